"""Each private API of a pinned library the project relies on (no public API does the same), checked on the installed
library: a failure names the library, its version, the API and the code that uses it, so an upgrade that changes one
fails here rather than somewhere downstream without a word."""

import asyncio
import importlib.metadata
import json

import mlflow.pyfunc
import numpy as np
import pytest
import torch
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import scoring_server

from benchmarks.common import int8_matmul
from thermal2visible.inference.request_budget import ServingError


def changed(library: str, api: str, how: str) -> str:
    return f"{library} {importlib.metadata.version(library)}: {api} {how}; update what the API's name says uses it"


def test_torch_int_mm_multiplies_int8_into_exact_int32():
    api = "torch._int_mm (benchmarks.common.int8_matmul)"
    if not callable(getattr(torch, "_int_mm", None)):
        pytest.fail(changed("torch", api, "is gone"))
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randint(-128, 128, shape, dtype=torch.int8, generator=generator) for shape in ((32, 64), (64, 48)))
    try:
        product = int8_matmul(a, b)
    except Exception as error:  # a changed signature or a dropped CPU kernel: either way, named
        pytest.fail(changed("torch", api, f"raises {type(error).__name__}: {error}"))
    if product.dtype != torch.int32 or not torch.equal(product, a.int() @ b.int()):
        pytest.fail(changed("torch", api, f"no longer gives the exact int32 product (got {product.dtype})"))


def test_torch_dropout_nd_is_the_base_of_every_dropout():
    api = "torch.nn.modules.dropout._DropoutNd (training.moving_average turns every dropout off by it)"
    base = getattr(torch.nn.modules.dropout, "_DropoutNd", None)
    if not isinstance(base, type):
        pytest.fail(changed("torch", api, "is gone"))
    kinds = [getattr(torch.nn, name) for name in dir(torch.nn) if "Dropout" in name]
    outside = [kind.__name__ for kind in kinds if not issubclass(kind, base)]
    if not kinds or outside:
        pytest.fail(changed("torch", api, f"is not the base of {outside or 'any dropout'}"))


class Refuses(mlflow.pyfunc.PythonModel):
    """A served model whose predict raises the exception class named in its one input row."""

    def predict(self, context, model_input, params=None):
        first = str(np.asarray(model_input).ravel()[0])  # no signature: the `inputs` list arrives as an array
        kind = {"plain": MlflowException, "kept": ServingError}[first.split(":")[0]]
        raise kind("row 0: not valid base64", error_code=INVALID_PARAMETER_VALUE)


def served_answer(model, body: dict) -> tuple[int, dict]:
    """What `mlflow models serve` answers to POST /invocations with `body`: its FastAPI app, called in-process."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/invocations",
        "raw_path": b"/invocations",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    asyncio.run(scoring_server.init(model)(scope, receive, send))
    status = next(message["status"] for message in sent if message["type"] == "http.response.start")
    return status, json.loads(b"".join(message.get("body", b"") for message in sent))


def test_mlflow_scoring_server_rewrites_messages_that_keeps_its_message_withstands(tmp_path, monkeypatch):
    monkeypatch.setenv("_MLFLOW_IS_IN_SERVING_ENVIRONMENT", "false")  # init sets it for the process; restored after
    mlflow.pyfunc.save_model(tmp_path / "model", python_model=Refuses(), pip_requirements=[])
    model = mlflow.pyfunc.load_model(str(tmp_path / "model"))
    request = "A" * 1000  # stands for a base64 image
    api = "mlflow.pyfunc.scoring_server's rewrite of MlflowException.message (inference.request_budget.ServingError)"

    status, answer = served_answer(model, {"inputs": [f"plain:{request}"]})
    if status != 400 or "row 0: not valid base64" not in answer.get("message", ""):
        pytest.fail(changed("mlflow", api, f"changed: a plain MlflowException now answers {status} {answer!s:.300}"))
    if request not in answer["message"]:
        pytest.fail(changed("mlflow", api, "is gone: the request is no longer echoed, so ServingError.message can go"))

    status, answer = served_answer(model, {"inputs": [f"kept:{request}"]})
    if (status, answer.get("message")) != (400, "row 0: not valid base64"):
        pytest.fail(changed("mlflow", api, f"changed: ServingError no longer keeps it ({status} {answer!s:.300})"))
