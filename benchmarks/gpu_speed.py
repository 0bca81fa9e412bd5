"""The paper's setup measured on a GPU (issue 59): images/s of the training step and achieved TFLOP/s as a share of
the GPU's dense peak for the step's arithmetic, against the plain fp32 pix2pix step (TF32 off); a short
time-to-quality run; onnxruntime on the GPU (where its CUDA provider is installed) against the CPU.

The step: the paper's networks at 256 px (benchmarks.common.PAPER_MODEL), the project's Pix2Pix under build_trainer
(precision plugin, non-finite checks, fused Adam), timed by a callback between batch ends after warm-up steps; the
baseline is benchmarks.train_step.PlainPix2Pix, the public pix2pix loop, fp32 with TF32 off. Interleaved rounds
(benchmarks/rounds.py): every configuration of a batch size once per round, order rotated.

Budget (<= 8 minutes on one H100/H200): 12 configurations per batch size (the plain step; 32-true with TF32 off and
on, 16-mixed and bf16-mixed, each NCHW and channels_last; the 16-mixed and bf16-mixed channels_last ones read per
batch instead of GPU-resident; torch.compile of both mixed channels_last ones at batch 64 only, since compilation
costs ~1 min each) x 3 batch sizes x 2 rounds, ~3 s each (Lightning's setup + 3 warm-up + 8 timed steps) ~ 4 min;
time to quality 2 x 45 s; onnxruntime ~ 20 s. `--dry-run`: the same code on the CPU at 32 px with tiny networks.

Writes <out>/<date>-gpu-speed.json and .png (default benchmarks/results/).
Usage: python -m benchmarks.gpu_speed [--dry-run] [--out benchmarks/results] [--rounds 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402

from benchmarks.common import PAPER, SHIPPED, machine, markdown_table, synthetic_cache  # noqa: E402
from benchmarks.rounds import measure_rounds, summarize  # noqa: E402
from benchmarks.train_step import PlainPix2Pix, memory_batches  # noqa: E402
from thermal2visible.data.cache import array_file  # noqa: E402
from thermal2visible.data.datamodule import PairedDataModule  # noqa: E402
from pipelines.studies.results import new_dated_stem  # noqa: E402
from thermal2visible.onnx_export import cache_to_model_input, export_generator  # noqa: E402
from thermal2visible.inference.session import onnx_session, run_onnx  # noqa: E402
from thermal2visible.models.networks import build_networks  # noqa: E402
from thermal2visible.models.payloads import load_generator, save_generator  # noqa: E402
from thermal2visible.training.module import Pix2Pix  # noqa: E402
from thermal2visible.training.precision import RunDevice  # noqa: E402
from thermal2visible.training.trainer import build_trainer  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

# Dense peaks in TFLOP/s by device name (NVIDIA's data sheets, without sparsity), first match wins. An unknown device
# gets no share, and the report says so.
PEAKS = {
    "H200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
    "H100": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},  # SXM
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
}
PLAIN = "plain pix2pix step (fp32, TF32 off)"


@dataclasses.dataclass(frozen=True)
class StepSetup:
    """One configuration of the project's step; its name lists every choice, so the table's rows explain themselves."""

    precision: str  # Lightning's
    tf32: bool | None = None  # 32-true only: mixed precisions do not use TF32 for their half-precision matmuls
    channels_last: bool = False
    resident: bool = True  # the cache held on the GPU, not read per batch
    compiled: bool = False

    @property
    def name(self) -> str:
        choices = [self.precision]
        choices += [] if self.tf32 is None else [f"TF32 {'on' if self.tf32 else 'off'}"]
        choices += ["channels_last"] * self.channels_last + ["read per batch"] * (not self.resident)
        return ", ".join(choices + ["compiled"] * self.compiled)

    @property
    def arithmetic(self) -> str:  # the key of the GPU's peak
        return {"16-mixed": "fp16", "bf16-mixed": "bf16"}.get(self.precision, "tf32" if self.tf32 else "fp32")


ARITHMETIC = [StepSetup("32-true", tf32=False), StepSetup("32-true", tf32=True), StepSetup("16-mixed"),
              StepSetup("bf16-mixed")]  # fmt: skip
MIXED_LAST = [dataclasses.replace(s, channels_last=True) for s in ARITHMETIC if s.tf32 is None]
SETUPS = [
    *ARITHMETIC,
    *(dataclasses.replace(s, channels_last=True) for s in ARITHMETIC),
    *(dataclasses.replace(s, resident=False) for s in MIXED_LAST),
    *(dataclasses.replace(s, compiled=True) for s in MIXED_LAST),
]
STEPS = {setup.name: setup for setup in SETUPS}


def peaks_of(device_name: str) -> dict | None:
    return next((peaks for name, peaks in PEAKS.items() if name in device_name), None)


class StepClock(Callback):
    """Stamps every batch end (across epochs) and stops the run after `steps` batches."""

    def __init__(self, steps: int):
        self.steps, self.stamps = steps, []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if module.device.type == "cuda":
            torch.cuda.synchronize()
        self.stamps.append(time.perf_counter())
        trainer.should_stop = len(self.stamps) >= self.steps

    def seconds(self, warmup: int) -> float:
        return statistics.median(b - a for a, b in zip(self.stamps[warmup:], self.stamps[warmup + 1 :]))


def set_tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on


class ForceTf32(Callback):
    """32-true with TF32 on: the project sets TF32 off for 32-true (RunDevice.trainer_options); forced after it."""

    def __init__(self, on: bool):
        self.on = on

    def on_fit_start(self, trainer, module) -> None:
        set_tf32(self.on)


def project_step(job: dict, name: str) -> float:
    setup = STEPS[name]
    train = dataclasses.replace(
        PAPER.train if job["size"] == 256 else SHIPPED.train,
        batch_size=job["batch"], devices=1, accelerator=job["accelerator"], precision=setup.precision,
        channels_last=setup.channels_last, compile=setup.compiled, max_epochs=1000, min_epochs=1,
    )  # fmt: skip
    torch.manual_seed(0)
    module = Pix2Pix(*build_networks(job["model"], job["size"], 1, 3), train)
    clock = StepClock(job["warmup"] + job["steps"] + 1)
    callbacks = [clock] + ([ForceTf32(setup.tf32)] if setup.tf32 is not None else [])
    device = RunDevice(job["accelerator"], setup.precision, setup.channels_last)
    trainer = build_trainer(train, device, callbacks=callbacks, limit_val_batches=0)
    loader = dataclasses.replace(SHIPPED.loader, preload="auto" if setup.resident else False, num_workers=0)
    trainer.fit(module, datamodule=PairedDataModule(job["cache"], job["batch"], loader))
    return clock.seconds(job["warmup"])


def plain_step(job: dict) -> float:
    """The public pix2pix loop on the run's device, fp32 with TF32 off."""
    set_tf32(False)
    torch.manual_seed(0)
    plain = PlainPix2Pix(job["model"], job["size"])
    device = "cuda" if job["accelerator"] == "gpu" else "cpu"
    for network in (plain.generator, plain.discriminator):
        network.to(device)
    plain.opt_g, plain.opt_d = (
        torch.optim.Adam(net.parameters(), SHIPPED.train.lr_g, betas=(SHIPPED.train.beta1, SHIPPED.train.beta2))
        for net in (plain.generator, plain.discriminator)
    )  # made again after the move: Adam's state lives with the weights
    stamps = []
    for thermal, visible in job["batches"]:
        plain.step(thermal.to(device), visible.to(device))
        if device == "cuda":
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
    return statistics.median(b - a for a, b in zip(stamps[job["warmup"] :], stamps[job["warmup"] + 1 :]))


