"""Ops of common exports beyond the corpus: the activations of CNNs and detectors (LeakyRelu, HardSwish,
HardSigmoid, PRelu, Mish...), ONNX's other reductions (ConvNeXt V2's ReduceL2), the integer inputs of a decoder
whose positions are its attention mask's cumulative sum, pools with ceil_mode, Resize, a causal mask's Trilu, Tile,
ArgMax and ArgMin, Einsum, the comparisons, Mod and IsInf, and an expert router's TopK and scatter. Each is read as
a tensat op, not kept opaque, and written back as the model wrote it (Greater and GreaterOrEqual as the Less and
LessOrEqual they are read as)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import tensat
from tensat import ops
from tensat.measure.timing import Runner
from tensat.onnx_io import export_model, import_model
from tensat.verify import compare_models, random_inputs, run_model
from tests.helpers import make, vi

RNG = np.random.default_rng(11)


def _w(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def _conv_then(op_type: str, opset: int = 18, **attrs: float) -> onnx.ModelProto:
    """A Conv, then one `op_type` node with `attrs` (none: ONNX's defaults)."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node(op_type, ["c"], ["y"], **attrs),
    ]
    shape = [1, 8, 12, 12]
    return make(nodes, [vi("x", [1, 4, 12, 12])], [vi("y", shape)], [_w("w", 8, 4, 3, 3), _w("b", 8)], opset=opset)


@pytest.mark.parametrize("op", sorted(ops.ACTIVATION_DEFAULTS))
def test_an_activation_s_attributes_default_as_onnx_says_and_are_written_back(op: str) -> None:
    """An activation written without its attributes takes ONNX's defaults (LeakyRelu's slope 0.01), and the model
    written back names them, computing what the input computes."""
    onnx_type = ops.get(op).onnx
    assert onnx_type is not None
    model = _conv_then(onnx_type)
    graph = import_model(model)
    (node,) = [n for n in graph.nodes if n.op == op]
    assert dict(node.attr) == ops.ACTIVATION_DEFAULTS[op]
    written = export_model(graph)
    (back,) = [n for n in written.graph.node if n.op_type == onnx_type]
    assert {a.name: a.f for a in back.attribute} == pytest.approx(ops.ACTIVATION_DEFAULTS[op])
    assert compare_models(model, written).ok


