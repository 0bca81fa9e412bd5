"""What training leaves on disk, and the protocol that keeps it whole through kills, signals and restarts.

Files (under `checkpoints/` and `models/`, see thermal2visible.paths):
  last.ckpt            Lightning's checkpoint after every epoch: weights, optimizers, schedulers, callbacks'
                       state (early stopping's PSNR history, the MLflow metrics not yet logged), and the run stamp.
  best_generator.pt    the generator payload (models/payloads.py) of the best smoothed-PSNR epoch so far
                       (early_stopping.py).
  models/generator.pt  a copy of the best payload, published only when a run ends normally (pipelines/train.py).

The protocol:
  1. Every file is written to `<name>.<pid>.tmp` beside it, then renamed over it (`models.payloads.atomic_save`, which
     Lightning's checkpoints go through too: `training.checkpoint_io`): a kill mid-write leaves the previous file whole,
     and a stray `.tmp` is never read.
  2. Every checkpoint carries a stamp: the run's fingerprint (a hash of everything that defines the trained weights:
     the keys config/schema.py marks `defines_weights()`, with the precision, layout, thread count and kernels they
     mean on this machine, the cache's files, the recognizer, and the code that makes the weights with the libraries
     it imports: `training_code`) and its MLflow run id. The keys marked `stops_training()` stay out: a checkpoint
     continues under other values that would not have stopped it before its last epoch (`StopRule`).
  3. At start, `find_resume` continues from last.ckpt only when its fingerprint is this run's; otherwise the old
     run's files are parked in checkpoints/<its fingerprint>/ (the train.keep_parked_runs most recent parked runs
     are kept: training.parked_runs) and this run continues its own parked files, or starts afresh. One training at a
     time holds the folder (`one_training_at_a_time`, an OS lock). A stamp is data read from disk: one whose values
     do not have a fingerprint's and a run id's shape is "unreadable", so no path is ever made from it; and a
     stamp's run id is continued only where that run says the same fingerprint (training.run.continued_run).
  4. Every checkpoint holds every rank's random state (torch CPU and CUDA, numpy, python: `RandomStreams`), taken
     at the epoch's end and restored before the resumed run draws anything: it draws the shuffles, crops, flips
     and dropout masks the uninterrupted run draws, so it ends with the same weights.
  5. The best generator is written only once a checkpoint records its epoch as the best (see
     PsnrEarlyStopping._keep_best), so a kill never leaves a best file the resumed run disagrees with.
  6. An epoch's metrics reach MLflow only once its checkpoint exists, and a resumed run logs those the checkpoint
     holds and MLflow lacks (tracking.CheckpointedMLFlowLogger, MetricsInCheckpoint): none logged twice.
  7. A job of several processes resumes as one: rank 0 alone decides, parks and restores (training.job), the other
     processes adopt its decision; before any checkpoint is loaded or any step taken every process checks that it
     sees the checkpoint rank 0 chose (`ResumeAgreement`): nodes that do not see the same checkpoints/ stop together,
     naming what each found, instead of drifting apart.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import re
import socket
from functools import cache
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only

from thermal2visible.config.schema import Params

from thermal2visible.config.stored import weight_defining
from thermal2visible.errors import PipelineError
from thermal2visible.imports import PACKAGE, code_digest
from thermal2visible.training.early_stopping import StopRule, checkpoint_history
from thermal2visible.paths import PIPELINES
from thermal2visible.training.precision import RunDevice, kernels, run_device
from thermal2visible.training.threads import threads_per_process

STAMP = "thermal2visible_run"  # checkpoint key: which run this checkpoint continues
LAST = "last"  # the checkpoint after every epoch: last.ckpt
FINGERPRINT = re.compile(r"[0-9a-f]{16}")  # what run_fingerprint returns, and so the only name a parked folder has
RUN_ID = re.compile(r"[0-9a-f]{32}")  # an MLflow run id
UNREADABLE = "unreadable"  # where a checkpoint whose stamp cannot be trusted is parked
TRAINING_SCRIPT = PACKAGE.parents[1] / PIPELINES / "train.py"  # in the project the package belongs to


@cache
def training_code() -> str:
    """The digest of the code that makes the weights: the train stage's script itself (not what it imports), and
    the import closures of what it fits (the LightningModule, its networks, the data module, the Trainer) and of
    the early stopping that picks the kept epoch. Tracking, figures, progress lines, records and messages are left
    out, and so are the libraries only they import: rewording a message or upgrading MLflow continues a run."""
    # here, not at the top: the training modules import this one
    from thermal2visible.data.datamodule import PairedDataModule
    from thermal2visible.models.networks import build_networks
    from thermal2visible.training.early_stopping import PsnrEarlyStopping
    from thermal2visible.training.module import Pix2Pix
    from thermal2visible.training.trainer import build_trainer

    fitted = (Pix2Pix, build_networks, PairedDataModule, build_trainer, PsnrEarlyStopping)
    return code_digest([TRAINING_SCRIPT], [Path(inspect.getsourcefile(part)) for part in fitted])


def run_fingerprint(
    params: Params, data_hash: str, recognizer_hash: str | None = None, device: RunDevice | None = None
) -> str:
    """Hash of what defines the trained weights: a checkpoint continues only a run with the same fingerprint.
    `device`: the run's resolved one (by default `run_device(params.train)`)."""
    t, device = params.train, device or run_device(params.train)
    defining = {
        section: {key: getattr(getattr(params, section), key) for key in keys}
        for section, keys in weight_defining().items()
    }
    # What `auto` and `cores` mean on this machine, not the words: a checkpoint carried to a machine (or a container,
    # a taskset, an OMP_NUM_THREADS) where they mean another precision, layout or thread count, or whose kernels
    # round otherwise, starts afresh.
    defining["train"] |= {
        "precision": device.precision,
        "channels_last": device.channels_last,
        "threads": threads_per_process(t.threads, device.accelerator, t.devices),
        "kernels": kernels(device.accelerator),
        # the cap stops a run (StopRule) and shapes the weights only through the learning rate's decay, which ends there
        "lr_decay_ends": t.max_epochs if t.lr_decay_epochs else None,
    }
    defining |= {"data": data_hash, "recognizer": recognizer_hash, "code": training_code()}
    return hashlib.sha256(json.dumps(defining, sort_keys=True).encode()).hexdigest()[:16]


