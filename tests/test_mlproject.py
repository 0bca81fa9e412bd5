"""`mlflow run . --env-manager local -e <stage>` on tiny params: the MLproject entry points run the real stages,
and each stage's MLflow run is a child of the run `mlflow run` opened."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

pytestmark = pytest.mark.slow


def mlflow_run(repo: Path, uri: str, entry: str, *parameters: str) -> None:
    command = [str(Path(sys.executable).with_name("mlflow")), "run", str(repo), "--env-manager", "local",
               "--experiment-name", "mlproject-test", "-e", entry]
    for parameter in parameters:
        command += ["-P", parameter]
    result = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    assert result.returncode == 0, f"mlflow run -e {entry} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def test_stage_entry_points_run_under_mlflow_run(project_copy):
    repo = project_copy
    uri = f"sqlite:///{repo / 'mlflow.db'}"
    mlflow_run(repo, uri, "synthesize", "identities=3", "images_per_identity=4")
    assert len(list((repo / "data/raw/thermal").rglob("*.png"))) == 12
    mlflow_run(repo, uri, "ingest")
    mlflow_run(repo, uri, "preprocess", "image_size=16")
    mlflow_run(repo, uri, "train", "batch_size=4", "max_epochs=2", "precision=32-true")
    assert (repo / "models/generator.pt").is_file()

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("mlproject-test").experiment_id])
    train = [run for run in runs if run.info.run_name == "train"]
    assert len(train) == 1 and train[0].info.status == "FINISHED"
    parent = client.get_run(train[0].data.tags[MLFLOW_PARENT_RUN_ID])
    assert parent.data.tags["mlflow.project.entryPoint"] == "train"
    assert train[0].data.params["train.batch_size"] == "4"
    assert {"val_psnr", "loss_g"} <= set(train[0].data.metrics)
