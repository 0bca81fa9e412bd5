"""The HTTP edge of `make serve`: what the server reads from a client is bounded before any parser sees it, and the
server process parses none of it.

MLflow's scoring app reads the whole body and parses it (JSON, CSV or parquet) before the model counts a row: a 59 KB
parquet body can hold 20 M rows, and a stalled upload holds its memory for as long as the client keeps the
connection. So, as the HTTP server passes a POST /invocations body on, in this order:

- only `application/json` (the documented request forms) gets through: anything else is a 415 before a byte is read;
- at most `max_bodies` requests are received or answered at once (503 beyond: each holds its body in memory);
- each read waits at most `read_timeout_s`, the whole body `deadline_s` (408 past either: a client that stalls or
  trickles its upload gives its memory back);
- the bytes (413), the nesting and the JSON values (commas and opening brackets, an upper bound on the rows and
  columns; 400) are counted as the body arrives, so a body that holds millions of rows is refused before any parser
  allocates them;
- the body, as bytes, goes to `answer`, which has it parsed and answered by a worker process under OS limits
  (inference.rest); error replies come back already cut by `plain_error`: no stack trace, no address, no request text.

Every other route (/ping, /health, /version) is the app's: it reads no body.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass

from typing import Awaitable, Callable

from starlette.types import ASGIApp, Receive, Scope, Send

JSON = b"application/json"
INVOCATIONS = "/invocations"
REPLY_CHARS = 1500
MAX_NESTING = 8  # {"dataframe_split": {"data": [["..."]]}} is 4 deep; every request form fits in 8
VALUES_PER_ROW = 8  # a row costs at most 2 commas and 2 brackets in any request form, with its index
ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-fA-F]+")
ECHOED_DATA = re.compile(r"(Failed to [\w ]+?) data '.*'\. ?\s*Error: (.*)", re.S)
QUOTED = re.compile(r"'([^']+)'|\"([^\"]+)\"")
ECHO_MARK = "<request text>"


@dataclass(frozen=True)
class EdgeLimits:
    max_body_bytes: int  # serve.max_request_bytes
    max_values: int  # JSON values one body may hold: VALUES_PER_ROW per row allowed, and a few for the form
    read_timeout_s: float  # serve.body_read_timeout_s
    deadline_s: float  # serve.body_deadline_s
    max_bodies: int  # serve.max_bodies_in_flight

    @classmethod
    def of(cls, max_body_bytes: int, max_rows: int, read_timeout_s: float, deadline_s: float, max_bodies: int):
        return cls(max_body_bytes, VALUES_PER_ROW * max_rows + 64, read_timeout_s, deadline_s, max_bodies)


class Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def plain_error(body: bytes, request: bytes, names: frozenset[str]) -> dict[str, str]:
    """An error reply cut to what it is about: no echoed request, stack trace or address; a quoted text that the
    request holds is replaced by ECHO_MARK unless it is one of the model's own `names` (its input column)."""
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

    def unechoed(quoted: re.Match) -> str:
        text = quoted[1] or quoted[2]
        return quoted[0] if text in names or text.encode() not in request else quoted[0][0] + ECHO_MARK + quoted[0][0]

    return {"error_code": code, "message": QUOTED.sub(unechoed, message)}


def json_body(content: dict[str, str]) -> bytes:
    return json.dumps(content).encode()


