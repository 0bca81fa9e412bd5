"""The REST server of `make serve`: MLflow's own scoring server (`mlflow.pyfunc.scoring_server`, what `mlflow models
serve` runs) around the model, behind the HTTP edge that server lacks (inference.edge: content type, body size,
values and nesting counted while reading, read timeouts, bodies in flight, plain error replies), with every request
decoded and translated in a worker process under OS limits (inference.workers), in one uvicorn process that caps its
open connections."""

from __future__ import annotations

import os

import uvicorn
from mlflow.environment_variables import MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT as TIMEOUT
from mlflow.pyfunc import scoring_server
from starlette.types import ASGIApp

from thermal2visible.config.schema import ServeConfig
from thermal2visible.inference.edge import Edge, EdgeLimits
from thermal2visible.inference import serving
from thermal2visible.inference.serving import IMAGE
from thermal2visible.inference.workers import start_forkserver, worker_count


def scoring_app(model_uri: str, serve: ServeConfig) -> ASGIApp:
    """MLflow's scoring app for the model at `model_uri`, behind the `Edge`, its requests run by worker processes.
    The model loads as `mlflow models serve` loads it: SERVING_MODEL_CONFIG (JSON) overrides its model_config."""
    # The workers' wall-clock limit is the scoring server's timeout, as `mlflow models serve` sets it for its workers.
    os.environ.setdefault(TIMEOUT.name, str(TIMEOUT.get()))
    start_forkserver(serving.__name__)
    pyfunc = scoring_server.load_model_with_mlflow_config(model_uri)
    model = pyfunc.unwrap_python_model()  # a serving.ThermalToVisible
    model.use_workers(worker_count(serve.workers), serve.worker_memory_mib)
    limits = EdgeLimits.of(
        serve.max_request_bytes,
        model.limits.max_rows or serve.max_rows,
        serve.body_read_timeout_s,
        serve.body_deadline_s,
        serve.max_bodies_in_flight,
    )
    return Edge(scoring_server.init(pyfunc), limits, frozenset({IMAGE}))


def serve(model_uri: str, serve: ServeConfig) -> None:
    app = scoring_app(model_uri, serve)
    uvicorn.run(app, host=serve.host, port=serve.port, log_level="info", limit_concurrency=serve.max_connections)
