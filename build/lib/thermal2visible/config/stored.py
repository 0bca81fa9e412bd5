"""Files written by this or an older version (a generator payload, a training checkpoint, the settings stored with a
model or cache: an ONNX file's metadata, a cache manifest): read back with each key added since at the value those
files were made with, settings checked by type and range. The one place old files are upgraded."""

from __future__ import annotations

import dataclasses
import json

from pydantic import TypeAdapter, ValidationError

from thermal2visible.config.marks import NEVER_ABSENT
from thermal2visible.config.messages import reason
from thermal2visible.config.schema import SECTIONS
from thermal2visible.errors import ConfigError


def marked(section: str, mark: str) -> dict[str, object]:
    """Each key of `section` -> its `mark` ("weights" or "before"); {} for a section without marks."""
    return {f.name: f.metadata[mark] for f in dataclasses.fields(SECTIONS[section]) if mark in f.metadata}


def weight_defining() -> dict[str, tuple[str, ...]]:
    """Per section training reads, the keys that define the trained weights (read from the marks above)."""
    keys = {
        section: tuple(key for key, defines in marked(section, "weights").items() if defines) for section in SECTIONS
    }
    return {section: names for section, names in keys.items() if names}


def added_later() -> dict[tuple[str, str], object]:
    """(section, key) -> the value every run and model stored before the key existed had."""
    return {
        (section, key): before
        for section in SECTIONS
        for key, before in marked(section, "before").items()
        if before is not NEVER_ABSENT
    }


def upgraded(section: str, settings: dict) -> dict:
    """A section as stored by an older version, with each key added since at the value those files were made with
    (and the model keys moved since where they went)."""
    settings = {key: before for (name, key), before in added_later().items() if name == section} | settings
    return upgraded_model(settings) if section == "model" else settings


# The model keys of the files written before each network had its own settings: old key -> where each went.
MOVED_INTO_SETTINGS = {
    "ngf": (("generator_settings", "ngf"),),
    "norm": (("generator_settings", "norm"), ("discriminator_settings", "norm")),  # one norm was both networks'
    "dropout": (("generator_settings", "dropout"),),
    "ndf": (("discriminator_settings", "ndf"),),
    "discriminator_scales": (("discriminator_settings", "scales"),),
}
MOVED_BEFORE = {"discriminator_scales": 1}  # what the files written before that key had


def upgraded_model(model: dict) -> dict:
    """A model section in the form of params.yaml, a preset or an override written before each network had its own
    settings (model.ngf, ndf, norm, dropout, discriminator_scales): those keys moved into the networks' settings.
    A key given the old way wins: in an old file it is the only one, and an override in the old form (`-S
    model.ngf=64`) is newer than the file it changes."""
    if not model.keys() & MOVED_INTO_SETTINGS.keys():
        return model
    moved = {key: value for key, value in model.items() if key not in MOVED_INTO_SETTINGS}
    for old, places in MOVED_INTO_SETTINGS.items():
        for settings_key, key in places:
            settings = moved[settings_key] = dict(moved.get(settings_key) or {})
            if old in model:
                settings[key] = model[old]
            elif old in MOVED_BEFORE:
                settings.setdefault(key, MOVED_BEFORE[old])
    return moved


def stored_section(section: str, settings: dict):
    """A section as stored with a model or cache (JSON: lists for tuples) -> its settings, checked by type and range.
    A key added since takes the value those files were made with; any other missing key means the file is not one
    this code can read."""
    upgraded_settings = upgraded(section, settings)
    try:
        return TypeAdapter(SECTIONS[section]).validate_json(json.dumps(upgraded_settings))
    except ValidationError as error:
        missing = "written before this key existed; run the stage that wrote the file again"
        raise ConfigError(
            "\n".join(dict.fromkeys(f"stored {reason(problem, (section,), missing)}" for problem in error.errors()))
        ) from None


# Keys a file gained after its first version, at the value every older file of its kind had.
PAYLOAD_ADDED_LATER = {"test_mode": "eval"}  # a generator payload: all were tested in eval mode before the key
CHECKPOINT_ADDED_LATER = {"bad_steps": 0}  # a training checkpoint: train.max_bad_steps counted from 0 then


SHARED_ARGUMENTS = (
    "generator",
    "in_channels",
    "out_channels",
    "image_size",
)  # a saved generator's, beside its settings


def upgraded_payload(payload: dict) -> dict:
    """A generator payload (models/payloads.py) as this version reads it; its `model` section names model.generator
    (one saved before that key existed is of the kind all were then) and holds the generator's own `settings` (one
    saved before, its arguments beyond the shared ones: the U-Net's and ResNet's ngf, norm, dropout)."""
    model = {"generator": added_later()[("model", "generator")]} | payload["model"]
    if "settings" not in model:
        own = {key: value for key, value in model.items() if key not in SHARED_ARGUMENTS}
        model = {key: value for key, value in model.items() if key in SHARED_ARGUMENTS} | {"settings": own}
    return PAYLOAD_ADDED_LATER | payload | {"model": model}


def upgraded_checkpoint(checkpoint: dict) -> dict:
    """The keys of a training checkpoint that Pix2Pix keeps itself, as this version reads them."""
    return CHECKPOINT_ADDED_LATER | {key: checkpoint[key] for key in CHECKPOINT_ADDED_LATER if key in checkpoint}
