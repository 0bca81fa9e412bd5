"""A training continues only when everything that defines its weights is the same, the code included: a change of
the training code's arithmetic, of the values inside the cache's arrays (its manifest unchanged), or of the thread
count the machine gives it, in the same project folder gives a fresh run with the weights a run from an empty
checkpoints/ gets; an edit of a comment, a docstring, a message or a logging module, a new version of a tracking
library, or a raised epoch cap continues, and ends with the weights of a run never interrupted. The code changed is
a copy of the project's (src/, pipelines/, dvc.yaml), laid out as the project is."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.projects import copy_project
from thermal2visible.imports import PACKAGE

pytestmark = pytest.mark.slow
REPO = PACKAGE.parents[1]
LOSSES = Path("src/thermal2visible/training/losses.py")
THREAD_PER_CORE = "train.threads=cores"  # the count the machine gives (the tiny settings fix one thread)
VANILLA = "        return F.binary_cross_entropy_with_logits(logits, target)\n"


def copy_of_project(root: Path) -> Path:
    return copy_project(root)


def edit(source: Path, old: str, new: str, file: Path = LOSSES) -> None:
    path = source / file
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))


def project(root: Path, cache: Path, write_params, *settings: str) -> Path:
    (root / "data").mkdir(parents=True)
    shutil.copytree(cache, root / "data" / "cache")
    write_params(
        root, "train.max_epochs=2", "early_stop.window=1", "early_stop.patience=2", "train.batch_size=4", *settings
    )
    return root


def train(source: Path, project: Path, *settings: str, libraries: Path | None = None, cores: set | None = None) -> str:
    """pipelines/train.py of `source` in `project` with `settings`; `libraries`: a folder of installed distributions
    ahead of the venv's, `cores`: the only cores the training may use."""
    path = os.pathsep.join(str(folder) for folder in (source / "src", libraries) if folder)
    env = os.environ | {"PYTHONPATH": path, "MLFLOW_DISABLE_TELEMETRY": "true"}
    done = subprocess.run(
        [sys.executable, str(source / "pipelines" / "train.py"), *(f"--set={setting}" for setting in settings)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
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


def newer_release(folder: Path, distribution: str) -> Path:
    """`folder` holding the metadata of a newer release of `distribution`: what importlib.metadata reports ahead of
    the installed one when `folder` comes first on the path, as after an upgrade."""
    info = folder / f"{distribution}-999.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 999.0\n")
    (info / "top_level.txt").write_text(f"{distribution}\n")
    return folder


@pytest.mark.timeout(600)
def test_what_changes_no_weight_continues_and_another_thread_count_trains_afresh(tmp_path, tiny_cache, write_params):
    source = copy_of_project(tmp_path / "source")
    folder = project(tmp_path / "project", tiny_cache, write_params, THREAD_PER_CORE)
    train(source, folder)
    old = weights(folder)

    progress = Path("src/thermal2visible/training/progress.py")  # the epoch line: logging
    edit(source, 'line = f"epoch {len(stop.history)}', 'line = f"Epoch {len(stop.history)}', progress)
    module = Path("src/thermal2visible/training/module.py")  # a message of the training step's own module
    edit(
        source,
        '"train.lambda_id > 0 needs the identity recognizer"',
        '"train.lambda_id > 0 needs a recognizer"',
        module,
    )
    upgraded = newer_release(tmp_path / "upgraded", "mlflow")
    output = train(source, folder, libraries=upgraded)
    assert "continued from checkpoints/last.ckpt" in output and "Epoch" not in output  # ended: nothing to train
    assert same(weights(folder), old)

    output = train(source, folder, "train.max_epochs=3", libraries=upgraded)
    assert "continued from checkpoints/last.ckpt" in output and "Epoch 3/3" in output
    fresh = project(tmp_path / "fresh", tiny_cache, write_params, THREAD_PER_CORE)
    train(source, fresh, "train.max_epochs=3")
    assert same(weights(folder), weights(fresh)) and not same(weights(folder), old)

    cores = os.sched_getaffinity(0)
    if len(cores) > 1:  # one core: the machine cannot give a training another count without asking for one
        output = train(source, folder, "train.max_epochs=3", cores={min(cores)})
        assert "continued from" not in output and "1 thread(s)" in output