async def respond(send: Send, status: int, media_type: str, body: bytes) -> None:
    headers = [(b"content-type", media_type.encode("latin-1")), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def reply(send: Send, status: int, content: dict[str, str]) -> None:
    await respond(send, status, JSON.decode(), json_body(content))


Answer = Callable[[str, bytearray], Awaitable[tuple[int, str, bytes]]]  # (content type, body) -> (status, type, reply)


class Edge:
    """ASGI middleware: a POST /invocations read within bounds (module docstring) and answered by `answer`; the
    rest to `app`."""

    def __init__(self, app: ASGIApp, limits: EdgeLimits, answer: Answer):
        self.app, self.limits, self.answer = app, limits, answer
        self.bodies = 0  # requests between their first read and their reply: the event loop's thread only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != INVOCATIONS:
            return await self.app(scope, receive, send)
        if self.bodies >= self.limits.max_bodies:
            reason = f"{self.limits.max_bodies} requests are being received or answered (serve.max_bodies_in_flight)"
            return await reply(send, 503, {"error_code": "TEMPORARILY_UNAVAILABLE", "message": reason + "; retry"})
        self.bodies += 1
        try:
            try:
                body = await self._body(scope, receive)
            except Refused as refused:
                return await reply(send, refused.status, {"error_code": "BAD_REQUEST", "message": str(refused)})
            if body is None:
                return
            content_type = dict(scope["headers"]).get(b"content-type", b"").decode("latin-1")
            status, media_type, answer = await self.answer(content_type, body)
            del body
            await respond(send, status, media_type, answer)
        finally:
            # The reply is out, and no await has let another request in since: a client that sends its next request
            # on the answer finds the slot free, so N clients never need more than N slots.
            self.bodies -= 1

    async def _body(self, scope: Scope, receive: Receive) -> bytearray | None:
        """The whole body, or None when the client left; Refused past a limit."""
        headers = dict(scope["headers"])
        if headers.get(b"content-type", b"").split(b";")[0].strip().lower() != JSON:
            raise Refused(415, "the request's content type must be application/json (the documented request forms)")
        limits = self.limits
        too_long = f"request body over {limits.max_body_bytes} bytes (serve.max_request_bytes)"
        if int(headers.get(b"content-length", b"0") or 0) > limits.max_body_bytes:
            raise Refused(413, too_long)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.deadline_s
        body, values, opens, closes, depth, deepest = bytearray(), 0, 0, 0, 0, 0
        more = True
        while more:
            wait = min(limits.read_timeout_s, deadline - loop.time())
            try:
                message = await asyncio.wait_for(receive(), max(wait, 0.0))
            except TimeoutError:
                if loop.time() >= deadline:
                    raise Refused(
                        408, f"request body not received within {limits.deadline_s:g} s (serve.body_deadline_s)"
                    )
                raise Refused(408, f"no request data for {limits.read_timeout_s:g} s (serve.body_read_timeout_s)")
            if message["type"] == "http.disconnect":
                return None
            chunk, more = message.get("body", b""), message.get("more_body", False)
            if len(body) + len(chunk) > limits.max_body_bytes:
                raise Refused(413, too_long)
            chunk_opens = chunk.count(b"[") + chunk.count(b"{")
            opens += chunk_opens
            closes += chunk.count(b"]") + chunk.count(b"}")
            values += chunk.count(b",") + chunk_opens
            if values > limits.max_values:
                raise Refused(
                    400,
                    f"request JSON holds over {limits.max_values} values; a request of serve.max_rows images "
                    "holds fewer (refused while reading)",
                )
            if closes > opens:
                raise Refused(400, "request JSON closes more brackets than it opens")
            depth, deepest = _nesting(chunk, depth, deepest)  # walks at most 2 x max_values brackets in all
            if deepest > MAX_NESTING:
                raise Refused(400, f"request JSON nests over {MAX_NESTING} levels; no request form needs more")
            body += chunk
        return body  # bytes-like: the pipe to the worker takes it without a copy


def _nesting(chunk: bytes, depth: int, deepest: int) -> tuple[int, int]:
    """(depth at the chunk's end, deepest so far) of brackets, counting those inside strings too (base64 holds
    none): an upper bound on the JSON's nesting."""
    for byte in chunk.translate(None, delete=_NOT_BRACKETS):
        depth += 1 if byte in b"[{" else -1
        deepest = max(deepest, depth)
    return depth, deepest


_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")
