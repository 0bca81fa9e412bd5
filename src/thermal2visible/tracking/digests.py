"""What identifies a run's inputs and outputs, without loading MLflow: the digest of the data and of a file.

The data version is `data_hash`: DVC's hash of data/cache (the `md5: ….dir` dvc.lock records for the preprocess
stage's output), so a run's `data_hash` tag is the dvc.lock entry of the data it read. It changes whenever any file of
the cache does, also where the manifest does not (a preprocessing change inside the arrays), and it exists outside
`dvc repro` too, e.g. for a stage run by hand.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from thermal2visible.paths import MANIFEST


def data_hash(cache_dir: str | Path) -> str:
    """DVC's md5 of the cache folder. In a DVC project it goes through DVC's state database, which hashes again only
    the files whose size, modification time or inode changed: after preprocess (or any DVC command) has hashed the
    cache, a stage pays a stat per file, not a read of every byte. Outside a DVC project every file is read."""
    # here, not at the top: DVC loads in a second, and the serving workers import this module for file_digest
    from dvc.exceptions import NotDvcRepoError
    from dvc.fs import LocalFileSystem
    from dvc.repo import Repo
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db.local import LocalHashFileDB

    root = Path(cache_dir).resolve()
    if not (root / MANIFEST).is_file():
        raise FileNotFoundError(root / MANIFEST)
    try:
        repo = Repo(Repo.find_root(str(root)))
    except NotDvcRepoError:
        fs = LocalFileSystem()
        return build(LocalHashFileDB(fs, str(root / "no-cache")), str(root), fs, "md5", dry_run=True)[2].hash_info.value
    with repo:
        database = repo.cache.local  # its state database; with dry_run nothing is copied into the cache
        return build(database, str(root), database.fs, "md5", dry_run=True, ignore=repo.dvcignore)[2].hash_info.value


GENERATOR_DIGEST = "generator_sha256"  # on train and evaluate runs, registered versions, eval.json and export.json


def file_digest(path: str | Path) -> str:
    """sha256 of a file: what a run or a registered version is found by (tracking.publish)."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()
