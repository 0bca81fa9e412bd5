"""The MLflow store and the identity of every run: where tracking goes, the run a stage logs to, and what ties
that run to its code (git commit, whether the sources differed), its data (an MLflow dataset whose digest is the
data hash) and its DVC experiment.

Tracking goes to `MLFLOW_TRACKING_URI`, else `sqlite:///mlflow.db` in the project folder (`project_root`), with
artifacts in ./mlruns (MLflow's default, fixed when the experiment is made). A training's run is a Lightning
`MLFlowLogger` (under DDP only rank 0 creates the run and logs to it); every other stage's is a `StageRun`, the same
calls through MLflow's client, so that those stages never load Lightning.

The data version is `data_hash`: the md5 of every file of data/cache (its arrays and its manifest, names and bytes),
so it changes whenever what training reads changes, also where the manifest does not (a preprocessing change inside
the arrays). Unlike the dvc.lock hash it exists outside `dvc repro` too, e.g. for a stage run by hand.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import socket
import subprocess
import warnings
from contextlib import contextmanager
from pathlib import Path
from time import time
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence
from urllib.parse import urlsplit

import mlflow
from mlflow import MlflowClient
from mlflow.data.dataset_source_registry import resolve_dataset_source
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking.context.registry import resolve_tags
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

from thermal2visible.config.schema import Params
from thermal2visible.errors import ConfigError
from thermal2visible.paths import CACHE, MANIFEST, SOURCES

if TYPE_CHECKING:
    from lightning.pytorch.loggers import MLFlowLogger

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
EXPERIMENT_KIND, MODEL_DEVELOPMENT = "mlflow.experimentKind", "custom_model_development"


def project_root() -> Path:
    """The folder the project's store belongs to: DVC_ROOT, which `dvc exp run --queue` points at the project rather
    than the temporary copy its stages run in (and `dvc repro` at the project itself), else the working directory."""
    return Path(os.environ.get("DVC_ROOT") or Path.cwd())


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else sqlite:///mlflow.db; a relative SQLite path is the project folder's, made absolute
    so that processes in other folders (a queued experiment's copy, a study's scratch projects) share the store."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    if urlsplit(uri).scheme in ("http", "https") and urlsplit(uri).password:
        # MLflow prints the URI in every "View run ... at: <uri>" line: terminals, DVC and CI logs.
        raise ConfigError(
            "MLFLOW_TRACKING_URI: holds a password, which MLflow would print; put the user and "
            "password in MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD instead"
        )
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not Path(uri[len(prefix) :]).is_absolute():
        return prefix + str(project_root() / uri[len(prefix) :])
    return uri


_HELD: set[str] = set()  # the store locks this process holds (flock would make a second open of one wait forever)


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Held while a process opens a local SQLite store, or registers a version in it: one process at a time.

    MLflow builds a new store's tables on first use, and processes doing that at once break each other
    ("duplicate column name: step", "table _alembic_tmp_metrics already exists"): torchrun nodes, or two runs
    started together on a fresh mlflow.db. Two registrations at once (a `dvc queue start -j 2` sweep) would gate
    against the same champion and race for its alias (MLflow sets an alias by looking it up, then inserting it:
    "UNIQUE constraint failed: registered_model_aliases"). A tracking server or PostgreSQL needs no lock to open,
    and takes registrations as they come.
    """
    path = uri.removeprefix("sqlite:///").partition("?")[0] + ".lock"
    if not uri.startswith("sqlite:///") or path in _HELD:  # a holder opening the store again never waits on itself
        yield
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        _HELD.add(path)
        try:
            yield
        finally:
            _HELD.discard(path)


def open_store(uri: str) -> MlflowClient:
    """A client of `uri`; a new SQLite store gets its tables here, under `store_lock`."""
    with store_lock(uri):
        return MlflowClient(uri)


def ensure_experiment(client: MlflowClient, name: str) -> None:
    """Create experiment `name` unless it exists; another run creating it at the same moment is no error.

    It is marked as model development, so MLflow's UI shows it as a training experiment, not a GenAI one. MLflow puts
    a new experiment's artifacts in ./mlruns/<id> of the working directory; a stage of a queued DVC experiment runs
    in a temporary copy of the project, so there they go to the project's mlruns/<name> instead.
    """
    if client.get_experiment_by_name(name) is None:
        elsewhere = Path.cwd().resolve() != project_root().resolve()
        location = (project_root() / "mlruns" / re.sub(r"[^\w.-]", "_", name)).resolve().as_uri() if elsewhere else None
        try:
            client.create_experiment(name, location, tags={EXPERIMENT_KIND: MODEL_DEVELOPMENT})
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise


