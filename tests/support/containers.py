"""The serving image for tests and benchmarks: built by the project's own command (pipelines/image.py), run as one
container on a free 127.0.0.1 port or as replicas behind the load balancer (`make serve-replicas`), always removed
afterwards, by the container's id or the compose project's name."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator


from tests.support.servers import PROJECT, free_port, quiet_env, running

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
    """`docker run` of the image `tag` with its port on a free 127.0.0.1 port, in the foreground (its log to `log`);
    yields the base URL once /ping answers, always removes the container."""
    port = free_port()
    name = f"t2v-test-{os.getpid()}-{port}"
    command = ["docker", "run", "--rm", "--name", name, "-p", f"127.0.0.1:{port}:8080", tag]
    try:
        with running(command, "/ping", port, log, quiet_env(), timeout_s) as url:
            yield url  # stopping `docker run` stops the container (docker proxies the signal)
    finally:  # and if it was killed before it could
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


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
    finally:  # what `up` left behind: stopped containers and the project's network
        remove_leftovers(name)


def remove_leftovers(compose_project: str, image: str | None = None) -> dict[str, list[str]]:
    """Remove the containers and networks of `compose_project` (by compose's labels) and the containers of `image`;
    what was found, by the listing that found it."""
    label = f"label=com.docker.compose.project={compose_project}"
    listings = {
        ("ps", "-aq", "--filter", label): ("rm", "-f"),
        ("network", "ls", "-q", "--filter", label): ("network", "rm"),
    }
    if image:
        listings[("ps", "-aq", "--filter", f"ancestor={image}")] = ("rm", "-f")
    found = {}
    for listing, remove in listings.items():
        identities = subprocess.run(["docker", *listing], capture_output=True, text=True).stdout.split()
        if identities:
            subprocess.run(["docker", *remove, *identities], capture_output=True)
            found[" ".join(listing)] = identities
    return found
