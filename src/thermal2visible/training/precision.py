"""Which device, precision and memory layout a run takes: `auto` resolved on this machine. The resolved precision,
not the word `auto`, defines a run's weights (resume.run_fingerprint), so one module owns the resolution."""

from __future__ import annotations

import torch
from lightning.fabric.utilities.rank_zero import WarningCache
from lightning.pytorch.plugins.precision import MixedPrecision

from thermal2visible.errors import ConfigError

# A run resolves its precision more than once (fingerprint, tags, trainer) and in every DDP rank: say each thing once.
NOTICES = WarningCache()


def resolve_accelerator(accelerator: str) -> str:
    if accelerator == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"train.accelerator: {accelerator}, but this PyTorch ({torch.__version__}) sees no CUDA GPU "
            "(a CPU build, or no driver); set train.accelerator: auto to train on the CPU"
        )
    return accelerator


# CPU features that compute in bf16, by torch.cpu.get_capabilities' names: AVX512-BF16 and AMX-BF16 (within reach
# only where ATen runs its AVX-512 kernels), AVX-NE-CONVERT (AVX2-VNNI-2), and ARM's BF16 and SVE-BF16.
AVX512_BF16 = ("avx512_bf16", "amx_bf16")
OTHER_BF16 = ("avx_ne_convert", "bf16", "sve_bf16")


def avx512_features() -> tuple[str, ...]:
    """The AVX-512-era features ATen can reach: none under ATEN_CPU_CAPABILITY=avx2 (the benchmarks' stand-in for an
    AVX2-only CPU)."""
    return AVX512_BF16 if torch.backends.cpu.get_cpu_capability() == "AVX512" else ()


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes in bf16. Elsewhere bf16 autocast is emulated through fp32 conversions: measured 10x
    slower than fp32 on an AVX2-only EPYC."""
    capabilities = torch.cpu.get_capabilities()
    return any(capabilities.get(feature, False) for feature in OTHER_BF16 + avx512_features())


def resolve_precision(precision: str, accelerator: str) -> str:
    """The precision Lightning gets. `auto`: the paper's 16-mixed on GPUs; on CPUs bf16-mixed where the CPU computes
    in bf16, else 32-true. fp16 autocast on CPU is 20-50x slower than bf16, so 16-mixed on a CPU is taken as auto."""
    if accelerator != "cpu":
        return "16-mixed" if precision == "auto" else precision
    cpu_mixed = "bf16-mixed" if cpu_has_native_bf16() else "32-true"
    if precision == "16-mixed":
        NOTICES.warn(f"train.precision 16-mixed is for GPUs; using {cpu_mixed} on this CPU")
        return cpu_mixed
    if precision == "bf16-mixed" and cpu_mixed == "32-true":
        NOTICES.warn(
            "this CPU has no bf16 instructions: train.precision bf16-mixed runs emulated, several times "
            "slower than 32-true (train.precision: auto picks the faster)"
        )
    return cpu_mixed if precision == "auto" else precision


def resolve_channels_last(channels_last: bool | str, device: str, precision: str) -> bool:
    """Whether a run keeps weights and activations channels-last; `precision` is the resolved one. `auto`: only for
    bf16-mixed on a CPU with AMX-BF16, where oneDNN's AMX convolutions take channels-last activations and NCHW pays a
    reorder around every convolution. Elsewhere NCHW: on AVX512-BF16 without AMX and in fp32 it is as fast or faster
    (docs/performance.md has the figures), and on GPUs, unmeasured here, `auto` keeps NCHW (params/paper_gpu.yaml asks
    for true)."""
    if channels_last != "auto":
        return channels_last
    amx = "amx_bf16" in avx512_features() and torch.cpu.get_capabilities().get("amx_bf16", False)
    return device == "cpu" and precision == "bf16-mixed" and amx


class OncePerIterationScaler(torch.amp.GradScaler):
    """fp16 loss scaling for a training step that steps two optimizers (D, then G). Lightning updates the scale after
    every optimizer step: twice an iteration, so the growth interval would count half-iterations, an overflow in
    either network would halve the scale at once, and G's gradients could carry another scale than the one G's step
    divides by. PyTorch's recipe for several optimizers is one update per iteration from all their overflow checks:
    here `update` (Lightning's call) waits, and `end_iteration` (the training step's last act) updates."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stepped = False

    def step(self, optimizer, *args, **kwargs):
        self.stepped = True
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None) -> None:
        """Lightning's call after each optimizer step: deferred to `end_iteration`."""

    def end_iteration(self) -> None:
        if self.stepped:  # an iteration that stopped before any step has no overflow check to update from
            super().update()
            self.stepped = False


def precision_options(precision: str, accelerator: str) -> dict:
    """The Trainer's precision arguments for a resolved `precision`: 16-mixed with a `OncePerIterationScaler`. Sets
    TF32 explicitly: off for 32-true, whose name promises fp32 (cuDNN's convolutions take TF32 by default), on for
    the mixed precisions, whose fp32 parts need no more."""
    if accelerator != "cpu":
        fp32 = precision == "32-true"
        torch.backends.cuda.matmul.allow_tf32 = not fp32
        torch.backends.cudnn.allow_tf32 = not fp32
    if precision != "16-mixed":
        return {"precision": precision}
    device = "cpu" if accelerator == "cpu" else "cuda"
    return {"plugins": [MixedPrecision("16-mixed", device, scaler=OncePerIterationScaler(device))]}
