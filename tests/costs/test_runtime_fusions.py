"""What onnxruntime fuses on its own is read as the op it runs as (`tensat.onnx.fusions.as_run`): a MatMul and the
Add of its bias as a `gemm` (one Gemm in its CPU session), a Conv and the BatchNormalization and activation after it
as one conv2d (one FusedConv). Each is priced as one kernel, and the extraction keeps them fused where taking them
apart (a Transpose moved between a MatMul and its bias, a Relu moved past the MaxPool after its Conv) only looks
cheaper op by op."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import tensat
from tensat import api, onnx_io
from tensat.cost import AnalyticCost, graph_cost, runtime_cost
from tensat.onnx.fusions import as_run
from tensat.onnx_io import import_model
from tests.helpers import make, vi
from tests.onnx.test_fusions import runtime_ops

RNG = np.random.default_rng(5)
SEQ, HIDDEN, OUT = 8, 16, 32


def _w(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def _linear(tail: list[onnx.NodeProto], outputs: list[onnx.ValueInfoProto], bias: tuple[int, ...] = (OUT,)):
    """x (1, SEQ, HIDDEN) @ w (HIDDEN, OUT) + b, then `tail`."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["lin"]), *tail]
    return make(nodes, [vi("x", [1, SEQ, HIDDEN])], outputs, [_w("w", HIDDEN, OUT), _w("b", *bias)])


def _attention_projection() -> onnx.ModelProto:
    """Attention's output (Softmax, MatMul, Transpose, Reshape) through its output projection and bias (newer
    onnxruntime releases leave this pair apart for their attention fusions; the test says which this one does)."""
    heads, size = 2, HIDDEN // 2
    nodes = [
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merged"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["y"]),
    ]
    inputs = [vi("scores", [1, heads, SEQ, SEQ]), vi("v", [1, heads, SEQ, size])]
    merged = numpy_helper.from_array(np.array([1, SEQ, HIDDEN], np.int64), "merged")
    return make(nodes, inputs, [vi("y", [1, SEQ, OUT])], [merged, _w("w", HIDDEN, OUT), _w("b", OUT)])


CASES = {
    "3-D bias": _linear([], [vi("lin", [1, SEQ, OUT])]),
    "2-D": make(
        [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["lin"])],
        [vi("x", [SEQ, HIDDEN])],
        [vi("lin", [SEQ, OUT])],
        [_w("w", HIDDEN, OUT), _w("b", OUT)],
    ),
    "full-bias": _linear([], [vi("lin", [1, SEQ, OUT])], bias=(SEQ, OUT)),
    "two-readers": make(
        [
            helper.make_node("MatMul", ["x", "w"], ["mm"]),
            helper.make_node("Add", ["mm", "b"], ["lin"]),
            helper.make_node("Relu", ["mm"], ["r"]),
        ],
        [vi("x", [1, SEQ, HIDDEN])],
        [vi("lin", [1, SEQ, OUT]), vi("r", [1, SEQ, OUT])],
        [_w("w", HIDDEN, OUT), _w("b", OUT)],
    ),
    "transposed-between": make(
        [
            helper.make_node("MatMul", ["x", "w"], ["mm"]),
            helper.make_node("Transpose", ["mm"], ["mm_t"], perm=[0, 2, 1]),
            helper.make_node("Add", ["mm_t", "b"], ["y"]),
        ],
        [vi("x", [1, SEQ, HIDDEN])],
        [vi("y", [1, OUT, SEQ])],
        [_w("w", HIDDEN, OUT), _w("b", OUT, 1)],
    ),
    "attention-projection": _attention_projection(),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bias_fusions_are_those_onnxruntime_makes(case: str) -> None:
    """The MatMul+Add pairs read as a `gemm` are those onnxruntime's own optimizer fuses into a Gemm, on the model as
    tensat writes it."""
    graph = import_model(CASES[case]).compact()
    fused = as_run(graph)
    gemms = sum(fused.nodes[i].op == "gemm" for i in fused.live())
    assert gemms == sum(runtime_ops(onnx_io.export_model(graph))[k] for k in ("Gemm", "FusedGemm"))
    assert gemms == (1 if case in ("3-D bias", "2-D", "attention-projection") else 0)


