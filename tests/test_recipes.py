"""The recovery recipes of docs/troubleshooting.md, run as written: their commands are read from the markdown's code
blocks, so a recipe that stops working fails here instead of in a user's shell."""

import os
import re
import subprocess
import sys
from pathlib import Path

from mlflow import MlflowClient

REPO = Path(__file__).resolve().parents[1]


def recipe(guide: str, heading: str) -> list[str]:
    """The command lines of the first bash block after `heading` in docs/<guide>, comments and blank lines left out."""
    text = (REPO / "docs" / guide).read_text()
    block = re.search(r"```bash\n(.*?)```", text[text.index(heading) :], re.S).group(1)
    return [line.split("    # ")[0].strip() for line in block.splitlines() if line.strip()]


def shell(line: str, cwd: Path) -> str:
    """One recipe line in bash, the venv's commands first on PATH (as after `source .venv/bin/activate`)."""
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    return done.stdout


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
