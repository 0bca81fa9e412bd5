"""A training on a machine that is doing something else: alone, beside one and two busy processes that are not the
project's, beside the REST server answering the README's 8-client load, and two trainings of two projects at once;
images/s of the training and the REST p99 in each, in interleaved rounds (benchmarks/rounds.py).

A training is a fresh `python -m benchmarks.shared_machine --train CACHE --epochs E` process: the project's Trainer,
Pix2Pix and datamodule with params.yaml's settings (the demo's), validation included, no MLflow; `--threads` sets its
train.threads (default: params.yaml's `cores`, a thread per core whatever else runs; `auto` follows the free cores).
A busy process is a pure-Python loop in a session of its own, as an IDE's indexer or a build would be. The
server is the project's REST server (pipelines/serve.py) of a demo-sized model, as benchmarks.rest_load serves it, with
8 clients sending requests one after another each. "Two projects" trains two caches made apart, as two projects'
folders would hold them, started together; its time is until both have finished. Each configuration's figure is its
time over the time alone in the same round (a fair share of two cores is x2.0 beside one busy process or another
training), and the REST p99 beside the training over the p99 of the same load alone, in the same round.

Writes a new benchmarks/results/<date>-shared_machine.json and .png (--report names them otherwise, --out puts
them at a path of your choice). --smoke: one round of everything at a tiny size, to check the benchmark runs.
Usage: python -m benchmarks.shared_machine [--rounds 3] [--epochs 8] [--requests 25] [--threads auto] [--smoke]
       [--report NAME] [--out PATH]
"""

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

from benchmarks.common import SHIPPED, add_report_option, machine_text, publish, result_stem, synthetic_cache
from benchmarks.inference import request_frame
from benchmarks.rest_load import client, served_model
from benchmarks.rounds import measure_rounds
from thermal2visible.data.datamodule import PairedDataModule
from tests.support.servers import model_server
from thermal2visible.inference.serving import IMAGE
from thermal2visible.models.networks import build_networks
from thermal2visible.training.module import Pix2Pix
from thermal2visible.training.trainer import build_trainer, per_process_batch

ALONE, BUSY_1, BUSY_2, REST, PROJECTS = (
    "alone",
    "beside 1 busy process",
    "beside 2 busy processes",
    "beside the REST load",
    "two projects at once",
)
REST_ALONE = "REST load alone"
GOALS = {BUSY_1: 2.2, BUSY_2: None, REST: 2.2, PROJECTS: 2.3, "rest_p99": 3.0}
CLIENTS = 8  # the README's load (docs/performance.md: 8 concurrent clients)


def train(cache: Path, epochs: int, threads: str) -> None:
    """One training of params.yaml's model on `cache` for `epochs` epochs with train.threads `threads`, validation
    included."""
    settings = dataclasses.replace(
        SHIPPED.train, max_epochs=epochs, min_epochs=1, accelerator="cpu", threads=threads_setting(threads)
    )
    torch.manual_seed(settings.seed)
    data = PairedDataModule(cache, per_process_batch(settings), SHIPPED.loader)
    module = Pix2Pix(
        *build_networks(SHIPPED.model, data.manifest["image_size"], data.thermal_channels, data.visible_channels),
        settings,
    )
    build_trainer(settings).fit(module, datamodule=data)


def threads_setting(text: str) -> str | int:
    return int(text) if text.isdigit() else text


def trainings_seconds(caches: list[Path], epochs: int, threads: str) -> float:
    """Wall seconds until a training of each of `caches` (train.threads `threads`), started together, has finished."""
    start = time.perf_counter()
    command = [sys.executable, "-m", "benchmarks.shared_machine", "--epochs", str(epochs), "--threads", threads]
    command += ["--train"]
    processes = [subprocess.Popen([*command, str(cache)], stdout=subprocess.DEVNULL) for cache in caches]
    if any(process.wait() for process in processes):
        raise SystemExit("a training failed")
    return time.perf_counter() - start


