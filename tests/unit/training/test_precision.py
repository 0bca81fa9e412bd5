"""Precision and memory layout (training/precision.py): what each CPU and GPU runs, loss scaling through Lightning's
precision plugin, and validation scores taken in fp32."""

import dataclasses
import warnings

import pytest
import torch
from lightning.pytorch.plugins import MixedPrecision

from thermal2visible.metrics import image_scores, score_means, to_unit
from thermal2visible.training.module import Pix2Pix
from thermal2visible.models.networks import build_networks
from thermal2visible.training.fingerprint import run_fingerprint
from thermal2visible.training import precision as precision_module
from thermal2visible.training.precision import OncePerIterationScaler, RunDevice, resolve_precision, run_device
from thermal2visible.training.trainer import build_trainer
from tests.support.shipped import SHIPPED, shipped
from tests.support.pix2pix_parts import RULES, SIZE, TINY_MODEL, loader, tiny_train, weights


@pytest.mark.parametrize(
    "features, in_use, native",
    [
        ({"avx2": True}, "AVX2", False),  # Zen 3: bf16 emulated
        ({"avx512_f": True}, "AVX512", False),  # AVX-512 without BF16 (Skylake to Ice Lake): emulated too
        ({"avx512_f": True, "avx512_bf16": True}, "AVX512", True),  # Zen 4/5, Cooper Lake
        ({"avx512_f": True, "avx512_bf16": True}, "AVX2", False),  # the same under ATEN_CPU_CAPABILITY=avx2
        ({"amx_bf16": True}, "AVX512", True),
        ({"avx_ne_convert": True}, "AVX2", True),  # AMX; AVX2-VNNI-2
        ({"bf16": True}, "DEFAULT", True),
        ({"sve_bf16": True}, "SVE256", True),
        ({"sve": True}, "SVE256", False),
    ],
)
def test_native_bf16_from_the_cpu_features(features, in_use, native, monkeypatch):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: features)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: in_use)
    assert precision_module.cpu_has_native_bf16() is native


@pytest.mark.parametrize("native_bf16, cpu_mixed", [(True, "bf16-mixed"), (False, "32-true")])
def test_precision_mapping(native_bf16, cpu_mixed, monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: native_bf16)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert resolve_precision("auto", "gpu") == "16-mixed"
        assert resolve_precision("auto", "cpu") == cpu_mixed
        assert resolve_precision("16-mixed", "gpu") == "16-mixed"
        assert resolve_precision("32-true", "cpu") == "32-true"
        assert said == []
        assert resolve_precision("16-mixed", "cpu") == cpu_mixed
        notice = f"train.precision 16-mixed is for GPUs; using {cpu_mixed} on this CPU"
        assert [str(w.message) for w in said] == [notice]
        # asked for by name: kept, with a notice if emulated
        assert resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"
        assert len(said) == (1 if native_bf16 else 2)
    monkeypatch.undo()
    assert build_trainer(tiny_train(precision="16-mixed")).precision == resolve_precision("auto", "cpu")


def test_a_run_resolves_its_device_once_and_says_its_precision_notice_once(monkeypatch):
    """The train stage resolves its RunDevice once and hands it to its fingerprint and its trainer, which take it as
    it is: the notice comes once, and neither resolves again."""
    params = dataclasses.replace(SHIPPED, train=tiny_train(precision="16-mixed", max_epochs=SHIPPED.early_stop.window))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        device = run_device(params.train)
        monkeypatch.setattr(precision_module, "resolve_precision", None)  # a second resolution would fail
        fingerprint = run_fingerprint(params, "data", device=device)
        trainer = build_trainer(params.train, device)
    assert [str(w.message) for w in said if "16-mixed" in str(w.message)] == [
        f"train.precision 16-mixed is for GPUs; using {device.precision} on this CPU"
    ]
    monkeypatch.undo()
    assert trainer.precision == device.precision != "16-mixed"
    named = dataclasses.replace(params, train=dataclasses.replace(params.train, precision=device.precision))
    assert fingerprint == run_fingerprint(named, "data")


@pytest.mark.parametrize(
    "features, in_use, device, precision, channels_last",
    [
        ({"avx512_bf16": True, "amx_bf16": True}, "AVX512", "cpu", "bf16-mixed", True),  # AMX: its kernels are NHWC
        ({"avx512_bf16": True, "amx_bf16": True}, "AVX512", "cpu", "32-true", False),
        ({"avx512_bf16": True, "amx_bf16": True}, "AVX2", "cpu", "bf16-mixed", False),  # ATEN_CPU_CAPABILITY=avx2
        ({"avx512_bf16": True, "amx_bf16": True}, "AVX512", "cuda", "bf16-mixed", False),
        ({"avx512_bf16": True}, "AVX512", "cpu", "bf16-mixed", False),  # Zen 4/5: NCHW as fast or faster
        ({"avx2": True}, "AVX2", "cpu", "32-true", False),
    ],
)
def test_channels_last_auto_only_where_amx_runs_bf16(features, in_use, device, precision, channels_last, monkeypatch):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: features)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: in_use)
    assert precision_module.resolve_channels_last("auto", device, precision) is channels_last
    assert precision_module.resolve_channels_last(True, device, precision) is True  # by name: kept
    assert precision_module.resolve_channels_last(False, device, precision) is False