def flops_per_image(model, size: int) -> int:
    """FLOPs of one plain step on one image (linear in the batch), counted on the CPU."""
    plain = PlainPix2Pix(model, size)
    with FlopCounterMode(display=False) as counter:
        plain.step(torch.zeros(1, 1, size, size), torch.zeros(1, 3, size, size))
    return counter.get_total_flops()


def step_figures(args, cache: Path, model, size: int, accelerator: str, peaks: dict | None) -> list[dict]:
    flops = flops_per_image(model, size)
    results = []
    for batch in args.batches:
        batches = memory_batches(cache, size, batch, args.warmup + args.steps + 1)
        job = dict(size=size, batch=batch, model=model, cache=cache, accelerator=accelerator,
                   warmup=args.warmup, steps=args.steps, batches=batches)  # fmt: skip
        names = [n for n in STEPS if not (STEPS[n].compiled and (batch != max(args.batches) or args.no_compile))]
        measurements = {PLAIN: lambda job=job: plain_step(job)}
        measurements |= {name: (lambda name=name, job=job: project_step(job, name)) for name in names}
        records = measure_rounds(measurements, args.rounds, warmup_rounds=0, label=f"batch {batch}: ")
        summary = summarize(records, baseline=PLAIN)
        for name, figures in summary["configs"].items():
            kind = "fp32" if name == PLAIN else STEPS[name].arithmetic
            tflops = flops * batch / figures["median_s"] / 1e12
            figures |= {
                "images_per_s": round(batch / figures["median_s"], 2),
                "arithmetic": kind,
                "tflops_per_s": float(f"{tflops:.4g}"),
                "share_of_dense_peak": round(tflops / peaks[kind], 4) if peaks else None,
            }
        results.append({"batch": batch, "summary": summary, "records": records})
    return results


