"""A tiny untrained generator in the `train` stage's models/generator.pt format, and its ONNX export.

Shapes come from the cache's manifest, so the model fits the real cached images; a few training-mode
passes give batch norm running statistics that differ from the identity, so eval mode matters in export.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlflow
import mlflow.pyfunc
import numpy as np
import torch

from tests.support.built_once import built_once
from tests.support.shipped import SHIPPED

from thermal2visible.paths import (
    EVAL_METRICS,
    EVAL_REPORT,
    EXPORT_METRICS,
    EXPORT_REPORT,
    GENERATOR,
    MANIFEST,
    PSNR_CSV,
    PSNR_CURVE,
    TRAIN_METRICS,
)
from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.stage_records import write_record
from thermal2visible.onnx_export import cache_to_model_input, export_generator
from thermal2visible.registry.gate import Registered, register
from thermal2visible.registry.packing import pyfunc_arguments
from thermal2visible.models.payloads import load_generator, save_generator
from thermal2visible.models.networks import build_generator
from thermal2visible.tracking.plots import save_psnr_curve
from thermal2visible.tracking.digests import GENERATOR_DIGEST, data_hash, file_digest


def save_tiny_generator(path: Path, cache: Path, seed: int = 0, ngf: int = 8, kind: str = "unet") -> Path:
    manifest = json.loads((cache / MANIFEST).read_text())
    model = {
        "generator": kind,
        "in_channels": manifest["thermal_channels"],
        "out_channels": manifest["visible_channels"],
        "image_size": manifest["image_size"],
        "settings": {"ngf": ngf, "norm": "batch", "dropout": 0.5},
    }
    torch.manual_seed(seed)
    generator = build_generator(model).train()
    with torch.no_grad():
        for batch in np.array_split(cache_to_model_input(np.load(cache / "train_thermal.npy")), 2):
            generator(torch.from_numpy(batch))
    save_generator(
        generator,
        path,
        test_mode="eval",
        preprocess=manifest["preprocess"],
        epoch=0,
        psnr_smoothed=0.0,
        psnr=0.0,
        fingerprint=f"fingerprint-{seed}",
        data_hash=data_hash(cache),
    )
    return path


def export_tiny_generator(folder: Path, cache: Path, seed: int = 0) -> Path:
    """folder/generator.pt and folder/generator.onnx (opset 18) of the tiny generator of `cache` and `seed`, exported
    now; returns the .onnx."""
    generator, payload = load_generator(save_tiny_generator(folder / "generator.pt", cache, seed))
    manifest = json.loads((cache / MANIFEST).read_text())
    export_generator(generator, payload, folder / "generator.onnx", opset=18, thermal_dtype=manifest["thermal_dtype"])
    return folder / "generator.onnx"


def export_tiny(folder: Path, cache: Path, seed: int = 0) -> Path:
    """folder/generator.pt and folder/generator.onnx (opset 18) of a tiny generator, the test's own copies; returns
    the .onnx."""
    folder.mkdir(parents=True, exist_ok=True)
    cache = cache.resolve()
    # made once beside the cache and shared by every test process that uses it: an ONNX export takes seconds
    exported = built_once(cache.parent, f"tiny-export-{seed}", lambda built: export_tiny_generator(built, cache, seed))
    for name in ("generator.pt", "generator.onnx"):
        shutil.copyfile(exported / name, folder / name)
    return folder / "generator.onnx"


def saved_pyfunc(onnx: Path, folder: Path, limits: ServedLimits) -> str:
    """`onnx` saved as the served pyfunc at `folder` with `limits` as its model_config: what make serve loads."""
    with pyfunc_arguments(onnx, limits) as arguments:
        mlflow.pyfunc.save_model(str(folder), **arguments)
    return str(folder)


def write_stage_record(project: Path, models: Path, test_psnr: float, parity_error: float = 0.0) -> None:
    """What train, evaluate and export leave for the register stage around `models`/generator.pt and .onnx: the
    two models in project/models, and metric files and a PSNR curve naming that generator by its sha256."""
    (project / "models").mkdir(exist_ok=True)
    for name in ("generator.pt", "generator.onnx"):
        shutil.copy(models / name, project / "models" / name)
    digest = file_digest(project / GENERATOR)
    fingerprint = load_generator(project / GENERATOR)[1]["fingerprint"]
    (project / "metrics").mkdir(exist_ok=True)
    (project / TRAIN_METRICS).write_text(json.dumps({"fingerprint": fingerprint}))
    (project / PSNR_CSV).write_text("epoch,psnr,psnr_smoothed\n1,10.0,10.0\n")
    save_psnr_curve(project / PSNR_CURVE, [10.0], [10.0], 1, 1, 1)
    write_record(
        {"generator": {"psnr": test_psnr}, GENERATOR_DIGEST: digest}, project / EVAL_METRICS, project / EVAL_REPORT
    )
    exported = {"parity_max_abs_error": parity_error, GENERATOR_DIGEST: digest}
    write_record(exported, project / EXPORT_METRICS, project / EXPORT_REPORT)


def register_tiny(model: Path, **arguments) -> Registered:
    """`register` in a `register` run of the project's experiment (params.yaml's mlflow.experiment), as the register
    stage calls it: on a tracking server, serving trusts only versions whose run lies there (registry.version_files)."""
    mlflow.set_experiment(SHIPPED.mlflow.experiment)
    with mlflow.start_run(run_name="register"):
        return register(model, **arguments)
