"""Attacks on a real `make serve` server (pipelines/serve.py) whose cost no header states: each is stopped by the
operating system's limits on the worker that runs it, or by the HTTP edge before a parser sees it; the server stays
up, its own memory does not grow, no reply echoes the request, and small requests go on while a costly one runs."""

from __future__ import annotations

import io
import socket
import struct
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import requests
import tifffile
from PIL import Image
from tests.support.shipped import shipped
from tests.support.tiny_model import export_tiny, saved_pyfunc

from tests.support.servers import cpu_seconds, listening_pid, memory_mib, model_server
from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.inference.serving import IMAGE, png_bytes, to_base64

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the server's memory from Linux's /proc"),
]
LIMITS = ServedLimits.of(
    shipped(
        "serve",
        max_pixels=40_000_000,
        max_request_pixels=40_000_000,
        max_model_pixels=10**7,
        max_request_cpu_seconds=2.0,
    )
)
WORKER_MIB = 1024  # a worker holds ~620 MiB of address space once loaded
SERVER = ("serve.workers=2", f"serve.worker_memory_mib={WORKER_MIB}", "serve.body_read_timeout_s=2")
SERVER += ("serve.body_deadline_s=6", "serve.max_bodies_in_flight=3")


def small() -> str:
    return to_base64(png_bytes(np.full((24, 40), 30000, np.uint16)))


def progressive_jpeg(side: int, scans: int) -> bytes:
    """A grey JPEG whose last progressive scan (a few bytes of end-of-block runs) is repeated `scans` times: each
    repeat walks every block again, inside one Pillow call."""
    buffer = io.BytesIO()
    Image.new("L", (side, side), 128).save(buffer, format="JPEG", progressive=True, quality=90)
    data = buffer.getvalue()
    last = data.rindex(b"\xff\xda")  # SOS: the last scan's header and data, up to EOI
    return data[:-2] + data[last:-2] * scans + b"\xff\xd9"


def tiff_with_huge_tile(side: int) -> bytes:
    """A 16x16 TIFF whose one tile claims side x side: the header's width x height is tiny, decoding allocates the
    whole tile (a zlib stream of zeros, ~side KB)."""
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, np.zeros((16, 16), np.uint8), tile=(16, 16), compression="zlib")
    data = bytearray(buffer.getvalue())
    squeeze, row = zlib.compressobj(1), bytes(side)
    tile = b"".join(squeeze.compress(row) for _ in range(side)) + squeeze.flush()
    with tifffile.TiffFile(io.BytesIO(bytes(data))) as tiff:
        tags = tiff.pages.first.tags
        patches = {"TileWidth": side, "TileLength": side, "TileOffsets": len(data), "TileByteCounts": len(tile)}
        for name, value in patches.items():
            struct.pack_into("<H" if tags[name].dtype == 3 else "<I", data, tags[name].valueoffset, value)
    return bytes(data) + tile


def png_bomb(side: int) -> bytes:
    """A 16-bit grey PNG of side x side zeros: inside max_pixels, ~side^2/500 bytes, and more memory than a worker
    has once normalised and scaled (no check was written for it)."""
    return png_bytes(np.zeros((side, side), np.uint16))


