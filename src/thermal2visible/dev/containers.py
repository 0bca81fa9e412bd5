"""The serving image for tests and benchmarks: built by the project's own command (pipelines/image.py), run as one
container on a free 127.0.0.1 port or as replicas behind the load balancer (`make serve-replicas`), always removed
afterwards, by the container's id or the compose project's name."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import requests

from thermal2visible.dev.servers import PROJECT, free_port, quiet_env, running

IMAGE_SCRIPT = PROJECT / "pipelines" / "image.py"


def docker_missing() -> str | None:
    """Why no image can be built or run here, or None where a Docker daemon answers."""
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired) as error:
        return f"no Docker here ({error})"
    if info.returncode != 0:
        return f"no Docker daemon answers: {info.stderr.strip()[-300:]}"
    for tool in ("docker-compose", "debootstrap"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
            return f"{tool} is not installed"
    return None


def build_image(project: Path, *arguments: str, timeout_s: float = 1200) -> str:
    """`make image` in `project` (its params.yaml and MLflow store); the tag it printed."""
    done = subprocess.run(
        [sys.executable, str(IMAGE_SCRIPT), *arguments], cwd=project, capture_output=True, text=True,
        env=quiet_env(), timeout=timeout_s,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"make image failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout.split("docker run --rm -p ")[1].split()[1]


@contextlib.contextmanager
def container(tag: str, log: Path, timeout_s: float = 180) -> Iterator[str]:
    """`docker run` of the image `tag` with its port on a free 127.0.0.1 port; yields the base URL once /ping answers,
    always removes the container (its log written to `log` first)."""
    port = free_port()
    started = subprocess.run(
        ["docker", "run", "-d", "-p", f"127.0.0.1:{port}:8080", tag], capture_output=True, text=True, check=True
    )
    identity = started.stdout.strip()
    try:
        _wait_until_ready(f"http://127.0.0.1:{port}/ping", identity, timeout_s)
        yield f"http://127.0.0.1:{port}"
    finally:
        log.write_text(subprocess.run(["docker", "logs", identity], capture_output=True, text=True).stdout)
        subprocess.run(["docker", "rm", "-f", identity], capture_output=True)


def _wait_until_ready(url: str, identity: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.ConnectionError, requests.Timeout):
            if requests.get(url, timeout=2).status_code == 200:
                return
        state = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Status}}", identity], capture_output=True, text=True
        )
        if state.stdout.strip() not in ("created", "running"):
            logs = subprocess.run(["docker", "logs", identity], capture_output=True, text=True)
            raise RuntimeError(f"container {identity[:12]} {state.stdout.strip()}:\n{logs.stderr[-3000:]}")
        time.sleep(0.25)
    raise RuntimeError(f"container {identity[:12]} not ready at {url} after {timeout_s:.0f} s")


@contextlib.contextmanager
def replicas(project: Path, count: int, timeout_s: float = 600) -> Iterator[tuple[str, str]]:
    """`make serve-replicas N=count` in `project` (its log: replicas.log there), on a free port under a compose
    project of its own; yields the load balancer's base URL once it answers and the compose project's name; always
    stops the command and removes what compose made."""
    port = free_port()
    name = f"t2v-test-{os.getpid()}-{port}"
    command = [sys.executable, str(IMAGE_SCRIPT), "--replicas", str(count), "--set", f"serve.port={port}"]
    env = quiet_env(COMPOSE_PROJECT_NAME=name)
    try:
        with running(command, "/ping", port, project / "replicas.log", env, timeout_s) as url:
            yield url, name
    finally:  # by compose's labels, what `up` left behind: stopped containers and the project's network
        label = f"label=com.docker.compose.project={name}"
        made = subprocess.run(["docker", "ps", "-aq", "--filter", label], capture_output=True, text=True)
        subprocess.run(["docker", "rm", "-f", *made.stdout.split()], capture_output=True)
        subprocess.run(["docker", "network", "prune", "-f", "--filter", label], capture_output=True)
