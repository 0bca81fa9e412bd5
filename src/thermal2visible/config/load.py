"""Reading params.yaml, with presets (YAML files under params/ holding some of its sections and keys) and
`section.key=value` overrides over it, as `dvc exp run -S` applies them."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pydantic
import yaml
from pydantic import TypeAdapter, ValidationError

from thermal2visible.config.messages import reason
from thermal2visible.config.schema import SCHEMA, Params
from thermal2visible.config.stored import upgraded_model
from thermal2visible.config.yaml_data import load_yaml
from thermal2visible.errors import ConfigError
from thermal2visible.paths import DVC_YAML, PARAMS


def apply_override(raw: dict, override: str) -> None:
    """`section.key=value`, the value parsed as YAML, or `section.key.inner=value` for a key of a mapping (as `dvc
    exp run -S` does both)."""
    dotted, sep, value = override.partition("=")
    *path, key = dotted.split(".")
    if not sep or not path or not all(path) or not key:
        raise ConfigError(f"override {override!r}: expected section.key=value")
    for depth, name in enumerate(path):
        raw = raw.setdefault(name, {})
        if not isinstance(raw, dict):
            raise ConfigError(f"{'.'.join(path[: depth + 1])}: expected a mapping of keys")
    try:
        raw[key] = load_yaml(value)
    except yaml.YAMLError as error:
        raise ConfigError(f"override {override!r}: not valid YAML: {error}") from None


def _read_sections(path: Path, role: str) -> dict:
    """A YAML file of `section: {key: value}` (params.yaml or a preset), or a ConfigError naming the file."""
    try:
        raw = load_yaml(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {role} file") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict) or not all(isinstance(keys, dict) or keys is None for keys in raw.values()):
        raise ConfigError(f"{path}: expected sections of `key: value`, as in params.yaml")
    return raw


def preset_overrides(path: str | Path) -> list[str]:
    """A preset (a YAML file under params/ holding some sections and keys of params.yaml) as `section.key=value`
    overrides, values in compact JSON (which YAML reads back) so a shell splits the list at spaces only. A mapping
    is laid over params.yaml's key by key (`model.generator_settings.ngf=64`), as the sections are."""
    raw = _read_sections(Path(path), "preset")

    def text(value: object) -> str:
        if isinstance(value, str) and " " not in value and load_yaml(value) == value:
            return value
        return json.dumps(value, separators=(",", ":"))

    def leaves(dotted: str, value: object) -> list[str]:
        if isinstance(value, dict) and value:
            return [leaf for key, inner in value.items() for leaf in leaves(f"{dotted}.{key}", inner)]
        return [f"{dotted}={text(value)}"]

    return [
        leaf
        for section, keys in raw.items()
        for key, value in (keys or {}).items()
        for leaf in leaves(f"{section}.{key}", value)
    ]


def stage_sections(pipeline: Path = DVC_YAML) -> set[str]:
    """The params.yaml sections that the stages of `pipeline` (the project's dvc.yaml) read: their `params:`."""
    try:
        stages = load_yaml(pipeline.read_text()).get("stages", {})
    except (FileNotFoundError, AttributeError, yaml.YAMLError):
        return set()  # outside a DVC project (or a broken dvc.yaml, which DVC reports itself) every section is ours
    return {
        entry.split(".")[0]
        for stage in stages.values()
        for entry in (stage.get("params") or [] if isinstance(stage, dict) else [])
        if isinstance(entry, str)
    }


def extended(own_sections: dict[str, type]) -> type:
    """Params with a stage's own sections (each a schema dataclass, as in config/schema.py) beside the shared ones."""
    if not own_sections:
        return Params
    stage_params = type("StageParams", (Params,), {"__annotations__": dict(own_sections)})
    return pydantic.dataclasses.dataclass(stage_params, frozen=True, config=SCHEMA)


def load_params(
    path: str | Path = PARAMS, overrides: typing.Sequence[str] = (), own_sections: dict[str, type] | None = None
) -> Params:
    """params.yaml with `overrides`, checked. `own_sections`: the sections a stage declares itself (cli.run_stage);
    a section that another stage of dvc.yaml reads is that stage's to check, and is left out here."""
    path = Path(path)
    raw = _read_sections(path, "params")
    for override in overrides:
        apply_override(raw, override)
    if isinstance(raw.get("model"), dict):  # a params.yaml, preset or override in the form before settings moved
        raw["model"] = upgraded_model(raw["model"])
    schema = extended(own_sections or {})
    for section in (raw.keys() - typing.get_type_hints(schema).keys()) & stage_sections():
        del raw[section]
    try:  # YAML's values, read by JSON's rules (dates and other YAML-only values become strings)
        params = TypeAdapter(schema).validate_json(json.dumps(raw, default=str))
    except ValidationError as error:
        problems = (reason(problem, schema=schema) for problem in error.errors())
        raise ConfigError("\n".join(dict.fromkeys(problems))) from None
    return params
