"""End to end: ONNX in, e-graph, extraction, verified ONNX out — through the API (the command line's runs are in
tests/cli/test_cli.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensat
from tensat import extraction
from tensat.models import SMALL_SIZES, build_model, model_names
from tests.helpers import HEAVY_GRAPHS, slow_params

SMALL = SMALL_SIZES

FAST = dict(ilp_time_limit=5, time_limit=20, iter_limit=6, cost="analytic", latency_check=0)


def test_small_configs_cover_every_benchmark():
    assert sorted(SMALL) == sorted(model_names())


@pytest.mark.parametrize("name", slow_params(sorted(SMALL), (*HEAVY_GRAPHS, "nasnet_a", "nasrnn")))
def test_benchmark_graph_optimizes_end_to_end(name):
    model = build_model(name, **SMALL[name])
    result = tensat.optimize_with_details(model, **FAST)
    out = result.output
    assert isinstance(out, onnx.ModelProto)
    onnx.checker.check_model(out, full_check=True)
    assert result.verification is not None and result.verification.ok
    assert result.cost_after <= result.cost_before * (1 + 1e-9)
    assert [i.name for i in out.graph.input] == [i.name for i in model.graph.input]
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    assert result.exploration.iterations, "no exploration iteration ran"
    assert set(result.times) >= {"import", "explore", "extract"}
    assert "verify" in result.times or result.returned_input is not None
    ex = result.extraction
    assert ex.bound is None or ex.bound <= ex.cost * (1 + 1e-9)
    assert ex.status != "optimal" or ex.gap() <= extraction.GAP_TOLERANCE * (1 + 1e-9)  # float slack


def _attention_with_opaque_ops() -> onnx.ModelProto:
    """Q, K, V projections sharing an input, with LayerNormalization, Softmax and Gather that tensat does not model."""
    rng = np.random.default_rng(0)
    d = 16

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)

    inits = [
        init("wq", d, d),
        init("wk", d, d),
        init("wv", d, d),
        init("ln_scale", d),
        init("ln_bias", d),
        numpy_helper.from_array(np.array([0, 2, 4, 6], dtype=np.int64), "rows"),
    ]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "ln_scale", "ln_bias"], ["xn"], axis=-1),
        helper.make_node("MatMul", ["xn", "wq"], ["q"]),
        helper.make_node("MatMul", ["xn", "wk"], ["k"]),
        helper.make_node("MatMul", ["xn", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
        helper.make_node("MatMul", ["q", "kt"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["att"]),
        helper.make_node("Gather", ["att", "rows"], ["picked"], axis=0),
        helper.make_node("Relu", ["picked"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "attn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, d])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_optimizes_around_ops_tensat_does_not_model():
    model = _attention_with_opaque_ops()
    result = tensat.optimize_with_details(model, **FAST)
    assert result.verification.ok
    merges = sum(it.matches.get("matmul-merge-shared-input", 0) for it in result.exploration.iterations)
    assert merges > 0, "the Q/K/V matmuls around the opaque ops were not explored"
    kept = {n.op_type for n in result.output.graph.node}
    assert {"LayerNormalization", "Softmax", "Gather"} <= kept


def test_api_returns_the_form_it_was_given(tmp_path: Path):
    model = build_model("squeezenet", **SMALL["squeezenet"])
    path = tmp_path / "sq.onnx"
    onnx.save(model, str(path))
    assert isinstance(tensat.optimize(model, **FAST), onnx.ModelProto)
    assert isinstance(tensat.optimize(str(path), **FAST), onnx.ModelProto)
    out = tmp_path / "sq.opt.onnx"
    assert tensat.optimize(path, output=str(out), **FAST) == out and out.exists()
    from tensat.onnx_io import import_model

    graph = import_model(model)
    optimized = tensat.optimize(graph, **FAST)
    assert isinstance(optimized, tensat.Graph)
