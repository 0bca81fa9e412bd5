"""decode_image: every supported format and depth comes back as uint8/uint16; every bad file says why."""

import io
import struct
import zlib

import numpy as np
import pytest
import tifffile
from PIL import Image

from thermal2visible.errors import PipelineError
from thermal2visible.data import images
from thermal2visible.data.images import BadImage, decode_image, read_image
from thermal2visible.data.ingest import ingest

RNG = np.random.default_rng(0)
GREY16 = RNG.integers(0, 65536, (12, 10), dtype=np.uint16)
RGB8 = RNG.integers(0, 256, (12, 10, 3), dtype=np.uint8)


def pillow_bytes(image: Image.Image, format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=format, **options)
    return buffer.getvalue()


def tiff_bytes(array: np.ndarray, **options) -> bytes:
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, array, **options)
    return buffer.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height pixels, with almost no pixel data behind it."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    pixels = zlib.compress(b"\0" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    "data, expected",
    [
        (pillow_bytes(Image.fromarray(GREY16), "PNG"), GREY16),
        (pillow_bytes(Image.fromarray(RGB8), "PNG"), RGB8),
        (pillow_bytes(Image.fromarray(RGB8[:, :, 0]), "PNG"), RGB8[:, :, 0]),
        (tiff_bytes(GREY16), GREY16),
        (tiff_bytes(GREY16.byteswap().view(GREY16.dtype.newbyteorder())), GREY16),  # big-endian TIFF
        (tiff_bytes(np.stack([GREY16] * 3, axis=-1)), np.stack([GREY16] * 3, axis=-1)),  # 16-bit colour
        (tiff_bytes(np.stack([GREY16] * 3), planarconfig="separate"), np.stack([GREY16] * 3, axis=-1)),
        (tiff_bytes(GREY16[:, :, None]), GREY16),
    ],
    ids=[
        "png16-grey",
        "png8-rgb",
        "png8-grey",
        "tiff16-grey",
        "tiff16-big-endian",
        "tiff16-rgb",
        "tiff-planar",
        "tiff-one-sample",
    ],
)
def test_lossless_formats_round_trip(data, expected):
    decoded = decode_image(data, "x", max_pixels=10_000)
    assert decoded.dtype == expected.dtype and decoded.dtype.isnative
    np.testing.assert_array_equal(decoded, expected)


def test_jpeg_and_palette_decode_to_rgb():
    across, down = np.meshgrid(np.linspace(0, 255, 10), np.linspace(0, 255, 12))
    smooth = np.stack([across, down, np.full_like(down, 99)], axis=-1).astype(np.uint8)
    jpeg = decode_image(pillow_bytes(Image.fromarray(smooth), "JPEG", quality=95), "x.jpg", 10_000)
    assert jpeg.shape == smooth.shape and jpeg.dtype == np.uint8
    assert np.abs(jpeg.astype(int) - smooth).mean() < 4  # lossy, but the same picture
    palette = decode_image(pillow_bytes(Image.fromarray(RGB8).convert("P"), "PNG"), "x.png", 10_000)
    assert palette.shape == RGB8.shape and palette.dtype == np.uint8


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "empty file"),
        (b"name,value\n1,2\n", "not a PNG, JPEG or TIFF"),
        (pillow_bytes(Image.fromarray(RGB8), "PNG")[:60], "truncated or corrupt PNG"),
        (pillow_bytes(Image.fromarray(np.tile(RGB8, (8, 8, 1))), "JPEG")[:2000], "truncated or corrupt JPEG"),
        (tiff_bytes(GREY16)[:120], "truncated or corrupt TIFF"),
        (
            pillow_bytes(Image.fromarray(np.dstack([RGB8, RGB8[:, :, :1]])), "PNG"),
            "RGBA (4 channels) with 120 transparent pixel(s), first at row 0, column 0",
        ),
        (pillow_bytes(Image.fromarray(RGB8[:, :, :2]), "PNG"), "grey+alpha (2 channels) with"),
        (
            tiff_bytes(np.dstack([RGB8, RGB8]), photometric="rgb", planarconfig="contig"),
            "6 channels; expected 1 (grey), 3 (RGB)",
        ),
        (tiff_bytes(GREY16.astype(np.int32)), "int32 samples"),
        (tiff_bytes(np.where(GREY16 > 60_000, np.nan, GREY16 / 1000.0).astype(np.float32)), "NaN/inf value(s), first"),
        (tiff_bytes(np.full((4, 4), np.inf)), "16 NaN/inf value(s), first at row 0, column 0"),
        (tiff_bytes(np.stack([GREY16, GREY16])), "2 images"),
        (pillow_bytes(Image.fromarray(RGB8), "PNG"), "pixels exceeds max_pixels 100 (refused before decoding)"),
        (png_header_only(60_000, 60_000), "decompression bomb"),
        (png_header_only(3_000, 2_000), "3000x2000 = 6000000 pixels exceeds max_pixels"),
    ],
    ids=[
        "empty",
        "text",
        "truncated-png",
        "truncated-jpeg",
        "truncated-tiff",
        "rgba-transparent",
        "grey-alpha-transparent",
        "six-channels",
        "int32",
        "float-nan",
        "float-inf",
        "multipage",
        "too-many-pixels",
        "bomb-header",
        "huge-header",
    ],
)
def test_bad_images_name_the_source_and_reason(data, reason):
    max_pixels = 100 if reason.startswith("pixels exceeds") else 1_000_000
    with pytest.raises(BadImage) as caught:
        decode_image(data, "faces/a.png", max_pixels)
    assert caught.value.source == "faces/a.png"
    assert reason in caught.value.reason
    assert str(caught.value) == f"faces/a.png: {caught.value.reason}"
    assert isinstance(caught.value, PipelineError)  # so every stage reports it as `error: ...`


