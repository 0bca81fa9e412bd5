"""One training run, start to end: whether it continues a checkpoint and which MLflow run it logs to (its tags are
written and read here), the fit with every callback of a stage training (build_trainer adds the machine's own), and
the end: the best epoch's generator and the stage's record written once, on disk and on the run. Under DDP every
process runs it; only rank 0 writes files or logs."""

from __future__ import annotations

import csv
import hashlib
import logging
import os
import shutil
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from mlflow.exceptions import MlflowException

from thermal2visible import paths
from thermal2visible.config.schema import Params
from thermal2visible.data.datamodule import PairedDataModule
from thermal2visible.errors import PipelineError
from thermal2visible.models.networks import build_networks
from thermal2visible.paths import BEST_GENERATOR, CHECKPOINTS
from thermal2visible.stage_records import write_record
from thermal2visible.tracking.checkpointed_logger import CheckpointedMLFlowLogger, MetricsInCheckpoint
from thermal2visible.tracking.plots import save_psnr_curve
from thermal2visible.tracking.grid_logger import ImageGridLogger
from thermal2visible.tracking.publish import FINGERPRINT_TAG, TRAINING_SECTIONS, log_training_record
from thermal2visible.tracking.runs import start_run
from thermal2visible.tracking.store import open_store, tracking_uri
from thermal2visible.training.early_stopping import PsnrEarlyStopping, StopRule
from thermal2visible.training.resume_decision import ResumeAgreement, decide_resume
from thermal2visible.training.module import Pix2Pix
from thermal2visible.training.parked_runs import prune_parked
from thermal2visible.training.precision import RunDevice
from thermal2visible.training.progress import EpochLine
from thermal2visible.training.resume import checkpointing, last_checkpoint
from thermal2visible.training.trainer import build_trainer, process_group_backend, world_size

# What a later start reads to close this run as KILLED when its process died before it finished.
HOST_TAG, PID_TAG = "host", "pid"


@dataclass
class TrainingRun:
    """The MLflow run a training logs to (a logger on every rank, with a run id on rank 0) and the checkpoint it
    continues, if any."""

    params: Params
    device: RunDevice
    fingerprint: str
    logger: CheckpointedMLFlowLogger
    resume_from: Path | None

    @classmethod
    def start(cls, params: Params, device: RunDevice, fingerprint: str) -> TrainingRun:
        """Whether this run continues a checkpoint (rank 0 decides), and the MLflow run it logs to: the continued
        run's, or a new one."""
        t, stop = params.train, params.early_stop
        resume_from, run_id = decide_resume(
            CHECKPOINTS,
            fingerprint,
            t.resume,
            process_group_backend(device.accelerator),
            stale=[BEST_GENERATOR],
            rule=StopRule(stop.window, stop.patience, stop.min_delta, t.min_epochs, t.max_epochs),
        )
        if rank_zero_only.rank == 0:
            run_id = continued_run(run_id, fingerprint, resume_from) if resume_from else None
            close_abandoned_runs(keep=run_id)
            prune_parked(CHECKPOINTS, fingerprint, t.keep_parked_runs)
        tags = {
            FINGERPRINT_TAG: fingerprint,
            "device": device.accelerator,
            "precision": device.precision,
            "memory_format": device.memory_format,
            "world_size": str(world_size(t)),
        }
        logger = start_run(
            params,
            "train",
            TRAINING_SECTIONS,
            run_id=run_id,
            logger_class=CheckpointedMLFlowLogger,
            dataset_context="training",
            tags=tags,
        )
        if logger.run_id:  # rank 0; a continued run gets its new process's
            for key, value in {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}.items():
                logger.experiment.set_tag(logger.run_id, key, value)
        return cls(params, device, fingerprint, logger, resume_from)

    def fit(self, data: PairedDataModule, recognizer, cache_hash: str) -> Fitted | None:
        """Pix2Pix fitted until early stopping, the epoch limit or the time budget ends it; None on every rank but
        0. A SIGTERM or Ctrl-C stops it as a PipelineError that says how to continue."""
        t, manifest, logger = self.params.train, data.manifest, self.logger
        networks = build_networks(
            self.params.model, manifest["image_size"], data.thermal_channels, data.visible_channels
        )
        module = Pix2Pix(*networks, t, recognizer)
        # The preprocess settings the generator is stamped with are the cache's (what its images went through), which
        # refuse_unworkable has checked params.yaml agrees with.
        stop = PsnrEarlyStopping(
            self.params.early_stop.window,
            self.params.early_stop.patience,
            min_delta=self.params.early_stop.min_delta,
            best_path=BEST_GENERATOR,
            metadata={"preprocess": manifest["preprocess"], "fingerprint": self.fingerprint, "data_hash": cache_hash},
        )
        callbacks = [
            stop,
            EpochLine(stop),
            ImageGridLogger(t.image_log_every),
            MetricsInCheckpoint(logger),
            *checkpointing(CHECKPOINTS, self.fingerprint, logger.run_id),
            ResumeAgreement(self.resume_from),
        ]
        trainer = build_trainer(t, self.device, logger=logger, callbacks=callbacks)
        started = time.perf_counter()
        ctrl_c = CtrlC()
        try:
            trainer.fit(module, datamodule=data, ckpt_path=self.resume_from, weights_only=True)
        except SIGTERMException:
            # Lightning stops after the current batch; the epoch it was in is redone (its loader cannot resume mid-way)
            done = len(stop.history)
            if logger.run_id:  # Lightning closed it as FAILED: it was stopped, and a later run continues it
                logger.experiment.set_terminated(logger.run_id, "KILLED")
            raise PipelineError(
                f"stopped by {'Ctrl-C' if ctrl_c.pressed else 'SIGTERM'} after epoch {done}; "
                + (
                    f"{last_checkpoint(CHECKPOINTS)} holds epochs 1-{done}: run again to continue"
                    if done
                    else "no epoch had finished, so the next run starts afresh"
                )
            ) from None
        if trainer.world_size > 1:  # the processes agree, or DDP lost them
            print(
                f"train: rank {trainer.global_rank} of {trainer.world_size} stopped at epoch {len(stop.history)}; "
                f"generator weights {weights_digest(module.generator)}"
            )
        return Fitted(stop, time.perf_counter() - started) if trainer.is_global_zero else None

    def keep(self, fitted: Fitted) -> None:
        """The best epoch's generator published as models/generator.pt with the stage's record, and on the run."""
        t, stop, logger = self.params.train, fitted.stop, self.logger
        # only a time budget ends a run before the window fills (config refuses max_epochs < it)
        if not BEST_GENERATOR.is_file():
            raise PipelineError(
                f"no model to keep: train.max_minutes ({t.max_minutes}) ran out after {len(stop.history)} epoch(s), "
                f"before the {stop.window}-epoch moving average of validation PSNR (early_stop.window) existed; raise "
                "train.max_minutes or lower early_stop.window"
            )
        summary = write_outputs(stop)
        # a tag, not a metric: every metric of the run is a per-epoch curve (the Trainer has finalized the logger)
        logger.experiment.set_tag(logger.run_id, "train_seconds", f"{fitted.seconds:.1f}")
        log_training_record(logger)
        print(
            f"train: best smoothed PSNR {summary['best_psnr_smoothed']:.2f} dB at epoch {summary['best_epoch']} "
            f"(raw {summary['best_psnr']:.2f} dB); stopped at epoch {summary['stopped_epoch']} of at most "
            f"{t.max_epochs}; {fitted.seconds:.0f} s; {paths.GENERATOR} written (fingerprint {self.fingerprint})"
            + (f" (continued from {self.resume_from})" if self.resume_from else "")
        )


