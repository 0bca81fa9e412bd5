"""The pipeline as a team uses it: one person runs it and pushes to a DVC remote, a teammate clones and pulls.

Two runs of the whole tiny pipeline in two clones give the same dvc.lock (every tracked output the same bytes: no run
id, timestamp or seconds in them). A fresh clone's `dvc pull` leaves only the register stage to run, and that fills
the store the clone points at — its own mlflow.db or a team's `mlflow server` — with the training run, the evaluation
run and the champion, which `pipelines/serve.py` then serves to the README's client; a second run adds nothing. A model
trained by torchrun outside DVC is recorded and registered, not swapped for a cached one; a user's own data, `dvc
add`ed, gets a registered model of its own and travels to the next clone.
"""

import base64
import dataclasses
import difflib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow.artifacts
import mlflow.pyfunc
import numpy as np
import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient
from PIL import Image

from conftest import copy_without_store
from thermal2visible.config.load import load_params
from thermal2visible.data.synthetic import synthesize
from tests.support.servers import free_port, mlflow_server, quiet_env, running
from thermal2visible.registry.gate import CHAMPION, registered_model_name
from thermal2visible.models.payloads import load_generator
from thermal2visible.paths import EVAL_METRICS, EVAL_REPORT, stage_paths
from thermal2visible.stage_records import read_record
from thermal2visible.tracking.publish import evaluation_metrics
from thermal2visible.tracking.digests import file_digest

pytestmark = pytest.mark.slow
STAGES = (
    "data/dvc.yaml:synthesize",
    "ingest",
    "preprocess",
    "train_recognizer",
    "train",
    "evaluate",
    "export",
    "register",
)
# The built-in data is made again where it is missing, never stored (cache: false): a pulled clone runs its stage.
REMADE = {"data/dvc.yaml:synthesize"}
REPO = Path(__file__).resolve().parents[2]