@pytest.mark.parametrize("amx", [True, False])
def test_a_run_with_channels_last_auto_trains_in_the_layout_auto_picks(amx, monkeypatch):
    """The layout `auto` picks for the run's device and precision, taken before the optimizers and DDP exist."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": True, "amx_bf16": amx})
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    train = tiny_train(precision="bf16-mixed", channels_last="auto")
    module = Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), train)
    before = weights(module)
    trainer = build_trainer(train)
    trainer.fit(module, train_dataloaders=loader())
    layout = torch.channels_last if amx else torch.contiguous_format
    kernels = [weight for weight in module.parameters() if weight.dim() == 4]
    assert kernels and all(weight.is_contiguous(memory_format=layout) for weight in kernels)
    stepped = [name for name, value in weights(module).items() if not torch.equal(value, before[name])]
    assert any(name.startswith("generator") for name in stepped) and any(
        name.startswith("discriminator") for name in stepped
    )


class ScaleProbe(Pix2Pix):
    """Records, for each backward, the stored gradient of one weight over its true (unscaled) gradient."""

    ratios: list

    def manual_backward(self, loss, *args, **kwargs):
        network = self.discriminator if not self.ratios else self.generator
        weight = next(network.parameters())
        true = torch.autograd.grad(loss, weight, retain_graph=True)[0].float()
        super().manual_backward(loss, *args, **kwargs)
        large = true.abs() > true.abs().max() * 0.1
        self.ratios.append((weight.grad.float()[large] / true[large]).median().item())


@pytest.mark.parametrize("rule", RULES)
def test_fp16_loss_scaling_goes_through_the_precision_plugin(rule):
    """16-mixed with the project's GradScaler (forced on CPU here): backward sees the scaled loss, the step unscales,
    and the scale is updated once an iteration, from both networks' checks (growth_interval 1: one doubling; an
    update after each optimizer step, Lightning's default, would double it twice)."""
    module = ScaleProbe(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(update_rule=rule))
    module.ratios = []
    scaler = OncePerIterationScaler("cpu", init_scale=2.0**10, growth_interval=1)
    trainer = build_trainer(
        tiny_train(), precision=None, limit_train_batches=1, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)]
    )
    trainer.fit(module, train_dataloaders=loader())
    assert module.ratios == pytest.approx([2.0**10] * 2, rel=0.05)  # the D step, then the G step
    assert scaler.get_scale() == 2.0**11


class GeneratorStepProbe(Pix2Pix):
    """Records the true gradient of G's loss for G's first weight, and the gradient G's optimizer steps with."""

    def on_train_start(self):
        self.true, self.stepped, self.backwards = [], [], 0
        weight = next(self.generator.parameters())
        self.optimizers()[0].optimizer.register_step_pre_hook(
            lambda *_: self.stepped.append(weight.grad.detach().float().clone())
        )

    def manual_backward(self, loss, *args, **kwargs):
        self.backwards += 1
        if self.backwards % 2 == 0:  # D's loss, then G's
            self.true.append(torch.autograd.grad(loss, next(self.generator.parameters()), retain_graph=True)[0])
        super().manual_backward(loss, *args, **kwargs)


@pytest.mark.parametrize("rule", RULES)
def test_generator_steps_with_its_true_gradient_while_the_loss_scale_grows(rule):
    """growth_interval 1: the scale doubles after every iteration, never between D's step and G's, so G's gradients
    (scaled before D's step under the simultaneous rule) reach G's step unscaled."""
    train = tiny_train(update_rule=rule, lambda_l1=1.0)  # L1 x 100 x 2^13 would overflow fp16
    module = GeneratorStepProbe(*build_networks(TINY_MODEL, SIZE, 1, 3), train)
    scaler = OncePerIterationScaler("cpu", init_scale=2.0**10, growth_interval=1)
    build_trainer(tiny_train(), precision=None, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)]).fit(
        module, train_dataloaders=loader()
    )
    assert scaler.get_scale() == 2.0**12  # doubled after each of 2 iterations
    for true, stepped in zip(module.true, module.stepped, strict=True):
        large = true.abs() > true.abs().max() * 0.1
        assert (stepped[large] / true.float()[large]).median().item() == pytest.approx(1.0, rel=0.05)


def test_validation_scores_are_fp32_scores_of_the_saved_weights_under_bf16_mixed(tiny_cache):
    """bf16 autocast cancels SSIM's variance terms (0.28 against 0.72 on the demo): validation must score what
    evaluate scores, the fp32 generator on the same images."""
    from thermal2visible.data.datamodule import PairedDataModule
    from thermal2visible.data.dataset import model_batch

    data = PairedDataModule(
        tiny_cache, 4, shipped("loader", num_workers=0, pin_memory=False, preload=True, jitter=True)
    )
    module = Pix2Pix(
        *build_networks(TINY_MODEL, data.manifest["image_size"], data.thermal_channels, data.visible_channels),
        tiny_train(precision="bf16-mixed"),
    )
    trainer = build_trainer(tiny_train(precision="bf16-mixed"), limit_train_batches=2)
    trainer.fit(module, datamodule=data)
    assert trainer.precision == "bf16-mixed"
    means = score_means()
    generator = module.kept_generator.eval()
    with torch.inference_mode():
        for batch in data.val_dataloader():
            batch = model_batch(batch)
            for name, values in image_scores(to_unit(generator(batch["thermal"])), to_unit(batch["visible"])).items():
                means[name].update(values)
    for name, value in means.compute().items():
        assert trainer.callback_metrics[f"val_{name}"].item() == pytest.approx(value.item(), abs=1e-5), name


def test_32_true_on_a_gpu_turns_tf32_off_and_mixed_precision_on():
    """cuDNN takes TF32 by default: 32-true must say fp32 and mean it."""
    defaults = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        assert RunDevice("gpu", "32-true", False).trainer_options() == {"precision": "32-true", "plugins": []}
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        fp16 = RunDevice("gpu", "16-mixed", False).trainer_options()
        assert isinstance(fp16["plugins"][0].scaler, OncePerIterationScaler)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = defaults
