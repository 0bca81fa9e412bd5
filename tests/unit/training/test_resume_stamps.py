"""A checkpoint's stamp is data read from disk: it continues a run only when it is that run's, it never names a
folder outside checkpoints/, and the MLflow run it names is continued only where that run says the same fingerprint."""

from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from thermal2visible.training.run import continued_run
from thermal2visible.training.resume import STAMP, find_resume

A, B, C = "a" * 16, "b" * 16, "c" * 16  # fingerprints
RUN = "1" * 32  # an MLflow run id


def test_resume_only_a_checkpoint_of_the_same_run(tmp_path, capsys):
    last, best = tmp_path / "last.ckpt", tmp_path / "best_generator.pt"
    torch.save({STAMP: {"fingerprint": A, "mlflow_run_id": RUN}, "state_dict": {}}, last)
    best.write_bytes(b"weights")
    assert find_resume(tmp_path, A, "auto", stale=[best]) == (last, RUN)
    assert find_resume(tmp_path, A, "never", stale=[best]) == (None, None) and not best.exists()
    torch.save({STAMP: {"fingerprint": A, "mlflow_run_id": RUN}}, last)
    assert find_resume(tmp_path, B, "auto") == (None, None) and not last.exists()
    assert f"is another run's (fingerprint {A}): kept in" in capsys.readouterr().out
    assert find_resume(tmp_path, A, "auto") == (last, RUN)  # its kept checkpoint, back in place
    last.write_bytes(b"not a checkpoint")
    assert find_resume(tmp_path, C, "auto") == (None, None) and not last.exists()
    assert (tmp_path / "unreadable" / "last.ckpt").read_bytes() == b"not a checkpoint"  # kept, not deleted
    assert "cannot be read" in capsys.readouterr().out


@pytest.mark.parametrize(
    "stamp",
    [
        {"fingerprint": "../../escaped_here", "mlflow_run_id": RUN},
        {"fingerprint": "/absolute/folder", "mlflow_run_id": RUN},
        {"fingerprint": A.upper(), "mlflow_run_id": RUN},
        {"fingerprint": 12345, "mlflow_run_id": RUN},
        {"fingerprint": A, "mlflow_run_id": "../run"},
        {"fingerprint": A, "mlflow_run_id": 7},
        ["not", "a", "mapping"],
    ],
)
def test_a_planted_stamp_moves_nothing_out_of_the_folder_and_is_never_continued(tmp_path, capsys, stamp):
    """A stamp is data: one whose values lack a fingerprint's or a run id's shape parks its checkpoint in
    unreadable/ (never a folder its text names), and the notice names the file and the key."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    last = folder / "last.ckpt"
    torch.save({STAMP: stamp}, last)
    before = set(tmp_path.rglob("*"))
    assert find_resume(folder, A, "auto") == (None, None)
    assert (folder / "unreadable" / "last.ckpt").is_file()
    assert set(tmp_path.rglob("*")) - before == {folder / "unreadable", folder / "unreadable" / "last.ckpt"}
    assert not Path("/absolute").exists()
    notice = capsys.readouterr().out
    assert f"{last} cannot be read (its {STAMP}." in notice


def test_a_parked_checkpoint_whose_stamp_is_another_runs_is_not_continued(tmp_path, capsys):
    """checkpoints/<A>/last.ckpt is continued by a run of fingerprint A only when its own stamp says A."""
    (tmp_path / A).mkdir()
    torch.save({STAMP: {"fingerprint": B, "mlflow_run_id": RUN}}, tmp_path / A / "last.ckpt")
    assert find_resume(tmp_path, A, "auto") == (None, None)
    assert (tmp_path / "unreadable" / "last.ckpt").is_file() and not (tmp_path / "last.ckpt").exists()
    assert "is not this run's" in capsys.readouterr().out


def test_a_stamps_run_is_continued_only_where_it_trained_that_fingerprint(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")  # in this folder, whatever a test before set
    client = MlflowClient("sqlite:///mlflow.db")
    experiment = client.create_experiment("stamps")
    ours = client.create_run(experiment, tags={"fingerprint": A}).info.run_id
    client.set_terminated(ours, "KILLED")
    checkpoint = tmp_path / "last.ckpt"
    assert continued_run(ours, B, checkpoint) is None
    assert f"{checkpoint}: its stamp's MLflow run {ours} is no training of fingerprint {B}" in capsys.readouterr().out
    assert continued_run("f" * 32, A, checkpoint) is None  # a run this store does not hold
    assert continued_run(ours, A, checkpoint) == ours
    assert client.get_run(ours).info.status == "RUNNING"  # trains again: no longer KILLED
