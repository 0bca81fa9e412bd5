"""Registry through a real `mlflow server`: new versions, lineage tags, and the champion gate."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient
from thermal2visible.servers import mlflow_server
from tiny_model import export_tiny

from thermal2visible.registry import CHALLENGER, CHAMPION, gate, register
from thermal2visible.serving import IMAGE

ROOT = Path(__file__).resolve().parents[1]
REGISTER = ROOT / "pipelines" / "register.py"


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


@pytest.fixture
def client(tracking_uri, monkeypatch) -> MlflowClient:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    return MlflowClient(tracking_uri)


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory, tiny_cache) -> Path:
    return export_tiny(tmp_path_factory.mktemp("model"), tiny_cache)


@pytest.mark.parametrize("psnr, parity, champion, expected", [
    (20.0, True, None, CHAMPION),         # the first model that passes parity
    (20.0, False, None, CHALLENGER),      # failed parity never becomes champion
    (20.0, True, 20.0, CHAMPION),         # a tie moves the champion to the newer model
    (19.9, True, 20.0, CHALLENGER),
    (30.0, False, 20.0, CHALLENGER),
])
def test_gate(psnr, parity, champion, expected):
    assert gate(psnr, parity, champion) == expected


def add(onnx_model: Path, name: str, psnr: float, parity: bool = True):
    """A new version of `name`, made by a (real, empty) training run of its own."""
    mlflow.set_experiment("registry-tests")
    with mlflow.start_run(run_name="train") as training:
        pass
    return register(onnx_model, name=name, experiment="registry-tests", test_psnr=psnr, parity_passed=parity,
                    metrics={"parity_max_abs_error": 1e-7}, max_pixels=1_000_000,
                    lineage={"training_run_id": training.info.run_id, "data_hash": "md5-of-tiny-cache",
                             "git_commit": None})


def aliases(client: MlflowClient, name: str) -> dict[str, int]:
    return {alias: int(version) for alias, version in client.get_registered_model(name).aliases.items()}


def test_champion_moves_only_for_a_better_model(client, onnx_model):
    first = add(onnx_model, "gated", 20.0)
    assert (first.version, first.alias, first.champion_psnr_before) == (1, CHAMPION, None)

    worse = add(onnx_model, "gated", 18.0)
    assert (worse.version, worse.alias, worse.champion_psnr_before) == (2, CHALLENGER, 20.0)
    assert aliases(client, "gated") == {CHAMPION: 1, CHALLENGER: 2}

    better = add(onnx_model, "gated", 25.0)
    assert (better.version, better.alias) == (3, CHAMPION)
    assert aliases(client, "gated") == {CHAMPION: 3, CHALLENGER: 2}

    unchecked = add(onnx_model, "gated", 40.0, parity=False)
    assert (unchecked.version, unchecked.alias) == (4, CHALLENGER)
    assert aliases(client, "gated") == {CHAMPION: 3, CHALLENGER: 4}
    # Nothing was overwritten: every version is still there with its own PSNR.
    psnrs = {int(v.version): float(v.tags["test_psnr"]) for v in client.search_model_versions("name='gated'")}
    assert psnrs == {1: 20.0, 2: 18.0, 3: 25.0, 4: 40.0}


def test_version_carries_lineage_signature_and_metrics(client, onnx_model):
    added = add(onnx_model, "lineage", 21.5)
    version = client.get_model_version("lineage", str(added.version))
    assert version.run_id == version.tags["training_run_id"]  # the version links to the run that trained it
    assert client.get_run(version.run_id).info.run_name == "train"
    assert version.tags["data_hash"] == "md5-of-tiny-cache"
    assert version.tags["parity_passed"] == "true"
    assert "git_commit" not in version.tags  # None values are skipped, not written as "None"
    experiment = client.get_experiment_by_name("registry-tests").experiment_id
    [packed_by] = client.search_runs([experiment], "attributes.run_name = 'register'",
                                     order_by=["attributes.start_time DESC"], max_results=1)
    assert packed_by.data.metrics == {"test_psnr": 21.5, "parity_max_abs_error": 1e-7}
    info = mlflow.models.get_model_info(f"models:/lineage/{added.version}")
    assert info.signature.inputs.input_names() == [IMAGE]
    assert info.saved_input_example_info is not None


def run_register_stage(project: Path, tracking_uri: str, psnr: float) -> subprocess.CompletedProcess:
    (project / "metrics" / "eval.json").write_text(json.dumps({"generator": {"psnr": psnr, "ssim": 0.5}}))
    return subprocess.run(
        [sys.executable, str(REGISTER), "--params", str(ROOT / "params.yaml"), "--set", "register.model_name=staged"],
        cwd=project, capture_output=True, text=True,
        env=os.environ | {"MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_DISABLE_TELEMETRY": "true"})


def test_register_stage(tracking_uri, onnx_model, tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "metrics").mkdir()
    shutil.copy(onnx_model, tmp_path / "models" / "generator.onnx")
    (tmp_path / "metrics" / "export.json").write_text(json.dumps({"parity_max_abs_error": 2e-7, "size_bytes": 1}))

    first = run_register_stage(tmp_path, tracking_uri, 22.0)
    assert first.returncode == 0, first.stderr
    assert json.loads((tmp_path / "metrics" / "register.json").read_text()) == {
        "model_name": "staged", "version": 1, "alias": CHAMPION, "test_psnr": 22.0, "champion_psnr_before": None}

    second = run_register_stage(tmp_path, tracking_uri, 21.0)
    assert second.returncode == 0, second.stderr
    summary = json.loads((tmp_path / "metrics" / "register.json").read_text())
    assert (summary["version"], summary["alias"], summary["champion_psnr_before"]) == (2, CHALLENGER, 22.0)


def test_register_stage_needs_evaluation(tracking_uri, onnx_model, tmp_path):
    (tmp_path / "models").mkdir()
    shutil.copy(onnx_model, tmp_path / "models" / "generator.onnx")
    result = subprocess.run([sys.executable, str(REGISTER), "--params", str(ROOT / "params.yaml")], cwd=tmp_path,
                            capture_output=True, text=True, env=os.environ | {"MLFLOW_TRACKING_URI": tracking_uri})
    assert result.returncode == 1
    assert result.stderr.strip() == "error: metrics/export.json: missing (run the export stage first)"