@pytest.fixture(scope="module")
def server(tiny_cache, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bounded")
    model = saved_pyfunc(export_tiny(folder / "onnx", tiny_cache), folder / "model", LIMITS)
    with model_server(model, folder / "serve", None, *SERVER) as base:
        pid = listening_pid(int(base.rsplit(":", 1)[1]))
        before = memory_mib(pid)["rss"]
        yield base, pid
        assert memory_mib(pid)["peak"] - before <= 512, "the server process itself grew by more than 512 MiB"


def invoke(base: str, image: bytes | str) -> requests.Response:
    value = image if isinstance(image, str) else to_base64(image)
    return requests.post(f"{base}/invocations", json={"inputs": {IMAGE: [value]}}, timeout=120)


def assert_refused_then_serving(response: requests.Response, limits: tuple[str, ...], base: str) -> None:
    assert response.status_code in (400, 503), response.text[:300]
    assert any(limit in response.json()["message"] for limit in limits) and len(response.content) < 2048
    assert invoke(base, small()).status_code == 200  # a fresh worker took the stopped one's place


def test_a_progressive_jpeg_of_many_scans_stops_at_the_cpu_limit(server):
    base, pid = server
    response = invoke(base, progressive_jpeg(2000, 2000))  # ~8 CPU-seconds of Pillow's load(), budget 2
    assert_refused_then_serving(response, ("serve.max_request_cpu_seconds",), base)
    before = cpu_seconds(pid)
    time.sleep(1.0)
    assert cpu_seconds(pid) - before < 0.2, "the server kept computing"


def test_a_tiff_tile_larger_than_its_image_stops_at_the_memory_limit(server):
    base, _ = server
    assert_refused_then_serving(invoke(base, tiff_with_huge_tile(24576)), ("serve.worker_memory_mib",), base)


def test_a_png_that_no_check_foresaw_stops_at_a_limit_of_its_worker(server):
    """Whichever the OS enforces first, memory or CPU: no check names this case, the limits hold anyway."""
    base, _ = server
    limits = ("serve.worker_memory_mib", "serve.max_request_cpu_seconds")
    assert_refused_then_serving(invoke(base, png_bomb(6000)), limits, base)


def test_small_requests_are_answered_while_a_costly_one_runs(server):
    base, _ = server
    costly = threading.Thread(target=invoke, args=(base, progressive_jpeg(2000, 2000)))
    costly.start()
    time.sleep(0.5)
    answers = [invoke(base, small()).status_code for _ in range(4)]
    still_running = costly.is_alive()
    costly.join(120)
    assert answers == [200] * 4 and still_running


@pytest.mark.parametrize(
    "content_type, body",
    [
        ("application/x-parquet", lambda: pd.DataFrame({IMAGE: ["x"] * 2_000_000}).to_parquet()),
        ("text/csv", lambda: b"image\n" + b"x\n" * 2_000_000),
    ],
    ids=["parquet", "csv"],
)
def test_bodies_other_than_json_are_refused_unread(server, content_type, body):
    base, _ = server
    response = requests.post(f"{base}/invocations", data=body(), headers={"content-type": content_type}, timeout=30)
    assert response.status_code == 415 and "application/json" in response.json()["message"]


@pytest.mark.parametrize(
    "body",
    [b'{"inputs": {"image": [' + b'"a",' * 1_000_000 + b'"a"]}}', b"[" + b"[[[[0]]]]," * 1_000_000 + b"[0]]"],
    ids=["million-rows", "nested-lists"],
)
def test_json_holding_millions_of_values_is_refused_while_reading(server, body):
    base, _ = server
    response = requests.post(f"{base}/invocations", data=body, headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 400 and "refused while reading" in response.json()["message"]


def stalled_upload(base: str) -> socket.socket:
    """A POST that promises 1 MB, sends 64 KB of it and stops."""
    host, port = base.removeprefix("http://").split(":")
    connection = socket.create_connection((host, int(port)), timeout=30)
    head = f"POST /invocations HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    head += "Content-Length: 1000000\r\n\r\n"
    connection.sendall(head.encode() + b" " * 65536)
    return connection


def test_a_stalled_upload_is_dropped_and_bodies_in_flight_are_capped(server):
    base, _ = server
    stalled = [stalled_upload(base) for _ in range(3)]  # serve.max_bodies_in_flight
    time.sleep(0.3)
    busy = requests.post(f"{base}/invocations", json={"inputs": {IMAGE: [small()]}}, timeout=30)
    assert busy.status_code == 503 and "serve.max_bodies_in_flight" in busy.json()["message"]
    for connection in stalled:  # answered 408 at the read timeout (2 s), not left to hold their memory
        assert connection.recv(4096).startswith(b"HTTP/1.1 408"), "a stalled upload was kept waiting"
        connection.close()
    assert invoke(base, small()).status_code == 200


def test_error_replies_do_not_echo_the_clients_names(server):
    base, _ = server
    body = {"instances": [{"SECRET-COLUMN-" + str(n): "x" for n in range(50)}]}
    response = requests.post(f"{base}/invocations", json=body, timeout=30)
    assert response.status_code == 400 and "Model is missing inputs ['image']" in response.json()["message"]
    assert b"SECRET" not in response.content
