"""The serving image (`make image`) of the tiny pipeline's champion: run with `docker run` it answers the README's
client with the PNG `make serve` gives, takes concurrent clients through one container and through two replicas
behind the load balancer (`make serve-replicas`), and refuses a bad request with make serve's own status and
message. Skipped, with the reason, where no Docker daemon runs (.ci/run installs and starts one)."""

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import requests

from test_bounded_work import stalled_upload
from tests.support.containers import build_image, container, docker_missing, replicas
from tests.support.servers import PROJECT, model_server

# the first test builds the tiny pipeline and the image (debootstrap's base, the server's libraries)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(bool(docker_missing()), reason=str(docker_missing())),
]

CHAMPION = "models:/{name}@champion"
CLIENTS, REQUESTS = 8, 5


@pytest.fixture(scope="module")
def image(pipeline_project, docker_tags) -> Iterator[str]:
    with docker_tags:  # until the module's last test has run the image and its replicas
        yield build_image(pipeline_project)


@pytest.fixture(scope="module")
def frame(pipeline_project) -> Path:
    return next((pipeline_project / "data" / "raw" / "thermal").rglob("*.png"))


@pytest.fixture(scope="module")
def served(pipeline_project, tmp_path_factory):
    """make serve of the same champion, from the project's store."""
    model = CHAMPION.format(
        name=json.loads((pipeline_project / "reports" / "registered.json").read_text())["model_name"]
    )
    with model_server(model, tmp_path_factory.mktemp("serve"), f"sqlite:///{pipeline_project / 'mlflow.db'}") as url:
        yield url


def translated(url: str, frame: Path, out: Path) -> bytes:
    """The README's client example against `url`."""
    command = [sys.executable, str(PROJECT / "examples" / "client.py"), str(frame), str(out), "--url", url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out.read_bytes()


def refusals(url: str) -> list[tuple[int, str]]:
    """What the server answers to requests it must refuse: not JSON, the wrong column, not an image."""
    not_an_image = {"dataframe_split": {"columns": ["image"], "data": [[base64.b64encode(b"notes").decode()]]}}
    answers = [
        requests.post(f"{url}/invocations", data=b"{", headers={"Content-Type": "application/json"}, timeout=60),
        requests.post(f"{url}/invocations", json={"dataframe_split": {"columns": ["x"], "data": [[1]]}}, timeout=60),
        requests.post(f"{url}/invocations", json=not_an_image, timeout=60),
    ]
    return [(answer.status_code, answer.text) for answer in answers]


def replica_requests(compose_project: str) -> list[int]:
    """How many translations each replica of `compose_project` answered, read from its log."""
    labels = [f"label=com.docker.compose.project={compose_project}", "label=com.docker.compose.service=model"]
    listed = subprocess.run(
        ["docker", "ps", "-q", *(f"--filter={label}" for label in labels)], capture_output=True, text=True
    )
    logs = [
        subprocess.run(["docker", "logs", identity], capture_output=True, text=True)
        for identity in listed.stdout.split()
    ]
    return [(log.stdout + log.stderr).count("POST /invocations") for log in logs]


def stalled_answer(url: str) -> bytes:
    with stalled_upload(url) as connection:
        return connection.recv(4096)


def under_load(url: str, frame: Path) -> dict:
    from benchmarks.rest_load import load  # the load benchmark's clients, each sending its next request on its answer

    body = {"dataframe_split": {"columns": ["image"], "data": [[base64.b64encode(frame.read_bytes()).decode()]]}}
    return load(url, body, CLIENTS, REQUESTS)


def test_the_image_answers_as_make_serve_does(image, served, frame, tmp_path):
    expected = translated(served, frame, tmp_path / "served.png")
    assert expected.startswith(b"\x89PNG")
    with container(image, tmp_path / "container.log") as url:
        assert translated(url, frame, tmp_path / "image.png") == expected
        assert refusals(url) == refusals(served)
        assert all(400 <= status < 500 for status, _ in refusals(url))
        figures = under_load(url, frame)
        assert figures["errors"] == 0 and figures["requests"] == CLIENTS * REQUESTS, figures["first_errors"]
    user = subprocess.run(["docker", "run", "--rm", "--entrypoint", "id", image, "-u"], capture_output=True, text=True)
    assert user.returncode == 0 and user.stdout.strip() != "0", user  # the server runs as a user of its own


def test_two_replicas_behind_the_balancer_share_the_load(pipeline_project, image, served, frame, tmp_path):
    with replicas(pipeline_project, 2) as (url, compose_project):
        assert translated(url, frame, tmp_path / "replicas.png") == translated(served, frame, tmp_path / "s.png")
        assert refusals(url) == refusals(served)
        figures = under_load(url, frame)
        assert figures["errors"] == 0 and figures["requests"] == CLIENTS * REQUESTS, figures["first_errors"]
        # a stalled upload passes the balancer as it arrives: the replica's read timeout answers it, as make serve's
        status = stalled_answer(url).split(b"\r\n")[0]
        assert status.startswith(b"HTTP/1.1 408") and status == stalled_answer(served).split(b"\r\n")[0]
        answered = replica_requests(compose_project)
        assert len(answered) == 2 and min(answered) > 0, answered  # both replicas took requests
