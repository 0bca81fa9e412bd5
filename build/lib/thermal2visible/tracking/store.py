"""The MLflow store: where tracking goes, one writer at a time, the project's experiment. What identifies its
contents (the digests of the data and of a generator) is digests.py.

Tracking goes to `MLFLOW_TRACKING_URI`, else `sqlite:///mlflow.db` in the project folder (`project_root`), with
artifacts in ./mlruns (MLflow's default, fixed when the experiment is made).
"""

from __future__ import annotations

import fcntl
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from thermal2visible.errors import ConfigError

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
EXPERIMENT_KIND, MODEL_DEVELOPMENT = "mlflow.experimentKind", "custom_model_development"


def project_root() -> Path:
    """The folder the project's store belongs to: DVC_ROOT, which `dvc exp run --queue` points at the project rather
    than the temporary copy its stages run in (and `dvc repro` at the project itself), else the working directory."""
    return Path(os.environ.get("DVC_ROOT") or Path.cwd())


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else sqlite:///mlflow.db; a relative SQLite path is the project folder's, made absolute
    so that processes in other folders (a queued experiment's copy, a study's scratch projects) share the store."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    if urlsplit(uri).scheme in ("http", "https") and urlsplit(uri).password:
        # MLflow prints the URI in every "View run ... at: <uri>" line: terminals, DVC and CI logs.
        raise ConfigError(
            "MLFLOW_TRACKING_URI: holds a password, which MLflow would print; put the user and "
            "password in MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD instead"
        )
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not Path(uri[len(prefix) :]).is_absolute():
        return prefix + str(project_root() / uri[len(prefix) :])
    return uri


_HELD: set[str] = set()  # the store locks this process holds (flock would make a second open of one wait forever)


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Held while a process opens a local SQLite store, or registers a version in it: one process at a time.

    MLflow builds a new store's tables on first use, and processes doing that at once break each other
    ("duplicate column name: step", "table _alembic_tmp_metrics already exists"): torchrun nodes, or two runs
    started together on a fresh mlflow.db. Two registrations at once (a `dvc queue start -j 2` sweep) would gate
    against the same champion and race for its alias (MLflow sets an alias by looking it up, then inserting it:
    "UNIQUE constraint failed: registered_model_aliases"). A tracking server or PostgreSQL needs no lock to open,
    and takes registrations as they come.
    """
    path = uri.removeprefix("sqlite:///").partition("?")[0] + ".lock"
    if not uri.startswith("sqlite:///") or path in _HELD:  # a holder opening the store again never waits on itself
        yield
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        _HELD.add(path)
        try:
            yield
        finally:
            _HELD.discard(path)


def open_store(uri: str) -> MlflowClient:
    """A client of `uri`; a new SQLite store gets its tables here, under `store_lock`."""
    with store_lock(uri):
        return MlflowClient(uri)


def ensure_experiment(client: MlflowClient, name: str) -> None:
    """Create experiment `name` unless it exists; another run creating it at the same moment is no error.

    It is marked as model development, so MLflow's UI shows it as a training experiment, not a GenAI one. MLflow puts
    a new experiment's artifacts in ./mlruns/<id> of the working directory; a stage of a queued DVC experiment runs
    in a temporary copy of the project, so there they go to the project's mlruns/<name> instead.
    """
    if client.get_experiment_by_name(name) is None:
        elsewhere = Path.cwd().resolve() != project_root().resolve()
        location = (project_root() / "mlruns" / re.sub(r"[^\w.-]", "_", name)).resolve().as_uri() if elsewhere else None
        try:
            client.create_experiment(name, location, tags={EXPERIMENT_KIND: MODEL_DEVELOPMENT})
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
