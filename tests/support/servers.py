"""Real MLflow processes for tests, benchmarks and UI screenshots: a tracking server and a model server on free
127.0.0.1 ports.

Each runs in its own session (process group), so stopping it reaches the workers it forks too
(`mlflow models serve` runs uvicorn as a child); the group is stopped in a `finally`, whatever the test did.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import requests

from thermal2visible.cli import this_python_first

MLFLOW = str(Path(sys.executable).with_name("mlflow"))
PROJECT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def quiet_env(**extra: str) -> dict[str, str]:
    return this_python_first(os.environ) | {"MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"} | extra


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_group(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the whole process group, SIGKILL whatever is left after `grace_s`."""
    pgid = process.pid  # start_new_session=True made the child the leader of a group with its own pid
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        if process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(0.2)
        else:
            time.sleep(0.2)
    if _group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    process.wait()
    # a killed member stays in the group until its parent, or init once the leader is gone, has reaped it
    deadline = time.monotonic() + grace_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _wait_ready(process: subprocess.Popen, url: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with code {process.returncode}; its log:\n{log.read_text()[-4000:]}")
        # not listening yet, or listening but too busy starting (a loaded machine) to answer within 2 s
        with contextlib.suppress(requests.ConnectionError, requests.Timeout):
            if requests.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.25)
    raise RuntimeError(f"server not ready at {url} after {timeout_s:.0f} s; its log:\n{log.read_text()[-4000:]}")


@contextlib.contextmanager
def running(
    command: list[str], ready_path: str, port: int, log: Path, env: dict[str, str], timeout_s: float = 120.0
) -> Iterator[str]:
    """Start `command`, wait until GET `ready_path` answers 200, yield its base URL; always stop it."""
    base = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent, start_new_session=True
        )
        try:
            _wait_ready(process, base + ready_path, log, timeout_s)
            yield base
        finally:
            stop_group(process)


@contextlib.contextmanager
def mlflow_app(app: str, store_uri: str, log: Path, *options: str, **env: str) -> Iterator[str]:
    """`mlflow server` or `mlflow ui` (`app`) on `store_uri`, one worker, at a free 127.0.0.1 port; yields its base
    URL and always stops it. `options` go to the command line, `env` into its environment."""
    port = free_port()
    command = [MLFLOW, app, "--backend-store-uri", store_uri, *options]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    # Job execution starts extra machinery that makes the start several times slower: off unless `env` turns it on.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"} | env
    with running(command, "/health", port, log, quiet_env(**env)) as base:
        yield base


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """`mlflow server` on a SQLite store and a local artifact folder under `root`; yields the tracking URI."""
    root.mkdir(parents=True, exist_ok=True)
    store, artifacts = f"sqlite:///{root / 'mlflow.db'}", str(root / "artifacts")
    with mlflow_app("server", store, root / "mlflow-server.log", "--artifacts-destination", artifacts) as uri:
        yield uri


@contextlib.contextmanager
def model_server(model_uri: str, root: Path, tracking_uri: str | None = None, *settings: str) -> Iterator[str]:
    """The project's REST server (pipelines/serve.py: MLflow's scoring server, guarded) of `model_uri` with the
    project's params.yaml and `settings` (`section.key=value`); yields the base URL. `tracking_uri` is where a
    models:/ or runs:/ URI is looked up."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [sys.executable, str(PROJECT / "pipelines" / "serve.py"), "--params", str(PROJECT / "params.yaml")]
    command += ["--model", model_uri, "--set", "serve.host=127.0.0.1", "--set", f"serve.port={port}"]
    command += [part for setting in settings for part in ("--set", setting)]
    env = quiet_env(**({"MLFLOW_TRACKING_URI": tracking_uri} if tracking_uri else {}))
    with running(command, "/ping", port, root / "model-server.log", env) as url:
        yield url


def listening_pid(port: int) -> int:
    """The process listening on 127.0.0.1:`port`, found through /proc (Linux): its socket's inode among the
    processes' open files."""
    inode = next(
        line.split()[9]
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
        if line.split()[1].endswith(f":{port:04X}") and line.split()[3] == "0A"  # 0A: LISTEN
    )
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd).endswith(f"[{inode}]") for fd in Path(f"/proc/{pid}/fd").iterdir()):
                return int(pid)
    raise LookupError(f"no process listens on port {port}")


def process_ticks() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, CPU ticks the process used itself (all threads), CPU ticks of its reaped children)."""
    stats = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited while we looked
            continue
        utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
        stats[int(entry)] = (int(fields[1]), utime + stime, cutime + cstime)
    return stats


def process_tree(stats: dict[int, tuple[int, int, int]], roots: set[int]) -> set[int]:
    """`roots` (those still alive) and every process below them."""
    tree = roots & stats.keys()
    frontier = list(tree)
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _, _) in stats.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier += children
    return tree


def cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of a process and of every process it started, live or ended: each live one's
    own, all threads, plus what the ones its members have waited for used (/proc/<pid>/stat)."""
    stats = process_ticks()
    return sum(sum(stats[member][1:]) for member in process_tree(stats, {pid})) / os.sysconf("SC_CLK_TCK")


def memory_mib(pid: int) -> dict[str, float]:
    """{"rss": now, "peak": the most resident memory the process has held} in MiB, from /proc/<pid>/status."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {key: int(status[field].split()[0]) / 1024 for key, field in (("rss", "VmRSS"), ("peak", "VmHWM"))}
