"""Two "nodes" on 127.0.0.1: pipelines/launch/torchrun.sh started twice (node rank 0 and 1, one process each),
exactly as on two machines sharing the project folder; gloo on CPU, tiny params.

Every rank prints its stop epoch and a digest of its generator's weights at the end (train.py does so whenever
world size > 1); the digests must agree with each other and with the weights in rank 0's checkpoints/last.ckpt.
"""

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from thermal2visible.dev.servers import free_port

from thermal2visible.models.networks import build_generator

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
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


@pytest.mark.timeout(400)
def test_two_nodes_train_one_run_with_equal_weights_and_one_stop_decision(tmp_path, tiny_cache, write_params):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cache").symlink_to(tiny_cache)
    write_params(tmp_path, "train.max_epochs=4", "early_stop.window=1", "early_stop.patience=1")
    env = os.environ | {
        "NNODES": "2",
        "NPROC_PER_NODE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }  # this venv's torchrun
    nodes = [
        subprocess.Popen(
            [str(REPO / "pipelines" / "launch" / "torchrun.sh"), "--set", "train.accelerator=cpu"],
            cwd=tmp_path,
            env=env | {"NODE_RANK": str(rank)},
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in (0, 1)
    ]
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
