"""Loader throughput (images/s, jitter included): the cached datamodule, with and without preload, against a
loader that decodes, preprocesses and jitters the raw images every epoch; all on one core (1 torch thread).
The preloaded path is also measured without the jitter, and profiled. The cache holds the training images at the
jitter side (preprocess) and jitters by cropping; the decode path must resample every image every epoch.
The loaders are compared in interleaved rounds (benchmarks/rounds.py): seconds per image, each loader once a round.

Needs the demo data (`dvc repro preprocess`, or pipelines/synthesize.py, ingest.py, preprocess.py in turn).
Prints the figures and writes a new benchmarks/results/<date>-loader.json and .png (--report names them otherwise,
--out puts them at a path of your choice).
Usage: python -m benchmarks.loader [--rounds 3] [--report loader] [--out PATH]
"""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from benchmarks.common import (
    add_report_option,
    decoded_batch,
    machine_text,
    profile_summary,
    result_file,
    result_stem,
    write_report,
)
from benchmarks.rounds import measure_rounds, plot_speedups, ratio_text, summarize
from thermal2visible.errors import PipelineError
from thermal2visible.config.load import load_params
from thermal2visible.data.cache import load_manifest
from thermal2visible.data.datamodule import PairedDataModule
from thermal2visible.data.dataset import model_batch
from thermal2visible.data.ingest import read_pair
from thermal2visible.data.preprocess import prepare_thermal, prepare_visible
from thermal2visible.paths import CACHE, INDEX, PARAMS

EPOCHS = {"decode every epoch": 1, "cache, preload off": 10, "cache, preloaded": 10, "cache, preloaded, no jitter": 10}


def seconds_per_image(epoch, epochs: int) -> float:
    start = time.perf_counter()
    images = sum(len(batch["thermal"]) for _ in range(epochs) for batch in epoch())
    return (time.perf_counter() - start) / images


def decoding_epoch(params, batch_size: int):
    """Batches as a loader without a cache makes them: read, decode, preprocess and jitter every training pair."""
    index, manifest = json.loads(INDEX.read_text()), load_manifest(CACHE)
    train = [source for source in manifest["sources"] if source["split"] == "train"]
    root, layout, settings, scale = (
        Path(index["root"]),
        index["layout"],
        params.preprocess,
        params.preprocess.jitter_scale,
    )
    rng = np.random.default_rng(0)

    def epoch():
        order = rng.permutation(len(train))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            rows = order[start : start + batch_size]
            raw = [read_pair(root, train[i], layout, params.ingest.max_pixels) for i in rows]
            yield decoded_batch(
                [(prepare_thermal(t, settings), prepare_visible(v, t, settings)) for t, v in raw], scale
            )

    return epoch


def cached_epoch(params, batch_size: int, preload: bool, jitter: bool = True):
    module = PairedDataModule(CACHE, batch_size, dataclasses.replace(params.loader, preload=preload, jitter=jitter))
    module.setup("fit")
    return lambda: (model_batch(batch) for batch in module.train_dataloader())


def profile_epochs(epoch, epochs: int) -> list[dict]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        for _ in range(epochs):
            for _ in epoch():
                pass
    return profile_summary(profile, top=6)


def main() -> None:
    # A batch of small images is too little work to split over threads; with other processes on the cores, the
    # threads mostly wait for each other.
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    add_report_option(parser, "loader", "{json,png}")
    args = parser.parse_args()
    params = load_params(PARAMS)
    if not INDEX.is_file():
        raise PipelineError(f"{INDEX}: missing; make the demo data first (dvc repro preprocess)")
    batch_size, manifest = params.train.batch_size, load_manifest(CACHE)
    loaders = {
        "decode every epoch": decoding_epoch(params, batch_size),
        "cache, preload off": cached_epoch(params, batch_size, preload=False),
        "cache, preloaded": cached_epoch(params, batch_size, preload=True),
        "cache, preloaded, no jitter": cached_epoch(params, batch_size, preload=True, jitter=False),
    }
    records = measure_rounds(
        {
            name: (lambda epoch=epoch, name=name: seconds_per_image(epoch, EPOCHS[name]))
            for name, epoch in loaders.items()
        },
        args.rounds,
    )
    summary = summarize(records, baseline="decode every epoch")
    rates = {name: 1 / figures["median_s"] for name, figures in summary["configs"].items()}
    print(
        f"{manifest['counts']['train']} training pairs of {manifest['image_size']}px, batch {batch_size}, "
        f"jitter on; {machine_text()}"
    )
    for name, figures in summary["configs"].items():
        print(f"  {name:28s} {rates[name]:10.0f} images/s   {ratio_text(figures)}")
    profile = profile_epochs(loaders["cache, preloaded"], EPOCHS["cache, preloaded"])
    print(
        "  where the preloaded path's time goes: " + ", ".join(f"{row['op']} {row['share']:.0%}" for row in profile[:3])
    )
    figures = {
        "images_per_second": rates,
        "summary": summary,
        "records": records,
        "profile_cache_preloaded": profile,
        "batch_size": batch_size,
        "image_size": manifest["image_size"],
        "train_pairs": manifest["counts"]["train"],
        "epochs": EPOCHS,
    }
    stem = result_stem(args.report, args.out)
    write_report(stem, figures)
    figure, axes = plt.subplots(figsize=(8, 3.4))
    plot_speedups(axes, summary, f"Loader, {manifest['image_size']}px, batch {batch_size}, jitter on")
    axes.set_xscale("log")
    axes.set_xlim(0.5, max(f["speedup_max"] for f in summary["configs"].values()) * 5)
    figure.suptitle(machine_text(), fontsize=9)
    figure.tight_layout()
    figure.savefig(result_file(stem, ".png"), dpi=120)
    print(f"wrote {stem}.json and .png")


if __name__ == "__main__":
    try:
        main()
    except PipelineError as error:
        sys.exit(f"error: {error}")
