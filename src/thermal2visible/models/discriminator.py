"""What every discriminator architecture (a module of models/discriminators/) is: an nn.Module built from its input
channels (thermal + visible), the image size and its own settings, with a `kind` (the value of model.discriminator
that picks it), its own `Settings` (model.discriminator_settings), `example` settings and a `size_rule`, as a
generator has them (models.generator.Architecture). It judges a (thermal, visible) pair and returns, per scale, its
feature maps and then its logits map (what training.losses and feature matching read)."""

from __future__ import annotations

from thermal2visible.models.generator import Architecture


class Discriminator(Architecture):
    def __init__(self, in_channels: int, image_size: int, settings):
        super().__init__(image_size, settings)
