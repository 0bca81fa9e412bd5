"""Security defaults: loopback-only servers, checkpoints that cannot run code, no secrets in what MLflow prints,
bounded requests. (The bad-input corpus, tests/system/test_bad_input_corpus.py, covers refused images, symlinks out of
the dataset root, decompression bombs, REST errors without tracebacks or echoes.)
"""

from __future__ import annotations

import ast
import base64
import io
import os
import socket
from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pytest
import tifffile
import torch
from PIL import Image
from tests.support.servers import MLFLOW, free_port, quiet_env, running
from tests.support.shipped import shipped
from tests.support.tiny_model import export_tiny

from thermal2visible.config.load import load_params
from thermal2visible.data.images import decode_image
from thermal2visible.errors import ConfigError, PipelineError
from thermal2visible.paths import PARAMS
from thermal2visible.models.payloads import load_generator, load_recognizer
from thermal2visible.inference.request_budget import (
    ServedLimits,
    ServingError,
    bad_request,
    row_bytes,
    max_encoded_length,
)
from thermal2visible.registry.packing import pyfunc_arguments
from thermal2visible.tracking.store import tracking_uri
from thermal2visible.training.resume import find_resume

REPO = Path(__file__).resolve().parents[2]
SOURCES = [
    *(REPO / "src").rglob("*.py"),
    *(REPO / "pipelines").rglob("*.py"),
    *(REPO / "benchmarks").glob("*.py"),
    *(REPO / "examples").glob("*.py"),
]


def listening_addresses(port: int) -> set[str]:
    """Local addresses of the LISTEN sockets on `port`, from /proc/net/tcp and tcp6 (Linux)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                raw = bytes.fromhex(address)
                found.add(
                    socket.inet_ntop(
                        socket.AF_INET if width == 8 else socket.AF_INET6,
                        b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)),
                    )
                )
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the listening sockets from Linux's /proc")
def test_mlflow_servers_listen_on_loopback_only_when_no_host_is_given(tmp_path, tiny_cache):
    onnx_path = export_tiny(tmp_path, tiny_cache)
    with pyfunc_arguments(onnx_path, ServedLimits.of(shipped("serve", max_pixels=10_000))) as arguments:
        mlflow.pyfunc.save_model(tmp_path / "pyfunc", **arguments)
    port = free_port()
    tracking = [
        MLFLOW,
        "server",
        "--backend-store-uri",
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    with running(
        tracking, "/health", port, tmp_path / "tracking.log", quiet_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    ):
        assert listening_addresses(port) == {"127.0.0.1"}
    port = free_port()
    serving = [MLFLOW, "models", "serve", "-m", str(tmp_path / "pyfunc"), "--env-manager", "local", "-p", str(port)]
    with running(serving, "/ping", port, tmp_path / "serving.log", quiet_env()):
        assert listening_addresses(port) == {"127.0.0.1"}
    # `make serve` binds params.yaml's serve.host (pipelines/serve.py; test_serving runs it), `make ui` loopback
    makefile = (REPO / "Makefile").read_text()
    assert "pipelines/serve.py" in makefile and "0.0.0.0" not in makefile
    assert load_params(REPO / PARAMS).serve.host == "127.0.0.1"
    assert all("-h 127.0.0.1" in line for line in makefile.splitlines() if "mlflow ui" in line)


def torch_load_calls() -> list[tuple[Path, ast.Call]]:
    return [
        (path, node)
        for path in SOURCES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load"
    ]


def test_every_checkpoint_load_is_weights_only():
    calls = torch_load_calls()
    assert len(calls) >= 3  # resume.find_resume and load_generator, load_recognizer at least
    for path, call in calls:
        assert any(k.arg == "weights_only" and ast.unparse(k.value) == "True" for k in call.keywords), (
            f"{path.relative_to(REPO)}:{call.lineno}: {ast.unparse(call)}"
        )
    fit = [
        node
        for path in (*(REPO / "src").rglob("*.py"), *(REPO / "pipelines").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "trainer.fit" and "ckpt_path=" in ast.unparse(node)
    ]
    assert fit and all("weights_only=True" in ast.unparse(call) for call in fit)  # Lightning's resume too


class RunsCode:
    """Unpickling this runs a shell command (what a malicious checkpoint does)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_that_would_run_code_is_refused_not_run(tmp_path, capsys):
    marker = tmp_path / "code-ran"
    for name in ("last.ckpt", "generator.pt", "recognizer.pt"):
        torch.save({"state_dict": {}, "payload": RunsCode(marker)}, tmp_path / name)
    assert find_resume(tmp_path, "f" * 16, "auto") == (None, None)
    notice = capsys.readouterr().out
    assert "cannot be read (UnpicklingError): kept in" in notice and "starting fresh" in notice
    with pytest.raises(PipelineError, match="not a generator saved by the train stage"):
        load_generator(tmp_path / "generator.pt")
    with pytest.raises(PipelineError, match="not a recognizer saved by train_recognizer"):
        load_recognizer(tmp_path / "recognizer.pt", ["a", "b"])
    assert not marker.exists()


def test_a_password_in_an_http_tracking_uri_is_refused(monkeypatch):
    """MLflow prints the tracking URI in its "View run ... at: <uri>" lines: with credentials in it, they would
    land in every terminal, DVC and CI log. MLflow reads them from MLFLOW_TRACKING_USERNAME/PASSWORD instead."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://alice:s3cret@mlflow.example.org")
    with pytest.raises(ConfigError, match="MLFLOW_TRACKING_PASSWORD") as refused:
        tracking_uri()
    assert "s3cret" not in str(refused.value)
    for allowed in ("https://mlflow.example.org", "postgresql://alice:s3cret@db.example.org/mlflow"):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", allowed)  # MLflow prints no database URI
        assert tracking_uri() == allowed


def encoded(pixels: np.ndarray, kind: str) -> str:
    buffer = io.BytesIO()
    if kind == "tiff":
        tifffile.imwrite(buffer, pixels)
    else:
        Image.fromarray(pixels).save(buffer, format="PNG", compress_level=0)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def test_request_size_limit_refuses_before_decoding_yet_fits_every_valid_image():
    max_pixels = 10_000
    rng = np.random.default_rng(0)
    widest = {
        "tiff": rng.integers(0, 65535, (max_pixels, 3), dtype=np.uint16),  # 16-bit RGB, uncompressed noise
        "png": rng.integers(0, 255, (max_pixels, 3), dtype=np.uint8),
    }  # Pillow writes no 16-bit RGB PNG
    for kind, pixels in widest.items():
        for height, width in ((100, 100), (max_pixels, 1)):  # one pixel a row: the most per-row overhead
            value = encoded(pixels.reshape(height, width, 3), kind)
            assert len(value) <= max_encoded_length(max_pixels), (kind, height, width)
            assert decode_image(row_bytes(value, 0, max_pixels), "row 0", max_pixels).shape == (height, width, 3)
    with pytest.raises(ServingError, match=r"row 3: \d+ base64 characters; an image within max_pixels 10000"):
        row_bytes("A" * (max_encoded_length(max_pixels) + 4), 3, max_pixels)


def test_a_serving_error_keeps_its_message_when_mlflow_rewrites_it():
    error = bad_request("row 0: not valid base64")
    error.message = f"Failed to predict data '{'A' * 10_000}'. \nError: {error.message}"  # what the server does
    assert error.message == "row 0: not valid base64" and len(error.serialize_as_json()) < 200
