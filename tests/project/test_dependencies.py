"""pyproject.toml declares every third-party package the project's code imports, read from the imports themselves: the
product's (src/ and pipelines/) as dependencies, the tooling's (tests/, tools/, benchmarks/) in the dev extra. A
package installed only because another one pulls it in is one upgrade away from missing; a runtime dependency the
product does not import says in a comment what needs it, so none is there for the tooling alone."""

import re
import tomllib

from thermal2visible.imports import PACKAGE, distributions

REPO = PACKAGE.parents[1]
PYPROJECT = REPO / "pyproject.toml"
PROJECT = tomllib.loads(PYPROJECT.read_text())["project"]
PRODUCT = {*PACKAGE.rglob("*.py"), *(REPO / "pipelines").rglob("*.py")}
TOOLING = {path for folder in ("tests", "tools", "benchmarks") for path in (REPO / folder).rglob("*.py")}


def name(requirement: str) -> str:
    """A requirement's distribution name, canonical (PEP 503): `ruamel.yaml==0.19.1` -> `ruamel-yaml`."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement)[0]).lower()


def declared(*extras: str) -> set[str]:
    requirements = PROJECT["dependencies"] + [
        item for extra in extras for item in PROJECT["optional-dependencies"][extra]
    ]
    return {name(requirement) for requirement in requirements}


def imported(files: set) -> set[str]:
    return {name(distribution) for distribution in distributions(files)}


def test_pyproject_declares_every_imported_package():
    assert imported(PRODUCT) - declared() == set(), (
        "imported by the code, not declared in pyproject.toml's dependencies"
    )


def test_the_dev_extra_declares_what_the_tooling_imports():
    assert imported(TOOLING) - declared("dev", "team") == set(), "imported by the tooling, not in the dev extra"


def test_a_runtime_dependency_the_product_does_not_import_says_what_needs_it():
    lines, used = PYPROJECT.read_text().splitlines(), imported(PRODUCT)
    unexplained = [
        requirement
        for requirement in PROJECT["dependencies"]
        if name(requirement) not in used
        for number, line in enumerate(lines)
        if line.strip() == f'"{requirement}",' and not lines[number - 1].strip().startswith("#")
    ]
    assert not unexplained, f"{unexplained}: not imported by src/ or pipelines/; say what needs it, or move it to dev"
