"""What the costliest requests inside params.yaml's serve limits cost a real server (pipelines/serve.py on 127.0.0.1),
whether small requests are still answered while the costliest one runs, and whether a request the server has answered
504 leaves work running.

Each case runs against a fresh server (its memory peak is its own): the CPU-seconds of the server process itself and
of it with every process it started (its request workers, /proc) over the request, the server process's
resident-memory peak above the idle server and the largest peak of a request worker (each bounded by
serve.worker_memory_mib): the server process only moves bytes, the workers do the work. Beside the costliest case,
one client sends a small frame after another: their latencies (p50, p99) are what a user waits while it runs.

The cases are the limits' corners: the most rows of the most pixels, one image of max_pixels, and the most model work
(thin frames at max_model_pixels each). Then, with MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT at --timeout seconds, the
costliest case again: the server's CPU use in the second after its 504 (from 1 s after the answer) must be idle.

The served model is the project's pyfunc around a freshly initialised generator of the demo's size (cost does not
depend on the weights). Writes benchmarks/results/<date>-request_budget.json and .md; exits 1 when a case costs more
than serve.max_request_cpu_seconds plus one step's overshoot (--slack) or the server is not idle after a 504.
Usage: python -m benchmarks.request_budget [--rounds 2] [--timeout 5] [--slack 2.0]
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import sys
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import requests
from PIL import Image

from benchmarks.common import SHIPPED, add_report_option, markdown_table, result_file, result_stem, write_report
from benchmarks.rest_load import served_model
from tests.support.servers import (
    cpu_seconds,
    listening_pid,
    memory_mib,
    model_server,
    process_ticks,
    process_tree,
)
from thermal2visible.inference.serving import IMAGE

LIMITS = SHIPPED.serve


def png(height: int, width: int, seed: int) -> str:
    """A 16-bit grey gradient frame (a camera's kind; small as a PNG at any size), base64."""
    frame = (np.add.outer(np.arange(height), np.arange(width)) * 3 + 1000 * seed).astype(np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def cases(size: int) -> dict[str, list[str]]:
    """The corners of the limits, each inside all of them."""
    rows, total, one = LIMITS.max_rows, LIMITS.max_request_pixels, LIMITS.max_pixels
    side = int((total / rows) ** 0.5)
    thin_length = LIMITS.max_model_pixels // size  # a size-px-high strip runs through the model at size x this
    thin_rows = min(rows, total // (size * thin_length))
    square = int(one**0.5)
    return {
        f"{rows} rows of {side}x{side}": [png(side, side, seed) for seed in range(rows)],
        f"1 row of {square}x{square}": [png(square, square, 0)],
        f"{thin_rows} rows of {thin_length}x{size} (max_model_pixels each)": [
            png(size, thin_length, seed) for seed in range(thin_rows)
        ],
    }


def invoke(url: str, images: list[str]) -> requests.Response:
    return requests.post(f"{url}/invocations", json={"inputs": {IMAGE: images}}, timeout=600)


def measure(url: str, images: list[str]) -> dict:
    pid = listening_pid(int(url.rsplit(":", 1)[1]))
    idle, before, started = memory_mib(pid)["rss"], cpu_seconds(pid), time.perf_counter()
    own_before = process_ticks()[pid][1]
    response = invoke(url, images)
    wall, cpu = time.perf_counter() - started, cpu_seconds(pid) - before
    own = (process_ticks()[pid][1] - own_before) / os.sysconf("SC_CLK_TCK")
    workers = [memory_mib(worker)["peak"] for worker in process_tree(process_ticks(), {pid}) - {pid}]
    return {
        "status": response.status_code,
        "message": "" if response.ok else response.json().get("message", response.text)[:160],
        "reply_bytes": len(response.content),
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "server_cpu_s": round(own, 2),
        "peak_mib_over_idle": round(memory_mib(pid)["peak"] - idle, 1),
        "worker_peak_mib": round(max(workers, default=0.0), 1),
    }


def small_beside(url: str, images: list[str], small: list[str]) -> dict:
    """Latencies of small requests sent one after another while `images` is answered (a second client)."""
    costly = threading.Thread(target=invoke, args=(url, images))
    latencies, errors = [], 0
    costly.start()
    while costly.is_alive():
        started = time.perf_counter()
        errors += not invoke(url, small).ok
        latencies.append(time.perf_counter() - started)
    costly.join()
    ordered = sorted(latencies)
    return {
        "requests": len(ordered),
        "errors": errors,
        "p50_s": round(statistics.median(ordered), 3),
        "p99_s": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
    }


def after_timeout(model: Path, images: list[str], timeout: int, scratch: Path) -> dict:
    os.environ["MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT"] = str(timeout)
    try:
        with model_server(str(model), scratch / "serve-timeout") as url:
            pid = listening_pid(int(url.rsplit(":", 1)[1]))
            response = invoke(url, images)
            time.sleep(1.0)
            before = cpu_seconds(pid)
            time.sleep(1.0)
            return {"status": response.status_code, "cpu_s_in_second_after": round(cpu_seconds(pid) - before, 3)}
    finally:
        del os.environ["MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="requests per case (the costliest is reported)")
    parser.add_argument("--timeout", type=int, default=5, help="the server's request timeout for the 504 check (s)")
    parser.add_argument("--slack", type=float, default=2.0, help="CPU-seconds one step may run past the budget")
    add_report_option(parser, "request_budget", "{json,md}")
    args = parser.parse_args()
    size = SHIPPED.preprocess.image_size
    results = {}
    with tempfile.TemporaryDirectory(prefix="t2v-budget-") as scratch:
        scratch = Path(scratch)
        model = served_model(scratch, size, SHIPPED.model.generator_settings["ngf"])
        corners = cases(size)
        for name, images in corners.items():
            with model_server(str(model), scratch / "serve") as url:
                runs = [measure(url, images) for _ in range(args.rounds)]
            results[name] = max(runs, key=lambda run: run["cpu_s"])
            print(f"{name}: {results[name]}", flush=True)
        costliest = max(results, key=lambda name: results[name]["cpu_s"])
        with model_server(str(model), scratch / "serve") as url:
            beside = small_beside(url, corners[costliest], [png(size, size, 0)])
        print(f"small requests beside {costliest}: {beside}", flush=True)
        abandoned = after_timeout(model, corners[costliest], args.timeout, scratch)
    budget = LIMITS.max_request_cpu_seconds
    rows = [
        [name, r["status"], r["wall_s"], r["cpu_s"], r["server_cpu_s"], r["peak_mib_over_idle"], r["worker_peak_mib"],
         r["reply_bytes"], r["message"]]
        for name, r in results.items()
    ]  # fmt: skip
    headers = ["request", "status", "wall s", "CPU s (all)", "CPU s (server process)", "server peak MiB"]
    headers += ["worker peak MiB", "reply bytes", "message"]
    table = markdown_table(headers, rows)
    worst_cpu = max(r["cpu_s"] for r in results.values())
    worst_mib = max(r["peak_mib_over_idle"] for r in results.values())
    worst_own = max(r["server_cpu_s"] for r in results.values())
    summary = (
        f"budget {budget} CPU-s (serve.max_request_cpu_seconds): worst request {worst_cpu} CPU-s, of them "
        f"{worst_own} in the server process, {worst_mib} MiB over the idle server; small requests beside "
        f"{costliest}: p50 {beside['p50_s']} s, "
        f"p99 {beside['p99_s']} s ({beside['requests']} requests, {beside['errors']} errors); after a "
        f"{args.timeout} s timeout (the same request): HTTP "
        f"{abandoned['status']}, then {abandoned['cpu_s_in_second_after']} CPU-s in the second after"
    )
    print(table + "\n\n" + summary)
    stem = result_stem(args.report, args.out)
    result_file(stem, ".md").write_text(f"# Request budget\n\n{table}\n\n{summary}\n")
    figures = {"limits": LIMITS.__dict__, "cases": results, "small_beside_costliest": beside}
    figures |= {"after_timeout": abandoned, "summary": summary}
    print(f"wrote {write_report(stem, figures)}")
    within = worst_cpu <= budget + args.slack and abandoned["status"] == 504 and not beside["errors"]
    sys.exit(0 if within and abandoned["cpu_s_in_second_after"] < 0.1 else 1)


if __name__ == "__main__":
    main()
