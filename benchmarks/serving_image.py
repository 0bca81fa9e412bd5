"""The serving image against `make serve` on the same machine: the image's size, its start-up (from `docker run` to
the first answered /ping) against make serve's, and C clients x N requests (the README's 8 x 200) through make serve,
one container (`make image`) and R replicas behind the load balancer (`make serve-replicas`), in interleaved rounds
after a warm-up round (benchmarks/rounds.py): requests/s of each against make serve, as median ratio and spread.

Run from a project where `make demo` has run: it serves that project's champion, sends the README's frame, and
builds the image with the project's own command. Writes a new benchmarks/results/<date>-serving-image.json (--report
names it otherwise, --out puts it at a path of your choice); exits 1 if any request failed.
Usage: python -m benchmarks.serving_image [--clients 8] [--requests 200] [--replicas 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import add_report_option, result_stem, write_report
from benchmarks.rest_load import load
from benchmarks.rounds import measure_rounds, ratio_text, summarize
from tests.support.containers import build_image, container, docker_missing, replicas
from tests.support.servers import model_server
from thermal2visible.inference.serving import IMAGE

FRAME = Path("data/raw/thermal/person_00/000.png")  # the README's client example
REGISTERED = Path("reports/registered.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=200, help="requests per client")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    add_report_option(parser, "serving-image", "json")
    args = parser.parse_args()
    if reason := docker_missing():
        sys.exit(f"the serving image cannot be built here: {reason}")
    if not REGISTERED.exists() or not FRAME.exists():
        sys.exit(f"no {REGISTERED} or {FRAME}: run `make demo` first, and this from the project folder")
    tag = build_image(Path.cwd())
    inspect = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", tag], capture_output=True, text=True)
    size_mb = int(inspect.stdout) / 1e6
    champion = f"models:/{json.loads(REGISTERED.read_text())['model_name']}@champion"
    body = {"dataframe_split": {"columns": [IMAGE], "data": [[base64.b64encode(FRAME.read_bytes()).decode()]]}}
    runs: dict[str, list[dict]] = {}
    startups: dict[str, list[float]] = {}

    with tempfile.TemporaryDirectory(prefix="t2v-image-") as scratch:
        scratch = Path(scratch)
        servers = {
            "make serve": lambda: model_server(champion, scratch / "serve", f"sqlite:///{Path.cwd() / 'mlflow.db'}"),
            "1 container": lambda: container(tag, scratch / "container.log"),
            f"{args.replicas} replicas": lambda: _url_only(replicas(Path.cwd(), args.replicas)),
        }

        def start_and_load(name: str) -> float:
            started = time.perf_counter()
            with servers[name]() as url:
                startups.setdefault(name, []).append(time.perf_counter() - started)
                figures = load(url, body, args.clients, args.requests)
                figures["container_memory"] = container_memory(tag)
            runs.setdefault(name, []).append(figures)
            return figures["wall_s"]  # the same requests for every config: seconds compare as requests/s

        measurements = {name: (lambda n=name: start_and_load(n)) for name in servers}
        records = measure_rounds(measurements, args.rounds, also_ours=container_engine)
    summary = summarize(records, baseline="make serve")
    configs = {}
    for name, timed in runs.items():
        timed = timed[-args.rounds :]  # the warm-up round's run is left out
        configs[name] = sorted(timed, key=lambda figures: figures["wall_s"])[len(timed) // 2]
        configs[name] |= {
            "startup_s_median": round(statistics.median(startups[name][-args.rounds :]), 2),
            "startup_s_all": [round(value, 2) for value in startups[name]],
            "errors_all_rounds": sum(figures["errors"] for figures in timed),
        }
        del configs[name]["latencies_ms"]
    errors = sum(figures["errors"] for timed in runs.values() for figures in timed)
    report = {"image": tag, "image_size_mb": round(size_mb, 1), "configs": configs, "summary": summary}
    report["errors"] = errors
    stem = result_stem(args.report, args.out)
    write_report(stem, report)
    print(f"image {tag}: {size_mb:.0f} MB")
    for name, figures in configs.items():
        print(
            f"{name}: ready in {figures['startup_s_median']} s; {figures['requests']} requests from {args.clients} "
            f"clients: {figures['throughput_rps']} requests/s, p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms; "
            f"{ratio_text(summary['configs'][name])} the requests/s of make serve"
        )
    print(f"{errors} errors in all rounds; wrote {stem}.json")
    sys.exit(1 if errors else 0)


def container_engine() -> set[int]:
    """The Docker daemon's processes: containerd's shims (parents of the containers' processes, re-parented to init),
    the daemons and the port proxies work for the benchmark outside its process tree."""
    engine = set()
    for comm in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):
            name = comm.read_text().strip()
            if name in ("dockerd", "containerd", "docker-proxy") or name.startswith("containerd-shim"):
                engine.add(int(comm.parent.name))
    return engine


def container_memory(tag: str) -> list[str]:
    """Memory in use by each running container of image `tag` (Docker's count: its cgroup's), after the load."""
    running = subprocess.run(["docker", "ps", "-q", "--filter", f"ancestor={tag}"], capture_output=True, text=True)
    if not running.stdout.split():
        return []
    stats = ["docker", "stats", "--no-stream", "--format", "{{.MemUsage}}", *running.stdout.split()]
    return subprocess.run(stats, capture_output=True, text=True).stdout.split("\n")[:-1]


@contextlib.contextmanager
def _url_only(running):
    with running as (url, _):
        yield url


if __name__ == "__main__":
    main()
