"""The Lightning Trainer built from params: device, precision, DDP over processes/nodes, resumable checkpoints."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_only
from torch.nn.parallel import DistributedDataParallel

from thermal2visible.errors import ConfigError
from thermal2visible.config import Params, TrainConfig

STAMP = "thermal2visible_run"  # checkpoint key: which run this checkpoint continues


def resolve_accelerator(accelerator: str) -> str:
    if accelerator == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    return accelerator


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN has bf16 kernels for this CPU (AVX512-BF16, AMX or AVX2-VNNI-2). Elsewhere bf16 autocast is
    emulated through fp32 conversions: measured 10x slower than fp32 on an AVX2-only EPYC."""
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def resolve_precision(precision: str, accelerator: str) -> str:
    """The precision Lightning gets. `auto`: the paper's 16-mixed on GPUs; on CPUs bf16-mixed where the CPU computes
    in bf16, else 32-true. fp16 autocast on CPU is 20-50x slower than bf16, so 16-mixed on a CPU is taken as auto."""
    if accelerator != "cpu":
        return "16-mixed" if precision == "auto" else precision
    cpu_mixed = "bf16-mixed" if cpu_has_native_bf16() else "32-true"
    if precision == "16-mixed":
        print(f"notice: train.precision 16-mixed is for GPUs; using {cpu_mixed} on this CPU")
        return cpu_mixed
    if precision == "bf16-mixed" and cpu_mixed == "32-true":
        print("notice: this CPU has no bf16 instructions: train.precision bf16-mixed runs emulated, several times "
              "slower than 32-true (train.precision: auto picks the faster)")
    return cpu_mixed if precision == "auto" else precision


def world_size(train: TrainConfig) -> int:
    return train.devices * train.num_nodes


def per_process_batch(train: TrainConfig) -> int:
    """train.batch_size is the global batch; each process takes an equal share (config checks it divides)."""
    return train.batch_size // world_size(train)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write to a temporary file beside the checkpoint, then rename: a kill mid-write leaves the old one whole.

    (Lightning's own save goes through a temporary file in the system temp dir and `shutil.move`, which copies,
    not renames, when that dir is on another filesystem.)
    """

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        torch.save(checkpoint, temporary)
        os.replace(temporary, path)


class GanDDPStrategy(DDPStrategy):
    """DDP for Pix2Pix's two networks and two backward passes per step.

    Stock DDP wraps the whole LightningModule in one DistributedDataParallel, which then expects every weight of G
    and D in each backward and fails on the D step ("parameters that were not used in producing the loss").
    Here G and D get a wrapper each (`Pix2Pix.distribute`): the D step's backward reduces D's gradients, the
    G step's reduces G's, and no unused-parameter search is needed.
    """

    def setup_environment(self) -> None:
        if self.root_device.type == "cpu":
            # One process per core share: several processes with all-core thread pools just fight for the cores.
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // self.num_processes))
        super().setup_environment()

    def _setup_model(self, model: LightningModule) -> LightningModule:
        model.distribute(lambda network: DistributedDataParallel(
            network, device_ids=self.determine_ddp_device_ids(), **self._ddp_kwargs))
        return model

    def _register_ddp_hooks(self) -> None:
        """No communication hooks: they were slower on CPU (gloo) and need the single wrapper we do not have."""


def build_strategy(train: TrainConfig, accelerator: str):
    if train.strategy not in ("auto", "ddp"):
        raise ConfigError(f"train.strategy: {train.strategy!r} is not one of auto, ddp")
    if train.strategy == "auto" and world_size(train) == 1:
        return "auto"
    cpu = accelerator == "cpu"
    return GanDDPStrategy(process_group_backend="gloo" if cpu else "nccl", gradient_as_bucket_view=True)


def build_trainer(train: TrainConfig, callbacks: Sequence[Callback] = (), logger: Logger | bool = False,
                  **overrides) -> Trainer:
    """A Trainer for `train`; `overrides` go to Trainer as they are (tests: limit_train_batches, ...)."""
    accelerator = resolve_accelerator(train.accelerator)
    if train.sync_batchnorm and accelerator == "cpu":
        raise ConfigError("train.sync_batchnorm: SyncBatchNorm needs GPUs (torch raises on CPU); set it to false")
    options = dict(
        accelerator=accelerator, devices=train.devices, num_nodes=train.num_nodes,
        strategy=build_strategy(train, accelerator), precision=resolve_precision(train.precision, accelerator),
        sync_batchnorm=train.sync_batchnorm, min_epochs=train.min_epochs, max_epochs=train.max_epochs,
        callbacks=list(callbacks), logger=logger, plugins=[AtomicCheckpointIO()],
        enable_checkpointing=any(isinstance(callback, ModelCheckpoint) for callback in callbacks),
        num_sanity_val_steps=0, enable_model_summary=False, enable_progress_bar=False, log_every_n_steps=1,
    )
    return Trainer(**(options | overrides))


def run_fingerprint(params: Params, data_hash: str, recognizer_hash: str | None = None) -> str:
    """Hash of what defines a training run: a checkpoint continues only a run with the same fingerprint."""
    train = dataclasses.asdict(params.train)
    train.pop("resume")
    defining = {"model": dataclasses.asdict(params.model), "train": train,
                "preprocess": dataclasses.asdict(params.preprocess),
                "early_stop": dataclasses.asdict(params.early_stop), "data": data_hash, "recognizer": recognizer_hash}
    return hashlib.sha256(json.dumps(defining, sort_keys=True).encode()).hexdigest()[:16]


class RunStamp(Callback):
    """Stores the run's fingerprint and MLflow run id in every checkpoint."""

    def __init__(self, fingerprint: str, mlflow_run_id: str | None):
        self.stamp = {"fingerprint": fingerprint, "mlflow_run_id": mlflow_run_id}

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        checkpoint[STAMP] = dict(self.stamp)


def checkpointing(directory: Path, fingerprint: str, mlflow_run_id: str | None) -> list[Callback]:
    """`directory`/last.ckpt after every epoch (with the run's stamp), nothing else.

    (A "top 1" by recency named "last": Lightning's save_last alone only writes when a top-k file was written.)
    """
    return [ModelCheckpoint(dirpath=directory, filename="last", save_top_k=1, enable_version_counter=False),
            RunStamp(fingerprint, mlflow_run_id)]


def find_resume(directory: Path, fingerprint: str, mode: str,
                stale: Sequence[Path] = ()) -> tuple[Path | None, str | None]:
    """(checkpoint to continue from, its MLflow run id), or (None, None) for a fresh start.

    A fresh start deletes last.ckpt and the `stale` files that belonged to the old run (on rank 0).
    """
    last = directory / "last.ckpt"
    if mode == "auto" and last.is_file():
        try:
            stamp = torch.load(last, map_location="cpu", weights_only=True).get(STAMP) or {}
            reason = "belongs to another run (params or data changed)"
        except Exception as error:  # torch.load fails in many ways on a foreign or damaged file; all mean "afresh"
            stamp, reason = {}, f"cannot be read ({type(error).__name__})"
        if stamp.get("fingerprint") == fingerprint:
            return last, stamp["mlflow_run_id"]
        if rank_zero_only.rank == 0:
            print(f"notice: {last} {reason}; starting fresh")
    if rank_zero_only.rank == 0:
        for path in (last, *stale):
            path.unlink(missing_ok=True)
    return None, None
