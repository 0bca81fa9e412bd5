"""A new stage is its script, its dvc.yaml entry and its params.yaml section: added to a copy of the project, with no
file under src/ changed, `dvc repro` runs it after the stage it depends on, its own section is checked by its own
schema, every other stage leaves that section alone, and the generators write its code deps and its row of the docs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # dvc repro and stage scripts in subprocesses
DVC = str(Path(sys.executable).with_name("dvc"))
SCRIPT = '''"""Stage `thumbnails`: how many thermal images data/raw holds, and the side of their thumbnails."""

import json
from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass

from thermal2visible.cli import run_stage
from thermal2visible.config.schema import SCHEMA


@dataclass(frozen=True, config=SCHEMA)
class ThumbnailsConfig:
    side: Annotated[int, Field(ge=8)]


def main(params) -> None:
    images = sorted(Path("data/raw/thermal").rglob("*.png"))
    summary = {"images": len(images), "side": params.thumbnails.side, "seed": params.synthesize.seed}
    Path("reports").mkdir(exist_ok=True)
    Path("reports/thumbnails.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    run_stage(main, __doc__, own_sections={"thumbnails": ThumbnailsConfig})
'''
ENTRY = """
  thumbnails:
    desc: counts the thermal images
    cmd: python pipelines/thumbnails.py
    deps:
      - data/raw
      - pipelines/thumbnails.py
    params:
      - thumbnails
    outs:
      - reports/thumbnails.json
"""


def run(command: list[str], project: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(project / "src"), "DVC_NO_ANALYTICS": "1"}
    return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.timeout(300)
def test_a_stage_is_its_script_its_dvc_entry_and_its_params(project_copy):
    project = project_copy
    (project / "pipelines" / "thumbnails.py").write_text(SCRIPT)
    pipeline = (project / "dvc.yaml").read_text()
    (project / "dvc.yaml").write_text(pipeline.replace("\nplots:\n", ENTRY + "\nplots:\n", 1))
    with (project / "params.yaml").open("a") as params:
        params.write("thumbnails:\n  side: 16\n")

    for generator in ("stage_deps", "docs"):  # what the docs say to run after adding a stage
        assert run([sys.executable, "-m", f"tools.{generator}"], project).returncode == 0
    stage = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]["thumbnails"]
    assert {"src/thermal2visible/cli.py", "src/thermal2visible/config/schema.py"} <= set(stage["deps"])
    assert "| thumbnails | `pipelines/thumbnails.py` | `thumbnails.*` |" in (project / "docs/pipeline.md").read_text()

    done = run([DVC, "repro", "thumbnails"], project)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    shipped = yaml.safe_load((project / "params.yaml").read_text())["synthesize"]
    assert json.loads((project / "reports" / "thumbnails.json").read_text()) == {
        "images": shipped["identities"] * shipped["images_per_identity"],  # synthesize ran first, as its dep says
        "side": 16,
        "seed": shipped["seed"],
    }
    assert run(["git", "status", "--porcelain", "--", "src"], project).stdout == ""

    refused = run([sys.executable, "pipelines/thumbnails.py", "--set", "thumbnails.side=4"], project)
    assert refused.returncode == 1 and "thumbnails.side: 4 must be >= 8" in refused.stderr
    misspelt = run([sys.executable, "pipelines/synthesize.py", "--set", "thumbnail.side=16"], project)
    assert misspelt.returncode == 1 and "thumbnail: unknown section" in misspelt.stderr
