"""What every discriminator architecture (a module of models/discriminators/) is: an nn.Module built from its input
channels (thermal + visible), the image size and its own settings, with a `kind` (the value of model.discriminator
that picks it), its own `Settings` (model.discriminator_settings), `example` settings and a `size_rule`, as a
generator has them (models.generator.Generator). It judges a (thermal, visible) pair and returns, per scale, its
feature maps and then its logits map (what training.losses and feature matching read)."""

from __future__ import annotations

from torch import nn

from thermal2visible.models.generator import NoSettings


class Discriminator(nn.Module):
    kind: str
    Settings: type = NoSettings
    example: object = NoSettings()

    @staticmethod
    def size_rule(image_size: int, settings) -> str | None:
        return None

    def __init__(self, in_channels: int, image_size: int, settings):
        super().__init__()
        if self.size_rule(image_size, settings):
            raise ValueError(f"image_size {self.size_rule(image_size, settings)}")
