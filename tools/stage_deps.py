"""The code deps of the pipeline files (dvc.yaml, data/dvc.yaml), derived: each stage depends on its script and every
package file the script imports (thermal2visible.imports), so that DVC reruns exactly the stages a code change can
affect. Edit the imports, then

    python -m tools.stage_deps          # rewrites the code deps of every stage
    python -m tools.stage_deps --check  # exits 1 naming the stages whose deps are stale

Data deps (outputs of other stages, `${data.source}`), and code deps written with a comment saying why (a file a stage
logs rather than imports), are kept as written."""

from __future__ import annotations

import argparse
import re
import sys

import yaml

from thermal2visible.imports import PACKAGE, discovered_folders, import_closure
from thermal2visible.paths import PIPELINE_FILES

ROOT = PACKAGE.parents[1]
CODE = ("pipelines/", "src/")
DEP = re.compile(r"^      - (?P<path>[^\s#]+)(?P<comment>\s+#.*)?$")


def code_deps(command: str) -> list[str]:
    """The script's import closure; a folder whose modules the code finds by itself (imports.package_modules) is one
    dep, the folder, so a module added there is a dep without any change here."""
    closure = import_closure(ROOT / command.split()[1])
    folders = {folder for path in closure for folder in discovered_folders(path)}
    files = {path for path in closure if not any(folder in path.parents for folder in folders)}
    return sorted(str(path.relative_to(ROOT)) for path in files | folders)


def derived(text: str) -> str:
    """dvc.yaml's text with every stage's code deps replaced by its script's import closure. A code dep with a comment
    is one the imports cannot show (a file the stage logs, say) and stays, with its comment."""
    stages = yaml.safe_load(text)["stages"]
    lines, stage, in_deps, kept = [], None, False, {}
    for line in text.splitlines(keepends=True):
        heading = re.match(r"^  (\w+):\s*$", line)
        if heading and heading[1] in stages:
            stage, in_deps, kept = heading[1], False, {}
        entry = DEP.match(line.rstrip("\n"))
        if in_deps and entry and entry["path"].startswith(CODE):
            if entry["comment"]:
                kept[entry["path"]] = entry["comment"]
            continue  # written below, after the stage's last data dep
        if in_deps and not entry:
            paths = sorted(set(code_deps(stages[stage]["cmd"])) | set(kept))
            lines += [f"      - {path}{kept.get(path, '')}\n" for path in paths]
            in_deps = False
        in_deps = in_deps or (stage is not None and line.rstrip() == "    deps:")
        lines.append(line)
    return "".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.stage_deps", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a stage's deps are stale")
    args = parser.parse_args()
    for pipeline in PIPELINE_FILES:
        path = ROOT / pipeline
        text = path.read_text()
        fresh = derived(text)
        if args.check:
            stale = [
                name
                for name, stage in yaml.safe_load(text)["stages"].items()
                if stage.get("deps") != yaml.safe_load(fresh)["stages"][name].get("deps")
            ]
            if stale:
                sys.exit(
                    f"{pipeline}: the code deps of {', '.join(stale)} differ from their imports; run {parser.prog}"
                )
        else:
            path.write_text(fresh)


if __name__ == "__main__":
    main()
