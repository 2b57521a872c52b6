"""The working-set bench: the model without its weight products, the interpolated working set, the report."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bench.working_set import _behaves_as, render, without_products
from tensat.session import make_session


def _model() -> onnx.ModelProto:
    """x (1, 4, 8) -> MatMul by (8, 16) -> Add bias -> Relu -> Gemm by (8, 16) transposed -> MatMul by x's own
    transpose (not a weight) -> y."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array([4, 16], np.int64), "flat"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="bias"),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("Reshape", ["r", "flat"], ["r2"]),
        helper.make_node("Gemm", ["r2", "w2"], ["g"], name="gemm", transB=1),
        helper.make_node("Transpose", ["g"], ["gt"], perm=[1, 0]),
        helper.make_node("MatMul", ["g", "gt"], ["y"], name="self"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_products_by_a_weight_are_replaced_by_copies_of_their_input_of_their_width() -> None:
    variant, count = without_products(_model())
    assert count == 2
    ops = [n.op_type for n in variant.graph.node]
    # the first product widens 8 to 16 (its input tiled, then sliced) and takes its bias with it; the Gemm narrows
    # 16 to 8; the product of two computed tensors stays
    assert ops == ["Concat", "Slice", "Relu", "Reshape", "Slice", "Transpose", "MatMul"]
    assert {i.name for i in variant.graph.initializer}.isdisjoint({"w1", "b1", "w2"})
    x = np.arange(32, dtype=np.float32).reshape(1, 4, 8)
    (y,) = make_session(variant.SerializeToString(), "cpu", threads=1).run(None, {"x": x})
    copy = np.maximum(x.reshape(4, 8), 0)  # the Gemm's copy: the first 8 of the 16 tiled columns, x again
    np.testing.assert_allclose(y, copy @ copy.T)


def test_the_working_set_is_interpolated_in_its_logarithm_where_the_prices_reach_the_time() -> None:
    sizes, priced = (8, 16, 32), (1.0, 1.0, 2.0)
    assert _behaves_as(sizes, priced, 1.5) == pytest.approx(16 * 2**0.5)
    assert _behaves_as(sizes, priced, 2.0) == pytest.approx(32)
    assert _behaves_as(sizes, priced, 0.5) is None
    assert _behaves_as(sizes, priced, 2.5) is None


def test_the_report_has_a_row_per_model_with_its_prices_at_each_size() -> None:
    info = {"cpu": "cpu", "cores": 2, "memory_gib": 1, "gpus": [], "python": "3", "versions": {}, "highs": "1"}
    info["date"] = "today"
    record = {
        "model": "m",
        "products": 3,
        "weights_mib": 11.25,
        "working_set_mib": 22.9,
        "sizes_mib": [8, 16],
        "priced_ms": [1.4, 1.6],
        "priced_at_working_set_ms": 1.7,
        "in_graph_ms": 1.5,
        "behaves_as_mib": 11.3,
    }
    table = render([record, {**record, "model": "n", "behaves_as_mib": None}], info)
    assert "| priced at 8 | priced at 16 |" in table
    assert "| m | 3 | 11.2 | 22.9 | 1.700 | 1.500 | 11 | 1.400 | 1.600 |" in table
    assert "| n | 3 | 11.2 | 22.9 | 1.700 | 1.500 | outside | 1.400 | 1.600 |" in table
