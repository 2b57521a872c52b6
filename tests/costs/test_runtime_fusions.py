"""What onnxruntime fuses on its own is priced as it runs it: a MatMul and the Add of its bias (one Gemm in its CPU
session), a Conv and the activation after it (one FusedConv). Both are priced so (`tensat.cost.runtime_fusions`) as
onnxruntime decides it, and the extraction keeps them fusible: a Transpose moved between a MatMul and its bias, or a
Relu moved past the MaxPool after its Conv, would leave a node the runtime runs on its own."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import tensat
import tensat.ir
from tensat import api, onnx_io, ops
from tensat.cost import AnalyticCost, fused_cost, fuses_into, item_of, runtime_fusions, runtime_items, runtime_kernels
from tensat.egraph import export
from tensat.measure.units import pricing_unit, unit_model
from tensat.onnx_io import import_model
from tensat.sequential import SequentialSearch
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
    """tensat's rule for which MatMul+Add pairs run as a Gemm agrees with onnxruntime's own optimizer, on the model
    as tensat writes it."""
    graph = import_model(CASES[case]).compact()
    owner, _ = runtime_fusions(graph)
    fused = [i for i, m in owner.items() if graph.nodes[m].op == "matmul"]
    assert len(fused) == sum(runtime_ops(onnx_io.export_model(graph))[k] for k in ("Gemm", "FusedGemm"))
    assert len(fused) == (1 if case in ("3-D bias", "2-D", "attention-projection") else 0)


def test_a_fused_bias_is_priced_on_the_cpu_only() -> None:
    graph = import_model(CASES["3-D bias"]).compact()
    on_cpu = collections.Counter(n.op for n, _, _ in runtime_items(graph, "cpu"))
    on_cuda = collections.Counter(n.op for n, _, _ in runtime_items(graph, "cuda"))
    assert on_cpu == {"matmul": 1}
    assert on_cuda == {"matmul": 1, "add": 1}


class _GemmDearer(AnalyticCost):
    """The analytic cost, but a MatMul priced 2 alone and 3 with the addend of the Gemm it runs as, and an Add on its
    own `add`."""

    def __init__(self, add: float = 1.5) -> None:
        super().__init__()
        self.add = add

    def __call__(self, node, in_shapes, const=()):  # type: ignore[no-untyped-def]
        if node.op == "matmul":
            return 3.0 if len(in_shapes) == 3 else 2.0
        if node.op == "add":
            return self.add
        return super().__call__(node, in_shapes, const)


@pytest.mark.parametrize("case", ["3-D bias", "2-D"])
def test_a_gemm_is_priced_as_its_matmul_and_addend_and_its_add_at_what_that_adds(case: str, monkeypatch) -> None:
    """onnxruntime's Gemm writes its addend into the output before it accumulates the product there, a pass a MatMul
    does not make. The kernel is priced by the MatMul with the addend as a third operand, timed as the MatMul and
    the Add (one Gemm in the unit's session, as in the graph; a 3-D product as the 2-D one the Gemm computes, the
    Reshapes around it being views in the graph), and the extraction prices the fused Add at the Gemm's price less
    the MatMul's: the graph's price and the extraction's agree."""
    graph = import_model(CASES[case]).compact()
    ((node, shapes, const),) = runtime_items(graph, "cpu")
    assert node.op == "matmul" and len(shapes) == 3 and shapes[2][-1] == OUT and const == [False, True, True]
    unit = pricing_unit(node, shapes, const)
    assert unit.ops == ("matmul", "add") and unit.externals[0][0] == (SEQ, HIDDEN)
    assert runtime_ops(unit_model(unit)) == {"Gemm": 1}  # 2-D: no Reshape copying the Gemm into the unit's output
    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: _GemmDearer())
    result = tensat.optimize_with_details(CASES[case], latency_check=0, pre_pass="none")
    assert result.egraph is not None
    assert min(n.cost for n in result.egraph.nodes.values() if n.op == "Add") == pytest.approx(1.0)
    assert result.cost_before == pytest.approx(3.0) and result.cost_after == pytest.approx(3.0)