@pytest.mark.parametrize("case", ["3-D bias", "2-D"])
def test_a_gemm_is_written_as_the_gemm_onnxruntime_runs_and_priced_as_one_kernel(case: str) -> None:
    """A `gemm` is written as a Gemm (2-D) or as the MatMul and Add onnxruntime fuses into one (3-D): the graph it
    runs has one Gemm and no Add, and computes what the input does. Read so, the input prices below the sum of its
    MatMul and Add."""
    graph = import_model(CASES[case]).compact()
    written = onnx_io.export_model(as_run(graph))
    ran = runtime_ops(written)
    assert ran["Gemm"] + ran["FusedGemm"] == 1 and ran["Add"] == 0 and ran["MatMul"] == 0
    x = RNG.standard_normal(tuple(graph.nodes[graph.input_ids[0]].shape)).astype(np.float32)
    want, got = (g.evaluate({"x": x})[g.outputs[0][1]] for g in (graph, import_model(written)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert runtime_cost(graph, AnalyticCost()) < graph_cost(graph, AnalyticCost())


class _TransposedAddsCheaper(AnalyticCost):
    """The analytic cost, except that an Add whose rows are shorter than its columns prices at half: the way two
    measurements of one computation in two layouts can differ. Op by op, moving the Transpose between the MatMul
    and its bias then looks cheaper."""

    def __call__(self, node, in_shapes, const=()):  # type: ignore[no-untyped-def]
        price = super().__call__(node, in_shapes, const)
        return price * 0.5 if node.op == "add" and node.shape[-1] < node.shape[-2] else price


def _conv_relu_pool() -> onnx.ModelProto:
    """A Conv, its Relu, then a 2x2 MaxPool: op by op, the Relu is cheaper after the pool (a quarter of the data)."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    return make(nodes, [vi("x", [1, 3, 16, 16])], [vi("y", [1, 8, 8, 8])], [_w("w", 8, 3, 3, 3), _w("b", 8)])


def test_the_extraction_keeps_the_gemm_the_runtime_fuses(monkeypatch) -> None:
    """Op by op, moving the Transpose between the MatMul and its bias looks cheaper (under prices that favour the
    Add on the transposed layout). The rules offer it (`gemm-unfuse`, `transpose-add-distribute`), and with the
    input read as the Gemm it runs as, priced as one kernel, the extraction keeps the graph as written."""
    model = _linear([helper.make_node("Transpose", ["lin"], ["y"], perm=[0, 2, 1])], [vi("y", [1, OUT, SEQ])])
    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: _TransposedAddsCheaper())
    result = tensat.optimize_with_details(model, latency_check=0, pre_pass="none")
    assert result.verification is None or result.verification.ok
    assert result.rules == {}
    assert runtime_ops(result.output)["Gemm"] == 1


def test_the_extraction_keeps_the_relu_fused_into_its_conv() -> None:
    """Op by op, the Relu is cheaper after the MaxPool; read as the conv2d with its Relu that onnxruntime runs, and
    priced as one kernel, the input is kept, and onnxruntime runs the fused kernel."""
    result = tensat.optimize_with_details(_conv_relu_pool(), cost="analytic", latency_check=0, pre_pass="none")
    assert result.verification is None or result.verification.ok
    assert result.rules == {}
    assert runtime_ops(result.output)["FusedConv"] == 1


def test_a_batchnorm_and_relu_after_a_conv_are_read_as_one_conv() -> None:
    """Conv, BatchNormalization, Relu: read as one conv2d with its weights scaled and the Relu fused, as onnxruntime
    folds and fuses them, computing the same."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["n"], epsilon=1e-3),
        helper.make_node("Relu", ["n"], ["y"]),
    ]
    var = numpy_helper.from_array(RNG.uniform(0.5, 2.0, 8).astype(np.float32), "var")
    params = [_w("w", 8, 3, 3, 3), _w("b", 8), _w("g", 8), _w("beta", 8), _w("mean", 8), var]
    graph = import_model(make(nodes, [vi("x", [1, 3, 8, 8])], [vi("y", [1, 8, 8, 8])], params)).compact()
    fused = as_run(graph)
    ran = collections.Counter(fused.nodes[i].op for i in fused.live() if i not in fused.weight_only())
    assert ran == {"input": 1, "conv2d": 1}
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    want, got = (g.evaluate({"x": x})[g.outputs[0][1]] for g in (graph, fused))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert runtime_ops(onnx_io.export_model(fused))["FusedConv"] == 1
