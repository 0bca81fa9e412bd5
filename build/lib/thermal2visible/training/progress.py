"""One line per epoch while training, on the first process: what a user watching `make demo` or a log needs to see
the run go on, and when it may stop. Lightning's bar is off: in DVC's and CI's logs its redraws are noise."""

from __future__ import annotations

import time

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from thermal2visible.training.early_stopping import PsnrEarlyStopping


class EpochLine(Callback):
    """`epoch 12/200: val PSNR 18.31 dB, average 18.02 dB, best 18.10 dB at epoch 10 (patience 18 left), 1.4 s,
    2 thread(s)` (the intra-op threads at the epoch's end: threads.FreeCoreThreads).

    Registered after `stop`, so it reads the decision this epoch's validation made."""

    def __init__(self, stop: PsnrEarlyStopping):
        self.stop = stop
        self.started = time.perf_counter()

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.started = time.perf_counter()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero or not self.stop.history:
            return
        stop = self.stop
        line = f"epoch {len(stop.history)}/{trainer.max_epochs}: val PSNR {stop.history[-1]:.2f} dB"
        if stop.best_epoch:
            line += (
                f", average {stop.smoothed()[-1]:.2f} dB, best {stop.best_smoothed:.2f} dB at epoch {stop.best_epoch}"
                f" ({stop.patience - stop.wait} epochs of patience left)"
            )
        else:
            line += f" (the {stop.window}-epoch average starts at epoch {stop.window})"
        print(f"{line}, {time.perf_counter() - self.started:.1f} s, {torch.get_num_threads()} thread(s)", flush=True)
