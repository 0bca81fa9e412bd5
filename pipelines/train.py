"""Stage `train`: Pix2Pix on data/cache with PSNR early stopping, resumable, tracked in MLflow.

Writes models/generator.pt (the generator of the best smoothed-PSNR epoch, stamped with the run's fingerprint),
metrics/train.json (the stopping decision), metrics/psnr.csv, reports/psnr_curve.png: a pure function of code,
params, data and the machine's kind, so a rerun reproduces them byte for byte. The MLflow run id and wall-clock
seconds go to MLflow only (the run is found by its `generator_sha256` tag: tracking.publish). Resume state stays in
checkpoints/ (last.ckpt + best_generator.pt), which is no DVC output: it never travels through a DVC remote, and
a teammate's `dvc pull` leaves nothing to retrain. models/generator.pt is written only when training ends normally.
Under DDP (train.devices x train.num_nodes > 1) every process runs this script; only rank 0 writes files or logs.
"""

# first, before torch loads OpenMP: it sets OpenMP's spin for trainings that share the cores
import thermal2visible.training.spin  # noqa: F401

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

from lightning.pytorch import seed_everything
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from thermal2visible.cli import run_stage
from thermal2visible.errors import PipelineError
from thermal2visible.config.schema import Params, TrainConfig
from thermal2visible.data.datamodule import PairedDataModule
from thermal2visible.models.payloads import load_recognizer
from thermal2visible.tracking.checkpointed_logger import CheckpointedMLFlowLogger, MetricsInCheckpoint
from thermal2visible.tracking.figures import save_psnr_curve
from thermal2visible.tracking.grid_logger import ImageGridLogger
from thermal2visible.tracking.publish import TRAINING_SECTIONS
from thermal2visible.tracking.runs import close_abandoned_runs, continued_run, log_artifact, start_run
from thermal2visible.tracking.digests import GENERATOR_DIGEST, data_hash, file_digest
from thermal2visible.training.early_stopping import PsnrEarlyStopping, StopRule
from thermal2visible.training.job import decide_resume
from thermal2visible.training.module import Pix2Pix
from thermal2visible.models.networks import build_networks
from thermal2visible.training.parked_runs import prune_parked
from thermal2visible.training.progress import EpochLine
from thermal2visible.training.precision import RunDevice, run_device
from thermal2visible.training.resume import (
    ResumeAgreement,
    checkpointing,
    last_checkpoint,
    one_training_at_a_time,
    run_fingerprint,
)
from thermal2visible.training.trainer import (
    build_trainer,
    per_process_batch,
    process_group_backend,
    refuse_unworkable,
    world_size,
)
from thermal2visible.models.networks import check_networks
from thermal2visible.records import write_record
from thermal2visible.paths import (
    BEST_GENERATOR,
    CACHE,
    CHECKPOINTS,
    GENERATOR,
    MANIFEST,
    PSNR_CSV,
    PSNR_CURVE,
    RECOGNIZER,
    TRAIN_METRICS,
)


def identity_recognizer(params: Params, identities: list[str]):
    """(frozen recognizer, its file hash) when the identity loss is on, else (None, None): never read otherwise."""
    if params.train.lambda_id == 0:
        return None, None
    return load_recognizer(RECOGNIZER, identities)


def write_outputs(stop: PsnrEarlyStopping) -> dict:
    GENERATOR.parent.mkdir(parents=True, exist_ok=True)
    staged = GENERATOR.with_name(f"{GENERATOR.name}.{os.getpid()}.tmp")
    shutil.copyfile(BEST_GENERATOR, staged)
    os.replace(staged, GENERATOR)
    # numbers only: the fingerprint is in the generator's payload and on the MLflow run
    summary = stop.summary()
    write_record(summary, TRAIN_METRICS)
    with PSNR_CSV.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["epoch", "psnr", "psnr_smoothed"])
        for epoch, (psnr, smoothed) in enumerate(zip(stop.history, stop.smoothed()), start=1):
            writer.writerow([epoch, f"{psnr:.4f}", "" if smoothed is None else f"{smoothed:.4f}"])
    save_psnr_curve(PSNR_CURVE, stop.history, stop.smoothed(), stop.best_epoch, len(stop.history), stop.window)
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


def main(params: Params) -> None:
    t = params.train
    check_networks(params.model, params.preprocess.image_size)  # refused by name before any data is read
    if not (CACHE / MANIFEST).is_file():
        raise PipelineError(f"{CACHE / MANIFEST}: missing; run the preprocess stage first (dvc repro preprocess)")
    seed_everything(t.seed, workers=True, verbose=False)
    data = PairedDataModule(CACHE, per_process_batch(t), params.loader)
    refuse_unworkable(params, data.manifest)
    recognizer, recognizer_hash = identity_recognizer(params, data.identities)
    cache_hash = data_hash(CACHE)
    device = run_device(t)
    fingerprint = run_fingerprint(params, cache_hash, recognizer_hash, device)
    with one_training_at_a_time(CHECKPOINTS, fingerprint):
        train(params, device, data, recognizer, cache_hash, fingerprint)


@dataclass
class Run:
    """The MLflow run a training logs to (a logger on every rank, with a run id on rank 0) and the checkpoint it
    continues, if any."""

    logger: CheckpointedMLFlowLogger
    resume_from: Path | None
    fingerprint: str


