"""MLflow runs for train / train_recognizer / evaluate, and the figures they log (PSNR curve, image grids).

Every run is a Lightning `MLFlowLogger`; under DDP only rank 0 creates the run and logs to it (the logger is
rank-zero-only). Tracking goes to `MLFLOW_TRACKING_URI`, else `sqlite:///mlflow.db` in the working directory,
with artifacts in ./mlruns beside it.

The data version logged with every run is `data_hash`: the md5 of data/cache/manifest.json. The manifest names
every source file by sha256 and the preprocess params, so it changes exactly when the cache's inputs change
(unlike the dvc.lock hash it exists outside `dvc repro` too, e.g. for a stage run by hand).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Sequence
from urllib.parse import urlsplit

import matplotlib
import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from thermal2visible.errors import ConfigError
from thermal2visible.config import Params
from thermal2visible.pixels import from_model, quantise

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def tracking_uri() -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    if urlsplit(uri).scheme in ("http", "https") and urlsplit(uri).password:
        # MLflow prints the URI in every "View run ... at: <uri>" line: terminals, DVC and CI logs.
        raise ConfigError("MLFLOW_TRACKING_URI: holds a password, which MLflow would print; put the user and "
                          "password in MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD instead")
    return uri


@contextmanager
def first_use_lock(uri: str) -> Iterator[None]:
    """Held while a process opens a local SQLite store, so only one at a time can be creating it.

    MLflow builds a new store's tables on first use, and processes doing that at once break each other
    ("duplicate column name: step", "table _alembic_tmp_metrics already exists"): torchrun nodes, or two runs
    started together on a fresh mlflow.db. A tracking server or PostgreSQL needs no such lock.
    """
    if not uri.startswith("sqlite:///"):
        yield
        return
    with open(uri.removeprefix("sqlite:///").partition("?")[0] + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def open_store(uri: str) -> MlflowClient:
    """A client of `uri`; a new SQLite store gets its tables here, under `first_use_lock`."""
    with first_use_lock(uri):
        return MlflowClient(uri)


def ensure_experiment(client: MlflowClient, name: str) -> None:
    """Create experiment `name` unless it exists; another run creating it at the same moment is no error."""
    if client.get_experiment_by_name(name) is None:
        try:
            client.create_experiment(name)
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise


class CheckpointedMLFlowLogger(MLFlowLogger):
    """An MLFlowLogger that logs each epoch once, even when a killed run resumes and repeats an epoch.

    Lightning logs an epoch's validation metrics before it writes that epoch's checkpoint, so a run killed in
    between would log them a second time after resuming. Here metrics wait until a checkpoint is on disk: then
    they are logged, and later ones of the same epoch (the training losses, logged after the checkpoint) go
    straight through. Metrics of an epoch that never got its checkpoint die with the process; its rerun logs them.
    The waiting metrics also go into the checkpoint (`MetricsInCheckpoint`): a run killed after writing it but
    before logging them has them logged when it resumes. Left open: a kill in the milliseconds between the
    checkpoint and Lightning's logging of that epoch's training losses loses those points (never duplicates them).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.waiting: list[tuple[dict[str, float], int | None]] = []
        self.checkpointed_step = 0  # the last epoch a checkpoint holds

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if step is not None and step <= self.checkpointed_step:
            super().log_metrics(metrics, step)
        else:
            self.waiting.append((dict(metrics), step))

    def _log_waiting(self) -> None:
        waiting, self.waiting = self.waiting, []
        for metrics, step in waiting:
            super().log_metrics(metrics, step)
            self.checkpointed_step = max(self.checkpointed_step, step or 0)

    @rank_zero_only
    def log_missing(self, waiting: list[tuple[dict[str, float], int]]) -> None:
        """Log those of a checkpoint's waiting metrics that the run does not have yet."""
        for metrics, step in waiting:
            missing = {key: value for key, value in metrics.items()
                       if step not in {m.step for m in self.experiment.get_metric_history(self.run_id, key)}}
            if missing:
                super().log_metrics(missing, step)
            self.checkpointed_step = max(self.checkpointed_step, step)

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback) -> None:
        super().after_save_checkpoint(checkpoint_callback)
        self._log_waiting()

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if status == "success":  # not after a failure: the waiting epoch was never checkpointed
            self._log_waiting()
        super().finalize(status)


class MetricsInCheckpoint(Callback):
    """Keeps a CheckpointedMLFlowLogger's waiting metrics in every checkpoint, and logs the missing ones on resume."""

    def __init__(self, logger: CheckpointedMLFlowLogger):
        self.logger = logger

    def state_dict(self) -> dict:
        return {"waiting": [(metrics, step) for metrics, step in self.logger.waiting if step is not None]}

    def load_state_dict(self, state_dict: dict) -> None:
        self.logger.log_missing(state_dict["waiting"])


