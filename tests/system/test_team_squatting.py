"""Squatting on docs/team.md's server: a READ user creates a registered model name nobody created yet (MLflow makes
her its MANAGE) and makes a version of her own run its champion; anyone may give a version files outside the store.
`make serve`, translate.py and the register stage refuse such versions in one line naming the model, the version and
the rule (registry.version_files); team_users.py lists them for the admin; a version the pipeline made on the
model the admin took over is trusted (test_team_auth.py serves one end to end). The server as in test_team_auth.py.
"""

from __future__ import annotations

import re
import secrets

import numpy as np
import pytest
from mlflow import MlflowClient
from mlflow.server import get_app_client
from PIL import Image
from test_team_auth import as_user, auth_ini, run_script
from test_team_server import project_ready_to_register
from tests.support.servers import mlflow_app
from thermal2visible.registry.version_files import trusted_model_uri

pytestmark = pytest.mark.slow
SQUATTED = "thermal2visible-flir"  # a dataset's model name the admin has not made yet
ELSEWHERE = "s3://someone-else/model"
RUN_RULE = "refused by the rule 'its run lies in the project's experiment'"
FILES_RULE = "refused by the rule 'its files lie under the project experiment's artifact location'"


def last_line(done) -> str:
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


def login(monkeypatch, user: str, password: str) -> MlflowClient:
    """An in-process client logged in as `user` (MLflow reads the login from the environment on each request)."""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    return MlflowClient()


@pytest.mark.timeout(300)
def test_squatted_versions_are_refused_by_rule(tmp_path, tiny_cache, write_params, monkeypatch):
    project = project_ready_to_register(tmp_path / "project", tiny_cache, write_params)
    root = tmp_path / "server"
    root.mkdir()
    (root / "basic_auth.ini").write_text(auth_ini(root / "basic_auth.db"))
    admin = ("admin", "admin-" + secrets.token_urlsafe(12))
    server_env = {
        "MLFLOW_AUTH_CONFIG_PATH": str(root / "basic_auth.ini"),
        "MLFLOW_AUTH_ADMIN_PASSWORD": admin[1],
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32),
    }
    options = ("--app-name", "basic-auth", "--artifacts-destination", str(tmp_path / "artifacts"))
    with mlflow_app("server", f"sqlite:///{root / 'mlflow.db'}", root / "server.log", *options, **server_env) as uri:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        reader = ("anna", secrets.token_urlsafe(18))
        login(monkeypatch, *admin)
        get_app_client("basic-auth", tracking_uri=uri).create_user(*reader)

        # The reader squats: a model name nobody made, a version of a run in her own experiment, @champion.
        anna = login(monkeypatch, *reader)
        anna.create_registered_model(SQUATTED)
        own_run = anna.create_run(anna.create_experiment("anna")).info.run_id
        squat = anna.create_model_version(SQUATTED, ELSEWHERE, run_id=own_run)
        anna.set_registered_model_alias(SQUATTED, "champion", squat.version)

        # The admin's script makes the project's experiment, lists the squatted version, lowers the reader to READ.
        model = ("--set", f"register.model_name={SQUATTED}")
        users = ("launch/team_users.py", "--manage", "ci", "--read", "anna", *model)
        done = run_script(project, as_user(uri, *admin), *users)
        assert done.returncode == 0, done.stderr
        assert f"untrusted: registered model {SQUATTED} version 1 {RUN_RULE}" in done.stdout, done.stdout
        maintainer = ("ci", re.search(r"created user ci, password (\S+)", done.stdout)[1])

        # The maintainer's register adds a version, and its gate refuses to score the squatted champion.
        refusal = last_line(run_script(project, as_user(uri, *maintainer), "register.py", *model))
        assert f"models:/{SQUATTED}/1 (registered model {SQUATTED} version 1): {RUN_RULE}" in refusal, refusal
        made = login(monkeypatch, *maintainer).get_model_version(SQUATTED, "2")

        # MLflow accepts a version of the project's run whose files are elsewhere; `make serve` does not.
        elsewhere = login(monkeypatch, *maintainer).create_model_version(SQUATTED, ELSEWHERE, run_id=made.run_id)
        done = run_script(
            project, as_user(uri, *reader), "serve.py", "--model", f"models:/{SQUATTED}/{elsewhere.version}"
        )
        refusal = last_line(done)
        assert f"(registered model {SQUATTED} version {elsewhere.version}): {FILES_RULE}" in refusal, refusal

        # translate.py: the squatted champion refused; the version the pipeline registered is trusted.
        images = tmp_path / "thermal"
        images.mkdir()
        Image.fromarray(np.zeros((24, 32), np.uint8)).save(images / "a.png")  # refused before it is read
        translate = ("translate.py", "--input", str(images), "--output", str(tmp_path / "visible"), "--model")
        refusal = last_line(run_script(project, as_user(uri, *reader), *translate, f"models:/{SQUATTED}@champion"))
        assert f"models:/{SQUATTED}@champion (registered model {SQUATTED} version 1): {RUN_RULE}" in refusal, refusal
        login(monkeypatch, *reader)
        made_uri = f"models:/{SQUATTED}/{made.version}"
        assert trusted_model_uri(made_uri, "thermal2visible") == made_uri