def test_a_fused_add_costs_no_more_than_the_add_on_its_own(monkeypatch) -> None:
    """The pass a Gemm adds to its MatMul is no dearer than a plain Add, so where the two timings of the product
    differ by more (noise of a memory-bound product, as CaffeNet's fully connected layers showed), the fused Add
    is priced at the Add's own price: a form that keeps the bias out of the Gemm must not look cheaper for it."""
    graph = import_model(CASES["2-D"]).compact()
    const = graph.weight_only()
    matmul, add = (item_of(graph, n, const) for n in graph.nodes if n.op in ("matmul", "add"))
    assert fused_cost(_GemmDearer(add=0.25), add, 0, matmul) == pytest.approx(0.25)
    assert fused_cost(_GemmDearer(add=1.5), add, 0, matmul) == pytest.approx(1.0)
    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: _GemmDearer(add=0.25))
    result = tensat.optimize_with_details(CASES["2-D"], latency_check=0, pre_pass="none")
    assert result.egraph is not None
    assert min(n.cost for n in result.egraph.nodes.values() if n.op == "Add") == pytest.approx(0.25)


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


# case -> (the model, its cost model, a rule the control's extraction uses, the fused kernel the result keeps)
FUSIBLE = {
    "gemm": (
        lambda: _linear([helper.make_node("Transpose", ["lin"], ["y"], perm=[0, 2, 1])], [vi("y", [1, OUT, SEQ])]),
        _TransposedAddsCheaper,
        "transpose-add-distribute",
        "Gemm",
    ),
    "conv-relu": (_conv_relu_pool, AnalyticCost, "conv-relu-fuse", "FusedConv"),
}


def test_the_sequential_search_prices_a_gemm_as_the_extraction_does() -> None:
    """The sequential search's own price of a graph (each node's, a fused Add at what it adds to its MatMul's
    kernel) is the graph's price as onnxruntime runs it."""
    graph = import_model(FUSIBLE["gemm"][0]()).compact()
    result = SequentialSearch(graph, _GemmDearer(), budget=5).run()
    assert result.trace[0]["cost"] == pytest.approx(result.cost_before)
    assert result.cost_before == pytest.approx(3.0 + AnalyticCost()(*runtime_items(graph)[1]))


@pytest.mark.parametrize("discount", [True, False], ids=["fused-priced", "without"])
@pytest.mark.parametrize("case", list(FUSIBLE))
def test_the_extraction_keeps_what_the_runtime_fuses(case: str, discount: bool, monkeypatch) -> None:
    """Op by op, taking the fusion apart looks cheaper: the Transpose moved between the MatMul and its bias (under
    prices that favour the Add on the transposed layout), the Relu moved past the MaxPool. With the fused node
    priced as the runtime runs it in the extraction, the graph is kept as written. Without it (the test's control),
    the extraction takes the fusion apart (it moves the Transpose before the MatMul; it fuses the Relu into the
    Conv, a gain only op by op prices), and what comes of that is for the candidate's price as written to say."""
    build, cost, rule, fused = FUSIBLE[case]
    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: cost())
    if not discount:
        monkeypatch.setattr(export, "_runtime_fused", lambda decoded, const, shapes, device: iter(()))
    result = tensat.optimize_with_details(build(), latency_check=0, pre_pass="none")  # tensat's rules, on the input
    assert result.verification is None or result.verification.ok
    if discount:
        assert result.rules == {} and result.returned_input is not None
        assert runtime_ops(result.output)[fused] == 1
    else:
        assert rule in result.rules


def _padded_conv(value: float = 0.0, pads: tuple[int, ...] = (0, 0, 1, 2, 0, 0, 2, 1), readers: int = 1):
    """A Pad (of `value`, by `pads`) before a Conv; with `readers` 2, a Relu reads the Pad's output too."""
    pad_input = numpy_helper.from_array(np.array(pads, np.int64), "pads")
    fill = numpy_helper.from_array(np.array(value, np.float32), "fill")
    nodes = [
        helper.make_node("Pad", ["x", "pads", "fill"], ["p"]),
        helper.make_node("Conv", ["p", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
    ]
    size = [1, 3 + pads[1] + pads[5], 12 + pads[2] + pads[6], 12 + pads[3] + pads[7]]
    outputs = [vi("y", [1, 8, size[2], size[3]])]
    if readers == 2:
        nodes.append(helper.make_node("Relu", ["p"], ["r"]))
        outputs.append(vi("r", size))
    weights = [pad_input, fill, _w("w", 8, size[1], 3, 3), _w("b", 8)]
    return make(nodes, [vi("x", [1, 3, 12, 12])], outputs, weights)


PADS = {
    "zeros on the spatial axes": (_padded_conv(), 1),
    "ones": (_padded_conv(value=1.0), 0),
    "on the channels": (_padded_conv(pads=(0, 1, 1, 1, 0, 0, 1, 1)), 0),
    "read twice": (_padded_conv(readers=2), 0),
}


@pytest.mark.parametrize("case", list(PADS))
def test_a_pad_is_priced_inside_the_conv_exactly_where_onnxruntime_fuses_it(case: str) -> None:
    """onnxruntime takes a Pad of zeros on the spatial axes, the only reader of which is a Conv, into the Conv's own
    pads; such a Pad is not priced apart (a model exported with explicit padding would otherwise price above what
    runs), and any other Pad is."""
    model, fused = PADS[case]
    graph = import_model(model).compact()
    pads_priced = sum(1 for n, _, _ in runtime_items(graph) if n.op == "pad")
    assert runtime_ops(onnx_io.export_model(graph))["Pad"] == 1 - fused
    assert pads_priced == 1 - fused


def _valid_conv_after_a_pad() -> onnx.ModelProto:
    """A Pad of zeros before a Conv written with `auto_pad` VALID, as torch.onnx's TorchScript exporter writes
    EfficientNet-B0's 'same' padding: onnxruntime's PadFusion takes no Pad into such a Conv."""
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p"]),
        helper.make_node("Conv", ["p", "w", "b"], ["y"], strides=[2, 2], auto_pad="VALID"),
    ]
    pads = numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "pads")
    return make(nodes, [vi("x", [1, 8, 12, 12])], [vi("y", [1, 8, 6, 6])], [pads, _w("w", 8, 8, 3, 3), _w("b", 8)])


