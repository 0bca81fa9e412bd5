"""Images/s of one full Pix2Pix training step (D step + G step, optimizers included), set against the plain pix2pix
step, in interleaved rounds (benchmarks/rounds.py).

The reference is the plain pix2pix step as the reference PyTorch code trains: the project's networks and losses, the
default Adam, fp32, NCHW, batches already in memory, D's weights frozen for G's backward; no Lightning, no checks.
Every other configuration trains the project's own `Pix2Pix` LightningModule under a real Trainer (the step that
trains, non-finite checks and the precision plugin included); a callback stamps the end of every batch and a step's
time is the gap between two stamps (fetching the batch, jitter and the whole step). "default" is what params.yaml
trains with (precision and layout as `auto` resolves them, fused Adam, preloaded cache); the others change one thing
of it.

At 256 px the model is the paper's (ngf/ndf 64); at other sizes it is params.yaml's. Achieved GFLOP/s (FLOPs counted
by FlopCounterMode on one plain step) is set against the GEMM peak of the step's dtype, measured in every round under
the same load checks (common.GemmPeaks), and both the plain and the default step are profiled. Every measurement and
profile runs in a fresh child process (`--worker`): the allocator settings a training run makes
(train.keep_freed_memory) hold for the rest of its process, and the plain step runs with glibc's defaults, as the
reference code does (its "freed memory kept" variant applies the project's settings to it). To measure an
AVX2-only CPU on a newer one, start Python with ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2
MKL_ENABLE_INSTRUCTIONS=AVX2 (the report names the limit).

Writes a new benchmarks/results/<date>-train_step.json, .md and .png (--report names them otherwise, --out puts
them at a path of your choice).
Usage: python -m benchmarks.train_step [--sizes 64 256] [--batch 4] [--rounds 3] [--warmup-rounds 1] [--steps 4]
       [--configs ...] [--report train_step] [--out PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from lightning.pytorch import Callback, seed_everything  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from benchmarks.common import (
    PAPER_MODEL,
    PAPER_SIZE,
    SHIPPED,
    BatchClock,
    GemmPeaks,
    add_report_option,
    decoded_batch,  # noqa: E402
    machine_text,
    markdown_table,
    profile_summary,
    result_file,
    result_stem,
    share_text,
    synthetic_cache,
    synthetic_preprocess,
    write_report,
)
from benchmarks.rounds import measure_rounds, plot_speedups, ratio_text, summarize  # noqa: E402
from thermal2visible.config.schema import ModelConfig, PreprocessConfig
from thermal2visible.data.cache import array_file, load_manifest  # noqa: E402
from thermal2visible.data.datamodule import PairedDataModule  # noqa: E402
from thermal2visible.data.ingest import read_pair  # noqa: E402
from thermal2visible.data.preprocess import prepare_thermal, prepare_visible  # noqa: E402
from thermal2visible.models.discriminators.patchgan import PatchDiscriminator, patch_layers  # noqa: E402
from thermal2visible.models.generator import ConvSettings  # noqa: E402
from thermal2visible.models.generators.unet import UNetGenerator  # noqa: E402
from thermal2visible.pixels import to_model  # noqa: E402
from thermal2visible.training.allocator import keep_freed_memory  # noqa: E402
from thermal2visible.training.module import Pix2Pix  # noqa: E402
from thermal2visible.models.networks import build_networks
from thermal2visible.training.precision import resolve_precision  # noqa: E402
from thermal2visible.training.trainer import build_trainer  # noqa: E402

PLAIN = "plain pix2pix step"
PLAIN_KEPT = "plain pix2pix step, freed memory kept"
# Changes to the project's default step (params.yaml's train section, preloaded cache); None: the plain step.
CONFIGS = {
    PLAIN: None,
    PLAIN_KEPT: None,
    "default": {},
    "default + torch.compile": dict(compile=True),
    "default in fp32": dict(precision="32-true"),
    "default in fp32 + torch.compile": dict(precision="32-true", compile=True),
    "default + channels_last": dict(channels_last=True),
    "default in NCHW": dict(channels_last=False),
    "default, plain Adam": dict(fused_adam=False),
    "default, simultaneous update": dict(update_rule="simultaneous"),
    "default + small convs as matmul": dict(small_convs_as_matmul=4),
    "default, glibc's malloc defaults": dict(keep_freed_memory=False),
    "no optimizations (fp32, NCHW, plain Adam, decoded input)": dict(
        precision="32-true", channels_last=False, fused_adam=False, compile=False, small_convs_as_matmul=0, cached=False
    ),
}


def model_for(size: int) -> ModelConfig:
    return PAPER_MODEL if size == PAPER_SIZE else SHIPPED.model


def timed_steps(steps_at_paper_size: int, size: int) -> int:
    """Smaller images make shorter steps, and a short step is at the mercy of the VM's hiccups: more of them, so
    that a measurement lasts about as long at every size."""
    return max(steps_at_paper_size, steps_at_paper_size * (PAPER_SIZE // size) ** 2 // 2)


def step_dtype(change: dict | None) -> str:
    precision = "32-true" if change is None else change.get("precision", SHIPPED.train.precision)
    return "bf16" if resolve_precision(precision, "cpu") == "bf16-mixed" else "fp32"


def memory_batches(cache: Path, size: int, batch: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` batches of training pairs as model input (NCHW, [-1, 1], `size` px windows of the cached training
    images), made once: the plain step's input."""
    thermal, visible = (
        torch.from_numpy(to_model(np.load(array_file(cache, "train", kind))[:, :size, :size]))
        for kind in ("thermal", "visible")
    )
    picks = [torch.arange(i * batch, (i + 1) * batch) % len(thermal) for i in range(count)]
    return [(thermal[p].contiguous(), visible[p].contiguous()) for p in picks]


