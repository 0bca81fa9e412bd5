"""What one REST request may cost, on the project's real server (pipelines/serve.py): rows, pixels summed over rows
and each image's header are checked before any image is decoded; the body is capped before it is read; error
replies are short and never echo the request; a request past its CPU-seconds stops, and one the server has answered
504 leaves no work running."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tifffile
from mlflow.environment_variables import MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT
from PIL import Image
from tests.support.shipped import shipped
from tests.support.tiny_model import export_tiny, saved_pyfunc as saved

from thermal2visible.data.images import BadImage, image_size
from tests.support.servers import cpu_seconds, listening_pid, model_server
from thermal2visible.inference.rest import scoring_app
from thermal2visible.inference.request_budget import ServedLimits, Work
from thermal2visible.inference.serving import IMAGE, to_base64

LIMITS = ServedLimits.of(shipped("serve", max_rows=4, max_request_pixels=3_000_000, max_model_pixels=10**7))
BODY_LIMIT = 2**20


def png(pixels: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return to_base64(buffer.getvalue())


def ramp(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A 16-bit gradient (small as a PNG, whatever its size), shifted by `seed`."""
    return (np.add.outer(np.arange(height), np.arange(width)) * 7 + seed * 1000).astype(np.uint16)


@pytest.fixture(scope="module")
def onnx_file(tiny_cache, tmp_path_factory) -> Path:
    return export_tiny(tmp_path_factory.mktemp("model"), tiny_cache)


@pytest.fixture(scope="module")
def url(onnx_file, tmp_path_factory):
    model = saved(onnx_file, tmp_path_factory.mktemp("pyfunc") / "model", LIMITS)
    with model_server(model, tmp_path_factory.mktemp("serve"), None, f"serve.max_request_bytes={BODY_LIMIT}") as base:
        yield base


def invoke(url: str, images: list[str]) -> requests.Response:
    return requests.post(f"{url}/invocations", json={"inputs": {IMAGE: images}}, timeout=120)


@pytest.mark.slow
def test_a_request_within_the_budget_is_translated(url):
    response = invoke(url, [png(ramp(40, 56))] * 4)
    assert response.status_code == 200, response.text
    assert len(response.json()["predictions"]) == 4


@pytest.mark.slow
def test_rows_over_the_budget_are_refused(url):
    response = invoke(url, [png(ramp(8, 8))] * 5)
    assert response.status_code == 400
    assert response.json()["message"] == "5 images in one request; serve.max_rows allows 4"


@pytest.mark.slow
def test_pixels_summed_over_rows_are_refused_before_any_row_is_decoded(url):
    """Two 1500x1000 frames (3.0 M pixels together, inside max_request_pixels) then a third: refused by the sum,
    although its last row is not even an image: the headers are read, no row is decoded."""
    big = png(ramp(1000, 1500))
    response = invoke(url, [big, big, to_base64(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)])
    assert response.status_code == 400
    assert "row 2: unreadable image header" in response.json()["message"]
    response = invoke(url, [big, big, png(ramp(8, 8))])
    assert response.status_code == 400
    assert "3 images of 3000064 pixels in all exceed serve.max_request_pixels 3000000" in response.json()["message"]


def test_a_volume_or_many_samples_are_refused_from_the_header():
    """A 12 KB TIFF that holds 1000 slices, and one with 1000 samples per pixel: refused before any pixel is decoded,
    by what they are (a width x height check alone lets both through)."""
    volume, samples = io.BytesIO(), io.BytesIO()
    tifffile.imwrite(volume, np.zeros((1000, 48, 32), np.uint8), volumetric=True, tile=(16, 16, 16), compression="zlib")
    tifffile.imwrite(samples, np.zeros((40, 30, 1000), np.uint8), planarconfig="contig", photometric="minisblack")
    with pytest.raises(BadImage, match="TIFF volume of 1000 slices"):
        image_size(volume.getvalue(), "volume.tif", 10**6)
    with pytest.raises(BadImage, match="1000 channels; expected 1"):
        image_size(samples.getvalue(), "samples.tif", 10**6)


@pytest.mark.slow
def test_a_body_over_the_cap_is_refused_before_it_is_read(url):
    response = requests.post(
        f"{url}/invocations", data=b"{" + b" " * (BODY_LIMIT + 1) + b"}", headers={"content-type": "application/json"}
    )
    assert response.status_code == 413


@pytest.mark.slow
def test_error_replies_are_short_and_never_echo_the_request(url):
    marker = b"NEVER-ECHOED-" * 60_000  # 780 KB, inside the body cap
    malformed = requests.post(f"{url}/invocations", data=b"{" + marker, headers={"content-type": "application/json"})
    nested = requests.post(
        f"{url}/invocations", data=b"[" * 2000 + b"]" * 2000, headers={"content-type": "application/json"}
    )
    for response in (malformed, nested):
        assert response.status_code == 400, response.text[:300]
        assert len(response.content) < 4096 and b"NEVER-ECHOED" not in response.content
        assert "stack_trace" not in response.json() and " at 0x" not in response.text
    assert "request JSON holds over" in nested.json()["message"]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the server's CPU time from Linux's /proc")
def test_a_request_stops_at_its_cpu_seconds_and_a_504_leaves_no_work_running(onnx_file, tmp_path, monkeypatch):
    frames = [png(ramp(1000, 1500, seed)) for seed in range(4)]  # about a CPU-second each on the tiny model
    model = saved(onnx_file, tmp_path / "tight", ServedLimits.of(shipped("serve", max_request_cpu_seconds=0.5)))
    with model_server(model, tmp_path / "serve-tight") as base:
        response = invoke(base, frames)
    assert response.status_code == 400
    assert "has used its 0.5 CPU-seconds (serve.max_request_cpu_seconds)" in response.json()["message"]

    monkeypatch.setenv("MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT", "1")
    model = saved(onnx_file, tmp_path / "generous", ServedLimits.of(shipped("serve")))  # 20 CPU-seconds
    with model_server(model, tmp_path / "serve-timeout") as base:
        pid = listening_pid(int(base.rsplit(":", 1)[1]))
        response = invoke(base, frames)
        answered = time.monotonic()
        assert response.status_code == 504
        time.sleep(max(0.0, answered + 1.0 - time.monotonic()))
        before = cpu_seconds(pid)
        time.sleep(1.0)
        assert cpu_seconds(pid) - before < 0.1, "the server kept computing after its 504"
        assert invoke(base, [png(ramp(40, 56))]).status_code == 200  # and it still serves
    assert json.dumps(response.text)  # the 504's body is MLflow's short text


@pytest.mark.slow
def test_the_served_model_stops_at_the_servers_timeout_by_default(onnx_file, tmp_path, monkeypatch):
    """Without MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT set, make serve's model still knows the scoring server's
    timeout (MLflow's default), so abandoned work stops under the default settings too."""
    monkeypatch.delenv("MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT", raising=False)
    model = saved(onnx_file, tmp_path / "model", LIMITS)
    _, workers = scoring_app(model, shipped("serve", workers=1), str(tmp_path / "files"))
    workers.close()
    assert Work(None, arrived=0.0).deadline == MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT.get() > 0
