"""The networks a model section builds: the generator model.generator names (every architecture models/generators/
holds, found there rather than listed) and the PatchGAN; and rebuilding a generator from what a payload saved of it."""

from __future__ import annotations

import dataclasses
import json

from pydantic import TypeAdapter, ValidationError
from torch import nn

from thermal2visible.config.schema import ModelConfig
from thermal2visible.errors import ConfigError
from thermal2visible.imports import package_modules
from thermal2visible.models.discriminator import MultiScaleDiscriminator
from thermal2visible.models.generator import Generator

GENERATORS: dict[str, type[Generator]] = {
    network.kind: network
    for module in package_modules("thermal2visible.models.generators")
    for network in vars(module).values()
    if isinstance(network, type) and issubclass(network, Generator) and "kind" in vars(network)
}


def generator_class(model: ModelConfig, image_size: int) -> type[Generator]:
    """The class model.generator names, checked to take `image_size` (preprocess.image_size) and
    model.generator_settings; a ConfigError naming the key otherwise."""
    if model.generator not in GENERATORS:
        raise ConfigError(f"model.generator: {model.generator!r} is not one of {sorted(GENERATORS)}")
    why_not = GENERATORS[model.generator].size_rule(image_size)
    if why_not:
        raise ConfigError(f"preprocess.image_size: {why_not} (model.generator: {model.generator})")
    generator_settings(model)
    return GENERATORS[model.generator]


def generator_settings(model: ModelConfig) -> dict:
    """model.generator_settings checked by the generator's own `Settings`; a ConfigError naming each bad key."""
    try:
        checked = TypeAdapter(GENERATORS[model.generator].Settings)  # by JSON's rules, as params.yaml is read
        settings = checked.validate_json(json.dumps(model.generator_settings))
    except ValidationError as error:
        raise ConfigError(
            "\n".join(
                f"model.generator_settings.{'.'.join(map(str, problem['loc']))}: {problem['msg']} "
                f"(model.generator: {model.generator})"
                for problem in error.errors()
            )
        ) from None
    return dataclasses.asdict(settings)


def build_networks(
    model: ModelConfig, image_size: int, thermal_channels: int, visible_channels: int
) -> tuple[nn.Module, nn.Module]:
    """The generator model.generator names and the (multi-scale) PatchGAN, initialised in that order, for
    `image_size` squares: what training/module.Pix2Pix trains."""
    generator = generator_class(model, image_size)(
        thermal_channels,
        visible_channels,
        image_size,
        model.ngf,
        model.norm,
        model.dropout,
        model.recompute,
        **generator_settings(model),
    )
    discriminator = MultiScaleDiscriminator(
        thermal_channels + visible_channels, model.ndf, model.norm, image_size, model.discriminator_scales
    )
    return generator, discriminator


def saved_config(generator: nn.Module) -> dict:
    """What rebuilds `generator`: its kind (model.generator) and its arguments (`generator.config`)."""
    return {"generator": generator.kind, **generator.config}


def build_generator(config: dict) -> nn.Module:
    """The generator of a `saved_config` (as config.stored.upgraded_payload reads it)."""
    arguments = dict(config)
    kind = arguments.pop("generator")
    if kind not in GENERATORS:
        raise ValueError(f"generator {kind!r} is not one of {sorted(GENERATORS)}")
    return GENERATORS[kind](**arguments, recompute=False)  # recompute saves training memory only
