"""What onnxruntime fuses survives tensat: the subgraphs are found by asking onnxruntime (`tensat.onnx.fusions`), and
each is read as the kernel it becomes: its op where tensat models it (a GELU written out, as GPT-2 writes it,
becomes `gelu`), else the kernel's node kept verbatim (onnxruntime's BiasGelu). An optimization that would have
rewritten the subgraph op by op (moving arithmetic across a Reshape, cheaper op by op) then finds one op there."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import tensat
from tensat import api
from tensat.cost import AnalyticCost
from tensat.onnx import fusions
from tensat.onnx_io import export_model, import_model, load_model
from tensat.session import runtime_graph
from tensat.verify import compare_models
from tests.helpers import make, vi

RNG = np.random.default_rng(3)


def _const(name: str, value: float) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.float32)))


def gpt2_mlp(seq: int = 16, hidden: int = 32, inner: int = 128) -> onnx.ModelProto:
    """GPT-2's MLP as torch.onnx's TorchScript exporter writes it: each projection a Gemm between Reshapes, and
    the tanh GELU (0.5*h*(1+tanh(sqrt(2/pi)*(h+0.044715*h^3)))) in exactly the exporter's operand order."""

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((RNG.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)

    def shape(name: str, *dims: int) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(dims, np.int64), name)

    nodes = [
        helper.make_node("Reshape", ["x", "rows"], ["x2"]),
        helper.make_node("Gemm", ["x2", "w_fc", "b_fc"], ["fc"]),
        helper.make_node("Reshape", ["fc", "fc3"], ["h"]),
        _const("half", 0.5),
        helper.make_node("Mul", ["h", "half"], ["h_half"]),
        _const("three", 3.0),
        helper.make_node("Pow", ["h", "three"], ["cube"]),
        _const("c", 0.044715),
        helper.make_node("Mul", ["cube", "c"], ["cube_c"]),
        helper.make_node("Add", ["h", "cube_c"], ["inner"]),
        _const("s2pi", 0.7978845834732056),
        helper.make_node("Mul", ["inner", "s2pi"], ["scaled"]),
        helper.make_node("Tanh", ["scaled"], ["t"]),
        _const("one", 1.0),
        helper.make_node("Add", ["t", "one"], ["t1"]),
        helper.make_node("Mul", ["h_half", "t1"], ["gelu"]),
        helper.make_node("Reshape", ["gelu", "inner_rows"], ["g2"]),
        helper.make_node("Gemm", ["g2", "w_proj", "b_proj"], ["proj"]),
        helper.make_node("Reshape", ["proj", "out3"], ["y"]),
    ]
    inits = [
        w("w_fc", hidden, inner),
        w("b_fc", inner),
        w("w_proj", inner, hidden),
        w("b_proj", hidden),
        shape("rows", -1, hidden),
        shape("fc3", 1, seq, inner),
        shape("inner_rows", -1, inner),
        shape("out3", 1, seq, hidden),
    ]
    return make(nodes, [vi("x", [1, seq, hidden])], [vi("y", [1, seq, hidden])], inits, opset=17)


def runtime_ops(model: onnx.ModelProto) -> collections.Counter[str]:
    """Op types of `model` as onnxruntime runs it on the CPU (extended optimizations)."""
    return collections.Counter(n.op_type for n in runtime_graph(model).graph.node)


def test_the_runtimes_fused_subgraphs_are_found() -> None:
    model = load_model(gpt2_mlp())
    assert runtime_ops(model)["FastGelu"] == 1
    found = fusions.runtime_fusions(model)
    assert [k.op_type for k in found.kernels.values()] == ["FastGelu"] and "gelu" in found.kernels
    graph = import_model(gpt2_mlp(), runtime_fusions=True)
    (gelu,) = [graph.nodes[i] for i in graph.live() if graph.nodes[i].op == "gelu"]
    assert gelu.attr["approximate"] == 1 and "tanh" not in graph.summary()


