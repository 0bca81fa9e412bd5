"""Decode one image file (the formats in FORMATS) into a uint8/uint16/float array, or say exactly why it cannot be used.

The pixel count is checked from the header before any pixel is decoded, so a small file that claims a huge
image (a decompression bomb) costs nothing. PNG and JPEG go through Pillow, which also applies the EXIF
orientation (a phone's JPEG is stored sideways with a tag saying so); TIFF goes through tifffile, which keeps
16-bit colour, planar layouts and float32/float64 temperature maps that Pillow would reduce or refuse.

What comes back: HxW (grey) or HxWx3 (RGB); uint8, uint16, or float32/float64 (a radiometric tool's temperature
map, in its own unit). An alpha channel is dropped when every pixel is opaque and refused otherwise (what would
the model see behind a transparent pixel?). Non-finite floats (NaN, inf) are refused: a camera's dead pixel or a
tool's "no reading" would otherwise become an arbitrary colour after normalisation.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import tifffile
from PIL import Image, ImageOps

from thermal2visible.errors import PipelineError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"
TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF, both byte orders
CHANNELS = "expected 1 (grey), 3 (RGB) or either with an opaque alpha"


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
        raise BadImage(
            source,
            f"{width}x{height} = {width * height} pixels exceeds max_pixels {max_pixels} (refused before decoding)",
        )


def _pillow_size(data: bytes, source: str) -> tuple[int, int]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(io.BytesIO(data)).size


def _decode_pillow(data: bytes, source: str, max_pixels: int) -> np.ndarray:
    # Decoders fed hostile bytes raise assorted exception types; any of them means "cannot decode this file".
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as error:
        raise BadImage(source, f"decompression bomb refused before decoding: {error}") from None
    except Exception as error:
        raise BadImage(source, f"unreadable {format_of(data, source).name} header ({error})") from None
    _check_size(image.width, image.height, source, max_pixels)
    try:
        image.load()
        image = ImageOps.exif_transpose(image)
    except MemoryError:  # a limit on the process, not a fault of the file: the caller says which
        raise
    except Exception as error:
        raise BadImage(source, f"truncated or corrupt {image.format} data ({error})") from None
    if image.mode == "CMYK":  # a print-ready JPEG: four inks, no alpha; as RGB it is an RGB photo like any other
        image = image.convert("RGB")
    if image.mode in ("1", "P", "PA"):  # bilevel and palette images have no sample depth of their own
        transparent = image.mode == "PA" or "transparency" in image.info
        image = image.convert("L" if image.mode == "1" else "RGBA" if transparent else "RGB")
    return np.asarray(image)


def _tiff_size(tiff: tifffile.TiffFile, source: str) -> tuple[int, int]:
    """(width, height) of a TIFF's one 2-D image, from its header: several pages, a volume or more than 4 samples per
    pixel are refused here, before any pixel is decoded (each multiplies what decoding costs)."""
    if not tiff.pages:
        raise BadImage(source, "truncated or corrupt TIFF (no readable image)")
    if len(tiff.pages) != 1:
        raise BadImage(source, f"TIFF holds {len(tiff.pages)} images; expected exactly one")
    page = tiff.pages.first
    if page.photometric == tifffile.PHOTOMETRIC.SEPARATED:  # its fourth sample is black ink, not an alpha
        raise BadImage(source, "CMYK TIFF; expected grey or RGB (convert it to RGB first)")
    if page.imagedepth > 1:
        raise BadImage(source, f"TIFF volume of {page.imagedepth} slices; expected one 2-D image")
    if page.samplesperpixel > 4:
        raise BadImage(source, f"{page.samplesperpixel} channels; {CHANNELS}")
    return page.imagewidth, page.imagelength


def _tiff_header_size(data: bytes, source: str) -> tuple[int, int]:
    with tifffile.TiffFile(io.BytesIO(data)) as tiff:
        return _tiff_size(tiff, source)


def _decode_tiff(data: bytes, source: str, max_pixels: int) -> np.ndarray:
    try:
        with tifffile.TiffFile(io.BytesIO(data)) as tiff:
            _check_size(*_tiff_size(tiff, source), source, max_pixels)
            page = tiff.pages.first
            pixels, axes = page.asarray(), page.axes
    except BadImage:
        raise
    except MemoryError:  # a limit on the process, not a fault of the file: the caller says which
        raise
    except Exception as error:
        if "allocate" in str(error):  # imagecodecs' own words for a failed allocation ("Unable to allocate ...")
            raise MemoryError(str(error)) from None
        raise BadImage(source, f"truncated or corrupt TIFF ({error})") from None
    return np.moveaxis(pixels, axes.index("S"), -1) if "S" in axes else pixels


@dataclass(frozen=True)
class ImageFormat:
    """A file format the pipeline reads. Its files are told by their first bytes (`magics`), never by their name;
    `suffixes` are the names ingest and translate pick up. `header_size` gives (width, height) from the header alone,
    raising BadImage for a header it refuses; `decode` checks the size against max_pixels (`_check_size`) before it
    decodes a pixel, and returns HxW or HxWxC samples for `_checked`."""

    name: str
    suffixes: tuple[str, ...]
    magics: tuple[bytes, ...]
    header_size: Callable[[bytes, str], tuple[int, int]]
    decode: Callable[[bytes, str, int], np.ndarray]


# Every format read. A new one is its two functions and its entry here: ingest, translate, serving and their
# messages follow this tuple.
FORMATS = (
    ImageFormat("PNG", (".png",), (PNG_MAGIC,), _pillow_size, _decode_pillow),
    ImageFormat("JPEG", (".jpg", ".jpeg"), (JPEG_MAGIC,), _pillow_size, _decode_pillow),
    ImageFormat("TIFF", (".tif", ".tiff"), TIFF_MAGICS, _tiff_header_size, _decode_tiff),
)


def image_suffixes() -> tuple[str, ...]:
    """The file names taken as images, lower case: every format's suffixes."""
    return tuple(suffix for image_format in FORMATS for suffix in image_format.suffixes)


