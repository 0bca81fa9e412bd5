"""What every generator shares: norms, dropout drawn the same in any memory layout, pix2pix's initialisation, block
recomputation, the arguments saved with its weights, and the test mode it is run in (`as_tested`). The generators
themselves are the modules of models/generators/, one architecture each (models/networks.py finds them).
"""

from __future__ import annotations

import dataclasses
import typing
from contextlib import contextmanager, nullcontext
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from pydantic import Field
from pydantic.dataclasses import dataclass

from thermal2visible.config.schema import SCHEMA, TrainConfig
from thermal2visible.models.small_convs import ACTIVE_SIDE, small_convs_as_matmul


Norm = Literal["batch", "instance", "none"]  # make_norm's kinds


def make_norm(kind: Norm, channels: int) -> nn.Module:
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
    for those, several times slower at the U-Net's inner levels (docs/performance.md)."""
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


@dataclass(frozen=True, config=SCHEMA)
class NoSettings:
    """The settings of a network that has none of its own."""


class Architecture(nn.Module):
    """What a generator and a discriminator share: the `kind` that picks it, its own `Settings`, the `example`
    settings the shared tests build it with, and the `size_rule` it is refused by before any weight exists."""

    kind: str
    Settings: type = NoSettings
    example: object = NoSettings()

    @staticmethod
    def size_rule(image_size: int, settings) -> str | None:
        return None

    def __init__(self, image_size: int, settings):
        super().__init__()
        if self.size_rule(image_size, settings):
            raise ValueError(f"image_size {self.size_rule(image_size, settings)}")


@dataclass(frozen=True, config=SCHEMA)
class ConvSettings:
    """The settings of the pix2pix generators (the U-Net and the ResNet): width, norm and dropout."""

    ngf: Annotated[int, Field(ge=1, description="width: channels of the first layer (paper: 64)")]
    norm: Annotated[Norm, Field(description="the norm after each convolution")]
    dropout: Annotated[float, Field(ge=0, lt=1, description="dropout rate, where the network has dropout; 0: none")]


class Generator(Architecture):
    """What every generator architecture (a module of models/generators/) is: an nn.Module built from its input and
    output channels, the image size and its own settings, with

    kind       the value of model.generator that picks it;
    Settings   a schema dataclass of its own settings (model.generator_settings, checked by type and range; its
               fields' descriptions are docs/params.md's). A `dropout` or a `norm` field means what ConvSettings'
               do: the shared tests (tests/unit/models/test_models.py) check dropout and batch norm where a kind
               has them;
    example    small Settings the shared tests build it with;
    size_rule  why an image size does not fit it with some settings, or None.

    `config` is what is saved with its weights to rebuild it (models.networks.build_generator); `recompute`
    (model.recompute, set where it is trained) recomputes its blocks in backward (run_block)."""

    @staticmethod
    def size_rule(image_size: int, settings) -> str | None:
        raise NotImplementedError

    def __init__(self, in_channels: int, out_channels: int, image_size: int, settings):
        super().__init__(image_size, settings)
        if in_channels not in (1, 3):
            raise ValueError(f"in_channels {in_channels}: thermal images have 1 or 3 channels")
        self.recompute = False
        self.config = {
            "in_channels": in_channels,
            "out_channels": out_channels,
            "image_size": image_size,
            "settings": dataclasses.asdict(settings),
        }


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
