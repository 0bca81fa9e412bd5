"""The Lightning Trainer built from params: device, precision, DDP over processes/nodes (resume.py: what it
saves and how a run resumes)."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from datetime import timedelta
from typing import Sequence

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel

from thermal2visible.config.schema import Params, TrainConfig
from thermal2visible.errors import ConfigError
from thermal2visible.training.allocator import keep_freed_memory
from thermal2visible.training.precision import ChannelsLast, RunDevice, run_device
from thermal2visible.training.random_streams import RandomStreams
from thermal2visible.training.checkpoint_io import AtomicCheckpointIO
from thermal2visible.training.shared_cores import TakeTurns
from thermal2visible.training.threads import FreeCoreThreads, threads_per_process
from thermal2visible.training.throughput import Throughput


def world_size(train: TrainConfig) -> int:
    return train.devices * train.num_nodes


def per_process_batch(train: TrainConfig) -> int:
    """train.batch_size is the global batch; each process takes an equal share (config checks it divides)."""
    return train.batch_size // world_size(train)


def refuse_other_preprocessing(params: Params, manifest: dict) -> None:
    """The cache's images went through the manifest's preprocess settings; a run whose params say otherwise (a
    stage run by hand with --set preprocess.KEY=..., or params edited without re-running preprocess) would stamp
    its generator with settings its training images never saw, and serve them."""
    cached = manifest["preprocess"]
    asked = json.loads(json.dumps(dataclasses.asdict(params.preprocess)))  # tuples -> lists, as the manifest holds
    for key, value in asked.items():
        if cached.get(key, "(missing)") != value:
            raise ConfigError(
                f"preprocess.{key}: {value!r} in the params, but the cache was made with "
                f"{cached.get(key, '(missing)')!r}; re-run the preprocess stage (dvc repro preprocess) "
                "or set the param back"
            )


def refuse_unworkable(params: Params, manifest: dict) -> None:
    """ConfigError, naming the key and why, for a run that could not finish, before anything is trained (each of
    these otherwise failed at the end of training, or in its first identity loss), and for preprocess params
    that the cache was not made with. A global batch smaller than the number of processes is refused with the
    params already (config: batch_size divisible by them)."""
    counts, world = manifest["counts"], world_size(params.train)
    if counts["val"] == 0:
        raise ConfigError(
            f"the validation split is empty (the cache was made with preprocess.val_fraction: "
            f"{manifest['preprocess']['val_fraction']}; with data.layout: side_by_side, {params.data.source} needs a "
            "val/ folder): early stopping picks the model by validation PSNR, so training could never choose one"
        )
    if counts["val"] < world:
        raise ConfigError(
            f"train.devices x num_nodes: each of the {world} processes validates its own share of the "
            f"{counts['val']} validation image(s) and needs at least one; raise preprocess.val_fraction "
            "or use fewer processes"
        )
    if params.train.lambda_id > 0:
        unlabelled = sum(source["split"] == "train" and source["identity"] is None for source in manifest["sources"])
        if unlabelled:
            raise ConfigError(
                f"train.lambda_id: {params.train.lambda_id} needs the identity of every training pair, "
                f"but {unlabelled} have no identity folder (put each person's images in their own "
                "folder, or set train.lambda_id: 0)"
            )
    refuse_other_preprocessing(params, manifest)


class GanDDPStrategy(DDPStrategy):
    """DDP for Pix2Pix's two networks and two backward passes per step.

    Stock DDP wraps the whole LightningModule in one DistributedDataParallel, which then expects every weight of G
    and D in each backward and fails on the D step ("parameters that were not used in producing the loss").
    Here G and D get a wrapper each (`Pix2Pix.distribute`): the D step's backward reduces D's gradients, the
    G step's reduces G's, and no unused-parameter search is needed.
    Buffers (batch-norm statistics) are not broadcast in each forward as stock DDP does: D runs twice before its
    backward, and cuDNN's batch norm keeps the running statistics for that backward, so the second forward's broadcast
    overwrote them under autograd ("modified by an inplace operation", rank 1, first GPU check). Every rank takes rank
    0's buffers before each training step and before validation instead (gradients never read them: training-mode
    batch norm normalises with the batch's own statistics), so validation scores the model rank 0 saves.
    `ddp_kwargs` go to each DistributedDataParallel.
    """

    def __init__(self, *, process_group_backend: str | None = None, **ddp_kwargs) -> None:
        super().__init__(process_group_backend=process_group_backend)
        self.ddp_kwargs = ddp_kwargs

    def setup_environment(self) -> None:
        if self.root_device.type == "cpu":
            # One process per core share: several processes with all-core thread pools just fight for the cores.
            torch.set_num_threads(threads_per_process("cores", "cpu", self.num_processes))
        super().setup_environment()

    def configure_ddp(self) -> None:
        """The two wrappers in place of stock DDP's one; the strategy's model stays the LightningModule. No
        communication hooks: they were slower on CPU (gloo) and need the single wrapper we do not have."""
        self.model.distribute(
            lambda network: DistributedDataParallel(
                network, device_ids=self.determine_ddp_device_ids(), broadcast_buffers=False, **self.ddp_kwargs
            )
        )

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        take_rank_zero_buffers(self.lightning_module)

    def on_validation_start(self) -> None:
        super().on_validation_start()
        take_rank_zero_buffers(self.lightning_module)


@torch.no_grad()
def take_rank_zero_buffers(module: torch.nn.Module) -> None:
    """Rank 0's buffers on every rank, in one broadcast per dtype and device."""
    groups: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for buffer in module.buffers():
        groups[buffer.dtype, buffer.device].append(buffer)
    for buffers in groups.values():
        flat = torch.cat([buffer.reshape(-1) for buffer in buffers])
        torch.distributed.broadcast(flat, src=0)
        for buffer, part in zip(buffers, flat.split([buffer.numel() for buffer in buffers])):
            buffer.copy_(part.view_as(buffer))


