"""Two "nodes" on 127.0.0.1: pipelines/launch/torchrun.sh started twice (node rank 0 and 1, one process each),
exactly as on two machines sharing the project folder; gloo on CPU, tiny params.

Every rank prints its stop epoch and a digest of its generator's weights at the end (train.py does so whenever
world size > 1); the digests must agree with each other and with the weights in rank 0's checkpoints/last.ckpt.
"""

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from tests.support.servers import free_port
from thermal2visible.cli import this_python_first

from thermal2visible.models.networks import build_generator

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
RANK_LINE = re.compile(r"train: rank (\d) of 2 stopped at epoch (\d+); generator weights ([0-9a-f]{16})")


def digest_of_checkpoint(project: Path) -> str:
    """The digest train.py prints, computed from the generator weights in checkpoints/last.ckpt."""
    config = torch.load(project / "models" / "generator.pt", weights_only=True)["model"]
    state = torch.load(project / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    generator = build_generator(config)
    generator.load_state_dict(
        {name.removeprefix("generator."): value for name, value in state.items() if name.startswith("generator.")}
    )
    digest = hashlib.sha256()
    for name, weight in generator.named_parameters():
        digest.update(name.encode() + weight.detach().float().numpy().tobytes())
    return digest.hexdigest()[:16]


def start_nodes(folders: list[Path]) -> list[subprocess.Popen]:
    """torchrun.sh (this venv's torchrun) on node ranks 0 and 1, node r in folders[r], each in its own session."""
    env = this_python_first(os.environ) | {
        "NNODES": "2",
        "NPROC_PER_NODE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    return [
        subprocess.Popen(
            [str(REPO / "pipelines" / "launch" / "torchrun.sh"), "--set", "train.accelerator=cpu"],
            cwd=folder,
            env=env | {"NODE_RANK": str(rank)},
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for rank, folder in enumerate(folders)
    ]


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process under it, as a node failure would (torchrun's workers may lead their own
    process groups), found through /proc's parent links."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, grown = {pid}, True
    while grown:
        children = {child for child, parent in parents.items() if parent in tree} - tree
        tree, grown = tree | children, bool(children)
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def checkpoint_epoch(folder: Path) -> int | None:
    path = folder / "checkpoints" / "last.ckpt"
    return torch.load(path, weights_only=True)["epoch"] if path.is_file() else None


@pytest.mark.timeout(400)
def test_two_nodes_train_one_run_with_equal_weights_and_one_stop_decision(tmp_path, tiny_cache, write_params):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cache").symlink_to(tiny_cache)
    write_params(tmp_path, "train.max_epochs=4", "early_stop.window=1", "early_stop.patience=1")
    nodes = start_nodes([tmp_path, tmp_path])  # one shared project folder
    outputs = [node.communicate(timeout=360)[0] for node in nodes]
    for node, out in zip(nodes, outputs):
        assert node.returncode == 0, out

    ranks = [RANK_LINE.findall(out) for out in outputs]
    assert [found[0][0] for found in ranks] == ["0", "1"], outputs  # each node ran one rank
    (_, stopped_0, weights_0), (_, stopped_1, weights_1) = ranks[0][0], ranks[1][0]
    assert stopped_0 == stopped_1  # the early-stopping decision is the same everywhere
    assert weights_0 == weights_1 == digest_of_checkpoint(tmp_path)
    assert f'"stopped_epoch": {stopped_0},' in (tmp_path / "metrics" / "train.json").read_text()

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("thermal2visible").experiment_id])
    assert len(runs) == 1 and runs[0].data.tags["world_size"] == "2" and runs[0].info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "val_psnr")]
    assert steps == list(range(1, int(stopped_0) + 1))


@pytest.mark.timeout(400)
def test_nodes_that_do_not_share_checkpoints_stop_before_any_step(tmp_path, tiny_cache, write_params):
    """Node 0 and node 1 in separate folders (no shared file system): after a kill, node 0 finds the job's
    checkpoint and node 1 none. Both stop with one error naming what each found, before any step: node 0's
    checkpoint is left as it was."""
    folders = [tmp_path / "node0", tmp_path / "node1"]
    for folder in folders:
        (folder / "data").mkdir(parents=True)
        (folder / "data" / "cache").symlink_to(tiny_cache)
        write_params(folder, "train.max_epochs=200", "early_stop.window=1", "early_stop.patience=200")
    nodes = start_nodes(folders)
    deadline = time.monotonic() + 240
    while checkpoint_epoch(folders[0]) is None:
        assert all(node.poll() is None for node in nodes) and time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.05)
    for node in nodes:
        kill_tree(node.pid)
        node.communicate()
    kept = checkpoint_epoch(folders[0])
    assert kept is not None and checkpoint_epoch(folders[1]) is None

    nodes = start_nodes(folders)
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    for node, output in zip(nodes, outputs):
        assert node.returncode != 0, output
        assert "the job's processes disagree on how to resume" in output, output
        assert re.search(r"rank 0 on .*: checkpoints/last.ckpt \(fingerprint \w+, epoch \d+", output), output
        assert "rank 1 on " in output and ": checkpoints/last.ckpt (missing)" in output, output  # adopted, not seen
    assert checkpoint_epoch(folders[0]) == kept
