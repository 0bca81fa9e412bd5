"""Images/s of one full Pix2Pix training step (D step + G step, optimizers included) on the paper's model.

Every configuration trains the project's own `Pix2Pix` LightningModule under a real Trainer, so the step measured is
the step that trains (same loss math, same Lightning precision plugin); a callback stamps the end of every batch,
and a step's time is the gap between two stamps: fetching the batch, jitter and the whole step. The baseline is the
default pix2pix setup: fp32, NCHW, the default Adam, every batch decoded from PNG and preprocessed on the fly
(no cache). Then each optimization alone and all together. Achieved GFLOP/s (FLOPs counted by FlopCounterMode
on one eager step) is set against the measured GEMM peak of the step's dtype; the fastest configuration is profiled.
"All together" takes the precision `train.precision: auto` picks. On a CPU without bf16 instructions, bf16 is emulated
(~10x slower than fp32): there "+ bf16-mixed" and the bf16 peak are measured only when named in --configs.

Writes reports/train_step.json, reports/train_step.md and reports/train_step.png.
Usage: python benchmarks/train_step.py [--sizes 256] [--batches 1 4] [--repeats 5] [--threads 2]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch import Callback, seed_everything  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from common import (REPORTS, BatchClock, decoded_batch, machine, markdown_table, matmul_peak_gflops,  # noqa: E402
                    profile_summary, synthetic_cache, write_report)
from thermal2visible.config import IngestConfig, LoaderConfig, ModelConfig, PreprocessConfig, TrainConfig  # noqa: E402
from thermal2visible.data.cache import load_manifest  # noqa: E402
from thermal2visible.data.datamodule import PairedDataModule  # noqa: E402
from thermal2visible.data.ingest import read_pair  # noqa: E402
from thermal2visible.data.preprocess import prepare_thermal, prepare_visible  # noqa: E402
from thermal2visible.training.module import Pix2Pix  # noqa: E402
from thermal2visible.training.trainer import build_trainer, cpu_has_native_bf16, resolve_precision  # noqa: E402

PAPER_MODEL = ModelConfig(ngf=64, ndf=64, norm="batch", dropout=0.5)
BASELINE = dict(precision="32-true", channels_last=False, fused_adam=False, compile=False, cached=False)
OPTIMIZATIONS = {"cached input": dict(cached=True), "bf16-mixed": dict(precision="bf16-mixed"),
                 "channels_last": dict(channels_last=True), "fused Adam": dict(fused_adam=True),
                 "torch.compile": dict(compile=True)}
# Together: every optimization, mixed precision as the project's default picks it (bf16 only where the CPU has
# bf16 instructions: emulated bf16 is slower than fp32).
ALL = {key: value for change in OPTIMIZATIONS.values() for key, value in change.items()} | dict(precision="auto")
CONFIGS = {"fp32 baseline": {}, **{f"+ {name}": change for name, change in OPTIMIZATIONS.items()},
           "all together": ALL, "all but compile": ALL | dict(compile=False)}


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def step_dtype(change: dict) -> str:
    return "bf16" if resolve_precision((BASELINE | change)["precision"], "cpu") == "bf16-mixed" else "fp32"


class DecodedPairs(Dataset):
    """The uncached input pipeline: each pair read, decoded and preprocessed from its PNG files when drawn."""

    def __init__(self, cache: Path, cfg: PreprocessConfig):
        self.sources = [s for s in load_manifest(cache)["sources"] if s["split"] == "train"]
        self.root, self.cfg = cache.parent / "raw", cfg

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        thermal, visible = read_pair(self.root, self.sources[i], "pairs", IngestConfig().max_pixels)
        return prepare_thermal(thermal, self.cfg), prepare_visible(visible, thermal, self.cfg)


def jittered_batch(samples: list) -> dict:
    return decoded_batch(samples, PreprocessConfig().jitter_scale) | {"identity": torch.full((len(samples),), -1)}


class FlopCount(Callback):
    """Counts the FLOPs of training batch `at` (FlopCounterMode sees forward and backward of both networks)."""

    def __init__(self, at: int):
        self.at, self.mode, self.flops = at, FlopCounterMode(display=False), 0

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if batch_idx == self.at:
            self.mode.__enter__()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if batch_idx == self.at:
            self.mode.__exit__(None, None, None)
            self.flops = self.mode.get_total_flops()


def fit(change: dict, batch: int, size: int, data: tuple, batches: int, callbacks: list) -> None:
    """Train the project's Pix2Pix for `batches` batches under `change` (BASELINE settings otherwise)."""
    settings = BASELINE | change
    cached = settings.pop("cached")
    train = TrainConfig(batch_size=batch, max_epochs=1, accelerator="cpu", **settings)
    seed_everything(0, verbose=False)
    module = Pix2Pix(PAPER_MODEL, train, size, thermal_channels=1, visible_channels=3)
    trainer = build_trainer(train, callbacks=callbacks, limit_train_batches=batches, limit_val_batches=0)
    cache, cfg = data
    if cached:
        trainer.fit(module, datamodule=PairedDataModule(cache, batch, LoaderConfig(preload=True)))
    else:
        loader = DataLoader(DecodedPairs(cache, cfg), batch_size=batch, shuffle=True, drop_last=True,
                            collate_fn=jittered_batch)
        trainer.fit(module, train_dataloaders=loader)


