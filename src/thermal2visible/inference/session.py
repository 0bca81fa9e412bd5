"""The exported generator at run time: an onnxruntime session of the .onnx, the metadata export.py stored in it, and
one call. onnxruntime alone: what the served model runs needs neither torch nor onnx.

The metadata is input like any other: whoever wrote the file (a registry writer included) chose it. `exported_settings`
checks every key the code uses by type and range (the schema's constraints on the preprocess section, the channels
the graph really has) and refuses the file naming the key and the value, so a tampered file cannot turn into
silent garbage or an internal error on the first request."""

from __future__ import annotations

import json
import re
import threading
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


RUN_SECONDS = 300.0  # one run (a batch of up to 16 tiles): a few seconds for the U-Net at 512 px on 2 CPU cores


class RunTimeLimit(PipelineError):
    """An onnxruntime run stopped at its time limit: a graph can loop (a Loop node of 10^12 iterations) although
    the file is data."""


ORT_NOISE = re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : |Load model from .*? failed:|\S+\.(?:cc|h):\d+ \S+\(.*?\) ")


def _load_reason(error: Exception) -> str:
    """onnxruntime's reason, without its error-code prefix, the path again and C++ source locations: one line."""
    lines = str(error).strip().splitlines()
    reason = ORT_NOISE.sub("", lines[0]).strip() if lines else ""
    return (reason or type(error).__name__)[:300]


def onnx_session(path: str | Path, threads: int | None = None) -> ort.InferenceSession:
    """The file's session on the CPU, or a PipelineError in one line naming it (onnxruntime's own message carries
    its C++ source location and, for a graph it cannot build, several lines). `threads`: intra-op threads (None:
    onnxruntime's default, one per core)."""
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own types (Fail, InvalidGraph, NoSuchFile...) and RuntimeError
        raise PipelineError(f"{path}: onnxruntime cannot load it ({_load_reason(error)})") from None


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


def run_onnx(session: ort.InferenceSession, batch: np.ndarray, seconds: float | None = None) -> np.ndarray:
    """The generator on one batch, stopped after `seconds` (default RUN_SECONDS) by onnxruntime's own flag, which
    it checks between nodes and between a Loop's iterations: RunTimeLimit then."""
    seconds = RUN_SECONDS if seconds is None else seconds
    options = ort.RunOptions()
    options.log_severity_level = 4  # the terminate flag's own error line would reach the user's terminal as noise
    timer = threading.Timer(seconds, setattr, (options, "terminate", True))
    timer.start()
    try:
        return session.run([OUTPUT_NAME], {INPUT_NAME: batch}, options)[0]
    except Exception:
        if options.terminate:
            raise RunTimeLimit(f"an onnxruntime run passed its {seconds:g} s limit (session.RUN_SECONDS)") from None
        raise
    finally:
        timer.cancel()
