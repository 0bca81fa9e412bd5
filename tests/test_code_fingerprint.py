"""A training continues only when everything that defines its weights is the same, the code included: a change of
the training code's arithmetic, or of the values inside the cache's arrays (its manifest unchanged), in the same
project folder gives a fresh run with the weights a run from an empty checkpoints/ gets; an edit of a comment or a
docstring continues. The code changed is a copy of the project's (src/, pipelines/, dvc.yaml), laid out as the
project is."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from thermal2visible.dev.projects import copy_project
from thermal2visible.imports import PACKAGE

pytestmark = pytest.mark.slow
REPO = PACKAGE.parents[1]
LOSSES = Path("src/thermal2visible/training/losses.py")
VANILLA = "        return F.binary_cross_entropy_with_logits(logits, target)\n"


def copy_of_project(root: Path) -> Path:
    return copy_project(root)


def edit(source: Path, old: str, new: str) -> None:
    path = source / LOSSES
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))


def project(root: Path, cache: Path, write_params) -> Path:
    (root / "data").mkdir(parents=True)
    shutil.copytree(cache, root / "data" / "cache")
    write_params(root, "train.max_epochs=2", "early_stop.window=1", "early_stop.patience=2", "train.batch_size=4")
    return root


def train(source: Path, project: Path) -> str:
    env = os.environ | {"PYTHONPATH": str(source / "src"), "MLFLOW_DISABLE_TELEMETRY": "true"}
    done = subprocess.run(
        [sys.executable, str(source / "pipelines" / "train.py")],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def weights(project: Path) -> dict[str, torch.Tensor]:
    return torch.load(project / "models" / "generator.pt", weights_only=True)["state_dict"]


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


@pytest.mark.timeout(600)
def test_new_code_or_new_arrays_train_afresh_and_a_comment_edit_continues(tmp_path, tiny_cache, write_params):
    source = copy_of_project(tmp_path / "source")
    folder = project(tmp_path / "project", tiny_cache, write_params)
    train(source, folder)
    old = weights(folder)

    edit(source, "    logits = logits.float()\n", "    # a reader's note\n    logits = logits.float()\n")
    edit(source, "on a PatchGAN's logits", "on the PatchGAN's logits")  # a docstring: text, not behaviour
    assert "continued from checkpoints/last.ckpt" in train(source, folder)
    assert same(weights(folder), old)

    edit(source, VANILLA, VANILLA.replace("return ", "return 2 * "))
    assert "continued from" not in train(source, folder)
    retrained = weights(folder)
    fresh = project(tmp_path / "fresh", tiny_cache, write_params)
    train(source, fresh)
    assert same(retrained, weights(fresh)) and not same(retrained, old)

    for root in (folder, fresh):  # the same values changed inside the training arrays; the manifest keeps its bytes
        for arrays in (root / "data" / "cache").glob("*_thermal.npy"):
            values = np.load(arrays)
            values[0] = 255 - values[0]
            np.save(arrays, values)
    assert "continued from" not in train(source, folder)
    (fresh / "checkpoints").rename(tmp_path / "set-aside")
    train(source, fresh)
    assert same(weights(folder), weights(fresh)) and not same(weights(folder), retrained)
