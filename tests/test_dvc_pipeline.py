"""The DVC pipeline in a real temporary git + DVC repo: repro, no-op repro, and a param change re-running only its stages."""
import json
import subprocess
import sys
from pathlib import Path

import yaml

DATA_STAGES = ["synthesize", "ingest", "preprocess"]


def dvc(repo, *args):
    result = subprocess.run([str(Path(sys.executable).with_name("dvc")), *args], cwd=repo, capture_output=True,
                            text=True)
    assert result.returncode == 0, f"dvc {args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def ran_stages(output):
    return {stage for stage in DATA_STAGES if f"Running stage '{stage}'" in output}


def test_repro_twice_is_a_noop_and_a_param_reruns_only_its_stages(project_copy):
    repo = project_copy
    first = dvc(repo, "repro", "preprocess")
    assert ran_stages(first) == set(DATA_STAGES)
    manifest = repo / "data" / "cache" / "manifest.json"
    stamp = manifest.stat().st_mtime_ns

    second = dvc(repo, "repro", "preprocess")
    assert ran_stages(second) == set()
    assert manifest.stat().st_mtime_ns == stamp
    assert "up to date" in dvc(repo, "status", "preprocess")

    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["preprocess"]["image_size"] = 16
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    third = dvc(repo, "repro", "preprocess")
    assert ran_stages(third) == {"preprocess"}
    assert json.loads(manifest.read_text())["image_size"] == 16
