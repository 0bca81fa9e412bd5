"""The served model packed for MLflow: what `mlflow.pyfunc.log_model` and `save_model` need to make the .onnx a
`serving.ThermalToVisible` pyfunc (`pyfunc_arguments`): the code it runs (serving.py and what it imports, copied as
`code_paths`), its signature, an input example of the kind of frame it was trained on, and its requirements. Runs
where a model is logged, never where it is served, so it is no part of the packed code."""

from __future__ import annotations

import io
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import tifffile
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, Schema

from thermal2visible.config.schema import PreprocessConfig
from thermal2visible.errors import PipelineError
from thermal2visible.imports import PACKAGE, import_closure, libraries
from thermal2visible.inference import serving
from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.inference.serving import IMAGE, TRAINING_MANIFEST, to_base64
from thermal2visible.inference.session import ExportedSettings, exported_settings, onnx_session

SIGNATURE = ModelSignature(inputs=Schema([ColSpec("string", IMAGE)]), outputs=Schema([ColSpec("string", IMAGE)]))
EXAMPLE_SIDE = 32
SERVED_MODEL = Path(serving.__file__).with_name("served_model.py")


# MLflow publishes its package without the tracking server's and the UI's dependencies (Flask, SQLAlchemy, gunicorn,
# scikit-learn, matplotlib, ...) as mlflow-skinny, for serving: a served model needs MLflow's pyfunc alone.
SERVING_DISTRIBUTIONS = {"mlflow": "mlflow-skinny"}


def requirements(entry: Path = SERVED_MODEL) -> list[str]:
    """The installed version of every library the code of `entry` imports (its own code travels with it:
    `packed_code`), read from the imports themselves, so a library the code stops importing leaves."""
    return sorted(
        f"{SERVING_DISTRIBUTIONS.get(name, name)}=={version}"
        for name, version in libraries(import_closure(entry)).items()
    )


@dataclass(frozen=True)
class ThermalInput:
    """The thermal frames a model was trained on: what its input example, and a reader of the registry, must be
    told."""

    dtype: str  # as the cache's manifest recorded it: uint8, uint16 (counts) or float32/float64 (temperatures)
    channels: int
    preprocess: PreprocessConfig

    def __str__(self) -> str:
        return (
            f"{self.dtype} {'grey' if self.channels == 1 else 'RGB'} thermal frame "
            f"(thermal_norm: {self.preprocess.thermal_norm})"
        )


def thermal_input(settings: ExportedSettings, where: str) -> ThermalInput:
    """The thermal frames of an .onnx's settings; a PipelineError naming `where` for an export that did not
    record it."""
    if settings.thermal_dtype is None:
        raise PipelineError(
            f"{where}: its metadata does not say which kind of thermal frame it was trained on "
            "(exported before models recorded thermal_dtype): run the export stage again"
        )
    return ThermalInput(settings.thermal_dtype, settings.in_channels, settings.preprocess)


def image_formats(trained_on: ThermalInput) -> dict[str, str]:
    """What the signature's strings hold (it says only "string"): the MLmodel file's metadata, for a reader of
    the registry."""
    return {
        "input": f"image: base64 PNG/JPEG/TIFF thermal frame of any size; trained on {trained_on}",
        "output": "image: base64 8-bit PNG visible frame of the input's width x height, in register with it",
    }


def example_frame(trained_on: ThermalInput) -> np.ndarray:
    """A small ramp of `trained_on`'s frames: across temperature_range for a temperature map, across the whole range of
    counts for integer frames."""
    dtype = np.dtype(trained_on.dtype)
    low, high = trained_on.preprocess.temperature_range if dtype.kind == "f" else (0, np.iinfo(dtype).max)
    ramp = np.linspace(low, high, EXAMPLE_SIDE**2).reshape(EXAMPLE_SIDE, EXAMPLE_SIDE).astype(dtype)
    return ramp if trained_on.channels == 1 else np.dstack([ramp] * trained_on.channels)


def tiff_bytes(pixels: np.ndarray) -> bytes:
    """TIFF holds every kind a model takes (Pillow writes neither 16-bit RGB nor float PNGs)."""
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, pixels, photometric="minisblack" if pixels.ndim == 2 else "rgb")
    return buffer.getvalue()


def example_request(trained_on: ThermalInput) -> pd.DataFrame:
    """The input example logged with the model: a frame of the kind it was trained on."""
    return pd.DataFrame({IMAGE: [to_base64(tiff_bytes(example_frame(trained_on)))]})


def packed_files(entry: Path = Path(serving.__file__)) -> list[str]:
    """The files `packed_code` packs, relative to the package."""
    return sorted(str(path.relative_to(PACKAGE)) for path in import_closure(entry))


@contextmanager
def packed_code(entry: Path = Path(serving.__file__)) -> Iterator[Path]:
    """The package files `entry` runs (by default the served model's: serving.py and what it imports, transitively:
    no training, tracking or dev code), copied into a temporary `thermal2visible` folder laid out as the package is."""
    with tempfile.TemporaryDirectory() as staging:
        code = Path(staging) / PACKAGE.name
        for name in packed_files(entry):
            (code / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(PACKAGE / name, code / name)
        yield code


@contextmanager
def pyfunc_arguments(
    onnx_path: str | Path, limits: ServedLimits, training_manifest: str | Path | None = None
) -> Iterator[dict[str, object]]:
    """What `mlflow.pyfunc.log_model` and `save_model` both need to package the .onnx as this pyfunc, valid while
    the context lasts: `with pyfunc_arguments(...) as arguments: mlflow.pyfunc.save_model(path, **arguments)`.

    The code the model runs goes along as `code_paths` (`packed_files`, as `thermal2visible/...`), so a registered
    version keeps the preprocessing it was trained with even after the code here moves on, and serves where the
    project is not installed. A registered version also carries the cache manifest it was trained on
    (`training_manifest`): which frames it learnt from.
    """
    trained_on = thermal_input(exported_settings(onnx_session(onnx_path), str(onnx_path)), str(onnx_path))
    artifacts = {"onnx": str(onnx_path)} | ({TRAINING_MANIFEST: str(training_manifest)} if training_manifest else {})
    with packed_code() as code:
        yield dict(
            python_model=str(SERVED_MODEL),  # models-from-code: a code file, never a pickle
            artifacts=artifacts,
            code_paths=[str(code)],
            model_config=asdict(limits),
            signature=SIGNATURE,
            metadata=image_formats(trained_on),
            input_example=example_request(trained_on),
            pip_requirements=requirements(),
        )
