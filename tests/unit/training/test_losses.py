"""The GAN, feature-matching and identity losses (training/losses.py) on known values."""

import math

import pytest
import torch
from torch.utils.data import DataLoader

from thermal2visible.models.recognizer import IdentityRecognizer
from thermal2visible.models.discriminators.patchgan import (
    MultiScaleDiscriminator,
    PatchSettings,
)
from thermal2visible.training.losses import adversarial_loss, feature_matching, gan_loss
from thermal2visible.training.module import Pix2Pix
from thermal2visible.models.networks import build_networks
from thermal2visible.training.trainer import build_trainer
from tests.support.pix2pix_parts import RULES, SIZE, TINY_MODEL, loader, tiny_train, weights


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