class PlainPix2Pix:
    """The reference pix2pix step in plain PyTorch: D on real and generated pairs, D steps, then G against the
    updated D (D frozen) plus lambda * L1, G steps. Same networks, losses and optimizer settings as the project.
    Kept beside the real module on purpose: it is the baseline every speed ratio is taken against (what the public
    pix2pix code's loop costs), so it must stay free of the project's step machinery."""

    def __init__(self, model: ModelConfig, size: int, visible_channels: int = 3):
        train = SHIPPED.train
        self.generator = UNetGenerator(1, visible_channels, size, ConvSettings(**model.generator_settings))
        self.discriminator = PatchDiscriminator(
            1 + visible_channels,
            model.discriminator_settings["ndf"],
            model.discriminator_settings["norm"],
            patch_layers(size),
        )
        self.opt_g, self.opt_d = (
            torch.optim.Adam(net.parameters(), train.lr_g, betas=(train.beta1, train.beta2))
            for net in (self.generator, self.discriminator)
        )
        self.lambda_l1 = train.lambda_l1

    def step(self, thermal: torch.Tensor, real: torch.Tensor) -> None:
        fake = self.generator(thermal)
        self.discriminator.requires_grad_(True)
        self.opt_d.zero_grad()
        logits_real, logits_fake = self.discriminator(thermal, real), self.discriminator(thermal, fake.detach())
        loss_d = 0.5 * (
            F.binary_cross_entropy_with_logits(logits_real, torch.ones_like(logits_real))
            + F.binary_cross_entropy_with_logits(logits_fake, torch.zeros_like(logits_fake))
        )
        loss_d.backward()
        self.opt_d.step()
        self.discriminator.requires_grad_(False)
        self.opt_g.zero_grad()
        logits = self.discriminator(thermal, fake)
        loss_g = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits)) + self.lambda_l1 * F.l1_loss(
            fake, real
        )
        loss_g.backward()
        self.opt_g.step()


def plain_step_seconds(size: int, batches: list, warmup: int) -> float:
    torch.manual_seed(0)
    plain = PlainPix2Pix(model_for(size), size)
    stamps = []
    for thermal, visible in batches:
        plain.step(thermal, visible)
        stamps.append(time.perf_counter())
    return statistics.median(b - a for a, b in zip(stamps[warmup - 1 :], stamps[warmup:]))


def plain_step_flops(size: int, batches: list) -> int:
    plain = PlainPix2Pix(model_for(size), size)
    with FlopCounterMode(display=False) as counter:
        plain.step(*batches[0])
    return counter.get_total_flops()


class DecodedPairs(Dataset):
    """The uncached input pipeline: each pair read, decoded and preprocessed from its PNG files when drawn."""

    def __init__(self, cache: Path, preprocess: PreprocessConfig):
        self.sources = [s for s in load_manifest(cache)["sources"] if s["split"] == "train"]
        self.root, self.preprocess = cache.parent / "raw", preprocess

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        thermal, visible = read_pair(self.root, self.sources[i], "pairs", SHIPPED.ingest.max_pixels)
        return prepare_thermal(thermal, self.preprocess), prepare_visible(visible, thermal, self.preprocess)


