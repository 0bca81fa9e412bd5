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
  2. Every checkpoint carries a stamp: the run's fingerprint (training.fingerprint: a hash of everything that
     defines the trained weights) and its MLflow run id. The keys marked `stops_training()` stay out of it: a
     checkpoint continues under other values that would not have stopped it before its last epoch (`StopRule`).
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
  7. A job of several processes resumes as one: rank 0 alone decides, parks and restores (training.resume_decision), the
     other processes adopt its decision; before any checkpoint is loaded or any step taken every process checks that it
     sees the checkpoint rank 0 chose (`ResumeAgreement`): nodes that do not see the same checkpoints/ stop together,
     naming what each found, instead of drifting apart.
"""

from __future__ import annotations

import fcntl
import os
import re
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only

from thermal2visible.errors import PipelineError
from thermal2visible.training.fingerprint import FINGERPRINT
from thermal2visible.training.early_stopping import StopRule, checkpoint_history

STAMP = "thermal2visible_run"  # checkpoint key: which run this checkpoint continues
LAST = "last"  # the checkpoint after every epoch: last.ckpt
RUN_ID = re.compile(r"[0-9a-f]{32}")  # an MLflow run id
UNREADABLE = "unreadable"  # where a checkpoint whose stamp cannot be trusted is parked


class RunStamp(Callback):
    """Stores the run's fingerprint and MLflow run id in every checkpoint."""

    def __init__(self, fingerprint: str, mlflow_run_id: str | None):
        self.stamp = {"fingerprint": fingerprint, "mlflow_run_id": mlflow_run_id}

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        checkpoint[STAMP] = dict(self.stamp)


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
    it moves files (training.resume_decision hands its decision to the other processes).

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
