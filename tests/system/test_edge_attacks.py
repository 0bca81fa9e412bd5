"""Attacks on a real `make serve` server (pipelines/serve.py) before a request reaches the model: bodies whose
headers, chunks or markers cost what the file says, bodies that are not images, and connections that never send.
Each costs its request's worker no more than its budget and the server process almost nothing; meanwhile a small
request is answered within seconds and /ping answers at once. No case is handled by a check of its own: the
operating system's limits on the worker that parses the body hold, whatever the format."""

from __future__ import annotations

import base64
import io
import socket
import struct
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import requests
from PIL import Image
from tests.support.shipped import shipped
from tests.support.tiny_model import export_tiny, saved_pyfunc

from tests.support.servers import cpu_seconds, listening_pid, memory_mib, model_server, process_ticks
from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.inference.serving import png_bytes

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the server's CPU and memory from /proc"),
]
BUDGET = 2.0  # CPU-seconds of one request (serve.max_request_cpu_seconds): each attack below needs several times more
LIMITS = ServedLimits.of(shipped("serve", max_request_cpu_seconds=BUDGET))
HEAD_TIMEOUT = 2.0
SERVER = (f"serve.head_timeout_s={HEAD_TIMEOUT}",)
STOPPED_BY = ("serve.max_request_cpu_seconds", "serve.worker_memory_mib")
SERVER_GROWTH_MIB = 1024
SMALL_WITHIN_S = 3.0


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def small_png() -> bytes:
    return png_bytes(np.full((24, 40), 30000, np.uint16))


def png_of_profiles(count: int) -> bytes:
    """A small PNG carrying `count` iCCP chunks of ~1 KB, each inflating to ~1 MiB inside Pillow's Image.open."""
    png = small_png()
    profile = chunk(b"iCCP", b"p\x00\x00" + zlib.compress(bytes(2**20 - 4096), 9))
    return png[:33] + profile * count + png[33:]  # 33: the signature and the IHDR chunk


def png_of_empty_chunks(count: int) -> bytes:
    """A small PNG carrying `count` empty chunks of a kind no reader knows: nothing inflates, Pillow's chunk loop in
    Python walks them all (a case the limits were not built around: no compression, no metadata kept)."""
    png = small_png()
    return png[:33] + chunk(b"teSt", b"") * count + png[33:]


def small_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (16, 16), 128).save(buffer, format="JPEG")
    return buffer.getvalue()


def jpeg_of_fill(count: int) -> bytes:
    """A JPEG with `count` 0xFF fill bytes before its first marker: Pillow's marker loop reads them one at a time."""
    data = small_jpeg()
    return data[:2] + b"\xff" * count + data[2:]


def jpeg_of_comments(count: int) -> bytes:
    """A JPEG with `count` empty comment markers: Pillow keeps every one."""
    data = small_jpeg()
    return data[:2] + b"\xff\xfe\x00\x02" * count + data[2:]


def body_of(image: bytes) -> bytes:
    return b'{"inputs": {"image": ["' + base64.b64encode(image) + b'"]}}'


@pytest.fixture(scope="module")
def server(tiny_cache, tmp_path_factory):
    folder = tmp_path_factory.mktemp("edge")
    model = saved_pyfunc(export_tiny(folder / "onnx", tiny_cache), folder / "model", LIMITS)
    with model_server(model, folder / "serve", None, *SERVER) as base:
        yield base, listening_pid(int(base.rsplit(":", 1)[1]))


def post(base: str, body: bytes, timeout: float = 120) -> requests.Response:
    headers = {"content-type": "application/json"}
    return requests.post(f"{base}/invocations", data=body, headers=headers, timeout=timeout)


def own_cpu_seconds(pid: int) -> float:
    """CPU-seconds of the process itself (all its threads), not of the workers it started."""
    return process_ticks()[pid][1] / 100


def attack(base: str, pid: int, body: bytes, copies: int) -> dict:
    """`copies` of `body` at once, and a small request sent once they are under way; what each cost."""
    idle, own_before, tree_before = memory_mib(pid)["rss"], own_cpu_seconds(pid), cpu_seconds(pid)
    answers: list[requests.Response] = []
    senders = [threading.Thread(target=lambda: answers.append(post(base, body))) for _ in range(copies)]
    for sender in senders:
        sender.start()
    time.sleep(1.0)
    started = time.monotonic()
    small = post(base, body_of(small_png()), timeout=30)
    small_s = time.monotonic() - started
    ping_started = time.monotonic()
    ping = requests.get(f"{base}/ping", timeout=30)
    ping_s = time.monotonic() - ping_started
    for sender in senders:
        sender.join(180)
    return {
        "answers": answers,
        "small": small,
        "small_s": small_s,
        "ping": ping.status_code,
        "ping_s": ping_s,
        "server_cpu_s": own_cpu_seconds(pid) - own_before,
        "tree_cpu_s": cpu_seconds(pid) - tree_before,
        "server_growth_mib": memory_mib(pid)["peak"] - idle,
    }


