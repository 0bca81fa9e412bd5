"""docs/team.md's server with logins: a real `mlflow server --app-name basic-auth` (SQLite and a local artifact
folder standing in for PostgreSQL and S3), its users made by pipelines/launch/team_users.py. Without a login
nothing answers; a READ user reads and serves the model but can neither move `champion`, nor upload through the
artifact proxy, nor delete a version; the maintainer (MANAGE) registers through the pipeline's register stage and
can do all three. Stopping the server leaves no process behind.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
from test_team_server import project_ready_to_register
from tests.support.servers import free_port, mlflow_app, quiet_env, running
from thermal2visible.inference.serving import IMAGE, png_bytes, to_base64

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
NAME = "thermal2visible-portrait"  # register.model_name auto, for the built-in portrait scene
API = "/api/2.0/mlflow"
MARKER = "T2V_TEAM_AUTH_TEST"


def auth_ini(database: Path) -> str:
    """docs/team.md's settings file as its recipe writes it, its user store at `database` (the admin's first
    password comes from the environment)."""
    recipe = (REPO / "docs" / "team.md").read_text()
    text = re.search(r"cat > ~/mlflow-server/basic_auth.ini <<EOF\n(.*?)\nEOF\n", recipe, re.S).group(1)
    assert "$HOME/mlflow-server/basic_auth.db" in text
    return text.replace("$HOME/mlflow-server/basic_auth.db", str(database)) + "\n"


def processes_marked(marker: str) -> list[int]:
    """Pids of the live processes whose environment holds MARKER=`marker`: the server and all it started."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if f"{MARKER}={marker}".encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
    return found


def as_user(tracking_uri: str, user: str, password: str) -> dict[str, str]:
    return quiet_env(MLFLOW_TRACKING_URI=tracking_uri, MLFLOW_TRACKING_USERNAME=user, MLFLOW_TRACKING_PASSWORD=password)


def run_script(project: Path, env: dict[str, str], script: str, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "pipelines" / script), *args]
    return subprocess.run(command, cwd=project, text=True, capture_output=True, timeout=300, env=env)


def champion(uri: str, admin: tuple[str, str]) -> str:
    answer = requests.get(f"{uri}{API}/registered-models/alias", params={"name": NAME, "alias": "champion"}, auth=admin)
    assert answer.status_code == 200, answer.text
    return answer.json()["model_version"]["version"]


def version_exists(uri: str, version: str, admin: tuple[str, str]) -> bool:
    answer = requests.get(f"{uri}{API}/model-versions/get", params={"name": NAME, "version": version}, auth=admin)
    assert answer.status_code in (200, 404), answer.text
    return answer.status_code == 200