class PsnrClock(Callback):
    """(seconds since fit start, validation PSNR) after every validation."""

    def on_fit_start(self, trainer, module) -> None:
        self.start, self.curve = time.perf_counter(), []

    def on_validation_end(self, trainer, module) -> None:
        psnr = trainer.callback_metrics.get("val_psnr")
        if psnr is not None:
            self.curve.append((round(time.perf_counter() - self.start, 2), round(psnr.item(), 3)))


def time_to_quality(cache: Path, model, size: int, accelerator: str, seconds: float) -> dict:
    """The pix2pix defaults (params/pix2pix_default.yaml's train settings: batch 1, 32-true, plain Adam) against the
    project's GPU defaults (params/paper_gpu.yaml on one device), each trained for `seconds` (train.max_minutes,
    in place of the paper's 50-epoch window and patience, which do not fit a lease); the time at which each first
    reaches the pix2pix run's best validation PSNR."""
    from thermal2visible.config.load import load_params, preset_overrides
    from thermal2visible.paths import PARAMS

    project = Path(__file__).resolve().parents[1]
    setups = {
        "pix2pix defaults": preset_overrides(project / "params" / "pix2pix_default.yaml"),
        "project GPU defaults": preset_overrides(project / "params" / "paper_gpu.yaml") + ["train.devices=1"],
    }
    curves = {}
    for name, overrides in setups.items():
        params = load_params(project / PARAMS, overrides)
        batch = min(params.train.batch_size, 8 if accelerator == "cpu" else params.train.batch_size)
        train = dataclasses.replace(params.train, accelerator=accelerator, batch_size=batch, max_epochs=10_000,
                                    max_minutes=seconds / 60)  # fmt: skip
        precision = train.precision if accelerator == "gpu" or train.precision == "32-true" else "32-true"
        torch.manual_seed(0)
        module = Pix2Pix(*build_networks(model, size, 1, 3), train)
        clock = PsnrClock()
        device = RunDevice(accelerator, precision, bool(train.channels_last is True))
        loader = dataclasses.replace(params.loader, num_workers=0)
        build_trainer(train, device, callbacks=[clock]).fit(module, datamodule=PairedDataModule(cache, batch, loader))
        curves[name] = {"batch_size": batch, "precision": precision, "curve": clock.curve}
    target = max(psnr for _, psnr in curves["pix2pix defaults"]["curve"])
    for figures in curves.values():
        figures["seconds_to_target"] = next((t for t, psnr in figures["curve"] if psnr >= target), None)
    return {"target_psnr": target, "budget_s": seconds, "setups": curves}


def onnxruntime_figures(cache: Path, model, size: int, accelerator: str, scratch: Path, repeats: int) -> dict:
    """Seconds per 256-px image at batch 1 and 8 and per 640x512 frame: onnxruntime's CUDA provider where this
    onnxruntime has it (else torch on the GPU stands in, said so) against onnxruntime on the CPU."""
    import onnxruntime as ort

    torch.manual_seed(0)
    generator, _ = build_networks(model, size, 1, 3)
    save_generator(generator, scratch / "generator.pt", "eval", preprocess=dataclasses.asdict(SHIPPED.preprocess))
    generator, payload = load_generator(scratch / "generator.pt")
    payload["model"]["image_size"] = size
    payload["preprocess"]["image_size"] = size
    export_generator(generator, payload, scratch / "generator.onnx", opset=18, thermal_dtype="uint16")
    cpu = onnx_session(scratch / "generator.onnx")
    engines = {"onnxruntime CPU": lambda x: run_onnx(cpu, x)}
    why = None
    if accelerator == "gpu":
        if "CUDAExecutionProvider" in ort.get_available_providers():
            gpu = ort.InferenceSession(str(scratch / "generator.onnx"), providers=["CUDAExecutionProvider"])
            engines["onnxruntime CUDA"] = lambda x: run_onnx(gpu, x)
        else:
            why = f"onnxruntime {ort.__version__} is the CPU build here: torch (fp32, TF32 off) on the GPU stands in"
            on_gpu = generator.to("cuda")

            def torch_gpu(x):
                with torch.inference_mode():
                    out = on_gpu(torch.from_numpy(x).cuda()).cpu().numpy()
                return out

            engines["torch on the GPU"] = torch_gpu
    images = cache_to_model_input(np.load(array_file(cache, "train", "thermal")))
    frame_side = (512, 640) if size == 256 else (2 * size, 3 * size)  # the dry run's frame: a 2x3-tile stand-in
    inputs = {
        "1 image": images[:1],
        "8 images": np.resize(images, (8, *images.shape[1:])),
        f"{frame_side[1]}x{frame_side[0]} frame": np.zeros((1, 1, *frame_side), np.float32),
    }
    figures = {}
    for label, batch in inputs.items():
        for engine, call in engines.items():
            call(batch)  # warm-up: kernels, allocations
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                call(batch)
                times.append(time.perf_counter() - start)
            figures.setdefault(label, {})[engine] = {
                "ms_per_image": round(1000 * statistics.median(times) / len(batch), 3)
            }
    return {"figures": figures, "why_not_onnxruntime_cuda": why}


