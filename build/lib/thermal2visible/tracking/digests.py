"""What identifies a run's inputs and outputs, without loading MLflow: the digest of the data and of a file.

The data version is `data_hash`: the md5 of every file of data/cache (its arrays and its manifest, names and bytes),
so it changes whenever what training reads changes, also where the manifest does not (a preprocessing change inside
the arrays). Unlike the dvc.lock hash it exists outside `dvc repro` too, e.g. for a stage run by hand.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from thermal2visible.paths import MANIFEST


def data_hash(cache_dir: str | Path) -> str:
    """md5 of the cache's files, each by its path inside the cache and its bytes (read in blocks: any size)."""
    root, digest = Path(cache_dir), hashlib.md5()
    if not (root / MANIFEST).is_file():
        raise FileNotFoundError(root / MANIFEST)
    for path in sorted(path for path in root.rglob("*") if path.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        with open(path, "rb") as file:
            digest.update(hashlib.file_digest(file, "md5").digest())
    return digest.hexdigest()


GENERATOR_DIGEST = "generator_sha256"  # on train and evaluate runs, registered versions, eval.json and export.json


def file_digest(path: str | Path) -> str:
    """sha256 of a file: what a run or a registered version is found by (tracking.publish)."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()