@pytest.mark.timeout(500)
def test_team_server_with_logins(tmp_path, tiny_cache, write_params):
    project = project_ready_to_register(tmp_path / "project", tiny_cache, write_params)
    root, artifacts = tmp_path / "server", tmp_path / "artifacts"
    root.mkdir()
    (root / "basic_auth.ini").write_text(auth_ini(root / "basic_auth.db"))
    admin = ("admin", "admin-" + secrets.token_urlsafe(12))
    marker = secrets.token_hex(8)  # in the environment of the server and of everything it starts
    server_env = {
        "MLFLOW_AUTH_CONFIG_PATH": str(root / "basic_auth.ini"),
        "MLFLOW_AUTH_ADMIN_PASSWORD": admin[1],
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "true",  # as the recipe runs it: with its job runner's workers
        MARKER: marker,
    }
    options = ("--app-name", "basic-auth", "--artifacts-destination", str(artifacts))
    with mlflow_app("server", f"sqlite:///{root / 'mlflow.db'}", root / "server.log", *options, **server_env) as uri:
        # No login, or a wrong password: nothing answers.
        search = f"{uri}{API}/experiments/search"
        assert requests.get(search, params={"max_results": 1}).status_code == 401
        assert requests.get(search, params={"max_results": 1}, auth=("admin", "wrong-password-1")).status_code == 401
        assert requests.put(f"{uri}/api/2.0/mlflow-artifacts/artifacts/0/x.txt", data=b"x").status_code == 401
        assert requests.get(search, params={"max_results": 1}, auth=admin).status_code == 200
        # A checked password is remembered for the minute (auth_cache_ttl_seconds), a wrong one never.
        assert requests.get(search, params={"max_results": 1}, auth=("admin", "wrong-password-1")).status_code == 401

        # The admin's users: a maintainer and a reader, passwords printed once.
        done = run_script(project, as_user(uri, *admin), "launch/team_users.py", "--manage", "ci", "--read", "anna")
        assert done.returncode == 0, done.stderr
        passwords = dict(re.findall(r"created user (\S+), password (\S+)", done.stdout))
        assert set(passwords) == {"ci", "anna"}
        assert f"anna: READ on experiment thermal2visible and registered model {NAME}" in done.stdout
        assert f"ci: MANAGE on experiment thermal2visible and registered model {NAME}" in done.stdout
        maintainer, reader = ("ci", passwords["ci"]), ("anna", passwords["anna"])
        # Run again, it creates no one and gives the levels named (the reader's, checked below, stays READ).
        done = run_script(project, as_user(uri, *admin), "launch/team_users.py", "--read", "anna")
        assert done.returncode == 0 and "created user" not in done.stdout and "anna: READ" in done.stdout, done.stderr

        # The reader cannot register (the stage's first write is refused, in one line naming the grant to ask for,
        # nothing is added) ...
        done = run_script(project, as_user(uri, *reader), "register.py")
        *_, refusal = done.stderr.strip().splitlines()
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert refusal.startswith(f"error: the MLflow server {uri} refused anna /api/2.0/mlflow/runs/create (403)")
        assert refusal.endswith(
            "python pipelines/launch/team_users.py --manage anna --set data.source=data/raw "
            "--set synthesize.scene=portrait (docs/team.md)"
        ), refusal
        assert not version_exists(uri, "1", admin)
        # ... the maintainer can, through the pipeline's register stage.
        done = run_script(project, as_user(uri, *maintainer), "register.py")
        assert done.returncode == 0, done.stderr
        assert f"registered {NAME} version 1 as @champion" in done.stdout

        # A second version of the same files, by the maintainer, for the reader to try to promote and delete.
        first = requests.get(f"{uri}{API}/model-versions/get", params={"name": NAME, "version": "1"}, auth=reader)
        assert first.status_code == 200, first.text
        first = first.json()["model_version"]
        assert {"key": "test_psnr", "value": repr(21.5)} in first["tags"]
        second = {
            "name": NAME,
            "source": first["source"],
            "run_id": first["run_id"],
            "model_id": first["source"].removeprefix("models:/"),
        }
        created = requests.post(f"{uri}{API}/model-versions/create", json=second, auth=maintainer)
        assert created.status_code == 200 and created.json()["model_version"]["version"] == "2", created.text
        run = requests.get(f"{uri}{API}/runs/get", params={"run_id": first["run_id"]}, auth=reader)
        assert run.status_code == 200, run.text
        upload_path = f"{run.json()['run']['info']['experiment_id']}/{first['run_id']}/artifacts/note.txt"
        upload = f"{uri}/api/2.0/mlflow-artifacts/artifacts/{upload_path}"
        promote = {"name": NAME, "alias": "champion", "version": "2"}

        # The reader: each write refused, nothing changed.
        assert requests.post(f"{uri}{API}/registered-models/alias", json=promote, auth=reader).status_code == 403
        assert champion(uri, admin) == "1"
        assert requests.put(upload, data=b"from anna", auth=reader).status_code == 403
        assert not (artifacts / upload_path).exists()
        deletion = {"name": NAME, "version": "2"}
        assert requests.delete(f"{uri}{API}/model-versions/delete", json=deletion, auth=reader).status_code == 403
        assert version_exists(uri, "2", admin)

        # The maintainer: each write done.
        assert requests.post(f"{uri}{API}/registered-models/alias", json=promote, auth=maintainer).status_code == 200
        assert champion(uri, admin) == "2"
        assert requests.put(upload, data=b"from ci", auth=maintainer).status_code == 200
        assert (artifacts / upload_path).read_bytes() == b"from ci"
        back = promote | {"version": "1"}
        assert requests.post(f"{uri}{API}/registered-models/alias", json=back, auth=maintainer).status_code == 200
        assert requests.delete(f"{uri}{API}/model-versions/delete", json=deletion, auth=maintainer).status_code == 200
        assert not version_exists(uri, "2", admin) and champion(uri, admin) == "1"

        # A model the reader was granted nothing on: serving it is refused, naming the READ grant.
        done = run_script(project, as_user(uri, *reader), "serve.py", "--set", "register.model_name=other")
        *_, refusal = done.stderr.strip().splitlines()
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert (
            "--read anna --set data.source=data/raw --set synthesize.scene=portrait --set register.model_name=other"
            in refusal
        )

        # The reader serves the champion (`make serve`): its files come through the server with the reader's login.
        port = free_port()
        serve = [sys.executable, str(REPO / "pipelines" / "serve.py"), "--set", f"serve.port={port}"]
        with running(serve, "/ping", port, project / "serve.log", as_user(uri, *reader)) as served:
            thermal = to_base64(png_bytes(np.random.default_rng(0).integers(0, 255, (24, 32), dtype=np.uint8)))
            body = {"dataframe_split": {"columns": [IMAGE], "data": [[thermal]]}}
            answer = requests.post(f"{served}/invocations", json=body, timeout=60)
            assert answer.status_code == 200, answer.text
            assert base64.b64decode(answer.json()["predictions"][0][IMAGE]).startswith(b"\x89PNG")

        # The server, its web workers and its job runner's workers: one process group, not the test's.
        pids = processes_marked(marker)
        commands = b" ".join(Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids)
        assert b"uvicorn" in commands and b"huey_consumer" in commands, commands
        group = os.getpgid(pids[0])
        assert {os.getpgid(pid) for pid in pids} == {group} != os.getpgid(0)

    # Stopped: nothing of the server's process group, nor anything it started, is left.
    assert processes_marked(marker) == []
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)