@pytest.mark.parametrize("op_type", ["HardSwish", "HardSigmoid", "LeakyRelu", "PRelu", "Mish", "Elu", "Max"])
def test_a_cnn_s_activation_is_modelled_and_optimizes(op_type: str) -> None:
    """Conv, activation, Conv: every node modelled, and the optimized model verified against the input."""
    extra: list[onnx.TensorProto] = []
    inputs = ["c"]
    if op_type == "PRelu":
        extra, inputs = [_w("slope", 8, 1, 1)], ["c", "slope"]
    elif op_type == "Max":
        extra, inputs = [numpy_helper.from_array(np.zeros((1,), np.float32), "zero")], ["c", "zero"]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node(op_type, inputs, ["a"]),
        helper.make_node("Conv", ["a", "w2", "b2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    inits = [_w("w", 8, 4, 3, 3), _w("b", 8), _w("w2", 8, 8, 3, 3), _w("b2", 8), *extra]
    model = make(nodes, [vi("x", [1, 4, 12, 12])], [vi("y", [1, 8, 12, 12])], inits, opset=18)
    result = tensat.optimize_with_details(model, cost="analytic", latency_check=0)
    assert result.nodes_opaque == 0 and result.nodes_read >= 3
    assert result.verification is not None and result.verification.ok


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("op_type", ["ReduceMax", "ReduceMin", "ReduceL2", "ReduceL1", "ReduceSumSquare"])
def test_a_reduction_reads_its_axes_as_its_opset_gives_them(op_type: str, opset: int) -> None:
    """Axes as an attribute before opset 18, as an input from it; read either way and written as the opset says."""
    if opset < 18:
        node = helper.make_node(op_type, ["x"], ["y"], axes=[1], keepdims=1)
        inits = []
    else:
        node = helper.make_node(op_type, ["x", "axes"], ["y"], keepdims=1)
        inits = [numpy_helper.from_array(np.array([1], np.int64), "axes")]
    model = make([node], [vi("x", [2, 6, 5])], [vi("y", [2, 1, 5])], inits, opset=opset)
    graph = import_model(model)
    assert [n.op for n in graph.nodes if not n.is_leaf] == [ops.get("reduce" + op_type[6:].lower()).name]
    written = export_model(graph)
    assert len(written.graph.node[-1].input) == (2 if opset >= 18 else 1)
    assert compare_models(model, written).ok


def _mask_positions() -> onnx.ModelProto:
    """OPT's learned positions: the attention mask's cumulative sum (times the mask, plus an offset) indexes a table
    of one row per token and the offset, and the token ids a vocabulary; a mask of other values than 0 and 1 runs
    past the position table."""
    seq, width = 8, 4
    nodes = [
        helper.make_node("CumSum", ["mask", "axis"], ["cum"]),
        helper.make_node("Mul", ["cum", "mask"], ["kept"]),
        helper.make_node("Add", ["kept", "offset"], ["pos"]),
        helper.make_node("Gather", ["positions", "pos"], ["p"]),
        helper.make_node("Gather", ["tokens", "ids"], ["t"]),
        helper.make_node("Add", ["t", "p"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(1, np.int64), "axis"),
        numpy_helper.from_array(np.array(1, np.int64), "offset"),
        _w("positions", seq + 2, width),
        _w("tokens", 50, width),
    ]
    inputs = [vi("ids", [1, seq], TP.INT64), vi("mask", [1, seq], TP.INT64)]
    return make(nodes, inputs, [vi("y", [1, seq, width])], inits, opset=17)


def test_integer_inputs_are_valid_as_an_attention_mask() -> None:
    """The inputs tensat runs a model on hold integers of 0 and 1: valid token ids, and a valid mask, whose positions
    stay in the table (with integers up to 3 the model failed, and tensat blamed it). The positions' integer CumSum,
    Mul and Add are modelled."""
    model = _mask_positions()
    feeds = random_inputs(model)
    assert set(np.unique(feeds["mask"])) <= {0, 1} and set(np.unique(feeds["ids"])) <= {0, 1}
    runner = Runner("cpu", 1)  # and so do the runs that time it (`bench.unit_context` profiles whole models so)
    runner.bound(runner.session(model))()
    assert {"cumsum", "mul", "add"} <= set(import_model(model).summary())
    result = tensat.optimize_with_details(model, cost="analytic", latency_check=0)
    assert result.nodes_opaque == 0
    assert result.verification is not None and result.verification.ok


CEIL_POOLS = [
    # op, input size, kernel, stride, pads, count_include_pad, read as
    ("AveragePool", 7, 1280, 1280, 0, 1, "avgpool"),  # EfficientNet-B0's export of its global average pool
    ("MaxPool", 7, 9, 9, 0, 0, "maxpool"),
    ("AveragePool", 7, 8, 8, 1, 0, "avgpool"),
    ("AveragePool", 8, 3, 2, 0, 1, "avgpool"),
    ("AveragePool", 8, 3, 2, 1, 0, "avgpool"),
    ("AveragePool", 9, 2, 2, 0, 0, "avgpool"),
    ("AveragePool", 8, 3, 2, 1, 1, "opaque"),  # counts its pads, and its last window runs past them
    ("AveragePool", 7, 3, 2, 1, 1, "avgpool"),  # counts its pads, but ceil_mode changes nothing
    ("MaxPool", 8, 3, 2, 0, 0, "maxpool"),  # GoogLeNet's
    ("MaxPool", 8, 3, 2, 1, 0, "maxpool"),
    ("MaxPool", 10, 2, 3, 0, 0, "maxpool"),
]


@pytest.mark.parametrize(("op_type", "size", "kernel", "stride", "pad", "cip", "read_as"), CEIL_POOLS)
def test_a_ceil_mode_pool_is_read_as_the_floor_mode_pool_it_equals(
    op_type: str, size: int, kernel: int, stride: int, pad: int, cip: int, read_as: str
) -> None:
    """A pool with ceil_mode is the pool without it whose end pads hold its last window, or, where it is one window
    over its whole input, the global pool: read so, written so, and computing what onnxruntime computes for the
    input. An average pool counting pads of its own stays as written where its last window runs past them
    (onnxruntime clips that window at the pad)."""
    attrs = dict(kernel_shape=[kernel] * 2, strides=[stride] * 2, pads=[pad] * 4, ceil_mode=1)
    if op_type == "AveragePool":
        attrs["count_include_pad"] = cip
    ceil = -(-(size + 2 * pad - kernel) // stride) + 1
    out = ceil - 1 if (ceil - 1) * stride >= size + pad else ceil
    model = _pool_model(op_type, attrs, size, out)
    graph = import_model(model)
    assert [n.op for n in graph.nodes if not n.is_leaf] == [read_as]
    assert compare_models(model, export_model(graph)).ok
    if read_as != "opaque":
        _computes_as_onnxruntime(model, graph)


def _pool_model(op_type: str, attrs: dict[str, Any], size: int, out: int) -> onnx.ModelProto:
    """One pool of a 1x3 x `size` x `size` input, of an `out` x `out` output."""
    return make(
        [helper.make_node(op_type, ["x"], ["y"], **attrs)],
        [vi("x", [1, 3, size, size])],
        [vi("y", [1, 3, out, out])],
        [],
        opset=17,
    )


def _computes_as_onnxruntime(model: onnx.ModelProto, graph: tensat.Graph) -> None:
    """The graph read from `model` computes its output as onnxruntime runs it, on random inputs."""
    feeds = random_inputs(model)
    (got,) = tensat.session.make_session(model, "cpu", threads=1).run(None, feeds)
    ((_, y),) = graph.outputs
    np.testing.assert_allclose(graph.evaluate(feeds, [y])[y], got, rtol=1e-5, atol=1e-6)


WINDOWS_CUT = [
    # op, attributes, input size, the kernel and pads read
    (
        "AveragePool",
        dict(kernel_shape=[1280, 1280], strides=[1280, 1280], ceil_mode=1, count_include_pad=1),
        7,
        (7, 7),
        (0, 0, 0, 0),
    ),  # EfficientNet-B0's global average pool
    ("MaxPool", dict(kernel_shape=[9, 9], strides=[2, 2], pads=[1, 1, 1, 1]), 7, (8, 8), (1, 1, 0, 0)),
    ("AveragePool", dict(kernel_shape=[9, 9], strides=[2, 2], pads=[1, 1, 1, 1]), 7, (8, 8), (1, 1, 0, 0)),
    (
        "AveragePool",
        dict(kernel_shape=[9, 9], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
        7,
        (9, 9),
        (1, 1, 1, 1),
    ),  # counts its end pads: kept
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2]), 7, (3, 3), (0, 0, 0, 0)),  # three windows: kept
]


@pytest.mark.parametrize(("op_type", "attrs", "size", "kernel", "pads"), WINDOWS_CUT)
def test_a_pool_s_one_window_is_read_cut_at_the_input_s_end(
    op_type: str, attrs: dict[str, Any], size: int, kernel: tuple[int, ...], pads: tuple[int, ...]
) -> None:
    """Where an axis has one window and it runs past the input into the end pads, the window is read ending at the
    input's end, without the end pads it reads nothing else from: the pool it computes, which onnxruntime runs
    without iterating over the pads. An average counting its pads keeps them."""
    model = _pool_model(op_type, attrs, size, 1 if kernel[0] > 3 else 3)
    graph = import_model(model)
    (pool,) = [n for n in graph.nodes if not n.is_leaf]
    assert (pool.attr["kernel"], pool.attr["pads"]) == (kernel, pads)
    _computes_as_onnxruntime(model, graph)
    assert compare_models(model, export_model(graph)).ok


RESIZES = [
    (mode, transform, nearest, size)
    for mode in range(len(ops.RESIZE_MODES))
    for transform in range(len(ops.RESIZE_TRANSFORMS))
    for nearest in (range(len(ops.RESIZE_NEAREST)) if mode == 0 else [0])
    for size in [(10, 8), (7, 3), (3, 2)]
]


@pytest.mark.parametrize(("mode", "transform", "nearest", "size"), RESIZES)
def test_resize_computes_what_onnxruntime_computes(mode: int, transform: int, nearest: int, size: tuple) -> None:
    """Every mode, coordinate transformation and rounding tensat models, up and down, by exact and inexact ratios
    (written by scales where the ratio is exact in float, else by sizes): numpy's value is onnxruntime's."""
    graph = tensat.ir.Graph(opset_imports={"": 18})
    x = graph.input("x", (1, 2, 5, 4), "float32")
    y = graph.add("resize", [x], size=size, mode=mode, transform=transform, nearest=nearest)
    graph.output("y", y)
    feeds = random_inputs(export_model(graph))
    model = export_model(graph)
    session = tensat.session.make_session(model, "cpu", threads=1)
    (got,) = session.run(None, feeds)
    np.testing.assert_allclose(got, graph.evaluate(feeds, [y])[y], rtol=1e-5, atol=1e-5)
    assert import_model(model).summary() == graph.summary()


@pytest.mark.parametrize("opset", [9, 10, 11, 13, 18])
def test_a_nearest_upsample_by_two_is_read_and_written_at_its_opset(opset: int) -> None:
    """An upsampling by 2 (a detector's, a U-Net's) as each opset writes it: Upsample with its scales, then Resize;
    read as a resize of the batch-agnostic scales' sizes, verified, and written back in the opset's form."""
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    if opset < 10:
        node, inits = helper.make_node("Upsample", ["c", "scales"], ["u"], mode="nearest"), [scales]
    elif opset == 10:
        node, inits = helper.make_node("Resize", ["c", "scales"], ["u"], mode="nearest"), [scales]
    else:
        roi = numpy_helper.from_array(np.zeros(0, np.float32), "roi")
        attrs = dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        node, inits = helper.make_node("Resize", ["c", "roi", "scales"], ["u"], **attrs), [roi, scales]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        node,
        helper.make_node("Relu", ["u"], ["y"]),
    ]
    model = make(
        nodes,
        [vi("x", [1, 4, 6, 6])],
        [vi("y", [1, 8, 12, 12])],
        [_w("w", 8, 4, 3, 3), _w("b", 8), *inits],
        opset=opset,
    )
    graph = import_model(model)
    assert "opaque" not in graph.summary() and "resize" in graph.summary()
    written = export_model(graph)
    assert {n.op_type for n in written.graph.node} & {"Resize", "Upsample"} == {"Upsample" if opset < 10 else "Resize"}
    assert compare_models(model, written).ok


@pytest.mark.parametrize("opset", [9, 10])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [(2.0, 2.0), (3.0, 2.0), (2.0, 0.6)])
def test_an_old_opset_resize_computes_what_onnxruntime_computes(opset: int, mode: str, scales: tuple) -> None:
    """Upsample (opset 9) and Resize (opset 10), by integer scales and one below 1: where tensat reads the node, its
    numpy value is onnxruntime's (a nearest one below 1, which onnxruntime rounds otherwise, stays as written)."""
    op_type = "Upsample" if opset < 10 else "Resize"
    x = RNG.standard_normal((1, 1, 3, 5)).astype(np.float32)
    out = [1, 1, int(3 * scales[0]), int(5 * scales[1])]
    given = numpy_helper.from_array(np.array([1, 1, *scales], np.float32), "s")
    node = helper.make_node(op_type, ["x", "s"], ["y"], mode=mode)
    model = make([node], [vi("x", [1, 1, 3, 5])], [vi("y", out)], [given], opset=opset)
    try:
        (got,) = tensat.session.make_session(model, "cpu", threads=1).run(None, {"x": x})
    except Exception:  # noqa: BLE001 - onnxruntime's Upsample takes no scale below 1
        assert opset < 10 and min(scales) < 1
        return
    graph = import_model(model)
    resized = [i for i, n in enumerate(graph.nodes) if n.op == "resize"]
    if mode == "nearest" and min(scales) < 1:
        assert not resized
        return
    np.testing.assert_allclose(graph.evaluate({"x": x}, resized)[resized[0]], got, rtol=1e-5, atol=1e-5)


