"""What every benchmark shares: the machine it ran on, medians, matmul peaks, profiles, and the result files.

Benchmarks run from the project root (`python -m benchmarks.<name>`); each run writes a new dated result,
benchmarks/results/<YYYY-MM-DD>-<name>.json (+ .md, .png), and never replaces a file unless given --out.
Timings are medians of repeats after warm-up; every figure says how many torch threads made it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback

from thermal2visible.cli import quiet_lightning
from thermal2visible.config.load import load_params, preset_overrides
from thermal2visible.config.schema import PreprocessConfig
from thermal2visible.data.cache import build_cache
from thermal2visible.data.dataset import random_windows
from thermal2visible.data.ingest import ingest
from thermal2visible.data.synthetic import synthesize
from thermal2visible.pixels import unit_to_model
from thermal2visible.training.precision import cpu_has_native_bf16
from benchmarks.rounds import MachineLoad

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")

from pipelines.studies.results import new_dated_stem  # noqa: E402
from thermal2visible.paths import PAPER_GPU, PARAMS  # noqa: E402

quiet_lightning()
logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)  # "GPU available: False" x N
RAW_SIDE = 1.25  # raw frames are larger than the model input, as camera frames are: preprocessing resizes them
PROJECT = Path(__file__).resolve().parents[1]
RESULTS = Path("benchmarks/results")  # from the project root, where benchmarks run
RESULT_SUFFIXES = (".json", ".md", ".png")  # the files one run may write, side by side
SHIPPED = load_params(PROJECT / PARAMS)  # every setting a benchmark does not change on purpose
PAPER = load_params(PROJECT / PARAMS, preset_overrides(PROJECT / PAPER_GPU))
PAPER_SIZE, PAPER_MODEL = PAPER.preprocess.image_size, PAPER.model  # the paper's networks
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# Setting these before Python starts makes a CPU with AVX-512/bf16 compute like an AVX2-only one (CI's other kind):
# oneDNN (convolutions), ATen's vectorized kernels and MKL all stop at AVX2. The micro-architecture stays.
ISA_LIMITS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")
# /proc/cpuinfo flags and the name a report gives the widest one present; AVX2 where none is.
WIDEST_FIRST = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX-512"))


def machine() -> dict:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    limits = {name: os.environ[name] for name in ISA_LIMITS if name in os.environ}
    widest = next((name for flag, name in WIDEST_FIRST if flag in flags), "AVX2")
    return {
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "bf16_instructions": [f for f in ("amx_bf16", "avx512_bf16") if f in flags],
        "isa": widest + (f", limited to {torch.backends.cpu.get_cpu_capability()} ({limits})" if limits else ""),
        "bf16_in_use": cpu_has_native_bf16(),
    }


def machine_text(facts: dict | None = None) -> str:
    """One line naming the machine beside a figure: CPU, cores, widest vector ISA in use, threads (of this process,
    or of the `machine()` facts a report recorded)."""
    facts = facts or machine()
    return f"{facts['cpu']} ({facts['isa']}), {facts['cores']} cores, {facts['torch_threads']} torch threads"


def median_seconds(call: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def int8_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int8 x int8 -> int32 GEMM, the arithmetic a quantized convolution runs on, for the int8 peak. torch has no
    public one: `a @ b` on int8 tensors accumulates in int8 (it overflows) and is far slower; `torch._int_mm` is
    private, so tests/unit/inference/test_private_apis.py checks it on the installed torch."""
    return torch._int_mm(a, b)


