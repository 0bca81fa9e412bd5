"""Shared fixtures: tiny params, a params.yaml writer, and a tiny cache built by the real data stages."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ["DVC_NO_ANALYTICS"] = "1"

from thermal2visible.config import Params, apply_override, load_params  # noqa: E402  (after the environment is set)

REPO = Path(__file__).resolve().parents[1]
# Small enough for a test to build, train and serve in seconds on two CPU cores.
TINY = ("synthesize.identities=4", "synthesize.images_per_identity=6", "synthesize.resolution=48",
        "preprocess.image_size=32", "train.batch_size=4", "train.max_epochs=2", "early_stop.window=1",
        "model.ngf=8", "model.ndf=8")


def _write_params(directory: Path, *overrides: str) -> Path:
    """The repo's params.yaml with the tiny settings and then `overrides` (section.key=value) applied."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for override in (*TINY, *overrides):
        apply_override(raw, override)
    path = Path(directory) / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    load_params(path)  # fail here, naming the key, rather than in the test that uses it
    return path


@pytest.fixture
def write_params():
    """`write_params(directory, "section.key=value", ...) -> path` of a tiny params.yaml written there."""
    return _write_params


@pytest.fixture
def tiny_params(tmp_path) -> Params:
    return load_params(_write_params(tmp_path))


def run_script(script: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """Run pipelines/<script> from `cwd` as DVC would; output captured as text."""
    return subprocess.run([sys.executable, str(REPO / "pipelines" / script), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def run_stage_script():
    """`run_stage_script("ingest.py", cwd, "--set", "ingest.on_error=skip") -> CompletedProcess`."""
    return run_script


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> Path:
    """A cache dir (manifest.json + arrays) made by synthesize -> ingest -> preprocess on tiny data."""
    from thermal2visible.data.cache import build_cache
    from thermal2visible.data.ingest import ingest
    from thermal2visible.data.synthetic import synthesize

    work = tmp_path_factory.mktemp("tiny_data")
    params = load_params(_write_params(work))
    synthesize(params.synthesize, work / "raw")
    index, _ = ingest(work / "raw", "pairs", params.ingest)
    build_cache(index, params.preprocess, params.ingest.max_pixels, work / "cache")
    return work / "cache"
