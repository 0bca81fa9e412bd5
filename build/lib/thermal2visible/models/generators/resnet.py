"""The ResNet generator of the public pix2pix/CycleGAN code (its `resnet_9blocks`): thermal (B,Ct,H,W) in [-1,1] ->
visible (B,Cv,H,W) in [-1,1], H and W multiples of 4.

A 7x7 convolution to ngf channels, two stride-2 convolutions down to a quarter of the side at 4 ngf, nine residual
blocks there, two transposed convolutions back up, a 7x7 convolution to the output channels and tanh; padding is
by reflection. Unlike the U-Net, nothing passes the bottleneck but the residual path, and the field of view does
not grow with the image: the network is the same at every image size. At 256 px, ngf 64, batch norm and RGB
in/out it has 11,383,427 parameters (the public code's count, 11.378 M, is for instance norm without affine
weights, which keeps the convolutions' biases instead: 11,378,179 here too).

generator_settings.dropout is the public code's `use_dropout`: dropout between the two convolutions of every residual
block (the public code's pix2pix turns it on at 0.5); 0 leaves it out.
"""

from __future__ import annotations

import torch
from torch import nn

from thermal2visible.models.generator import (
    ConvSettings,
    LayoutIndependentDropout,
    Generator,
    init_weights,
    make_norm,
    run_block,
)

RESIDUAL_BLOCKS = 9


class ResidualBlock(nn.Module):
    def __init__(self, channels: int, norm: str, dropout: float, bias: bool):
        super().__init__()
        layers = [
            nn.ReflectionPad2d(1),
            nn.Conv2d(channels, channels, 3, bias=bias),
            make_norm(norm, channels),
            nn.ReLU(),
        ]
        if dropout > 0:
            layers.append(LayoutIndependentDropout(dropout))
        layers += [nn.ReflectionPad2d(1), nn.Conv2d(channels, channels, 3, bias=bias), make_norm(norm, channels)]
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.layers(x)


class ResnetGenerator(Generator):
    kind = "resnet"  # model.generator
    Settings = ConvSettings  # dropout: inside every residual block
    example = ConvSettings(ngf=4, norm="batch", dropout=0.5)

    @staticmethod
    def size_rule(image_size: int, settings: ConvSettings) -> str | None:
        if image_size < 16 or image_size % 4:
            return f"{image_size} must be a multiple of 4 >= 16 for the ResNet (it halves the image twice and back)"
        return None

    def __init__(self, in_channels: int, out_channels: int, image_size: int, settings: ConvSettings):
        super().__init__(in_channels, out_channels, image_size, settings)
        ngf, norm, dropout = settings.ngf, settings.norm, settings.dropout
        bias = norm != "batch"  # batch norm has its own shift (as in the public code)
        stages = [
            nn.Sequential(
                nn.ReflectionPad2d(3), nn.Conv2d(in_channels, ngf, 7, bias=bias), make_norm(norm, ngf), nn.ReLU()
            )
        ]
        for width in (ngf, 2 * ngf):
            stages.append(
                nn.Sequential(nn.Conv2d(width, 2 * width, 3, 2, 1, bias=bias), make_norm(norm, 2 * width), nn.ReLU())
            )
        stages += [ResidualBlock(4 * ngf, norm, dropout, bias) for _ in range(RESIDUAL_BLOCKS)]
        for width in (4 * ngf, 2 * ngf):
            stages.append(
                nn.Sequential(
                    nn.ConvTranspose2d(width, width // 2, 3, 2, 1, output_padding=1, bias=bias),
                    make_norm(norm, width // 2),
                    nn.ReLU(),
                )
            )
        stages.append(nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(ngf, out_channels, 7), nn.Tanh()))
        self.stages = nn.ModuleList(stages)
        init_weights(self)

    def forward(self, thermal: torch.Tensor) -> torch.Tensor:
        x = thermal
        for stage in self.stages:
            x = run_block(stage, x, self.recompute)
        return x