def assert_bounded(result: dict, copies: int) -> None:
    assert len(result["answers"]) == copies
    for answer in result["answers"]:
        assert 400 <= answer.status_code < 500, answer.text[:300]
        assert len(answer.content) < 2048
    assert result["small"].status_code == 200 and result["small_s"] < SMALL_WITHIN_S, result["small_s"]
    assert result["ping"] == 200 and result["ping_s"] < 1.0
    assert result["server_growth_mib"] <= SERVER_GROWTH_MIB, result["server_growth_mib"]
    # the server process moves bytes: a fraction of a request's budget for each
    assert result["server_cpu_s"] < copies * BUDGET / 2, result["server_cpu_s"]
    # each request within its budget (+1 s: the CPU limit's whole seconds), a worker's reload after each stop
    assert result["tree_cpu_s"] < copies * (BUDGET + 1 + 1.5) + 2, result["tree_cpu_s"]


@pytest.mark.parametrize(
    "image, copies",
    [
        (lambda: png_of_profiles(6000), 6),
        (lambda: jpeg_of_fill(30_000_000), 2),
        (lambda: jpeg_of_comments(8_000_000), 4),
        (lambda: png_of_empty_chunks(2_000_000), 4),
    ],
    ids=["png-profiles", "jpeg-fill", "jpeg-comments", "png-empty-chunks"],
)
def test_a_header_that_costs_what_the_file_says_stops_in_its_worker(server, image, copies):
    base, pid = server
    result = attack(base, pid, body_of(image()), copies)
    assert_bounded(result, copies)
    for answer in result["answers"]:
        assert any(limit in answer.json()["message"] for limit in STOPPED_BY), answer.text[:300]


def test_large_bodies_that_are_not_images_cost_the_server_only_their_bytes(server):
    base, pid = server
    body = b'{"inputs": {"image": ["' + b"A" * 62_000_000 + b'"]}}'  # valid base64 of zeros: not an image
    result = attack(base, pid, body, 7)
    assert_bounded(result, 7)
    messages = [answer.json()["message"] for answer in result["answers"]]
    assert all("row 0" in message or any(limit in message for limit in STOPPED_BY) for message in messages), messages


def silent(base: str, trickle: bool) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    connection = socket.create_connection((host, int(port)), timeout=30)
    if trickle:
        connection.send(b"G")
    return connection


def closed(connection: socket.socket) -> bool:
    connection.settimeout(0.0)
    try:
        return connection.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.mark.parametrize("trickle", [False, True], ids=["silent", "trickle"])
def test_connections_that_never_send_a_request_hold_no_slot_and_are_closed(server, trickle):
    base, _ = server
    connections = [silent(base, trickle) for _ in range(70)]
    try:
        for _ in range(3):
            started = time.monotonic()
            assert requests.get(f"{base}/ping", timeout=10).status_code == 200
            assert time.monotonic() - started < 1.0
            assert post(base, body_of(small_png()), timeout=30).status_code == 200
            if trickle:
                for connection in connections:
                    connection.send(b"E")
            time.sleep(0.5)
        time.sleep(HEAD_TIMEOUT + 1)
        assert all(closed(connection) for connection in connections), "a connection without a request stayed open"
    finally:
        for connection in connections:
            connection.close()


def test_the_server_log_holds_a_line_per_request_and_no_warning_a_user_cannot_act_on(server, tmp_path_factory):
    base, _ = server
    assert requests.get(f"{base}/ping", timeout=10).status_code == 200
    text = "".join(log.read_text() for log in tmp_path_factory.getbasetemp().glob("edge*/serve/**/*.log"))
    assert '"GET /ping HTTP/1.1" 200' in text and "WARNING" not in text, text[-2000:]


def test_an_idle_keep_alive_connection_is_closed(server):
    base, _ = server
    connection = silent(base, trickle=False)
    try:
        connection.sendall(b"GET /ping HTTP/1.1\r\nHost: t\r\n\r\n")
        assert connection.recv(4096).startswith(b"HTTP/1.1 200")
        time.sleep(HEAD_TIMEOUT + 1)
        assert closed(connection), "an idle keep-alive connection stayed open"
    finally:
        connection.close()
