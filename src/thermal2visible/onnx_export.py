"""The trained generator as one self-contained ONNX file, checked against PyTorch on real images.

The graph is the generator alone (U-Net or ResNet): (B,Ct,H,W) float32 in [-1,1] -> (B,Cv,H,W) in [-1,1], with
batch, height and width dynamic (H and W any multiples of the training size S, which both generators take), so whole
frames run fully convolutionally.
Everything a server needs to feed it (image size, channels, the preprocess settings training used) rides
along as `metadata_props`, so the .onnx file alone is enough to reproduce training's input pipeline (session.py
reads them back).
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

from thermal2visible.errors import PipelineError
from thermal2visible.inference.session import INPUT_NAME, OUTPUT_NAME, run_onnx
from thermal2visible.pixels import to_model


def cache_to_model_input(thermal: np.ndarray) -> np.ndarray:
    """Cache layout (N,H,W,C) uint16 of [0,1] x 65535 -> the generator's (N,C,H,W) float32 in [-1,1]."""
    return to_model(np.asarray(thermal))


# The exporter looks for torchvision's detection ops and warns, once per op, that torchvision is absent; the generator
# uses none of them.
logging.getLogger("torch.onnx._internal.exporter._registration").addFilter(
    lambda record: not record.getMessage().startswith("torchvision is not installed")
)


def export_generator(generator: torch.nn.Module, payload: dict, path: Path, opset: int, thermal_dtype: str) -> None:
    """Write `generator` (eval mode: dropout off, batch norm on its running statistics) to `path`, with
    the model settings, preprocess settings and lineage of its `generator.pt` payload as metadata, and
    `thermal_dtype`, the kind of thermal frame it was trained on (the cache manifest's: uint8, uint16, float32...)."""
    if payload["test_mode"] != "eval":
        raise PipelineError(
            f"train.test_mode: {payload['test_mode']!r}: this generator was validated with dropout on, so its output "
            "is random and would differ between the ONNX model and PyTorch (and between requests); export serves "
            "eval mode only: train with train.test_mode: eval to export"
        )
    config = payload["model"]
    metadata = {
        "opset": opset,
        "image_size": config["image_size"],
        "in_channels": config["in_channels"],
        "out_channels": config["out_channels"],
        "input_range": [-1, 1],
        "preprocess": payload["preprocess"],
        "thermal_dtype": thermal_dtype,
        "fingerprint": payload.get("fingerprint"),
        "data_hash": payload.get("data_hash"),
    }
    generator.eval()
    size = config["image_size"]
    # Batch 2 and a 2x3-tile frame as the example: torch.export specialises a dimension it sees as 1.
    example = torch.zeros(2, config["in_channels"], 2 * size, 3 * size)
    rows, cols = (torch.export.Dim(name, min=1, max=1024) for name in ("rows", "cols"))
    # The dynamo exporter is the maintained one (the TorchScript exporter is deprecated since torch 2.9);
    # we take its in-memory model instead of letting it save, so the weights can never land in a sidecar
    # `.onnx.data` file that a pyfunc's `artifacts=` would not copy.
    program = torch.onnx.export(
        generator,
        (example,),
        dynamo=True,
        opset_version=opset,
        verbose=False,
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_shapes=({0: torch.export.Dim("batch"), 2: size * rows, 3: size * cols},),
    )
    model = program.model_proto
    # torch.export's debug notes name this checkout's absolute paths (each node's stack trace) and print a set in
    # hash order (the graph's): without them the same weights give the same bytes in any clone and process, so a
    # rerun's dvc.lock stays the same. onnxruntime never reads them.
    del model.graph.metadata_props[:]
    for node in model.graph.node:
        del node.metadata_props[:]
    onnx.helper.set_model_props(model, {key: json.dumps(value) for key, value in metadata.items()})
    model.doc_string = "thermal2visible pix2pix generator: thermal in [-1,1] (NCHW) -> visible in [-1,1]"
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, path)


def run_torch(generator: torch.nn.Module, batch: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return generator(torch.from_numpy(batch)).numpy()


def in_chunks(images: np.ndarray, chunk: int = 16):
    for start in range(0, len(images), chunk):
        yield images[start : start + chunk]


def check_parity(session: ort.InferenceSession, generator: torch.nn.Module, images: np.ndarray, atol: float) -> float:
    """Max |onnxruntime - torch| over `images` (model input layout); PipelineError when above `atol`."""
    if len(images) == 0:
        raise PipelineError("parity check: no test images to compare onnxruntime with PyTorch on")
    generator.eval()
    error = max(
        float(np.abs(run_onnx(session, chunk) - run_torch(generator, chunk)).max()) for chunk in in_chunks(images)
    )
    if not error <= atol:  # also catches NaN
        raise PipelineError(
            f"ONNX parity check failed: max |onnxruntime - torch| = {error:.3g} on "
            f"{len(images)} test images exceeds export.atol = {atol:g}"
        )
    return error


WARM_UP_CALLS, TIMED_CALLS = 2, 20


def median_latency_ms(predict: Callable[[np.ndarray], object], image: np.ndarray, repeats: int = TIMED_CALLS) -> float:
    """Median wall time of one call on a batch of one image, after the warm-up calls."""
    for _ in range(WARM_UP_CALLS):
        predict(image)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        predict(image)
        times.append(time.perf_counter() - start)
    return 1000.0 * statistics.median(times)


def latency_line(latencies: dict[str, float], side: int) -> str:
    """`median_latency_ms`'s figures, each after what it ran, in one line that says what they measure."""
    figures = "; ".join(f"{what}: {ms:.2f} ms" for what, ms in latencies.items())
    return (
        f"latency of one {side}x{side} image through the generator alone (median wall time of {TIMED_CALLS} calls "
        f"on a batch of one, after {WARM_UP_CALLS} warm-up calls; no decoding or encoding): {figures}"
    )


class _Calibration(CalibrationDataReader):
    """Feeds training images one at a time to onnxruntime's static-quantization range collector."""

    def __init__(self, images: np.ndarray):
        self._batches = iter([{INPUT_NAME: image[None]} for image in images])

    def get_next(self):
        return next(self._batches, None)


def quantize_int8(fp32_path: Path, int8_path: Path, calibration_images: np.ndarray) -> None:
    """Static int8 quantization in QDQ form, activation ranges calibrated on `calibration_images`."""
    quantize_static(
        str(fp32_path), str(int8_path), _Calibration(calibration_images), quant_format=QuantFormat.QDQ, per_channel=True
    )
    # quantize_static keeps neither our metadata nor the doc string; the int8 file must stand alone too.
    fp32, int8 = onnx.load(fp32_path), onnx.load(int8_path)
    onnx.helper.set_model_props(int8, {prop.key: prop.value for prop in fp32.metadata_props})
    onnx.save_model(int8, int8_path)
