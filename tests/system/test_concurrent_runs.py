"""Several writers on one MLflow store at the same time lose nothing: two real training runs starting together on
a fresh SQLite store, and eight processes logging at once, to SQLite directly and through a real `mlflow server`.

The limit, measured on this 2-core machine (too slow for CI): MLflow gives each SQLite session a 20 s busy
timeout, so 64 processes x 50 `log_metric` and 32 processes x 50 `log_batch` of 100 metrics pass without an error;
48-64 processes each writing 1000-metric batches make some writers wait longer, and they fail with "database is
locked" (the client raises; those metrics are lost). An `mlflow server` in front of SQLite does worse at that
extreme (its SQLAlchemy pool of 5 + 10 connections runs dry: "QueuePool limit ... reached", answered 400, which
the client does not retry); PostgreSQL takes 48 x 10 x 1000 metrics without an error. SQLite is for one person,
a tracking server on PostgreSQL for a team or a cluster (docs/team.md).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric
from tests.support.servers import mlflow_server

from thermal2visible.tracking.store import ensure_experiment, open_store, store_lock

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
WRITERS, SINGLE, BATCHES, BATCH = 8, 50, 5, 20


def logger_process(uri: str, start_at: float, results) -> None:
    """One writer: its own run, SINGLE `log_metric` then BATCHES `log_batch` of BATCH metrics, from `start_at`."""
    errors = []
    try:
        client = open_store(uri)  # a fresh SQLite store: one process at a time creates its tables
        ensure_experiment(client, "writers")
        run_id = client.create_run(client.get_experiment_by_name("writers").experiment_id).info.run_id
        time.sleep(max(0.0, start_at - time.time()))
        for step in range(SINGLE):
            client.log_metric(run_id, "loss", float(step), step=step)
        for step in range(BATCHES):
            stamp = int(time.time() * 1000)
            client.log_batch(run_id, metrics=[Metric(f"k{i}", float(step), stamp, step) for i in range(BATCH)])
    except Exception as error:  # reported to the test, which fails naming it
        errors.append(f"{type(error).__name__}: {str(error)[:300]}")
        run_id = None
    results.put((run_id, errors))


def hammer(uri: str) -> list[str]:
    """WRITERS processes (forked before this process touches `uri`) start logging at the same instant; returns
    their run ids after checking every one finished without an error."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    start_at = time.time() + 5  # after every child has made its run
    processes = [context.Process(target=logger_process, args=(uri, start_at, results)) for _ in range(WRITERS)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=240) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    errors = [error for _, errors in outcomes for error in errors]
    assert not errors, errors
    return [run_id for run_id, _ in outcomes]


def logged_counts(uri: str, run_ids: list[str]) -> dict[str, list[int]]:
    client = MlflowClient(uri)
    return {
        run_id: [len(client.get_metric_history(run_id, key)) for key in ("loss", "k0", f"k{BATCH - 1}")]
        for run_id in run_ids
    }


@pytest.mark.timeout(400)
@pytest.mark.parametrize("store", ["sqlite", "mlflow server"])
def test_concurrent_loggers_lose_no_metric(tmp_path, store):
    if store == "sqlite":
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        counts = logged_counts(uri, hammer(uri))
    else:
        with mlflow_server(tmp_path / "server") as uri:
            counts = logged_counts(uri, hammer(uri))
    assert len(counts) == WRITERS
    assert all(count == [SINGLE, BATCHES, BATCHES] for count in counts.values()), counts


@pytest.mark.timeout(400)
def test_two_training_runs_start_together_on_a_fresh_sqlite_store(tmp_path, tiny_cache, write_params):
    """Both open a store that does not exist yet and log every epoch into it. (The two seldom reach MLflow's table
    creation in the same second, so this is not what proves tracking.store_lock: the writers above, forked
    together, break a fresh store without it — "duplicate column name: step" — and so do torchrun nodes.)"""
    uri = f"sqlite:///{tmp_path / 'shared' / 'mlflow.db'}"
    (tmp_path / "shared").mkdir()
    trainings = []
    for name in ("a", "b"):
        project = tmp_path / name
        (project / "data").mkdir(parents=True)
        (project / "data" / "cache").symlink_to(tiny_cache)
        write_params(project, "train.max_epochs=3", "early_stop.window=1", f"train.seed={ord(name)}")
        trainings.append(
            subprocess.Popen(
                [sys.executable, str(REPO / "pipelines" / "train.py")],
                cwd=project,
                env=os.environ | {"MLFLOW_TRACKING_URI": uri},
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    for training in trainings:
        out = training.communicate(timeout=300)[0]
        assert training.returncode == 0, out

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("thermal2visible").experiment_id])
    assert len(runs) == 2 and {run.info.status for run in runs} == {"FINISHED"}
    for run in runs:
        assert len(run.data.metrics) >= 8
        for key in run.data.metrics:
            assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == [1, 2, 3], key


@pytest.mark.timeout(60)
def test_the_holder_of_the_store_lock_opens_the_store_without_waiting_on_itself(tmp_path):
    """The register stage registers under the lock and starts its run (which opens the store) inside it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with store_lock(uri):
        ensure_experiment(open_store(uri), "inside")
    assert open_store(uri).get_experiment_by_name("inside") is not None
