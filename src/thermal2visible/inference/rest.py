"""The REST server of `make serve`: MLflow's own scoring server (`mlflow.pyfunc.scoring_server`, what `mlflow models
serve` runs) around the model, behind the guards that server lacks, in one uvicorn process.

- The body is capped (Starlette's RequestBodyLimitMiddleware: 413 once it passes serve.max_request_bytes, before the
  rest is read), and JSON nested deeper than any request form needs is refused before it is parsed (Python's parser
  would recurse until it fails, a 500).
- An error reply says what is wrong and no more: MLflow's parse errors append the request itself ("Input: ..."),
  and some carry a stack trace or an object's address; those parts are cut, and the message is capped at
  `REPLY_CHARS`.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import uvicorn
from mlflow.environment_variables import MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT as TIMEOUT
from mlflow.pyfunc import scoring_server
from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REPLY_CHARS = 1500
MAX_NESTING = 8  # {"dataframe_split": {"data": [["..."]]}} is 4 deep; every request form fits in 8
ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-fA-F]+")
ECHOED_DATA = re.compile(r"(Failed to [\w ]+?) data '.*'\. Error: (.*)", re.S)


def nesting(body: bytes) -> int:
    """How deep brackets nest in `body`, counting those inside strings too (base64 holds none): an upper bound on
    the JSON's nesting, in one vectorised pass."""
    raw = np.frombuffer(body, np.uint8)
    opens = (raw == ord("[")) | (raw == ord("{"))
    closes = (raw == ord("]")) | (raw == ord("}"))
    depth = np.cumsum(opens.astype(np.int64) - closes)
    return int(depth.max()) if depth.size else 0


def plain_error(body: bytes) -> dict[str, str]:
    """An error reply cut to what it is about: no echoed request, stack trace or address."""
    try:
        reply = json.loads(body)
        code, message = str(reply.get("error_code", "BAD_REQUEST")), str(reply.get("message", ""))
    except (ValueError, AttributeError):
        code, message = "INTERNAL_ERROR", body.decode("utf-8", "replace")
    message = ADDRESS.sub("", message.split("\nInput:", 1)[0])
    if echoed := ECHOED_DATA.match(message):  # "Failed to predict data '<the request>'. Error: <why>"
        message = f"{echoed[1]}: {echoed[2]}"
    if len(message) > REPLY_CHARS:
        message = message[:REPLY_CHARS] + " [cut]"
    return {"error_code": code, "message": message}


class Guard:
    """ASGI middleware: refuses over-deep JSON before the app parses it, and rewrites every error reply with
    `plain_error`."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:  # the body limit outside this middleware bounds what is gathered here
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if (depth := nesting(body)) > MAX_NESTING:
            reason = f"request JSON nests {depth} levels deep; no request form needs more than {MAX_NESTING}"
            return await reply(send, 400, {"error_code": "BAD_REQUEST", "message": reason})

        async def replay() -> Message:
            nonlocal body
            message, body = {"type": "http.request", "body": body, "more_body": False}, b""
            return message

        status, error_body = 200, []

        async def send_plain(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if status < 400:
                    await send(message)
            elif status < 400:
                await send(message)
            else:
                error_body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    await reply(send, status, plain_error(b"".join(error_body)))

        await self.app(scope, replay, send_plain)


async def reply(send: Send, status: int, content: dict[str, str]) -> None:
    body = json.dumps(content).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def scoring_app(model_uri: str, max_request_bytes: int) -> ASGIApp:
    """MLflow's scoring app for the model at `model_uri`, behind the body cap and the `Guard`. The model loads as
    `mlflow models serve` loads it: SERVING_MODEL_CONFIG (JSON) overrides its model_config."""
    # The served model stops work the server has given up on (serving.Work): it reads the timeout from the
    # environment, as `mlflow models serve` sets it for its workers.
    os.environ.setdefault(TIMEOUT.name, str(TIMEOUT.get()))
    app = scoring_server.init(scoring_server.load_model_with_mlflow_config(model_uri))
    return RequestBodyLimitMiddleware(Guard(app), max_body_size=max_request_bytes)


def serve(model_uri: str, host: str, port: int, max_request_bytes: int) -> None:
    uvicorn.run(scoring_app(model_uri, max_request_bytes), host=host, port=port, log_level="info")
