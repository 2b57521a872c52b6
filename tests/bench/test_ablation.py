"""The ablation bench: which nodes become views, that the ablated model still runs, and the report's ratios."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from bench.ablation import as_views, render, value_shapes
from tensat.session import make_session
from tensat.verify import random_inputs
from tests.helpers import make, vi


def _model():
    """x (1,4,6) -> Transpose -> Softmax -> Mul by a weight -> Add of two activations -> ReduceMean (fewer elements),
    and a Cast (another dtype) beside them."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Softmax", ["t"], ["s"], axis=2),
        helper.make_node("Mul", ["s", "w"], ["m"]),
        helper.make_node("Add", ["m", "t"], ["a"]),
        helper.make_node("ReduceMean", ["a"], ["r"], axes=[2], keepdims=1),
        helper.make_node("Cast", ["r"], ["c"], to=TensorProto.DOUBLE),
        helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT),
    ]
    w = numpy_helper.from_array(np.full((4,), 2.0, np.float32), "w")
    return make(nodes, [vi("x", [1, 4, 6])], [vi("y", [1, 6, 1])], inits=[w], opset=17, ir=9)


def test_value_shapes_are_read_from_a_run_of_the_model() -> None:
    shapes = value_shapes(_model())
    assert shapes["x"] == ((1, 4, 6), "float32") and shapes["t"] == ((1, 6, 4), "float32")
    assert shapes["y"] == ((1, 6, 1), "float32") and shapes["w"] == ((4,), "float32")


def test_a_node_becomes_a_view_of_its_first_input_only_where_nothing_else_dies_and_the_sizes_match() -> None:
    model = _model()
    for op, expected in (("Transpose", 1), ("Softmax", 1), ("Mul", 1), ("Add", 0), ("ReduceMean", 0), ("Cast", 0)):
        ablated, count = as_views(model, op)
        assert count == expected, op
        ops = [n.op_type for n in ablated.graph.node]
        assert ops.count("Reshape") == expected and len(ops) == 7
        sess = make_session(ablated.SerializeToString(), "cpu", threads=1, log_severity=4)
        (y,) = sess.run(None, random_inputs(model))
        assert y.shape == (1, 6, 1)


def test_the_report_sets_each_op_type_s_saving_against_its_price() -> None:
    info = {"cpu": "cpu", "cores": 2, "memory_gib": 1, "gpus": [], "python": "3", "versions": {}, "highs": "1"}
    info["date"] = "today"
    op = {"op": "Transpose", "nodes": 4, "replaced": 3, "predicted_us": 10.0, "in_graph_us": 25.0, "pairs": 9}
    op["in_graph_interval_us"] = [20.0, 30.0]
    free = {**op, "op": "Slice", "predicted_us": 0.0, "in_graph_us": 1.0}
    text = render([{"model": "m", "predicted_ms": 1.0, "run_ms": 1.2, "ops": [free, op]}], info)
    rows = [line for line in text.splitlines() if line.startswith("| m |")]
    assert rows[0].endswith("| 1000 | 1200 | | 1.20 |")
    assert rows[1] == "| m | Transpose | 3 / 4 | 10 | 25 | 20 to 30 | 2.50 |"
    assert rows[2].endswith("| — |")
