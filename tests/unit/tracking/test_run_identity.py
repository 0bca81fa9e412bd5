"""What ties an MLflow run to its code, data and DVC experiment, checked on real stage runs in a fresh git + DVC
repo."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from thermal2visible.paths import CACHE
from thermal2visible.tracking.digests import data_hash
from thermal2visible.tracking.store import EXPERIMENT_KIND, MODEL_DEVELOPMENT

DVC = str(Path(sys.executable).with_name("dvc"))


def recognizer_run(repo: Path, client: MlflowClient):
    [run] = client.search_runs(
        [client.get_experiment_by_name("thermal2visible").experiment_id],
        "attributes.run_name = 'train_recognizer'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return run


@pytest.mark.slow  # a git clone and a training subprocess
def test_a_clean_clone_run_is_not_dirty_names_its_commit_and_logs_its_dataset(project_copy):
    repo = project_copy
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{repo / 'mlflow.db'}"}
    subprocess.run([DVC, "repro", "train_recognizer"], cwd=repo, env=env, check=True, capture_output=True)
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    run = recognizer_run(repo, client)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    # dvc.lock, data and metrics were written before the run started: outputs, not sources
    assert subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    assert run.data.tags["git_dirty"] == "false"
    assert run.data.tags["mlflow.source.git.commit"] == head
    assert run.data.tags["dvc_experiment"] == "none"  # dvc repro, not dvc exp run
    [dataset] = run.inputs.dataset_inputs
    assert dataset.dataset.digest == data_hash(repo / CACHE) == run.data.tags["data_hash"]
    assert dataset.tags[0].value == "training"
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.tags[EXPERIMENT_KIND] == MODEL_DEVELOPMENT

    with (repo / "pipelines" / "train_recognizer.py").open("a") as file:
        file.write("\n# an uncommitted change to a source file\n")
    subprocess.run([DVC, "repro", "train_recognizer"], cwd=repo, env=env, check=True, capture_output=True)
    assert recognizer_run(repo, client).data.tags["git_dirty"] == "true"
