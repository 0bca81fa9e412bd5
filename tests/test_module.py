"""Pix2Pix LightningModule and Trainer construction: loss math, LR rules, precision, non-finite steps, identity loss."""

import copy
import dataclasses
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins import MixedPrecision
from torch.utils.data import DataLoader

from thermal2visible.errors import ConfigError
from thermal2visible.config.schema import SECTIONS, ModelConfig, TrainConfig
from thermal2visible.config.stored import marked
from thermal2visible.metrics import image_scores, score_means, to_unit
from thermal2visible.models.recognizer import IdentityRecognizer
from thermal2visible.models.discriminators.patchgan import (
    MultiScaleDiscriminator,
    PatchDiscriminator,
    PatchSettings,
    patch_layers,
)
from thermal2visible.training.losses import adversarial_loss, feature_matching, gan_loss
from thermal2visible.training.module import Pix2Pix, TrainingDiverged, linear_decay, scaled_lr
from thermal2visible.models.networks import build_networks
from thermal2visible.training.resume import run_fingerprint
from thermal2visible.training import precision as precision_module
from thermal2visible.training.precision import OncePerIterationScaler, RunDevice, resolve_precision, run_device
from thermal2visible.training.throughput import Throughput
from thermal2visible.training.trainer import GanDDPStrategy, build_trainer, per_process_batch
from shipped import SHIPPED, shipped


def tiny_model(generator: str = "unet", norm: str = "batch", dropout: float = 0.5, scales: int = 1) -> ModelConfig:
    """params.yaml's model section with networks 4 channels wide."""
    return shipped(
        "model",
        generator=generator,
        generator_settings={"ngf": 4, "norm": norm, "dropout": dropout},
        discriminator_settings={"ndf": 4, "norm": norm, "scales": scales},
    )


TINY_MODEL = tiny_model()
SIZE = 16
RULES = ["alternating", "simultaneous"]  # train.update_rule


def tiny_train(**changes) -> TrainConfig:
    settings = dict(
        batch_size=2, precision="32-true", max_epochs=1, accelerator="cpu", channels_last=False, fused_adam=False
    )
    return shipped("train", **(settings | changes))


def loader(count=4, batch_size=2, poison=(), size=SIZE):
    """Random pairs as PairedDataModule batches look; samples in `poison` get a NaN thermal image."""
    generator = torch.Generator().manual_seed(0)
    samples = []
    for i in range(count):
        thermal = torch.rand(1, size, size, generator=generator) * 2 - 1
        if i in poison:
            thermal[0, 0, 0] = math.nan
        samples.append(
            {
                "thermal": thermal,
                "visible": torch.rand(3, size, size, generator=generator) * 2 - 1,
                "identity": torch.tensor(i % 2),
            }
        )
    return DataLoader(samples, batch_size=batch_size)


def weights(module):
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


def test_gan_losses_on_known_logits():
    logits = torch.tensor([[[[2.0, -1.0], [0.0, 3.0]]]])
    bce_real = torch.log1p(torch.exp(-logits)).mean()  # -log(sigmoid(x))
    bce_fake = torch.log1p(torch.exp(logits)).mean()  # -log(1 - sigmoid(x))
    assert gan_loss(logits, True, "vanilla").item() == pytest.approx(bce_real.item())
    assert gan_loss(logits, False, "vanilla").item() == pytest.approx(bce_fake.item())
    assert gan_loss(torch.zeros(1, 1, 3, 3), True, "vanilla").item() == pytest.approx(math.log(2))
    assert gan_loss(logits, True, "lsgan").item() == pytest.approx((1 + 4 + 1 + 4) / 4)  # (x - 1)^2
    assert gan_loss(logits, False, "lsgan").item() == pytest.approx((4 + 1 + 0 + 9) / 4)  # x^2
    with pytest.raises(ValueError, match="gan_mode"):
        gan_loss(logits, True, "wgan")


@pytest.mark.parametrize("mode", ["vanilla", "lsgan"])
def test_patch_mean_of_shards_is_the_mean_of_the_global_batch(mode):
    """What makes DDP exact: equal shards' means, averaged, are the global batch's mean over all patches."""
    logits = torch.randn(8, 1, 6, 6)
    whole = gan_loss(logits, True, mode)
    shards = (gan_loss(logits[:4], True, mode) + gan_loss(logits[4:], True, mode)) / 2
    assert shards.item() == pytest.approx(whole.item(), rel=1e-6)
    per_patch = gan_loss(logits.reshape(-1, 1, 1, 1)[:1], True, mode)  # one patch alone
    assert per_patch.item() != pytest.approx(whole.item())


