"""Give the users of a team server (`mlflow server --app-name basic-auth`, docs/team.md) their rights on this
project's experiment and the data's registered model. Run as the server's admin, from the project folder:

    export MLFLOW_TRACKING_URI=http://10.0.0.5:5000 MLFLOW_TRACKING_USERNAME=admin MLFLOW_TRACKING_PASSWORD=...
    python pipelines/launch/team_users.py --manage ci --read anna --read ben [--set data.source=data/flir]

The experiment (params.yaml's mlflow.experiment) and the registered model (register.model_name; `auto`: the one of
data.source) are created when missing. Each --read user gets READ on both: runs, versions and their files, so
loading and serving a version. Each --manage user gets MANAGE: logging runs, registering versions, moving aliases,
deleting. A user the server does not know yet is created with a random password, printed here once; a user it
knows keeps their password and gets the level named here.

Run it for each dataset (--set data.source=...) before anyone registers one: MLflow lets any user create a
registered model name nobody created yet and makes them its MANAGE. A model that existed already may hold such a
user's versions: each version the trust rule refuses (registry.version_files, which `make serve`, translate.py and
register apply) is listed, for the admin to delete.
"""

from __future__ import annotations

import argparse
import secrets
import warnings

import mlflow.server
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from thermal2visible.cli import run_stage
from thermal2visible.config.schema import Params
from thermal2visible.errors import ConfigError
from thermal2visible.registry.version_files import version_refusal
from thermal2visible.registry.gate import ensure_registered_model, registered_model_name
from thermal2visible.tracking.store import ensure_experiment, tracking_uri


def grant(auth, user: str, resource_type: str, resource: str, permission: str) -> None:
    """`permission` for `user` on the resource, replacing the level they held there."""
    try:
        auth.grant_user_permission(user, resource_type, resource, permission)
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        auth.revoke_user_permission(user, resource_type, resource)
        auth.grant_user_permission(user, resource_type, resource, permission)


def main(params: Params, args: argparse.Namespace) -> None:
    uri = tracking_uri()
    if not uri.startswith(("http://", "https://")):
        raise ConfigError(f"MLFLOW_TRACKING_URI: {uri} is no tracking server; users live on `mlflow server`")
    # The auth client imports MLflow's FastAPI app, which mounts Flask through starlette.middleware.wsgi, and
    # Starlette warns on that import (a StarletteDeprecationWarning, a UserWarning, so always printed): MLflow's to
    # change, nothing the admin running this script can act on.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"starlette\.middleware\.wsgi is deprecated")
        auth = mlflow.server.get_app_client("basic-auth", tracking_uri=uri)
    client = MlflowClient(uri)
    ensure_experiment(client, params.mlflow.experiment)
    experiment = client.get_experiment_by_name(params.mlflow.experiment).experiment_id
    model = registered_model_name(params)
    ensure_registered_model(client, model)
    for version in client.search_model_versions(f"name = '{model}'"):
        refusal = version_refusal(client, version, params.mlflow.experiment)
        if refusal is not None:
            print(f"untrusted: registered model {model} version {version.version} {refusal}; delete it")
    for permission, users in (("READ", args.read), ("MANAGE", args.manage)):
        for user in users:
            try:
                auth.get_user(user)
            except MlflowException as error:
                if error.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                password = secrets.token_urlsafe(18)
                auth.create_user(user, password)
                print(f"created user {user}, password {password}")
            grant(auth, user, "experiment", experiment, permission)
            grant(auth, user, "registered_model", model, permission)
            print(f"{user}: {permission} on experiment {params.mlflow.experiment} and registered model {model}")


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--read", action="append", default=[], metavar="USER", help="a user who reads (repeatable)")
    parser.add_argument("--manage", action="append", default=[], metavar="USER", help="a maintainer (repeatable)")


if __name__ == "__main__":
    run_stage(main, description=__doc__.splitlines()[0], arguments=arguments)
