"""Training from caches of 1k, 10k and 40k pairs at 256 px: images/s and peak resident memory, each training split
read from the cache files per batch, against the split preloaded into memory at 1k; interleaved rounds
(benchmarks/rounds.py).

The 1k cache is made by the data stages' own functions (synthetic faces); the larger ones repeat its training rows
(the files are what is measured, not the pictures) beside its validation and test splits. Every measurement is a
fresh `python -m benchmarks.data_scale --worker ...` process running the project's Trainer, Pix2Pix and datamodule
(params.yaml's settings at 256 px, jitter on) for a few steps; its peak resident memory is the kernel's VmHWM. The
in-memory footprint of each size, and what `loader.preload: true` and `auto` do with it here, are reported too.

Writes a new benchmarks/results/<date>-data_scale.json and .png (--report names them otherwise, --out puts them
at a path of your choice).
Usage: python -m benchmarks.data_scale [--sizes 1000 10000 40000] [--rounds 3] [--steps 8] [--batch 8]
       [--scratch DIR] [--report data_scale] [--out PATH]
"""

import argparse
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from benchmarks.common import (  # noqa: E402
    SHIPPED,
    BatchClock,
    add_report_option,
    machine_text,
    result_file,
    result_stem,
    synthetic_cache,
    write_report,
)
from benchmarks.rounds import measure_rounds, ratio_text, summarize  # noqa: E402
from thermal2visible.data.cache_files import JITTER, array_file, load_manifest  # noqa: E402
from thermal2visible.data.datamodule import PairedDataModule, free_memory, gib  # noqa: E402
from thermal2visible.data.dataset import stored_split  # noqa: E402
from thermal2visible.errors import PipelineError  # noqa: E402
from thermal2visible.paths import MANIFEST  # noqa: E402
from thermal2visible.training.module import Pix2Pix  # noqa: E402
from thermal2visible.models.networks import build_networks
from thermal2visible.training.trainer import build_trainer  # noqa: E402

SIZE, WARMUP = 256, 3


def worker(cache: Path, preload: bool, steps: int, batch: int, out: Path) -> None:
    """`steps` training steps (after WARMUP) on `cache`; writes seconds per image and peak resident MiB to `out`."""
    train = dataclasses.replace(SHIPPED.train, batch_size=batch, max_epochs=1, min_epochs=1, accelerator="cpu")
    torch.manual_seed(0)
    data = PairedDataModule(cache, batch, dataclasses.replace(SHIPPED.loader, preload=preload))
    module = Pix2Pix(*build_networks(SHIPPED.model, SIZE, data.thermal_channels, data.visible_channels), train)
    clock = BatchClock(WARMUP + steps)
    build_trainer(train, callbacks=[clock], limit_train_batches=WARMUP + steps, limit_val_batches=0).fit(
        module, datamodule=data
    )
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    out.write_text(
        json.dumps(
            {"s_per_image": clock.step_seconds(WARMUP) / batch, "peak_mib": int(status["VmHWM"].split()[0]) / 1024}
        )
    )


