"""Settings files are data: a YAML alias bomb (a few hundred bytes that expand to billions of values once walked) is
refused at its line, in seconds, wherever settings are read: params.yaml, a preset, a `--set` value, a stored model's
MLmodel."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from thermal2visible.config.load import load_params, preset_overrides
from thermal2visible.errors import ConfigError, PipelineError
from thermal2visible.paths import PARAMS
from thermal2visible.registry.version_files import artifact_files

PROJECT = Path(__file__).resolve().parents[3]


def bomb(indent: str = "  ") -> str:
    """12 levels, each naming the one below 9 times: 9^12 values once expanded."""
    lines = [f"{indent}a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"{indent}a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]" for level in range(1, 12)]
    return "\n".join(lines) + "\n"


def bombed_params(folder: Path) -> Path:
    path = folder / "params.yaml"
    text = PARAMS.read_text()
    path.write_text(text + "extra:\n" + bomb())
    return path


def refused_line(path: Path) -> int:
    return PARAMS.read_text().count("\n") + 2  # the line of the first anchor, below `extra:`


@pytest.mark.slow
def test_a_stage_refuses_an_alias_bomb_in_params_yaml_at_once_naming_file_and_line(tmp_path):
    params = bombed_params(tmp_path)
    started = time.monotonic()
    stage = subprocess.run(
        [sys.executable, str(PROJECT / "pipelines" / "serve.py"), "--params", str(params)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 30
    assert stage.returncode != 0
    assert f"{params}: not valid YAML: line {refused_line(params)}: YAML anchor &a0 refused" in stage.stderr


def test_a_preset_with_aliases_is_refused(tmp_path):
    preset = tmp_path / "preset.yaml"
    preset.write_text("train:\n" + bomb())
    with pytest.raises(ConfigError, match=rf"{preset}: not valid YAML: line 2: YAML anchor &a0"):
        preset_overrides(preset)


def test_an_override_value_with_an_alias_is_refused():
    with pytest.raises(ConfigError, match="override .*: not valid YAML: line 1: YAML anchor &a"):
        load_params(PARAMS, ["serve.host=&a [*a]"])


def test_an_mlmodel_with_aliases_is_refused(tmp_path):
    (tmp_path / "MLmodel").write_text("flavors:\n  python_function:\n" + bomb("    "))
    with pytest.raises(PipelineError, match="line 3: YAML anchor &a0 refused"):
        artifact_files(tmp_path, "models:/x/1")


def test_plain_settings_still_load():
    assert load_params(PARAMS, ["serve.host=0.0.0.0"]).serve.host == "0.0.0.0"