def test_the_gan_loss_is_the_mean_of_the_scales_losses():
    """pix2pixHD averages the scales' losses: a 2x2 map counts as much as a 6x6 one (not its 4 patches' share)."""
    fine, coarse = torch.randn(2, 1, 6, 6), torch.randn(2, 1, 2, 2)
    judged = [[torch.randn(2, 8, 6, 6), fine], [torch.randn(2, 8, 2, 2), coarse]]
    for mode in ("vanilla", "lsgan"):
        for real in (True, False):
            expected = (gan_loss(fine, real, mode) + gan_loss(coarse, real, mode)) / 2
            assert adversarial_loss(judged, real, mode).item() == pytest.approx(expected.item(), rel=1e-6)
            assert adversarial_loss(judged[:1], real, mode).item() == gan_loss(fine, real, mode).item()


def test_feature_matching_uses_pix2pixhd_weights():
    """Per scale 1/scales, per feature layer 4/(n_layers + 1) (the scale's feature count); the logits are left out."""

    def judged(offsets: list[list[float]]) -> list[list[torch.Tensor]]:
        return [[torch.full((2, 3, 4, 4), value) for value in scale] for scale in offsets]

    real = judged([[0.0] * 5, [0.0] * 4])
    fake = judged([[1.0, 2.0, 3.0, 4.0, 100.0], [1.0, 1.0, 1.0, 100.0]])  # the 100s are the logits
    expected = 0.5 * (4 / 4 * (1 + 2 + 3 + 4)) + 0.5 * (4 / 3 * (1 + 1 + 1))
    assert feature_matching(fake, real).item() == pytest.approx(expected)
    assert feature_matching(real, real).item() == 0


@pytest.mark.parametrize("scales", [1, 2, 3])
def test_feature_matching_is_zero_exactly_on_identical_pairs(scales):
    discriminator = MultiScaleDiscriminator(4, 64, PatchSettings(ndf=4, norm="batch", scales=scales))
    thermal = torch.rand(2, 1, 64, 64)
    real = (torch.rand(2, 3, 64, 64) * 2 - 1).requires_grad_()
    fake = (real.detach() + 0.1 * torch.randn_like(real)).requires_grad_()
    judged_real = discriminator(thermal, real)
    assert feature_matching(discriminator(thermal, real.detach().clone()), judged_real).item() == 0
    loss = feature_matching(discriminator(thermal, fake), judged_real)
    loss.backward()
    assert loss.item() > 0 and fake.grad.abs().sum() > 0
    assert real.grad is None  # the real pair's features are targets: no gradient through them


def test_learning_rate_scaling_rules():
    assert scaled_lr(2e-4, 64, 1, "none") == 2e-4
    assert scaled_lr(2e-4, 64, 1, "sqrt") == pytest.approx(1.6e-3)
    assert scaled_lr(2e-4, 4, 1, "linear") == pytest.approx(8e-4)
    assert scaled_lr(2e-4, 4, 16, "linear") == pytest.approx(5e-5)
    with pytest.raises(ValueError, match="lr_scaling"):
        scaled_lr(2e-4, 4, 1, "cubic")


def test_linear_decay_over_the_last_epochs():
    decay = linear_decay(max_epochs=10, decay_epochs=3)
    assert [round(decay(epoch), 3) for epoch in range(10)] == [1] * 7 + [0.75, 0.5, 0.25]


