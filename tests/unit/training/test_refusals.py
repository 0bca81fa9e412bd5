"""Configurations that cannot finish are refused by `train` before its first epoch, naming the key and why.

Each case is a real cache made by the data stages from the tiny set (with the split or the folders that make the
run impossible) and a real `pipelines/train.py` run on it.
"""

import shutil
from pathlib import Path

import pytest
import torch
from conftest import _write_params, run_script

from thermal2visible.config.load import load_params
from thermal2visible.data.cache import build_cache
from thermal2visible.data.ingest import ingest
from thermal2visible.errors import ConfigError
from thermal2visible.training.precision import resolve_accelerator


def unlabelled_raw(raw: Path, folder: Path) -> Path:
    """The tiny raw set with one person's pairs moved out of their identity folder."""
    shutil.copytree(raw, folder)
    for kind in ("thermal", "visible"):
        person = sorted((folder / kind).iterdir())[0]
        for image in person.iterdir():
            image.rename(folder / kind / f"{person.name}_{image.name}")
        person.rmdir()
    return folder


@pytest.fixture(scope="module")
def caches(tiny_cache, tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("refusals")
    raw = tiny_cache.parent / "raw"
    made = {}
    for name, source, overrides in (
        ("no_val", raw, ["preprocess.val_fraction=0"]),
        ("one_val", raw, ["preprocess.val_fraction=0.01"]),
        ("unlabelled", unlabelled_raw(raw, work / "unlabelled_raw"), []),
    ):
        params = load_params(_write_params(work, *overrides))
        index, _ = ingest(source, "pairs", params.ingest)
        build_cache(index, params.preprocess, params.ingest.max_pixels, work / name, on_error="fail")
        made[name] = work / name
    return made


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "cache, overrides, message",
    [
        ("no_val", [], "the validation split is empty (the cache was made with preprocess.val_fraction: 0.0"),
        (
            "one_val",
            ["train.devices=2"],
            "train.devices x num_nodes: each of the 2 processes validates its own share of the 1 validation image(s)",
        ),
        (
            "unlabelled",
            ["train.lambda_id=1.0"],
            "train.lambda_id: 1.0 needs the identity of every training pair, but 4 have no identity folder",
        ),
        ("one_val", ["train.batch_size=1", "train.devices=2"], "train.batch_size: 1 is not divisible by devices"),
        # a generator stamped with settings its training images never went through would be served with them
        (
            "unlabelled",
            ["preprocess.thermal_norm=fixed"],
            "preprocess.thermal_norm: 'fixed' in the params, but the cache was made with 'percentile'",
        ),
    ],
)
@pytest.mark.slow
def test_refused_before_the_first_epoch_naming_the_key(tmp_path, caches, write_params, cache, overrides, message):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cache").symlink_to(caches[cache])
    write_params(tmp_path, "train.max_epochs=50", "early_stop.window=1")
    sets = [arg for override in overrides for arg in ("--set", override)]
    result = run_script("train.py", tmp_path, *sets, timeout=240)
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "mlflow.db").exists()  # nothing trained


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: nothing to refuse")
def test_a_gpu_setting_on_a_machine_without_one_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="train.accelerator: gpu, but this PyTorch .* sees no CUDA GPU"):
        resolve_accelerator("gpu")