def jittered_batch(samples: list) -> dict:
    return decoded_batch(samples, SHIPPED.preprocess.jitter_scale) | {"identity": torch.full((len(samples),), -1)}


def fit(change: dict, batch: int, size: int, data: tuple, batches: int, callbacks: list) -> None:
    """Train the project's Pix2Pix for `batches` batches: params.yaml's train settings with `change` applied."""
    settings = dict(change)
    cached = settings.pop("cached", True)
    train = dataclasses.replace(SHIPPED.train, batch_size=batch, max_epochs=1, accelerator="cpu", **settings)
    seed_everything(0, verbose=False)
    module = Pix2Pix(*build_networks(model_for(size), size, 1, 3), train)
    trainer = build_trainer(train, callbacks=callbacks, limit_train_batches=batches, limit_val_batches=0)
    cache, preprocess = data
    if cached:
        loader = dataclasses.replace(SHIPPED.loader, preload=True)
        trainer.fit(module, datamodule=PairedDataModule(cache, batch, loader))
    else:
        loader = DataLoader(
            DecodedPairs(cache, preprocess), batch_size=batch, shuffle=True, drop_last=True, collate_fn=jittered_batch
        )
        trainer.fit(module, train_dataloaders=loader)


def project_step_seconds(change: dict, batch: int, size: int, data: tuple, warmup: int, steps: int) -> float:
    clock = BatchClock(warmup + steps)
    fit(change, batch, size, data, warmup + steps, [clock])
    return clock.step_seconds(warmup)


class Profiled(Callback):
    """torch.profiler over every batch after the first."""

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if batch_idx == 1:
            self.profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profile.__enter__()

    def on_train_end(self, trainer, module) -> None:
        self.profile.__exit__(None, None, None)


def profile(name: str, batch: int, size: int, data: tuple, batches: list) -> list[dict]:
    """Where two eager steps of the plain or of the default configuration spend their time (after a warm-up)."""
    if name == PLAIN:
        plain = PlainPix2Pix(model_for(size), size)
        plain.step(*batches[0])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiled:
            for thermal, visible in batches[1:3]:
                plain.step(thermal, visible)
        return profile_summary(profiled)
    profiled = Profiled()
    fit(CONFIGS[name], batch, size, data, 3, [profiled])
    return profile_summary(profiled.profile)


def measure(job: dict) -> dict:
    """One measurement (or, with job["profile"], one profile) of one configuration, in the process that runs it."""
    torch.set_num_threads(job["threads"])
    name, size, batch = job["config"], job["size"], job["batch"]
    data = (Path(job["cache"]), synthetic_preprocess(size))
    batches = memory_batches(data[0], size, batch, job["warmup"] + job["steps"])
    if name == PLAIN_KEPT:
        keep_freed_memory()
    if job["profile"]:
        return {"profile": profile(name, batch, size, data, batches)}
    if CONFIGS[name] is None:
        return {"seconds": plain_step_seconds(size, batches, job["warmup"])}
    return {"seconds": project_step_seconds(CONFIGS[name], batch, size, data, job["warmup"], job["steps"])}