@pytest.mark.parametrize(
    "features, in_use, native",
    [
        ({"avx2": True}, "AVX2", False),  # Zen 3: bf16 emulated, 10x slower
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


def test_trainer_settings_from_params():
    build_trainer(tiny_train(deterministic=True))
    assert torch.are_deterministic_algorithms_enabled()  # train.deterministic: a GPU rerun gives the same weights
    build_trainer(tiny_train(deterministic=False))
    assert not torch.are_deterministic_algorithms_enabled()
    ddp = build_trainer(tiny_train(devices=2, batch_size=8)).strategy
    assert isinstance(ddp, GanDDPStrategy) and ddp.num_processes == 2
    assert ddp.process_group_backend == "gloo" and ddp.ddp_kwargs == {"gradient_as_bucket_view": True}
    assert per_process_batch(tiny_train(devices=2, num_nodes=2, batch_size=8)) == 2
    with pytest.raises(ConfigError, match="sync_batchnorm.*GPU"):
        build_trainer(tiny_train(sync_batchnorm=True))
    with pytest.raises(ConfigError, match="train.strategy"):
        build_trainer(tiny_train(strategy="fsdp"))


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


@pytest.mark.parametrize("rule", RULES)
def test_non_finite_losses_skip_the_step_then_stop_the_run(rule):
    module = Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(max_bad_steps=1, update_rule=rule))
    before = weights(module)
    trainer = build_trainer(tiny_train(max_bad_steps=1))
    with pytest.raises(TrainingDiverged, match="2 steps with a non-finite loss.*max_bad_steps = 1"):
        trainer.fit(module, train_dataloaders=loader(poison={0, 2}))
    after = weights(module)
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed == set()  # no optimizer step, and batch-norm statistics rolled back


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("norm", ["batch", "none"])  # none: no statistics, nothing for a simultaneous step to undo
def test_a_bad_step_is_skipped_and_training_goes_on(rule, norm):
    train = tiny_train(max_bad_steps=5, update_rule=rule)
    module = Pix2Pix(*build_networks(tiny_model(norm=norm), SIZE, 1, 3), train)
    trainer = build_trainer(train)
    trainer.fit(module, train_dataloaders=loader(count=6, poison={0, 1}))
    assert module.bad_steps == 1 and math.isfinite(trainer.callback_metrics["loss_g"].item())
    (throughput,) = [callback for callback in trainer.callbacks if isinstance(callback, Throughput)]
    assert throughput.images == 4  # the undone step's 2 images are no training
    assert trainer.callback_metrics["images_per_s"] == pytest.approx(4 / throughput.seconds)


def resumed(module: Pix2Pix, checkpoint, **overrides) -> Trainer:
    """Fit `module` from `checkpoint` with nothing left to train: what a resumed run starts from."""
    trainer = build_trainer(tiny_train(max_bad_steps=5), **overrides)
    trainer.fit(module, train_dataloaders=loader(), ckpt_path=checkpoint, weights_only=True)
    return trainer


def test_the_bad_step_budget_is_not_reset_by_a_resume(tmp_path):
    module = Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(max_bad_steps=5))
    trainer = build_trainer(tiny_train(max_bad_steps=5), callbacks=[ModelCheckpoint(tmp_path, "last")])
    trainer.fit(module, train_dataloaders=loader(count=6, poison={0, 1}))
    assert module.bad_steps == 1
    again = Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(max_bad_steps=5))
    resumed(again, tmp_path / "last.ckpt")
    assert again.bad_steps == 1  # train.max_bad_steps counts over the whole run, across resumes
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    del checkpoint["bad_steps"]  # as checkpoints were written before the count was kept
    torch.save(checkpoint, tmp_path / "older.ckpt")
    older = Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(max_bad_steps=5))
    older.bad_steps = 4
    resumed(older, tmp_path / "older.ckpt")
    assert older.bad_steps == 0


def test_the_loss_scale_survives_a_resume(tmp_path):
    """16-mixed's GradScaler (forced on CPU here, as on a GPU): a resumed run keeps the scale it had reached."""

    def fp16(scaler):
        return dict(precision=None, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])

    grown = OncePerIterationScaler("cpu", init_scale=2.0**10, growth_interval=1)
    build_trainer(tiny_train(), callbacks=[ModelCheckpoint(tmp_path, "last")], **fp16(grown)).fit(
        Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train()), train_dataloaders=loader()
    )
    reached = grown.get_scale()
    assert reached > 2.0**10  # it grew (growth_interval 1): a fresh scaler would start lower
    fresh = OncePerIterationScaler("cpu", init_scale=2.0**10, growth_interval=1)
    resumed(Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train()), tmp_path / "last.ckpt", **fp16(fresh))
    assert fresh.get_scale() == reached


def test_validation_scores_are_fp32_scores_of_the_saved_weights_under_bf16_mixed(tiny_cache):
    """bf16 autocast cancels SSIM's variance terms (0.28 against 0.72 on the demo): validation must score what
    evaluate scores, the fp32 generator on the same images."""
    from thermal2visible.data.datamodule import PairedDataModule, model_batch

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
    generator = module.generator.eval()
    with torch.inference_mode():
        for batch in data.val_dataloader():
            batch = model_batch(batch)
            for name, values in image_scores(to_unit(generator(batch["thermal"])), to_unit(batch["visible"])).items():
                means[name].update(values)
    for name, value in means.compute().items():
        assert trainer.callback_metrics[f"val_{name}"].item() == pytest.approx(value.item(), abs=1e-5), name


