"""The package files a script runs: itself and every `thermal2visible` module it imports, transitively (function-level
imports too, and the modules of a package found with `package_modules`), read from the source with `ast` rather than
by importing it. What a DVC stage depends on (tools.stage_deps), what a registered model packs
(inference.serving) and the code a training's fingerprint holds (`code_digest`) are derived from it."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import json
import pkgutil
from pathlib import Path
from types import ModuleType
from typing import Iterable

PACKAGE = Path(__file__).resolve().parent


def _module_file(name: str) -> Path | None:
    base = PACKAGE.parent.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _submodules(package: str) -> list[str]:
    folder = _module_file(package).parent
    return [f"{package}.{name}" for _, name, _ in pkgutil.iter_modules([str(folder)])]


def package_modules(package: str) -> list[ModuleType]:
    """Every module of `package` (a dotted name), imported: how code finds the parts a folder holds (the generator
    architectures) without a list of them. `import_closure` follows such a call as it follows an import."""
    return [importlib.import_module(name) for name in _submodules(package)]


def _discovered_packages(tree: ast.AST) -> set[str]:
    """The packages a parsed module imports whole with `package_modules("...")`."""
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == package_modules.__name__
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    }


def discovered_folders(path: Path) -> set[Path]:
    """The package folders whose modules `path` imports with `package_modules` (so any module added there is one of
    its imports too)."""
    return {_module_file(package).parent for package in _discovered_packages(ast.parse(path.read_text(), str(path)))}


def _all_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = {module for package in _discovered_packages(tree) for module in _submodules(package)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import module` imports the module; `from module import name` the module alone
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _imported_modules(path: Path) -> set[str]:
    return {name for name in _all_imports(path) if name.split(".")[0] == PACKAGE.name}


def part_imports() -> set[tuple[str, str]]:
    """(importer, imported) for each two parts of the package (its top-level modules and subpackages, by name) where a
    file of the first imports the second: the package's architecture as its code has it."""

    def part(path: Path) -> str:
        return path.relative_to(PACKAGE).parts[0].removesuffix(".py")

    return {
        (part(path), name.split(".")[1])
        for path in PACKAGE.rglob("*.py")
        for name in _imported_modules(path)
        if "." in name and name.split(".")[1] != part(path)
    }


def import_closure(script: Path) -> set[Path]:
    """`script` and the package files it needs, as absolute paths."""
    seen, todo = set(), [script.resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imported_modules(path):
            parts = name.split(".")
            for depth in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__, a/b/__init__ too
                found = _module_file(".".join(parts[:depth]))
                if found:
                    todo.append(found)
    return seen


def _without_docstrings(tree: ast.AST) -> ast.AST:
    """`tree` less the docstring of each module, class and function: text for readers, not behaviour."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


# Where text goes to a person and nowhere else: what is raised, warned, printed or logged.
MESSAGE_CALLS = frozenset(
    {"print", "warn", "rank_zero_warn", "rank_zero_info", "debug", "info", "warning", "error", "exception"}
)


def _without_messages(tree: ast.AST) -> ast.AST:
    """`tree` with the text of every message (the strings and f-strings inside a `raise` or a MESSAGE_CALLS call)
    blanked: rewording an error or a progress line changes no computed value."""
    holders = [node.exc for node in ast.walk(tree) if isinstance(node, ast.Raise) and node.exc is not None]
    holders += [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in MESSAGE_CALLS
    ]
    for holder in holders:
        for node in ast.walk(holder):
            for field, value in ast.iter_fields(node):
                if isinstance(value, list):
                    value[:] = [_blank(item) for item in value]
                else:
                    setattr(node, field, _blank(value))
    return tree


def _blank(node: object) -> object:
    if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return ast.Constant("")
    return node


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def distributions(files: set[Path]) -> set[str]:
    """The installed distributions of every third-party package `files` import (the standard library's modules
    belong to none). Where several install files under one import name (mlflow, mlflow-skinny and mlflow-tracing all
    under `mlflow`), the one named as the import is the package to install."""
    installed = importlib.metadata.packages_distributions()
    tops = {name.split(".")[0] for path in files for name in _all_imports(path)} - {PACKAGE.name}
    found = set()
    for top in tops:
        candidates = installed.get(top, [])
        found |= {name for name in candidates if _canonical(name) == _canonical(top)} or set(candidates)
    return found


def libraries(files: set[Path]) -> dict[str, str]:
    """Distribution -> installed version, for every third-party package `files` import (`distributions`)."""
    return {distribution: importlib.metadata.version(distribution) for distribution in distributions(files)}


def code_digest(alone: Iterable[Path], roots: Iterable[Path]) -> str:
    """sha256 of the files `alone` and the import closures of `roots`: the syntax tree of each file (comments,
    docstrings, messages and layout left out: an edit of those alone keeps the digest) and the version of every
    library those files import."""
    files = {path.resolve() for path in alone}.union(*(import_closure(root) for root in roots))
    digest = hashlib.sha256()
    for path in sorted(files):
        tree = _without_messages(_without_docstrings(ast.parse(path.read_text(), str(path))))
        digest.update(str(path.relative_to(PACKAGE.parents[1])).encode() + b"\0" + ast.dump(tree).encode() + b"\0")
    digest.update(json.dumps(libraries(files), sort_keys=True).encode())
    return digest.hexdigest()
