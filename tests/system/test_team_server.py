"""The team setup of docs/team.md: a throwaway PostgreSQL cluster, a real `mlflow server` on it, and the pipeline's
register stage pointed at the server by MLFLOW_TRACKING_URI; then the same stage straight at PostgreSQL with a
password in the URI, which must appear in no output, param or tag.

Skipped where PostgreSQL's server programs (initdb, pg_ctl) or the psycopg driver are missing. PostgreSQL refuses
to run as root: as root the cluster runs as the `postgres` user (runuser).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import mlflow.artifacts
import pytest
from mlflow import MlflowClient
from thermal2visible.paths import CACHE
from tests.support.servers import free_port, mlflow_app, quiet_env
from thermal2visible.tracking.store import open_store
from tests.support.tiny_model import export_tiny, write_stage_record

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
PASSWORD = "team-s3cret-pw"
NAME = "thermal2visible-portrait"  # register.model_name auto, for the built-in portrait scene
BINARIES = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)  # Debian/Ubuntu keep them off PATH
PG_BIN = Path(BINARIES[0]) if BINARIES else Path(shutil.which("pg_ctl") or "/nonexistent").parent


def postgres_missing() -> str | None:
    if not (PG_BIN / "initdb").exists() or not (PG_BIN / "pg_ctl").exists():
        return "PostgreSQL server programs (initdb, pg_ctl) not installed: apt-get install postgresql"
    try:
        import psycopg  # noqa: F401  (SQLAlchemy's driver for postgresql:// URIs)
    except ImportError:
        return "psycopg (PostgreSQL driver) not installed: pip install 'psycopg[binary]'"
    if os.geteuid() == 0 and not shutil.which("runuser"):
        return "running as root without runuser: PostgreSQL refuses to run as root"
    return None


def as_postgres(*command: str | Path) -> list[str]:
    return (["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []) + [str(part) for part in command]


@pytest.fixture
def postgres():
    """A fresh cluster on 127.0.0.1 and a free port, user `mlflow` with PASSWORD, database `mlflow`; yields the
    port. Its folder is outside pytest's tmp (which the postgres user cannot enter) and removed afterwards."""
    if reason := postgres_missing():
        pytest.skip(reason)
    folder = Path(tempfile.mkdtemp(prefix="t2v-postgres-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    (folder / "password").write_text(PASSWORD)
    port = free_port()
    data, log = folder / "data", folder / "postgres.log"
    try:
        subprocess.run(
            as_postgres(
                PG_BIN / "initdb",
                "-D",
                data,
                "-U",
                "mlflow",
                "--pwfile",
                folder / "password",
                "--auth",
                "scram-sha-256",
                "--no-sync",
            ),
            check=True,
            capture_output=True,
        )
        subprocess.run(
            as_postgres(
                PG_BIN / "pg_ctl", "-D", data, "-l", log, "-w", "start", "-o", f"-h 127.0.0.1 -p {port} -k {folder}"
            ),
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [PG_BIN / "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "mlflow", "mlflow"],
            check=True,
            env=os.environ | {"PGPASSWORD": PASSWORD},
        )
        yield port
    finally:
        subprocess.run(as_postgres(PG_BIN / "pg_ctl", "-D", data, "-m", "immediate", "stop"), capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def project_ready_to_register(root: Path, tiny_cache: Path, write_params) -> Path:
    """What the earlier stages leave for register: the cache (its test frames score the gate),
    models/generator.onnx and the export and evaluate metrics."""
    root.mkdir()
    write_params(root)
    (root / CACHE).parent.mkdir()
    (root / CACHE).symlink_to(tiny_cache)
    write_stage_record(root, export_tiny(root / "exported", tiny_cache).parent, test_psnr=21.5)
    return root


def register_stage(project: Path, tracking_uri: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "pipelines" / "register.py"), *args],
        cwd=project,
        text=True,
        capture_output=True,
        timeout=300,
        env=quiet_env(MLFLOW_TRACKING_URI=tracking_uri),
    )


@pytest.mark.timeout(400)
def test_register_through_a_tracking_server_on_postgresql(postgres, tmp_path, tiny_cache, write_params):
    project = project_ready_to_register(tmp_path / "project", tiny_cache, write_params)
    # docs/team.md's recipe: the password in PGPASSWORD (or ~/.pgpass), not in the URI that `ps` shows everyone.
    database = f"postgresql://mlflow@127.0.0.1:{postgres}/mlflow"
    artifacts = ("--artifacts-destination", str(tmp_path / "artifacts"))
    log = tmp_path / "mlflow-server.log"
    with mlflow_app("server", database, log, *artifacts, PGPASSWORD=PASSWORD) as tracking_uri:
        done = register_stage(project, tracking_uri)
        assert done.returncode == 0, done.stderr
        assert f"registered {NAME} version 1 as @champion" in done.stdout
        client = MlflowClient(tracking_uri)
        version = client.get_model_version_by_alias(NAME, "champion")
        assert int(version.version) == 1 and version.tags["test_psnr"] == repr(21.5)
        # The version's files by their location on the server: MLflow resolves a models:/ URI through the process's
        # global registry URI, whatever tracking_uri is passed, so it would ask an earlier test's store.
        location = client.get_model_version_download_uri(NAME, version.version)
        downloaded = mlflow.artifacts.download_artifacts(
            location, tracking_uri=tracking_uri, dst_path=str(tmp_path / "download")
        )
        assert (Path(downloaded) / "MLmodel").is_file()  # served by the server from its artifact store
        assert list((tmp_path / "artifacts").rglob("generator.onnx"))

    # Straight at the database, password in the URI: it must not leak into outputs or the runs. (Its own
    # experiment: the server's experiments keep artifacts behind the server, which only an http URI reaches.)
    direct = f"postgresql://mlflow:{PASSWORD}@127.0.0.1:{postgres}/mlflow"
    # The server's champion keeps its files behind the server: the gate cannot score it from here against another
    # model, and says so.
    write_stage_record(project, export_tiny(tmp_path / "other", tiny_cache, seed=1).parent, test_psnr=21.5)
    done = register_stage(
        project, direct, "--set", "mlflow.experiment=direct-to-postgres", "--set", f"register.model_name={NAME}"
    )
    assert done.returncode == 1 and "its files cannot be read through MLFLOW_TRACKING_URI" in done.stderr, done.stdout
    assert "Traceback" not in done.stderr and PASSWORD not in done.stdout + done.stderr
    done = register_stage(
        project,
        direct,
        "--set",
        "mlflow.experiment=direct-to-postgres",
        "--set",
        "register.model_name=direct-thermal2visible",
    )
    assert done.returncode == 0, done.stderr
    assert "version 1 as @champion" in done.stdout and PASSWORD not in done.stdout + done.stderr
    client = MlflowClient(direct)
    for run in client.search_runs([e.experiment_id for e in client.search_experiments()]):
        assert PASSWORD not in json.dumps([run.data.params, run.data.tags, run.info.artifact_uri])
    for version in client.search_model_versions("name='direct-thermal2visible'"):
        assert PASSWORD not in json.dumps([version.tags, version.source])


def test_two_registrations_at_once_on_one_local_store_both_land_and_gate_in_turn(tmp_path, tiny_cache, write_params):
    """Two register stages on one SQLite store at the same moment (a `dvc queue start -j 2` sweep): both versions
    land, and the gates run one after the other, so @champion is the better one whichever came first (at once, both
    gated against the same champion and raced for the alias: "UNIQUE constraint failed")."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    open_store(uri)  # the store's tables exist, as the train and evaluate stages leave them
    stages = []
    for seed, psnr in ((1, 21.5), (2, 23.5)):
        project = tmp_path / f"project{seed}"
        project.mkdir()
        write_params(project)
        (project / CACHE).parent.mkdir()
        (project / CACHE).symlink_to(tiny_cache)
        write_stage_record(project, export_tiny(project / "exported", tiny_cache, seed).parent, test_psnr=psnr)
        command = [sys.executable, str(REPO / "pipelines" / "register.py")]
        stages.append(
            subprocess.Popen(
                command,
                cwd=project,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=quiet_env(MLFLOW_TRACKING_URI=uri),
            )
        )
    for stage in stages:
        out, err = stage.communicate(timeout=300)
        assert stage.returncode == 0, err[-2000:]
    client = MlflowClient(uri)
    assert sorted(int(v.version) for v in client.search_model_versions(f"name = '{NAME}'")) == [1, 2]
    assert client.get_model_version_by_alias(NAME, "champion").tags["test_psnr"] == repr(23.5)
