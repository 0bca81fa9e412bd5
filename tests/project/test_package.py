"""The installed package is the product: it imports outside any checkout, holds nothing but thermal2visible, and each
of its modules is run by something a user runs (a stage or study script, a `-m` command of the Makefile, the
pipeline files or the guides, the model file MLflow loads), none only by tests or the project's tooling."""

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.projects import copy_project
from thermal2visible.imports import PACKAGE, import_closure
from thermal2visible.registry.packing import SERVED_MODEL

REPO = PACKAGE.parents[1]
MODULE_COMMAND = re.compile(r"-m (thermal2visible(?:\.\w+)+)")
# where a user's commands are written
USER_FILES = ("Makefile", "dvc.yaml", "data/dvc.yaml", "MLproject", "README.md", "docs/*.md", "pipelines/launch/*")


def user_entry_points() -> set[Path]:
    commands = {
        name
        for pattern in USER_FILES
        for path in REPO.glob(pattern)
        if path.is_file()
        for name in MODULE_COMMAND.findall(path.read_text())
    }
    modules = {PACKAGE.parent.joinpath(*name.split(".")).with_suffix(".py") for name in commands}
    return set((REPO / "pipelines").rglob("*.py")) | modules | {SERVED_MODEL}


def test_every_module_of_the_package_is_run_by_something_a_user_runs():
    reached = set().union(*(import_closure(entry) for entry in user_entry_points()))
    only_tooling = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if path not in reached)
    assert not only_tooling, f"{only_tooling}: no user's command runs them; tooling belongs in tools/ or tests/support/"


@pytest.mark.slow  # builds the wheel and imports every module in a fresh interpreter
def test_the_built_package_holds_only_itself_and_imports_outside_a_checkout(tmp_path):
    source = copy_project(tmp_path / "clone")  # setuptools writes its build folders beside the sources it builds
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
    subprocess.run([*build, str(source)], check=True, capture_output=True, cwd=tmp_path, timeout=300)
    (wheel,) = tmp_path.glob("thermal2visible-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}
        archive.extractall(tmp_path / "site")
    assert tops == {PACKAGE.name}
    # A folder with no pipeline files, the unpacked wheel ahead of this checkout's editable install on the path.
    every_module = (
        "import importlib, pkgutil, thermal2visible as t;"
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(t.__path__, 'thermal2visible.')];"
        "import thermal2visible.inference.serving as serving; print(serving.__file__)"
    )
    (tmp_path / "elsewhere").mkdir()
    imported = subprocess.run(
        [sys.executable, "-c", every_module],
        cwd=tmp_path / "elsewhere",
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "site"), "MLFLOW_DISABLE_TELEMETRY": "true"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert imported.stdout.strip() == str(tmp_path / "site" / "thermal2visible" / "inference" / "serving.py")
