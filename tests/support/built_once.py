"""A folder that every test process shares and the first that needs it builds."""

import shutil
from pathlib import Path
from typing import Callable

from filelock import FileLock


def built_once(shared: Path, name: str, build: Callable[[Path], None]) -> Path:
    """shared/name, filled by `build(folder)` once and used by every test process: the first that needs it builds it
    while the others wait. What is built so is read, never changed, by the tests."""
    folder, built = shared / name, shared / f"{name}.built"
    with FileLock(shared / f"{name}.lock"):
        if not built.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build a killed process did not finish
            folder.mkdir()
            build(folder)
            built.touch()
    return folder
