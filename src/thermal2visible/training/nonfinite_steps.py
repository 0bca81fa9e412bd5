"""Undoing a non-finite training step: what a step may change before it knows its losses and gradients are finite is
copied before the step, into buffers kept from step to step, and put back if the step turns out non-finite."""

from __future__ import annotations

import torch
from lightning.pytorch import Trainer
from torch import nn


def finite_everywhere(loss: torch.Tensor, network: nn.Module, trainer: Trainer) -> bool:
    """Whether `loss` and `network`'s gradients are finite on every process (all skip a step together, or DDP
    hangs). Under fp16 loss scaling, overflowing gradients are the GradScaler's to skip (it lowers the scale), so only
    the loss is checked then."""
    bad = ~torch.isfinite(loss.detach().float())
    gradients = [weight.grad for weight in network.parameters() if weight.grad is not None]
    if gradients and getattr(trainer.precision_plugin, "scaler", None) is None:
        bad |= ~torch.isfinite(torch.nn.utils.get_total_norm(gradients))
    return trainer.strategy.reduce(bad.float(), reduce_op="sum").item() == 0


class StepUndo:
    """The state one step of `generator` and `discriminator` (D optimized by `opt_d`) may change before its
    finiteness is known: batch-norm statistics, and under the alternating rule D's weights and optimizer state (D
    steps before G's loss exists, since G's loss needs the updated D)."""

    def __init__(self, generator: nn.Module, discriminator: nn.Module, update_rule: str):
        self.generator, self.discriminator, self.update_rule = generator, discriminator, update_rule
        self.saved: list[torch.Tensor] = []

    def _undoable(self, opt_d) -> list[torch.Tensor]:
        statistics = [*self.generator.buffers(), *self.discriminator.buffers()]
        if self.update_rule == "simultaneous":
            return statistics  # both losses are checked before either network steps
        moments = [
            value
            for weight in self.discriminator.parameters()
            for value in opt_d.optimizer.state.get(weight, {}).values()
            if torch.is_tensor(value)
        ]
        return [*statistics, *self.discriminator.parameters(), *moments]

    @torch.no_grad()
    def snapshot(self, opt_d) -> None:
        """Copy the undoable state into the kept buffers, no allocation (a deepcopy of the state dicts at every step
        is a visible share of a small model's step). Before D's first step Adam has no state: the copy is then
        shorter."""
        live = self._undoable(opt_d)
        if len(self.saved) != len(live):
            self.saved = [tensor.detach().clone() for tensor in live]
        else:  # a copy_ per tensor: the demo step measured as fast as with torch._foreach_copy_ (docs/performance.md)
            for saved, tensor in zip(self.saved, live):
                saved.copy_(tensor)

    @torch.no_grad()
    def restore(self, opt_d) -> None:
        """Put back the state of the last snapshot."""
        live = self._undoable(opt_d)
        if len(live) != len(self.saved):  # D's first step made Adam's state: undo it by forgetting it
            for weight in self.discriminator.parameters():
                opt_d.optimizer.state.pop(weight, None)
            live = self._undoable(opt_d)
        for tensor, saved in zip(live, self.saved):
            tensor.copy_(saved)
