"""The pix2pix U-Net generator: thermal (B,Ct,S,S) in [-1,1] -> visible (B,Cv,S,S) in [-1,1].

log2(S) stride-2 encoder levels take the image down to 1x1; each decoder level doubles it back and
concatenates the encoder output of the same size (the skip connections). At 256 px, ngf 64, batch norm and
RGB in/out this is exactly the network of the pix2pix paper (54,413,955 parameters).
"""

from __future__ import annotations

import math
import typing
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from thermal2visible.config.schema import TrainConfig
from thermal2visible.models.small_convs import ACTIVE_SIDE, small_convs_as_matmul

DROPOUT_LEVELS = 3  # pix2pix: dropout in the three innermost decoder blocks (the paper's CD512-CD1024-CD1024)


def make_norm(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "instance":
        return nn.InstanceNorm2d(channels)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"norm {kind!r} is not one of batch, instance, none")


class LayoutIndependentDropout(nn.Dropout):
    """nn.Dropout with its mask drawn in the tensor's logical (N, C, H, W) order. nn.Dropout draws it in memory
    order, so the same seed drops other activations of a channels-last tensor than of an NCHW one, and
    train.channels_last would change a run's random stream, not only its speed. For NCHW input the draws are
    nn.Dropout's, bit for bit."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        keep = torch.empty(x.shape, dtype=x.dtype, device=x.device).bernoulli_(1 - self.p)
        return x * keep.div_(1 - self.p)  # x first: the product keeps x's memory layout


def dense_gradient(x: torch.Tensor) -> torch.Tensor:
    """`x`, whose gradient reaches the layer before it dense, in `x`'s own memory layout. A tensor that only
    feeds torch.cat gets a strided slice of the cat's gradient, and batch norm's CPU backward takes a slow path
    for those: forward + backward 5-6x (NCHW) and 7-24x (channels-last) slower at the U-Net's 16-128 px levels
    (bf16, batch 4, an AMX Xeon)."""
    if x.requires_grad:
        layout = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
        x.register_hook(lambda grad: grad.contiguous(memory_format=layout))
    return x


def init_weights(model: nn.Module) -> None:
    """pix2pix initialisation: weights N(0, 0.02), batch-norm scales N(1, 0.02), biases 0."""
    for layer in model.modules():
        if isinstance(layer, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.normal_(layer.weight, 0.0, 0.02)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        elif isinstance(layer, nn.BatchNorm2d):
            nn.init.normal_(layer.weight, 1.0, 0.02)
            nn.init.zeros_(layer.bias)


@contextmanager
def statistics_kept(block: nn.Module):
    """Puts `block`'s buffers (batch-norm running statistics and batch counts) back as they were on entry."""
    saved = [buffer.clone() for buffer in block.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in zip(block.buffers(), saved):
                buffer.copy_(value)


def run_block(block: nn.Module, x: torch.Tensor, recompute: bool) -> torch.Tensor:
    """`block(x)`; with `recompute` (model.recompute) while training with gradients, only the block's input is kept
    and its insides are recomputed in backward."""
    if recompute and block.training and torch.is_grad_enabled():
        # The RNG state is replayed, so dropout masks match, and the recomputation leaves batch-norm statistics as
        # the forward left them, so recompute changes memory and time only, never the trained weights
        # (config/schema.py marks model.recompute `run_setting()`).
        side = ACTIVE_SIDE.get()  # backward recomputes outside the training step's conv mode: the same convs again
        return checkpoint(
            block, x, use_reentrant=False, context_fn=lambda: (nullcontext(), recomputed_as_run(block, side))
        )
    return block(x)


@contextmanager
def recomputed_as_run(block: nn.Module, small_convs_side: int):
    """The recomputation of `block`: statistics kept, and convolutions laid out as the forward laid them out
    (train.small_convs_as_matmul), so it saves the tensors the forward saved."""
    with statistics_kept(block), small_convs_as_matmul(small_convs_side):
        yield


def generator_config(in_channels: int, out_channels: int, image_size: int, ngf: int, norm: str, dropout: float) -> dict:
    """What models.networks.build_generator needs to rebuild a generator (plain types: saved with the weights)."""
    if in_channels not in (1, 3):
        raise ValueError(f"in_channels {in_channels}: thermal images have 1 or 3 channels")
    return {
        "in_channels": in_channels,
        "out_channels": out_channels,
        "image_size": image_size,
        "ngf": ngf,
        "norm": norm,
        "dropout": dropout,
    }


class UNetGenerator(nn.Module):
    kind = "unet"  # model.generator

    def __init__(
        self, in_channels: int, out_channels: int, image_size: int, ngf: int, norm: str, dropout: float, recompute: bool
    ):
        super().__init__()
        levels = int(math.log2(image_size))
        if image_size < 16 or 2**levels != image_size:
            raise ValueError(f"image_size {image_size} must be a power of two >= 16")
        self.recompute = recompute
        self.config = generator_config(in_channels, out_channels, image_size, ngf, norm, dropout)
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
        for block in reversed(self.decoder[:-1]):
            y = self._run(block, torch.cat([skips.pop(), dense_gradient(y)], dim=1))
        return y


TEST_MODES = typing.get_args(typing.get_type_hints(TrainConfig)["test_mode"])  # train.test_mode's choices


# Batch norm in either form: the Trainer turns BatchNorm2d into SyncBatchNorm (not a subclass) under
# train.sync_batchnorm, and the test mode must treat both alike.
BATCH_NORMS = (nn.BatchNorm2d, nn.SyncBatchNorm)


def _own_statistics(
    norm: nn.BatchNorm2d | nn.SyncBatchNorm, inputs: tuple[torch.Tensor], output: torch.Tensor
) -> torch.Tensor:
    """Batch norm with the statistics of each image alone: what batch norm computes at batch 1 in train mode."""
    return F.instance_norm(inputs[0], weight=norm.weight, bias=norm.bias, eps=norm.eps)


@contextmanager
def as_tested(generator: nn.Module, mode: str):
    """`generator` as it is tested (train.test_mode); weights and running statistics are left untouched.

    eval: running batch-norm statistics, dropout off (deterministic). train: pix2pix's test mode (Isola et al.
    test at batch 1 with the network in train mode): every image normalised by its own statistics and dropout on.
    Per image, not per batch, so no image's result depends on the others it is batched with.
    """
    if mode not in TEST_MODES:
        raise ValueError(f"test mode {mode!r} is not one of {TEST_MODES}")
    was_training = generator.training
    generator.eval()
    hooks = []
    if mode == "train":
        for module in generator.modules():
            if isinstance(module, BATCH_NORMS):
                hooks.append(module.register_forward_hook(_own_statistics))
            elif isinstance(module, nn.Dropout):
                module.train()
    try:
        yield generator
    finally:
        for hook in hooks:
            hook.remove()
        generator.train(was_training)