@dataclass
class Fitted:
    """What a finished fit leaves rank 0: the stopping decision (with its history) and the fit's wall time."""

    stop: PsnrEarlyStopping
    seconds: float


def train(
    params: Params, device: RunDevice, data: PairedDataModule, recognizer, cache_hash: str, fingerprint: str
) -> None:
    """The training itself, on the process that holds checkpoints/ (and its DDP peers)."""
    run = start_training_run(params, device, fingerprint)
    fitted = fit(params, device, data, recognizer, cache_hash, run)
    if fitted is not None:
        keep(params.train, fitted, run)


def start_training_run(params: Params, device: RunDevice, fingerprint: str) -> Run:
    """Whether this run continues a checkpoint (rank 0 decides), and the MLflow run it logs to: the continued run's,
    or a new one."""
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
    logger = start_run(
        params,
        "train",
        TRAINING_SECTIONS,
        run_id=run_id,
        logger_class=CheckpointedMLFlowLogger,
        dataset_context="training",
        tags={
            "fingerprint": fingerprint,
            "device": device.accelerator,
            "precision": device.precision,
            "memory_format": device.memory_format,
            "world_size": str(world_size(params.train)),
        },
    )
    if logger.run_id:  # rank 0; a continued run gets its new process's: what a later start checks to close this
        # run as KILLED if its process died before it finished
        for key, value in {"host": socket.gethostname(), "pid": str(os.getpid())}.items():
            logger.experiment.set_tag(logger.run_id, key, value)
    return Run(logger, resume_from, fingerprint)


def fit(
    params: Params, device: RunDevice, data: PairedDataModule, recognizer, cache_hash: str, run: Run
) -> Fitted | None:
    """Pix2Pix fitted with every callback of the stage until early stopping, the epoch limit or the time budget
    ends it; None on every rank but 0. A SIGTERM or Ctrl-C stops it as a PipelineError that says how to continue."""
    t, manifest = params.train, data.manifest
    module = Pix2Pix(
        *build_networks(params.model, manifest["image_size"], data.thermal_channels, data.visible_channels),
        t,
        recognizer,
    )
    # The preprocess settings the generator is stamped with are the cache's (what its images went through), which
    # refuse_unworkable has checked params.yaml agrees with.
    stop = PsnrEarlyStopping(
        params.early_stop.window,
        params.early_stop.patience,
        min_delta=params.early_stop.min_delta,
        best_path=BEST_GENERATOR,
        metadata={"preprocess": manifest["preprocess"], "fingerprint": run.fingerprint, "data_hash": cache_hash},
    )
    trainer = build_trainer(
        t,
        device,
        logger=run.logger,
        callbacks=[
            stop,
            EpochLine(stop),
            ImageGridLogger(t.image_log_every),
            MetricsInCheckpoint(run.logger),
            *checkpointing(CHECKPOINTS, run.fingerprint, run.logger.run_id),
            ResumeAgreement(run.resume_from),
        ],
    )
    started = time.perf_counter()
    ctrl_c = CtrlC()
    try:
        trainer.fit(module, datamodule=data, ckpt_path=run.resume_from, weights_only=True)
    except SIGTERMException:
        # Lightning stops after the current batch; the epoch it was in is redone (its loader cannot resume mid-way)
        done = len(stop.history)
        if run.logger.run_id:  # Lightning closed it as FAILED: it was stopped, and a later run continues it
            run.logger.experiment.set_terminated(run.logger.run_id, "KILLED")
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


def keep(t: TrainConfig, fitted: Fitted, run: Run) -> None:
    """The best epoch's generator published as models/generator.pt with the stage's record, and on the MLflow run."""
    stop, logger = fitted.stop, run.logger
    # only a time budget ends a run before the window fills (config refuses max_epochs < it)
    if not BEST_GENERATOR.is_file():
        raise PipelineError(
            f"no model to keep: train.max_minutes ({t.max_minutes}) ran out after {len(stop.history)} epoch(s), before "
            f"the {stop.window}-epoch moving average of validation PSNR (early_stop.window) existed; raise "
            "train.max_minutes or lower early_stop.window"
        )
    summary = write_outputs(stop)
    # a tag, not a metric: every metric of the run is a per-epoch curve (the Trainer has finalized the logger anyway)
    logger.experiment.set_tag(logger.run_id, "train_seconds", f"{fitted.seconds:.1f}")
    # what the register stage finds this run by: the weights it wrote, not its settings (a torchrun job and a DVC
    # run of the same params.yaml write different weights under one fingerprint)
    logger.experiment.set_tag(logger.run_id, GENERATOR_DIGEST, file_digest(GENERATOR))
    for path in (GENERATOR, PSNR_CURVE, PSNR_CSV):
        log_artifact(logger, path)
    print(
        f"train: best smoothed PSNR {summary['best_psnr_smoothed']:.2f} dB at epoch {summary['best_epoch']} "
        f"(raw {summary['best_psnr']:.2f} dB); stopped at epoch {summary['stopped_epoch']} of at most "
        f"{t.max_epochs}; {fitted.seconds:.0f} s; {GENERATOR} written (fingerprint {run.fingerprint})"
        + (f" (continued from {run.resume_from})" if run.resume_from else "")
    )


if __name__ == "__main__":
    run_stage(main, __doc__)