def _bias_gelu() -> onnx.ModelProto:
    """A GELU written out with Erf over a sum with a bias: onnxruntime's BiasGelu, a kernel tensat does not model."""
    nodes = [
        helper.make_node("Add", ["x", "b"], ["h"]),
        helper.make_node("Div", ["h", "r2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["h", "e1"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["g"]),
        helper.make_node("MatMul", ["g", "w"], ["y"]),
    ]
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array((0.1 * rng.standard_normal(32)).astype(np.float32), "b"),
        numpy_helper.from_array(np.array(1.4142135, np.float32), "r2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        numpy_helper.from_array((0.1 * rng.standard_normal((32, 16))).astype(np.float32), "w"),
    ]
    return make(nodes, [vi("x", [1, 16, 32])], [vi("y", [1, 16, 16])], inits)


def test_a_model_with_no_fusible_op_is_not_run() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Abs", ["r"], ["y"])]
    model = make(nodes, [vi("x", [1, 8])], [vi("y", [1, 8])])
    assert fusions.runtime_fusions(model) == fusions.Fusions()


def test_a_model_the_runtime_cannot_load_has_no_fusions() -> None:
    model = gpt2_mlp()
    model.graph.node[0].op_type = "NoSuchOp"
    assert fusions.runtime_fusions(model) == fusions.Fusions()


def test_a_kernel_tensat_does_not_model_is_read_verbatim() -> None:
    """onnxruntime's BiasGelu is no op of tensat's: the subgraph it replaces is read as that one node, kept as it is
    (an opaque node of onnxruntime's domain), which the model as written computes and onnxruntime runs."""
    model = _bias_gelu()
    assert runtime_ops(model)["BiasGelu"] == 1
    plain = import_model(model)
    assert "opaque" not in plain.summary() and plain.summary()["erf"] == 1
    g = import_model(model, runtime_fusions=True)
    (kernel,) = [g.opaque[g.nodes[i].attr["key"]] for i in g.live() if g.nodes[i].op == "opaque"]
    assert (kernel.domain, kernel.op_type) == ("com.microsoft", "BiasGelu")
    assert "erf" not in g.summary() and g.summary()["matmul"] == 1
    written = export_model(g)
    assert runtime_ops(written)["BiasGelu"] == 1
    assert compare_models(model, written).ok


class _LayoutBiased(AnalyticCost):
    """The analytic cost, except that an element-wise op on a 2-D tensor prices 10% lower than on the same data
    seen as 3-D: the way two measurements of one computation written two ways can differ (when each was taken,
    where its memory lay). Op by op, moving the GELU's arithmetic to the 2-D side of the MatMul's Reshape then
    looks cheaper."""

    def __call__(self, node, in_shapes, const=()):  # type: ignore[no-untyped-def]
        price = super().__call__(node, in_shapes, const)
        return price * 0.9 if node.op in ("add", "mul", "tanh") and len(node.shape) == 2 else price


@pytest.mark.parametrize("asked", [True, False], ids=["asking onnxruntime", "without asking"])
def test_the_fused_gelu_survives_optimization(asked: bool, monkeypatch) -> None:
    """Under prices that favour 2-D element-wise ops, moving the GELU's arithmetic across the Reshape looks
    cheaper op by op, and onnxruntime would then run the GELU as eight nodes instead of one FastGelu. Read as the
    kernel onnxruntime runs (asking it), or found again by the rule that introduces the kernel (without), the GELU
    is one op that prices below its eight, and the graph returned runs it as one FastGelu."""
    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: _LayoutBiased())
    if not asked:
        monkeypatch.setattr(fusions, "runtime_fusions", lambda model: fusions.Fusions())
    result = tensat.optimize_with_details(gpt2_mlp(), latency_check=0)
    assert result.verification is not None and result.verification.ok
    assert runtime_ops(result.output)["FastGelu"] == 1
    assert ("fast-gelu-fuse" in result.rules) == (not asked)
