"""The REST server of `make serve`: MLflow's own scoring code (`mlflow.pyfunc.scoring_server`, what `mlflow models
serve` runs) around the model, with everything it does to a request, from parsing the JSON to encoding the reply, in
worker processes under OS limits (inference.workers). The server process only moves bytes: granian (a Rust HTTP
server) holds the connections, closing any that sends no request head within serve.head_timeout_s, and the edge
(inference.edge) bounds what a body may be before it goes to a worker."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import resource
import signal
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator

from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings
from granian.server.embed import Server
from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR as PROGRESS_BAR
from mlflow.environment_variables import MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT as TIMEOUT
from mlflow.exceptions import MlflowException
import mlflow.artifacts
import mlflow.pyfunc
from mlflow.pyfunc import scoring_server
from mlflow.version import VERSION
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from thermal2visible.config.schema import ServeConfig
from thermal2visible.inference.edge import Edge, EdgeLimits, json_body, plain_error
from thermal2visible.inference.serving import IMAGE
from thermal2visible.inference.workers import Loaded, OverLimit, Workers, start_forkserver, worker_count

JSON = "application/json"


@contextmanager
def no_download_bars() -> Iterator[None]:
    """MLflow draws a progress bar for every artifact it downloads, a block of lines for every model it reads: none
    while the server loads its model, unless the environment asks for them."""
    if PROGRESS_BAR.name in os.environ:
        yield
        return
    os.environ[PROGRESS_BAR.name] = "false"
    try:
        yield
    finally:
        os.environ.pop(PROGRESS_BAR.name, None)


def invocations_in_worker(model_uri: str) -> Loaded:
    """Run inside a worker (`workers.Setup`): the model loaded as `mlflow models serve` loads it
    (SERVING_MODEL_CONFIG, JSON, overrides its model_config; loading runs the version's packed code, here under the
    worker's limits), with one onnxruntime thread (the kernel shares the cores between the workers), and the handler
    of one request: MLflow's own `invocations`, its error replies cut by `plain_error`."""
    os.environ["OMP_NUM_THREADS"] = "1"
    override = os.environ.get(scoring_server.SERVING_MODEL_CONFIG)
    # MLflow's check of the version's pinned requirements against this environment walks every installed package
    # (seconds of CPU): a worker replaced after a refusal would spend them again. The server's own environment is
    # the project's, which `make image` installs from the model's requirements.
    with no_download_bars():
        pyfunc = mlflow.pyfunc.load_model(
            model_uri, suppress_warnings=True, **({"model_config": json.loads(override)} if override else {})
        )
    schema = pyfunc.metadata.get_input_schema()
    limits = pyfunc.unwrap_python_model().limits  # a serving.ThermalToVisible's ServedLimits

    def handle(content_type: object, body: bytes) -> tuple[object, bytes]:
        try:
            result = scoring_server.invocations(body, str(content_type), pyfunc, schema)
            status, media_type, reply = result.status, result.mimetype, result.response.encode()
        except MlflowException as error:
            if isinstance(error.__context__, MemoryError):  # MLflow wraps whatever predict raised: the worker's limit
                raise MemoryError from None
            status, media_type, reply = error.get_http_status_code(), JSON, error.serialize_as_json().encode()
        if status >= 400:
            media_type, reply = JSON, json_body(plain_error(reply, body, frozenset({IMAGE})))
        return (status, media_type), reply

    return Loaded(handle, limits.max_request_cpu_seconds, {"max_rows": limits.max_rows})


def refusal(status: int, code: str, message: str) -> tuple[int, str, bytes]:
    return status, JSON, json_body({"error_code": code, "message": message})


class Invocations:
    """A request's body answered by a worker, waited for on a thread of its own (one per body in flight, so none
    waits for a thread); a limit that stopped it is a 4xx or 5xx naming the limit."""

    def __init__(self, workers: Workers, bodies: int):
        self.workers = workers
        self.threads = ThreadPoolExecutor(bodies, thread_name_prefix="invocation")

    def answer(self, content_type: str, body: bytearray, deadline: float) -> tuple[int, str, bytes]:
        try:
            (status, media_type), reply = self.workers.run(content_type, body, deadline, TIMEOUT.name)
        except OverLimit as over:
            if over.busy:
                return refusal(503, "TEMPORARILY_UNAVAILABLE", str(over))
            if over.limit == TIMEOUT.name:
                return refusal(504, "TEMPORARILY_UNAVAILABLE", str(over))
            return refusal(400, "INVALID_PARAMETER_VALUE", str(over))
        except RuntimeError as error:  # a bug in the worker's code: its traceback is in the server log
            return refusal(500, "INTERNAL_ERROR", str(error))
        return status, media_type, reply

    async def __call__(self, content_type: str, body: bytearray) -> tuple[int, str, bytes]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TIMEOUT.get()  # the loop's clock is time.monotonic
        return await loop.run_in_executor(self.threads, self.answer, content_type, body, deadline)


def routes_without_body() -> Starlette:
    """/ping and /health (200 once every worker has loaded the model, as MLflow's scoring server answers them),
    /version (MLflow's)."""

    async def ping(_request) -> Response:
        return Response("\n", media_type=JSON)

    async def version(_request) -> Response:
        return Response(VERSION, media_type=JSON)

    return Starlette(routes=[Route("/ping", ping), Route("/health", ping), Route("/version", version)])


def model_files(model_uri: str, files: str) -> str:
    """The model's files, copied under `files` once for all the workers."""
    with no_download_bars():
        return mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=files)


