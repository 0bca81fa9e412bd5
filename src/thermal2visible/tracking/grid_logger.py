"""ImageGridLogger: thermal | generated | real grids of validation faces, logged to MLflow while a run trains."""

from __future__ import annotations

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import MLFlowLogger

from thermal2visible.tracking.plots import comparison_grid


class ImageGridLogger(Callback):
    """Every `every` epochs: thermal | generated | real for the first validation faces, as an MLflow image."""

    def __init__(self, every: int, count: int = 6):
        self.every, self.count = every, count

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: torch.Tensor,
        batch: dict,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        epoch = trainer.current_epoch + 1
        if batch_idx or trainer.sanity_checking or not trainer.is_global_zero or self.every < 1 or epoch % self.every:
            return
        n = self.count
        grid = comparison_grid(batch["thermal"][:n], outputs[:n], batch["visible"][:n])
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                logger.experiment.log_image(logger.run_id, grid, key="val_grid", step=epoch)
