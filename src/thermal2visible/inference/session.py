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

from thermal2visible.config.messages import reason
from thermal2visible.config.schema import PreprocessConfig
from thermal2visible.config.stored import stored_section, upgraded
from thermal2visible.errors import PipelineError

INPUT_NAME = "thermal"
OUTPUT_NAME = "visible"
EXPORT_WRITES_IT = "the export stage writes every key; export the model again"


@dataclass(frozen=True, config=ConfigDict(strict=True, extra="ignore"))  # opset, input_range: information only
class ExportedSettings:
    image_size: Annotated[int, Field(ge=16)]
    in_channels: Literal[1, 3]
    out_channels: Literal[1, 3]
    preprocess: PreprocessConfig
    thermal_dtype: Literal["uint8", "uint16", "float32", "float64"] | None = None  # None: exported before it was kept
    fingerprint: str | None = None
    data_hash: str | None = None


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
        problems = (
            reason(problem, missing=EXPORT_WRITES_IT, schema=ExportedSettings, prefix="metadata ")
            for problem in error.errors()
        )
        raise PipelineError(f"{where}: " + "; ".join(dict.fromkeys(problems))) from None
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


# One run (a batch of up to 16 tiles) of a graph this checkout exported itself (export's parity check, benchmarks): a
# few seconds for the U-Net at 512 px on 2 CPU cores. Readers of a model file or registered version (make serve,
# translate.py, the champion gate) take serve.max_run_seconds instead.
RUN_SECONDS = 300.0
# The one-square run on load (`check_runs`) of a version packed before serve.max_check_seconds was kept: a looping
# graph is refused this soon, whatever its per-batch limit.
CHECK_SECONDS = 10.0


def run_onnx(session: ort.InferenceSession, batch: np.ndarray, seconds: float = RUN_SECONDS) -> np.ndarray:
    """The generator on one batch, stopped after `seconds` by onnxruntime's own flag, which it checks between nodes
    and between a Loop's iterations: RunTimeLimit then."""
    options = ort.RunOptions()
    options.log_severity_level = 4  # the terminate flag's own error line would reach the user's terminal as noise
    timer = threading.Timer(seconds, setattr, (options, "terminate", True))
    timer.start()
    try:
        return session.run([OUTPUT_NAME], {INPUT_NAME: batch}, options)[0]
    except Exception:
        if options.terminate:
            raise RunTimeLimit(f"an onnxruntime run passed its {seconds:g} s limit") from None
        raise
    finally:
        timer.cancel()


def check_runs(
    session: ort.InferenceSession, settings: ExportedSettings, where: str, max_model_pixels: int, seconds: float
) -> None:
    """The graph run once on one training square of its metadata's image_size: a size the network's depth does not
    take (a U-Net of log2(S) levels fed 17 px) is refused naming the file, key and value when the model is loaded,
    rather than failing every frame with onnxruntime's text; the graph decides, whichever generator made it. A graph
    that loops stops at `seconds` (serve.max_check_seconds: RunTimeLimit naming the file and the key)."""
    size, channels = settings.image_size, settings.in_channels
    if size * size > max_model_pixels:  # before the square is allocated: the metadata chose its size
        raise PipelineError(
            f"{where}: metadata image_size {size}: one {size}x{size} square is over max_model_pixels "
            f"{max_model_pixels}, so every frame would be refused"
        )
    try:
        visible = run_onnx(session, np.zeros((1, channels, size, size), np.float32), seconds)
    except RunTimeLimit as error:
        raise RunTimeLimit(f"{where}: {error} on one {size}x{size} square (serve.max_check_seconds)") from None
    except Exception as error:  # onnxruntime's own types, as on load
        raise PipelineError(
            f"{where}: metadata image_size {size}: the graph cannot run on one {size}x{size} square "
            f"({_load_reason(error)})"
        ) from None
    if visible.shape != (1, settings.out_channels, size, size):
        raise PipelineError(
            f"{where}: metadata image_size {size}: the graph turns one {size}x{size} square into shape "
            f"{list(visible.shape)}, not [1, {settings.out_channels}, {size}, {size}]"
        )


def check_trained_with(preprocess: PreprocessConfig, manifest: str | Path, where: str) -> None:
    """The metadata's preprocess settings are those of the training record packed with the model (the cache manifest
    it trained on), key for key: training refuses params that differ from its cache, so a difference (face_crop on a
    model trained without it) is a tampered or mismatched file, which would be served with the wrong input."""
    try:
        recorded = stored_section("preprocess", json.loads(Path(manifest).read_text())["preprocess"])
    except (OSError, ValueError, KeyError, TypeError) as error:  # ValueError: bad JSON, or the schema's ConfigError
        raise PipelineError(f"{manifest}: not a training record this code can read ({error})") from None
    differ = [
        f"metadata preprocess.{key} {getattr(preprocess, key)!r} but the training record {manifest} holds "
        f"{getattr(recorded, key)!r}"
        for key in preprocess.__dataclass_fields__
        if getattr(preprocess, key) != getattr(recorded, key)
    ]
    if differ:
        raise PipelineError(f"{where}: " + "; ".join(differ))
