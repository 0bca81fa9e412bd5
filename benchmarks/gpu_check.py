"""One prepared GPU check (issue 58): the training, resume, DDP, export and serving paths on a CUDA GPU, each item a
short measured step through the project's own code (build_trainer, build_networks, Pix2Pix, export_generator, the
REST server), recorded as pass, fail or skip with its reason.

A GPU is lent only now and then, for minutes: this script is ready before it is, and `--dry-run` runs the same items
on the CPU with tiny sizes (tests/project/test_gpu_scripts.py), so it cannot rot. Items that need CUDA run their CPU
equivalent in a dry run, or say "skipped: needs CUDA".

Writes <out>/<date>-gpu-check.md and .json (dry run: <date>-gpu-check-dry-run.*); exits 1 when an item fails.
Usage: python -m benchmarks.gpu_check [--dry-run] [--out benchmarks/results] [--items NAME ...]
On the device machine: docs/training.md ("GPUs") says how to carry the wheels.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402

from thermal2visible.cli import quiet_lightning  # noqa: E402
from thermal2visible.config.load import load_params, preset_overrides  # noqa: E402
from thermal2visible.config.schema import Params  # noqa: E402
from thermal2visible.data.cache import array_file, build_cache, load_manifest  # noqa: E402
from thermal2visible.data.datamodule import PairedDataModule  # noqa: E402
from thermal2visible.data.ingest import ingest  # noqa: E402
from thermal2visible.data.synthetic import synthesize  # noqa: E402
from pipelines.studies.results import new_dated_stem  # noqa: E402
from thermal2visible.errors import ConfigError  # noqa: E402
from thermal2visible.models.networks import build_networks  # noqa: E402
from thermal2visible.paths import PARAMS  # noqa: E402
from thermal2visible.training.module import Pix2Pix  # noqa: E402
from thermal2visible.training.precision import OncePerIterationScaler, RunDevice  # noqa: E402
from thermal2visible.training.resume import checkpointing, last_checkpoint  # noqa: E402
from thermal2visible.training.trainer import GanDDPStrategy, build_trainer, per_process_batch  # noqa: E402

quiet_lightning()
REPO = Path(__file__).resolve().parents[1]
TINY = preset_overrides(REPO / "params" / "tiny.yaml")
# On the GPU the same tiny data, a little larger: the paths are checked here, not the speed (benchmarks/gpu_speed.py).
GPU_SIZES = [
    "synthesize.resolution=80",
    "preprocess.image_size=64",
    "model.generator_settings.ngf=32",
    "model.discriminator_settings.ndf=32",
    "train.batch_size=8",
]
EPOCHS, BATCHES = 2, 2  # per training: enough for a resume half-way and for the random streams to matter
DDP_TIMEOUT_S = 240  # a hang under DDP (SyncBatchNorm's collectives in validation, say) is a failure, not a stall
SKIP_CUDA = "needs CUDA"


@dataclasses.dataclass
class Check:
    """What every item gets: where it runs, the params, the cached data and a scratch folder."""

    dry_run: bool
    accelerator: str  # "gpu" on the device machine, "cpu" in a dry run
    params: Params
    cache: Path
    scratch: Path
    overrides: list[str]  # the params overrides that made `params` (a DDP worker rebuilds them)
    trained: dict = dataclasses.field(default_factory=dict)  # results items share (the 16-mixed module to export)

    @property
    def device(self) -> str:
        return "cuda" if self.accelerator == "gpu" else "cpu"


class Skip(Exception):
    """An item that cannot run here; its message says why."""


def settings(check: Check, accelerator: str | None = None, **changes):
    """The tiny run's train settings on `accelerator`: deterministic kernels, so reruns on one device agree."""
    base = dict(
        accelerator=accelerator or check.accelerator,
        max_epochs=EPOCHS,
        min_epochs=1,
        deterministic=True,
        channels_last=False,
    )
    return dataclasses.replace(check.params.train, **(base | changes))


def new_module(check: Check, train, cls: type = Pix2Pix) -> Pix2Pix:
    torch.manual_seed(train.seed)
    manifest = load_manifest(check.cache)
    networks = build_networks(
        check.params.model, manifest["image_size"], manifest["thermal_channels"], manifest["visible_channels"]
    )
    return cls(*networks, train)


