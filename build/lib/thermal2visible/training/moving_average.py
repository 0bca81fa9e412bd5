"""The kept generator as an exponential moving average of the trained one's weights (StyleGAN's G_ema): validation,
early stopping and the export read the average, so one epoch's GAN swing no longer decides the kept model.

Its memory is a half-life in training images, the same horizon at any batch size. With a ramp-up (StyleGAN2's
ema_rampup) the half-life is at most that fraction of the images trained on so far, so a short run's average is not
held back by the initial weights it started from.

Its batch-norm statistics are its own: after each step the averaged weights run in training mode on the batch just
trained on. An average of the trained model's statistics would describe another network's activations (seen: running
variances 2.5x the averaged weights' own, 8 dB lost), which is also why torch's AveragedModel, which averages or
copies them, is not used."""

import copy

import torch
from torch import nn


class MovingAverage(nn.Module):
    """`network` follows the trained generator after every step; `images` (a buffer, so checkpoints resume it) counts
    the training images it has followed."""

    def __init__(self, generator: nn.Module, half_life_images: float, ramp_up: float, batch_size: int):
        super().__init__()
        self.network = copy.deepcopy(generator).requires_grad_(False)
        self.half_life_images, self.ramp_up, self.batch_size = half_life_images, ramp_up, batch_size
        self.register_buffer("images", torch.zeros((), dtype=torch.float64))

    def decay(self) -> float:
        """How much of the average the next step keeps: its memory halves every half-life of training images."""
        seen = self.images.item() + self.batch_size
        half_life = min(self.half_life_images, self.ramp_up * seen) if self.ramp_up else self.half_life_images
        return 0.5 ** (self.batch_size / half_life)

    @torch.no_grad()
    def follow(self, trained: nn.Module, thermal: torch.Tensor) -> None:
        """Move the averaged weights towards the trained ones by 1 - decay, then its batch-norm statistics by the batch
        just trained on, as training moves the trained model's: a forward of the averaged weights in training mode."""
        keep = self.decay()
        for average, weight in zip(self.network.parameters(), trained.parameters()):
            average.lerp_(weight, 1 - keep)
        self.images += self.batch_size
        self.network.train()
        self.network(thermal)
