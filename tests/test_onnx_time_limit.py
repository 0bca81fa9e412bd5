"""An ONNX file is data that can still loop: every onnxruntime run stops at its time limit, and a file onnxruntime
cannot load is refused in one line naming it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from thermal2visible.errors import PipelineError
from thermal2visible.inference.session import RunTimeLimit, onnx_session, run_onnx


def looping_generator(path, trips: int = 10**12) -> None:
    """thermal -> visible through a Loop of `trips` identity iterations: a graph that never returns."""
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
    nodes = [
        helper.make_node("Constant", [], ["trips"], value=helper.make_tensor("t", TensorProto.INT64, [], [trips])),
        helper.make_node("Constant", [], ["cond"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True])),
        helper.make_node("Loop", ["trips", "cond", "thermal"], ["visible"], body=body),
    ]
    frame = ["n", 1, "h", "w"]
    graph = helper.make_graph(
        nodes,
        "looping",
        [helper.make_tensor_value_info("thermal", TensorProto.FLOAT, frame)],
        [helper.make_tensor_value_info("visible", TensorProto.FLOAT, frame)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), path)


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
