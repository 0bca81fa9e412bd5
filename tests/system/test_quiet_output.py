"""Quiet where nothing is wrong, heard where something is: setup shows its progress, loading a model draws no
download bars, and export's timing line says what it measured."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import mlflow
import mlflow.pyfunc
from tests.support.shipped import SHIPPED
from tests.support.tiny_model import export_tiny

from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.inference.rest import invocations_in_worker, model_files
from thermal2visible.onnx_export import latency_line
from thermal2visible.registry.packing import pyfunc_arguments

REPO = Path(__file__).resolve().parents[2]
BARS = "Downloading artifacts"


def test_setup_announces_each_step_and_lets_pip_show_its_progress(tmp_path):
    recipe = subprocess.run(
        ["make", "-n", "setup", f"VENV={tmp_path / 'venv'}"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    installs = [index for index, line in enumerate(recipe) if " -m pip install " in line]
    assert len(installs) == 3, recipe
    for index in installs:
        assert "--quiet" not in recipe[index] and " -q " not in recipe[index], recipe[index]
        announced = [line for line in recipe[:index] if line.startswith("echo ")]
        assert re.match(r'echo "setup: \[\d/\d\] ', announced[-1]), recipe


def test_the_server_loads_a_model_without_download_bars(tmp_path, tiny_cache, capfd, monkeypatch):
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    onnx = export_tiny(tmp_path / "export", tiny_cache)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment(SHIPPED.mlflow.experiment)
    with mlflow.start_run(), pyfunc_arguments(onnx, ServedLimits.of(SHIPPED.serve)) as arguments:
        logged = mlflow.pyfunc.log_model(name="model", **arguments, registered_model_name="quiet")
    model_uri = f"models:/quiet/{logged.registered_model_version}"
    capfd.readouterr()
    # what MLflow draws by default, so that the test sees them if they come
    mlflow.artifacts.download_artifacts(model_uri, dst_path=str(tmp_path / "plain"))
    assert BARS in "".join(capfd.readouterr())

    assert Path(model_files(model_uri, str(tmp_path / "files")), "MLmodel").is_file()  # what make serve copies once
    assert BARS not in "".join(capfd.readouterr())
    loaded = invocations_in_worker(model_uri)  # what each of its workers loads
    assert loaded.told["max_rows"] == SHIPPED.serve.max_rows
    assert BARS not in "".join(capfd.readouterr())
    assert "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR" not in os.environ  # only around the load


def test_the_timing_line_says_what_each_figure_measures():
    line = latency_line({"onnxruntime on models/generator.onnx (what serving runs)": 4.0, "torch on x": 442.18}, 256)
    assert line.startswith("latency of one 256x256 image through the generator alone (median wall time of 20 calls")
    assert "onnxruntime on models/generator.onnx (what serving runs): 4.00 ms; torch on x: 442.18 ms" in line
