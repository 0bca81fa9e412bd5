"""The one conversion between image pixels and the generator's space.

Images are HxW, HxWxC or NxHxWxC arrays: uint8 (0..255), uint16 (0..65535) or float already in [0, 1].
The generator reads and writes float32 NCHW in [-1, 1]. The cache writer, preprocessing, export, serving, metrics
and figures convert through here, so an 8-bit and a 16-bit image of the same scene reach the model as the same
numbers, and a 16-bit visible image can never be read as 255x too bright.
"""

from __future__ import annotations

import numpy as np

FULL_SCALE = {np.dtype(np.uint8): 255.0, np.dtype(np.uint16): 65535.0}


def unit(image: np.ndarray) -> np.ndarray:
    """uint8 / uint16 / float [0,1] pixels -> float32 in [0, 1], same shape; grey HxW gains a channel axis."""
    image = np.asarray(image)
    if image.dtype.kind == "f":
        scaled = image.astype(np.float32, copy=False)
    elif image.dtype in FULL_SCALE:
        scaled = image.astype(np.float32) / FULL_SCALE[image.dtype]
    else:
        raise TypeError(f"{image.dtype} pixels: expected uint8, uint16 or float in [0, 1]")
    return scaled[:, :, None] if scaled.ndim == 2 else scaled


def on_uint16_scale(image: np.ndarray) -> np.ndarray:
    """uint8 / uint16 pixels -> float32 on uint16's scale: 8-bit stretched onto it (255 -> 65535), 16-bit kept."""
    return image.astype(np.float32) * (FULL_SCALE[np.dtype(np.uint16)] / FULL_SCALE[image.dtype])


def uint16_from_int16_bits(images):
    """A torch tensor of uint16 pixels read as int16 (torch has no uint16 arithmetic) -> int32 of the same values."""
    return images.int() & int(FULL_SCALE[np.dtype(np.uint16)])


def unit_to_model(scaled):
    """[0, 1] -> the generator's [-1, 1], any layout (numpy array or torch tensor)."""
    return scaled * 2.0 - 1.0


def stored_to_model_(images, dtype):
    """A float torch tensor holding stored `dtype` (uint8 / uint16) values -> [-1, 1], in place: the loader's hot
    path, where a small batch costs per operation, not per pixel."""
    return images.mul_(2.0 / FULL_SCALE[np.dtype(dtype)]).sub_(1.0)


def to_model(images: np.ndarray) -> np.ndarray:
    """HxW[xC] or NxHxWxC pixels (uint8 / uint16 / float [0,1]) -> contiguous float32 NCHW in [-1, 1]."""
    return unit_to_model(nchw(unit(images)))


def quantise(scaled: np.ndarray, dtype) -> np.ndarray:
    """[0, 1] floats -> uint8 / uint16 at that type's full scale, rounded (values outside [0, 1] clipped)."""
    return np.round(np.clip(scaled, 0.0, 1.0) * FULL_SCALE[np.dtype(dtype)]).astype(dtype)


def from_model(output, dtype=None):
    """Generator output in [-1, 1] -> [0, 1], clipped, same layout and type (numpy array or torch tensor).

    With dtype np.uint8 or np.uint16 (numpy only): `quantise`d to that type."""
    scaled = ((output + 1) / 2).clip(0, 1)
    return scaled if dtype is None else quantise(scaled, dtype)


def nhwc(batch: np.ndarray) -> np.ndarray:
    """NCHW (the model's layout) -> NHWC (an image's)."""
    return batch.transpose(0, 2, 3, 1)


def nchw(images: np.ndarray) -> np.ndarray:
    """HxWxC or NxHxWxC (an image's layout) -> contiguous NCHW (the model's)."""
    batch = images[None] if images.ndim == 3 else images
    return np.ascontiguousarray(batch.transpose(0, 3, 1, 2))


def with_channels(batch, channels: int):
    """An NCHW torch batch shown with `channels` channels: grey replicated to RGB, RGB averaged to grey."""
    if batch.shape[1] == channels:
        return batch
    return batch.expand(-1, channels, -1, -1) if batch.shape[1] == 1 else batch.mean(dim=1, keepdim=True)
