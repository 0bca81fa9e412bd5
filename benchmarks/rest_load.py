"""Bounded load test of REST serving: C concurrent clients x N requests each against the real REST server
on 127.0.0.1, one 16-bit thermal frame (PNG, RAW_SIDE x the model side) per request. Zero errors required.

Each --workers value (serve.workers: the request worker processes; 0: one per core) gets a fresh server per round,
in interleaved rounds (benchmarks/rounds.py) after a warm-up round: requests/s of each against the first value, as
median ratio and spread; latencies from each one's median round.

The served model is the project's pyfunc around a freshly initialised generator of the demo's size (speed does not
depend on the weights), exported by the project's own code. Latency is measured by each client around its whole
request; throughput is answered requests over the wall time of the test.

Writes a new benchmarks/results/<date>-load.json and .png (latency histograms; --report names them otherwise, --out
puts them at a path of your choice); exits 1 if any request failed.
Usage: python -m benchmarks.rest_load [--clients 8] [--requests 200] [--workers 1 0] [--rounds 3] [--size 64]
       [--ngf 32] [--report load] [--out PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import numpy as np  # noqa: E402
import requests  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import SHIPPED, add_report_option, result_file, result_stem, write_report  # noqa: E402
from benchmarks.rounds import measure_rounds, ratio_text, summarize  # noqa: E402
from benchmarks.inference import request_frame  # noqa: E402  (the frame the inference benchmark sends)
from thermal2visible.models.payloads import load_generator, save_generator  # noqa: E402
from thermal2visible.onnx_export import export_generator  # noqa: E402
from thermal2visible.models.generator import ConvSettings  # noqa: E402
from thermal2visible.models.generators.unet import UNetGenerator  # noqa: E402
from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.inference.serving import IMAGE  # noqa: E402
from thermal2visible.registry.packing import pyfunc_arguments  # noqa: E402

from tests.support.servers import model_server  # noqa: E402


def served_model(folder: Path, size: int, ngf: int) -> Path:
    """A pyfunc folder (what `register` logs) around a fresh generator of side `size` and width `ngf`."""
    torch.manual_seed(0)
    save_generator(
        UNetGenerator(1, 3, size, ConvSettings(**SHIPPED.model.generator_settings | {"ngf": ngf})),
        folder / "generator.pt",
        "eval",
        preprocess=dataclasses.asdict(dataclasses.replace(SHIPPED.preprocess, image_size=size)),
    )
    generator, payload = load_generator(folder / "generator.pt")
    # thermal_dtype: the kind of frame the clients send (16-bit PNGs)
    export_generator(generator, payload, folder / "generator.onnx", opset=18, thermal_dtype="uint16")
    with pyfunc_arguments(folder / "generator.onnx", ServedLimits.of(SHIPPED.serve)) as arguments:
        mlflow.pyfunc.save_model(str(folder / "pyfunc"), **arguments)
    return folder / "pyfunc"


def client(url: str, body: dict, count: int) -> list[tuple[float, str | None]]:
    """`count` requests one after the other: (seconds, None) for each answered 200, else (seconds, what went wrong)."""
    results = []
    with requests.Session() as session:
        for _ in range(count):
            start = time.perf_counter()
            try:
                response = session.post(f"{url}/invocations", json=body, timeout=120)
                error = None if response.status_code == 200 else f"HTTP {response.status_code}: {response.text[:200]}"
            except requests.RequestException as failure:
                error = f"{type(failure).__name__}: {failure}"
            results.append((time.perf_counter() - start, error))
    return results


def load(url: str, body: dict, clients: int, count: int) -> dict:
    client(url, body, 3)  # warm-up: first requests load onnxruntime's kernels
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [r for batch in pool.map(lambda _: client(url, body, count), range(clients)) for r in batch]
    wall = time.perf_counter() - started
    latencies = [1000 * seconds for seconds, error in results if error is None]
    errors = [error for _, error in results if error is not None]
    return {
        "clients": clients,
        "requests_per_client": count,
        "requests": len(results),
        "errors": len(errors),
        "first_errors": errors[:5],
        "wall_s": round(wall, 2),
        "throughput_rps": round(len(latencies) / wall, 2),
        "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
        "p99_ms": round(float(np.percentile(latencies, 99)), 1) if latencies else None,
        "max_ms": round(max(latencies), 1) if latencies else None,
        "latencies_ms": [round(value, 2) for value in latencies],
    }


def plot(configs: dict[str, dict], path: Path) -> None:
    figure, axes = plt.subplots(figsize=(7, 4))
    for (name, figures), color in zip(configs.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        label = f"{name}: {figures['throughput_rps']:.1f} requests/s, p99 {figures['p99_ms']:.0f} ms"
        axes.hist(figures["latencies_ms"], bins=50, color=color, alpha=0.6, label=label)
    first = next(iter(configs.values()))
    axes.set(
        xlabel="latency per request (ms)",
        ylabel="requests",
        title=f"{first['clients']} clients x {first['requests_per_client']} requests (each one's median round)",
    )
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=200, help="requests per client")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1, 0], help="serve.workers values; 0: one per core (the default)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    parser.add_argument(
        "--size",
        type=int,
        default=SHIPPED.preprocess.image_size,
        help="model side (default: params.yaml preprocess.image_size)",
    )
    parser.add_argument(
        "--ngf",
        type=int,
        default=SHIPPED.model.generator_settings["ngf"],
        help="generator width (default: params.yaml model.generator_settings.ngf)",
    )
    add_report_option(parser, "load", "{json,png}")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="t2v-load-") as scratch:
        scratch = Path(scratch)
        model = served_model(scratch, args.size, args.ngf)
        body = {"dataframe_split": {"columns": [IMAGE], "data": [[request_frame(args.size)]]}}

        def serve_and_load(workers: int, name: str) -> float:
            with model_server(str(model), scratch / "serve", None, f"serve.workers={workers}") as url:
                figures = load(url, body, args.clients, args.requests)
            runs.setdefault(name, []).append(figures)
            return figures["wall_s"]  # the same requests for every config: seconds compare as requests/s

        names = {n: "1 worker" if n == 1 else f"{n or 'one per core'} workers" for n in args.workers}
        measurements = {name: (lambda w=workers, n=name: serve_and_load(w, n)) for workers, name in names.items()}
        records = measure_rounds(measurements, args.rounds)
    summary = summarize(records, baseline=names[args.workers[0]])
    configs = {}
    for name, timed in runs.items():
        timed = timed[-args.rounds :]  # the warm-up round's run is left out
        configs[name] = sorted(timed, key=lambda figures: figures["wall_s"])[len(timed) // 2]
        configs[name]["errors_all_rounds"] = sum(figures["errors"] for figures in timed)
    errors = sum(figures["errors"] for timed in runs.values() for figures in timed)
    report = {
        "model": {"size": args.size, "ngf": args.ngf},
        "server": "pipelines/serve.py (MLflow's scoring app behind the project's edge), requests in worker processes",
        "configs": configs,
        "summary": summary,
        "errors": errors,
    }
    stem = result_stem(args.report, args.out)
    if all(figures["p50_ms"] is not None for figures in configs.values()):  # at least one request answered each
        plot(configs, result_file(stem, ".png"))
    write_report(stem, report)
    for name, figures in configs.items():
        print(
            f"{name}: {figures['requests']} requests from {args.clients} clients in {figures['wall_s']} s: "
            f"{figures['throughput_rps']} requests/s, p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms; "
            f"{ratio_text(summary['configs'][name])} the requests/s of {summary['baseline']}"
        )
        for error in figures["first_errors"]:
            print(f"  {error}", file=sys.stderr)
    print(f"{errors} errors in all rounds; wrote {stem}.json and .png")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
