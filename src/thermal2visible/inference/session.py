"""The exported generator at run time: an onnxruntime session of the .onnx, the metadata export.py stored in it, and
one call. onnxruntime alone: what the served model runs needs neither torch nor onnx.

The metadata is input like any other: whoever wrote the file (a registry writer included) chose it. `exported_settings`
checks every key the code uses by type and range (the schema's constraints on the preprocess section, the channels
the graph really has) and refuses the file naming the key and the value, so a tampered file cannot turn into
silent garbage or an internal error on the first request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import onnxruntime as ort
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from thermal2visible.config.schema import PreprocessConfig

from thermal2visible.config.stored import upgraded
from thermal2visible.errors import PipelineError

INPUT_NAME = "thermal"
OUTPUT_NAME = "visible"


@dataclass(frozen=True, config=ConfigDict(strict=True, extra="ignore"))  # opset, input_range: information only
class ExportedSettings:
    image_size: Annotated[int, Field(ge=16)]
    in_channels: Literal[1, 3]
    out_channels: Literal[1, 3]
    preprocess: PreprocessConfig
    thermal_dtype: Literal["uint8", "uint16", "float32", "float64"] | None = None  # None: exported before it was kept
    fingerprint: str | None = None
    data_hash: str | None = None


def onnx_session(path: str | Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def onnx_metadata(session: ort.InferenceSession) -> dict[str, object]:
    """The `metadata_props` that `export` wrote (image size, channels, preprocess settings, lineage), unchecked."""
    return {key: json.loads(value) for key, value in session.get_modelmeta().custom_metadata_map.items()}


def _problem(error: dict) -> str:
    key = ".".join(str(part) for part in error["loc"])
    reason = error["ctx"]["error"] if error["type"] == "value_error" else error["msg"]
    return f"metadata {key}: {reason}" + ("" if error["type"] == "missing" else f", got {error['input']!r}")


def exported_settings(session: ort.InferenceSession, where: str) -> ExportedSettings:
    """The checked metadata of an .onnx (`where` names it in every refusal)."""
    try:
        metadata = onnx_metadata(session)
    except json.JSONDecodeError as error:
        raise PipelineError(f"{where}: metadata is not JSON ({error})") from None
    if isinstance(metadata.get("preprocess"), dict):
        metadata["preprocess"] = upgraded("preprocess", metadata["preprocess"])
    try:
        settings = TypeAdapter(ExportedSettings).validate_json(json.dumps(metadata))
    except ValidationError as error:
        raise PipelineError(f"{where}: " + "; ".join(_problem(problem) for problem in error.errors())) from None
    if settings.image_size != settings.preprocess.image_size:
        raise PipelineError(
            f"{where}: metadata image_size {settings.image_size} differs from preprocess.image_size "
            f"{settings.preprocess.image_size}"
        )
    for key, node in (("in_channels", session.get_inputs()[0]), ("out_channels", session.get_outputs()[0])):
        graph_channels = node.shape[1] if len(node.shape) == 4 else None
        if graph_channels != getattr(settings, key):
            raise PipelineError(
                f"{where}: metadata {key} {getattr(settings, key)} but the graph's {node.name} has shape {node.shape}"
            )
    return settings


def run_onnx(session: ort.InferenceSession, batch: np.ndarray) -> np.ndarray:
    return session.run([OUTPUT_NAME], {INPUT_NAME: batch})[0]
