"""Tiny parts the Pix2Pix unit tests build on: networks 4 channels wide, a one-epoch CPU training, random pairs."""

import math

import torch
from torch.utils.data import DataLoader

from thermal2visible.config.schema import ModelConfig, TrainConfig
from tests.support.shipped import shipped


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