def fit(check: Check, train, device: RunDevice, module=None, callbacks=(), preload=True, ckpt=None, **overrides):
    """Train `module` (a fresh Pix2Pix by default) for BATCHES batches an epoch through build_trainer."""
    module = module or new_module(check, train)
    loader = dataclasses.replace(check.params.loader, preload=preload, num_workers=0)
    data = PairedDataModule(check.cache, per_process_batch(train), loader)
    options = dict(limit_train_batches=BATCHES, limit_val_batches=1) | overrides
    trainer = build_trainer(train, device, callbacks=callbacks, **options)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt, weights_only=True if ckpt else None)
    return module, trainer, data


def losses_of(trainer) -> dict[str, float]:
    return {k: v.item() for k, v in trainer.callback_metrics.items() if k.startswith("loss")}


def weights_cpu(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().float().cpu().clone() for name, value in module.state_dict().items()}


def max_difference(a: dict, b: dict) -> float:
    return max((a[name] - b[name]).abs().max().item() for name in a if a[name].numel())


# --- the items -------------------------------------------------------------------------------------------------------


def environment(check: Check) -> dict:
    import lightning
    import onnxruntime

    facts = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "lightning": lightning.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_providers": onnxruntime.get_available_providers(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
        "cpu_threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        facts |= {"gpu_memory_gib": round(total / 2**30, 1), "capability": list(torch.cuda.get_device_capability())}
    return facts


def training_step(precision: str, tf32: bool | None = None) -> Callable[[Check], dict]:
    """A short training under `precision` (TF32 forced on or off after build_trainer, which sets it off for
    32-true: the project has no setting for 32-true with TF32): finite losses, weights moved."""

    def item(check: Check) -> dict:
        train = settings(check, precision=precision)
        device = RunDevice(check.accelerator, precision, False)
        module = new_module(check, train)
        before = weights_cpu(module)
        flags = {}
        if tf32 is not None:
            flags = dict(tf32_asked=tf32)

            class ForceTf32(Callback):
                def on_fit_start(self, trainer, pl_module):  # after build_trainer's RunDevice set it
                    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32

            callbacks = [ForceTf32()]
        else:
            callbacks = []
        start = time.perf_counter()
        module, trainer, _ = fit(check, train, device, module, callbacks)
        seconds = time.perf_counter() - start
        losses = losses_of(trainer)
        moved = max_difference(before, weights_cpu(module))
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        result = flags | {
            "lightning_precision": trainer.precision,
            "tf32_in_use": torch.backends.cuda.matmul.allow_tf32 if check.device == "cuda" else None,
            "losses": losses,
            "largest_weight_change": moved,
            "fit_seconds": round(seconds, 2),
            "loss_scale": scaler.get_scale() if scaler is not None else None,
            "scaler": type(scaler).__name__ if scaler is not None else None,
        }
        assert losses and all(math.isfinite(v) for v in losses.values()), f"non-finite losses {losses}"
        assert moved > 0, "no weight moved"
        if precision == "16-mixed":
            assert isinstance(scaler, OncePerIterationScaler), f"16-mixed without the project's scaler: {scaler}"
            check.trained["16-mixed"] = module
        if check.device == "cpu" and tf32 is not None:
            result["note"] = "TF32 is a CUDA setting: on the CPU this is the 32-true run"
        return result

    return item


class Overflowing(Pix2Pix):
    """Under 16-mixed: on batch `poisoned`, D's and G's first weights get infinite gradients (finite losses), so
    both optimizer steps of that iteration overflow. Records the loss scale and the weights around each step."""

    poisoned = 1

    def on_train_start(self):
        self.record = []

    def training_step(self, batch, batch_idx):
        scaler = self.trainer.precision_plugin.scaler
        hooks = []
        if batch_idx == self.poisoned:
            hooks = [
                next(net.parameters()).register_hook(lambda gradient: gradient * math.inf)
                for net in (self.discriminator, self.generator)
            ]
        before = {n: p.detach().clone() for n, p in self.named_parameters()}
        scale = scaler.get_scale()
        losses = super().training_step(batch, batch_idx)
        for hook in hooks:
            hook.remove()
        unchanged = all(torch.equal(before[n], p) for n, p in self.named_parameters())
        finite = losses is not None and all(torch.isfinite(v).all().item() for v in losses.values())
        after = scaler.get_scale()
        self.record.append(
            dict(
                batch=batch_idx,
                scale_before=scale,
                scale_after=after,
                weights_unchanged=unchanged,
                losses_finite=finite,
            )
        )
        return losses


