"""Data-parallel scaling on this CPU: 1 vs 2 worker processes (1 thread each, gloo), same per-worker batch.

Every configuration is a fresh `python -m benchmarks.ddp_scaling --worker ...` process that trains the project's
Pix2Pix (paper model, params.yaml's training settings: precision auto, its layout, fused Adam; preloaded cache)
under a real Trainer: 1 worker without DDP, 2 workers under the project's GanDDPStrategy (Lightning's launcher
starts the second rank by running the same command line again), with DDP's bucket settings and gradient compression
varied. DDP refuses the stock bf16 compression hook on CPU by its name, so the bf16 hook here is the project's own,
doing the same thing.
The configurations run in interleaved rounds (benchmarks/rounds.py); the figure compared is seconds per image.

Writes a new benchmarks/results/<date>-ddp_scaling.json and .png (--report names them otherwise, --out puts them
at a path of your choice).
Usage: python -m benchmarks.ddp_scaling [--size 256] [--batches 4] [--rounds 3] [--repeats 4] [--configs ...]
       [--report ddp_scaling] [--out PATH]
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook  # noqa: E402

from benchmarks.common import (
    PAPER_MODEL,
    SHIPPED,
    BatchClock,
    add_report_option,
    machine_text,
    markdown_table,
    median_seconds,  # noqa: E402
    result_file,
    result_stem,
    synthetic_cache,
    write_report,
)
from benchmarks.rounds import measure_rounds, plot_speedups, ratio_text, summarize  # noqa: E402
from tests.support.servers import free_port  # noqa: E402
from thermal2visible.data.datamodule import PairedDataModule  # noqa: E402
from thermal2visible.training.module import Pix2Pix  # noqa: E402
from thermal2visible.models.networks import build_networks
from thermal2visible.training.precision import resolve_channels_last, resolve_precision  # noqa: E402
from thermal2visible.training.trainer import GanDDPStrategy, build_trainer  # noqa: E402

# What runs on the other core beside one worker, to tell what slows two workers' compute (the scaling model's c):
# a Python loop that touches no memory, or numpy copying 256 MB over and over (memory bandwidth and the shared L3).
NEIGHBOURS = {
    "spin": "while True: pass",
    "copy": "import numpy as np\nsource = np.ones(2**25)\ntarget = np.empty_like(source)\n"
    "while True: np.copyto(target, source)",
}
# DDP's own defaults are bucket_cap_mb 25, gradient_as_bucket_view False; the project's strategy turns the view on.
CONFIGS = {
    "1 worker": dict(workers=1),
    "2 workers, DDP defaults": dict(workers=2, gradient_as_bucket_view=False),
    "2 workers, bucket view (project)": dict(workers=2, gradient_as_bucket_view=True),
    "2 workers, bucket view, 100 MB buckets": dict(workers=2, gradient_as_bucket_view=True, bucket_cap_mb=100),
    "2 workers, bucket view, 10 MB buckets": dict(workers=2, gradient_as_bucket_view=True, bucket_cap_mb=10),
    "2 workers, bucket view, 5 MB buckets": dict(workers=2, gradient_as_bucket_view=True, bucket_cap_mb=5),
    "2 workers, bucket view, 2 MB buckets": dict(workers=2, gradient_as_bucket_view=True, bucket_cap_mb=2),
    "2 workers, bucket view, bf16 compression": dict(workers=2, gradient_as_bucket_view=True, compress="bf16"),
    "2 workers, bucket view, fp16 compression": dict(workers=2, gradient_as_bucket_view=True, compress="fp16"),
    # one bucket per network: PowerSGD issues its second all-reduce from the first one's callback, which on gloo
    # runs on a worker thread, so with several buckets the two ranks can issue them in different orders and hang
    "2 workers, bucket view, PowerSGD rank 1": dict(
        workers=2, gradient_as_bucket_view=True, bucket_cap_mb=1000, compress="powersgd"
    ),
    "2 workers, bucket view, a core each": dict(workers=2, gradient_as_bucket_view=True, pin=True),
    "1 worker, the other core spinning": dict(workers=1, neighbour="spin"),
    "1 worker, the other core copying memory": dict(workers=1, neighbour="copy"),
    "1 worker, glibc's malloc defaults": dict(workers=1, keep_freed_memory=False),
    "2 workers, bucket view, glibc's malloc defaults": dict(
        workers=2, gradient_as_bucket_view=True, keep_freed_memory=False
    ),
    "1 worker, NCHW": dict(workers=1, channels_last=False),
    "2 workers, bucket view, NCHW": dict(workers=2, gradient_as_bucket_view=True, channels_last=False),
    "1 worker, NCHW, the other core copying memory": dict(workers=1, channels_last=False, neighbour="copy"),
}
DEFAULT_CONFIGS = ["1 worker", "2 workers, DDP defaults", "2 workers, bucket view (project)"]
# keys of params.yaml's train section a configuration may change; the rest are GanDDPStrategy's
TRAIN_KEYS = ("keep_freed_memory", "channels_last")


def own_reference(name: str) -> str | None:
    """The one-worker configuration with the same train settings changed as `name`, if `name` changes any: the
    reference its ratio is also set against."""
    changed = {key: CONFIGS[name][key] for key in TRAIN_KEYS if key in CONFIGS[name]}
    if not changed:
        return None
    [reference] = [other for other, config in CONFIGS.items() if config == dict(workers=1, **changed)]
    return None if reference == name else reference


def bf16_allreduce(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket's gradients in bfloat16 (half the bytes on the wire), then write them back in fp32."""
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size())
    reduced = dist.all_reduce(compressed, async_op=True).get_future()
    return reduced.then(lambda future: buffer.copy_(future.value()[0]))


