"""The networks a model section builds: the generator model.generator names (every architecture models/generators/
holds, found there rather than listed) and the PatchGAN; and rebuilding a generator from what a payload saved of it."""

from __future__ import annotations

import json

from pydantic import TypeAdapter, ValidationError
from torch import nn

from thermal2visible.config.messages import reason
from thermal2visible.config.schema import ModelConfig
from thermal2visible.errors import ConfigError
from thermal2visible.imports import package_modules
from thermal2visible.models.discriminator import Discriminator
from thermal2visible.models.generator import Generator


def found(modules: list, base: type) -> dict[str, type]:
    """kind -> class, for every subclass of `base` with a `kind` of its own in `modules`."""
    return {
        network.kind: network
        for module in modules
        for network in vars(module).values()
        if isinstance(network, type) and issubclass(network, base) and "kind" in vars(network)
    }


# The package names are written out: that is how imports.py sees that these folders' modules are imported.
GENERATORS: dict[str, type[Generator]] = found(package_modules("thermal2visible.models.generators"), Generator)
DISCRIMINATORS: dict[str, type[Discriminator]] = found(
    package_modules("thermal2visible.models.discriminators"), Discriminator
)
ROLES = {"generator": GENERATORS, "discriminator": DISCRIMINATORS}  # model.<role> names a kind of each


def network_class(model: ModelConfig, role: str) -> type:
    """The class model.<role> names; a ConfigError naming the key otherwise."""
    kind, kinds = getattr(model, role), ROLES[role]
    if kind not in kinds:
        raise ConfigError(f"model.{role}: {kind!r} is not one of {sorted(kinds)}")
    return kinds[kind]


def own_settings(model: ModelConfig, role: str):
    """model.<role>_settings checked by the network's own `Settings`; a ConfigError naming each bad key."""
    key = f"{role}_settings"
    network = network_class(model, role)
    try:
        return checked_settings(network, getattr(model, key))
    except ValidationError as error:
        problems = (reason(problem, schema=network.Settings, prefix=f"model.{key}.") for problem in error.errors())
        raise ConfigError("\n".join(f"{problem} (model.{role}: {network.kind})" for problem in problems)) from None


def checked_settings(network: type, settings: dict):
    """`settings` as `network`'s own Settings, by JSON's rules (as params.yaml and a payload are read)."""
    return TypeAdapter(network.Settings).validate_json(json.dumps(settings))


def check_networks(model: ModelConfig, image_size: int) -> dict[str, object]:
    """Each network's own settings (role -> its checked Settings); a ConfigError naming the key, before any data is
    read, for a kind that does not exist, settings its `Settings` refuses, or an `image_size`
    (preprocess.image_size) a network's size rule refuses with its settings."""
    settings = {role: own_settings(model, role) for role in ROLES}
    for role, own in settings.items():
        why_not = network_class(model, role).size_rule(image_size, own)
        if why_not:
            raise ConfigError(f"preprocess.image_size: {why_not} (model.{role}: {getattr(model, role)})")
    return settings


def build_networks(
    model: ModelConfig, image_size: int, thermal_channels: int, visible_channels: int
) -> tuple[nn.Module, nn.Module]:
    """The generator model.generator names and the discriminator model.discriminator names, initialised in that
    order, for `image_size` squares: what training/module.Pix2Pix trains."""
    settings = check_networks(model, image_size)
    generator = network_class(model, "generator")(thermal_channels, visible_channels, image_size, settings["generator"])
    generator.recompute = model.recompute
    discriminator = network_class(model, "discriminator")(
        thermal_channels + visible_channels, image_size, settings["discriminator"]
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
    settings = checked_settings(GENERATORS[kind], arguments.pop("settings"))
    return GENERATORS[kind](**arguments, settings=settings)
