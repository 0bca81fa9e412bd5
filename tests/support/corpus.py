"""The bad-input corpus: every broken dataset file and REST request the project must refuse clearly.

Everything is generated at test time (no binary blobs in the repository). `write_bad_files` adds broken files
to a folder-pairs dataset and says what ingest must report for each; `bad_requests` lists request bodies for
`mlflow models serve` with the status and message each must get; `write_bad_videos` writes videos that
`pipelines/translate.py` must refuse, naming the file (and frame) and why, writing nothing.
"""

from __future__ import annotations

import base64
import io
import json
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
import tifffile
from PIL import Image

IMAGE = "image"


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb_png(width: int, height: int, lie: bool = False) -> bytes:
    """An 8-bit grey PNG of width x height black pixels: a few kB that inflate to width*height bytes.
    `lie`: the header claims that size but the data holds a single row (a header-only bomb)."""
    packer = zlib.compressobj(9)
    row = b"\x00" * (width + 1)  # filter byte + pixels
    data = b"".join(packer.compress(row) for _ in range(1 if lie else height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")


def tiff(pixels: np.ndarray, pages: int = 1) -> bytes:
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, np.stack([pixels] * pages) if pages > 1 else pixels)
    return buffer.getvalue()


def temperatures(height: int = 24, width: int = 24, seed: int = 0) -> np.ndarray:
    """A float32 temperature map in °C, as a radiometric tool exports it."""
    return (30 + 5 * np.random.default_rng(seed).random((height, width))).astype(np.float32)


def thermal16(height: int = 24, width: int = 24, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(29_000, 31_000, (height, width), dtype=np.uint16)


def rgb(height: int = 24, width: int = 24, channels: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)


@dataclass(frozen=True)
class BadFile:
    case: str
    path: str  # the file ingest must name, relative to the dataset root
    reason: str  # a phrase its reason must contain


def write_bad_files(root: Path, outside: Path, max_pixels: int) -> list[BadFile]:
    """Write every broken case into the pairs dataset at `root` (beside its good pairs, 1-channel thermal);
    `outside` is a folder out of the root for symlink targets. Also writes one unusual but valid pair
    (thermal/odd/odd.png, 16-bit 37x23) that ingest must accept."""

    def write(relative: str, data: bytes) -> str:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)
        return relative

    def pair(name: str, thermal: bytes, visible: bytes, thermal_suffix: str = ".png") -> str:
        write(f"visible/bad/{name}.png", visible)
        return write(f"thermal/bad/{name}{thermal_suffix}", thermal)

    good_visible = png(rgb())
    whole = png(thermal16())
    side = int(max_pixels**0.5) + 1
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "secret.png").write_bytes(whole)
    for link, target in (
        ("thermal/bad/escape.png", outside / "secret.png"),
        ("thermal/escape_dir", outside),
        ("thermal/bad/dangling.png", root / "thermal/bad/gone.png"),
    ):
        (root / link).parent.mkdir(parents=True, exist_ok=True)
        (root / link).symlink_to(target)
    write("thermal/odd/odd.png", png(thermal16(23, 37)))
    write("visible/odd/odd.png", png(rgb(23, 37)))
    write("thermal/bad/see_through.png", whole)
    write("thermal/bad/float.png", whole)
    return [
        BadFile("unpaired thermal", write("thermal/bad/lonely.png", whole), "no visible image visible/bad/lonely"),
        BadFile("unpaired visible", write("visible/bad/alone.png", good_visible), "no thermal image"),
        BadFile("zero bytes", pair("empty", b"", good_visible), "empty file (0 bytes)"),
        BadFile("truncated PNG", pair("truncated", whole[: len(whole) // 2], good_visible), "truncated or corrupt PNG"),
        BadFile("corrupt JPEG", pair("corrupt_jpeg", b"\xff\xd8\xff\xe0" + bytes(64), good_visible, ".jpg"), "JPEG"),
        BadFile(
            "corrupt TIFF",
            pair("corrupt_tiff", b"II*\x00" + bytes(64), good_visible, ".tif"),
            "truncated or corrupt TIFF",
        ),
        BadFile(
            "multi-page TIFF", pair("pages", tiff(thermal16(), pages=2), good_visible, ".tif"), "TIFF holds 2 images"
        ),
        BadFile("text named .png", pair("text", b"just some notes", good_visible), "not a PNG, JPEG or TIFF"),
        BadFile("not an image file", write("thermal/bad/notes.txt", b"notes"), "not an image file"),
        BadFile(
            "mismatched pair sizes",
            pair("sizes", png(thermal16(24, 24)), png(rgb(20, 24))),
            "thermal is 24x24 but its visible partner",
        ),
        BadFile("RGBA thermal", pair("rgba", png(rgb(channels=4)), good_visible), "4 channels"),
        BadFile("grey+alpha thermal", pair("grey_alpha", png(rgb(channels=2)), good_visible), "2 channels"),
        BadFile(
            "float thermal with NaN",
            pair("nan", tiff(np.where(thermal16() > 30_900, np.nan, temperatures())), good_visible, ".tiff"),
            "NaN/inf value(s), first at row",
        ),
        BadFile(
            "visible with transparent pixels",
            write("visible/bad/see_through.png", png(np.dstack([rgb(), np.full((24, 24), 128, np.uint8)]))),
            "RGBA (4 channels) with 576 transparent pixel(s)",
        ),
        BadFile(
            "float visible",
            write("visible/bad/float.tiff", tiff(temperatures(24, 24)[:, :, None].repeat(3, 2))),
            "visible image has float32 samples",
        ),
        BadFile(
            "RGB among grey thermal",
            pair("rgb", png(rgb()), good_visible),
            "thermal has 3 channel(s) but most thermal images have 1",
        ),
        BadFile(
            "decompression bomb",
            pair("bomb", bomb_png(4 * side, 4 * side), good_visible),
            f"exceeds max_pixels {max_pixels} (refused before decoding)",
        ),
        BadFile(
            "header claims a huge image",
            pair("huge", bomb_png(100_000, 100_000, lie=True), good_visible),
            "decompression bomb refused before decoding",
        ),
        BadFile("two files, one name", write("thermal/bad/twin.tif", tiff(thermal16())), "2 files share the name"),
        BadFile("two files, one name", write("thermal/bad/twin.png", whole), "2 files share the name"),
        BadFile("symlink out of the root", "thermal/bad/escape.png", "symlink leads outside the dataset root"),
        BadFile("folder symlink out of the root", "thermal/escape_dir", "symlink leads outside the dataset root"),
        BadFile("dangling symlink", "thermal/bad/dangling.png", "broken symlink or not a regular file"),
    ]


@dataclass(frozen=True)
class BadRequest:
    case: str
    body: dict | bytes  # a dict is sent as JSON; bytes as they are, with `content_type`
    status: int
    phrase: str  # in the JSON `message` (or the plain-text body)
    content_type: str = "application/json"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def bad_requests(max_pixels: int, max_encoded: int, model_channels: int = 1) -> list[BadRequest]:
    """Broken /invocations bodies for a model served with `max_pixels` (`max_encoded`: the longest base64 the
    pyfunc accepts), plus one unusual but valid request (16-bit PNG of odd size, 200)."""
    frame = _b64(png(thermal16()))
    half = png(thermal16(64, 64))
    over = "A" * (max_encoded + 4)  # valid base64 alphabet, longer than any allowed image
    side = int(max_pixels**0.5) + 1
    deep = int(1e5)
    wrong_channels = 3 if model_channels == 1 else 1
    wrong = rgb() if wrong_channels == 3 else thermal16()
    return [
        # the 14 of tests/system/test_serving.py
        BadRequest(
            "not base64",
            {"dataframe_split": {"columns": [IMAGE], "data": [[frame], ["%%% not base64"]]}},
            400,
            "row 1: not valid base64",
        ),
        BadRequest(
            "not an image",
            {"dataframe_records": [{IMAGE: _b64(b"just some text, no image")}]},
            400,
            "row 0: not a PNG, JPEG or TIFF",
        ),
        BadRequest("empty image", {"dataframe_records": [{IMAGE: ""}]}, 400, "row 0: empty file"),
        BadRequest(
            "truncated",
            {"dataframe_records": [{IMAGE: _b64(half[: len(half) // 2])}]},
            400,
            "row 0: truncated or corrupt PNG",
        ),
        BadRequest(
            "wrong channels for the model",
            {"inputs": {IMAGE: [_b64(png(wrong))]}},
            400,
            f"row 0: thermal image has {wrong_channels} channel(s); this model",
        ),
        BadRequest("rgba", {"instances": [{IMAGE: _b64(png(rgb(8, 8, 4)))}]}, 400, "row 0: RGBA (4 channels) with"),
        BadRequest(
            "float TIFF with NaN",
            {"inputs": {IMAGE: [_b64(tiff(np.full((8, 8), np.nan, np.float32)))]}},
            400,
            "row 0: 64 NaN/inf value(s), first at row 0, column 0",
        ),
        BadRequest(
            "grey+alpha, half transparent",
            {
                "inputs": {
                    IMAGE: [
                        _b64(
                            png(
                                np.dstack(
                                    [thermal16(8, 8).astype(np.uint8), np.tile([0, 255], (8, 4)).astype(np.uint8)]
                                )
                            )
                        )
                    ]
                }
            },
            400,
            "row 0: grey+alpha (2 channels) with 32 transparent pixel(s), first at row 0, column 0",
        ),
        BadRequest(
            "too many pixels",
            {"dataframe_records": [{IMAGE: _b64(png(np.zeros((side, side), np.uint8)))}]},
            400,
            f"pixels exceeds max_pixels {max_pixels} (refused before decoding)",
        ),
        BadRequest(
            "zero rows",
            {"dataframe_split": {"columns": [IMAGE], "data": []}},
            400,
            "no images: the 'image' column has 0 rows",
        ),
        BadRequest("zero inputs", {"inputs": {IMAGE: []}}, 400, "no images: the 'image' column has 0 rows"),
        BadRequest("empty records", {"dataframe_records": []}, 400, "Model is missing inputs ['image']"),
        BadRequest(
            "wrong column", {"dataframe_records": [{"picture": frame}]}, 400, "Model is missing inputs ['image']"
        ),
        BadRequest(
            "wrong column (instances)",
            {"instances": [{"picture": frame}]},
            400,
            "Model is missing inputs ['image']",
        ),
        BadRequest(
            "not a string", {"dataframe_records": [{IMAGE: 7}]}, 400, "row 0: expected a base64 string, got int"
        ),
        BadRequest("unknown form", {"images": [frame]}, 400, "dataframe_split"),
        # and more
        BadRequest(
            "huge JSON (over the size limit)",
            {"dataframe_records": [{IMAGE: over}]},
            400,
            f"row 0: {len(over)} base64 characters; an image within max_pixels {max_pixels} takes at most",
        ),
        BadRequest(
            "huge JSON, inputs form (no echo)",
            {"inputs": {IMAGE: [over]}},
            400,
            "base64 characters; an image within max_pixels",
        ),
        BadRequest(
            "decompression bomb",
            {"inputs": {IMAGE: [_b64(bomb_png(4 * side, 4 * side))]}},
            400,
            f"exceeds max_pixels {max_pixels} (refused before decoding)",
        ),
        BadRequest(
            "header claims a huge image",
            {"instances": [{IMAGE: _b64(bomb_png(100_000, 100_000, True))}]},
            400,
            "row 0: decompression bomb refused before decoding",
        ),
        BadRequest(
            "thin frame: tiny to send, huge to translate",
            {"inputs": {IMAGE: [_b64(png(np.full((1, 8000), 128, np.uint8)))]}},
            400,
            "row 0: a 8000x1 frame runs through the model at",
        ),
        BadRequest(
            "multi-page TIFF",
            {"inputs": {IMAGE: [_b64(tiff(thermal16(), pages=2))]}},
            400,
            "row 0: TIFF holds 2 images",
        ),
        BadRequest(
            "deeply nested JSON (500 levels)",
            ('{"inputs": {"image": ' + "[" * 500 + "]" * 500 + "}}").encode(),
            400,
            "refused while reading",  # the HTTP edge counts its brackets as values before any parser runs
        ),
        BadRequest(
            f"deeply nested JSON ({deep} levels)",
            ('{"inputs": {"image": ' + "[" * deep + "]" * deep + "}}").encode(),
            400,
            "refused while reading",
        ),
        BadRequest("JSON not UTF-8", b'{"inputs": {"image": ["\xff\xfe"]}}', 400, "valid JSON"),
        BadRequest("top-level JSON list", json.dumps([frame]).encode(), 400, "Received a list"),
        BadRequest(
            "not JSON, large",
            b"{" + b"x" * 200_000,
            400,
            "valid JSON",
        ),
        BadRequest(
            "wrong content type", b"hello", 415, "content type must be application/json", content_type="text/plain"
        ),
        BadRequest(
            "charset not UTF-8",
            json.dumps({"inputs": {IMAGE: [frame]}}).encode(),
            415,
            "only supports UTF-8",
            content_type="application/json; charset=latin-1",
        ),
        BadRequest("CSV body", b"image\n%%%\n", 415, "content type must be application/json", content_type="text/csv"),
        BadRequest("16-bit PNG of odd size (valid)", {"inputs": {IMAGE: [_b64(png(thermal16(23, 37)))]}}, 200, ""),
    ]


def write_video(path: Path, frames: int = 12, width: int = 48, height: int = 40, fps: int = 15) -> Path:
    """An H.264 mp4 of a warm block moving over a cool noisy room (keyframe every 4 frames)."""
    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        # one encoding thread: the same bytes on every run of one machine
        stream.width, stream.height, stream.options = width, height, {"g": "4", "threads": "1"}
        stream.pix_fmt = "yuv420p" if width % 2 == 0 and height % 2 == 0 else "yuv444p"
        for k in range(frames):
            grey = rng.integers(30, 60, (height, width)).astype(np.uint8)
            grey[height // 4 : 3 * height // 4, 2 * k : 2 * k + width // 3] = 220
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.dstack([grey] * 3), format="rgb24")))
        container.mux(stream.encode(None))
    return path


@dataclass(frozen=True)
class BadVideo:
    case: str
    path: str  # the input video, in the folder `write_bad_videos` wrote to
    output: str  # what translate is asked to write
    pattern: str  # a regular expression its error matches


def write_damaged_copy(source: Path, target: Path, packet_index: int) -> Path:
    """`source` remuxed with one packet's first NAL length made impossible: every decoder must report that packet
    (scrambled slice bytes are not enough: H.264 often decodes them without an error, and where depends on the
    encoder's bytes, which differ between CPUs)."""
    with av.open(str(source)) as reader, av.open(str(target), "w") as writer:
        stream = writer.add_stream_from_template(reader.streams.video[0])
        for index, packet in enumerate(p for p in reader.demux(reader.streams.video[0]) if p.size):
            if index == packet_index:
                payload = bytearray(bytes(packet))
                payload[:4] = (0x7FFFFFF0).to_bytes(4, "big")
                damaged = av.Packet(bytes(payload))
                damaged.pts, damaged.dts, damaged.time_base = packet.pts, packet.dts, packet.time_base
                damaged.is_keyframe = packet.is_keyframe
                packet = damaged
            packet.stream = stream
            writer.mux(packet)
    return target


def write_bad_videos(folder: Path) -> list[BadVideo]:
    """Videos `pipelines/translate.py --input VIDEO --output OUT` must refuse without writing OUT."""
    folder.mkdir(parents=True, exist_ok=True)
    write_damaged_copy(write_video(folder / "good.mp4"), folder / "corrupt.mp4", packet_index=6)
    (folder / "empty.mp4").write_bytes(b"")
    (folder / "notes.mp4").write_text("not a video")
    write_video(folder / "huge.mp4", frames=2, width=640, height=512)
    write_video(folder / "thin.mp4", frames=2, width=4000, height=2)  # 8000 pixels, 64000x32 at the model's 32 px
    return [
        # the frame named is counted in display order, behind the damaged packet by the decoder's reorder delay
        BadVideo(
            "corrupt frame", "corrupt.mp4", "out.mp4", r"corrupt\.mp4: frame \d+: cannot be decoded \(Invalid data"
        ),
        BadVideo("zero bytes", "empty.mp4", "out.mp4", re.escape("empty.mp4: not a readable video")),
        BadVideo("text named .mp4", "notes.mp4", "out.mp4", re.escape("notes.mp4: not a readable video")),
        BadVideo("missing", "missing.mp4", "out.mp4", re.escape("missing.mp4: no such video file")),
        BadVideo(
            "frames over max_pixels", "huge.mp4", "out.mp4", re.escape("huge.mp4: 640x512 frames exceed max_pixels")
        ),
        BadVideo(
            "frames too thin: over max_model_pixels once scaled",
            "thin.mp4",
            "out.mp4",
            re.escape("thin.mp4: a 4000x2 frame runs through the model at 64000x32 = 2048000 pixels"),
        ),
        BadVideo(
            "output not a video",
            "good.mp4",
            "out.png",
            re.escape("out.png: the output of a video must be a video file"),
        ),
    ]
