"""The resume state of other runs that `checkpoints/` keeps (training.resume parks it there, one folder per
fingerprint): the `train.keep_parked_runs` most recently used, so the folder stays within that many runs plus the
current one."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from thermal2visible.training.fingerprint import FINGERPRINT
from thermal2visible.training.resume import UNREADABLE


def prune_parked(directory: Path, running: str, keep: int) -> list[str]:
    """Delete the parked runs of `directory` beyond the `keep` most recently parked or used, saying so in one line;
    the names of the folders deleted. A parked run is a real folder named as `find_resume` names them (a
    fingerprint, or `unreadable`) that holds something; the running fingerprint's own folder, a symbolic link and
    anything else named otherwise are never touched, so nothing outside `directory` is ever followed or deleted."""
    parked = [
        folder
        for folder in (directory.iterdir() if directory.is_dir() else ())
        if (FINGERPRINT.fullmatch(folder.name) or folder.name == UNREADABLE)
        and folder.name != running
        and not folder.is_symlink()
        and folder.is_dir()
        and any(folder.iterdir())
    ]
    # a folder's time changes when a run is parked into it or taken back out; its files' when they were written
    parked.sort(key=lambda folder: max(path.lstat().st_mtime for path in (folder, *folder.iterdir())), reverse=True)
    removed = parked[keep:]
    if not removed:
        return []
    freed = sum(size_of(folder) for folder in removed)
    for folder in removed:
        shutil.rmtree(folder)
    names = ", ".join(folder.name for folder in removed)
    print(
        f"notice: {directory}: removed {len(removed)} parked run(s) (fingerprints {names}; {megabytes(freed)}) "
        f"beyond train.keep_parked_runs {keep}"
    )
    return [folder.name for folder in removed]


def size_of(path: Path) -> int:
    """Bytes of the file `path`, or of the files under the folder `path`: symbolic links counted as themselves,
    never followed."""
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum((Path(root) / name).lstat().st_size for root, _, names in os.walk(path) for name in names)


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"
