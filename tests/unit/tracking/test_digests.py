"""The data version (tracking.digests.data_hash) is DVC's hash of the cache: the value dvc.lock records for it, the
same inside a DVC project (from DVC's state database) and outside one (every file read), and it follows any change."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from thermal2visible.paths import MANIFEST
from thermal2visible.tracking.digests import data_hash

pytestmark = pytest.mark.slow  # dvc init and dvc add: Python processes
DVC = str(Path(sys.executable).with_name("dvc"))


def test_the_data_hash_is_dvcs_recorded_hash_inside_and_outside_a_dvc_project(tmp_path):
    project = tmp_path / "project"
    cache = project / "data" / "cache"
    (cache / "train").mkdir(parents=True)
    (cache / MANIFEST).write_text('{"counts": {"train": 4}}')
    np.save(cache / "train" / "visible.npy", np.arange(4 * 8, dtype=np.uint8).reshape(4, 8))
    env = os.environ | {"DVC_NO_ANALYTICS": "1"}
    for command in (["git", "init", "-q"], [DVC, "init", "-q"], [DVC, "add", "-q", "data/cache"]):
        subprocess.run(command, cwd=project, env=env, check=True)
    (recorded,) = yaml.safe_load((project / "data" / "cache.dvc").read_text())["outs"]

    assert data_hash(cache) == recorded["md5"]  # inside the project: what DVC recorded
    outside = tmp_path / "copy"
    shutil.copytree(cache, outside)
    assert data_hash(outside) == recorded["md5"]  # the same value where no DVC project holds the cache

    rows = np.load(cache / "train" / "visible.npy")
    rows[0, 0] += 1  # one value inside an array, the manifest unchanged
    np.save(cache / "train" / "visible.npy", rows)
    assert data_hash(cache) != recorded["md5"]
