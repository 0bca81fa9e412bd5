"""The DVC pipeline in a real temporary git + DVC repo: repro, no-op repro, and a param change re-running only its stages."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA_STAGES = ["synthesize", "ingest", "preprocess"]
TINY = {"synthesize": {"identities": 3, "images_per_identity": 4, "resolution": 40},
        "preprocess": {"image_size": 32}}


def run(cmd, cwd):
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def dvc(repo, *args):
    return run([str(Path(sys.executable).with_name("dvc")), *args], repo)


def ran_stages(output):
    return {stage for stage in DATA_STAGES if f"Running stage '{stage}'" in output}


def set_params(repo, changes):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for section, values in changes.items():
        params[section].update(values)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "project"
    repo.mkdir()
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, repo / name)
    for name in ("pipelines", "src"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    set_params(repo, TINY)
    run(["git", "init", "-q"], repo)
    dvc(repo, "init", "-q")
    dvc(repo, "config", "core.analytics", "false")
    run(["git", "add", "-A"], repo)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"], repo)
    return repo


def test_repro_twice_is_a_noop_and_a_param_reruns_only_its_stages(repo):
    first = dvc(repo, "repro", "preprocess")
    assert ran_stages(first) == set(DATA_STAGES)
    manifest = repo / "data" / "cache" / "manifest.json"
    assert manifest.is_file()
    stamp = manifest.stat().st_mtime_ns

    second = dvc(repo, "repro", "preprocess")
    assert ran_stages(second) == set()
    assert manifest.stat().st_mtime_ns == stamp
    assert "up to date" in dvc(repo, "status", "preprocess")

    set_params(repo, {"preprocess": {"image_size": 16}})
    third = dvc(repo, "repro", "preprocess")
    assert ran_stages(third) == {"preprocess"}
    assert json.loads(manifest.read_text())["image_size"] == 16
