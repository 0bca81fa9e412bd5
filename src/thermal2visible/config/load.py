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
from thermal2visible.errors import ConfigError
from thermal2visible.paths import DVC_YAML, PARAMS


def apply_override(raw: dict, override: str) -> None:
    """`section.key=value`, the value parsed as YAML (as `dvc exp run -S` does)."""
    dotted, sep, value = override.partition("=")
    section, dot, key = dotted.partition(".")
    if not sep or not dot or not key:
        raise ConfigError(f"override {override!r}: expected section.key=value")
    raw.setdefault(section, {})
    if not isinstance(raw[section], dict):
        raise ConfigError(f"{section}: expected a mapping of keys")
    raw[section][key] = yaml.safe_load(value)


def _read_sections(path: Path, role: str) -> dict:
    """A YAML file of `section: {key: value}` (params.yaml or a preset), or a ConfigError naming the file."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {role} file") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict) or not all(isinstance(keys, dict) or keys is None for keys in raw.values()):
        raise ConfigError(f"{path}: expected sections of `key: value`, as in params.yaml")
    return raw


def preset_overrides(path: str | Path) -> list[str]:
    """A preset (a YAML file under params/ holding some sections and keys of params.yaml) as `section.key=value`
    overrides, values in compact JSON (which YAML reads back) so a shell splits the list at spaces only."""
    raw = _read_sections(Path(path), "preset")

    def text(value: object) -> str:
        if isinstance(value, str) and " " not in value and yaml.safe_load(value) == value:
            return value
        return json.dumps(value, separators=(",", ":"))

    return [f"{section}.{key}={text(value)}" for section, keys in raw.items() for key, value in (keys or {}).items()]


def stage_sections(pipeline: Path = DVC_YAML) -> set[str]:
    """The params.yaml sections that the stages of `pipeline` (the project's dvc.yaml) read: their `params:`."""
    try:
        stages = yaml.safe_load(pipeline.read_text()).get("stages", {})
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
    schema = extended(own_sections or {})
    for section in (raw.keys() - typing.get_type_hints(schema).keys()) & stage_sections():
        del raw[section]
    try:  # YAML's values, read by JSON's rules (dates and other YAML-only values become strings)
        params = TypeAdapter(schema).validate_json(json.dumps(raw, default=str))
    except ValidationError as error:
        problems = (reason(problem, schema=schema) for problem in error.errors())
        raise ConfigError("\n".join(dict.fromkeys(problems))) from None
    return params
