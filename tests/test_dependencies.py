"""pyproject.toml declares every third-party package the project's code (src/ and pipelines/) imports, read from
the imports themselves: a package that is installed only because another one pulls it in is one upgrade away from
missing."""

import re
import tomllib

from thermal2visible.imports import PACKAGE, distributions


def name(requirement: str) -> str:
    """A requirement's distribution name, canonical (PEP 503): `ruamel.yaml==0.19.1` -> `ruamel-yaml`."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement)[0]).lower()


def test_pyproject_declares_every_imported_package():
    project = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())["project"]
    declared = {name(requirement) for requirement in project["dependencies"]}
    code = {*PACKAGE.rglob("*.py"), *(PACKAGE.parents[1] / "pipelines").rglob("*.py")}
    imported = {name(distribution) for distribution in distributions(code)}
    assert imported - declared == set(), "imported by the code, not declared in pyproject.toml's dependencies"
