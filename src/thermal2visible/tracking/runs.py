"""The run a stage logs to and what ties it to its code (git commit, whether the sources differed), its data (an
MLflow dataset whose digest is the data hash, tracking.store) and its DVC experiment; finding runs.

A training's run is a Lightning `MLFlowLogger` (under DDP only rank 0 creates the run and logs to it); every other
stage's is a `StageRun`, the same calls through MLflow's client, so that those stages never load Lightning.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from contextlib import contextmanager
from pathlib import Path
from time import time
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

import mlflow
from mlflow import MlflowClient
from mlflow.data.dataset_source_registry import resolve_dataset_source
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking.context.registry import resolve_tags
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

from thermal2visible.config.schema import Params
from thermal2visible.tracking.digests import data_hash
from thermal2visible.tracking.store import ensure_experiment, open_store, tracking_uri
from thermal2visible import paths
from thermal2visible.paths import SOURCES

if TYPE_CHECKING:
    from lightning.pytorch.loggers import MLFlowLogger


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
    digest = data_hash(paths.CACHE) if dataset_context else None
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
            log_dataset(logger.experiment, logger.run_id, paths.CACHE, digest, dataset_context)
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


def log_artifact(logger: MLFlowLogger | StageRun, path: str | Path) -> None:
    if logger.run_id:  # None on ranks other than 0
        logger.experiment.log_artifact(logger.run_id, str(path))
