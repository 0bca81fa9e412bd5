"""Training speed, logged as `images_per_s` every epoch: the images of the steps that counted (a non-finite step is
undone and is not training: Pix2Pix.training_step returns None for it), over the wall clock from the epoch's start to
its last step (loading and steps, not validation), summed over the processes."""

from __future__ import annotations

import time

from lightning.pytorch import Callback, LightningModule, Trainer


class Throughput(Callback):
    def __init__(self) -> None:
        self.images = 0
        self.started = time.perf_counter()
        self.seconds = 0.0

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.images, self.started, self.seconds = 0, time.perf_counter(), 0.0

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch: dict, batch_idx: int):
        if outputs:  # Lightning passes {} for a step that returned None
            self.images += len(batch["thermal"])
        self.seconds = time.perf_counter() - self.started

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        images_per_s = self.images * trainer.world_size / max(self.seconds, 1e-9)
        pl_module.log("images_per_s", images_per_s, sync_dist=True)