def overflow_16_mixed(check: Check) -> dict:
    """A forced overflow under 16-mixed skips both optimizers' steps and halves the scale once for the iteration."""
    train = settings(check, precision="16-mixed", max_epochs=1)
    module = new_module(check, train, Overflowing)
    module, trainer, _ = fit(check, train, RunDevice(check.accelerator, "16-mixed", False), module,
                             limit_train_batches=3, limit_val_batches=0)  # fmt: skip
    record = {r["batch"]: r for r in module.record}
    bad, others = record[Overflowing.poisoned], [r for b, r in record.items() if b != Overflowing.poisoned]
    # Both networks overflowed in one iteration: one halving, not two (OncePerIterationScaler), and no step taken.
    assert bad["scale_after"] == bad["scale_before"] / 2, f"scale {bad['scale_before']} -> {bad['scale_after']}"
    assert bad["weights_unchanged"], "an overflowing step changed weights"
    assert bad["losses_finite"] and module.bad_steps == 0, "the overflow was taken for a non-finite loss"
    # The other iterations may overflow on their own at the first scales (65536: L1 x 100 in fp16), halving once too.
    assert all(r["scale_after"] in (r["scale_before"], r["scale_before"] / 2) for r in others), others
    assert any(not r["weights_unchanged"] for r in others), "no other iteration stepped"
    return {"steps": module.record, "growth_interval": trainer.precision_plugin.scaler.get_growth_interval()}


class StopAfterFirstEpoch(Callback):
    """The interruption: the run stops after its first epoch's checkpoint, as a killed run's last.ckpt holds it."""

    def on_train_epoch_end(self, trainer, pl_module):
        trainer.should_stop = True


class Loaded(Callback):
    """The weights as training resumes on the new device, to set against the checkpoint's."""

    def on_train_start(self, trainer, pl_module):
        self.weights = weights_cpu(pl_module)


def resume(source: str, target: str) -> Callable[[Check], dict]:
    """Half a run on `source`, resumed on `target` ("gpu" or "cpu"): the state arrives exactly, and the weights end
    as the uninterrupted run's where both halves run the same deterministic kernels (one device). Across devices the
    kernels (and the dropout masks, drawn by each device's own generator) differ: the distance is reported. GPU->GPU
    runs 16-mixed (the GPU default, its scaler in the checkpoint); a cross-device resume 32-true, which both take."""

    def item(check: Check) -> dict:
        if "gpu" in (source, target) and check.device != "cuda":
            raise Skip(SKIP_CUDA)
        precision = "16-mixed" if source == target == "gpu" else "32-true"
        references = {}
        for accelerator in dict.fromkeys((source, target)):
            train = settings(check, accelerator, precision=precision)
            module, _, _ = fit(check, train, RunDevice(accelerator, precision, False))
            references[accelerator] = weights_cpu(module)
        folder = check.scratch / f"resume-{source}-{target}"
        first = settings(check, source, precision=precision)
        fit(check, first, RunDevice(source, precision, False), callbacks=[*checkpointing(folder, "gpu-check", None),
            StopAfterFirstEpoch()])  # fmt: skip
        checkpoint = last_checkpoint(folder)
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
        loaded = Loaded()
        second = settings(check, target, precision=precision)
        module, trainer, _ = fit(
            check, second, RunDevice(target, precision, False), callbacks=[loaded], ckpt=checkpoint
        )
        carried = max_difference({n: v.float() for n, v in saved["state_dict"].items()}, loaded.weights)
        final = weights_cpu(module)
        result = {
            "precision": precision,
            "checkpoint_epoch": saved["epoch"],
            "epochs_trained": trainer.current_epoch,
            "state_carried_max_difference": carried,
            "vs_uninterrupted": {f"on {a}": max_difference(final, w) for a, w in references.items()},
        }
        assert carried == 0, f"the resumed weights differ from the checkpoint's by {carried}"
        assert all(torch.isfinite(w).all() for w in final.values()), "non-finite weights"
        if source == target:
            assert result["vs_uninterrupted"][f"on {source}"] == 0, "not the uninterrupted run's weights"
        else:
            result["note"] = "across devices the kernels and dropout streams differ: no bitwise equality expected"
        return result

    return item


