"""`mlflow run . --env-manager local -e <stage>` for real: an entry point runs its stage through `dvc exp run` with
exactly the settings given (none: params.yaml as it is), so params.yaml, dvc.lock and the MLflow run agree."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from mlflow import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from thermal2visible.config.load import load_params
from thermal2visible.paths import CACHE, MANIFEST, PAPER_GPU

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
STAGE_RUNS = ("train", "evaluate", "register")  # the stages that log runs


def mlflow_run(
    repo: Path, uri: str, entry: str, *parameters: str, experiment: str | None = None
) -> subprocess.CompletedProcess:
    command = [str(BIN / "mlflow"), "run", str(repo), "--env-manager", "local", "-e", entry]
    command += ["--experiment-name", experiment] if experiment else []
    for parameter in parameters:
        command += ["-P", parameter]
    return subprocess.run(
        command, cwd=repo, capture_output=True, text=True, timeout=600, env={**os.environ, "MLFLOW_TRACKING_URI": uri}
    )


def train_runs(uri: str) -> list:
    """The train runs in the project's experiment (params.yaml's mlflow.experiment), oldest first."""
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("thermal2visible").experiment_id
    return client.search_runs([experiment], "attributes.run_name = 'train'", order_by=["attributes.start_time ASC"])


def dvc_status_clean(repo: Path) -> bool:
    status = subprocess.run(
        [str(BIN / "dvc"), "status", "--json", "train"], cwd=repo, capture_output=True, text=True, check=True
    )
    return yaml.safe_load(status.stdout) == {}


def test_train_entry_point_uses_params_yaml_as_it_is_then_only_what_is_given(project_copy):
    repo = project_copy
    uri = f"sqlite:///{repo / 'mlflow.db'}"
    result = mlflow_run(repo, uri, "train")  # no --experiment-name: the wrapper run goes to MLflow's Default
    assert result.returncode == 0, f"mlflow run -e train failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert (repo / "models/generator.pt").is_file()
    params = load_params(repo / "params.yaml")
    [run] = train_runs(uri)
    logged = run.data.params
    expected = {key: str(value) for key, value in params.flat("model", "train", "early_stop", "loader").items()}
    assert {key: logged[key] for key in expected} == expected
    assert run.info.status == "FINISHED"
    parent = MlflowClient(uri).get_run(run.data.tags[MLFLOW_PARENT_RUN_ID])
    assert parent.data.tags["mlflow.project.entryPoint"] == "train"
    assert run.data.tags["dvc_experiment"] != "none"  # ran inside `dvc exp run`
    assert dvc_status_clean(repo)

    # `main`, the whole pipeline: every stage that runs logs a run of its own, nested under the wrapper run
    result = mlflow_run(repo, uri, "main", "set=train.max_epochs=3 train.lr_g=0.0001", experiment="thermal2visible")
    assert result.returncode == 0, f"mlflow run -e main -P set=... failed:\n{result.stderr[-3000:]}"
    first, second = train_runs(uri)
    client = MlflowClient(uri)
    wrapper = client.get_run(second.data.tags[MLFLOW_PARENT_RUN_ID])
    assert wrapper.data.tags["mlflow.project.entryPoint"] == "main" and wrapper.info.run_name not in STAGE_RUNS
    nested = client.search_runs([wrapper.info.experiment_id], f"tags.{MLFLOW_PARENT_RUN_ID} = '{wrapper.info.run_id}'")
    assert sorted(run.info.run_name for run in nested) == sorted(STAGE_RUNS)  # one experiment: the UI nests them
    [version] = client.search_model_versions("name = 'thermal2visible-portrait'")
    assert version.run_id == second.info.run_id  # the version's source run: the training that made its weights
    assert (second.data.params["train.max_epochs"], second.data.params["train.lr_g"]) == ("3", "0.0001")
    assert yaml.safe_load((repo / "params.yaml").read_text())["train"]["max_epochs"] == 3
    locked = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["train"]["params"]["params.yaml"]
    assert locked["train"]["max_epochs"] == 3
    assert dvc_status_clean(repo)
    assert (repo / CACHE / MANIFEST).is_file()


def test_an_undeclared_mlproject_parameter_is_refused_naming_the_right_form(project_copy):
    result = mlflow_run(project_copy, f"sqlite:///{project_copy / 'mlflow.db'}", "synthesize", "identities=3")
    assert result.returncode != 0
    assert 'the only MLproject parameter is set, e.g. -P set="train.batch_size=16' in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is of a GPU preset on a machine without a GPU")
def test_a_preset_this_machine_cannot_run_is_refused_before_anything_changes(project_copy):
    before = (project_copy / "params.yaml").read_text()
    result = subprocess.run(
        [sys.executable, "-m", "thermal2visible.dvc_experiment", "--preset", str(REPO / PAPER_GPU)],
        cwd=project_copy,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
    )
    assert result.returncode == 1 and "train.accelerator: gpu" in result.stderr and "Traceback" not in result.stderr
    assert "nothing was run or changed" in result.stderr and "dvc exp run" not in result.stdout
    assert (project_copy / "params.yaml").read_text() == before
    assert sorted(path.name for path in (project_copy / "data").iterdir()) == [".gitignore", "dvc.yaml"]  # no data
