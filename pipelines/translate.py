"""Translate thermal images or a thermal video into visible ones, through the same model code REST serving uses.

    python pipelines/translate.py --model models:/thermal2visible-portrait@champion --input DIR --output DIR
    python pipelines/translate.py --model models:/thermal2visible-portrait@champion --input a.mp4 --output b.mp4

--model takes any MLflow model URI (models:/NAME@ALIAS, models:/NAME/VERSION, runs:/...), whose ONNX file is
fetched as data and run by the installed code (nothing from the registry is executed), or a .onnx file from
`export`. Folder: images (PNG/JPEG/TIFF, 8/16-bit or float
TIFF, any size) are found recursively; each OUTPUT/<relative path>.png has the size of its input, in register
with it. A bad image is reported by name and skipped; the command then exits 1. Video (.mp4, .mov, .avi,
.mkv): every frame is translated by the same model code, one at a time (memory does not grow with the video's
length), into a video of the same frame count, size and frame rate (H.264); a frame that cannot be decoded
stops the run naming the frame, and no output file is left behind.

The output may not be the input, lie inside it or contain it (as the paths lead, through symbolic links): such a
run is refused, naming both paths, before the model is loaded or anything is written, and exits 1. A translation
would overwrite the thermal originals with visible PNGs, or mix its outputs among them.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd
from mlflow.exceptions import MlflowException
from tqdm import tqdm

from thermal2visible.errors import ConfigError, PipelineError
from thermal2visible.config.load import load_params
from thermal2visible.data.images import image_suffixes, read_bytes
from thermal2visible.registry.version_files import load_registered, model_of_files
from thermal2visible.inference.session import RunTimeLimit
from thermal2visible.inference.serving import IMAGE, ThermalToVisible, to_base64
from thermal2visible.inference.video import VIDEO_SUFFIXES, translate_video


def load_model(model: str, experiment: str | None, limits: tuple[float, ...], scratch: Path) -> ThermalToVisible:
    """The installed serving code around a .onnx file, or around the ONNX file of a registered model, fetched as
    data (registry.version_files) once it is trusted as coming from `experiment`: no code from the registry runs
    here."""
    if model.endswith(".onnx"):
        if not Path(model).is_file():
            raise PipelineError(f"{model}: no such ONNX file")
        return model_of_files({"onnx": model}, *limits)
    try:
        return load_registered(model, experiment, scratch, *limits)
    except MlflowException as error:
        raise PipelineError(f"{model}: cannot load the model ({error.message})") from None


def _same(a: Path, b: Path) -> bool:
    """Whether two resolved paths are one file or folder (also through a hard link or a second mount)."""
    try:
        return a == b or os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def refuse_overlap(source: Path, target: Path) -> None:
    """Refuse an output that is the input, lies inside it or contains it, as the paths resolve through symbolic
    links: translating would overwrite the originals or mix outputs among them. Checks paths only: nothing is read
    or written."""
    real_source, real_target = source.resolve(), target.resolve()
    if _same(real_target, real_source):
        how = "is the input"
    elif any(_same(folder, real_source) for folder in real_target.parents):
        how = "lies inside the input"
    elif any(_same(folder, real_target) for folder in real_source.parents):
        how = "contains the input"
    else:
        return
    resolved = (
        f" ({real_target} and {real_source} once links are followed)"
        if (real_target, real_source) != (Path(os.path.abspath(target)), Path(os.path.abspath(source)))
        else ""
    )
    raise PipelineError(
        f"--output {target} {how} {source}{resolved}: refused, so that no input is overwritten and no output "
        "mixes with the inputs; choose an output outside the input"
    )


def find_images(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise PipelineError(f"{folder}: no such input folder")
    images = sorted(path for path in folder.rglob("*") if path.is_file() and path.suffix.lower() in image_suffixes())
    if not images:
        raise PipelineError(f"{folder}: no images ({', '.join(image_suffixes())}) found")
    outputs = [path.relative_to(folder).with_suffix(".png") for path in images]
    if len(set(outputs)) != len(outputs):
        clash = next(out for out in outputs if outputs.count(out) > 1)
        raise PipelineError(f"{folder}: two images would both be written as {clash} (same name, other format)")
    return images


def translate(model: ThermalToVisible, images: list[Path], source: Path, target: Path) -> list[str]:
    """Write one PNG per image; return the errors of the images that could not be translated."""
    errors = []
    for path in tqdm(images, desc="translating", unit="image"):
        try:
            request = pd.DataFrame({IMAGE: [to_base64(read_bytes(path))]})
            visible = base64.b64decode(model.predict(None, request)[IMAGE][0])
        except RunTimeLimit:  # the model's fault: every other image would wait as long
            raise
        except (MlflowException, PipelineError) as error:
            errors.append(f"{path}: {getattr(error, 'message', error)}")
            continue
        out = target / path.relative_to(source).with_suffix(".png")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(visible)
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="MLflow model URI or a .onnx file")
    parser.add_argument("--input", required=True, type=Path, help="folder of thermal images, or a thermal video")
    parser.add_argument("--output", required=True, type=Path, help="folder for the visible PNGs, or a video file")
    parser.add_argument(
        "--max-pixels", type=int, help="largest image accepted, width x height (default: params.yaml serve.max_pixels)"
    )
    parser.add_argument(
        "--max-model-pixels",
        type=int,
        help="most pixels one frame may cost the model once scaled by image_size / its shorter side "
        "(default: params.yaml serve.max_model_pixels)",
    )
    parser.add_argument(
        "--max-run-seconds",
        type=float,
        help="longest one run of the model may take before the model is refused "
        "(default: params.yaml serve.max_run_seconds)",
    )
    parser.add_argument(
        "--max-check-seconds",
        type=float,
        help="longest the model's one-square check on load may take before the model is refused "
        "(default: params.yaml serve.max_check_seconds)",
    )
    parser.add_argument(
        "--experiment",
        help="the project's MLflow experiment: on a team server, a registered model is loaded only if its version "
        "comes from it (docs/team.md; default: params.yaml mlflow.experiment)",
    )
    args = parser.parse_args()
    limits = ("max_pixels", "max_model_pixels", "max_run_seconds", "max_check_seconds")
    # a file or folder here needs no experiment: only what comes from a store is checked against it
    needs_experiment = args.experiment is None and urlparse(args.model).scheme not in ("", "file")
    if needs_experiment or any(getattr(args, limit) is None for limit in limits):
        try:
            params = load_params()
        except ConfigError as error:
            sys.exit(
                f"error: {error} (run from the project folder, or give --max-pixels, --max-model-pixels, "
                "--max-run-seconds, --max-check-seconds and, for a registered model, --experiment)"
            )
        for limit in limits:
            if getattr(args, limit) is None:
                setattr(args, limit, getattr(params.serve, limit))
        args.experiment = args.experiment or params.mlflow.experiment
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # MLflow draws a progress bar for every artifact it downloads, a block of lines for the model read here
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    video = args.input.suffix.lower() in VIDEO_SUFFIXES
    try:
        refuse_overlap(args.input, args.output)  # before anything is loaded or written
        images = [] if video else find_images(args.input)
        with tempfile.TemporaryDirectory() as scratch:
            model = load_model(
                args.model, args.experiment, tuple(getattr(args, limit) for limit in limits), Path(scratch)
            )
            if video:
                frames = translate_video(model, args.input, args.output)
                print(f"translated {frames} frames of {args.input} into {args.output}")
                return
            errors = translate(model, images, args.input, args.output)
    except (PipelineError, MlflowException) as error:
        print(f"error: {getattr(error, 'message', error)}", file=sys.stderr)
        sys.exit(1)
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    print(f"translated {len(images) - len(errors)} of {len(images)} images into {args.output}")
    if errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