class Compression(Callback):
    """Registers a gradient-compression hook on G's and D's DDP wrappers once the strategy made them.

    PowerSGD (rank 1, error feedback) sends two thin factors per weight matrix instead of the matrix; it starts
    compressing at its 2nd all-reduce, inside the benchmark's warm-up steps, and each wrapper keeps its own state."""

    def __init__(self, kind: str):
        self.kind = kind

    def on_train_start(self, trainer, module) -> None:
        for replica in module.replicas.values():
            if self.kind == "powersgd":
                state = powerSGD_hook.PowerSGDState(
                    process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2
                )
                replica.register_comm_hook(state=state, hook=powerSGD_hook.powerSGD_hook)
            else:
                replica.register_comm_hook(
                    state=None, hook={"bf16": bf16_allreduce, "fp16": fp16_compress_hook}[self.kind]
                )


def worker(config: dict, cache: Path, size: int, batch: int, warmup: int, repeats: int, out: Path) -> None:
    """One configuration; rank 0 writes {"step_s": ...} to `out`."""
    config = dict(config)
    workers, compress, neighbour = config.pop("workers"), config.pop("compress", None), config.pop("neighbour", None)
    changed = {key: config.pop(key) for key in TRAIN_KEYS if key in config}
    if config.pop("pin", False):  # rank 0 runs first and its second rank inherits its core, then takes its own
        os.sched_setaffinity(0, {int(os.environ.get("LOCAL_RANK", 0))})
    train = dataclasses.replace(
        SHIPPED.train,
        batch_size=batch * workers,
        devices=workers,
        accelerator="cpu",
        max_epochs=1,
        **changed,
    )
    strategy = "auto"
    if workers == 1:
        torch.set_num_threads(1)
    else:  # sets 1 thread per process itself (cores // processes)
        strategy = GanDDPStrategy(process_group_backend="gloo", **config)
    torch.manual_seed(0)
    module = Pix2Pix(*build_networks(PAPER_MODEL, size, 1, 3), train)
    clock = BatchClock(warmup + repeats)
    callbacks = [clock] + ([Compression(compress)] if compress else [])
    trainer = build_trainer(
        train, callbacks=callbacks, strategy=strategy, limit_train_batches=warmup + repeats, limit_val_batches=0
    )
    busy = subprocess.Popen([sys.executable, "-c", NEIGHBOURS[neighbour]]) if neighbour else None
    try:
        trainer.fit(
            module, datamodule=PairedDataModule(cache, batch, dataclasses.replace(SHIPPED.loader, preload=True))
        )
    finally:
        if busy:
            busy.kill()
            busy.wait()
    if trainer.is_global_zero:
        out.write_text(json.dumps({"step_s": clock.step_seconds(warmup), "threads": torch.get_num_threads()}))


