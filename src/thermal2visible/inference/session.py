"""The exported generator at run time: an onnxruntime session of the .onnx, the metadata export.py stored in it, and
one call. onnxruntime alone: what the served model runs needs neither torch nor onnx."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

INPUT_NAME = "thermal"
OUTPUT_NAME = "visible"


def onnx_session(path: str | Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def onnx_metadata(session: ort.InferenceSession) -> dict[str, object]:
    """The `metadata_props` that `export` wrote (image size, channels, preprocess settings, lineage)."""
    return {key: json.loads(value) for key, value in session.get_modelmeta().custom_metadata_map.items()}


def run_onnx(session: ort.InferenceSession, batch: np.ndarray) -> np.ndarray:
    return session.run([OUTPUT_NAME], {INPUT_NAME: batch})[0]
