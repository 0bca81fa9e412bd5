"""export: models/generator.pt -> models/generator.onnx, checked against PyTorch on the real test images.

Writes metrics/export.json (parity error, size, opset), reports/exported.json (the generator it exported, by sha256)
and, with `export.int8`, models/generator.int8.onnx plus its size and PSNR against the fp32 model. Latencies
(onnxruntime vs torch, int8) are printed, not written: a tracked output holds only what a rerun reproduces byte for
byte (benchmarks/inference.py measures speed properly).
The .onnx is written beside its final path and moved there only after the parity check passed, so a
failing export never leaves a model behind for `register` to pick up.
"""

from __future__ import annotations

import json

import numpy as np
import torch

from thermal2visible.cli import run_stage
from thermal2visible.errors import PipelineError
from thermal2visible.config.schema import Params
from thermal2visible.onnx_export import (
    cache_to_model_input,
    check_parity,
    export_generator,
    latency_line,
    median_latency_ms,
    quantize_int8,
    run_torch,
)
from thermal2visible.inference.session import onnx_session, run_onnx
from thermal2visible.metrics import psnr
from thermal2visible.models.payloads import load_generator
from thermal2visible.data.cache import array_file, load_manifest
from thermal2visible.tracking.digests import GENERATOR_DIGEST, file_digest
from thermal2visible.paths import CACHE, EXPORT_METRICS, EXPORT_REPORT, GENERATOR, MANIFEST, ONNX, ONNX_INT8
from thermal2visible.stage_records import write_record
from thermal2visible.pixels import from_model

CALIBRATION_IMAGES = 64


def load_split(split: str, image_size: int) -> np.ndarray:
    path = array_file(CACHE, split, "thermal")
    if not path.is_file():
        raise PipelineError(f"{path}: no cached {split} images (run the preprocess stage first)")
    images = cache_to_model_input(np.load(path, mmap_mode="r"))
    if images.shape[-1] != image_size:
        raise PipelineError(
            f"{path}: images are {images.shape[-1]} px but the generator was trained at "
            f"{image_size} px (re-run preprocess and train)"
        )
    return images


def trained_thermal_dtype() -> str:
    """The kind of thermal frame the cache holds (uint8, uint16 or a float map), as its manifest says."""
    manifest = load_manifest(CACHE)
    if "thermal_dtype" not in manifest:
        raise PipelineError(
            f"{CACHE / MANIFEST}: says nothing of the thermal frames' kind (written before "
            "caches recorded it): run the preprocess stage again"
        )
    return manifest["thermal_dtype"]


def main(params: Params) -> None:
    generator, payload = load_generator(GENERATOR)
    image_size = payload["model"]["image_size"]
    test = load_split("test", image_size)

    staged = ONNX.with_suffix(".onnx.partial")
    export_generator(generator, payload, staged, params.export.opset, trained_thermal_dtype())
    session = onnx_session(staged)
    try:
        error = check_parity(session, generator, test, params.export.atol)
    except PipelineError:
        staged.unlink()
        raise
    staged.replace(ONNX)

    one = test[:1]
    metrics = {
        "parity_max_abs_error": error,
        "parity_images": len(test),
        "atol": params.export.atol,
        "parity_passed": True,
        "opset": params.export.opset,
        "size_bytes": ONNX.stat().st_size,
        GENERATOR_DIGEST: file_digest(GENERATOR),  # what register checks the export against
    }
    latencies = {
        f"onnxruntime on {ONNX} (what serving runs)": median_latency_ms(lambda x: run_onnx(session, x), one),
        f"torch on {GENERATOR} (eager PyTorch, the parity check's reference)": median_latency_ms(
            lambda x: run_torch(generator, x), one
        ),
    }
    if params.export.int8:
        quantize_int8(ONNX, ONNX_INT8, load_split("train", image_size)[:CALIBRATION_IMAGES])
        int8 = onnx_session(ONNX_INT8)
        metrics |= {
            "int8_size_bytes": ONNX_INT8.stat().st_size,
            "int8_psnr_vs_fp32": float(
                psnr(*(from_model(torch.from_numpy(run_onnx(model, test))) for model in (session, int8))).mean()
            ),
        }
        latencies[f"onnxruntime on {ONNX_INT8}"] = median_latency_ms(lambda x: run_onnx(int8, x), one)
    write_record(metrics, EXPORT_METRICS, EXPORT_REPORT)
    print(json.dumps(metrics, indent=2))
    print(latency_line(latencies, image_size))


if __name__ == "__main__":
    run_stage(main, description=__doc__.splitlines()[0])