class RunStamp(Callback):
    """Stores the run's fingerprint and MLflow run id in every checkpoint."""

    def __init__(self, fingerprint: str, mlflow_run_id: str | None):
        self.stamp = {"fingerprint": fingerprint, "mlflow_run_id": mlflow_run_id}

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        checkpoint[STAMP] = dict(self.stamp)


def resume_view(checkpoint: Path | None) -> str:
    """What a rank would continue: the checkpoint's run and position as this rank's disk holds it, or a fresh start."""
    if checkpoint is None:
        return "a fresh start"
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
        fingerprint, epoch, step = state[STAMP]["fingerprint"], state["epoch"], state["global_step"]
    except FileNotFoundError:
        return f"{checkpoint} (missing)"
    except Exception as error:  # a damaged or foreign file: what this rank sees, for the error every rank raises
        return f"{checkpoint} (unreadable: {type(error).__name__})"
    return f"{checkpoint} (fingerprint {fingerprint}, epoch {epoch}, step {step})"


class ResumeAgreement(Callback):
    """Rank 0 decides how the job resumes (training.job); every other rank adopts the decision. Before any checkpoint
    is loaded or any step taken, each rank's view of that checkpoint is compared with rank 0's; where one differs
    (nodes that do not share checkpoints/), every rank stops with the same error naming what each found, instead of
    one node continuing and the others failing or starting afresh: Adam states that differ, replicas that drift,
    ranks that stop at different epochs and hang."""

    def __init__(self, resume_from: Path | None):
        self.resume_from = resume_from

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.world_size == 1:  # nothing to agree with: a single process never reads its checkpoint twice
            return
        views = [None] * trainer.world_size
        torch.distributed.all_gather_object(views, (socket.gethostname(), resume_view(self.resume_from)))
        if any(view != views[0][1] for _, view in views):
            found = "; ".join(f"rank {rank} on {host}: {view}" for rank, (host, view) in enumerate(views))
            raise PipelineError(
                f"the job's processes disagree on how to resume ({found}). Rank 0 decides for the job: every node "
                "must see the same checkpoints/ (a shared file system, or a copy of node 0's folder on each node)"
            )


def last_checkpoint(directory: Path) -> Path:
    return directory / (LAST + ModelCheckpoint.FILE_EXTENSION)


def checkpointing(directory: Path, fingerprint: str, mlflow_run_id: str | None) -> list[Callback]:
    """`directory`/last.ckpt after every epoch (with the run's stamp), nothing else.

    (A "top 1" by recency named "last": Lightning's save_last alone only writes when a top-k file was written.)
    """
    # The folder always holds the lock and other runs' kept state: Lightning's warning that it is not empty tells a
    # user nothing they could act on.
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    return [
        ModelCheckpoint(dirpath=directory, filename=LAST, save_top_k=1, enable_version_counter=False),
        RunStamp(fingerprint, mlflow_run_id),
    ]


class UntrustedStamp(Exception):
    """A checkpoint's stamp that is not what `RunStamp` writes."""


