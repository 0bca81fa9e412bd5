"""The server of a serving image (`make image`, docker/Dockerfile): `make serve`'s server (inference.rest: MLflow's
scoring server behind the edge, requests run by workers under OS limits) around the model where MLflow's container
layout puts it, with params.yaml's serve section as it was when the image was built, listening on every interface of
the container at MLflow's container port."""

from __future__ import annotations

from pathlib import Path

from pydantic import TypeAdapter

from thermal2visible.config.schema import ServeConfig
from thermal2visible.inference.rest import serve

MODEL_DIR = Path("/opt/ml/model")  # where MLflow's own serving images keep the model
SETTINGS = Path("/opt/thermal2visible/serve.json")  # written by pipelines/image.py, host 0.0.0.0 and PORT
PORT = 8080  # MLflow's container port: `docker run -p 5001:8080 ...`


def main() -> None:
    serve(str(MODEL_DIR), TypeAdapter(ServeConfig).validate_json(SETTINGS.read_bytes()))


if __name__ == "__main__":
    main()
