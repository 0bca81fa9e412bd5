"""docs/params.md, generated: every key of params.yaml with its type (the schema's) and its comment (params.yaml's),
and whether it defines the trained weights (the schema's marks); then each network kind models/ holds with its own
settings (its module's `Settings`: type and description). Values stay in params.yaml: an experiment that changes one
leaves this page true. The page documents the kinds the repository ships, those whose module git tracks: a kind
dropped in and not yet committed leaves it fresh, and once committed it fails the check until the page is regenerated
(docs/contributing.md's recipe).

    python -m tools.params_page            # rewrite docs/params.md
    python -m tools.params_page --check    # exit 1 when docs/params.md is stale (the tests run it)
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import types
import typing
from pathlib import Path

from thermal2visible.config.schema import SECTIONS

from thermal2visible.config.stored import marked
from thermal2visible.models.networks import ROLES
from thermal2visible.paths import PARAMS

REFERENCE = Path("docs/params.md")
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[a-z_0-9]+):(?P<value>[^#]*)(#\s?(?P<comment>.*))?$")
COMMENT_LINE = re.compile(r"^ +#\s?(?P<comment>.*)$")


def comments(text: str) -> dict[str, str]:
    """`section` and `section.key` -> the comment written beside it in params.yaml (continuation lines joined)."""
    found: dict[str, str] = {}
    section, last = None, None
    for line in text.splitlines():
        match = KEY_LINE.match(line)
        if match:
            if not match["indent"]:
                section = match["key"]
                last = section
            else:
                last = f"{section}.{match['key']}"
            found[last] = (match["comment"] or "").strip()
        elif last and COMMENT_LINE.match(line) and found.get(last):
            found[last] += " " + COMMENT_LINE.match(line)["comment"].strip()
        elif not line.strip():
            last = None
    return found


def type_name(annotation: object) -> str:
    """A field's type as a reader writes it: `int`, `float`, `unet | resnet`, `auto | bool`, `[float, float]`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(str(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin is tuple:
        return "[" + ", ".join(type_name(arg) for arg in args) + "]"
    return getattr(annotation, "__name__", str(annotation))


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def shipped(module: types.ModuleType) -> bool:
    """Whether git tracks the module's file (every module is shipped outside a git checkout)."""
    path = Path(module.__file__)
    done = subprocess.run(["git", "ls-files", "--error-unmatch", path.name], cwd=path.parent, capture_output=True)
    return done.returncode == 0 or b"not a git repository" in done.stderr


def kinds() -> list[str]:
    """A section per role (model.generator, model.discriminator): each shipped kind, its module's first paragraph
    and the keys of model.<role>_settings its Settings declares."""
    lines = []
    for role, networks in ROLES.items():
        lines += ["", f"## `model.{role}` kinds and their `model.{role}_settings`"]
        for kind, network in sorted(networks.items()):
            module = sys.modules[network.__module__]
            if not shipped(module):
                continue
            hints = typing.get_type_hints(network.Settings, include_extras=True)
            summary = " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())  # its first paragraph
            lines += ["", f"### `{kind}`", "", summary, ""]
            lines += ["| key | type | what it does |", "|---|---|---|"]
            for field in dataclasses.fields(network.Settings):
                annotation, *extras = typing.get_args(hints[field.name]) or (hints[field.name],)
                described = next((extra.description for extra in extras if getattr(extra, "description", None)), "")
                lines.append(f"| `{field.name}` | {cell(type_name(annotation))} | {cell(described)} |")
    return lines


def reference(params_text: str) -> str:
    notes = comments(params_text)
    lines = [
        "# params.yaml reference",
        "",
        "Generated from the settings schema and params.yaml's comments by `python -m tools.params_page`"
        " (a test fails when this page is stale); the values are params.yaml's. Override a key with "
        "`dvc exp run -S section.key=value`, a stage script's `--set section.key=value`, or a preset under `params/`. "
        "**Weights**: yes, the key defines the trained "
        "weights, so a checkpoint of a run with another value never continues; stop, it only says where a run stops, "
        "so a checkpoint continues where the new value would not have stopped the run before it; no, it only says how "
        "a run is carried out.",
    ]
    for section, schema in SECTIONS.items():
        hints, weights, stops = typing.get_type_hints(schema), marked(section, "weights"), marked(section, "stops")
        lines += ["", f"## `{section}`", ""]
        if notes.get(section):
            lines += [notes[section], ""]
        lines += ["| key | type | weights | what it does |", "|---|---|---|---|"]
        for field in dataclasses.fields(schema):
            key = field.name
            defines = "stop" if stops.get(key) else {True: "yes", False: "no"}.get(weights.get(key), "")
            lines.append(
                f"| `{key}` | {cell(type_name(hints[key]))} | {defines} | {cell(notes.get(f'{section}.{key}', ''))} |"
            )
    return "\n".join(lines + kinds()) + "\n"


def main(argv: list[str]) -> None:
    fresh = reference(PARAMS.read_text())
    if "--check" in argv:
        if not REFERENCE.is_file() or REFERENCE.read_text() != fresh:
            sys.exit(f"{REFERENCE} is stale: run `python -m tools.params_page` to regenerate it")
        return
    REFERENCE.write_text(fresh)
    print(f"wrote {REFERENCE}")


if __name__ == "__main__":
    main(sys.argv[1:])
