"""Metrics that reach MLflow exactly once per epoch, even when a killed run resumes and repeats an epoch."""

from __future__ import annotations

from typing import Mapping

from lightning.pytorch import Callback
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only


class CheckpointedMLFlowLogger(MLFlowLogger):
    """An MLFlowLogger that logs each epoch once, even when a killed run resumes and repeats an epoch.

    Lightning logs an epoch's validation metrics before it writes that epoch's checkpoint, so a run killed in
    between would log them a second time after resuming. Here metrics wait until a checkpoint is on disk: then
    they are logged, and later ones of the same epoch (the training losses, logged after the checkpoint) go
    straight through. Metrics of an epoch that never got its checkpoint die with the process; its rerun logs them.
    The waiting metrics also go into the checkpoint (`MetricsInCheckpoint`): a run killed after writing it but
    before logging them has them logged when it resumes. Left open: a kill in the milliseconds between the
    checkpoint and Lightning's logging of that epoch's training losses loses those points (never duplicates them).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.waiting: list[tuple[dict[str, float], int | None]] = []
        self.checkpointed_step = 0  # the last epoch a checkpoint holds

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if step is not None and step <= self.checkpointed_step:
            super().log_metrics(metrics, step)
        else:
            self.waiting.append((dict(metrics), step))

    def _log_waiting(self) -> None:
        waiting, self.waiting = self.waiting, []
        for metrics, step in waiting:
            super().log_metrics(metrics, step)
            self.checkpointed_step = max(self.checkpointed_step, step or 0)

    @rank_zero_only
    def log_missing(self, waiting: list[tuple[dict[str, float], int]]) -> None:
        """Log those of a checkpoint's waiting metrics that the run does not have yet."""
        for metrics, step in waiting:
            missing = {
                key: value
                for key, value in metrics.items()
                if step not in {m.step for m in self.experiment.get_metric_history(self.run_id, key)}
            }
            if missing:
                super().log_metrics(missing, step)
            self.checkpointed_step = max(self.checkpointed_step, step)

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback) -> None:
        super().after_save_checkpoint(checkpoint_callback)
        self._log_waiting()

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if status == "success":  # not after a failure: the waiting epoch was never checkpointed
            self._log_waiting()
        super().finalize(status)


class MetricsInCheckpoint(Callback):
    """Keeps a CheckpointedMLFlowLogger's waiting metrics in every checkpoint, and logs the missing ones on resume."""

    def __init__(self, logger: CheckpointedMLFlowLogger):
        self.logger = logger

    def state_dict(self) -> dict:
        return {"waiting": [(metrics, step) for metrics, step in self.logger.waiting if step is not None]}

    def load_state_dict(self, state_dict: dict) -> None:
        self.logger.log_missing(state_dict["waiting"])