def read_stamp(checkpoint: Path) -> dict:
    """The stamp of `checkpoint`, checked: {"fingerprint": 16 hex digits, "mlflow_run_id": 32 hex digits or None}.
    An unstamped checkpoint (one Lightning wrote without RunStamp) has fingerprint "unstamped"."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
    stamp = state.get(STAMP) if isinstance(state, dict) else None
    if stamp is None:
        return {"fingerprint": "unstamped", "mlflow_run_id": None}
    for key, shape in (("fingerprint", FINGERPRINT), ("mlflow_run_id", RUN_ID)):
        value = stamp.get(key) if isinstance(stamp, dict) else None
        if not (isinstance(value, str) and shape.fullmatch(value)) and not (key == "mlflow_run_id" and value is None):
            raise UntrustedStamp(f"its {STAMP}.{key} is {str(value)[:40]!r}, not {shape.pattern}")
    return {"fingerprint": stamp["fingerprint"], "mlflow_run_id": stamp["mlflow_run_id"]}


def find_resume(
    directory: Path, fingerprint: str, mode: str, stale: Sequence[Path] = (), rule: StopRule | None = None
) -> tuple[Path | None, str | None]:
    """(checkpoint to continue from, its stamp's MLflow run id), or (None, None) for a fresh start. Rank 0's alone:
    it moves files (training.job hands its decision to the other processes).

    Resume state is kept per fingerprint: another run's last.ckpt and `stale` files are parked in
    `directory/<its fingerprint>/` (kept within training.parked_runs' bound), and brought back when a run of that
    fingerprint starts (`resume: auto`), which then continues it. A checkpoint that cannot be read, or whose stamp is
    not one this code writes, is parked in `directory/unreadable/`. A checkpoint of this fingerprint that `rule`
    (this run's stop settings) would have stopped before its last epoch is parked too, and this run starts afresh:
    continuing it would keep a model this run could never have trained.
    """
    last = last_checkpoint(directory)
    notice = None
    if last.is_file():
        try:
            stamp = read_stamp(last)
            owner = stamp["fingerprint"]
            notice = f"{last} is another run's (fingerprint {owner}): kept in {directory / owner}"
        except Exception as error:  # torch.load fails in many ways on a foreign or damaged file; all mean "park it"
            stamp, owner = {}, UNREADABLE
            why = error if isinstance(error, UntrustedStamp) else type(error).__name__
            notice = f"{last} cannot be read ({why}): kept in {directory / owner}"
        if mode == "auto" and owner == fingerprint:
            overrun = overrun_by(last, rule)
            if overrun is None:
                return last, stamp["mlflow_run_id"]
            move_run_files(directory, directory, directory / owner, (last, *stale))
            print(f"notice: {last} is this run's, but {overrun}: kept in {directory / owner}; starting fresh")
            return None, None
        move_run_files(directory, directory, directory / owner, (last, *stale))
    parked = directory / fingerprint
    if mode == "auto" and last_checkpoint(parked).is_file():
        try:
            stamp = read_stamp(last_checkpoint(parked))
        except Exception:
            stamp = {}
        if stamp.get("fingerprint") != fingerprint:  # planted or damaged: not this run's to continue
            move_run_files(directory, parked, directory / UNREADABLE, (last, *stale))
            print(f"notice: {last_checkpoint(parked)} is not this run's: kept in {directory / UNREADABLE}")
            return None, None
        overrun = overrun_by(last_checkpoint(parked), rule)
        if overrun is not None:
            print(f"notice: {last_checkpoint(parked)} is this run's, but {overrun}: left there; starting fresh")
            return None, None
        move_run_files(directory, parked, directory, (last, *stale))
        if notice:
            print(f"notice: {notice}; continuing this run's own from {parked}")
        return last, stamp["mlflow_run_id"]
    if notice:
        print(f"notice: {notice}; starting fresh")
    return None, None


def overrun_by(checkpoint: Path, rule: StopRule | None) -> str | None:
    """Why `checkpoint` went past where `rule` stops a run (StopRule.overrun), or None."""
    if rule is None:
        return None
    try:
        history = checkpoint_history(torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True))
    except Exception as error:  # as read_stamp: a damaged file cannot be continued
        return f"it cannot be read ({error if isinstance(error, ValueError) else type(error).__name__})"
    return rule.overrun(history)


def move_run_files(directory: Path, source: Path, target: Path, files: Sequence[Path]) -> None:
    """Move a run's files (named as they lie in `directory`) from `source` to `target`, replacing what is there.
    Both are `directory` or a folder right inside it: a name made from a stamp never leads out of it."""
    for folder in (source, target):
        if directory.resolve() not in (folder.resolve(), folder.resolve().parent):
            raise PipelineError(f"{folder}: not a folder of {directory}; nothing was moved")
    target.mkdir(parents=True, exist_ok=True)
    for path in files:
        if (source / path.name).is_file():
            (source / path.name).replace(target / path.name)


@contextmanager
def one_training_at_a_time(directory: Path, fingerprint: str) -> Iterator[None]:
    """Hold `directory`/lock (an OS file lock, released when the process ends however it ends) while training; a
    second training of the same folder is refused, naming the holder's PID and fingerprint. Rank 0 only: the other
    processes of a DDP job are its own."""
    if rank_zero_only.rank != 0:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().split() or ["?", "?"]
            raise PipelineError(
                f"{directory}: another training is using it (PID {holder[0]}, fingerprint {holder[-1]}); one "
                "training at a time per checkpoint folder: wait for it, or train in another clone of the project"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()} {fingerprint}\n")
        lock.flush()
        for unfinished in directory.glob("*.tmp"):  # a killed writer's: with the lock held, nobody else writes here
            unfinished.unlink()
        yield
