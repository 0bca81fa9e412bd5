"""Serve a registered model over REST on params.yaml's serve.host and serve.port: MLflow's scoring server, guarded.

    python pipelines/serve.py [--model models:/thermal2visible-portrait@champion] [--set serve.port=5002]

(`make serve [PORT=5002] [MODEL=...]` runs it.) The default model is the champion of the registered model that
params.yaml's data go to (registry.gate.registered_model_name); the first lines say which version that is and where
it came from (its run, data, settings, test PSNR, commit: registry.descriptions.served_from). The server is the one
`mlflow models serve` runs, in this environment, behind an edge that bounds what it reads (inference.edge) and with
each request run by a worker process under OS limits (inference.workers): serve.workers, worker_memory_mib,
max_request_bytes, body_read_timeout_s, body_deadline_s, max_bodies_in_flight and max_connections are this server's;
the request budget travels inside the model (inference.request_budget.ServedLimits). MLflow's
MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT (seconds, default 60) sets the request timeout, which the workers' wall clock
follows."""

from __future__ import annotations

import argparse

from mlflow import MlflowClient

from thermal2visible.cli import run_stage
from thermal2visible.config.schema import Params
from thermal2visible.registry.descriptions import served_from
from thermal2visible.registry.version_files import trusted_model_uri
from thermal2visible.registry.gate import CHAMPION, registered_model_name
from thermal2visible.inference.rest import serve


def main(params: Params, args: argparse.Namespace) -> None:
    model = args.model or f"models:/{registered_model_name(params)}@{CHAMPION}"
    # MLflow's loader runs the version's own code: on a team server only a version of the project's experiment
    pinned = trusted_model_uri(model, params.mlflow.experiment)
    origin = served_from(MlflowClient(), pinned)  # an alias names another version after each promotion
    print(f"serving {pinned} on http://{params.serve.host}:{params.serve.port}/invocations", flush=True)
    print("".join(f"  {line}\n" for line in origin), end="", flush=True)
    serve(pinned, params.serve)


if __name__ == "__main__":
    run_stage(
        main,
        description=__doc__.splitlines()[0],
        arguments=lambda parser: parser.add_argument(
            "--model", help="MLflow model URI (default: the champion of the data's registered model)"
        ),
        grant="READ",  # serving only reads the registry
    )
