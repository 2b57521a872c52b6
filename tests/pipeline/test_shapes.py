"""Models with symbolic input dims, optimized at the shapes given: the model returned unchanged keeps its symbolic
dims; an optimized one is fixed to the shapes given, and the run says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import tensat
from tensat.onnx_io import symbolic_inputs
from tensat.verify import run_model


def _dynamic(tmp_path: Path, *, cancelling: bool) -> Path:
    """x[batch, 16] @ w, then a Relu; with `cancelling`, a Transpose pair before the Relu (a gain the rules find)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"])]
    if cancelling:
        nodes += [
            helper.make_node("Transpose", ["m"], ["t"], perm=[1, 0]),
            helper.make_node("Transpose", ["t"], ["u"], perm=[1, 0]),
            helper.make_node("Relu", ["u"], ["y"]),
        ]
    else:
        nodes.append(helper.make_node("Relu", ["m"], ["y"]))
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)], ir_version=8
    )
    path = tmp_path / "dynamic.onnx"
    onnx.save(model, str(path))
    return path


def test_the_input_returned_unchanged_keeps_its_symbolic_dims(tmp_path: Path) -> None:
    """The shapes given fix the dims only for the search: a run that returns the input writes the model as given,
    which runs at any batch."""
    src, out = _dynamic(tmp_path, cancelling=False), tmp_path / "out.onnx"
    result = tensat.optimize_with_details(
        str(src), output=str(out), input_shapes={"x": [2, 16]}, cost="analytic", latency_check=0
    )
    assert result.returned_input is not None
    written = onnx.load(str(out))
    assert symbolic_inputs(written) == {"x": ["batch"]}
    assert run_model(written, {"x": np.ones((5, 16), np.float32)})["y"].shape == (5, 8)


def test_an_optimized_model_fixed_to_the_shapes_given_says_so(tmp_path: Path) -> None:
    src, out = _dynamic(tmp_path, cancelling=True), tmp_path / "out.onnx"
    result = tensat.optimize_with_details(
        str(src), output=str(out), input_shapes={"x": [2, 16]}, cost="analytic", latency_check=0
    )
    assert result.returned_input is None
    assert symbolic_inputs(onnx.load(str(out))) == {}
    assert any("not kept" in w and "x (batch)" in w for w in result.warnings), result.warnings
    static = tensat.optimize_with_details(onnx.load(str(out)), cost="analytic", latency_check=0)
    assert not any("symbolic" in w for w in static.warnings)
