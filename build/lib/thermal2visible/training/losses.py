"""The GAN losses of training/module.py: pix2pix's (vanilla or least-squares, on a PatchGAN's logits) and pix2pixHD's
(over the scales of a multi-scale discriminator, and feature matching between D's features)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gan_loss(logits: torch.Tensor, real: bool, mode: str) -> torch.Tensor:
    """Mean over batch and patch map of how far the discriminator's logits are from "real" (1) or "fake" (0)."""
    logits = logits.float()
    target = torch.ones_like(logits) if real else torch.zeros_like(logits)
    if mode == "vanilla":
        return F.binary_cross_entropy_with_logits(logits, target)
    if mode == "lsgan":
        return F.mse_loss(logits, target)
    raise ValueError(f"gan_mode {mode!r} is not one of vanilla, lsgan")


def adversarial_loss(judged: list[list[torch.Tensor]], real: bool, mode: str) -> torch.Tensor:
    """`gan_loss` of each scale's logits (MultiScaleDiscriminator's output), averaged over the scales. pix2pixHD sums
    them, beside its feature matching and without L1; here the GAN loss stands against pix2pix's 100 x L1, and the
    mean keeps that balance whatever the number of scales."""
    return torch.stack([gan_loss(outputs[-1], real, mode) for outputs in judged]).mean()


def feature_matching(judged_fake: list[list[torch.Tensor]], judged_real: list[list[torch.Tensor]]) -> torch.Tensor:
    """pix2pixHD's feature-matching loss: L1 between D's features (every layer's output but the logits) on the
    generated and on the real pair, the real ones as fixed targets; each layer weighted 4 / (its scale's n_layers
    + 1), i.e. 4 / its number of feature layers, and each scale 1 / the number of scales."""
    scales = len(judged_fake)
    return sum(
        4 / (len(fake_outputs) - 1) / scales * F.l1_loss(fake.float(), real.detach().float())
        for fake_outputs, real_outputs in zip(judged_fake, judged_real, strict=True)
        for fake, real in zip(fake_outputs[:-1], real_outputs[:-1], strict=True)
    )
