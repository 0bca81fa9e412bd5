"""Runs that share one machine: two trainings at once against one alone, and the REST server's latency beside a
training against alone; interleaved rounds (benchmarks/rounds.py).

A training is a fresh `python -m benchmarks.shared_machine --train CACHE --epochs E` process: the project's Trainer,
Pix2Pix and datamodule with params.yaml's settings (the demo's), validation included, no MLflow. The demo-sized
cache is made once by the data stages' own functions. "Two at once" is the wall time until both have finished;
its figure is that time over "alone" in the same round (a fair share of the cores is x2.0).
The server is the project's REST server (pipelines/serve.py) of a demo-sized model, as benchmarks.rest_load serves it;
one client sends requests one after another. "Beside a training" starts a training, waits for its first step,
sends the requests and stops the training; its figure is its p99 latency over the alone p99 of the same round.

Writes a new benchmarks/results/<date>-shared_machine.json and .png (--report names them otherwise, --out puts
them at a path of your choice).
Usage: python -m benchmarks.shared_machine [--rounds 3] [--epochs 8] [--requests 200] [--report shared_machine]
       [--out PATH]
"""

import thermal2visible.training.shared_cores  # noqa: F401  (first: sets OpenMP's spin before torch loads)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import requests  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402

from benchmarks.common import SHIPPED, add_report_option, machine_text, result_file, result_stem, synthetic_cache  # noqa: E402
from benchmarks.common import write_report  # noqa: E402
from benchmarks.inference import request_frame  # noqa: E402
from benchmarks.rest_load import served_model  # noqa: E402
from benchmarks.rounds import measure_rounds  # noqa: E402
from thermal2visible.data.datamodule import PairedDataModule  # noqa: E402
from thermal2visible.dev.servers import model_server  # noqa: E402
from thermal2visible.inference.serving import IMAGE  # noqa: E402
from thermal2visible.training.module import Pix2Pix  # noqa: E402
from thermal2visible.models.networks import build_networks
from thermal2visible.training.trainer import build_trainer, per_process_batch  # noqa: E402

ALONE, TWO, SERVE_ALONE, SERVE_BESIDE = "one training", "two trainings at once", "serving alone", "serving beside"


class FirstStep(Callback):
    """Touches `path` once the first training step has ended: the training is computing."""

    def __init__(self, path: Path):
        self.path = path

    def on_train_batch_end(self, *hook_arguments) -> None:
        if not self.path.exists():
            self.path.touch()


def train(cache: Path, epochs: int, started: Path | None) -> None:
    """One training of params.yaml's model on `cache` for `epochs` epochs, validation included."""
    settings = dataclasses.replace(SHIPPED.train, max_epochs=epochs, min_epochs=1, accelerator="cpu")
    torch.manual_seed(settings.seed)
    data = PairedDataModule(cache, per_process_batch(settings), SHIPPED.loader)
    module = Pix2Pix(
        *build_networks(SHIPPED.model, data.manifest["image_size"], data.thermal_channels, data.visible_channels),
        settings,
    )
    build_trainer(settings, callbacks=[FirstStep(started)] if started else []).fit(module, datamodule=data)


def training(cache: Path, epochs: int, started: Path | None = None) -> subprocess.Popen:
    command = [sys.executable, "-m", "benchmarks.shared_machine", "--train", str(cache), "--epochs", str(epochs)]
    return subprocess.Popen(command + (["--started", str(started)] if started else []), stdout=subprocess.DEVNULL)


def trainings_seconds(cache: Path, epochs: int, count: int) -> float:
    """Wall seconds until `count` trainings started together have all finished."""
    start = time.perf_counter()
    processes = [training(cache, epochs) for _ in range(count)]
    if any(process.wait() for process in processes):
        raise SystemExit("a training failed")
    return time.perf_counter() - start


def latencies_ms(url: str, body: dict, count: int) -> list[float]:
    """`count` requests one after another; each must be answered 200."""
    times = []
    with requests.Session() as session:
        for _ in range(count):
            start = time.perf_counter()
            response = session.post(f"{url}/invocations", json=body, timeout=120)
            times.append(1000 * (time.perf_counter() - start))
            if response.status_code != 200:
                raise SystemExit(f"HTTP {response.status_code}: {response.text[:200]}")
    return times


def serving_p99(url: str, body: dict, count: int, cache: Path | None, scratch: Path, record: list) -> float:
    """p99 ms of `count` requests, beside a training of `cache` when one is given (the training runs long enough
    to outlast them and is stopped after)."""
    neighbour = None
    if cache is not None:
        started = scratch / "started"
        started.unlink(missing_ok=True)
        neighbour = training(cache, 10_000, started)
        while not started.exists():
            if neighbour.poll() is not None:
                raise SystemExit("the training beside the server failed")
            time.sleep(0.1)
    try:
        times = latencies_ms(url, body, count)
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    record.append({"beside_training": cache is not None, "latencies_ms": [round(t, 2) for t in times]})
    return float(np.percentile(times, 99)) / 1000  # seconds: what measure_rounds keeps