def measure(name: str, change: dict, batch: int, size: int, data: tuple, warmup: int, repeats: int,
            count_flops: bool) -> dict:
    clock = BatchClock(warmup + repeats)
    callbacks = [clock] + ([FlopCount(at=warmup + repeats)] if count_flops else [])
    started = time.perf_counter()
    fit(change, batch, size, data, warmup + repeats + count_flops, callbacks)
    step = clock.step_seconds(warmup)
    dtype = step_dtype(change)
    result = {"config": name, "batch": batch, "size": size, "dtype": dtype, "step_s": round(step, 4),
              "images_per_s": round(batch / step, 3), "warmup_s": round(clock.stamps[warmup - 1] - started, 1)}
    print(f"  {name:22s} batch {batch}: {result['images_per_s']:7.2f} images/s  ({step:.3f} s/step; set-up and "
          f"warm-up, compilation included: {result['warmup_s']} s)", flush=True)
    return result | ({"flops_per_step": callbacks[1].flops} if count_flops else {})


class Profiled(Callback):
    """torch.profiler over every batch after the first."""

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if batch_idx == 1:
            self.profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profile.__enter__()

    def on_train_end(self, trainer, module) -> None:
        self.profile.__exit__(None, None, None)


def profile_steps(change: dict, batch: int, size: int, data: tuple) -> list[dict]:
    """Where two eager steps of a configuration spend their time (after one warm-up step)."""
    profiled = Profiled()
    fit(change | dict(compile=False), batch, size, data, 3, [profiled])
    return profile_summary(profiled.profile)


def plot(results: list[dict], path: Path) -> None:
    batches = sorted({r["batch"] for r in results})
    figure, axes = plt.subplots(1, len(batches), figsize=(5.5 * len(batches), 3.8), squeeze=False)
    for axis, batch in zip(axes[0], batches):
        rows = [r for r in results if r["batch"] == batch]
        bars = axis.barh([r["config"] for r in rows], [r["speedup"] for r in rows],
                         color=["#999999"] + ["#4c72b0"] * (len(rows) - 3) + ["#55a868", "#8172b2"])
        axis.bar_label(bars, labels=[f"x{r['speedup']:.2f} ({r['images_per_s']:.2f}/s)" for r in rows], padding=3)
        axis.axvline(1, color="black", linewidth=0.8)
        axis.set_xlim(right=max(r["speedup"] for r in rows) * 1.5)
        axis.invert_yaxis()
        axis.set(xlabel="speed-up over the fp32 baseline", title=f"{rows[0]['size']} px, batch {batch}")
    figure.suptitle(f"Pix2Pix training step (ngf/ndf 64), {torch.get_num_threads()} threads")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    # Without bf16 instructions bf16 is emulated, ~10x slower than fp32: it runs only when asked for by name.
    default_configs = [name for name, change in CONFIGS.items()
                       if cpu_has_native_bf16() or change.get("precision") != "bf16-mixed"]
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=default_configs)
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation happens here)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-profile", action="store_true", help="skip profiling the fastest configuration")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtypes = {"fp32"} | {step_dtype(CONFIGS[name]) for name in args.configs}
    peaks = {dtype: matmul_peak_gflops(DTYPES[dtype]) for dtype in sorted(dtypes, reverse=True)}
    peak_text = ", ".join(f"{dtype} {gflops:.0f} GFLOP/s" for dtype, gflops in peaks.items())
    print(f"{machine()['cpu']}, {args.threads} threads; GEMM peak {peak_text}", flush=True)
    results, profiles = [], {}
    with tempfile.TemporaryDirectory(prefix="t2v-train-step-") as scratch:
        for size in args.sizes:
            pairs = int(max(args.batches) * (args.warmup + args.repeats + 2) / 0.9) + 4
            data = synthetic_cache(Path(scratch) / str(size), size, pairs)
            for batch in args.batches:
                rows = [measure(name, CONFIGS[name], batch, size, data, args.warmup, args.repeats,
                                count_flops=i == 0) for i, name in enumerate(args.configs)]
                flops = rows[0].get("flops_per_step", 0)
                for row in rows:
                    row["speedup"] = round(rows[0]["step_s"] / row["step_s"], 3)
                    row["gflops_per_s"] = round(flops / row["step_s"] / 1e9, 1)
                    row["share_of_peak"] = round(row["gflops_per_s"] / peaks[row["dtype"]], 3)
                results += rows
                if not args.no_profile:
                    fastest = min(rows, key=lambda row: row["step_s"])
                    profiles[f"{size}px batch {batch}: {fastest['config']}"] = profile_steps(
                        CONFIGS[fastest["config"]], batch, size, data)
    header = ["size", "batch", "configuration", "images/s", "s/step", "speed-up", "GFLOP/s", "of dtype peak"]
    table = markdown_table(header, [[r["size"], r["batch"], r["config"], r["images_per_s"], r["step_s"],
                                     f"x{r['speedup']:.2f}", r["gflops_per_s"], f"{r['share_of_peak']:.0%}"]
                                    for r in results])
    print(table)
    write_report("train_step", {"results": results, "matmul_peak_gflops": peaks, "threads": args.threads,
                                "warmup": args.warmup, "repeats": args.repeats, "profiles": profiles})
    profile_text = "".join(f"\n### Profile: {name} (eager, self CPU time)\n\n" + markdown_table(
        ["op", "calls", "self ms", "share"], [[p["op"], p["calls"], p["self_ms"], f"{p['share']:.0%}"] for p in rows])
        for name, rows in profiles.items())
    (REPORTS / "train_step.md").write_text(
        f"# Training step, {machine()['cpu']}, {args.threads} threads\n\nGEMM peak: {peak_text} (2048x2048)."
        f"\n\n{table}{profile_text}")
    plot(results, REPORTS / "train_step.png")
    print(f"wrote {REPORTS}/train_step.json, .md and .png")


if __name__ == "__main__":
    main()
