"""Small convolutions as one matmul (train.small_convs_as_matmul): the same arithmetic as `F.conv2d` and
`F.conv_transpose2d`, laid out as im2col and one matmul (a convolution) or one matmul and col2im (a transposed one).

On CPU, oneDNN's convolution kernels run the U-Net's inner layers (maps of a few pixels, hundreds of channels) at a few
percent of the GEMM peak: each weight meets only batch x pixels inputs. As one matmul, the layers with maps of 4x4 px
and under run up to 3.3x faster forward + backward (benchmarks.layers, bf16 autocast); at the demo's size oneDNN's
kernels are as fast or faster from 8x8 maps on. Only training steps run this way: validation, evaluation and the ONNX
export keep the standard convolutions of the same weights.
"""

from __future__ import annotations

from contextlib import nullcontext
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


def _pair(value) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def conv2d_output_size(x: torch.Tensor, weight: torch.Tensor, stride, padding) -> tuple[int, int]:
    (stride_h, stride_w), (pad_h, pad_w) = _pair(stride), _pair(padding)
    return (
        (x.shape[-2] + 2 * pad_h - weight.shape[-2]) // stride_h + 1,
        (x.shape[-1] + 2 * pad_w - weight.shape[-1]) // stride_w + 1,
    )


def conv2d_as_matmul(x: torch.Tensor, weight: torch.Tensor, bias, stride, padding) -> torch.Tensor:
    """`F.conv2d(x, weight, bias, stride, padding)` as im2col and one matmul of weights and columns."""
    columns = F.unfold(x, weight.shape[-2:], padding=padding, stride=stride)
    out = conv2d_output_size(x, weight, stride, padding)
    y = (weight.reshape(len(weight), -1) @ columns).reshape(len(x), len(weight), *out)
    return y if bias is None else y + bias[:, None, None]


def conv_transpose2d_as_matmul(x: torch.Tensor, weight: torch.Tensor, bias, stride, padding) -> torch.Tensor:
    """`F.conv_transpose2d(x, weight, bias, stride, padding)` as one matmul of weights and input, then col2im."""
    batch, channels, height, width = x.shape
    _, _, kernel_h, kernel_w = weight.shape
    (stride_h, stride_w), (pad_h, pad_w) = _pair(stride), _pair(padding)
    out = ((height - 1) * stride_h - 2 * pad_h + kernel_h, (width - 1) * stride_w - 2 * pad_w + kernel_w)
    columns = weight.reshape(channels, -1).t() @ x.reshape(batch, channels, height * width)
    y = F.fold(columns, out, (kernel_h, kernel_w), padding=(pad_h, pad_w), stride=(stride_h, stride_w))
    return y if bias is None else y + bias[:, None, None]


def _plain(args: tuple, kwargs: dict, extra: tuple[str, ...]) -> tuple | None:
    """(x, weight, bias, stride, padding) of a conv call with 4-D input, numeric padding, one group, no dilation and
    no output padding (the networks here), or None for any other call, which is left to torch."""
    names = ("input", "weight", "bias", "stride", "padding", *extra)
    given = dict(zip(names, args)) | kwargs
    x, padding = given["input"], given.get("padding", 0)
    supported = (
        x.dim() == 4
        and not isinstance(padding, str)
        and given.get("groups", 1) == 1
        and _pair(given.get("dilation", 1)) == (1, 1)
        and _pair(given.get("output_padding", 0)) == (0, 0)
    )
    return (x, given["weight"], given.get("bias"), given.get("stride", 1), padding) if supported else None


# The max_side in force (0: off), for recomputation in backward, which runs outside the mode (run_block).
ACTIVE_SIDE: ContextVar[int] = ContextVar("small_convs_as_matmul", default=0)


class SmallConvsAsMatmul(TorchFunctionMode):
    """Within it, a 2-D convolution whose smaller map (a convolution's output, a transposed convolution's input)
    is at most `max_side` x `max_side` pixels runs as one matmul; every other call is torch's own."""

    def __init__(self, max_side: int):
        super().__init__()
        self.max_side = max_side

    def __enter__(self):
        self.token = ACTIVE_SIDE.set(self.max_side)
        return super().__enter__()

    def __exit__(self, *exc):
        ACTIVE_SIDE.reset(self.token)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.conv2d:
            call = _plain(args, kwargs, ("dilation", "groups"))
            if call is not None and max(conv2d_output_size(call[0], call[1], *call[3:])) <= self.max_side:
                return conv2d_as_matmul(*call)
        elif func is F.conv_transpose2d:
            call = _plain(args, kwargs, ("output_padding", "groups", "dilation"))
            if call is not None and max(call[0].shape[-2:]) <= self.max_side:
                return conv_transpose2d_as_matmul(*call)
        return func(*args, **kwargs)


def small_convs_as_matmul(max_side: int):
    """The context the training step runs in: SmallConvsAsMatmul(max_side), or nothing for 0 (off)."""
    return SmallConvsAsMatmul(max_side) if max_side > 0 else nullcontext()
