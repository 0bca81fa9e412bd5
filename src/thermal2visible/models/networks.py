"""Which generator class model.generator names, and rebuilding one from what a payload saved of it."""

from __future__ import annotations

from torch import nn

from thermal2visible.config.stored import added_later
from thermal2visible.models.generator import UNetGenerator
from thermal2visible.models.resnet import ResnetGenerator

GENERATORS: dict[str, type[nn.Module]] = {network.kind: network for network in (UNetGenerator, ResnetGenerator)}


def saved_config(generator: nn.Module) -> dict:
    """What rebuilds `generator`: its kind (model.generator) and its arguments (`generator.config`)."""
    return {"generator": generator.kind, **generator.config}


def build_generator(config: dict) -> nn.Module:
    """The generator of a `saved_config`; one saved before model.generator existed is of the kind all were then."""
    arguments = dict(config)
    kind = arguments.pop("generator", added_later()[("model", "generator")])
    if kind not in GENERATORS:
        raise ValueError(f"generator {kind!r} is not one of {sorted(GENERATORS)}")
    return GENERATORS[kind](**arguments, recompute=False)  # recompute saves training memory only
