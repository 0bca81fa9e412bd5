"""One resume decision per job, under the real torchrun: rank 0 decides (parking another run's checkpoint, bringing
back its own) and the other rank adopts that decision even when it gets there first, with nothing on disk yet
decided. This file is also the script torchrun runs
(`torchrun ... tests/unit/training/test_resume_decision.py FOLDER OUT FP0 FP1`)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from thermal2visible.errors import PipelineError
from thermal2visible.training.resume import STAMP

OURS, OTHERS = "a" * 16, "b" * 16  # fingerprints
OUR_RUN, OTHER_RUN = "1" * 32, "2" * 32


def decide_on_this_rank(folder: Path, out: Path, fingerprints: list[str]) -> None:
    """A rank of the job: rank 0 comes late, so rank 1 would look at the folder first if it could."""
    from thermal2visible.training.resume_decision import decide_resume

    rank = int(os.environ["RANK"])
    if rank == 0:
        time.sleep(2)
    try:
        checkpoint, run_id = decide_resume(folder, fingerprints[rank], "auto", "gloo")
        report = {"rank": rank, "checkpoint": str(checkpoint), "run_id": run_id}
    except PipelineError as error:
        report = {"rank": rank, "error": str(error)}
    (out / f"{rank}.json").write_text(json.dumps(report))


def job(folder: Path, *fingerprints: str) -> list[dict]:
    """What each rank of a 2-process torchrun job decided (or the error it stopped with)."""
    from tests.support.servers import free_port  # here: torchrun runs this file as a script, without tests/ on the path

    out = folder.with_name("decisions")
    out.mkdir()
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc-per-node", "2", "--master-port", str(free_port()), __file__, str(folder)]
    result = subprocess.run([*command, str(out), *fingerprints], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads((out / f"{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow
def test_every_rank_continues_what_rank_0_decided_though_it_looked_first(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    torch.save({STAMP: {"fingerprint": OTHERS, "mlflow_run_id": OTHER_RUN}}, folder / "last.ckpt")
    (folder / OURS).mkdir()
    torch.save({STAMP: {"fingerprint": OURS, "mlflow_run_id": OUR_RUN}}, folder / OURS / "last.ckpt")
    decided = {"checkpoint": str(folder / "last.ckpt"), "run_id": OUR_RUN}
    assert job(folder, OURS, OURS) == [{"rank": 0} | decided, {"rank": 1} | decided]
    assert torch.load(folder / "last.ckpt", weights_only=True)[STAMP]["fingerprint"] == OURS
    assert (folder / OTHERS / "last.ckpt").is_file()  # the other run's, parked by rank 0


@pytest.mark.slow
def test_ranks_of_different_runs_stop_together_and_move_nothing(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    torch.save({STAMP: {"fingerprint": OTHERS, "mlflow_run_id": OTHER_RUN}}, folder / "last.ckpt")
    reports = job(folder, OURS, OTHERS)
    assert all("the job's processes train different runs" in report["error"] for report in reports), reports
    assert [path.name for path in folder.iterdir()] == ["last.ckpt"]


if __name__ == "__main__":
    decide_on_this_rank(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