@contextmanager
def busy_processes(count: int):
    """`count` pure-Python loops, each in a session of its own (another program's, to the kernel's scheduler)."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


class RestLoad:
    """CLIENTS clients sending requests one after another to `url`, from start() to stop(); p99 of their latencies."""

    def __init__(self, url: str, body: dict):
        self.url, self.body = url, body

    def start(self) -> None:
        self.done, self.results = threading.Event(), []
        self.pool = ThreadPoolExecutor(CLIENTS)
        self.clients = [self.pool.submit(self.client) for _ in range(CLIENTS)]

    def client(self) -> None:
        while not self.done.is_set():
            self.results.extend(client(self.url, self.body, 1))

    def stop(self) -> float:
        """The p99 latency in seconds; every request must have been answered 200."""
        self.done.set()
        for future in self.clients:
            future.result()
        self.pool.shutdown()
        errors = [error for _, error in self.results if error]
        if errors:
            raise SystemExit(f"{len(errors)} REST requests failed: {errors[0]}")
        return float(np.percentile([seconds for seconds, _ in self.results], 99))


def rest_alone(load: RestLoad, requests: int) -> float:
    """p99 seconds of CLIENTS x `requests` requests with nothing else running."""
    load.start()
    while len(load.results) < CLIENTS * requests:
        time.sleep(0.05)
    return load.stop()


def beside_rest(load: RestLoad, cache: Path, epochs: int, threads: str, p99s: list[float]) -> float:
    load.start()
    try:
        seconds = trainings_seconds([cache], epochs, threads)
    finally:
        p99s.append(load.stop())
    return seconds


def beside_busy(count: int, cache: Path, epochs: int, threads: str) -> float:
    with busy_processes(count):
        return trainings_seconds([cache], epochs, threads)


def by_round(records: list[dict]) -> list[dict[str, dict]]:
    rounds: dict[int, dict[str, dict]] = {}
    for record in records:
        rounds.setdefault(record["round"], {})[record["config"]] = record
    return [rounds[index] for index in sorted(rounds)]


def spread(values: list[float]) -> dict:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "rounds": len(values),
    }


def figures_of(records: list[dict], p99s_beside: list[float], images: int) -> dict:
    """Per configuration: images/s (median) and its time over alone in the same round (median, min-max); the REST
    p99 beside the training over alone in the same round. Flagged rounds are kept and counted: the configurations'
    own load is this benchmark's, so a flag means someone else's."""
    rounds = by_round(records)
    trainings = {}
    for config in (ALONE, BUSY_1, BUSY_2, REST, PROJECTS):
        trained = images * (2 if config == PROJECTS else 1)
        trainings[config] = {
            "images_per_s": round(statistics.median(trained / r[config]["seconds"] for r in rounds), 2),
            "time_over_alone": spread([r[config]["seconds"] / r[ALONE]["seconds"] for r in rounds]),
            "goal": GOALS.get(config),
        }
    rest = [beside / r[REST_ALONE]["seconds"] for beside, r in zip(p99s_beside, rounds)]
    return {
        "trainings": trainings,
        "rest_p99_ms": {
            "alone": round(1000 * statistics.median(r[REST_ALONE]["seconds"] for r in rounds), 1),
            "beside_training": round(1000 * statistics.median(p99s_beside), 1),
            "beside_over_alone": spread(rest),
            "goal": GOALS["rest_p99"],
        },
        "flagged_rounds": sum(any(record["flagged"] for record in r.values()) for r in rounds),
    }


def plot(figures: dict, path: Path) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 1]})
    configs = [config for config in figures["trainings"] if config != ALONE]
    bars = [figures["trainings"][config]["time_over_alone"] for config in configs]
    bars.append(figures["rest_p99_ms"]["beside_over_alone"])
    goals = [figures["trainings"][config]["goal"] for config in configs] + [figures["rest_p99_ms"]["goal"]]
    names = [config.replace(" ", "\n", 1) for config in configs] + ["REST p99\nbeside training"]
    for position, (ratio, goal) in enumerate(zip(bars, goals)):
        error = [[ratio["median"] - ratio["min"]], [ratio["max"] - ratio["median"]]]
        left.bar(position, ratio["median"], yerr=error, capsize=4, color="#4c72b0")
        if goal:
            left.hlines(goal, position - 0.4, position + 0.4, color="#c44e52", linestyle="--")
        left.text(position, ratio["max"] + 0.05, f"x{ratio['median']:.2f}", ha="center")
    left.axhline(2.0, color="grey", linewidth=0.8)
    left.set_xticks(range(len(names)), names, fontsize=8)
    left.set(ylabel="over alone (median, min-max of rounds); red: the goal", title="sharing the machine")
    speeds = {config: values["images_per_s"] for config, values in figures["trainings"].items()}
    right.barh(list(speeds), list(speeds.values()), color="#55a868")
    right.invert_yaxis()
    right.set(xlabel="images/s (all trainings together)", title="training speed")
    figure.suptitle(machine_text(), fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=8, help="epochs of each timed training")
    parser.add_argument("--requests", type=int, default=25, help="requests per client of the REST load alone")
    parser.add_argument(
        "--threads", default=str(SHIPPED.train.threads), help="the trainings' train.threads: cores, auto or a count"
    )
    parser.add_argument("--smoke", action="store_true", help="one round, one epoch, tiny data: does it run")
    parser.add_argument("--train", type=Path, help=argparse.SUPPRESS)  # a training process of this benchmark
    add_report_option(parser, "shared_machine", "{json,png}")
    args = parser.parse_args()
    if args.train:
        return train(args.train, args.epochs, args.threads)
    size, warmup = SHIPPED.preprocess.image_size, 1
    pairs = SHIPPED.synthesize.identities * SHIPPED.synthesize.images_per_identity  # the demo's
    if args.smoke:
        args.rounds, args.epochs, args.requests, size, pairs, warmup = 1, 1, 2, 32, 24, 0
    with tempfile.TemporaryDirectory(prefix="t2v-shared-") as scratch:
        scratch = Path(scratch)
        caches = [synthetic_cache(scratch / project, size, pairs)[0] for project in ("project-a", "project-b")]
        images = json.loads((caches[0] / "manifest.json").read_text())["counts"]["train"] * args.epochs
        body = {"dataframe_split": {"columns": [IMAGE], "data": [[request_frame(size)]]}}
        p99s_beside: list[float] = []
        served = served_model(scratch, size, SHIPPED.model.generator_settings["ngf"])
        with model_server(str(served), scratch / "serve") as url:
            load = RestLoad(url, body)
            records = measure_rounds(
                {
                    ALONE: lambda: trainings_seconds(caches[:1], args.epochs, args.threads),
                    BUSY_1: lambda: beside_busy(1, caches[0], args.epochs, args.threads),
                    BUSY_2: lambda: beside_busy(2, caches[0], args.epochs, args.threads),
                    REST: lambda: beside_rest(load, caches[0], args.epochs, args.threads, p99s_beside),
                    PROJECTS: lambda: trainings_seconds(caches, args.epochs, args.threads),
                    REST_ALONE: lambda: rest_alone(load, args.requests),
                },
                args.rounds,
                warmup_rounds=warmup,
            )
    figures = figures_of(records, p99s_beside[warmup:], images) | {
        "epochs": args.epochs,
        "images_per_training": images,
        "clients": CLIENTS,
        "model": {"size": size, "ngf": SHIPPED.model.generator_settings["ngf"], "batch_size": SHIPPED.train.batch_size},
        "threads": threads_setting(args.threads),
        "rounds": records,
    }
    publish(result_stem(args.report, args.out), figures, plot, ("trainings", "rest_p99_ms"))


if __name__ == "__main__":
    main()
