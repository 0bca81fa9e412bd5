"""The parts of the docs that the project's files already say, written from them: docs/pipeline.md's stage diagram
and table from dvc.yaml (each stage's `desc`, script, params and what it writes, and the edges from one stage's
outputs to another's deps), MLproject's entry points from the pipeline files' stages, and docs/contributing.md's
diagram of the package's parts from their imports and table of its modules from their docstrings. After adding or
changing a stage or a module:

    python -m tools.docs          # rewrites the parts between their markers
    python -m tools.docs --check  # exits 1 when a part differs from what it is written from"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import yaml
from dvc.dvcfile import load_file
from dvc.repo import Repo

from thermal2visible.imports import PACKAGE, part_imports
from thermal2visible.paths import DVC_YAML, PIPELINE_FILES

ROOT = PACKAGE.parents[1]
DOC = Path("docs/pipeline.md")
BEGIN = "<!-- stages: written by `python -m tools.docs` from dvc.yaml -->"
END = "<!-- /stages -->"
PACKAGES_BEGIN = "<!-- modules: written by `python -m tools.docs` from their docstrings -->"
PACKAGES_END = "<!-- /modules -->"
WRITES = ("outs", "metrics", "plots")
CONTRIBUTING = Path("docs/contributing.md")
PARTS_BEGIN = "<!-- packages: written by `python -m tools.docs` from the imports -->"
PARTS_END = "<!-- /packages -->"
MLPROJECT = Path("MLproject")
ENTRIES_BEGIN = "  # written by `python -m tools.docs` from the stages of the pipeline files"
ENTRIES_END = "  # /written"


def paths(entries: list) -> list[str]:
    """The paths of a dvc.yaml list, whose entries are a path or {path: options}."""
    return [entry if isinstance(entry, str) else next(iter(entry)) for entry in entries or []]


def reads(stage: dict) -> str:
    return ", ".join(f"`{name}`" if "." in name else f"`{name}.*`" for name in stage.get("params") or []) or "-"


def writes(stage: dict) -> str:
    return ", ".join(f"`{path}`" for key in WRITES for path in paths(stage.get(key))) or "-"


def diagram(stages: dict) -> list[str]:
    """A mermaid flowchart: an edge from each stage to every stage that depends on what it writes."""
    written = {path: name for name, stage in stages.items() for key in WRITES for path in paths(stage.get(key))}
    edges = dict.fromkeys(
        f"  {written[path]} --> {name}"
        for name, stage in stages.items()
        for dep in paths(stage.get("deps"))
        for path in written
        if dep == path or dep.startswith(path.rstrip("/") + "/")
    )
    return ["```mermaid", "flowchart LR", *edges, "```"]


def section(stages: dict) -> str:
    rows = [
        f"| {name} | `{stage['cmd'].split()[1]}` | {reads(stage)} | {writes(stage)} | {stage.get('desc', '')} |"
        for name, stage in stages.items()
    ]
    table = ["| stage | script | reads | writes | what |", "|---|---|---|---|---|", *rows]
    return "\n".join([BEGIN, *diagram(stages), "", *table, END])


def summary(path: Path) -> str:
    """The first clause of a module's docstring: up to its first colon, semicolon or full stop."""
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    return re.split(r"[:;]\s|\.\s|\.$|\n\n", docstring, maxsplit=1)[0].replace("\n", " ")


def modules_table(package: Path) -> str:
    """A row per module and per package of `package` (a package with its modules, and its own packages by name
    only: generators/, discriminators/ hold a module per kind, which a contributor adds without touching this page),
    from their docstrings."""
    rows = [f"| `{path.name}` | {summary(path)} |" for path in sorted(package.glob("*.py")) if path.stem != "__init__"]
    for folder in sorted(path.parent for path in package.glob("*/__init__.py")):
        modules = [path.name for path in folder.glob("*.py") if path.stem != "__init__"]
        packages = [f"{path.parent.name}/" for path in folder.glob("*/__init__.py")]
        inside = ", ".join(sorted(modules + packages))
        rows.append(f"| `{folder.name}/` | {summary(folder / '__init__.py')}: {inside} |")
    return "\n".join([PACKAGES_BEGIN, "| module | what |", "|---|---|", *rows, PACKAGES_END])


def parts_diagram(edges: set[tuple[str, str]]) -> str:
    """A mermaid flowchart: an arrow from each part of the package to each part it imports."""
    arrows = [f"  {importer} --> {imported}" for importer, imported in sorted(edges)]
    return "\n".join([PARTS_BEGIN, "```mermaid", "flowchart TD", *arrows, "```", PARTS_END])


def stage_targets(project: Path) -> dict[str, str]:
    """Each stage of the pipeline files by its name, with the DVC target that names it (`train`,
    `data/dvc.yaml:synthesize`)."""
    return {
        name: name if pipeline == DVC_YAML else f"{pipeline}:{name}"
        for pipeline in PIPELINE_FILES
        for name in yaml.safe_load((project / pipeline).read_text())["stages"]
    }


def entry_points(targets: dict[str, str]) -> str:
    """MLproject's entry points: `main`, the whole pipeline, and one per stage, each run through
    thermal2visible.dvc_experiment with the settings given as `set`."""
    lines = [ENTRIES_BEGIN]
    for name, target in {"main": "all", **targets}.items():
        lines += [
            f"  {name}:",
            "    parameters:",
            '      set: {type: string, default: ""}',
            f'    command: "python -m thermal2visible.dvc_experiment {target} {{set}}"',
        ]
    return "\n".join([*lines, ENTRIES_END])


def between(text: str, begin: str, end: str, written: str) -> str:
    """`text` with what lies from `begin` to `end` (both markers included) replaced by `written`."""
    before, rest = text.split(begin, 1)
    return before + written + rest.split(end, 1)[1]


def resolved_stages(project: Path) -> dict:
    """The stages of the pipeline files (data/dvc.yaml's, then dvc.yaml's) as DVC reads them: every `${…}` replaced
    by its value (the file's vars, params.yaml's)."""
    repo = Repo(str(project))
    return {
        name: stage
        for pipeline in PIPELINE_FILES
        for name, stage in load_file(repo, str(pipeline)).resolver.resolve()["stages"].items()
    }


def derived(doc: str, stages: dict) -> str:
    """`doc` with the part between its markers written from `stages` (dvc.yaml's, resolved)."""
    return between(doc, BEGIN, END, section(stages))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the docs are stale")
    args = parser.parse_args()
    written = {
        DOC: derived((ROOT / DOC).read_text(), resolved_stages(ROOT)),
        CONTRIBUTING: between(
            between((ROOT / CONTRIBUTING).read_text(), PARTS_BEGIN, PARTS_END, parts_diagram(part_imports())),
            PACKAGES_BEGIN,
            PACKAGES_END,
            modules_table(PACKAGE),
        ),
        MLPROJECT: between(
            (ROOT / MLPROJECT).read_text(), ENTRIES_BEGIN, ENTRIES_END, entry_points(stage_targets(ROOT))
        ),
    }
    stale = [name for name, text in written.items() if text != (ROOT / name).read_text()]
    if args.check:
        if stale:
            sys.exit(f"{', '.join(map(str, stale))}: differ from what they are written from; run {parser.prog}")
        return
    for name in stale:
        (ROOT / name).write_text(written[name])


if __name__ == "__main__":
    main()
