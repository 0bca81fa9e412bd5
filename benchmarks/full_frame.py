"""Full-frame translation: `pad` (one fully convolutional pass) against `tile` (overlapping training-size tiles),
with the old centre-square-stretched-to-the-frame as the reference, on the test pairs of a built cache.

    python -m benchmarks.full_frame --onnx models/generator.onnx --cache data/cache

PSNR (dB, [0, 1] images, mean over frames) on the test faces as they are (square) and on two and three test faces
side by side (2:1 and 3:1: the wide frames where the methods differ; a frame is scaled by image_size / its shorter
side, so every square frame is one training view); latency (ms, onnxruntime on this CPU) on a Lepton 160x120 and a
Boson 640x512 frame, the three methods in interleaved rounds (benchmarks/rounds.py), set against `pad`.
Writes a new benchmarks/results/<date>-full_frame.json (--report names it otherwise, --out puts it at a path of your
choice).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from skimage.metrics import peak_signal_noise_ratio
from skimage.transform import resize

from benchmarks.common import add_report_option, machine_text, result_stem, write_report
from benchmarks.rounds import measure_rounds, ratio_text, summarize
from thermal2visible.config.schema import PreprocessConfig
from thermal2visible.config.stored import stored_section
from thermal2visible.data.cache import raw_pairs
from thermal2visible.paths import CACHE, ONNX
from thermal2visible.data.preprocess import prepare_thermal
from thermal2visible.onnx_export import median_latency_ms
from thermal2visible.inference.frames import translate_frame
from thermal2visible.inference.session import onnx_metadata, onnx_session, run_onnx
from thermal2visible.pixels import from_model, nhwc, to_model, unit


def stretched(generate, frame: np.ndarray, settings: PreprocessConfig) -> np.ndarray:
    """The translation before full-frame: the centre square's output resized over the whole frame."""
    square = from_model(nhwc(generate(to_model(prepare_thermal(frame, settings))))[0])
    return resize(square, (*frame.shape[:2], square.shape[2]), anti_aliasing=False)


def side_by_side(pairs: list[tuple[np.ndarray, np.ndarray]], count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Consecutive groups of `count` pairs, each joined left to right into one wide (thermal, visible) pair."""
    groups = [pairs[k : k + count] for k in range(0, len(pairs) - count + 1, count)]
    return [tuple(np.hstack(images) for images in zip(*group)) for group in groups]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnx", type=Path, default=ONNX)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--rounds", type=int, default=3, help="timed latency rounds after one warm-up round")
    add_report_option(parser, "full_frame", "json")
    args = parser.parse_args()
    session = onnx_session(args.onnx)
    metadata = onnx_metadata(session)
    settings = stored_section("preprocess", metadata["preprocess"])

    def generate(batch: np.ndarray) -> np.ndarray:
        return run_onnx(session, batch)

    methods = {
        "pad": lambda frame: translate_frame(generate, frame, settings, "pad"),
        "tile": lambda frame: translate_frame(generate, frame, settings, "tile"),
        "stretch (before)": lambda frame: stretched(generate, frame, settings),
    }
    pairs = list(raw_pairs(args.cache, "test"))
    report = {
        "machine_text": machine_text(),
        "image_size": settings.image_size,
        "test_pairs": len(pairs),
        "psnr_db": {},
        "latency_ms": {},
        "latency_vs_pad": {},
    }
    layouts = {f"{count} side by side ({count}:1)": side_by_side(pairs, count) for count in (1, 2, 3)}
    for layout, frames in layouts.items():
        report["psnr_db"][layout] = {
            name: round(
                float(
                    np.mean(
                        [
                            peak_signal_noise_ratio(unit(visible), method(thermal), data_range=1.0)
                            for thermal, visible in frames
                        ]
                    )
                ),
                2,
            )
            for name, method in methods.items()
        }
    rng = np.random.default_rng(0)
    for height, width in ((120, 160), (512, 640)):
        frame = rng.integers(29_000, 31_000, (height, width), dtype=np.uint16)
        calls = {
            name: (lambda method=method: median_latency_ms(method, frame, repeats=5) / 1000)
            for name, method in methods.items()
        }
        summary = summarize(measure_rounds(calls, args.rounds, label=f"{width}x{height}: "), baseline="pad")
        report["latency_ms"][f"{width}x{height}"] = {
            name: round(1000 * figures["median_s"], 1) for name, figures in summary["configs"].items()
        }
        report["latency_vs_pad"][f"{width}x{height}"] = {
            name: ratio_text(figures) for name, figures in summary["configs"].items()
        }
    write_report(result_stem(args.report, args.out), report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
