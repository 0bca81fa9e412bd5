"""Does a hot or cold object beside the face change how the face is translated? The test faces of a built cache,
each alone and in the middle of a frame three times as wide, translated by `inference.frames.translate_frame` (the
served path) through the exported ONNX model, scored on the face alone.

    python -m benchmarks.wide_frames --onnx models/generator.onnx --cache data/cache

PSNR (dB, [0, 1] images, mean over the test frames) of the face region against the real visible face, for:
the face alone (the square test frame); the face with sides that repeat its edge columns (a calm wide frame);
the same with a hot strip (the counts' maximum, 65535 for 16-bit) in the left side's outer half and a cold strip
(0) in the right side's, half a face away; and with both strips filling the sides, touching the face.
Writes a new benchmarks/results/<date>-wide_frames.json (--report names it otherwise, --out puts it at a path of
your choice).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from skimage.metrics import peak_signal_noise_ratio

from benchmarks.common import add_report_option, machine_text, result_stem, write_report
from thermal2visible.config.stored import stored_section
from thermal2visible.data.cache import raw_pairs
from thermal2visible.paths import CACHE, ONNX
from thermal2visible.inference.frames import translate_frame
from thermal2visible.inference.session import onnx_metadata, onnx_session, run_onnx
from thermal2visible.pixels import unit


def widened(thermal: np.ndarray) -> np.ndarray:
    """The frame in the middle of one three times as wide, each side repeating the frame's edge column."""
    width = thermal.shape[1]
    return np.pad(thermal, ((0, 0), (width, width)) + ((0, 0),) * (thermal.ndim - 2), mode="edge")


def with_strips(thermal: np.ndarray, strip: int) -> np.ndarray:
    """`widened`, with a hot strip `strip` columns wide at its left edge and a cold one at its right edge."""
    wide = widened(thermal)
    hot = np.iinfo(thermal.dtype).max if np.issubdtype(thermal.dtype, np.integer) else float(thermal.max()) * 1.3
    wide[:, :strip], wide[:, -strip:] = hot, 0
    return wide


LAYOUTS = {
    "face alone": lambda thermal: thermal,
    "3:1, sides repeat the face's edge": widened,
    "3:1, hot strip left, cold strip right, half a face away": lambda thermal: with_strips(
        thermal, thermal.shape[1] // 2
    ),
    "3:1, hot and cold filling the sides, touching the face": lambda thermal: with_strips(thermal, thermal.shape[1]),
}


def face_psnr(generate, settings, thermal: np.ndarray, visible: np.ndarray, layout) -> float:
    """PSNR of the face's region of the translated `layout(thermal)` against the real visible face."""
    frame = layout(thermal)
    left = (frame.shape[1] - thermal.shape[1]) // 2
    face = translate_frame(generate, frame, settings)[:, left : left + thermal.shape[1]]
    return float(peak_signal_noise_ratio(unit(visible), face, data_range=1.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnx", type=Path, default=ONNX)
    parser.add_argument("--cache", type=Path, default=CACHE)
    add_report_option(parser, "wide_frames", "json")
    args = parser.parse_args()
    session = onnx_session(args.onnx)
    settings = stored_section("preprocess", onnx_metadata(session)["preprocess"])

    def generate(batch: np.ndarray) -> np.ndarray:
        return run_onnx(session, batch)

    pairs = list(raw_pairs(args.cache, "test"))
    psnr = {
        name: round(
            float(np.mean([face_psnr(generate, settings, thermal, visible, layout) for thermal, visible in pairs])), 2
        )
        for name, layout in LAYOUTS.items()
    }
    alone = psnr["face alone"]
    report = {
        "command": f"python -m benchmarks.wide_frames --onnx {args.onnx} --cache {args.cache}",
        "machine_text": machine_text(),
        "image_size": settings.image_size,
        "thermal_norm": settings.thermal_norm,
        "test_frames": len(pairs),
        "face_psnr_db": psnr,
        "vs_face_alone_db": {name: round(value - alone, 2) for name, value in psnr.items()},
    }
    write_report(result_stem(args.report, args.out), report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
