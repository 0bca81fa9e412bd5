"""The pix2pix U-Net generator: thermal (B,Ct,S,S) in [-1,1] -> visible (B,Cv,S,S) in [-1,1].

log2(S) stride-2 encoder levels take the image down to 1x1; each decoder level doubles it back and
concatenates the encoder output of the same size (the skip connections). At 256 px, ngf 64, batch norm and
RGB in/out this is exactly the network of the pix2pix paper (54,413,955 parameters).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from thermal2visible.models.generator import (
    ConvSettings,
    LayoutIndependentDropout,
    dense_gradient,
    Generator,
    init_weights,
    make_norm,
    run_block,
)

DROPOUT_LEVELS = 3  # pix2pix: dropout in the three innermost decoder blocks (the paper's CD512-CD1024-CD1024)


class UNetGenerator(Generator):
    kind = "unet"  # model.generator
    Settings = ConvSettings  # dropout: in the three innermost decoder blocks
    example = ConvSettings(ngf=4, norm="batch", dropout=0.5)

    @staticmethod
    def size_rule(image_size: int, settings: ConvSettings) -> str | None:
        if image_size < 16 or image_size & (image_size - 1):
            return f"{image_size} must be a power of two >= 16 (the U-Net halves it down to 1)"
        return None

    def __init__(self, in_channels: int, out_channels: int, image_size: int, settings: ConvSettings):
        super().__init__(in_channels, out_channels, image_size, settings)
        ngf, norm, dropout = settings.ngf, settings.norm, settings.dropout
        levels = int(math.log2(image_size))
        # Batch norm has its own shift, so the convolutions before it need no bias (as in pix2pix).
        bias = norm != "batch"
        width = [ngf * min(2**level, 8) for level in range(levels)]

        self.encoder = nn.ModuleList([nn.Conv2d(in_channels, ngf, 4, 2, 1, bias=bias)])
        for level in range(1, levels):
            innermost = level == levels - 1
            self.encoder.append(
                nn.Sequential(
                    nn.LeakyReLU(0.2),
                    nn.Conv2d(width[level - 1], width[level], 4, 2, 1, bias=bias),
                    nn.Identity() if innermost else make_norm(norm, width[level]),  # a 1x1 map has nothing to normalise
                )
            )

        # decoder[level] maps the level's input (skip + upsampled, or the bottleneck alone) to width[level - 1].
        self.decoder = nn.ModuleList(
            [nn.Sequential(nn.ReLU(), nn.ConvTranspose2d(2 * ngf, out_channels, 4, 2, 1), nn.Tanh())]
        )
        for level in range(1, levels):
            innermost = level == levels - 1
            blocks = [
                nn.ReLU(),
                nn.ConvTranspose2d(width[level] * (1 if innermost else 2), width[level - 1], 4, 2, 1, bias=bias),
                make_norm(norm, width[level - 1]),
            ]
            if level >= levels - DROPOUT_LEVELS and dropout > 0:
                blocks.append(LayoutIndependentDropout(dropout))
            self.decoder.append(nn.Sequential(*blocks))
        init_weights(self)

    def _run(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return run_block(block, x, self.recompute)

    def forward(self, thermal: torch.Tensor) -> torch.Tensor:
        skips = []
        x = thermal
        for block in self.encoder:
            x = self._run(block, x)
            skips.append(x)
        y = self._run(self.decoder[-1], skips.pop())
        for block in list(self.decoder)[-2::-1]:  # not reversed(ModuleList slice): torch.compile mis-iterates it
            y = self._run(block, torch.cat([skips.pop(), dense_gradient(y)], dim=1))
        return y