def data_hash(cache_dir: str | Path) -> str:
    """md5 of the cache's files, each by its path inside the cache and its bytes (read in blocks: any size)."""
    root, digest = Path(cache_dir), hashlib.md5()
    if not (root / MANIFEST).is_file():
        raise FileNotFoundError(root / MANIFEST)
    for path in sorted(path for path in root.rglob("*") if path.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        with open(path, "rb") as file:
            digest.update(hashlib.file_digest(file, "md5").digest())
    return digest.hexdigest()


GENERATOR_DIGEST = "generator_sha256"  # on train and evaluate runs, registered versions, eval.json and export.json


def file_digest(path: str | Path) -> str:
    """sha256 of a file: what a run or a registered version is found by (tracking.publish)."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def git_tags() -> dict[str, str]:
    """The commit the code came from, and whether the sources (not the pipeline's outputs) differed from it."""

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {}
    changed = git("status", "--porcelain", "--", *map(str, SOURCES))
    return {"mlflow.source.git.commit": commit.strip(), "git_dirty": str(bool(changed)).lower()}


def run_identity() -> dict[str, str]:
    """Tags naming what produced a run: git commit and dirtiness, and the DVC experiment it ran in (`dvc exp run`
    exports DVC_EXP_NAME to its stages; a plain `dvc repro` or a script run alone has none)."""
    return git_tags() | {"dvc_experiment": os.environ.get("DVC_EXP_NAME", "none")}


def log_dataset(client: MlflowClient, run_id: str, cache_dir: Path, digest: str, context: str) -> None:
    """The cache as an MLflow dataset input of the run (the UI's Datasets panel), its digest the data hash."""
    with warnings.catch_warnings():
        # MLflow registers its local-file source twice (schemes "" and "file") and warns that it picked one of the two
        warnings.filterwarnings("ignore", "The specified dataset source can be interpreted in multiple ways")
        source = resolve_dataset_source(str(cache_dir.resolve()))
    dataset = MetaDataset(source, name=cache_dir.name, digest=digest)
    # Dataset.to_dict (name, digest, source, source_type[, schema]) is the public form of the run's dataset entity
    inputs = [DatasetInput(Dataset(**dataset.to_dict()), [InputTag(MLFLOW_DATASET_CONTEXT, context)])]
    try:
        client.log_inputs(run_id, inputs)
    except MlflowException:  # another run created the same dataset row at the same moment: it exists now
        client.log_inputs(run_id, inputs)


class StageRun:
    """The MLflow run of a stage that does not train: Lightning's `MLFlowLogger` constructor and the calls the stages
    make of it (log_hyperparams, log_metrics, finalize, run_id, experiment), written with MLflow's client. Tags,
    params and metrics come out as the logger writes them: MLflow's context tags (user, source), `mlflow.runName`,
    param values as text of at most 250 characters."""

    def __init__(
        self, experiment_name: str, run_name: str, tracking_uri: str, tags: dict[str, str], run_id: str | None = None
    ):
        self.experiment = MlflowClient(tracking_uri)
        if run_id is None:
            experiment_id = self.experiment.get_experiment_by_name(experiment_name).experiment_id
            run_tags = resolve_tags(tags | {MLFLOW_RUN_NAME: run_name})
            run_id = self.experiment.create_run(experiment_id, tags=run_tags).info.run_id
        self.run_id = run_id

    def log_hyperparams(self, params: Mapping[str, object]) -> None:
        entries = [Param(key, str(value)[:250]) for key, value in params.items()]
        for start in range(0, len(entries), 100):  # MLflow takes at most 100 params per batch
            self.experiment.log_batch(self.run_id, params=entries[start : start + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        now = int(time() * 1000)
        entries = [Metric(key, value, now, step or 0) for key, value in metrics.items()]
        self.experiment.log_batch(self.run_id, metrics=entries)

    def finalize(self, status: str = "success") -> None:
        self.experiment.set_terminated(self.run_id, "FINISHED" if status in ("success", "finished") else "FAILED")


def start_run(
    params: Params,
    name: str,
    sections: Sequence[str],
    tags: dict[str, str] | None = None,
    run_id: str | None = None,
    logger_class: type[MLFlowLogger] | type[StageRun] = StageRun,
    dataset_context: str | None = None,
) -> MLFlowLogger | StageRun:
    """A new MLflow run logging `params.flat(*sections)` and `tags`, or (run_id) the existing run to continue.

    Every run carries `run_identity`. With `dataset_context` (training, evaluation) it reads data/cache: the run
    is tagged with its `data_hash` and gets the cache as its dataset input in that context.
    Every run goes to the project's experiment (mlflow.experiment). Under `mlflow run` (which exports MLFLOW_RUN_ID)
    a new run is that run's child, so `mlflow run . --experiment-name <the same>` shows every stage's run beneath it.
    """
    tags = {**run_identity(), **(tags or {})}
    digest = data_hash(CACHE) if dataset_context else None
    if digest:
        tags["data_hash"] = digest
    experiment = params.mlflow.experiment
    client = open_store(tracking_uri())
    parent = os.environ.get("MLFLOW_RUN_ID")
    if parent and run_id is None:
        tags[MLFLOW_PARENT_RUN_ID] = parent
    ensure_experiment(client, experiment)  # MLFlowLogger's own get-or-create fails when two runs race
    logger = logger_class(
        experiment_name=experiment, run_name=name, tracking_uri=tracking_uri(), tags=tags, run_id=run_id
    )
    if run_id is None:  # a continued run has them already, and MLflow refuses to change a logged param
        logger.log_hyperparams(params.flat(*sections))
        if digest and logger.run_id:
            log_dataset(logger.experiment, logger.run_id, CACHE, digest, dataset_context)
    return logger


@contextmanager
def logging_into(run_id: str) -> Iterator[None]:
    """`run_id` (a run `start_run` started) as MLflow's active run, for the calls that log only into the active run
    (a model's `log_model`); it ends FINISHED, or FAILED on an error. Named by its id, it is this run even under
    `mlflow run`, whose MLFLOW_RUN_ID a bare `mlflow.start_run()` would continue instead."""
    with mlflow.start_run(run_id=run_id):
        yield


def newest_run(client: MlflowClient, run_name: str, tags: dict[str, str], status: str | None = None) -> str | None:
    """The newest run named `run_name` carrying every tag of `tags` (and in `status`, if given), in any experiment of
    the store: runs are found by what they are, wherever they went."""
    experiments = [experiment.experiment_id for experiment in client.search_experiments()]
    conditions = [f"attributes.run_name = '{run_name}'", *(f"tags.{key} = '{value}'" for key, value in tags.items())]
    conditions += [f"attributes.status = '{status}'"] if status else []
    runs = client.search_runs(
        experiments, " and ".join(conditions), order_by=["attributes.start_time DESC"], max_results=1
    )
    return runs[0].info.run_id if runs else None


def continued_run(run_id: str | None, fingerprint: str, checkpoint: Path) -> str | None:
    """`run_id` (read from `checkpoint`'s stamp) where that run is a training of `fingerprint` in this store, set
    RUNNING again (a stopped run's status was FAILED or KILLED); else None, with a notice: the resumed training then
    logs to a new run, never to a run that a stamp merely names."""
    if run_id is None:
        return None
    client = open_store(tracking_uri())
    try:
        tags = client.get_run(run_id).data.tags
    except MlflowException:
        tags = {}
    if tags.get("fingerprint") != fingerprint:
        print(
            f"notice: {checkpoint}: its stamp's MLflow run {run_id} is no training of fingerprint {fingerprint} in "
            f"{tracking_uri()}: the resumed training logs to a new run"
        )
        return None
    client.update_run(run_id, status="RUNNING")
    return run_id


def close_abandoned_runs(keep: str | None) -> list[str]:
    """Mark KILLED every `train` run this host started that is still RUNNING though its process is gone (a training
    killed before its first checkpoint, which no later run continues), but `keep`, the run being continued."""
    client = open_store(tracking_uri())
    experiments = [experiment.experiment_id for experiment in client.search_experiments()]
    running = "attributes.run_name = 'train' and attributes.status = 'RUNNING'"
    closed = []
    for run in client.search_runs(experiments, f"{running} and tags.host = '{socket.gethostname()}'"):
        pid = run.data.tags.get("pid", "")
        if run.info.run_id != keep and pid.isdigit() and not process_alive(int(pid)):
            client.set_terminated(run.info.run_id, "KILLED")
            closed.append(run.info.run_id)
    if closed:
        print(f"notice: marked KILLED the train run(s) whose process had died: {', '.join(closed)}")
    return closed


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def log_artifact(logger: MLFlowLogger | StageRun, path: str | Path) -> None:
    if logger.run_id:  # None on ranks other than 0
        logger.experiment.log_artifact(logger.run_id, str(path))