def test_a_resize_by_a_scale_other_than_its_sizes_ratio_stays_as_written() -> None:
    """A scale of 1.5 on 5 pixels gives 7, whose ratio 1.4 would move the sampled coordinates: kept opaque."""
    roi = numpy_helper.from_array(np.zeros(0, np.float32), "roi")
    scales = numpy_helper.from_array(np.array([1, 1, 1.5, 1.5], np.float32), "scales")
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="linear")
    model = make([node], [vi("x", [1, 2, 5, 5])], [vi("y", [1, 2, 7, 7])], [roi, scales], opset=18)
    assert "opaque" in import_model(model).summary()


@pytest.mark.parametrize(
    ("op_type", "attrs", "shape"),
    [
        ("DepthToSpace", {"blocksize": 2}, [1, 8, 3, 2]),
        ("DepthToSpace", {"blocksize": 2, "mode": "CRD"}, [1, 8, 3, 2]),
        ("DepthToSpace", {"blocksize": 3, "mode": "DCR"}, [1, 18, 2, 2]),
        ("SpaceToDepth", {"blocksize": 2}, [1, 3, 4, 6]),
    ],
)
def test_pixel_shuffles_are_read_and_written_back(op_type: str, attrs: dict, shape: list[int]) -> None:
    """DepthToSpace in both channel orders (ONNX's default DCR, PyTorch's pixel shuffle CRD) and SpaceToDepth: read
    as tensat's ops, and written back computing what the model computes."""
    b = int(attrs["blocksize"])
    n, c, h, w = shape
    out = [n, c // (b * b), h * b, w * b] if op_type == "DepthToSpace" else [n, c * b * b, h // b, w // b]
    model = make([helper.make_node(op_type, ["x"], ["y"], **attrs)], [vi("x", shape)], [vi("y", out)], opset=17)
    graph = import_model(model)
    assert "opaque" not in graph.summary()
    assert compare_models(model, export_model(graph)).ok


def test_a_u_net_up_block_is_modelled_and_optimizes() -> None:
    """A U-Net's up block: a ConvTranspose doubling the size (no bias written), concatenated with the skip, then a
    Conv and Relu. Every node modelled, and the optimized model verified."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["skip"], pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["skip"], ["down"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("ConvTranspose", ["down", "wt"], ["up"], strides=[2, 2], kernel_shape=[2, 2]),
        helper.make_node("Concat", ["up", "skip"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["y"]),
    ]
    inits = [_w("w", 8, 4, 3, 3), _w("b", 8), _w("wt", 8, 8, 2, 2), _w("w2", 8, 16, 3, 3), _w("b2", 8)]
    model = make(nodes, [vi("x", [1, 4, 12, 12])], [vi("y", [1, 8, 12, 12])], inits, opset=17)
    assert "conv_transpose2d" in import_model(model).summary()
    result = tensat.optimize_with_details(model, cost="analytic", latency_check=0)
    assert result.nodes_opaque == 0
    assert result.verification is not None and result.verification.ok


@pytest.mark.parametrize(("mode", "opset"), [("reflect", 10), ("reflect", 18), ("edge", 13), ("wrap", 19)])
def test_a_pad_by_the_tensor_s_own_elements_is_read_and_written_back(mode: str, opset: int) -> None:
    """A reflection pad before a Conv (PyTorch's ReflectionPad2d, a GAN's or a super-resolution model's), an edge
    and a wrap pad: read as `border_pad`, every node modelled, verified against the input, and the Pad written back in
    its mode at the model's opset (pads an attribute before opset 11)."""
    pads = [0, 0, 1, 2, 0, 0, 1, 2]
    if opset < 11:
        pad, inits = helper.make_node("Pad", ["x"], ["p"], mode=mode, pads=pads), []
    else:
        inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads")]
        pad = helper.make_node("Pad", ["x", "pads"], ["p"], mode=mode)
    nodes = [pad, helper.make_node("Conv", ["p", "w", "b"], ["y"])]
    model = make(
        nodes, [vi("x", [1, 4, 8, 8])], [vi("y", [1, 8, 8, 10])], [_w("w", 8, 4, 3, 3), _w("b", 8), *inits], opset=opset
    )
    graph = import_model(model)
    assert "border_pad" in graph.summary() and "opaque" not in graph.summary()
    written = export_model(graph)
    (back,) = [n for n in written.graph.node if n.op_type == "Pad"]
    assert {a.name: a.s.decode() for a in back.attribute if a.name == "mode"} == {"mode": mode}
    assert compare_models(model, written).ok
    result = tensat.optimize_with_details(model, cost="analytic", latency_check=0)
    assert result.nodes_opaque == 0 and result.verification is not None and result.verification.ok


def test_gather_elements_with_negative_and_narrower_indices_is_read_and_written_back() -> None:
    """GatherElements along its axis, by constant indices narrower than the data on another axis and negative ones
    (counted from the end): read as `gather_elements`, and written back computing what the model computes."""
    index = numpy_helper.from_array(np.array([[[0, -1], [2, 1]], [[-3, 0], [1, 1]]], np.int64), "index")
    node = helper.make_node("GatherElements", ["x", "index"], ["y"], axis=1)
    model = make([node], [vi("x", [2, 3, 4])], [vi("y", [2, 2, 2])], [index], opset=17)
    graph = import_model(model)
    assert "gather_elements" in graph.summary() and "opaque" not in graph.summary()
    assert compare_models(model, export_model(graph)).ok
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    (got,) = tensat.session.make_session(model, "cpu", threads=1).run(None, {"x": x})
    (out,) = [i for i, n in enumerate(graph.nodes) if n.op == "gather_elements"]
    np.testing.assert_array_equal(graph.evaluate({"x": x}, [out])[out], got)


def _read_and_written_back(model: onnx.ModelProto, op: str, feeds: dict[str, np.ndarray]) -> tensat.ir.Graph:
    """`model` read with its one node as `op`, written back computing what onnxruntime computes for `feeds`."""
    graph = import_model(model)
    assert [n.op for n in graph.nodes if not n.is_leaf] == [op]
    assert compare_models(model, export_model(graph)).ok
    (want,) = tensat.session.make_session(model, "cpu", threads=1).run(None, feeds)
    ((_, y),) = graph.outputs
    got = graph.evaluate(feeds, [y])[y]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    return graph


@pytest.mark.parametrize(("upper", "k"), [(1, None), (0, 0), (1, -1), (0, 2), (1, 7)])
def test_trilu_is_read_and_written_back(upper: int, k: int | None) -> None:
    """A causal mask's Trilu, upper or lower, from the main diagonal (its k left out) or another, past the matrix
    too, on a batch of matrices."""
    inits = [] if k is None else [numpy_helper.from_array(np.array(k, np.int64), "k")]
    node = helper.make_node("Trilu", ["x"] + ([] if k is None else ["k"]), ["y"], upper=upper)
    model = make([node], [vi("x", [2, 5, 6])], [vi("y", [2, 5, 6])], inits, opset=17)
    _read_and_written_back(model, "trilu", {"x": RNG.standard_normal((2, 5, 6)).astype(np.float32)})


@pytest.mark.parametrize(("repeats", "dtype"), [((1, 3, 2), TP.FLOAT), ((2, 1, 1), TP.INT64)])
def test_tile_by_constant_repeats_is_read_and_written_back(repeats: tuple[int, ...], dtype: int) -> None:
    """A Tile by constant repeats, of floats and of integers; by ones only, it is its input."""
    shape = [2, 1, 3]
    out = [d * r for d, r in zip(shape, repeats)]
    reps = numpy_helper.from_array(np.array(repeats, np.int64), "repeats")
    model = make(
        [helper.make_node("Tile", ["x", "repeats"], ["y"])],
        [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("y", dtype, out)],
        [reps],
        opset=17,
    )
    x = RNG.standard_normal(shape).astype(np.float32) if dtype == TP.FLOAT else RNG.integers(0, 9, shape)
    _read_and_written_back(model, "tile", {"x": x})
    ones = numpy_helper.from_array(np.ones(3, np.int64), "repeats")
    same = make([helper.make_node("Tile", ["x", "repeats"], ["y"])], [vi("x", shape)], [vi("y", shape)], [ones])
    assert [n.op for n in import_model(same).nodes if not n.is_leaf] == []


@pytest.mark.parametrize("op_type", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize(("axis", "keepdims", "last"), [(-1, 0, 0), (1, 1, 1), (0, 1, 0)])
def test_an_arg_reduction_is_read_and_written_back(op_type: str, axis: int, keepdims: int, last: int) -> None:
    """ArgMax and ArgMin along an axis (negative counted from the end), the reduced axis kept or dropped, the first
    or the last extreme taken where several tie (integers, so that they do)."""
    shape = [3, 4, 5]
    out = (
        [1 if i == axis % 3 else d for i, d in enumerate(shape)]
        if keepdims
        else shape[: axis % 3] + shape[axis % 3 + 1 :]
    )
    node = helper.make_node(op_type, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)
    model = make(
        [node],
        [helper.make_tensor_value_info("x", TP.INT64, shape)],
        [helper.make_tensor_value_info("y", TP.INT64, out)],
        [],
        opset=17,
    )
    _read_and_written_back(model, op_type.lower(), {"x": RNG.integers(0, 3, shape)})


@pytest.mark.parametrize(
    ("equation", "a", "b"),
    [
        ("bhqd,bhkd->bhqk", [1, 2, 5, 4], [1, 2, 6, 4]),
        ("bij,bjk->bik", [2, 3, 4], [2, 4, 5]),
        ("ij,kj", [3, 4], [5, 4]),
        ("bij, jk -> bki", [2, 3, 4], [4, 5]),
        ("i,i->", [4], [4]),
    ],
)
def test_einsum_of_two_operands_is_read_and_written_back(equation: str, a: list[int], b: list[int]) -> None:
    """An Einsum of two operands, explicit or implicit, spaced or not, to a scalar too: read as `einsum` by its
    subscripts numbered by first appearance, written back computing what the model computes."""
    x, y = RNG.standard_normal(a).astype(np.float32), RNG.standard_normal(b).astype(np.float32)
    out = list(np.einsum(equation.replace(" ", ""), x, y).shape)
    model = make(
        [helper.make_node("Einsum", ["x", "y"], ["z"], equation=equation)],
        [vi("x", a), vi("y", b)],
        [vi("z", out)],
        [],
        opset=17,
    )
    _read_and_written_back(model, "einsum", {"x": x, "y": y})


def test_an_einsum_with_an_ellipsis_stays_opaque() -> None:
    model = make(
        [helper.make_node("Einsum", ["x", "y"], ["z"], equation="...ij,...jk->...ik")],
        [vi("x", [2, 3, 4]), vi("y", [2, 4, 5])],
        [vi("z", [2, 3, 5])],
        [],
        opset=17,
    )
    assert "einsum" not in import_model(model).summary()


def test_comparisons_mod_and_isinf_are_modelled_as_onnxruntime_computes_them() -> None:
    """Greater and GreaterOrEqual are read as Less and LessOrEqual of the operands swapped (false both ways at a
    NaN); Mod keeps the divisor's sign, or with fmod the dividend's; IsInf finds the signs it is asked for."""
    nodes = [
        helper.make_node("Greater", ["a", "b"], ["gt"]),
        helper.make_node("GreaterOrEqual", ["a", "b"], ["ge"]),
        helper.make_node("LessOrEqual", ["a", "b"], ["le"]),
        helper.make_node("Mod", ["i", "j"], ["m"]),
        helper.make_node("Mod", ["i", "j"], ["fm"], fmod=1),
        helper.make_node("IsInf", ["a"], ["neg_inf"], detect_positive=0),
        helper.make_node("IsInf", ["a"], ["inf"]),
    ]
    inputs = [vi("a", [2, 4]), vi("b", [2, 4]), vi("i", [2, 4], TP.INT64), vi("j", [4], TP.INT64)]
    outputs = [vi(n, [2, 4], TP.BOOL) for n in ("gt", "ge", "le", "neg_inf", "inf")]
    outputs[3:3] = [vi("m", [2, 4], TP.INT64), vi("fm", [2, 4], TP.INT64)]
    model = make(nodes, inputs, outputs, opset=18)
    graph = import_model(model)
    counts = graph.summary()
    assert "opaque" not in counts
    assert (counts["less"], counts["less_or_equal"], counts["mod"], counts["isinf"]) == (1, 2, 2, 2)
    a = np.array([[1, np.nan, 2, -np.inf], [np.inf, 0, -1, 3]], np.float32)
    b = np.array([[1, 1, np.nan, 0], [2, 0, -2, np.inf]], np.float32)
    i = np.array([[7, -7, 7, -7], [0, 5, -5, 6]], np.int64)
    feeds = {"a": a, "b": b, "i": i, "j": np.array([3, 3, -3, -4], np.int64)}
    want = run_model(model, feeds)
    out = export_model(graph)
    onnx.checker.check_model(out, full_check=True)
    got = run_model(out, feeds)
    ours = graph.evaluate(feeds, [n for _, n in graph.outputs])
    for name, n in graph.outputs:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        np.testing.assert_array_equal(ours[n], want[name], err_msg=name)


def test_an_expert_router_is_modelled_and_optimizes() -> None:
    """A mixture of experts' router, as Mixtral's export writes it: the top two of a softmax over the experts, the
    weights renormalized, each token's expert ids scattered into a one-hot mask. Every node modelled (TopK as its
    values and its indices, written back as one node), and the optimized model verified."""
    nodes = [
        helper.make_node("MatMul", ["x", "gate"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["p"], axis=-1),
        helper.make_node("TopK", ["p", "k"], ["top", "expert"], axis=-1),
        helper.make_node("ReduceSum", ["top", "last"], ["total"], keepdims=1),
        helper.make_node("Div", ["top", "total"], ["w"]),
        helper.make_node("ScatterElements", ["zeros", "expert", "w"], ["mask"], axis=1),
        helper.make_node("Transpose", ["mask"], ["mask_t"], perm=[1, 0]),
        helper.make_node("Transpose", ["mask_t"], ["y"], perm=[1, 0]),
    ]
    tokens, hidden, experts = 6, 16, 4
    inits = [
        _w("gate", hidden, experts),
        numpy_helper.from_array(np.array([2], np.int64), "k"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
        numpy_helper.from_array(np.zeros((tokens, experts), np.float32), "zeros"),
    ]
    model = make(nodes, [vi("x", [tokens, hidden])], [vi("y", [tokens, experts])], inits, opset=17)
    assert {"topk", "scatter_elements"} <= set(import_model(model).summary())
    result = tensat.optimize_with_details(model, cost="analytic", latency_check=0)
    assert result.nodes_opaque == 0
    assert result.verification is not None and result.verification.ok
    written = [n.op_type for n in result.output.graph.node]
    assert written.count("TopK") == 1 and "Transpose" not in written
