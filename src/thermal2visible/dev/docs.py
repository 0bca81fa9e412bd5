"""docs/pipeline.md's stage table and diagram, derived from dvc.yaml: each stage's `desc`, script, params and what it
writes, and the edges from one stage's outputs to another's deps. Add or change a stage in dvc.yaml, then

    python -m thermal2visible.dev.docs          # rewrites the part of docs/pipeline.md between its markers
    python -m thermal2visible.dev.docs --check  # exits 1 when that part differs from dvc.yaml"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from thermal2visible.imports import PACKAGE

ROOT = PACKAGE.parents[1]
DOC = Path("docs/pipeline.md")
BEGIN = "<!-- stages: written by `python -m thermal2visible.dev.docs` from dvc.yaml -->"
END = "<!-- /stages -->"
WRITES = ("outs", "metrics", "plots")


def paths(entries: list) -> list[str]:
    """The paths of a dvc.yaml list, whose entries are a path or {path: options}."""
    return [entry if isinstance(entry, str) else next(iter(entry)) for entry in entries or []]


def reads(stage: dict) -> str:
    return ", ".join(f"`{name}`" if "." in name else f"`{name}.*`" for name in stage.get("params") or []) or "-"


def writes(stage: dict) -> str:
    return ", ".join(f"`{path}`" for key in WRITES for path in paths(stage.get(key))) or "-"


def diagram(stages: dict, params: dict) -> list[str]:
    """A mermaid flowchart: an edge from each stage to every stage that depends on what it writes (a dep such as
    `${data.source}` as params.yaml sets it)."""

    def value(match: re.Match) -> str:
        section, key = match[1].split(".", 1)
        return str(params[section][key])

    written = {path: name for name, stage in stages.items() for key in WRITES for path in paths(stage.get(key))}
    edges = dict.fromkeys(
        f"  {written[path]} --> {name}"
        for name, stage in stages.items()
        for dep in (re.sub(r"\$\{([\w.]+)\}", value, dep) for dep in paths(stage.get("deps")))
        for path in written
        if dep == path or dep.startswith(path.rstrip("/") + "/")
    )
    return ["```mermaid", "flowchart LR", *edges, "```"]


def section(stages: dict, params: dict) -> str:
    rows = [
        f"| {name} | `{stage['cmd'].split()[1]}` | {reads(stage)} | {writes(stage)} | {stage.get('desc', '')} |"
        for name, stage in stages.items()
    ]
    table = ["| stage | script | reads | writes | what |", "|---|---|---|---|---|", *rows]
    return "\n".join([BEGIN, *diagram(stages, params), "", *table, END])


def derived(doc: str, pipeline: str, params: str) -> str:
    """`doc` with the part between its markers written from `pipeline` and `params` (dvc.yaml's and params.yaml's
    text)."""
    before, rest = doc.split(BEGIN, 1)
    return before + section(yaml.safe_load(pipeline)["stages"], yaml.safe_load(params)) + rest.split(END, 1)[1]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m thermal2visible.dev.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the docs are stale")
    args = parser.parse_args()
    doc = ROOT / DOC
    fresh = derived(doc.read_text(), (ROOT / "dvc.yaml").read_text(), (ROOT / "params.yaml").read_text())
    if args.check:
        if fresh != doc.read_text():
            sys.exit(f"{DOC}: its stage table differs from dvc.yaml; run {parser.prog}")
        return
    doc.write_text(fresh)


if __name__ == "__main__":
    main()
