"""docs/params.md is generated from the settings schema and params.yaml's comments, and kept fresh."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from thermal2visible.paths import PARAMS
from tools.params_page import REFERENCE, reference

REPO = Path(__file__).resolve().parents[2]


def test_the_params_page_is_fresh():
    assert (REPO / REFERENCE).read_text() == reference((REPO / PARAMS).read_text()), (
        "docs/params.md is stale: run `make regen`"
    )


@pytest.mark.slow  # the page's command in processes
def test_a_changed_comment_makes_the_check_fail(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / REFERENCE).write_text((REPO / REFERENCE).read_text())
    text = (REPO / PARAMS).read_text()
    (tmp_path / PARAMS).write_text(text.replace("# ONNX opset", "# the ONNX opset the export writes"))
    check = [sys.executable, "-m", "tools.params_page", "--check"]
    tools = os.environ | {"PYTHONPATH": str(REPO)}  # the checkout's tools/, run on the folder it is given
    stale = subprocess.run(check, cwd=tmp_path, capture_output=True, text=True, env=tools)
    assert stale.returncode == 1 and "docs/params.md is stale" in stale.stderr
    subprocess.run(check[:-1], cwd=tmp_path, check=True, capture_output=True, env=tools)
    assert "the ONNX opset the export writes" in (tmp_path / REFERENCE).read_text()
    assert subprocess.run(check, cwd=tmp_path, env=tools).returncode == 0
