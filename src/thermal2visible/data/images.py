"""Decode one PNG, JPEG or TIFF into a uint8/uint16 array, or say exactly why it cannot be used.

The pixel count is checked from the header before any pixel is decoded, so a small file that claims a huge
image (a decompression bomb) costs nothing. PNG and JPEG go through Pillow; TIFF through tifffile, which keeps
16-bit colour and planar layouts that Pillow would reduce to 8 bits.
"""
from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image

from thermal2visible.errors import PipelineError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"
TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF, both byte orders
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff")


class BadImage(PipelineError):
    """A file that cannot be used as an image; `source` names it, `reason` says why."""

    def __init__(self, source: str, reason: str):
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason


def _check_size(width: int, height: int, source: str, max_pixels: int) -> None:
    if width < 1 or height < 1:
        raise BadImage(source, f"{width}x{height} image has no pixels")
    if width * height > max_pixels:
        raise BadImage(source, f"{width}x{height} = {width * height} pixels exceeds max_pixels {max_pixels} "
                               "(refused before decoding)")


def _decode_pillow(data: bytes, source: str, max_pixels: int) -> np.ndarray:
    # Decoders fed hostile bytes raise assorted exception types; any of them means "cannot decode this file".
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as error:
        raise BadImage(source, f"decompression bomb refused before decoding: {error}") from None
    except Exception as error:
        raise BadImage(source, f"unreadable {('PNG', 'JPEG')[data.startswith(JPEG_MAGIC)]} header ({error})") from None
    _check_size(image.width, image.height, source, max_pixels)
    try:
        image.load()
    except Exception as error:
        raise BadImage(source, f"truncated or corrupt {image.format} data ({error})") from None
    if image.mode in ("1", "P"):  # bilevel and palette images have no sample depth of their own
        image = image.convert("L" if image.mode == "1" else "RGB")
    return np.asarray(image)


def _decode_tiff(data: bytes, source: str, max_pixels: int) -> np.ndarray:
    try:
        with tifffile.TiffFile(io.BytesIO(data)) as tiff:
            page, pages = tiff.pages.first, len(tiff.pages)
            width, height, axes = page.imagewidth, page.imagelength, page.axes
            if pages == 1:
                _check_size(width, height, source, max_pixels)
                pixels = page.asarray()
    except BadImage:
        raise
    except Exception as error:
        raise BadImage(source, f"truncated or corrupt TIFF ({error})") from None
    if pages != 1:
        raise BadImage(source, f"TIFF holds {pages} images; expected exactly one")
    return np.moveaxis(pixels, axes.index("S"), -1) if "S" in axes else pixels


def _checked(pixels: np.ndarray, source: str) -> np.ndarray:
    if pixels.dtype.kind != "u" or pixels.dtype.itemsize not in (1, 2):
        raise BadImage(source, f"{pixels.dtype} samples; expected 8- or 16-bit unsigned integers")
    pixels = pixels.astype(np.uint8 if pixels.dtype.itemsize == 1 else np.uint16, copy=False)  # native byte order
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    if pixels.ndim == 3 and pixels.shape[2] != 3 or pixels.ndim not in (2, 3):
        channels = pixels.shape[2] if pixels.ndim == 3 else f"shape {pixels.shape}"
        raise BadImage(source, f"{channels} channels; expected 1 (grey) or 3 (RGB)")
    return pixels


def decode_image(data: bytes, source: str, max_pixels: int) -> np.ndarray:
    """HxW (grey) or HxWx3 (RGB) array, uint8 or uint16; raises BadImage naming `source` and the reason."""
    if not data:
        raise BadImage(source, "empty file (0 bytes)")
    if data.startswith(TIFF_MAGICS):
        pixels = _decode_tiff(data, source, max_pixels)
    elif data.startswith((PNG_MAGIC, JPEG_MAGIC)):
        pixels = _decode_pillow(data, source, max_pixels)
    else:
        raise BadImage(source, "not a PNG, JPEG or TIFF image")
    return _checked(pixels, source)


def read_bytes(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise BadImage(str(path), f"cannot read ({error.strerror or error})") from None


def read_image(path: str | Path, max_pixels: int) -> np.ndarray:
    return decode_image(read_bytes(path), str(path), max_pixels)
