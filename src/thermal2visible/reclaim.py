"""`make reclaim`: the disk space of everything the project can rebuild, given back, each part named with its size
before it goes, and what was freed at the end:

- checkpoints/: every run's resume state, the current one and the parked ones (a training then starts afresh);
- DVC's cache of files that nothing in the workspace uses any more (`dvc gc --workspace --force`): what `dvc repro`
  or `dvc pull` would make or fetch again;
- the artifacts and records of MLflow runs deleted in the UI or with `mlflow runs delete` (`mlflow gc`), in the
  project's own store (MLFLOW_TRACKING_URI, else ./mlflow.db). A tracking server's deleted runs are its
  administrator's to collect.

`python -m thermal2visible.reclaim` from the project folder.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

from thermal2visible.paths import CHECKPOINTS
from thermal2visible.tracking.store import open_store, store_lock, tracking_uri
from thermal2visible.training.parked_runs import megabytes, size_of


def tool(name: str) -> str:
    """The venv's own `dvc` or `mlflow`, beside this interpreter, else the one on PATH."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.is_file() else name


def reclaim_checkpoints(folder: Path = CHECKPOINTS) -> int:
    if not folder.exists():
        return 0
    # Its lock, as a training takes it (training.resume.one_training_at_a_time): none starts while this removes.
    with open(folder / "lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = (lock.read().split() or ["?"])[0]
            print(f"reclaim: {folder}/ is in use by a training (PID {holder}): left as it is")
            return 0
        size, runs = size_of(folder), len(list(folder.glob("**/last.ckpt")))
        print(
            f"reclaim: removing {folder}/ ({megabytes(size)}: the resume state of {runs} run(s), current and parked; "
            "each starts afresh when trained again)"
        )
        # Its entries, not the folder, where checkpoints/ is a link to a shared folder; no link inside is followed.
        for entry in folder.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    if not folder.is_symlink():
        folder.rmdir()
    return size


def reclaim_dvc_cache() -> int:
    if not Path(".dvc").is_dir():
        print("reclaim: no DVC repository here: DVC's cache skipped")
        return 0
    found = subprocess.run([tool("dvc"), "cache", "dir"], capture_output=True, text=True)
    cache = Path(found.stdout.strip()) if found.returncode == 0 and found.stdout.strip() else Path(".dvc/cache")
    before = size_of(cache) if cache.exists() else 0
    print(f"reclaim: DVC's cache {cache} ({megabytes(before)}): removing what the workspace does not use")
    subprocess.run([tool("dvc"), "gc", "--workspace", "--force"], check=True)
    return before - (size_of(cache) if cache.exists() else 0)


def local_path(uri: str) -> Path | None:
    """The folder of a local artifact URI (a plain path or file://), else None."""
    parts = urlsplit(uri)
    return Path(unquote(parts.path)) if parts.scheme in ("", "file") else None


def reclaim_mlflow_runs() -> int:
    from mlflow.entities import ViewType

    uri = tracking_uri()
    if not uri.startswith("sqlite:///"):
        print(f"reclaim: the MLflow store is {urlsplit(uri).scheme}, not this project's own: its deleted runs skipped")
        return 0
    if not Path(uri.removeprefix("sqlite:///").partition("?")[0]).is_file():
        print("reclaim: no MLflow store here: deleted runs skipped")
        return 0
    client = open_store(uri)
    experiments = [experiment.experiment_id for experiment in client.search_experiments(view_type=ViewType.ALL)]
    deleted = [
        run
        for start in range(0, len(experiments), 100)  # MLflow searches at most 100 experiments at a time
        for run in client.search_runs(experiments[start : start + 100], run_view_type=ViewType.DELETED_ONLY)
    ]
    folders = [path for path in (local_path(run.info.artifact_uri) for run in deleted) if path and path.exists()]
    before = sum(size_of(folder) for folder in folders)
    print(f"reclaim: {len(deleted)} deleted MLflow run(s) in {uri} ({megabytes(before)} of artifacts): removing them")
    if not deleted:
        return 0
    with store_lock(uri):  # no stage opens or registers in the store meanwhile
        subprocess.run([tool("mlflow"), "gc", "--backend-store-uri", uri, "--tracking-uri", uri], check=True)
    return before - sum(size_of(folder) for folder in folders if folder.exists())


def main() -> None:
    freed = {
        "checkpoints": reclaim_checkpoints(),
        "DVC cache": reclaim_dvc_cache(),
        "deleted MLflow runs": reclaim_mlflow_runs(),
    }
    parts = ", ".join(f"{name} {megabytes(size)}" for name, size in freed.items())
    print(f"reclaim: freed {megabytes(sum(freed.values()))} ({parts})")


if __name__ == "__main__":
    main()
