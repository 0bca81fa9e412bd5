"""The shipped settings (params.yaml as committed) with changes: how a test gets a section without restating its
values, whatever experiment the working params.yaml holds.

`dvc exp run -S` and `mlflow run -P set=...` write their settings into the working params.yaml; the tests read the
committed one (git's HEAD) instead, so an experiment in progress changes no test's outcome. Where HEAD's file no
longer fits the schema (a key being added, not yet committed), the working file is the shipped one.
"""

import dataclasses
import subprocess
import tempfile
from pathlib import Path

from thermal2visible.config.load import load_params
from thermal2visible.errors import ConfigError
from thermal2visible.paths import PARAMS

REPO = Path(__file__).resolve().parents[2]


def _shipped_text() -> str:
    working = (REPO / PARAMS).read_text()
    committed = subprocess.run(["git", "show", f"HEAD:{PARAMS}"], cwd=REPO, capture_output=True, text=True)
    if committed.returncode != 0:
        return working
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / PARAMS).write_text(committed.stdout)
        try:
            load_params(Path(folder) / PARAMS)
        except ConfigError:
            return working
    return committed.stdout


SHIPPED_TEXT = _shipped_text()
SHIPPED_FROM = Path(tempfile.mkdtemp(prefix="shipped-")) / PARAMS  # for subprocesses that take --params
SHIPPED_FROM.write_text(SHIPPED_TEXT)
SHIPPED = load_params(SHIPPED_FROM)


def shipped(section: str, **changes):
    """params.yaml's `section`, with `changes` (validated by the schema as a params.yaml value would be)."""
    return dataclasses.replace(getattr(SHIPPED, section), **changes)
