"""Where a measurement (a benchmark's or a study's) writes its files: a new dated name, never a recorded one."""

from __future__ import annotations

import datetime
import itertools
from pathlib import Path


def new_dated_stem(folder: Path, name: str, suffixes: tuple[str, ...]) -> Path:
    """folder/<today>-<name>, or -2, -3, ... after it when a file of that stem with one of `suffixes` exists."""
    today = datetime.date.today().isoformat()
    for number in itertools.count(1):
        stem = folder / (f"{today}-{name}" if number == 1 else f"{today}-{name}-{number}")
        if not any(Path(f"{stem}{suffix}").exists() for suffix in suffixes):
            return stem
    raise AssertionError("itertools.count never ends")