def scoring_app(model_uri: str, serve: ServeConfig, files: str) -> tuple[ASGIApp, Workers]:
    """The server's app for the model at `model_uri` and its workers (started, each with the model loaded from the
    one copy of its files under `files`); a model that cannot be served raises the first worker's PipelineError."""
    # The workers' wall-clock limit is the scoring server's timeout, as `mlflow models serve` sets it for its workers.
    os.environ.setdefault(TIMEOUT.name, str(TIMEOUT.get()))
    start_forkserver(__name__)
    local = model_files(model_uri, files)
    count = worker_count(serve.workers, serve.max_bodies_in_flight)
    workers = Workers(count, functools.partial(invocations_in_worker, local), serve.worker_memory_mib)
    limits = EdgeLimits.of(
        serve.max_request_bytes,
        workers.told["max_rows"] or serve.max_rows,
        serve.body_read_timeout_s,
        serve.body_deadline_s,
        serve.max_bodies_in_flight,
    )
    return Edge(routes_without_body(), limits, Invocations(workers, serve.max_bodies_in_flight)), workers


def allow_open_files(connections: int) -> None:
    """A file descriptor for every connection the server may hold, and some for its own files and pipes: the soft
    limit raised as far as the hard one allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(hard, wanted), hard)
        )


async def listen(app: ASGIApp, serve: ServeConfig) -> None:
    server = Server(
        app,
        address=serve.host,
        port=serve.port,
        interface=Interfaces.ASGINL,
        http=HTTPModes.http1,
        backpressure=serve.max_connections,
        backlog=max(128, serve.max_connections),
        http1_settings=HTTP1Settings(header_read_timeout=max(1, round(serve.head_timeout_s * 1000))),
        websockets=False,
        log_access=True,  # one line a request: what an operator (and a test of the balancer) reads
    )
    # granian says at every start that its embedded mode is experimental: nothing a user of make serve can act on
    logging.getLogger("_granian").addFilter(lambda record: "experimental" not in record.getMessage())
    loop = asyncio.get_running_loop()
    for stop in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(stop, server.stop)
    await server.serve()


def serve(model_uri: str, serve: ServeConfig) -> None:
    with tempfile.TemporaryDirectory(prefix="thermal2visible-serve-") as files:
        app, workers = scoring_app(model_uri, serve, files)
        allow_open_files(serve.max_connections)
        try:
            asyncio.run(listen(app, serve))
        finally:
            workers.close()
