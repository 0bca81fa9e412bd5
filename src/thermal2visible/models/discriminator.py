"""What every discriminator architecture (a module of models/discriminators/) is: an nn.Module with a `kind` (the
value of model.discriminator that picks it) and its own `Settings` (the keys model.discriminator_settings gives it),
built from the arguments every discriminator takes and its own settings. It judges a (thermal, visible) pair and
returns, per scale, its feature maps and then its logits map (what training.losses and feature matching read)."""

from __future__ import annotations

from torch import nn

from thermal2visible.models.generator import NoSettings


class Discriminator(nn.Module):
    kind: str
    Settings: type = NoSettings

    def __init__(self, in_channels: int, ndf: int, norm: str, image_size: int, scales: int, **settings):
        super().__init__()
