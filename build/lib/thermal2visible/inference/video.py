"""A thermal video in, a visible video out: decoded, translated and encoded one frame at a time (PyAV, whose wheel
bundles FFmpeg), so memory stays flat however long the video. Same frame count, size and frame rate; H.264.
Frames reach the model as 8-bit grey or RGB, or as 16-bit grey when the stream is (gray16: a radiometric recording).

The output is written to a hidden file beside the target and renamed when the last frame is in: a video that
fails half-way (a corrupt frame, a frame the model refuses) leaves nothing behind.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path
from typing import Protocol

import av
import numpy as np
from tqdm import tqdm

from thermal2visible.errors import PipelineError

VIDEO_SUFFIXES = {".mp4": "mp4", ".mov": "mov", ".mkv": "matroska", ".avi": "avi"}  # suffix -> container format


class FrameTranslator(Protocol):
    in_channels: int
    max_pixels: int

    def check_work(self, height: int, width: int, where: str) -> None:
        """Raises naming `where` when frames of this size would cost the model more than it allows."""

    def translate(self, frame: np.ndarray, where: str) -> np.ndarray:
        """Decoded thermal frame -> uint8 visible frame of its size; raises naming `where`."""


def _open(source: Path) -> av.container.InputContainer:
    if not source.is_file():
        raise PipelineError(f"{source}: no such video file")
    try:
        container = av.open(str(source))
    except av.FFmpegError as error:
        raise PipelineError(f"{source}: not a readable video ({error.strerror or error})") from None
    if not container.streams.video:
        container.close()
        raise PipelineError(f"{source}: holds no video stream")
    return container


def translate_video(model: FrameTranslator, source: Path, target: Path) -> int:
    """Translate every frame of `source` into the video `target`; returns the frame count."""
    if target.suffix.lower() not in VIDEO_SUFFIXES:
        raise PipelineError(f"{target}: the output of a video must be a video file ({', '.join(VIDEO_SUFFIXES)})")
    with _open(source) as reader:
        stream = reader.streams.video[0]
        # Decoders conceal damaged frames by default (grey blocks, repeated macroblocks): a translation of a
        # concealed frame would be silently wrong, so any decoding error stops the run instead.
        stream.codec_context.options = {"err_detect": "explode"}
        # One decoding thread: frames come out as their packets go in, so an error names the frame it is in.
        stream.codec_context.thread_count = 1
        width, height = stream.codec_context.width, stream.codec_context.height
        if width * height > model.max_pixels:
            raise PipelineError(f"{source}: {width}x{height} frames exceed max_pixels {model.max_pixels}")
        model.check_work(height, width, str(source))
        rate = stream.average_rate or stream.guessed_rate or Fraction(25)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        try:
            count = _transcode(model, reader, stream, source, partial, VIDEO_SUFFIXES[target.suffix.lower()], rate)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    os.replace(partial, target)
    return count


def _transcode(
    model: FrameTranslator, reader, stream, source: Path, partial: Path, container: str, rate: Fraction
) -> int:
    # A 16-bit grey stream (a radiometric recording, e.g. FFV1 gray16le) keeps its 16 bits, as 16-bit images do.
    deep = (stream.codec_context.pix_fmt or "").startswith("gray16")
    decoded_as = ("gray16le" if deep else "gray") if model.in_channels == 1 else "rgb24"
    width, height = stream.codec_context.width, stream.codec_context.height
    frames = reader.decode(stream)
    index = 0
    with av.open(str(partial), "w", format=container) as writer:
        out = writer.add_stream("libx264", rate=rate)
        out.width, out.height = width, height
        # 4:2:0 chroma (what every player plays) needs even sides; odd-sized thermal sensors get 4:4:4.
        out.pix_fmt = "yuv420p" if width % 2 == 0 and height % 2 == 0 else "yuv444p"
        with tqdm(total=stream.frames or None, desc="translating", unit="frame") as progress:
            while True:
                try:
                    frame = next(frames, None)
                except av.FFmpegError as error:
                    raise PipelineError(
                        f"{source}: frame {index}: cannot be decoded ({error.strerror or error})"
                    ) from None
                if frame is None:
                    break
                visible = model.translate(frame.to_ndarray(format=decoded_as), f"{source}: frame {index}")
                # the encoder converts grey or RGB frames to its own pixel format
                picture = av.VideoFrame.from_ndarray(
                    np.ascontiguousarray(visible), format="gray" if visible.ndim == 2 else "rgb24"
                )
                picture.pts, picture.time_base = index, 1 / rate
                writer.mux(out.encode(picture))
                index += 1
                progress.update()
        writer.mux(out.encode(None))
    if index == 0:
        raise PipelineError(f"{source}: the video holds no frames")
    return index
