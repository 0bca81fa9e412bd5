"""The fast tests' guard (conftest.fast_tests_start_no_python) finds a Python process however a test starts it."""

import shutil
import sys
from pathlib import Path

import pytest
from conftest import python_program

VENV_COMMAND = str(Path(sys.executable).with_name("dvc"))


@pytest.mark.parametrize(
    "args",
    [
        [sys.executable, "-c", "pass"],
        ["python3", "-V"],
        [VENV_COMMAND, "status"],
        ["bash", "-c", f"cd /tmp && {sys.executable} -V"],
        ["sh", "-c", "true; python3 -c pass"],
        ["timeout", "30", "python3", "-V"],
        ["timeout", "30", sys.executable, "-c", "pass"],  # a launcher's command with its own -c
        ["env", "A=1", VENV_COMMAND, "repro"],
        f"{sys.executable} -c pass",
    ],
)
def test_python_is_found_however_it_is_started(args):
    assert python_program(args)


def test_a_venv_command_found_on_path_is_python(monkeypatch):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    assert shutil.which("dvc") and python_program(["dvc", "status"])


@pytest.mark.parametrize("args", [["git", "status"], ["bash", "-c", "git init -q && ls"], ["timeout", "5", "true"]])
def test_other_programs_are_not_python(args):
    assert not python_program(args)
