"""The pix2pix PatchGAN discriminator: (thermal, visible) -> a map of real/fake logits, one per image patch, and
pix2pixHD's multi-scale form of it.

With n_layers 3 each output sees a 70x70 patch; at 256 px the map is 30x30 (2,768,705 parameters at ndf 64,
batch norm, RGB pair). Images under 32 px are too small for three stride-2 layers, so fewer are used there.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from pydantic.dataclasses import dataclass
from torch import nn

from thermal2visible.config.schema import SCHEMA
from thermal2visible.models.discriminator import Discriminator
from thermal2visible.models.generator import Norm, init_weights, make_norm

SMALLEST_SCALE = 16  # px: the coarsest scale's side that still leaves a PatchGAN (patch_layers) a map to judge


@dataclass(frozen=True, config=SCHEMA)
class PatchSettings:
    ndf: Annotated[int, Field(ge=1, description="width: channels of the first layer (paper: 64)")]
    norm: Annotated[Norm, Field(description="the norm after each convolution but the first and the logits")]
    scales: Annotated[
        Literal[1, 2, 3],
        Field(
            description="1: the pix2pix PatchGAN | 2, 3: pix2pixHD's multi-scale PatchGAN, the same network (own "
            "weights) also on 2x / 4x downsampled pairs, the GAN loss averaged over scales (pix2pixHD sums them: "
            "docs/training.md says why the mean here)"
        ),
    ]


def patch_layers(image_size: int) -> int:
    """3 (the 70x70 PatchGAN) unless the image is too small to leave a 2x2 map after the stride-2 layers."""
    return min(3, int(math.log2(image_size)) - 2)


def patch_gan(in_channels: int, ndf: int, norm: str, n_layers: int) -> nn.Sequential:
    """The PatchGAN's layers: n_layers + 1 blocks ending in a leaky ReLU (the features), then the logits conv."""
    bias = norm != "batch"
    layers: list[nn.Module] = [nn.Conv2d(in_channels, ndf, 4, 2, 1), nn.LeakyReLU(0.2)]
    width = ndf
    for n in range(1, n_layers + 1):
        wider = ndf * min(2**n, 8)
        stride = 2 if n < n_layers else 1  # the last feature layer keeps the resolution
        layers += [nn.Conv2d(width, wider, 4, stride, 1, bias=bias), make_norm(norm, wider), nn.LeakyReLU(0.2)]
        width = wider
    layers.append(nn.Conv2d(width, 1, 4, 1, 1))
    return nn.Sequential(*layers)


class PatchDiscriminator(nn.Module):
    """One PatchGAN: the pair's logits map."""

    def __init__(self, in_channels: int, ndf: int, norm: str, n_layers: int):
        super().__init__()
        self.layers = patch_gan(in_channels, ndf, norm, n_layers)
        init_weights(self)

    def forward(self, thermal: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        return self.layers(torch.cat([thermal, visible], dim=1))


def downsampled(pair: torch.Tensor) -> torch.Tensor:
    """pix2pixHD's 2x downsampling between scales (an odd side rounds up)."""
    return F.avg_pool2d(pair, 3, stride=2, padding=1, count_include_pad=False)


def scale_sides(image_size: int, scales: int) -> list[int]:
    """The side of the pair each scale sees, finest first."""
    sides = [image_size]
    while len(sides) < scales:
        sides.append((sides[-1] - 1) // 2 + 1)
    return sides


def layer_outputs(layers: nn.Sequential, pair: torch.Tensor) -> list[torch.Tensor]:
    """Every block's output (the features feature matching compares), then the logits map."""
    outputs = []
    x = pair
    for layer in layers:
        x = layer(x)
        if isinstance(layer, nn.LeakyReLU):
            outputs.append(x)
    return [*outputs, x]


class MultiScaleDiscriminator(Discriminator):
    """pix2pixHD's multi-scale PatchGAN: the PatchGAN on the pair and, with weights of their own, on 2x and 4x
    downsampled copies, each with the patch_layers of its side: coarser scales judge larger structures (a whole
    face), the finest the texture. With one scale it is exactly the pix2pix PatchGAN, under the same weight names
    (`layers.*`), drawn in the same order, so runs and checkpoints from before the option are unchanged.

    Output, per scale (finest first): `layer_outputs`. At 64 px, ndf 32, 3 scales, the logits maps are 6x6
    (64 px, n_layers 3), 2x2 (32 px, n_layers 3) and 2x2 (16 px, n_layers 2).
    """

    kind = "patchgan"  # model.discriminator
    Settings = PatchSettings
    example = PatchSettings(ndf=4, norm="batch", scales=1)

    @staticmethod
    def size_rule(image_size: int, settings: PatchSettings) -> str | None:
        coarsest = image_size >> (settings.scales - 1)
        if coarsest < SMALLEST_SCALE:
            return (
                f"{image_size} px in {settings.scales} scales (discriminator_settings.scales) leaves the coarsest at "
                f"{coarsest} px, under the {SMALLEST_SCALE} px a PatchGAN needs"
            )
        return None

    def __init__(self, in_channels: int, image_size: int, settings: PatchSettings):
        super().__init__(in_channels, image_size, settings)
        ndf, norm = settings.ndf, settings.norm
        finest, *coarser = scale_sides(image_size, settings.scales)
        self.layers = patch_gan(in_channels, ndf, norm, patch_layers(finest))
        self.coarser = nn.ModuleList(patch_gan(in_channels, ndf, norm, patch_layers(side)) for side in coarser)
        init_weights(self)

    def forward(self, thermal: torch.Tensor, visible: torch.Tensor) -> list[list[torch.Tensor]]:
        pair = torch.cat([thermal, visible], dim=1)
        judged = [layer_outputs(self.layers, pair)]
        for layers in self.coarser:
            pair = downsampled(pair)
            judged.append(layer_outputs(layers, pair))
        return judged