def format_names() -> str:
    """'PNG, JPEG or TIFF': the formats read, for messages."""
    names = [image_format.name for image_format in FORMATS]
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def format_of(data: bytes, source: str) -> ImageFormat:
    """The format `data` is in, by its first bytes; raises BadImage naming `source` for an empty or other file."""
    if not data:
        raise BadImage(source, "empty file (0 bytes)")
    for image_format in FORMATS:
        if data.startswith(image_format.magics):
            return image_format
    raise BadImage(source, f"not a {format_names()} image")


ALPHA_LAYOUTS = {2: "grey+alpha", 4: "RGBA"}


def _without_alpha(pixels: np.ndarray, source: str) -> np.ndarray:
    alpha = pixels[:, :, -1]
    opaque = 1.0 if pixels.dtype.kind == "f" else np.iinfo(pixels.dtype).max
    see_through = int(np.count_nonzero(alpha != opaque))
    if see_through:
        row, col = np.argwhere(alpha != opaque)[0]
        raise BadImage(
            source,
            f"{ALPHA_LAYOUTS[pixels.shape[2]]} ({pixels.shape[2]} channels) with {see_through} "
            f"transparent pixel(s), first at row {row}, column {col}; flatten it onto a "
            "background first (an opaque alpha channel is dropped)",
        )
    return pixels[:, :, :-1]


def _checked(pixels: np.ndarray, source: str) -> np.ndarray:
    if pixels.dtype.kind == "f":
        pixels = pixels.astype(pixels.dtype.newbyteorder("="), copy=False)
    elif pixels.dtype.kind == "u" and pixels.dtype.itemsize in (1, 2):
        pixels = pixels.astype(np.uint8 if pixels.dtype.itemsize == 1 else np.uint16, copy=False)  # native order
    else:
        raise BadImage(source, f"{pixels.dtype} samples; expected 8- or 16-bit unsigned integers or floats")
    if pixels.ndim == 3 and pixels.shape[2] in ALPHA_LAYOUTS:
        pixels = _without_alpha(pixels, source)
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    if pixels.ndim == 3 and pixels.shape[2] != 3 or pixels.ndim not in (2, 3):
        channels = pixels.shape[2] if pixels.ndim == 3 else f"shape {pixels.shape}"
        raise BadImage(source, f"{channels} channels; {CHANNELS}")
    if pixels.dtype.kind == "f" and not np.isfinite(pixels).all():
        bad = ~np.isfinite(pixels)
        row, col = np.argwhere(bad)[0][:2]
        raise BadImage(
            source,
            f"{int(np.count_nonzero(bad))} NaN/inf value(s), first at row {row}, column {col}: "
            "a temperature map must be finite everywhere (fill or mask dead pixels first)",
        )
    return pixels


def image_size(data: bytes, source: str, max_pixels: int) -> tuple[int, int]:
    """(width, height) from the header alone, checked against `max_pixels` as decoding checks it, for a budget over
    several images before any is decoded; raises BadImage naming `source` for a file that is not one image of a
    format in FORMATS within the limit."""
    image_format = format_of(data, source)
    try:
        size = image_format.header_size(data, source)
    except BadImage:
        raise
    except Image.DecompressionBombError as error:
        raise BadImage(source, f"decompression bomb refused before decoding: {error}") from None
    except Exception as error:
        raise BadImage(source, f"unreadable image header ({error})") from None
    _check_size(*size, source, max_pixels)
    return size


def decode_image(data: bytes, source: str, max_pixels: int) -> np.ndarray:
    """HxW (grey) or HxWx3 (RGB) array, uint8, uint16 or float (finite); raises BadImage naming `source` and why."""
    return _checked(format_of(data, source).decode(data, source, max_pixels), source)


def read_bytes(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise BadImage(str(path), f"cannot read ({error.strerror or error})") from None


def read_image(path: str | Path, max_pixels: int) -> np.ndarray:
    return decode_image(read_bytes(path), str(path), max_pixels)
