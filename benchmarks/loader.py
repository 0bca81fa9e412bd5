"""Loader throughput (images/s, jitter included): the cached datamodule, with and without preload, against a
loader that decodes, preprocesses and jitters the raw images every epoch; all on one core (1 torch thread).
The preloaded path is also measured without the jitter, and profiled. The cache holds the training images at the
jitter side (preprocess) and jitters by cropping; the decode path must resample every image every epoch.

Needs the demo data (`dvc repro preprocess`, or pipelines/synthesize.py, ingest.py, preprocess.py in turn).
Prints the figures and writes reports/loader.json and reports/loader.png.   Usage: python benchmarks/loader.py
"""
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from common import decoded_batch, profile_summary
from thermal2visible.errors import PipelineError
from thermal2visible.config import load_params
from thermal2visible.data.cache import load_manifest
from thermal2visible.data.datamodule import PairedDataModule, model_batch
from thermal2visible.data.ingest import read_pair
from thermal2visible.data.preprocess import prepare_thermal, prepare_visible
from thermal2visible.paths import CACHE, INDEX, REPORTS

REPORT = REPORTS / "loader"
EPOCHS = {"decode every epoch": 1, "cache, preload off": 10, "cache, preloaded": 10,
          "cache, preloaded, no jitter": 10}
REPEATS = 3  # the best of a few rounds: other processes on the machine only ever slow a round down


def images_per_second(epoch, epochs: int) -> float:
    rates = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        images = sum(len(batch["thermal"]) for _ in range(epochs) for batch in epoch())
        rates.append(images / (time.perf_counter() - start))
    return max(rates)


def decoding_epoch(params, batch_size: int):
    """Batches as a loader without a cache makes them: read, decode, preprocess and jitter every training pair."""
    index, manifest = json.loads(INDEX.read_text()), load_manifest(CACHE)
    train = [source for source in manifest["sources"] if source["split"] == "train"]
    root, layout, cfg, scale = Path(index["root"]), index["layout"], params.preprocess, params.preprocess.jitter_scale
    rng = np.random.default_rng(0)

    def epoch():
        order = rng.permutation(len(train))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            rows = order[start:start + batch_size]
            raw = [read_pair(root, train[i], layout, params.ingest.max_pixels) for i in rows]
            yield decoded_batch([(prepare_thermal(t, cfg), prepare_visible(v, t, cfg)) for t, v in raw], scale)
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
    # threads mostly wait for each other (measured here: jitter 0.6 ms on one thread, 35 ms on two).
    torch.set_num_threads(1)
    params = load_params("params.yaml")
    if not INDEX.is_file():
        raise PipelineError(f"{INDEX}: missing; make the demo data first (dvc repro preprocess)")
    batch_size, manifest = params.train.batch_size, load_manifest(CACHE)
    loaders = {"decode every epoch": decoding_epoch(params, batch_size),
               "cache, preload off": cached_epoch(params, batch_size, preload=False),
               "cache, preloaded": cached_epoch(params, batch_size, preload=True),
               "cache, preloaded, no jitter": cached_epoch(params, batch_size, preload=True, jitter=False)}
    rates = {name: images_per_second(epoch, EPOCHS[name]) for name, epoch in loaders.items()}
    baseline = rates["decode every epoch"]
    print(f"{manifest['counts']['train']} training pairs of {manifest['image_size']}px, batch {batch_size}, "
          f"jitter on, {torch.get_num_threads()} torch threads, {os.cpu_count()} cores")
    for name, rate in rates.items():
        print(f"  {name:28s} {rate:10.0f} images/s   x{rate / baseline:.1f}")
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    profile = profile_epochs(loaders["cache, preloaded"], EPOCHS["cache, preloaded"])
    print("  where the preloaded path's time goes: "
          + ", ".join(f"{row['op']} {row['share']:.0%}" for row in profile[:3]))
    figures = {"images_per_second": rates, "speedup_per_core": {name: rate / baseline for name, rate in rates.items()},
               "profile_cache_preloaded": profile, "batch_size": batch_size, "image_size": manifest["image_size"],
               "train_pairs": manifest["counts"]["train"], "epochs": EPOCHS, "repeats": REPEATS,
               "torch_threads": torch.get_num_threads()}
    REPORT.with_suffix(".json").write_text(json.dumps(figures, indent=1) + "\n")
    figure, axes = plt.subplots(figsize=(7, 3.4))
    bars = axes.barh(list(rates), list(rates.values()), color=["#999999", "#4c72b0", "#55a868", "#c4c4c4"])
    axes.bar_label(bars, labels=[f"{r:,.0f}/s" for r in rates.values()], padding=3)
    axes.set_xscale("log")
    axes.set_xlim(right=max(rates.values()) * 5)  # room for the labels
    axes.set_xlabel("training images per second (log scale)")
    axes.invert_yaxis()
    axes.set_title(f"Loader throughput, {manifest['image_size']}px, batch {batch_size}, jitter on")
    figure.tight_layout()
    figure.savefig(REPORT.with_suffix(".png"), dpi=120)
    print(f"wrote {REPORT.with_suffix('.json')} and {REPORT.with_suffix('.png')}")


if __name__ == "__main__":
    try:
        main()
    except PipelineError as error:
        sys.exit(f"error: {error}")