def larger_cache(base: Path, pairs: int, folder: Path) -> Path:
    """A cache whose training split holds `pairs` rows, the base cache's repeated in order; other splits copied."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(base)
    for split in ("val", "test"):
        for kind in ("thermal", "visible", "identity"):
            shutil.copyfile(array_file(base, split, kind), array_file(folder, split, kind))
    for kind in ("thermal", "visible", "identity"):
        rows = np.load(array_file(base, JITTER, kind), mmap_mode="r")
        target = np.lib.format.open_memmap(array_file(folder, JITTER, kind), "w+", rows.dtype, (pairs, *rows.shape[1:]))
        for start in tqdm(range(0, pairs, len(rows)), desc=f"{pairs} pairs: {kind}", unit="copy", leave=False):
            count = min(len(rows), pairs - start)
            target[start : start + count] = rows[:count]
        target.flush()
        del target
    manifest["counts"]["train"] = pairs
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


def measurement(cache: Path, preload: bool, steps: int, batch: int, figures: list, name: str):
    """A measurement for measure_rounds: one worker process; its figures are appended to `figures`."""

    def run() -> float:
        out = cache / "worker.json"
        out.unlink(missing_ok=True)
        command = [sys.executable, "-m", "benchmarks.data_scale", "--worker", str(cache), "--steps", str(steps)]
        command += ["--batch", str(batch)] + (["--preload"] if preload else [])
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        result = json.loads(out.read_text())
        figures.append({"config": name} | result)
        return result["s_per_image"]

    return run


def preload_verdicts(cache: Path, batch: int) -> dict:
    """What loader.preload true and auto do with this cache on this machine (the split's bytes, the free memory)."""
    needed = sum(stored.nbytes for stored in stored_split(cache, JITTER).values())
    verdicts = {"in_memory_bytes": needed, "free_bytes": free_memory(torch.device("cpu"))}
    for setting in (True, "auto"):
        module = PairedDataModule(cache, batch, dataclasses.replace(SHIPPED.loader, preload=setting))
        try:
            module.setup("fit")
            verdicts[f"preload_{setting}"] = "preloaded" if module.splits["train"].tensors is not None else "streamed"
        except PipelineError as refusal:
            verdicts[f"preload_{setting}"] = f"refused: {refusal}"
        del module
    return verdicts


def plot(summary: dict, path: Path) -> None:
    figure, (speed, memory) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(summary["configs"])
    for axis, key, label in ((speed, "images_per_s", "images/s (median)"), (memory, "peak_mib", "peak RSS, MiB")):
        values = [summary["configs"][name][key] for name in names]
        bars = axis.barh(names, values, color=["#4c72b0"] + ["#55a868"] * (len(names) - 1))
        axis.bar_label(bars, labels=[f"{v:.1f}" if key == "images_per_s" else f"{v:.0f}" for v in values], padding=4)
        axis.set(xlabel=label)
        axis.invert_yaxis()
    speed.set_title("training throughput")
    memory.set_title("peak resident memory")
    figure.suptitle(f"{SIZE} px, batch {summary['batch']}; {machine_text()}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 40000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per measurement, after 3 untimed ones")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--scratch", type=Path, help="where the caches are written (default: a temporary folder)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--preload", action="store_true", help=argparse.SUPPRESS)
    add_report_option(parser, "data_scale", "{json,png}")
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.preload, args.steps, args.batch, args.worker / "worker.json")
    with tempfile.TemporaryDirectory(prefix="t2v-scale-", dir=args.scratch) as scratch:
        scratch = Path(scratch)
        base, _ = synthetic_cache(scratch / "base", SIZE, min(args.sizes))
        caches = {size: larger_cache(base, size, scratch / f"cache-{size}") for size in args.sizes}
        verdicts = {size: preload_verdicts(cache, args.batch) for size, cache in caches.items()}
        smallest, figures = min(args.sizes), []
        baseline = f"{smallest} pairs, preloaded"
        configs = {baseline: measurement(caches[smallest], True, args.steps, args.batch, figures, baseline)}
        for size, cache in caches.items():
            name = f"{size} pairs, read per batch"
            configs[name] = measurement(cache, False, args.steps, args.batch, figures, name)
        records = measure_rounds(configs, args.rounds, label="data scale ")
    # the worker's figures of the timed rounds: the warm-up round's come first
    timed = figures[len(configs) :]
    summary = {"batch": args.batch, "steps": args.steps, "configs": {}}
    for name in configs:
        mine = [f for f in timed if f["config"] == name]
        summary["configs"][name] = {
            "images_per_s": round(1 / statistics.median(f["s_per_image"] for f in mine), 2),
            "peak_mib": round(statistics.median(f["peak_mib"] for f in mine)),
        }
    base_speed = summary["configs"][baseline]["images_per_s"]
    base_memory = summary["configs"][f"{smallest} pairs, read per batch"]["peak_mib"]
    for name, figure in summary["configs"].items():
        figure["speed_of_preloaded"] = round(figure["images_per_s"] / base_speed, 3)
        figure["memory_of_smallest_read"] = round(figure["peak_mib"] / base_memory, 3)
    summary["speed_ratios"] = summarize(records, baseline)  # per round, each over the preloaded 1k in the same round
    summary["preload"] = {str(size): verdict for size, verdict in verdicts.items()}
    stem = result_stem(args.report, args.out)
    plot(summary, result_file(stem, ".png"))
    write_report(stem, summary | {"rounds": records, "worker_figures": figures})
    for name, figure in summary["configs"].items():
        print(
            f"{name}: {figure['images_per_s']} images/s "
            f"({ratio_text(summary['speed_ratios']['configs'][name])} the preloaded's), "
            f"peak {figure['peak_mib']} MiB ({figure['memory_of_smallest_read']:.2f} x the smallest read per batch)"
        )
    for size, verdict in verdicts.items():
        print(
            f"{size} pairs: in memory {gib(verdict['in_memory_bytes'])} of {gib(verdict['free_bytes'])} free; "
            f"preload true: {verdict['preload_True'][:160]}; auto: {verdict['preload_auto'][:60]}"
        )
    print(f"{machine_text()}; wrote {stem}.json and .png")


if __name__ == "__main__":
    main()
