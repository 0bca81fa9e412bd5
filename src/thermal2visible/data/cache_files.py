"""The cache's files as training reads them: the splits, the arrays' names and the manifest. Apart from the code that
writes the cache (data.cache), so what training runs holds none of preprocessing's code or libraries."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from thermal2visible.errors import PipelineError
from thermal2visible.paths import MANIFEST

SPLITS = ("train", "val", "test")  # the cache's splits, and the folders of the side_by_side layout
JITTER = "jitter"  # the training split at the jitter side: jitter_{thermal,visible,identity}.npy


def array_file(cache_dir: str | Path, split: str, kind: str) -> Path:
    """The cached array of one split (or JITTER) and kind: thermal, visible or identity."""
    return Path(cache_dir) / f"{split}_{kind}.npy"


def load_manifest(cache_dir: str | Path) -> dict:
    path = Path(cache_dir) / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError(f"{path}: no cache here; run the preprocess stage first (dvc repro preprocess)") from None


def load_split(cache_dir: str | Path, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(thermal, visible, identity) arrays of one split (or of JITTER), memory-mapped read-only."""
    return tuple(
        np.load(array_file(cache_dir, split, kind), mmap_mode="r") for kind in ("thermal", "visible", "identity")
    )