def run(repo: Path, *command: str, env: dict[str, str] | None = None) -> str:
    # stages run `python` from PATH
    env = (env or os.environ) | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(command, cwd=repo, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def dvc(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    return run(repo, str(Path(sys.executable).with_name("dvc")), *args, env=env)


def git(repo: Path, *args: str) -> str:
    return run(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", *args)


def ran(output: str) -> set[str]:
    return {stage for stage in STAGES if f"Running stage '{stage}'" in output}


@pytest.fixture(scope="module")
def pushed(pipeline_project, tmp_path_factory) -> tuple[Path, Path]:
    """The whole tiny pipeline run in a project and in its clone; the project's record committed and pushed."""
    root = tmp_path_factory.mktemp("team")
    first, second = copy_without_store(pipeline_project, root / "first"), root / "second"
    recorded = {
        name if lock == "dvc.lock" else f"{lock.replace('.lock', '.yaml')}:{name}"
        for lock in ("dvc.lock", "data/dvc.lock")
        for name in yaml.safe_load((first / lock).read_text())["stages"]
    }
    assert recorded == set(STAGES)
    git(root, "clone", "-q", str(first), str(second))  # the project as committed, before its run
    assert ran(dvc(second, "repro")) == set(STAGES)
    dvc(first, "remote", "add", "-d", "team", str(root / "remote"))
    git(first, "add", "-A")
    git(first, "commit", "-qm", "pipeline run")
    dvc(first, "push")
    return first, second


def pulled_clone(pushed: tuple[Path, Path], folder: Path) -> Path:
    """A teammate's fresh clone of the record, its outputs pulled: no store, no models/ but DVC's."""
    git(folder.parent, "clone", "-q", str(pushed[0]), str(folder))
    dvc(folder, "pull")
    assert not (folder / "mlflow.db").exists()
    return folder


def store_of(clone: Path, uri: str | None = None) -> tuple[MlflowClient, str]:
    """(a client of the clone's store, the clone's registered model name)."""
    name = registered_model_name(load_params(clone / "params.yaml"))
    return MlflowClient(uri or f"sqlite:///{clone / 'mlflow.db'}"), name


def runs_by_name(client: MlflowClient) -> dict[str, list]:
    found: dict[str, list] = {}
    for run_ in client.search_runs([experiment.experiment_id for experiment in client.search_experiments()]):
        found.setdefault(run_.info.run_name, []).append(run_)
    return found


def assert_store_holds_the_record(clone: Path, client: MlflowClient, name: str) -> None:
    """The champion is models/generator.onnx, sourced from the run that trained models/generator.pt, beside the
    evaluation run of metrics/eval.json."""
    champion = client.get_model_version_by_alias(name, CHAMPION)
    assert champion.tags["onnx_sha256"] == file_digest(clone / "models" / "generator.onnx")
    assert champion.tags["generator_sha256"] == file_digest(clone / "models" / "generator.pt")
    training = client.get_run(champion.tags["training_run_id"])
    assert champion.run_id == training.info.run_id and training.info.run_name == "train"
    assert training.data.tags["generator_sha256"] == champion.tags["generator_sha256"]
    evaluation = client.get_run(champion.tags["evaluation_run_id"])
    report = read_record(clone / EVAL_METRICS, clone / EVAL_REPORT)
    assert evaluation.data.metrics == pytest.approx(evaluation_metrics(report))
    assert "identity_rank1_accuracy_generator" in evaluation.data.metrics  # the tiny set's people recur in test


@pytest.mark.parametrize("lock", ["dvc.lock", "data/dvc.lock"])
def test_two_runs_agree_byte_for_byte(pushed, lock):
    a, b = ((repo / lock).read_text().splitlines() for repo in pushed)
    assert a == b, f"{lock} differs between two runs:\n" + "\n".join(difflib.unified_diff(a, b, lineterm=""))


def test_every_metrics_file_holds_numbers_only(pushed):
    """What `dvc metrics show` and `dvc exp show` make columns of is numbers: names, digests, flags and reasons are
    in the stages' reports."""
    shown = subprocess.run(
        [str(Path(sys.executable).with_name("dvc")), "metrics", "show", "--json"],
        cwd=pushed[0],
        capture_output=True,
        text=True,
        check=True,
    )
    files = {}

    def collect(node):
        for key, value in node.items():
            if key.endswith(".json") and isinstance(value, dict) and "data" in value:
                files[key] = value["data"]
            elif isinstance(value, dict):
                collect(value)

    def leaves(node):
        return [leaf for value in node.values() for leaf in (leaves(value) if isinstance(value, dict) else [value])]

    collect(json.loads(shown.stdout))
    declared = {str(path) for key, path in stage_paths().items() if key.endswith("_METRICS")}
    assert set(files) == declared
    for path, record in files.items():
        assert leaves(record) and all(type(leaf) in (int, float) for leaf in leaves(record)), (path, record)


@pytest.mark.timeout(600)
def test_a_fresh_clone_fills_its_store_serves_the_champion_and_adds_nothing_twice(pushed, tmp_path):
    clone = pulled_clone(pushed, tmp_path / "teammate")
    assert ran(dvc(clone, "repro")) == {"register"} | REMADE  # every output was pulled; only the store was missing
    assert git(clone, "status", "--porcelain") == ""
    client, name = store_of(clone)
    assert_store_holds_the_record(clone, client, name)
    training = client.get_model_version_by_alias(name, CHAMPION).run_id
    assert client.get_run(training).data.tags["logged_from"] == "dvc record"  # trained in another clone
    assert client.get_metric_history(training, "val_psnr")  # the curve, from metrics/psnr.csv

    before = {run_name: len(found) for run_name, found in runs_by_name(client).items()}
    output = dvc(clone, "repro")
    assert ran(output) == {"register"} and "nothing added" in output
    assert len(client.search_model_versions(f"name = '{name}'")) == 1
    assert {run_name: len(found) for run_name, found in runs_by_name(client).items()} == before

    port = free_port()
    serve = [sys.executable, str(clone / "pipelines" / "serve.py"), "--set", f"serve.port={port}"]
    thermal = next((clone / "data" / "raw" / "thermal").rglob("*.png"))
    with running(serve, "/ping", port, clone / "serve.log", quiet_env(), timeout_s=180) as url:  # `make serve`
        client_example = [sys.executable, str(REPO / "examples" / "client.py"), str(thermal), "visible.png"]
        run(tmp_path, *client_example, "--url", url)
    visible = np.asarray(Image.open(tmp_path / "visible.png"))
    assert visible.shape == (*np.asarray(Image.open(thermal)).shape[:2], 3)
    assert np.array_equal(visible, champion_in_process(clone, name, thermal, tmp_path))  # the registry's champion


def champion_in_process(clone: Path, name: str, thermal: Path, tmp_path: Path) -> np.ndarray:
    """The champion of the clone's store, loaded in this process, on `thermal`: its visible pixels. (Fetched by
    its location: a models:/ URI would go through the process's global tracking URI, which subprocesses inherit.)"""
    uri = f"sqlite:///{clone / 'mlflow.db'}"
    client = MlflowClient(uri)
    location = client.get_model_version_download_uri(name, client.get_model_version_by_alias(name, CHAMPION).version)
    model = mlflow.pyfunc.load_model(
        mlflow.artifacts.download_artifacts(location, tracking_uri=uri, dst_path=str(tmp_path / "champion"))
    )
    answer = model.predict(pd.DataFrame({"image": [base64.b64encode(thermal.read_bytes()).decode()]}))
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(answer["image"].iloc[0]))))