@dataclass
class Fitted:
    """What a finished fit leaves rank 0: the stopping decision (with its history) and the fit's wall time."""

    stop: PsnrEarlyStopping
    seconds: float


def write_outputs(stop: PsnrEarlyStopping) -> dict:
    """models/generator.pt (replaced whole), metrics/train.json, metrics/psnr.csv and the PSNR curve."""
    generator = paths.GENERATOR
    generator.parent.mkdir(parents=True, exist_ok=True)
    staged = generator.with_name(f"{generator.name}.{os.getpid()}.tmp")
    shutil.copyfile(BEST_GENERATOR, staged)
    os.replace(staged, generator)
    # numbers only: the fingerprint is in the generator's payload and on the MLflow run
    summary = stop.summary()
    write_record(summary, paths.TRAIN_METRICS)
    with paths.PSNR_CSV.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["epoch", "psnr", "psnr_smoothed"])
        for epoch, (psnr, smoothed) in enumerate(zip(stop.history, stop.smoothed()), start=1):
            writer.writerow([epoch, f"{psnr:.4f}", "" if smoothed is None else f"{smoothed:.4f}"])
    save_psnr_curve(paths.PSNR_CURVE, stop.history, stop.smoothed(), stop.best_epoch, len(stop.history), stop.window)
    return summary


def weights_digest(network) -> str:
    """sha256 of the trainable weights, equal on every DDP process (batch-norm statistics are per process)."""
    digest = hashlib.sha256()
    for name, weight in network.named_parameters():
        digest.update(name.encode() + weight.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


class CtrlC(logging.Filter):
    """The first Ctrl-C stops as SIGTERM does (after the current batch, last.ckpt whole: Lightning's SIGTERM handling,
    which also tells the other processes of a job); a second one at once. `pressed` says which of the two stopped the
    run, and Lightning's "Received SIGTERM" line is left out after a Ctrl-C."""

    def __init__(self):
        super().__init__()
        self.pressed = False
        logging.getLogger("lightning.pytorch.trainer.connectors.signal_connector").addFilter(self)
        signal.signal(signal.SIGINT, self.to_sigterm)

    def to_sigterm(self, signum, frame) -> None:
        self.pressed = True
        print("train: interrupted (Ctrl-C): stopping after the current batch; Ctrl-C again to stop at once")
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.kill(os.getpid(), signal.SIGTERM)

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.pressed and "Received SIGTERM" in record.getMessage())


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
    if tags.get(FINGERPRINT_TAG) != fingerprint:
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
    for run in client.search_runs(experiments, f"{running} and tags.{HOST_TAG} = '{socket.gethostname()}'"):
        pid = run.data.tags.get(PID_TAG, "")
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