def _allreduce_worker(rank: int, numel: int, port: int, out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        gradients = torch.randn(numel).to(dtype)
        dist.all_reduce(gradients)
        times[str(dtype).removeprefix("torch.")] = median_seconds(lambda: dist.all_reduce(gradients), 5, warmup=1)
    if rank == 0:
        out.write_text(json.dumps(times))
    dist.destroy_process_group()


def allreduce_seconds(numel: int, scratch: Path) -> dict:
    """What one all-reduce of `numel` gradients costs between 2 gloo processes, in fp32 and in bf16: the floor
    of the per-step overhead when no spare core lets it overlap with compute."""
    out = scratch / "allreduce.json"
    mp.spawn(_allreduce_worker, args=(numel, free_port(), out), nprocs=2)
    return json.loads(out.read_text())


def seconds_per_image(name: str, batch: int, cache: Path, args, scratch: Path) -> float:
    out = scratch / "result.json"
    out.unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "benchmarks.ddp_scaling",
        "--worker",
        json.dumps(CONFIGS[name]),
        "--cache",
        str(cache),
        "--size",
        str(args.size),
        "--batches",
        str(batch),
        "--warmup",
        str(args.warmup),
        "--repeats",
        str(args.repeats),
        "--result-file",
        str(out),
    ]
    finished = subprocess.run(command, capture_output=True, text=True)
    if finished.returncode != 0 or not out.is_file():
        raise RuntimeError(f"{name}: worker failed ({finished.returncode}):\n{finished.stderr[-3000:]}")
    return json.loads(out.read_text())["step_s"] / (batch * CONFIGS[name]["workers"])


def plot(results: dict, path: Path) -> None:
    figure, axes = plt.subplots(1, len(results), figsize=(7.5 * len(results), 3.2), squeeze=False)
    for axis, (batch, summary) in zip(axes[0], results.items()):
        plot_speedups(axis, summary, f"batch {batch} per worker")
        axis.axvline(2, color="black", linestyle=":", linewidth=1, label="ideal with 2 workers")
        axis.legend(loc="lower right")
    figure.suptitle(f"DDP on CPU cores, 1 thread per worker (gloo); {machine_text()}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batches", type=int, nargs="+", default=[4], help="per worker")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=DEFAULT_CONFIGS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result-file", type=Path, help=argparse.SUPPRESS)
    add_report_option(parser, "ddp_scaling", "{json,png}")
    args = parser.parse_args()
    if args.worker:
        worker(
            json.loads(args.worker), args.cache, args.size, args.batches[0], args.warmup, args.repeats, args.result_file
        )
        return
    if "1 worker" not in args.configs:
        parser.error("--configs must include '1 worker' (the reference)")
    precision = resolve_precision(SHIPPED.train.precision, "cpu")
    layout = "channels-last" if resolve_channels_last(SHIPPED.train.channels_last, "cpu", precision) else "NCHW"
    print(f"{machine_text()}; {args.size} px, {precision}, {layout}, fused Adam {SHIPPED.train.fused_adam}", flush=True)
    results, records = {}, {}
    with tempfile.TemporaryDirectory(prefix="t2v-ddp-") as scratch:
        pairs = 2 * max(args.batches) * (args.warmup + args.repeats) + 16
        cache, _ = synthetic_cache(Path(scratch), args.size, pairs)
        generator_and_discriminator = Pix2Pix(*build_networks(PAPER_MODEL, args.size, 1, 3), SHIPPED.train)
        gradients = sum(weight.numel() for weight in generator_and_discriminator.parameters())
        exchange = allreduce_seconds(gradients, Path(scratch))
        print(
            f"  one all-reduce of the {gradients / 1e6:.1f} M gradients: "
            + ", ".join(f"{dtype} {seconds * 1000:.0f} ms" for dtype, seconds in exchange.items()),
            flush=True,
        )
        for batch in args.batches:
            calls = {
                name: (lambda name=name: seconds_per_image(name, batch, cache, args, Path(scratch)))
                for name in args.configs
            }
            records[batch] = measure_rounds(calls, args.rounds, label=f"batch {batch}/worker: ")
            results[batch] = summarize(records[batch], baseline="1 worker")
            for reference in {own_reference(name) for name in args.configs} & set(args.configs):
                results[batch][f"vs {reference}"] = summarize(records[batch], baseline=reference)["configs"]
    rows = []
    for batch, summary in results.items():
        for name, figures in summary["configs"].items():
            figures["images_per_s"] = round(1 / figures["median_s"], 3)
            figures["efficiency"] = round(figures["speedup_median"] / CONFIGS[name]["workers"], 3)
            against_own = summary.get(f"vs {own_reference(name)}", {}).get(name)
            rows.append(
                [
                    *(batch, name, figures["images_per_s"], ratio_text(figures)),
                    ratio_text(against_own) if against_own else "",
                    f"{figures['efficiency']:.0%}",
                ]
            )
    header = ["batch/worker", "configuration", "images/s", "vs 1 worker (median [min-max])"]
    print(markdown_table([*header, "vs 1 worker with the same change", "efficiency"], rows))
    stem = result_stem(args.report, args.out)
    write_report(
        stem,
        {
            "results": results,
            "records": records,
            "size": args.size,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "gradients": gradients,
            "allreduce_s": exchange,
        },
    )
    plot(results, result_file(stem, ".png"))
    print(f"wrote {stem}.json and .png")


if __name__ == "__main__":
    main()
