"""A tiny untrained generator in the `train` stage's models/generator.pt format, and its ONNX export.

Shapes come from the cache's manifest, so the model fits the real cached images; a few training-mode
passes give batch norm running statistics that differ from the identity, so eval mode matters in export.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from thermal2visible.paths import MANIFEST
from thermal2visible.inference.export import cache_to_model_input, export_generator
from thermal2visible.models.payloads import load_generator, save_generator
from thermal2visible.models.networks import build_generator
from thermal2visible.tracking.store import data_hash


def save_tiny_generator(path: Path, cache: Path, seed: int = 0, ngf: int = 8, kind: str = "unet") -> Path:
    manifest = json.loads((cache / MANIFEST).read_text())
    model = {
        "generator": kind,
        "in_channels": manifest["thermal_channels"],
        "out_channels": manifest["visible_channels"],
        "image_size": manifest["image_size"],
        "ngf": ngf,
        "norm": "batch",
        "dropout": 0.5,
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


def export_tiny(folder: Path, cache: Path, seed: int = 0) -> Path:
    """folder/generator.pt and folder/generator.onnx (opset 18) of a tiny generator; returns the .onnx."""
    generator, payload = load_generator(save_tiny_generator(folder / "generator.pt", cache, seed))
    manifest = json.loads((cache / MANIFEST).read_text())
    export_generator(generator, payload, folder / "generator.onnx", opset=18, thermal_dtype=manifest["thermal_dtype"])
    return folder / "generator.onnx"
