"""Serve a registered model over REST on params.yaml's serve.host and serve.port: `mlflow models serve`, no more.

    python pipelines/serve.py [--model models:/thermal2visible-portrait@champion] [--set serve.port=5002]

(`make serve [PORT=5002] [MODEL=...]` runs it.) The default model is the champion of the registered model that
params.yaml's data go to (inference.registry.registered_model_name). The request limits (serve.max_pixels,
serve.max_model_pixels) travel inside the model."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from thermal2visible.cli import run_stage
from thermal2visible.config import Params
from thermal2visible.inference.registry import CHAMPION, registered_model_name


def main(params: Params, args: argparse.Namespace) -> None:
    model = args.model or f"models:/{registered_model_name(params)}@{CHAMPION}"
    mlflow = shutil.which("mlflow") or sys.exit("error: no `mlflow` on PATH: activate the project's venv")
    command = [mlflow, "models", "serve", "-m", model, "--env-manager", "local"]
    command += ["-h", params.serve.host, "-p", str(params.serve.port)]
    print(" ".join(command), flush=True)
    os.execv(mlflow, command)


if __name__ == "__main__":
    run_stage(
        main,
        description=__doc__.splitlines()[0],
        arguments=lambda parser: parser.add_argument(
            "--model", help="MLflow model URI (default: the champion of the data's registered model)"
        ),
    )
