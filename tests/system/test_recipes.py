"""The recovery recipes of docs/troubleshooting.md, run as written: their commands are read from the markdown's code
blocks, so a recipe that stops working fails here instead of in a user's shell."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from conftest import copy_without_store
from thermal2visible.config.load import load_params
from tests.support.servers import quiet_env
from thermal2visible.registry.gate import CHAMPION, registered_model_name

REPO = Path(__file__).resolve().parents[2]


def recipe(guide: str, heading: str) -> list[str]:
    """The command lines of the first bash block after `heading` in docs/<guide>, comments and blank lines left out."""
    text = (REPO / "docs" / guide).read_text()
    block = re.search(r"```bash\n(.*?)```", text[text.index(heading) :], re.S).group(1)
    return [line.split("    # ")[0].strip() for line in block.splitlines() if line.strip()]


def shell_env() -> dict[str, str]:
    """The venv's commands first on PATH, as after `source .venv/bin/activate`."""
    return quiet_env() | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def shell(line: str, cwd: Path, timeout: float = 120) -> str:
    """One recipe line in bash, as a user types it."""
    done = subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=shell_env(), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow  # the recipe's commands in bash, each a Python process
def test_a_run_stuck_in_running_is_found_and_closed_and_none_found_says_so(tmp_path, monkeypatch):
    find, close, _ = recipe("troubleshooting.md", "**A run stuck in RUNNING.**")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert shell(find, tmp_path).strip() == "no run is RUNNING"  # no experiment, no run: no crash

    client = MlflowClient(uri)
    stuck = client.create_run(client.create_experiment("thermal2visible"), run_name="train").info.run_id
    [line] = shell(find, tmp_path).splitlines()
    assert line.split()[:2] == [stuck, "train"]
    shell(close.replace("RUN_ID", line.split()[0]), tmp_path)
    assert client.get_run(stuck).info.status == "FAILED"


def settled(project: Path) -> None:
    """The project as committed: git sees no change, and DVC would rerun nothing but `register` (always run)."""
    assert "nothing to commit, working tree clean" in shell("git status", project), project.name
    status = shell("dvc status", project)
    stages = [line for line in status.splitlines() if line.endswith(":") and not line.startswith((" ", "\t"))]
    assert stages == ["register:"], f"{project.name}: {status}"


@pytest.mark.slow  # two tiny pipelines and a half, beside the shared one
@pytest.mark.timeout(1200)
def test_the_way_back_after_a_failed_experiment_and_from_the_camera_scene_ends_as_committed(pipeline_project, tmp_path):
    """troubleshooting.md's way back after a failed `dvc exp run`, in the project that ran the demo (its outputs in
    DVC's cache: nothing retrains), and camera.md's run and way back in a clone that never ran the demo (no cache:
    `dvc repro` makes them), each as written, at the tests' size."""
    demo = tmp_path / "demo"
    copy_without_store(pipeline_project, demo)
    shell("git add -A && git -c user.name=t -c user.email=t@t commit -qm demo", demo)  # the demo's run committed
    fresh = tmp_path / "fresh"
    shell(f"git clone -q {demo} {fresh}", tmp_path)

    # new built-in data and a training that fails after the data stages ran: a half-done workspace
    failing = "-S synthesize.identities=3 -S train.max_minutes=0.0001 -S early_stop.window=5"
    failed = subprocess.run(["bash", "-c", f"dvc exp run {failing}"], cwd=demo, env=shell_env(), capture_output=True)
    assert failed.returncode != 0 and "identities: 3" in (demo / "params.yaml").read_text()
    for line in recipe("troubleshooting.md", "Put the committed pipeline back"):
        output = shell(line, demo, timeout=600)
        assert "Running stage 'train'" not in output  # restored from DVC's cache, not retrained
    settled(demo)

    [run, _] = recipe("camera.md", "It runs end to end from a fresh clone")
    shell(f"{run} --preset params/tiny.yaml", fresh, timeout=600)  # the camera scene at the tests' size
    assert "scene: camera" in (fresh / "params.yaml").read_text()
    camera = registered_model_name(load_params(fresh / "params.yaml"))
    assert camera.endswith("-camera")  # the built-in scene's own model, beside the portraits'
    for line in recipe("camera.md", "To go back to the portraits"):
        shell(line, fresh, timeout=600)
    settled(fresh)
    portrait = registered_model_name(load_params(fresh / "params.yaml"))
    store = MlflowClient(f"sqlite:///{fresh / 'mlflow.db'}")
    # "The registered models of both datasets stay in the store.", each its own data's champion
    data = {store.get_model_version_by_alias(name, CHAMPION).tags["data_hash"] for name in (camera, portrait)}
    assert len(data) == 2 and all(data)
