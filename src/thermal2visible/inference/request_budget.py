"""What one request to the served model may cost, and how a refusal is answered.

`ServedLimits` is a served version's model_config (params.yaml's serve section): one image's pixels, one request's
rows, pixels and CPU-seconds, one onnxruntime run. `Work` checks a request's progress against that budget between
steps. A refusal is a `ServingError`, which MLflow's scoring server answers with its error code and the message alone.
"""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass, fields

from mlflow.environment_variables import MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT as TIMEOUT
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, TEMPORARILY_UNAVAILABLE

from thermal2visible.config.schema import ServeConfig
from thermal2visible.inference.session import CHECK_SECONDS, RUN_SECONDS


class ServingError(MlflowException):
    """An MlflowException that keeps the message it was made with: assignments after __init__ are ignored.

    Relies on a private behaviour of MLflow's scoring server (`mlflow models serve`,
    mlflow.pyfunc.scoring_server.invocations), checked by tests/unit/inference/test_private_apis.py: it assigns
    `error.message = "Failed to predict data '<the request>'. Error: <message>"` to an MlflowException raised in
    `predict` and answers
    `serialize_as_json()`; for the `inputs` and `instances` forms that echoes the whole base64 request back. No public
    setting turns that off, and any other exception type answers with a Python traceback.
    """

    @property
    def message(self) -> str:
        return self._message

    @message.setter
    def message(self, value: str) -> None:
        if not hasattr(self, "_message"):
            self._message = value


def bad_request(message: str) -> ServingError:
    return ServingError(message, error_code=INVALID_PARAMETER_VALUE)


def max_encoded_length(max_pixels: int) -> int:
    """The longest base64 an image within `max_pixels` may take: 8 bytes a pixel (16-bit RGB stored
    uncompressed, with PNG's per-row filter byte) plus 1 MiB of headers and metadata, as base64."""
    return (8 * max_pixels + 2**20) * 4 // 3


def row_bytes(value: object, row: int, max_pixels: int) -> bytes:
    source = f"row {row}"
    if not isinstance(value, str):
        raise bad_request(f"{source}: expected a base64 string, got {type(value).__name__}")
    if len(value) > max_encoded_length(max_pixels):
        raise bad_request(
            f"{source}: {len(value)} base64 characters; an image within max_pixels {max_pixels} "
            f"takes at most {max_encoded_length(max_pixels)} (refused before decoding)"
        )
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as error:
        raise bad_request(f"{source}: not valid base64 ({error})") from None


@dataclass(frozen=True)
class ServedLimits:
    """The model_config of a served version (params.yaml's serve section): what one image, one request and one run
    of the model may cost. The request budget (max_rows to max_request_cpu_seconds) is None for the project's own
    batch clients, which translate one local image at a time."""

    max_pixels: int  # one image, width x height
    max_model_pixels: int  # one frame once scaled to the model (frames.model_size)
    max_rows: int | None = None
    max_request_pixels: int | None = None  # summed over the rows
    max_request_cpu_seconds: float | None = None
    max_run_seconds: float = RUN_SECONDS  # one onnxruntime run; a version packed before the key ran with RUN_SECONDS
    max_check_seconds: float = CHECK_SECONDS  # the one-square run on load (session.check_runs)

    @classmethod
    def of(cls, serve: ServeConfig) -> ServedLimits:
        return cls(**{limit.name: getattr(serve, limit.name) for limit in fields(cls)})


class Work:
    """One request's progress against its budget: `check` between steps stops a request that has spent its
    CPU-seconds (a 400) or that the scoring server has given up on (its timeout passed: the client has its 504)."""

    def __init__(self, cpu_seconds: float | None, arrived: float):
        self.cpu_deadline = None if cpu_seconds is None else time.process_time() + cpu_seconds
        self.cpu_seconds = cpu_seconds
        timeout = TIMEOUT.get() if TIMEOUT.defined else None
        self.deadline = None if timeout is None else arrived + timeout

    def check(self, where: str) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise ServingError(
                "the server's request timeout passed before this request finished; stopped",
                error_code=TEMPORARILY_UNAVAILABLE,
            )
        if self.cpu_deadline is not None and time.process_time() > self.cpu_deadline:
            raise bad_request(
                f"{where}: this request has used its {self.cpu_seconds} CPU-seconds (serve.max_request_cpu_seconds); "
                "send fewer or smaller images per request"
            )