def matmul_peak_gflops(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    """Best GEMM throughput of this CPU at the current thread count: the ceiling a model step can reach.

    The best of the two libraries torch calls: MKL (`a @ b`; on AMD CPUs it takes a slower path for fp32) and
    oneDNN, which runs the convolutions (a 1x1 convolution over a size x 1 image in channels_last is a GEMM).
    int8: torch's int8 x int8 -> int32 GEMM (GOP/s), the arithmetic a quantized convolution runs on.
    """
    if dtype == torch.int8:
        a, b = (torch.randint(-128, 128, (size, size), dtype=torch.int8) for _ in range(2))
        return 2 * size**3 / median_seconds(lambda: int8_matmul(a, b), repeats, warmup=2) / 1e9
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    image = torch.randn(1, size, size, 1, dtype=dtype).contiguous(memory_format=torch.channels_last)
    kernel = torch.randn(size, size, 1, 1, dtype=dtype).contiguous(memory_format=torch.channels_last)
    seconds = min(
        median_seconds(lambda: a @ b, repeats, warmup=2),
        median_seconds(lambda: torch.nn.functional.conv2d(image, kernel), repeats, warmup=2),
    )
    return 2 * size**3 / seconds / 1e9


class GemmPeaks:
    """The GEMM peak of each dtype a benchmark divides by, measured each time `measure` is called (the benchmarks call
    it in every round, beside the configurations) under the rounds' own steal and foreign-load checks.

    A peak measured once, on a machine that was busy at that moment and quiet later, turned 57 % of the bf16 peak into
    "154 %". Now the peak is the best clean measurement (the best flagged one only when none was clean, and then the
    report says so), and a share above 100 % can only be a measurement error: it is reported as one, never as a figure.
    """

    def __init__(self, dtypes):
        self.samples: dict[str, list[dict]] = {dtype: [] for dtype in sorted(set(dtypes), reverse=True)}

    def measure(self) -> None:
        for dtype, samples in self.samples.items():
            with MachineLoad() as load:
                gflops = matmul_peak_gflops(DTYPES[dtype])
            samples.append(
                {
                    "gflops": round(gflops, 1),
                    "steal": round(load.steal, 3),
                    "foreign_load": round(load.foreign, 3),
                    "flagged": load.flagged,
                }
            )

    def peak(self, dtype: str) -> dict:
        clean = [sample["gflops"] for sample in self.samples[dtype] if not sample["flagged"]]
        return {
            "gflops": max(clean or [sample["gflops"] for sample in self.samples[dtype]]),
            "clean": bool(clean),
            "measurements": len(self.samples[dtype]),
        }

    def report(self) -> dict:
        return {dtype: self.peak(dtype) | {"samples": samples} for dtype, samples in self.samples.items()}

    def text(self) -> str:
        return ", ".join(
            f"{dtype} {peak['gflops']:.0f} GFLOP/s" + ("" if peak["clean"] else " (no clean measurement)")
            for dtype, peak in ((dtype, self.peak(dtype)) for dtype in self.samples)
        )

    def arithmetic(self, flops: int, seconds: float, dtype: str) -> dict:
        """Achieved GFLOP/s of `flops` done in `seconds`, and its share of the GEMM peak of the arithmetic used."""
        gflops = round(flops / seconds / 1e9, 1)
        share = round(gflops / self.peak(dtype)["gflops"], 3)
        return {"dtype": dtype, "gflops_per_s": gflops, "share_of_peak": share if share <= 1 else None}


def share_text(figures: dict) -> str:
    """'57 % of bf16 peak', or why there is no share."""
    if figures["share_of_peak"] is None:
        return f"over the {figures['dtype']} peak: a measurement error"
    return f"{figures['share_of_peak']:.0%} of {figures['dtype']} peak"


def profile_summary(profile: torch.profiler.profile, top: int = 12) -> list[dict]:
    """The `top` operators by self CPU time, with their share of the total: why a step takes what it takes."""
    events = profile.key_averages()
    total = sum(event.self_cpu_time_total for event in events) or 1
    ranked = sorted(events, key=lambda event: event.self_cpu_time_total, reverse=True)[:top]
    return [
        {
            "op": event.key,
            "calls": event.count,
            "self_ms": round(event.self_cpu_time_total / 1000, 1),
            "share": round(event.self_cpu_time_total / total, 3),
        }
        for event in ranked
    ]


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def add_report_option(parser, default: str, files: str) -> None:
    """--report NAME names a run's result, benchmarks/results/<date>-NAME.<files>; --out PATH writes those files at
    PATH instead, replacing what is there: the one way a run writes over an existing file."""
    parser.add_argument(
        "--report",
        default=default,
        help=f"name of the result: a new benchmarks/results/<date>-<name>.{files} (default {default})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="PATH",
        help=f"write PATH.{files} instead (a suffix given is dropped), replacing existing files",
    )


def result_stem(name: str, out: Path | None = None) -> Path:
    """Where a run's files go, without their suffix: `out` when given (its .json/.md/.png suffix dropped), else
    benchmarks/results/<today>-<name>, with -2, -3, ... when a file of that name exists: a run never replaces a
    result, tracked or not, unless told where to write."""
    if out is not None:
        return out.with_suffix("") if out.suffix in RESULT_SUFFIXES else out
    return new_dated_stem(RESULTS, name, RESULT_SUFFIXES)


def result_file(stem: Path, suffix: str) -> Path:
    """`stem` + `suffix` (".json", ".md", ".png"), its folder made."""
    path = Path(f"{stem}{suffix}")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_report(stem: Path, figures: dict) -> Path:
    """<stem>.json with the figures and the machine that produced them."""
    path = result_file(stem, ".json")
    path.write_text(json.dumps(figures | {"machine": machine()}, indent=1) + "\n")
    return path


def publish(stem: Path, figures: dict, plot: Callable[[dict, Path], None], headline: Sequence[str]) -> None:
    """<stem>.json and its plot <stem>.png; prints the `headline` figures and where the files went."""
    plot(figures, result_file(stem, ".png"))
    write_report(stem, figures)
    print(json.dumps({key: figures[key] for key in headline}, indent=1))
    print(f"{machine_text()}; wrote {stem}.json and .png")


def synthetic_cache(root: Path, size: int, pairs: int) -> tuple[Path, PreprocessConfig]:
    """`pairs` synthetic raw frames (RAW_SIDE x `size`) under root/raw and their cache in root/cache, made by the
    data stages' own functions; almost all pairs go to the training split."""
    identities = 4
    synthesize(
        dataclasses.replace(
            SHIPPED.synthesize,
            identities=identities,
            images_per_identity=-(-pairs // identities),
            resolution=int(size * RAW_SIDE),
        ),
        root / "raw",
    )
    index, _ = ingest(root / "raw", "pairs", SHIPPED.ingest)
    settings = synthetic_preprocess(size)
    build_cache(index, settings, SHIPPED.ingest.max_pixels, root / "cache", on_error="fail")
    return root / "cache", settings


def synthetic_preprocess(size: int) -> PreprocessConfig:
    """How synthetic_cache preprocesses its frames."""
    return dataclasses.replace(
        SHIPPED.preprocess, image_size=size, face_crop=False, val_fraction=0.05, test_fraction=0.05
    )


class BatchClock(Callback):
    """Stamps the end of every training batch: a step's time is the gap between two stamps (fetching and
    preparing the batch, the D step and the G step). Only the first `batches` batches are stamped."""

    def __init__(self, batches: int):
        self.batches, self.stamps = batches, []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if batch_idx < self.batches:
            self.stamps.append(time.perf_counter())

    def step_seconds(self, warmup: int) -> float:
        """Median gap after the first `warmup` batches."""
        return statistics.median([b - a for a, b in zip(self.stamps, self.stamps[1:])][warmup - 1 :])


def enlarged(images: torch.Tensor, scale: float) -> torch.Tensor:
    """Float NHWC images resized by `scale` (bilinear), as a loader without a cache resizes them every step."""
    side = round(images.shape[1] * scale)
    resized = F.interpolate(images.permute(0, 3, 1, 2), size=(side, side), mode="bilinear", align_corners=False)
    return resized.permute(0, 2, 3, 1)


def decoded_batch(pairs: list[tuple[np.ndarray, np.ndarray]], jitter_scale: float) -> dict[str, torch.Tensor]:
    """A batch as a loader without a cache makes it from freshly preprocessed float NHWC pairs: enlarged and cropped
    by the same pix2pix jitter as the datamodule's, then NCHW in [-1, 1]."""
    enlarged_pairs = [enlarged(torch.from_numpy(np.stack(images)), jitter_scale) for images in zip(*pairs)]
    windows = random_windows(enlarged_pairs, side=pairs[0][1].shape[0])
    return {name: unit_to_model(images.permute(0, 3, 1, 2)) for name, images in zip(("thermal", "visible"), windows)}