class PoisonedGeneratorStep(Pix2Pix):
    """The G step of the first batch goes non-finite after D has stepped: by its loss, or, with a finite loss,
    by one gradient (a hook on G's first weight)."""

    poison: str

    def generator_losses(self, *args):
        losses = super().generator_losses(*args)
        if self.bad_steps == 0 and self.poison == "loss":
            losses["loss_g"] = losses["loss_g"] * math.nan
        if self.bad_steps == 0 and self.poison == "gradient":
            next(self.generator.parameters()).register_hook(lambda gradient: gradient * math.inf)
        return losses


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("poison", ["loss", "gradient"])
def test_a_non_finite_generator_step_undoes_the_discriminator_step_before_it(poison, rule):
    module = PoisonedGeneratorStep(
        *build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(max_bad_steps=5, update_rule=rule)
    )
    module.poison = poison
    before = weights(module)
    build_trainer(tiny_train(max_bad_steps=5), limit_train_batches=1).fit(module, train_dataloaders=loader())
    assert module.bad_steps == 1
    assert {name for name in before if not torch.equal(before[name], weights(module)[name])} == set()
    assert module.optimizers()[1].optimizer.state_dict()["state"] == {}  # Adam never stepped D: no moments, no count


class PoisonedThirdStep(Pix2Pix):
    """Batch 2's G loss is NaN, after two good steps gave D its Adam moments; keeps everything as batch 2 began."""

    def on_train_batch_start(self, batch, batch_idx):
        if batch_idx == 2:
            self.before = {name: value.clone() for name, value in self.state_dict().items()}
            self.adam_before = {
                key: [value.clone() for value in state.values()]
                for key, state in self.optimizers()[1].optimizer.state_dict()["state"].items()
            }

    def generator_losses(self, *args):
        losses = super().generator_losses(*args)
        if self.trainer.fit_loop.epoch_loop.batch_idx == 2:
            losses["loss_g"] = losses["loss_g"] * math.nan
        return losses


@pytest.mark.parametrize("rule", RULES)
def test_a_non_finite_step_after_good_ones_puts_back_weights_statistics_and_adam_moments(rule):
    module = PoisonedThirdStep(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(max_bad_steps=5, update_rule=rule))
    build_trainer(tiny_train(max_bad_steps=5), limit_train_batches=3).fit(module, train_dataloaders=loader(count=6))
    assert module.bad_steps == 1
    assert [name for name, value in module.state_dict().items() if not torch.equal(value, module.before[name])] == []
    adam = module.optimizers()[1].optimizer.state_dict()["state"]
    assert len(adam) == len(module.adam_before) > 0
    assert all(
        torch.equal(a, b) for key, state in adam.items() for a, b in zip(state.values(), module.adam_before[key])
    )


def test_identity_loss_uses_a_frozen_recognizer():
    recognizer = IdentityRecognizer(3, 2, width=4).eval().requires_grad_(False)
    frozen = weights(recognizer)
    module = Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(lambda_id=1.0), recognizer)
    trainer = build_trainer(tiny_train(lambda_id=1.0))
    trainer.fit(module, train_dataloaders=loader())
    assert not module.recognizer.training  # Lightning's train() did not wake it
    assert all(torch.equal(frozen[name], value) for name, value in weights(module.recognizer).items())
    assert trainer.callback_metrics["loss_id"].item() > 0
    with pytest.raises(ValueError, match="lambda_id"):
        Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(lambda_id=1.0))


PIX2PIXHD = tiny_model(generator="resnet", scales=2)


def test_resnet_with_multi_scale_d_and_feature_matching_trains_in_bf16_with_channels_last():
    train = tiny_train(precision="bf16-mixed", channels_last=True, lambda_feat=10.0)
    module = Pix2Pix(*build_networks(PIX2PIXHD, 32, 1, 3), train)
    before = weights(module)
    trainer = build_trainer(train)
    trainer.fit(module, train_dataloaders=loader(size=32))
    assert trainer.precision == "bf16-mixed" and module.bad_steps == 0
    losses = {name: trainer.callback_metrics[name].item() for name in ("loss_d", "loss_g", "loss_gan", "loss_feat")}
    assert all(math.isfinite(value) for value in losses.values()) and losses["loss_feat"] > 0, losses
    moved = {name.split(".")[1] for name, value in weights(module).items() if not torch.equal(value, before[name])}
    assert moved >= {"stages", "layers", "coarser"}  # the ResNet, D's full and half scale