def ratios(records: list[dict], config: str, baseline: str) -> dict:
    """`config`'s figure over `baseline`'s in the same round (clean rounds only, unless too few): median, min, max."""
    by_round: dict[int, dict[str, dict]] = {}
    for record in records:
        by_round.setdefault(record["round"], {})[record["config"]] = record
    clean = [row for row in by_round.values() if not any(r["flagged"] for r in row.values())]
    rows = clean if len(clean) >= 3 else list(by_round.values())
    values = [row[config]["seconds"] / row[baseline]["seconds"] for row in rows]
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "rounds": len(values),
        "flagged_rounds_counted": len(rows) > len(clean),
    }


def plot(figures: dict, serving: list[dict], path: Path) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = ["two trainings at once\n(over one alone)", "server p99 beside a training\n(over alone)"]
    for position, (key, goal) in enumerate((("two_trainings", 2.3), ("serving_p99", 3.0))):
        ratio = figures[key]
        error = [[ratio["median"] - ratio["min"]], [ratio["max"] - ratio["median"]]]
        left.bar(position, ratio["median"], yerr=error, capsize=4, color="#4c72b0")
        left.hlines(goal, position - 0.4, position + 0.4, color="#c44e52", linestyle="--")
        left.text(position, ratio["max"] + 0.05, f"x{ratio['median']:.2f}", ha="center")
    left.axhline(2.0, color="grey", linewidth=0.8)
    left.set_xticks([0, 1], names)
    left.set(ylabel="ratio (median, min-max over rounds); red: the goal", title="sharing the machine")
    for beside, colour in ((False, "#55a868"), (True, "#dd8452")):
        times = [t for r in serving if r["beside_training"] == beside for t in r["latencies_ms"]]
        right.hist(times, bins=60, alpha=0.6, color=colour, label="beside a training" if beside else "alone")
    right.set(xlabel="request latency (ms)", ylabel="requests", title="REST requests, all rounds")
    right.legend()
    figure.suptitle(machine_text(), fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=8, help="epochs of each timed training")
    parser.add_argument("--requests", type=int, default=200, help="requests per serving measurement")
    parser.add_argument("--train", type=Path, help=argparse.SUPPRESS)  # a training process of this benchmark
    parser.add_argument("--started", type=Path, help=argparse.SUPPRESS)
    add_report_option(parser, "shared_machine", "{json,png}")
    args = parser.parse_args()
    if args.train:
        return train(args.train, args.epochs, args.started)
    size = SHIPPED.preprocess.image_size
    with tempfile.TemporaryDirectory(prefix="t2v-shared-") as scratch:
        scratch = Path(scratch)
        identities, per_identity = SHIPPED.synthesize.identities, SHIPPED.synthesize.images_per_identity
        cache, _ = synthetic_cache(scratch / "data", size, identities * per_identity)
        training_records = measure_rounds(
            {
                ALONE: lambda: trainings_seconds(cache, args.epochs, 1),
                TWO: lambda: trainings_seconds(cache, args.epochs, 2),
            },
            args.rounds,
            label="training ",
        )
        body = {"dataframe_split": {"columns": [IMAGE], "data": [[request_frame(size)]]}}
        serving: list[dict] = []
        with model_server(str(served_model(scratch, size, SHIPPED.model.ngf)), scratch / "serve") as url:
            latencies_ms(url, body, 10)  # the first requests load onnxruntime's kernels
            serving_records = measure_rounds(
                {
                    SERVE_ALONE: lambda: serving_p99(url, body, args.requests, None, scratch, serving),
                    SERVE_BESIDE: lambda: serving_p99(url, body, args.requests, cache, scratch, serving),
                },
                args.rounds,
                label="serving ",
            )
    figures = {
        "two_trainings": ratios(training_records, TWO, ALONE),
        "serving_p99": ratios(serving_records, SERVE_BESIDE, SERVE_ALONE),
        "goals": {"two_trainings": 2.3, "serving_p99": 3.0},
        "epochs": args.epochs,
        "requests": args.requests,
        "model": {"size": size, "ngf": SHIPPED.model.ngf, "batch_size": SHIPPED.train.batch_size},
        "rounds": training_records + serving_records,
        "serving_latencies": serving,
    }
    stem = result_stem(args.report, args.out)
    plot(figures, serving, result_file(stem, ".png"))
    write_report(stem, figures)
    print(json.dumps({key: figures[key] for key in ("two_trainings", "serving_p99")}, indent=1))
    print(f"{machine_text()}; wrote {stem}.json and .png")


if __name__ == "__main__":
    main()
