"""PSNR early stopping (paper §3.2): the validation PSNR of each epoch, smoothed by a moving average over `window`
epochs (the first smoothed value exists at epoch `window`); the generator of the best smoothed epoch is kept, and
training stops once `patience` epochs pass without the smoothed PSNR gaining `min_delta` dB over the value that last
did. The paper's rule is `min_delta` 0: any new best restarts the patience, so a curve that still creeps up by
hundredths of a dB never stops; with a `min_delta`, a gain that has flattened below it over `patience` epochs ends
the run, and the kept model is still the best epoch's.

Epochs are counted from 1 (epoch n = after n epochs of training). The history, best and counter are part of
Lightning's checkpoint, so a resumed run makes the same decisions as one that was never interrupted. The best
generator's file is written only once a checkpoint records that epoch as the best (see `_keep_best`), so a kill
never leaves a best file that the resumed run disagrees with.

Not Lightning's EarlyStopping and ModelCheckpoint: the best model here is the generator payload the later stages read
(weights, settings, fingerprint), written only once a checkpoint records its epoch as the best, not a whole trainer
checkpoint; and the smoothed PSNR it watches exists only from epoch `window`, before which no best may be taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer

from thermal2visible.models.payloads import save_generator


class PsnrEarlyStopping(Callback):
    def __init__(
        self,
        window: int,
        patience: int,
        best_path: str | Path | None = None,
        metadata: dict | None = None,
        monitor: str = "val_psnr",
        min_delta: float = 0.0,
    ):
        if window < 1 or patience < 1 or not min_delta >= 0:
            raise ValueError("window and patience must be >= 1, min_delta >= 0")
        self.window, self.patience, self.monitor, self.min_delta = window, patience, monitor, min_delta
        self.best_path = Path(best_path) if best_path else None
        self.metadata = dict(metadata or {})
        self.history: list[float] = []
        self.best_smoothed = -math.inf
        self.best_epoch = 0  # 0: no smoothed value yet
        self.reference = -math.inf  # the smoothed value that last gained min_delta
        self.wait = 0  # epochs since then
        self.kept_epoch = 0  # the epoch whose generator is in best_path (this process)

    def smoothed(self) -> list[float | None]:
        """The moving average at every epoch so far; None until `window` epochs exist."""
        return [
            None if epoch < self.window else sum(self.history[epoch - self.window : epoch]) / self.window
            for epoch in range(1, len(self.history) + 1)
        ]

    @property
    def should_stop(self) -> bool:
        return self.best_epoch > 0 and self.wait >= self.patience

    def observe(self, psnr: float) -> bool:
        """Record one epoch's validation PSNR; True when its smoothed value is a new best."""
        self.history.append(float(psnr))
        if len(self.history) < self.window:
            return False
        current = self.smoothed()[-1]
        # and strictly above it: with min_delta 0, the paper's rule (a new best restarts the patience)
        if current >= self.reference + self.min_delta and current > self.reference:
            self.reference, self.wait = current, 0
        else:
            self.wait += 1
        if current > self.best_smoothed:
            self.best_smoothed, self.best_epoch = current, len(self.history)
            return True
        return False

    def summary(self) -> dict:
        """What metrics/train.json reports about the stopping decision."""
        return {
            "best_epoch": self.best_epoch,
            "stopped_epoch": len(self.history),
            "best_psnr_smoothed": self.best_smoothed if self.best_epoch else None,
            "best_psnr": self.history[self.best_epoch - 1] if self.best_epoch else None,
            "epochs_run": len(self.history),
        }

    def state_dict(self) -> dict:
        return {
            "history": list(self.history),
            "best_smoothed": self.best_smoothed,
            "best_epoch": self.best_epoch,
            "reference": self.reference,
            "wait": self.wait,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = list(state_dict["history"])
        self.best_smoothed = state_dict["best_smoothed"]
        self.best_epoch = state_dict["best_epoch"]
        self.reference = state_dict["reference"]
        self.wait = state_dict["wait"]

    def _keep_best(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Write best_path when the generator in memory is the best one, between epochs.

        Lightning writes an epoch's checkpoint after its validation; a best file written at validation would
        survive a kill before that checkpoint, and the resumed run (whose best is an earlier epoch) would then
        publish weights from an epoch it never kept. Between epochs the checkpoint already holds the decision;
        a kill after the checkpoint and before this write is repaired at the resumed run's start.
        """
        latest = len(self.history)
        if self.best_path and trainer.is_global_zero and self.best_epoch == latest and self.kept_epoch != latest:
            save_generator(
                pl_module.kept_generator,
                self.best_path,
                pl_module.settings.test_mode,
                epoch=self.best_epoch,
                psnr_smoothed=self.best_smoothed,
                psnr=self.history[-1],
                **self.metadata,
            )
            self.kept_epoch = latest

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._keep_best(trainer, pl_module)
        # Resumed from a run that had already stopped: nothing left to train.
        trainer.should_stop = trainer.should_stop or self.should_stop

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._keep_best(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._keep_best(trainer, pl_module)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self.observe(float(trainer.callback_metrics[self.monitor]))
        smoothed = self.smoothed()[-1]
        if smoothed is not None:  # the quantity that stops training and picks the model, as a curve beside val_psnr
            for logger in trainer.loggers:
                logger.log_metrics({f"{self.monitor}_smoothed": smoothed}, step=len(self.history))
        # Lightning keeps training anyway until train.min_epochs; the decision is the same on every process
        # because the PSNR is averaged over all of them.
        trainer.should_stop = trainer.should_stop or self.should_stop


@dataclass(frozen=True)
class StopRule:
    """Where a run stops: early stopping (window, patience, min_delta), never before train.min_epochs, at
    train.max_epochs at the latest; train.max_minutes, a clock, is not replayed. The keys that only say where to
    stop stay out of the run's fingerprint: a checkpoint continues a run whose rule had not stopped it before the
    checkpoint's last epoch, and the continued run ends where an uninterrupted one would (a raised cap, a longer
    patience)."""

    window: int
    patience: int
    min_delta: float
    min_epochs: int
    max_epochs: int

    def first_stop(self, history: list[float]) -> int | None:
        """The first epoch of `history` (validation PSNRs) at which this rule ends a run, None if it never does."""
        stopping = PsnrEarlyStopping(self.window, self.patience, min_delta=self.min_delta)
        for epoch, psnr in enumerate(history, start=1):
            stopping.observe(psnr)
            if epoch >= self.max_epochs or (epoch >= self.min_epochs and stopping.should_stop):
                return epoch
        return None

    def overrun(self, history: list[float]) -> str | None:
        """Why a run under this rule could not have trained all of `history` (a checkpoint's epochs), or None."""
        stop = self.first_stop(history)
        if stop is None or stop == len(history):
            return None
        return (
            f"its {len(history)} epochs go past epoch {stop}, where train.max_epochs {self.max_epochs}, "
            f"train.min_epochs {self.min_epochs}, early_stop.patience {self.patience} and min_delta {self.min_delta} "
            "end this run"
        )


def checkpoint_history(state: dict) -> list[float]:
    """The validation PSNRs a Lightning checkpoint's early stopping holds; ValueError where they are not a list of
    numbers (a checkpoint is data read from disk)."""
    history = state.get("callbacks", {}).get(PsnrEarlyStopping.__qualname__, {}).get("history")
    if not isinstance(history, list) or not all(isinstance(value, (int, float)) for value in history):
        raise ValueError(f"its early stopping history is {str(history)[:40]!r}, not a list of numbers")
    return [float(value) for value in history]
