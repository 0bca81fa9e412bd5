"""Build a serving image of a registered model (docker/Dockerfile); with --replicas N, run N of them behind a load
balancer (docker/compose.yaml).

    python pipelines/image.py [--model models:/thermal2visible-portrait@champion] [--base python:3.11-slim]
    python pipelines/image.py --replicas 2 [--set serve.port=5002]

(`make image` and `make serve-replicas N=2` run it.) The default model is the champion of the registered model that
params.yaml's data go to, checked as `make serve` checks it. The image is tagged NAME:vVERSION and NAME:latest (NAME:
the registered model's name) and serves make serve's server with params.yaml's serve section on port 8080:
`docker run --rm -p 127.0.0.1:5001:8080 NAME:latest`. Without --base it builds on a Debian base made with debootstrap
(docker/debian-base.sh: no image registry needed); `--base python:3.11-slim` where a registry is reachable. The
replicas run in the foreground, as make serve does (Ctrl-C stops them), on serve.host:serve.port."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import mlflow

from thermal2visible.cli import run_stage
from thermal2visible.config.schema import Params
from thermal2visible.errors import PipelineError
from thermal2visible.inference import image_server
from thermal2visible.inference.workers import worker_count
from thermal2visible.registry.gate import CHAMPION, registered_model_name
from thermal2visible.registry.packing import packed_code, requirements
from thermal2visible.registry.version_files import REGISTRY_URI, trusted_model_uri

DOCKER = Path(__file__).resolve().parents[1] / "docker"
DEBIAN_BASE = "thermal2visible-base:bookworm"
SERVER = Path(image_server.__file__)


def docker(*arguments: str, **options) -> subprocess.CompletedProcess:
    if shutil.which("docker") is None:
        raise PipelineError("docker is not installed: docs/serving.md#a-serving-image says what the image needs")
    return subprocess.run(["docker", *arguments], **({"check": True} | options))


def base_image(base: str | None) -> str:
    """`base`, or the Debian base made with debootstrap (built once, then reused by its tag)."""
    if base:
        return base
    if docker("image", "inspect", DEBIAN_BASE, capture_output=True, check=False).returncode != 0:
        if shutil.which("debootstrap") is None:
            raise PipelineError(
                "no --base given and debootstrap is not installed to build one: install debootstrap, or give "
                "--base python:3.11-slim where an image registry is reachable"
            )
        subprocess.run([DOCKER / "debian-base.sh", DEBIAN_BASE], check=True)
    return DEBIAN_BASE


def write_context(context: Path, model_uri: str, params: Params) -> None:
    """What docker/Dockerfile copies: the model, the server's code and requirements, the serve settings."""
    mlflow.artifacts.download_artifacts(model_uri, dst_path=str(context / "model_dir"))
    with packed_code(SERVER) as code:
        shutil.copytree(code, context / "code" / code.name)
    (context / "requirements.txt").write_text("\n".join(requirements(SERVER)) + "\n")
    # inside a container, 127.0.0.1 is the container alone: the published port reaches every interface
    served = dataclasses.replace(params.serve, host="0.0.0.0", port=image_server.PORT)
    (context / "serve.json").write_text(json.dumps(dataclasses.asdict(served), indent=2))
    shutil.copy(DOCKER / "Dockerfile", context / "Dockerfile")


def version_tag(model_uri: str) -> str:
    """vVERSION for a registered model's version (an alias resolved now), `custom` for any other model."""
    registered = REGISTRY_URI.fullmatch(model_uri)
    if registered is None:
        return "custom"
    name, alias = registered["name"], registered["alias"]
    version = mlflow.MlflowClient().get_model_version_by_alias(name, alias).version if alias else registered["version"]
    return f"v{version}"


def build(params: Params, model: str | None, base: str | None) -> str:
    """Build the image of `model` (default: the champion); its NAME:vVERSION tag."""
    name = registered_model_name(params)
    pinned = trusted_model_uri(model or f"models:/{name}@{CHAMPION}", params.mlflow.experiment)
    tag = f"{name}:{version_tag(pinned)}"
    print(f"building the serving image {tag} of {pinned}", flush=True)
    with tempfile.TemporaryDirectory() as context:
        write_context(Path(context), pinned, params)
        docker("build", "--build-arg", f"BASE={base_image(base)}", "-t", tag, "-t", f"{name}:latest", context)
    return tag


def main(params: Params, args: argparse.Namespace) -> None:
    tag = build(params, args.model, args.base)
    port = params.serve.port
    if not args.replicas:
        print(f"run it:  docker run --rm -p 127.0.0.1:{port}:8080 {tag}", flush=True)
        return
    settings = {
        "IMAGE": tag,
        "BASE": base_image(args.base),
        "HOST": params.serve.host,
        "PORT": str(port),
        "REPLICA_MEMORY": f"{replica_memory_mib(params)}m",
    }
    # one compose project per registered model, unless COMPOSE_PROJECT_NAME names another
    env = {"COMPOSE_PROJECT_NAME": registered_model_name(params)} | os.environ | settings
    print(f"{args.replicas} replicas of {tag} behind http://{params.serve.host}:{port}/invocations", flush=True)
    compose = ["docker-compose", "-f", str(DOCKER / "compose.yaml")]
    # Ctrl-C reaches compose, which stops the replicas; this process waits for it, then removes what it made, so that
    # nothing is left behind, as after make serve
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        subprocess.run([*compose, "up", "--build", "--scale", f"model={args.replicas}"], env=env)
    finally:
        signal.signal(signal.SIGINT, previous)
        subprocess.run([*compose, "down"], env=env, capture_output=True)


def replica_memory_mib(params: Params) -> int:
    """A replica's memory limit: its workers' address-space limits (one per body in flight at serve.workers 0) and
    the server's."""
    return (worker_count(params.serve.workers, params.serve.max_bodies_in_flight) + 1) * params.serve.worker_memory_mib


if __name__ == "__main__":

    def arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model", help="MLflow model URI (default: the champion of the data's registered model)")
        parser.add_argument("--base", help=f"base image (default: {DEBIAN_BASE}, built with debootstrap)")
        parser.add_argument("--replicas", type=int, default=0, help="run N replicas behind a load balancer")

    run_stage(main, description=__doc__.splitlines()[0], arguments=arguments, grant="READ")
