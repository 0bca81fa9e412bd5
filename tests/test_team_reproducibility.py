"""The pipeline as a team uses it: one person runs it and pushes to a DVC remote, a teammate clones and pulls.

Two runs of the whole tiny pipeline in two clones give the same dvc.lock (every tracked output the same bytes:
no run id, timestamp or seconds in them); after `dvc push`, a fresh clone's `dvc pull` leaves nothing to run.
"""

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
STAGES = ("synthesize", "ingest", "preprocess", "train_recognizer", "train", "evaluate", "export", "register")


def run(repo: Path, *command: str) -> str:
    # stages run `python` from PATH
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(command, cwd=repo, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def dvc(repo: Path, *args: str) -> str:
    return run(repo, str(Path(sys.executable).with_name("dvc")), *args)


def git(repo: Path, *args: str) -> str:
    return run(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", *args)


def assert_same_lock(first: Path, second: Path) -> None:
    a, b = ((repo / "dvc.lock").read_text().splitlines() for repo in (first, second))
    assert a == b, "dvc.lock differs between two runs:\n" + "\n".join(difflib.unified_diff(a, b, lineterm=""))


@pytest.mark.timeout(900)
def test_two_runs_agree_byte_for_byte_and_a_pull_leaves_nothing_to_run(project_copy, tmp_path):
    first = project_copy
    second = tmp_path / "second"
    git(tmp_path, "clone", "-q", str(first), str(second))

    for repo in (first, second):
        output = dvc(repo, "repro")
        assert all(f"Running stage '{stage}'" in output for stage in STAGES), output
    assert_same_lock(first, second)

    remote = tmp_path / "remote"
    dvc(first, "remote", "add", "-d", "team", str(remote))
    git(first, "add", "-A")
    git(first, "commit", "-qm", "pipeline run")
    dvc(first, "push")

    teammate = tmp_path / "teammate"
    git(tmp_path, "clone", "-q", str(first), str(teammate))
    dvc(teammate, "pull")
    status = dvc(teammate, "status")
    assert "Data and pipelines are up to date" in status, status
    output = dvc(teammate, "repro")
    assert "Running stage" not in output, output
    assert git(teammate, "status", "--porcelain") == ""