def plot(report: dict, path: Path) -> None:
    steps = report["steps"]
    figure, axes = plt.subplots(1, len(steps), figsize=(6 * len(steps), 5), squeeze=False)
    for axis, result in zip(axes[0], steps):
        names = list(result["summary"]["configs"])
        values = [result["summary"]["configs"][n]["images_per_s"] for n in names]
        axis.barh(names, values, color=["#999999"] + ["#4c72b0"] * (len(names) - 1))
        axis.invert_yaxis()
        axis.set(xlabel="images/s (median of rounds)", title=f"batch {result['batch']}")
        axis.tick_params(axis="y", labelsize=7)
    figure.suptitle(f"Pix2Pix training step, {report['size']} px, {report['device']}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def print_steps(steps: list[dict]) -> None:
    for result in steps:
        rows = [[n, f["images_per_s"], f["speedup_median"], f["arithmetic"], f["tflops_per_s"],
                 "" if f["share_of_dense_peak"] is None else f"{f['share_of_dense_peak']:.1%}"]
                for n, f in result["summary"]["configs"].items()]  # fmt: skip
        print(f"batch {result['batch']}")
        print(markdown_table(["configuration", "images/s", "x plain", "arithmetic", "TFLOP/s", "of dense peak"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the same code on the CPU, tiny sizes, seconds")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "benchmarks" / "results")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-compile", action="store_true", help="leave out the compiled configurations")
    args = parser.parse_args()
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here (torch sees none): run with --dry-run on the CPU")
    start = time.perf_counter()
    if args.dry_run:  # the code paths, not figures: 32 px, tiny networks, one round, no compile (minutes on 2 cores)
        size, model, accelerator, ttq_s, repeats = (
            32,
            dataclasses.replace(
                SHIPPED.model,
                generator_settings=SHIPPED.model.generator_settings | {"ngf": 8},
                discriminator_settings=SHIPPED.model.discriminator_settings | {"ndf": 8},
            ),
            "cpu",
            3,
            2,
        )
        args.batches, args.warmup, args.steps, args.rounds, args.no_compile = [2], 1, 2, 1, True
        device_name = "cpu (dry run)"
    else:
        size, model, accelerator, ttq_s, repeats = PAPER.preprocess.image_size, PAPER.model, "gpu", 45, 10
        args.batches, args.warmup, args.steps = [1, 16, 64], 3, 8
        device_name = torch.cuda.get_device_name()
    peaks = peaks_of(device_name)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "command": "python -m benchmarks.gpu_speed" + (" --dry-run" if args.dry_run else ""),
        "dry_run": args.dry_run,
        "device": device_name,
        "dense_peaks_tflops": peaks,
        "peaks_note": None if peaks else f"no dense peak known for {device_name!r}: shares omitted",
        "size": size,
        "model": dataclasses.asdict(model),
        "rounds": args.rounds,
        "warmup_steps": args.warmup,
        "timed_steps": args.steps,
        "machine": machine(),
    }
    stem = new_dated_stem(args.out, "gpu-speed" + ("-dry-run" if args.dry_run else ""), (".json", ".png"))
    stem.parent.mkdir(parents=True, exist_ok=True)

    def write(**figures) -> None:
        """The report so far: a lease that ends mid-run still leaves the phases it finished."""
        report.update(figures, wall_seconds=round(time.perf_counter() - start, 1))
        Path(f"{stem}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="t2v-gpu-speed-") as scratch:
        pairs = int(max(args.batches) * 2 / 0.9) + 8  # two batches an epoch at the largest batch
        cache, _ = synthetic_cache(Path(scratch) / "data", size, pairs)
        steps = step_figures(args, cache, model, size, accelerator, peaks)
        write(steps=steps)
        plot(report, Path(f"{stem}.png"))
        print_steps(steps)
        write(time_to_quality=time_to_quality(cache, model, size, accelerator, ttq_s))
        write(inference=onnxruntime_figures(cache, model, size, accelerator, Path(scratch), repeats))
    print(f"wrote {stem}.json and .png in {report['wall_seconds']} s")
    assert all(math.isfinite(f["images_per_s"]) for r in steps for f in r["summary"]["configs"].values())


if __name__ == "__main__":
    main()
