"""An ONNX file is data that can still loop: every onnxruntime run stops at its time limit, and the one-square check
every loader runs first has its own short one (serve.max_check_seconds, apart from a batch's serve.max_run_seconds):
make serve, translate.py and the register stage's champion gate refuse such a model by name within seconds, and a
file onnxruntime cannot load is refused in one line naming it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import onnx
import pytest
from mlflow import MlflowClient
from onnx import TensorProto, helper
from tests.support.shipped import SHIPPED, SHIPPED_FROM, shipped
from tests.support.tiny_model import export_tiny, saved_pyfunc, write_stage_record

from thermal2visible.errors import PipelineError
from thermal2visible.registry.packing import pyfunc_arguments
from thermal2visible.registry.gate import CHAMPION
from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.inference.session import INPUT_NAME, RunTimeLimit, onnx_session, run_onnx
from thermal2visible.paths import MANIFEST

ROOT = Path(__file__).resolve().parents[3]
LIMIT = 1  # seconds: serve.max_check_seconds for the commands below (serve.max_run_seconds stays params.yaml's)
REFUSED_WITHIN = 60  # seconds, starting Python and MLflow included; without the limit they never return


def identity_loop(trips: int, looped: str, out: str) -> list[onnx.NodeProto]:
    """Nodes that pass `looped` to `out` through a Loop of `trips` identity iterations."""
    scalar = lambda name, kind: helper.make_tensor_value_info(name, kind, [])  # noqa: E731
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["x_in"], ["x_out"])],
        "body",
        [
            scalar("i", TensorProto.INT64),
            scalar("cond_in", TensorProto.BOOL),
            helper.make_tensor_value_info("x_in", TensorProto.FLOAT, None),
        ],
        [scalar("cond_out", TensorProto.BOOL), helper.make_tensor_value_info("x_out", TensorProto.FLOAT, None)],
    )
    return [
        helper.make_node("Constant", [], ["trips"], value=helper.make_tensor("t", TensorProto.INT64, [], [trips])),
        helper.make_node("Constant", [], ["cond"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True])),
        helper.make_node("Loop", ["trips", "cond", looped], [out], body=body),
    ]


def looping_generator(path, trips: int = 10**12) -> None:
    """thermal -> visible through a Loop of `trips` identity iterations: a graph that never returns."""
    frame = ["n", 1, "h", "w"]
    graph = helper.make_graph(
        identity_loop(trips, "thermal", "visible"),
        "looping",
        [helper.make_tensor_value_info("thermal", TensorProto.FLOAT, frame)],
        [helper.make_tensor_value_info("visible", TensorProto.FLOAT, frame)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), path)


def loop_before_the_network(source: Path, target: Path, trips: int = 10**12) -> Path:
    """An exported generator, metadata and weights unchanged, whose input first goes through a Loop of `trips`
    identity iterations: what a registry writer could put in a version."""
    model = onnx.load(str(source))
    for node in model.graph.node:
        node.input[:] = ["looped" if name == INPUT_NAME else name for name in node.input]
    nodes = identity_loop(trips, INPUT_NAME, "looped") + list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(target))
    return target


def test_a_looping_graph_stops_at_its_time_limit(tmp_path):
    looping_generator(tmp_path / "loop.onnx")
    session = onnx_session(tmp_path / "loop.onnx")
    with pytest.raises(RunTimeLimit, match="passed its 1 s limit"):
        run_onnx(session, np.zeros((1, 1, 16, 16), np.float32), seconds=1)


def test_a_file_onnxruntime_cannot_load_is_one_line_naming_it(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"not a protobuf")
    with pytest.raises(PipelineError) as refused:
        onnx_session(tmp_path / "bad.onnx")
    assert str(refused.value) == f"{tmp_path / 'bad.onnx'}: onnxruntime cannot load it (Protobuf parsing failed.)"


def translate(model: str, frames: Path, out: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    limits = ["--max-pixels", "1000000", "--max-model-pixels", "1000000", "--max-check-seconds", str(LIMIT)]
    command = [sys.executable, str(ROOT / "pipelines" / "translate.py"), "--model", model, *limits]
    return subprocess.run(
        [*command, "--input", str(frames), "--output", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=REFUSED_WITHIN,
    )


@pytest.fixture(scope="module")
def looping_export(tiny_cache, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("looping")
    return loop_before_the_network(export_tiny(folder, tiny_cache), folder / "looping.onnx")


@pytest.fixture
def frames(tiny_cache, tmp_path) -> Path:
    (tmp_path / "in").mkdir()
    shutil.copy(next((tiny_cache.parent / "raw" / "thermal").rglob("*.png")), tmp_path / "in" / "frame.png")
    return tmp_path / "in"


def refusal(model: str, tiny_cache: Path) -> str:
    size = json.loads((tiny_cache / MANIFEST).read_text())["image_size"]
    return (
        f"{model}: an onnxruntime run passed its {LIMIT} s limit on one {size}x{size} square (serve.max_check_seconds)"
    )


@pytest.mark.slow  # an export and a translate.py process
def test_translate_refuses_an_exported_model_that_loops_within_its_limit(looping_export, tiny_cache, frames, tmp_path):
    done = translate(str(looping_export), frames, tmp_path / "out")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == f"error: {refusal(str(looping_export), tiny_cache)}"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a real MLflow server
def test_a_looping_champion_is_refused_by_translate_and_the_gate_within_its_limit(
    tracking_uri, looping_export, tiny_cache, frames, tmp_path
):
    """A version whose graph loops before the network, made champion: translate.py and the register stage's gate
    refuse it by name within serve.max_check_seconds, and the champion stays where it was."""
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(SHIPPED.mlflow.experiment)  # where serving on a tracking server trusts a run
    with mlflow.start_run():  # MLflow loads the model to check its input example: within the limit too
        with pyfunc_arguments(
            looping_export, ServedLimits.of(shipped("serve", max_check_seconds=LIMIT)), tiny_cache / MANIFEST
        ) as arguments:
            logged = mlflow.pyfunc.log_model(name="model", **arguments)
    client = MlflowClient(tracking_uri)
    client.create_registered_model("looping")
    version = client.create_model_version("looping", logged.model_uri, model_id=logged.model_id)
    client.set_registered_model_alias("looping", CHAMPION, version.version)
    env = os.environ | {"MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_DISABLE_TELEMETRY": "true"}

    done = translate("models:/looping@champion", frames, tmp_path / "out", env)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and last.startswith("error: models:/looping@champion: ")
    assert last.endswith(refusal("looping.onnx", tiny_cache))  # the version, then its file in the download

    project = tmp_path / "project"
    shutil.copytree(tiny_cache, project / "data" / "cache")
    write_stage_record(project, export_tiny(tmp_path / "new", tiny_cache, seed=1).parent, 21.0)
    settings = ["--set", "register.model_name=looping", "--set", f"serve.max_check_seconds={LIMIT}"]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "pipelines" / "register.py"), "--params", str(SHIPPED_FROM), *settings],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=REFUSED_WITHIN,
    )
    assert done.returncode != 0 and time.monotonic() - started < REFUSED_WITHIN
    assert f"error: models:/looping/{version.version}: " in done.stderr  # the gate names the champion's version
    assert f"{refusal('looping.onnx', tiny_cache)}; refused, nothing was moved" in done.stderr
    assert client.get_registered_model("looping").aliases[CHAMPION] == version.version


@pytest.mark.slow  # a make serve process
def test_make_serve_refuses_a_looping_model_within_its_check_limit(looping_export, tiny_cache, tmp_path):
    model = saved_pyfunc(looping_export, tmp_path / "model", ServedLimits.of(shipped("serve", max_check_seconds=LIMIT)))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "pipelines" / "serve.py"), "--model", model],
        capture_output=True,
        text=True,
        timeout=REFUSED_WITHIN,
    )
    assert done.returncode != 0 and time.monotonic() - started < REFUSED_WITHIN
    assert done.stderr.strip().splitlines()[-1].endswith(refusal("looping.onnx", tiny_cache))