def ddp_run(check: Check, name: str, sync_batchnorm: bool = False) -> dict:
    """2 processes started by Lightning's launcher (`--ddp-worker`), through GanDDPStrategy's two wrappers; on a GPU
    both on GPU 0 over gloo. Each rank reports its losses and a digest of its weights; they must agree."""
    folder = check.scratch / name
    folder.mkdir(parents=True, exist_ok=True)
    job = dict(cache=str(check.cache), out=str(folder), accelerator=check.accelerator,
               overrides=check.overrides, sync_batchnorm=sync_batchnorm)  # fmt: skip
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--ddp-worker", json.dumps(job)]
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=DDP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"no answer after {DDP_TIMEOUT_S} s: a hang") from None
    ranks = [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]
    assert done.returncode == 0 and len(ranks) == 2, f"exit {done.returncode}: {done.stderr[-2500:]}"
    assert all(r["world_size"] == 2 and r["backend"] == "gloo" for r in ranks), ranks
    assert all(r["wrapped"] for r in ranks), "the networks were not wrapped in DistributedDataParallel"
    assert ranks[0]["digest"] == ranks[1]["digest"], "the replicas' weights differ"
    assert all(math.isfinite(v) for r in ranks for v in r["losses"].values()), ranks
    return {"ranks": ranks}


class SyncBatchNormSeen(Callback):
    """Whether the module held SyncBatchNorm layers while it trained (Lightning reverts them when fit ends)."""

    seen = False

    def on_train_batch_end(self, trainer, module, *args) -> None:
        self.seen = any(isinstance(m, torch.nn.SyncBatchNorm) for m in module.modules())