class Echo(torch.nn.Module):
    """A "generator" whose output is its input exactly: generated pairs equal real ones when visible = thermal."""

    def __init__(self):
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(()))

    def forward(self, thermal):
        return thermal + 0 * self.unused


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize("rule", RULES)
def test_feature_matching_of_a_perfect_generator_is_zero(rule, precision):
    """The real pair's features come from the D that judges the generated pair (alternating: the updated one;
    simultaneous: the one before its step), so a generated pair equal to the real one matches exactly. In bf16 too:
    Lightning's autocast caches no casts (cache_enabled=False); a cache would keep the bf16 copies of D's weights
    made before its step for the real pair's no-grad forward, and this test fails when it is switched on."""
    train = tiny_train(lambda_feat=1.0, update_rule=rule, precision=precision)
    module = Pix2Pix(*build_networks(TINY_MODEL, SIZE, 3, 3), train)
    module.generator = Echo()
    pairs = [
        {"thermal": image, "visible": image.clone(), "identity": torch.tensor(0)}
        for image in torch.rand(4, 3, SIZE, SIZE) * 2 - 1
    ]
    trainer = build_trainer(train)
    trainer.fit(module, train_dataloaders=DataLoader(pairs, batch_size=2))
    assert trainer.callback_metrics["loss_feat"].item() == 0 and trainer.callback_metrics["loss_l1"].item() == 0


class CountedForwards(Pix2Pix):
    """Counts the discriminator's forwards, through its DDP wrapper or not (a hook on the module itself)."""

    def setup(self, stage):
        self.forwards = 0
        self.discriminator.register_forward_hook(lambda *_: setattr(self, "forwards", self.forwards + 1))


@pytest.mark.parametrize(
    "rule, lambda_feat, forwards",
    [("alternating", 0.0, 3), ("alternating", 1.0, 4), ("simultaneous", 0.0, 2), ("simultaneous", 1.0, 2)],
)
def test_discriminator_forwards_per_step(rule, lambda_feat, forwards):
    """alternating: the D step's real and generated pairs, then the generated pair again for G's loss against the
    updated D (feature matching adds the real pair through that updated D). simultaneous: the real and the
    generated pair once, for both losses."""
    module = CountedForwards(
        *build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(lambda_feat=lambda_feat, update_rule=rule)
    )
    build_trainer(tiny_train(), limit_train_batches=2).fit(module, train_dataloaders=loader())
    assert module.forwards == 2 * forwards


def bce(logits: torch.Tensor, target: float) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target))


def pytorch_pix2pix_step(G, D, opt_g, opt_d, thermal, real, lambda_l1):
    """optimize_parameters of the public PyTorch pix2pix code (models/pix2pix_model.py), in its order."""
    fake = G(thermal)
    D.requires_grad_(True)
    opt_d.zero_grad()
    loss_d_fake = bce(D(thermal, fake.detach()), 0.0)
    loss_d_real = bce(D(thermal, real), 1.0)
    ((loss_d_fake + loss_d_real) * 0.5).backward()
    opt_d.step()
    D.requires_grad_(False)
    opt_g.zero_grad()
    (bce(D(thermal, fake), 1.0) + F.l1_loss(fake, real) * lambda_l1).backward()
    opt_g.step()


def tensorflow_pix2pix_step(G, D, opt_g, opt_d, thermal, real, lambda_l1):
    """train_step of the TensorFlow pix2pix tutorial: one forward under two gradient tapes, each loss's gradient for
    its own network's weights, then both apply_gradients. (The tutorial's D loss is real + fake; the paper's halving,
    which this project keeps under both rules, is kept here: a constant factor reaches Adam's step through eps only.)"""
    D.requires_grad_(True)
    fake = G(thermal)
    real_logits, fake_logits = D(thermal, real), D(thermal, fake)
    loss_g = bce(fake_logits, 1.0) + lambda_l1 * F.l1_loss(fake, real)
    loss_d = 0.5 * (bce(real_logits, 1.0) + bce(fake_logits, 0.0))
    for network, loss in ((G, loss_g), (D, loss_d)):
        weights = list(network.parameters())
        for weight, gradient in zip(weights, torch.autograd.grad(loss, weights, retain_graph=True)):
            weight.grad = gradient
    opt_g.step()
    opt_d.step()


