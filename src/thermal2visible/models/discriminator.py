"""The pix2pix PatchGAN discriminator: (thermal, visible) -> a map of real/fake logits, one per image patch.

With n_layers 3 each output sees a 70x70 patch; at 256 px the map is 30x30 (2,768,705 parameters at ndf 64,
batch norm, RGB pair). Images under 32 px are too small for three stride-2 layers, so fewer are used there.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from thermal2visible.models.generator import init_weights, make_norm


def patch_layers(image_size: int) -> int:
    """3 (the 70x70 PatchGAN) unless the image is too small to leave a 2x2 map after the stride-2 layers."""
    return min(3, int(math.log2(image_size)) - 2)


class PatchDiscriminator(nn.Module):
    def __init__(self, in_channels: int, ndf: int = 64, norm: str = "batch", n_layers: int = 3):
        super().__init__()
        bias = norm != "batch"
        layers: list[nn.Module] = [nn.Conv2d(in_channels, ndf, 4, 2, 1), nn.LeakyReLU(0.2)]
        width = ndf
        for n in range(1, n_layers + 1):
            wider = ndf * min(2 ** n, 8)
            stride = 2 if n < n_layers else 1  # the last feature layer keeps the resolution
            layers += [nn.Conv2d(width, wider, 4, stride, 1, bias=bias), make_norm(norm, wider), nn.LeakyReLU(0.2)]
            width = wider
        layers.append(nn.Conv2d(width, 1, 4, 1, 1))
        self.layers = nn.Sequential(*layers)
        init_weights(self)

    def forward(self, thermal: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        return self.layers(torch.cat([thermal, visible], dim=1))