def test_a_pad_onnxruntime_runs_apart_is_priced_apart_in_the_input() -> None:
    """tensat reads `auto_pad` as the Conv's own pads, so its IR cannot tell this Pad from one onnxruntime fuses; the
    input is read with the Pads onnxruntime runs (`Fusions.pads`), and priced as it runs, so that a graph with the
    Pad folded (the onnxslim pre-pass's, or the rules') is seen to save it."""
    model = _valid_conv_after_a_pad()
    assert runtime_ops(model)["Pad"] == 1
    read = import_model(model, runtime_fusions=True).compact()
    assert sum(1 for n, _, _ in runtime_items(read) if n.op == "pad") == 1
    written = onnx_io.export_model(read)  # explicit pads: onnxruntime takes the Pad into the Conv
    assert runtime_ops(written)["Pad"] == 0
    assert sum(1 for n, _, _ in runtime_items(import_model(written).compact()) if n.op == "pad") == 0


@pytest.mark.parametrize(
    "op", sorted(n for n, d in ops.REGISTRY.items() if d.kind == "unary" and d.onnx and d.accepts(["float32"]))
)
def test_the_activations_a_conv_fuses_are_the_runtime_s(op: str) -> None:
    """Each activation tensat models is fused into the Conv before it by `fuses_into` exactly where onnxruntime makes
    the pair one FusedConv (a LeakyRelu, a HardSigmoid; not an Elu)."""
    d = ops.get(op)
    attrs = {k: float(v[0]) for k, v in d.domains.items() if d.attrs}
    graph = tensat.ir.Graph(opset_imports={"": 18})
    x = graph.input("x", (1, 8, 16, 16), "float32")
    conv = graph.add("conv2d", [x, graph.weight(_array(8, 8, 3, 3), "w"), graph.weight(_array(8), "b")], **CONV)
    graph.output("y", graph.add(op, [conv], **attrs))
    fused = runtime_ops(onnx_io.export_model(graph))["FusedConv"] == 1
    shape = (1, 8, 16, 16)
    conv_operands = [(shape, False), ((8, 8, 3, 3), True), ((8,), True)]
    assert fuses_into(op, shape, [(shape, False)], 0, "conv2d", CONV, conv_operands, "cpu") == fused, op


def _array(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


CONV = dict(strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1, act=ops.ACT_NONE)


def test_the_two_outputs_of_a_topk_are_priced_as_one_kernel() -> None:
    """tensat models a TopK's values and its indices as two ops and writes them as one node, whose kernel computes
    both: a price counting each would count that kernel twice."""
    k = numpy_helper.from_array(np.array([2], np.int64), "k")
    nodes = [
        helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1),
        helper.make_node("TopK", ["x", "k"], ["low", "low_i"], axis=-1, largest=0),
        helper.make_node("Cast", ["i"], ["i_f"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Add", ["v", "i_f"], ["y"]),
        helper.make_node("Add", ["low", "y"], ["z"]),
    ]
    graph = import_model(make(nodes, [vi("x", [SEQ, HIDDEN])], [vi("z", [SEQ, 2])], [k]))
    kernels = [[graph.nodes[i].op for i in ids] for ids, _ in runtime_kernels(graph)]
    assert sorted(ks for ks in kernels if "topk" in ks) == [["topk"], ["topk", "topk"]]