REFERENCES = {"alternating": pytorch_pix2pix_step, "simultaneous": tensorflow_pix2pix_step}


def test_update_rules_take_the_steps_of_their_reference_code():
    """Two steps of each rule (fp32, no dropout) give the gradients and weights of its hand-written reference, and
    the references differ: D's lr and a small L1 weight make G's adversarial gradient depend on D's step."""
    train = tiny_train(lambda_l1=1.0, lr_d=0.01)
    model = tiny_model(dropout=0.0)
    references = {}
    for rule, reference_step in REFERENCES.items():
        module = Pix2Pix(*build_networks(model, SIZE, 1, 3), dataclasses.replace(train, update_rule=rule))
        G, D = copy.deepcopy(module.generator), PatchDiscriminator(4, 4, "batch", patch_layers(SIZE))
        D.load_state_dict(module.discriminator.state_dict())
        build_trainer(train).fit(module, train_dataloaders=loader())
        opt_g, opt_d = (
            torch.optim.Adam(network.parameters(), lr, betas=(train.beta1, train.beta2))
            for network, lr in ((G, train.lr_g), (D, train.lr_d))
        )
        for batch in loader():
            reference_step(G, D, opt_g, opt_d, batch["thermal"], batch["visible"], train.lambda_l1)
        for network, reference in ((module.generator, G), (module.discriminator, D)):
            expected = dict(reference.named_parameters())
            for name, weight in network.named_parameters():
                torch.testing.assert_close(weight.grad, expected[name].grad, msg=f"{rule}: {name}.grad")
                torch.testing.assert_close(weight, expected[name], msg=f"{rule}: {name}")
        references[rule] = [weight.grad for weight in G.parameters()]
    assert any(not torch.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(*references.values()))


def test_learning_rates_decay_linearly_at_the_end():
    train = tiny_train(max_epochs=3, lr_decay_epochs=2, lr_g=1e-3)
    module = Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), train)
    trainer = build_trainer(train)
    trainer.fit(module, train_dataloaders=loader())
    assert trainer.callback_metrics["lr"].item() == pytest.approx(1e-3 / 3)  # epoch 3 of 3: 1/3 of the rate


def changed(config, key: str):
    """`config` with another value of `key`, unvalidated (the fingerprint hashes values; it does not validate them).
    train.accelerator goes from auto to cpu: the same device on this machine, so the same precision for `auto`."""
    value = getattr(config, key)
    other = (
        "cpu"
        if key == "accelerator"
        else {
            bool: lambda: not value,
            int: lambda: value + 1,
            float: lambda: value + 0.5,
            tuple: lambda: (*value, 0),
            str: lambda: value + "-changed",
            dict: lambda: value | {"changed": 1},
        }[type(value)]()
    )
    config = copy.copy(config)
    object.__setattr__(config, key, other)
    return config


def test_run_fingerprint_changes_with_what_defines_the_weights_and_nothing_else():
    base = SHIPPED
    same = run_fingerprint(base, "data-md5")
    for section, defines in ((section, marked(section, "weights")) for section in SECTIONS):
        for key, weights in defines.items():
            other = copy.copy(base)
            object.__setattr__(other, section, changed(getattr(base, section), key))
            assert (run_fingerprint(other, "data-md5") != same) == weights, key
    assert run_fingerprint(base, "other-data") != same and run_fingerprint(base, "data-md5", "recognizer") != same


def test_run_fingerprint_hashes_what_precision_auto_means_on_the_machine(monkeypatch):
    auto = SHIPPED  # train.precision: auto on this CPU
    fingerprints = {}
    for native_bf16, resolved in ((True, "bf16-mixed"), (False, "32-true")):
        monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: native_bf16)
        named = dataclasses.replace(auto, train=dataclasses.replace(auto.train, precision=resolved))
        fingerprints[resolved] = run_fingerprint(auto, "data-md5")
        assert fingerprints[resolved] == run_fingerprint(named, "data-md5"), resolved
    # a checkpoint of an `auto` run carried from a bf16 machine to an AVX2 one does not continue there
    assert fingerprints["bf16-mixed"] != fingerprints["32-true"]


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