def in_a_child(job: dict, scratch: Path) -> dict:
    """measure(job) in a fresh Python process."""
    out = scratch / "measurement.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, "-m", "benchmarks.train_step", "--worker", json.dumps(job | {"out": str(out)})]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(f"{job['config']}: the measurement failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def plot(results: list[dict], path: Path) -> None:
    figure, axes = plt.subplots(
        1, len(results), figsize=(7.5 * len(results), 0.5 * len(results[0]["summary"]["configs"]) + 1.8), squeeze=False
    )
    for axis, result in zip(axes[0], results):
        plot_speedups(axis, result["summary"], f"{result['size']} px (ngf {result['ngf']}), batch {result['batch']}")
    figure.suptitle(f"Pix2Pix training step, {machine_text()}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256], help="64: params.yaml's demo size")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=list(CONFIGS),
        default=[PLAIN, "default", "default + channels_last", "default + torch.compile", "default in fp32"],
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up rounds")
    parser.add_argument(
        "--warmup-rounds", type=int, default=1, help="untimed rounds first, each configuration in its own process"
    )
    parser.add_argument(
        "--steps", type=int, default=4, help="timed steps per configuration per round at 256 px (more at smaller sizes)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation happens here)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    add_report_option(parser, "train_step", "{json,md,png}")
    args = parser.parse_args()
    if args.worker:
        job = json.loads(args.worker)
        Path(job["out"]).write_text(json.dumps(measure(job)))
        return
    torch.set_num_threads(args.threads)
    configs = {name: CONFIGS[name] for name in dict.fromkeys([PLAIN, *args.configs])}
    if all(step_dtype(change) == "fp32" for change in configs.values() if change is not None):
        configs = {name: change for name, change in configs.items() if name != "default in fp32"}  # same as default
    peaks = GemmPeaks(step_dtype(change) for change in configs.values())
    print(machine_text(), flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="t2v-train-step-") as scratch:
        for size in args.sizes:
            steps = timed_steps(args.steps, size)
            pairs = int(args.batch * (args.warmup + steps + 2) / 0.9) + 4
            cache, _ = synthetic_cache(Path(scratch) / str(size), size, pairs)
            batches = memory_batches(cache, size, args.batch, args.warmup + steps)
            job = dict(
                size=size, batch=args.batch, cache=str(cache), warmup=args.warmup, steps=steps, threads=args.threads
            )
            measurements = {
                name: (lambda name=name: in_a_child(job | dict(config=name, profile=False), Path(scratch))["seconds"])
                for name in configs
            }
            records = measure_rounds(
                measurements,
                args.rounds,
                args.warmup_rounds,
                label=f"{size} px: ",
                after_each_round=peaks.measure,
            )
            summary = summarize(records, baseline=PLAIN)
            flops = plain_step_flops(size, batches)
            results.append(
                {
                    "size": size,
                    "ngf": model_for(size).generator_settings["ngf"],
                    "batch": args.batch,
                    "steps": steps,
                    "flops_per_step": flops,
                    "summary": summary,
                    # each change's own effect: set against the default step in the same round
                    "vs_default": summarize(records, baseline="default")["configs"] if "default" in configs else {},
                    "records": records,
                    "profiles": {}
                    if args.no_profile
                    else {
                        name: in_a_child(job | dict(config=name, profile=True), Path(scratch))["profile"]
                        for name in (PLAIN, "default")
                    },
                }
            )
    for result in results:
        for name, figures in result["summary"]["configs"].items():
            figures["images_per_s"] = round(args.batch / figures["median_s"], 3)
            figures |= peaks.arithmetic(result["flops_per_step"], figures["median_s"], step_dtype(configs[name]))
    print(f"GEMM peak {peaks.text()}")
    header = [
        "size",
        "batch",
        "configuration",
        "images/s",
        "vs plain step (median [min-max])",
        "vs default",
        "GFLOP/s",
        "share of the GEMM peak",
    ]
    table = markdown_table(
        header,
        [
            [
                *(r["size"], r["batch"], name, f["images_per_s"], ratio_text(f)),
                ratio_text(r["vs_default"][name]) if name in r["vs_default"] else "",
                *(f["gflops_per_s"], share_text(f)),
            ]
            for r in results
            for name, f in r["summary"]["configs"].items()
        ],
    )
    print(table)
    stem = result_stem(args.report, args.out)
    write_report(
        stem,
        {
            "results": results,
            "matmul_peak_gflops": peaks.report(),
            "threads": args.threads,
            "warmup": args.warmup,
            "steps": args.steps,
            "rounds": args.rounds,
        },
    )
    profile_text = "".join(
        f"\n### Profile: {r['size']} px batch {r['batch']}, {name} (eager, self CPU time)\n\n"
        + markdown_table(
            ["op", "calls", "self ms", "share"],
            [[p["op"], p["calls"], p["self_ms"], f"{p['share']:.0%}"] for p in rows],
        )
        for r in results
        for name, rows in r["profiles"].items()
    )
    steps_text = ", ".join(f"{r['steps']} at {r['size']} px" for r in results)
    result_file(stem, ".md").write_text(
        f"# Training step, {machine_text()}\n\nGEMM peak: {peaks.text()} (2048x2048, best clean measurement of "
        f"one per round). {args.rounds} interleaved rounds "
        f"after a warm-up round; timed steps per measurement: {steps_text}; speed-up = plain step time / "
        f"configuration time in the same round.\n\n{table}{profile_text}"
    )
    plot(results, result_file(stem, ".png"))
    print(f"wrote {stem}.json, .md and .png")


if __name__ == "__main__":
    main()