def data_hash(cache_dir: str | Path) -> str:
    return hashlib.md5((Path(cache_dir) / "manifest.json").read_bytes()).hexdigest()


def git_tags() -> dict[str, str]:
    """The commit the code came from, and whether the working tree differed from it."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {}
    return {"mlflow.source.git.commit": commit.strip(), "git_dirty": str(bool(git("status", "--porcelain")))}


def start_run(params: Params, name: str, sections: Sequence[str], tags: dict[str, str] | None = None,
              run_id: str | None = None, logger_class: type[MLFlowLogger] = MLFlowLogger) -> MLFlowLogger:
    """A new MLflow run logging `params.flat(*sections)` and `tags`, or (run_id) the existing run to continue.

    Under `mlflow run` (which exports MLFLOW_RUN_ID) a new run is that run's child, in its experiment, so one
    `mlflow run . -e main` shows every stage's run beneath it.
    """
    tags = {**git_tags(), **(tags or {})}
    experiment = params.mlflow.experiment
    client = open_store(tracking_uri())
    parent = os.environ.get("MLFLOW_RUN_ID")
    if parent and run_id is None:
        experiment = client.get_experiment(client.get_run(parent).info.experiment_id).name
        tags[MLFLOW_PARENT_RUN_ID] = parent
    ensure_experiment(client, experiment)  # MLFlowLogger's own get-or-create fails when two runs race
    logger = logger_class(experiment_name=experiment, run_name=name, tracking_uri=tracking_uri(), tags=tags,
                          run_id=run_id)
    if run_id is None:  # a continued run has them already, and MLflow refuses to change a logged param
        logger.log_hyperparams(params.flat(*sections))
    return logger


def log_artifact(logger: MLFlowLogger, path: str | Path) -> None:
    if logger.run_id:  # None on ranks other than 0
        logger.experiment.log_artifact(logger.run_id, str(path))


def _as_rgb(images: torch.Tensor) -> np.ndarray:
    """(B,C,S,S) in [-1,1], C 1 or 3 -> (B,S,S,3) uint8."""
    unit = from_model(images.detach().float().cpu())
    if unit.shape[1] == 1:
        unit = unit.expand(-1, 3, -1, -1)
    return quantise(unit.permute(0, 2, 3, 1).numpy(), np.uint8)


def comparison_grid(thermal: torch.Tensor, generated: torch.Tensor, real: torch.Tensor, gap: int = 2) -> np.ndarray:
    """Rows thermal | generated | real, one column per face (as the paper's Fig. 5/6); uint8 RGB."""
    rows = [_as_rgb(images) for images in (thermal, generated, real)]
    count, side = rows[0].shape[:2]
    grid = np.full((3 * side + 2 * gap, count * side + (count - 1) * gap, 3), 255, np.uint8)
    for r, row in enumerate(rows):
        for c, image in enumerate(row):
            grid[r * (side + gap):r * (side + gap) + side, c * (side + gap):c * (side + gap) + side] = image
    return grid


def save_grid(grid: np.ndarray, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    plt.imsave(path, grid)


def save_psnr_curve(path: str | Path, history: Sequence[float], smoothed: Sequence[float | None],
                    best_epoch: int, stopped_epoch: int, window: int) -> None:
    """Raw and smoothed validation PSNR per epoch, the best smoothed epoch and the stop (the paper's Fig. 4)."""
    epochs = np.arange(1, len(history) + 1)
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot(epochs, history, color="0.7", linewidth=1, label="PSNR")
    smooth = np.array([np.nan if value is None else value for value in smoothed], dtype=float)
    axes.plot(epochs, smooth, color="tab:blue", linewidth=2, label=f"moving average ({window} epochs)")
    if best_epoch:
        axes.plot(best_epoch, smooth[best_epoch - 1], "o", color="tab:green", markersize=8,
                  label=f"best: epoch {best_epoch}, {smooth[best_epoch - 1]:.2f} dB")
    axes.axvline(stopped_epoch, color="tab:red", linestyle="--", label=f"stopped: epoch {stopped_epoch}")
    axes.set(xlabel="epoch", ylabel="validation PSNR (dB)", title="PSNR early stopping")
    axes.legend(loc="lower right")
    axes.grid(alpha=0.3)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


class ImageGridLogger(Callback):
    """Every `every` epochs: thermal | generated | real for the first validation faces, as an MLflow image."""

    def __init__(self, every: int, count: int = 6):
        self.every, self.count = every, count

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: torch.Tensor,
                                batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        epoch = trainer.current_epoch + 1
        if batch_idx or trainer.sanity_checking or not trainer.is_global_zero or self.every < 1 or epoch % self.every:
            return
        n = self.count
        grid = comparison_grid(batch["thermal"][:n], outputs[:n], batch["visible"][:n])
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                logger.experiment.log_image(logger.run_id, grid, key="val_grid", step=epoch)
