"""The kept generator as an exponential moving average of the trained one's weights (StyleGAN's G_ema): validation,
early stopping and the export read the average, so one epoch's GAN swing no longer decides the kept model.

Its memory is a half-life in training images, the same horizon at any batch size. With a ramp-up (StyleGAN2's
ema_rampup) the half-life is at most that fraction of the images trained on so far, so a short run's average is not
held back by the initial weights it started from.

Its batch-norm statistics are its own: an average of the trained model's (torch's AveragedModel with use_buffers)
would describe another network's activations. They are recomputed when they are about to be read, before
validation, from the last training batches of the epoch, as torch.optim.swa_utils.update_bn does (reset, then a
cumulative average over the batches), but with the network as validation and the export run it: dropout off, fp32.
update_bn runs the whole network in training mode, dropout included."""

import copy

import torch
from torch import nn
from torch.nn.modules.dropout import _DropoutNd

from thermal2visible.models.generator import BATCH_NORMS


class MovingAverage(nn.Module):
    """`network` follows the trained generator after every step; `images` (a buffer, so checkpoints resume it) counts
    the training images it has followed. The last thermal batches it followed, at least `statistics_images` images
    (none for 0), are kept for `refresh_statistics` (Pix2Pix clears them as each epoch starts)."""

    def __init__(
        self, generator: nn.Module, half_life_images: float, ramp_up: float, batch_size: int, statistics_images: int
    ):
        super().__init__()
        self.network = copy.deepcopy(generator).requires_grad_(False)
        self.half_life_images, self.ramp_up, self.batch_size = half_life_images, ramp_up, batch_size
        self.statistics_images = statistics_images
        self.register_buffer("images", torch.zeros((), dtype=torch.float64))
        self.recent_batches: list[torch.Tensor] = []

    def decay(self) -> float:
        """How much of the average the next step keeps: its memory halves every half-life of training images."""
        seen = self.images.item() + self.batch_size
        half_life = min(self.half_life_images, self.ramp_up * seen) if self.ramp_up else self.half_life_images
        return 0.5 ** (self.batch_size / half_life)

    @torch.no_grad()
    def follow(self, trained: nn.Module, thermal: torch.Tensor) -> None:
        """Move the averaged weights towards the trained ones by 1 - decay, and keep `thermal`, the batch just trained
        on, for the statistics."""
        keep = self.decay()
        for average, weight in zip(self.network.parameters(), trained.parameters()):
            average.lerp_(weight, 1 - keep)
        self.images += self.batch_size
        if self.statistics_images:
            self.recent_batches.append(thermal.detach())
            while sum(len(batch) for batch in self.recent_batches[1:]) >= self.statistics_images:
                del self.recent_batches[0]

    @torch.no_grad()
    def refresh_statistics(self) -> None:
        """The averaged network's batch-norm running statistics, anew: the mean over the kept batches of each batch's
        statistics, from the network in fp32 with dropout off. Nothing is done when no batch is kept (before the first
        step) or the network has no batch norm."""
        norms = [module for module in self.network.modules() if isinstance(module, BATCH_NORMS)]
        if not self.recent_batches or not norms:
            return
        modes = {module: module.training for module in self.network.modules()}
        momenta = [norm.momentum for norm in norms]
        for norm in norms:
            norm.reset_running_stats()
            norm.momentum = None  # a cumulative average: every kept batch weighs the same
        self.network.train()
        for module in self.network.modules():
            if isinstance(module, _DropoutNd):
                module.eval()
        with torch.autocast(self.recent_batches[0].device.type, enabled=False):
            for thermal in self.recent_batches:
                self.network(thermal.float())
        for norm, momentum in zip(norms, momenta):
            norm.momentum = momentum
        for module, training in modes.items():
            module.train(training)