def test_read_image_reports_a_missing_file(tmp_path):
    with pytest.raises(BadImage, match="missing.png: cannot read"):
        read_image(tmp_path / "missing.png", 1000)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, ">f4"])
def test_float_temperature_maps_come_back_as_floats(dtype):
    celsius = (20 + GREY16 / 65535 * 20).astype(dtype)
    decoded = decode_image(tiff_bytes(celsius), "t.tiff", 10_000)
    assert decoded.dtype.kind == "f" and decoded.dtype.isnative
    np.testing.assert_array_equal(decoded, celsius)


@pytest.mark.parametrize("mode, channels", [("RGBA", 3), ("LA", 1)])
def test_opaque_alpha_is_dropped(mode, channels):
    image = Image.fromarray(RGB8).convert(mode)
    decoded = decode_image(pillow_bytes(image, "PNG"), "x.png", 10_000)
    expected = np.asarray(image.convert("RGB" if channels == 3 else "L"))
    np.testing.assert_array_equal(decoded, expected)
    sixteen = np.dstack([np.stack([GREY16] * 3, axis=-1), np.full_like(GREY16, 65535)])
    np.testing.assert_array_equal(
        decode_image(tiff_bytes(sixteen, extrasamples=["unassalpha"]), "x.tif", 10_000), sixteen[:, :, :3]
    )


def test_palette_with_a_transparent_colour_is_refused():
    palette = Image.fromarray(RGB8).convert("P")
    with pytest.raises(BadImage, match="RGBA .4 channels. with"):
        decode_image(pillow_bytes(palette, "PNG", transparency=int(np.asarray(palette)[0, 0])), "x.png", 10_000)


def test_exif_orientation_is_applied():
    """A phone stores a portrait shot as landscape pixels plus EXIF Orientation 6 (rotate 90° clockwise to view)."""
    landscape = np.zeros((12, 20, 3), np.uint8)
    landscape[:, :5] = 255  # white stripe on the left of the stored pixels
    exif = Image.Exif()
    exif[0x0112] = 6
    data = pillow_bytes(Image.fromarray(landscape), "JPEG", quality=100, exif=exif.tobytes())
    decoded = decode_image(data, "phone.jpg", 10_000)
    assert decoded.shape == (20, 12, 3)
    assert decoded[:5].mean() > 200 and decoded[8:].mean() < 50  # the stripe is now on top


def test_a_cmyk_jpeg_is_an_rgb_photo_and_a_cmyk_tiff_is_refused_as_cmyk():
    """Four samples of ink, not RGB with alpha: the JPEG comes back as Pillow's RGB of it, the TIFF is refused as
    CMYK (never as "RGBA ... transparent pixels")."""
    cmyk = Image.fromarray(RGB8).convert("CMYK")
    pixels = decode_image(pillow_bytes(cmyk, "JPEG", quality=95), "ink.jpg", 10**6)
    expected = np.asarray(Image.open(io.BytesIO(pillow_bytes(cmyk, "JPEG", quality=95))).convert("RGB"))
    assert pixels.shape == (12, 10, 3) and pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels, expected)
    ink = np.asarray(cmyk)
    with pytest.raises(BadImage, match=r"^ink\.tif: CMYK TIFF; expected grey or RGB"):
        decode_image(tiff_bytes(ink, photometric="separated"), "ink.tif", 10**6)


# A format a contributor adds as docs/contributing.md says: its functions (here Pillow's, which reads PPM) and its
# entry in FORMATS, nothing else.
PPM = images.ImageFormat("PPM", (".ppm",), (b"P6",), images._pillow_size, images._decode_pillow)


@pytest.fixture(params=[*(image_format.name for image_format in images.FORMATS), "PPM dropped in"])
def image_format(request, monkeypatch) -> images.ImageFormat:
    if request.param == "PPM dropped in":
        monkeypatch.setattr(images, "FORMATS", (*images.FORMATS, PPM))
        return PPM
    return next(image_format for image_format in images.FORMATS if image_format.name == request.param)


def test_every_format_is_told_by_its_bytes_sized_from_its_header_bounded_before_decoding_and_ingested(
    image_format, tmp_path, tiny_params
):
    """The contract each entry of FORMATS keeps, checked on every entry and on one dropped in: the files ingest
    picks up by name, the serving workers size by header and decode, all within max_pixels."""
    data = pillow_bytes(Image.fromarray(RGB8), image_format.name)
    assert images.format_of(data, "frame") == image_format
    height, width = RGB8.shape[:2]
    assert images.image_size(data, "frame", width * height) == (width, height)
    assert decode_image(data, "frame", width * height).shape == RGB8.shape
    for refuse in (images.image_size, decode_image):
        with pytest.raises(BadImage, match=r"frame: 10x12 = 120 pixels exceeds max_pixels 119"):
            refuse(data, "frame", width * height - 1)
    frames = np.random.default_rng(1).integers(0, 256, (2, 2, *RGB8.shape), dtype=np.uint8)  # no two alike
    for side, side_frames in zip(("thermal", "visible"), frames):
        for number, frame in enumerate(side_frames):
            folder = tmp_path / "raw" / side / "person_00"
            folder.mkdir(parents=True, exist_ok=True)
            encoded = pillow_bytes(Image.fromarray(frame), image_format.name)
            (folder / f"{number}{image_format.suffixes[-1]}").write_bytes(encoded)
    index, problems = ingest(tmp_path / "raw", "pairs", tiny_params.ingest)
    assert problems == [] and len(index["pairs"]) == 2
    with pytest.raises(BadImage, match=rf"not a .*\b{image_format.name}\b.* image"):
        decode_image(b"no format starts so", "frame", width * height)
