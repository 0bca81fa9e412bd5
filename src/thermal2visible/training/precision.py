"""Which device, precision and memory layout a run takes: `auto` resolved on this machine. The resolved precision,
not the word `auto`, defines a run's weights (fingerprint.run_fingerprint), so a run resolves its `RunDevice` once and
passes it to its fingerprint, its tags and its Trainer."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from lightning.pytorch import Callback
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.utilities import rank_zero_warn

from thermal2visible.config.schema import TrainConfig
from thermal2visible.errors import ConfigError


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
    """Whether this CPU computes in bf16. Elsewhere bf16 autocast is emulated through fp32 conversions, several times
    slower than fp32 (docs/performance.md)."""
    capabilities = torch.cpu.get_capabilities()
    return any(capabilities.get(feature, False) for feature in OTHER_BF16 + avx512_features())


def resolve_precision(precision: str, accelerator: str) -> str:
    """The precision Lightning gets. `auto`: the paper's 16-mixed on GPUs; on CPUs bf16-mixed where the CPU computes
    in bf16, else 32-true. fp16 autocast on CPU is 20-50x slower than bf16, so 16-mixed on a CPU is taken as auto."""
    if accelerator != "cpu":
        return "16-mixed" if precision == "auto" else precision
    cpu_mixed = "bf16-mixed" if cpu_has_native_bf16() else "32-true"
    if precision == "16-mixed":
        rank_zero_warn(f"train.precision 16-mixed is for GPUs; using {cpu_mixed} on this CPU")
        return cpu_mixed
    if precision == "bf16-mixed" and cpu_mixed == "32-true":
        rank_zero_warn(
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


@dataclass(frozen=True)
class RunDevice:
    """What train.accelerator, train.precision and train.channels_last mean for a run on this machine."""

    accelerator: str  # cpu, gpu, or another name Lightning knows
    precision: str  # what Lightning gets: 32-true, 16-mixed or bf16-mixed
    channels_last: bool

    @property
    def memory_format(self) -> str:
        """The tag a run's MLflow record names its layout by (the two layouts' weights differ by float rounding)."""
        return "channels_last" if self.channels_last else "nchw"

    def trainer_options(self) -> dict:
        """The Trainer's precision arguments: 16-mixed as a plugin with a `OncePerIterationScaler`. Sets TF32
        explicitly: off for 32-true, whose name promises fp32 (cuDNN's convolutions take TF32 by default), on for
        the mixed precisions, whose fp32 parts need no more."""
        if self.accelerator != "cpu":
            fp32 = self.precision == "32-true"
            torch.backends.cuda.matmul.allow_tf32 = not fp32
            torch.backends.cudnn.allow_tf32 = not fp32
        if self.precision != "16-mixed":
            return {"precision": self.precision, "plugins": []}
        device = "cpu" if self.accelerator == "cpu" else "cuda"
        return {
            "precision": None,
            "plugins": [MixedPrecision("16-mixed", device, scaler=OncePerIterationScaler(device))],
        }


def kernels(accelerator: str) -> str:
    """Which kernels this machine's torch runs, where their rounding differs: the CPU's ATen level and bf16 features
    (an AVX2 host, an AVX-512 one, one with AMX), or the GPU's name and compute capability."""
    if accelerator == "cpu":
        capabilities = torch.cpu.get_capabilities()
        present = [feature for feature in OTHER_BF16 + avx512_features() if capabilities.get(feature, False)]
        return "+".join([torch.backends.cpu.get_cpu_capability(), *present])
    if accelerator in ("gpu", "cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
    return accelerator


def run_device(train: TrainConfig) -> RunDevice:
    """The `RunDevice` of `train` on this machine; says once why a named precision is not taken as asked."""
    accelerator = resolve_accelerator(train.accelerator)
    precision = resolve_precision(train.precision, accelerator)
    return RunDevice(accelerator, precision, resolve_channels_last(train.channels_last, accelerator, precision))


class ChannelsLast(Callback):
    """Trains in the channels-last layout: the weights before the optimizers and DDP wrappers are made (which then
    see them in their final layout), and every batch's images as they reach the step."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        pl_module.to(memory_format=torch.channels_last)

    def on_train_batch_start(self, trainer, pl_module, batch: dict, batch_idx: int) -> None:
        self._convert(batch)

    def on_validation_batch_start(self, trainer, pl_module, batch: dict, batch_idx: int, dataloader_idx: int = 0):
        self._convert(batch)

    @staticmethod
    def _convert(batch: dict) -> None:
        for key in ("thermal", "visible"):
            batch[key] = batch[key].contiguous(memory_format=torch.channels_last)