def process_group_backend(accelerator: str) -> str:
    return "gloo" if accelerator == "cpu" else "nccl"


def build_strategy(train: TrainConfig, accelerator: str):
    if train.strategy not in ("auto", "ddp"):
        raise ConfigError(f"train.strategy: {train.strategy!r} is not one of auto, ddp")
    if train.strategy == "auto" and world_size(train) == 1:
        return "auto"
    return GanDDPStrategy(process_group_backend=process_group_backend(accelerator), gradient_as_bucket_view=True)


def build_trainer(
    train: TrainConfig,
    device: RunDevice | None = None,
    callbacks: Sequence[Callback] = (),
    logger: Logger | bool = False,
    **overrides,
) -> Trainer:
    """A Trainer for `train` on `device` (a run passes the one it resolved; by default `run_device(train)`), with
    per-rank random streams kept in its checkpoints (RandomStreams), turns for the cores (TakeTurns), threads that
    follow the free cores (FreeCoreThreads, after TakeTurns) and images/s logged every epoch (Throughput);
    `overrides` go to Trainer as they are (tests: limit_train_batches, ...)."""
    device = device or run_device(train)
    if train.keep_freed_memory:
        keep_freed_memory()
    if train.sync_batchnorm and device.accelerator == "cpu":
        raise ConfigError("train.sync_batchnorm: SyncBatchNorm needs GPUs (torch raises on CPU); set it to false")
    precision = device.trainer_options()
    layout = [ChannelsLast()] if device.channels_last else []
    options = dict(
        accelerator=device.accelerator,
        devices=train.devices,
        num_nodes=train.num_nodes,
        strategy=build_strategy(train, device.accelerator),
        precision=precision["precision"],
        sync_batchnorm=train.sync_batchnorm,
        deterministic=train.deterministic,
        min_epochs=train.min_epochs,
        max_epochs=train.max_epochs,
        max_time=timedelta(minutes=train.max_minutes) if train.max_minutes else None,
        callbacks=[
            *layout,
            *callbacks,
            RandomStreams(train.seed),
            TakeTurns(),
            FreeCoreThreads(train.threads),
            Throughput(),
        ],
        logger=logger,
        plugins=[AtomicCheckpointIO(), *precision["plugins"]],  # 16-mixed: its plugin, not `precision`
        enable_checkpointing=any(isinstance(callback, ModelCheckpoint) for callback in callbacks),
        num_sanity_val_steps=0,
        enable_model_summary=False,
        enable_progress_bar=False,
        log_every_n_steps=1,
    )
    return Trainer(**(options | overrides))
