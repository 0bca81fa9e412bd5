"""Does a hot radiator or a cold window in the room change how a camera-scene model translates everything else?
Each test frame of the built-in camera scene whose room holds a radiator, a window or both is rendered twice from its
own shot, as synthesized and calm (the same shot with the objects taken out of the room), translated by
`inference.frames.translate_frame` (the served path) through the exported ONNX model and scored against the calm
visible frame of a registered camera.

    python -m benchmarks.camera_calm --params params.yaml --preset params/camera.yaml \
        --onnx models/generator.onnx --cache data/cache

PSNR (dB, [0, 1] images, mean over the test frames) over the pixels the two renders share — where the objects are
(where the two thermal renders differ, grown by GROW pixels) is left out of both scores — in two regions: the face
(the face box `preprocess.face_crop` would cut from the calm frame) and the whole frame. Writes a
new benchmarks/results/<date>-camera_calm.json (--report names it otherwise, --out puts it at a path of your choice).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy.ndimage import binary_dilation

from benchmarks.common import add_report_option, machine_text, result_stem, write_report
from thermal2visible.config.load import load_params, preset_overrides
from thermal2visible.config.stored import stored_section
from thermal2visible.data.cache import load_manifest
from thermal2visible.data.preprocess import face_box, thermal_counts
from thermal2visible.paths import CACHE, CAMERA, ONNX, PARAMS
from thermal2visible.data.synthetic import random_face, render, shot_of
from thermal2visible.inference.frames import translate_frame
from thermal2visible.inference.session import onnx_metadata, onnx_session, run_onnx
from thermal2visible.pixels import unit

GROW = 4  # pixels around the objects left out too: the resize to the model's size blurs their edges
NAME = re.compile(r"thermal/person_(\d+)/seq(\d+)_(\d+)\.png$")


def test_shots(cache: Path, synthesize) -> list[tuple[int, int]]:
    """(person, index) of every test frame of a camera-scene cache, from its file name (`synthetic.shot_of`)."""
    shots = []
    for source in load_manifest(cache)["sources"]:
        if source["split"] == "test":
            person, sequence, frame = map(int, NAME.search(source["thermal"]).groups())
            shots.append((person, sequence * synthesize.sequence_length + frame))
    return shots


def shared_psnr(prediction: np.ndarray, truth: np.ndarray, shared: np.ndarray) -> float:
    error = np.mean((prediction[shared] - truth[shared]) ** 2)
    return float(10 * np.log10(1.0 / error))


def face_mask(calm_thermal: np.ndarray) -> np.ndarray:
    """The face box of `face_crop` (the square around the largest warm blob) of a calm frame, as a mask."""
    row, col, side = face_box(thermal_counts(calm_thermal), 0.0)
    mask = np.zeros(calm_thermal.shape, bool)
    mask[row : row + side, col : col + side] = True
    return mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=PARAMS)
    parser.add_argument("--preset", type=Path, default=CAMERA)
    parser.add_argument("--onnx", type=Path, default=ONNX)
    parser.add_argument("--cache", type=Path, default=CACHE)
    add_report_option(parser, "camera_calm", "json")
    args = parser.parse_args()
    synthesize = load_params(args.params, preset_overrides(args.preset)).synthesize
    session = onnx_session(args.onnx)
    settings = stored_section("preprocess", onnx_metadata(session)["preprocess"])
    width = round(synthesize.resolution * synthesize.aspect)

    def generate(batch: np.ndarray) -> np.ndarray:
        return run_onnx(session, batch)

    scores = defaultdict(lambda: defaultdict(list))  # region -> frame kind -> PSNR per test frame
    for person, index in test_shots(args.cache, synthesize):
        face = random_face(np.random.default_rng([synthesize.seed, person]))
        shot, lighting, _ = shot_of(synthesize, person, index)
        if shot.hot is None and shot.cold is None:
            continue  # a calm room already: nothing to take out
        calm_shot = dataclasses.replace(shot, hot=None, cold=None)
        busy, _ = render(face, shot, lighting, synthesize.resolution, width)
        calm, truth = render(face, calm_shot, lighting, synthesize.resolution, width)
        shared = ~binary_dilation(busy != calm, iterations=GROW)
        regions = {"face": shared & face_mask(calm), "frame": shared}
        for name, thermal in (("with the room's objects", busy), ("calm", calm)):
            translated = translate_frame(generate, thermal, settings)
            for region, mask in regions.items():
                scores[region][name].append(shared_psnr(translated, unit(truth), mask))
    psnr = {
        region: {name: round(float(np.mean(values)), 2) for name, values in by_frame.items()}
        for region, by_frame in scores.items()
    }
    report = {
        "command": f"python -m benchmarks.camera_calm --params {args.params} --preset {args.preset} "
        f"--onnx {args.onnx} --cache {args.cache} --report {args.report}",
        "machine_text": machine_text(),
        "image_size": settings.image_size,
        "thermal_norm": settings.thermal_norm,
        "test_frames": len(scores["frame"]["calm"]),
        "psnr_db": psnr,
        "objects_minus_calm_db": {
            region: round(by_frame["with the room's objects"] - by_frame["calm"], 2)
            for region, by_frame in psnr.items()
        },
    }
    write_report(result_stem(args.report, args.out), report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