@pytest.mark.timeout(600)
def test_a_team_server_gets_the_record_with_its_training_run(pushed, tmp_path):
    clone = pulled_clone(pushed, tmp_path / "teammate")
    with mlflow_server(tmp_path / "server") as uri:
        team = os.environ | {"MLFLOW_TRACKING_URI": uri}
        assert ran(dvc(clone, "repro", env=team)) == {"register"} | REMADE
        client, name = store_of(clone, uri)
        assert_store_holds_the_record(clone, client, name)
        assert "nothing added" in dvc(clone, "repro", env=team)
        assert len(client.search_model_versions(f"name = '{name}'")) == 1
    assert not (clone / "mlflow.db").exists()  # nothing went to a local store


@pytest.mark.timeout(600)
def test_a_torchrun_training_is_recorded_and_registered_not_replaced(pushed, tmp_path):
    clone = pulled_clone(pushed, tmp_path / "teammate")
    pulled = file_digest(clone / "models" / "generator.pt")
    env = quiet_env(NNODES="1", NPROC_PER_NODE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    run(clone, str(clone / "pipelines" / "launch" / "torchrun.sh"), "--set", "train.accelerator=cpu", env=env)
    trained = file_digest(clone / "models" / "generator.pt")
    assert trained != pulled  # two processes: batch norm over each one's half of the batch
    assert load_params(clone / "params.yaml").train.devices == 2  # the record says how it was trained

    output = dvc(clone, "repro")
    assert ran(output) == {"evaluate", "export", "register"} | REMADE, output  # neither retrained nor restored
    assert file_digest(clone / "models" / "generator.pt") == trained
    client, name = store_of(clone)
    assert_store_holds_the_record(clone, client, name)
    training = client.get_run(client.get_model_version_by_alias(name, CHAMPION).run_id)
    assert training.data.tags["world_size"] == "2" and "logged_from" not in training.data.tags  # the job's own run
    assert load_generator(clone / "models" / "generator.pt")[1]["fingerprint"] == training.data.tags["fingerprint"]


@pytest.mark.timeout(600)
def test_own_data_gets_its_own_champion_and_travels_with_dvc_push_to_a_clone_that_runs_only_register(pushed, tmp_path):
    """README's own-data path in a teammate's clone whose store holds the built-in data's champion: the folder is
    `dvc add`ed, its pipeline registers a model of its own beside the champion it leaves alone, and `git push` +
    `dvc push` carry it all: the built-in data's stage never runs, and the next clone pulls everything and runs only
    `register`."""
    first = pulled_clone(pushed, tmp_path / "teammate")
    dvc(first, "repro")
    client, portrait = store_of(first)
    champion = client.get_model_version_by_alias(portrait, CHAMPION)

    params = load_params(first / "params.yaml").synthesize
    own = dataclasses.replace(params, identities=params.identities + 1)  # other data, where a user's folder would be
    synthesize(own, first / "data" / "skpairs")
    dvc(first, "add", "data/skpairs")
    built_in = {path: path.stat().st_mtime_ns for path in (first / "data" / "raw").rglob("*")}
    output = dvc(first, "exp", "run", "-S", "data.source=data/skpairs")
    assert ran(output) == set(STAGES) - REMADE
    assert {path: path.stat().st_mtime_ns for path in (first / "data" / "raw").rglob("*")} == built_in  # not rewritten
    _, name = store_of(first)
    assert name != portrait and name.endswith("skpairs")
    assert client.get_model_version_by_alias(name, CHAMPION).tags["data_hash"] != champion.tags["data_hash"]
    assert client.get_model_version_by_alias(portrait, CHAMPION).version == champion.version
    assert len(client.search_model_versions(f"name = '{portrait}'")) == 1

    git(first, "add", "-A")
    git(first, "commit", "-qm", "own data")
    dvc(first, "push")
    clone = pulled_clone((first, first), tmp_path / "next")
    assert (clone / "data" / "skpairs" / "thermal").is_dir()
    assert "register" in dvc(clone, "status") and "skpairs" not in dvc(clone, "status")
    assert ran(dvc(clone, "repro")) == {"register"}
    assert git(clone, "status", "--porcelain") == ""
