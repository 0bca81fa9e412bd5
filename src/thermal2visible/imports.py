"""The package files a script runs: itself and every `thermal2visible` module it imports, transitively (function-level
imports too, and the modules of a package found with `package_modules`), read from the source with `ast` rather than
by importing it. What a DVC stage depends on (thermal2visible.dev.stage_deps) and what a registered model packs
(inference.serving) are derived from it."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

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


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = {module for package in _discovered_packages(tree) for module in _submodules(package)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import module` imports the module; `from module import name` the module alone
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in names if name.split(".")[0] == PACKAGE.name}


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
