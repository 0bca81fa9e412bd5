"""Serve a registered model over REST on params.yaml's serve.host and serve.port: `mlflow models serve`, no more.

    python pipelines/serve.py [--model models:/thermal2visible@champion]

(`make serve` runs it.) The request limits (serve.max_pixels, serve.max_model_pixels) travel inside the model."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from thermal2visible.config import load_params
from thermal2visible.errors import ConfigError
from thermal2visible.inference.registry import CHAMPION


def main() -> None:
    try:
        params = load_params()
    except ConfigError as error:
        sys.exit(f"error: {error}")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default=f"models:/{params.register.model_name}@{CHAMPION}",
        help="MLflow model URI (default: %(default)s)",
    )
    args = parser.parse_args()
    mlflow = shutil.which("mlflow") or sys.exit("error: no `mlflow` on PATH: activate the project's venv")
    command = [
        mlflow,
        "models",
        "serve",
        "-m",
        args.model,
        "--env-manager",
        "local",
        "-h",
        params.serve.host,
        "-p",
        str(params.serve.port),
    ]
    print(" ".join(command), flush=True)
    os.execv(mlflow, command)


if __name__ == "__main__":
    main()
