"""The MLflow UI as a person sees it, in real headless Chromium over a real `mlflow ui` on a tiny pipeline's store:
the training run in the model-training view, its dataset, its smoothed-PSNR curve, and its registered version."""

import shutil

import pytest
from mlflow import MlflowClient

from thermal2visible.config.load import load_params
from thermal2visible.registry.gate import registered_model_name
from thermal2visible.paths import CACHE
from thermal2visible.tracking.digests import data_hash
from tools.screenshots import CHARTS, experiment_page, mlflow_ui, render, run_page, version_page

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not shutil.which("chromium"),
        reason=("Debian's chromium is not installed (.ci/run installs it where apt-get works): the UI is not rendered"),
    ),
]


def test_training_run_dataset_smoothed_psnr_and_registered_version_show_in_the_ui(pipeline_project, tmp_path):
    repo = pipeline_project
    uri = f"sqlite:///{repo / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("thermal2visible").experiment_id
    [train] = client.search_runs([experiment], "attributes.run_name = 'train'")
    name = registered_model_name(load_params(repo / "params.yaml"))  # thermal2visible-portrait
    [version] = client.search_model_versions(f"name = '{name}'")
    digest = data_hash(repo / CACHE)

    with mlflow_ui(uri, tmp_path) as base:
        runs = render(experiment_page(base, experiment), tmp_path / "experiment.png")
        overview = render(run_page(base, experiment, train.info.run_id), tmp_path / "run.png")
        curves = render(
            run_page(base, experiment, train.info.run_id, "model-metrics"), tmp_path / "metrics.png", **CHARTS
        )
        registered = render(version_page(base, name, version.version), tmp_path / "version.png")

    assert "Model training" in runs and "train_recognizer" in runs and f"cache ({digest[:8]}" in runs
    assert "Traces 0" not in runs  # not the GenAI dashboard
    assert f"Datasets cache ({digest})" in overview
    registered_panel = overview.partition("Registered models")[2][:200]
    assert name in registered_panel and "None" not in registered_panel.split("Description")[0]
    assert "val_psnr_smoothed" in overview.partition("Metrics (")[2]
    assert f"Model metrics ({len(train.data.metrics)})" in curves  # a curve per metric, val_psnr_smoothed included
    assert "Source Run : train" in registered  # the version links back to the run that trained it