def ddp_worker(job: dict) -> None:
    """One rank of ddp_run (Lightning re-runs this command line for rank 1)."""
    params = load_params(REPO / PARAMS, job["overrides"])
    check = Check(True, job["accelerator"], params, Path(job["cache"]), Path(job["out"]), job["overrides"])
    changes = dict(sync_batchnorm=job["sync_batchnorm"], test_mode="train" if job["sync_batchnorm"] else "eval")
    if job["accelerator"] == "cpu":
        train = settings(check, devices=2, precision="32-true", **changes)
        overrides = {}  # the project's own path: build_trainer picks GanDDPStrategy over gloo
    else:
        # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): gloo, both ranks on cuda:0, same strategy.
        train = settings(check, precision="16-mixed", **changes)
        strategy = GanDDPStrategy(process_group_backend="gloo", gradient_as_bucket_view=True)
        strategy.parallel_devices = [torch.device("cuda", 0)] * 2
        overrides = {"strategy": strategy}
    layers = SyncBatchNormSeen()
    device = RunDevice(check.accelerator, train.precision, False)
    module, trainer, _ = fit(check, train, device, callbacks=[layers], **overrides)
    weights = torch.cat([p.detach().float().flatten().cpu() for p in module.parameters()])
    report = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "wrapped": all(isinstance(r, torch.nn.parallel.DistributedDataParallel) for r in module.replicas.values())
        and len(module.replicas) == 2,
        "device": str(next(module.parameters()).device),
        "sync_batchnorm": layers.seen,
        "losses": losses_of(trainer),
        "digest": [round(weights.sum().item(), 6), round(weights.abs().sum().item(), 6)],
    }
    (Path(job["out"]) / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


def ddp_gloo(check: Check) -> dict:
    result = ddp_run(check, "ddp")
    if check.device == "cuda":
        result["nccl"] = "NCCL needs one GPU per process (two ranks on one GPU: 'Duplicate GPU detected')"
    return result


def sync_batchnorm(check: Check) -> dict:
    """SyncBatchNorm under test_mode: train (validation runs batch norm in training mode: collectives in
    validation too), 2 processes. On the CPU the project refuses it up front: that refusal is checked instead."""
    if check.device != "cuda":
        try:
            build_trainer(settings(check, sync_batchnorm=True))
        except ConfigError as error:
            raise Skip(f"{SKIP_CUDA} (checked instead: build_trainer refuses it on the CPU: {error})") from None
        raise AssertionError("build_trainer accepted sync_batchnorm on the CPU")
    result = ddp_run(check, "syncbn", sync_batchnorm=True)
    assert all(r["sync_batchnorm"] for r in result["ranks"]), "no SyncBatchNorm layer"
    return result


def compiled(check: Check) -> dict:
    """train.compile under the device's default precision: finite losses, and how long the first fit took."""
    precision = "16-mixed" if check.device == "cuda" else "32-true"
    train = settings(check, precision=precision, compile=True, max_epochs=1)
    start = time.perf_counter()
    module, trainer, _ = fit(check, train, RunDevice(check.accelerator, precision, False), new_module(check, train))
    losses = losses_of(trainer)
    assert all(math.isfinite(v) for v in losses.values()), losses
    return {
        "precision": precision,
        "losses": losses,
        "fit_seconds_with_compilation": round(time.perf_counter() - start, 1),
    }


def preload(check: Check) -> dict:
    """The training split preloaded onto the run's device (preload: auto) trains to the same weights as read per
    batch (deterministic kernels)."""
    precision = "16-mixed" if check.device == "cuda" else "32-true"
    train = settings(check, precision=precision)
    device = RunDevice(check.accelerator, precision, False)
    loaded, _, data = fit(check, train, device, preload="auto")
    tensors = data.splits["train"].tensors
    where = tensors["visible"].device.type if tensors is not None else "not preloaded"
    read, _, _ = fit(check, train, device, preload=False)
    difference = max_difference(weights_cpu(loaded), weights_cpu(read))
    assert where == check.device, f"preload: auto left the split on {where}"
    assert difference == 0, f"preloaded and read-per-batch runs differ by {difference}"
    return {"preloaded_on": where, "vs_read_per_batch": difference}


def exported(check: Check) -> dict:
    """The 16-mixed generator trained above, saved as the train stage saves it, exported by export_generator, and
    run by onnxruntime (CUDA provider where it is installed) against torch on the run's device."""
    import onnxruntime as ort

    from thermal2visible.onnx_export import cache_to_model_input, check_parity, export_generator
    from thermal2visible.inference.session import onnx_session, run_onnx
    from thermal2visible.models.payloads import load_generator, save_generator

    module = check.trained.get("16-mixed")
    if module is None:
        raise Skip("the 16-mixed training item did not run")
    manifest = load_manifest(check.cache)
    folder = check.scratch / "export"
    save_generator(module.generator, folder / "generator.pt", "eval", preprocess=manifest["preprocess"])
    generator, payload = load_generator(folder / "generator.pt")
    onnx_path = folder / "generator.onnx"
    export_generator(generator, payload, onnx_path, check.params.export.opset, manifest["thermal_dtype"])
    images = cache_to_model_input(np.load(array_file(check.cache, "test", "thermal")))
    cpu_error = check_parity(onnx_session(onnx_path), generator, images, check.params.export.atol)  # the stage's check
    result = {
        "onnx_bytes": onnx_path.stat().st_size,
        "parity_cpu_max_error": cpu_error,
        "atol": check.params.export.atol,
    }
    if check.device == "cuda":
        with torch.inference_mode():
            on_gpu = generator.to("cuda")(torch.from_numpy(images).cuda()).cpu().numpy()
        providers = ort.get_available_providers()
        if "CUDAExecutionProvider" in providers:
            session = ort.InferenceSession(str(onnx_path), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
            result["onnxruntime_provider"] = session.get_providers()[0]
        else:
            session = onnx_session(onnx_path)
            result["onnxruntime_provider"] = "CPUExecutionProvider"
            result["why_not_cuda"] = f"onnxruntime {ort.__version__} here is the CPU build (providers {providers})"
        error = float(np.abs(run_onnx(session, images) - on_gpu).max())
        result["parity_vs_torch_on_gpu_max_error"] = error
        assert error <= check.params.export.atol, f"onnxruntime vs torch on the GPU: {error}"
    check.trained["onnx"] = onnx_path
    return result


def served(check: Check) -> dict:
    """The exported model packaged as `register` packages it, served by the project's REST server (pipelines/serve.py,
    what `make serve` runs) and called by the README's client example (examples/client.py)."""
    if "onnx" not in check.trained:
        raise Skip("the export item did not run")
    try:
        import mlflow.pyfunc
    except ImportError as error:
        raise Skip(f"mlflow not importable ({error}): carry its wheels (benchmarks/gpu_wheels.sh)") from None
    from PIL import Image

    from tests.support.servers import model_server
    from thermal2visible.registry.packing import pyfunc_arguments
    from thermal2visible.inference.request_budget import ServedLimits

    model_dir = check.scratch / "pyfunc"
    with pyfunc_arguments(check.trained["onnx"], ServedLimits.of(check.params.serve)) as arguments:
        mlflow.pyfunc.save_model(str(model_dir), **arguments)
    thermal = sorted((check.scratch / "raw").rglob("*.png"))[0]
    visible = check.scratch / "visible.png"
    with model_server(str(model_dir), check.scratch / "serve") as url:
        client = [sys.executable, str(REPO / "examples" / "client.py"), str(thermal), str(visible), "--url", url]
        done = subprocess.run(client, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    size_in, size_out = Image.open(thermal).size, Image.open(visible).size
    assert size_in == size_out, f"asked {size_in}, got {size_out}"
    return {"thermal": str(thermal.relative_to(check.scratch)), "answered_size": list(size_out),
            "note": "the served model runs onnxruntime on the CPU (inference.session.onnx_session): a GPU host serves "
                    "from its CPU"}  # fmt: skip


ITEMS: dict[str, Callable[[Check], dict]] = {
    "environment": environment,
    "train 16-mixed": training_step("16-mixed"),
    "train bf16-mixed": training_step("bf16-mixed"),
    "train 32-true, TF32 off": training_step("32-true", tf32=False),
    "train 32-true, TF32 on": training_step("32-true", tf32=True),
    "16-mixed overflow skips the step, halves the scale once": overflow_16_mixed,
    "resume gpu->gpu": resume("gpu", "gpu"),
    "resume gpu->cpu": resume("gpu", "cpu"),
    "resume cpu->gpu": resume("cpu", "gpu"),
    "resume cpu->cpu": resume("cpu", "cpu"),
    "DDP, 2 processes over gloo": ddp_gloo,
    "SyncBatchNorm, test_mode train": sync_batchnorm,
    "compile": compiled,
    "preload on the device": preload,
    "export + onnxruntime parity": exported,
    "serve + client example": served,
}


def run_item(name: str, item: Callable[[Check], dict], check: Check) -> dict:
    start = time.perf_counter()
    try:
        status, details = "pass", item(check)
    except Skip as why:
        status, details = "skip", {"reason": str(why)}
    except Exception as error:  # a failing item is recorded and the others still run
        status, details = "fail", {"reason": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    seconds = round(time.perf_counter() - start, 2)
    print(f"[{status}] {name} ({seconds} s)" + (f": {details['reason'][:300]}" if "reason" in details else ""),
          flush=True)  # fmt: skip
    return {"item": name, "status": status, "seconds": seconds, **details}


def prepare(check_root: Path, overrides: list[str]) -> tuple[Params, Path]:
    """The tiny synthetic dataset through the data stages' own functions."""
    params = load_params(REPO / PARAMS, overrides)
    synthesize(params.synthesize, check_root / "raw")
    index, _ = ingest(check_root / "raw", "pairs", params.ingest)
    build_cache(index, params.preprocess, params.ingest.max_pixels, check_root / "cache", on_error="fail")
    return params, check_root / "cache"


def markdown(report: dict) -> str:
    facts = report["environment"]
    lines = [
        f"# GPU check{' (dry run on the CPU)' if report['dry_run'] else ''}, {report['date']}",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Device: {facts.get('device')}; torch {facts.get('torch')}, CUDA {facts.get('cuda')}; "
        f"{report['wall_seconds']} s in all.",
        "",
        "| item | status | seconds | reason or note |",
        "|---|---|---|---|",
    ]
    for r in report["items"]:
        note = r.get("reason") or r.get("note") or r.get("why_not_cuda") or ""
        lines.append(f"| {r['item']} | {r['status']} | {r['seconds']} | {str(note).replace('|', '/')[:300]} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the same items on the CPU, tiny sizes")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="folder of the .md and .json")
    parser.add_argument("--items", nargs="+", choices=list(ITEMS), metavar="ITEM", help="only these (default: all)")
    parser.add_argument("--ddp-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ddp_worker:
        return ddp_worker(json.loads(args.ddp_worker))
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("no CUDA GPU here (torch sees none): run with --dry-run on the CPU")
    start = time.perf_counter()
    overrides = TINY + ([] if args.dry_run else GPU_SIZES)
    names = [name for name in ITEMS if name in (args.items or ITEMS)]  # in ITEMS' order: export needs training
    with tempfile.TemporaryDirectory(prefix="t2v-gpu-check-") as scratch:
        params, cache = prepare(Path(scratch), overrides)
        check = Check(args.dry_run, "cpu" if args.dry_run else "gpu", params, cache, Path(scratch), overrides)
        items = [run_item(name, ITEMS[name], check) for name in dict.fromkeys(["environment", *names])]
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "dry_run": args.dry_run,
        "command": "python -m benchmarks.gpu_check" + (" --dry-run" if args.dry_run else ""),
        "environment": items[0],
        "items": items,
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    stem = new_dated_stem(args.out, "gpu-check" + ("-dry-run" if args.dry_run else ""), (".json", ".md"))
    stem.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{stem}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    Path(f"{stem}.md").write_text(markdown(report))
    print(f"wrote {stem}.md and .json")
    sys.exit(1 if any(r["status"] == "fail" for r in items) else 0)


if __name__ == "__main__":
    main()
