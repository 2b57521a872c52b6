"""onnxruntime's kernels and the faster forms of a computation are chosen by the extraction, with measured costs.

The input is read as the kernels onnxruntime runs it with (`tensat.onnx.fusions`): a residual Add and the
LayerNormalization reading it as one SkipLayerNormalization, a LayerNorm or an RMSNorm written out as the kernel it
becomes. The rules of `rewrites/rules/kernels.rules` and `forms.rules` offer the other forms (the two ops written
so that onnxruntime does not fuse them, an RMSNorm's kernel, an LRN's definition), each unit is timed as
onnxruntime runs it, and the extraction chooses; the exporter writes what was chosen, and onnxruntime runs exactly
those kernels (`check_kernels`)."""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import tensat
from tensat import api, extraction, onnx_io, ops, rewrites
from tensat.cost import AnalyticCost, Const, runtime_cost
from tensat.cost_report import load_graph
from tensat.egraph import TensorEGraph, provenance
from tensat.ir import Graph, Node
from tensat.measure import DEFAULT_OUTPUTS, MeasuredCost
from tensat.onnx import fusions
from tensat.session import make_session
from tests.helpers import make, vi
from tests.onnx.test_fusions import runtime_ops

RNG = np.random.default_rng(11)
SEQ, HIDDEN = 128, 256  # a BERT-style encoder's sub-layer output


def _w(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((0.1 * RNG.standard_normal(shape)).astype(np.float32), name)


def _post_norm(bias: bool = True) -> onnx.ModelProto:
    """A post-norm sub-layer: LayerNorm(x + x @ w (+ b)), the residual Add read by the LayerNormalization alone."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"])]
    if bias:
        nodes.append(helper.make_node("Add", ["mm", "b"], ["lin"]))
    nodes += [
        helper.make_node("Add", ["lin" if bias else "mm", "x"], ["res"]),
        helper.make_node("LayerNormalization", ["res", "g", "beta"], ["y"], axis=-1, epsilon=1e-5),
    ]
    inits = [_w("w", HIDDEN, HIDDEN), _w("g", HIDDEN), _w("beta", HIDDEN)] + ([_w("b", HIDDEN)] if bias else [])
    return make(nodes, [vi("x", [1, SEQ, HIDDEN])], [vi("y", [1, SEQ, HIDDEN])], inits)


def _rms_norm(reciprocal: bool = True) -> onnx.ModelProto:
    """T5's and Llama's RMSNorm as torch.onnx's dynamo exporter writes it: x * Reciprocal(Sqrt(mean(x^2) + eps))
    (or, as the TorchScript exporter writes it, x / Sqrt(...)), scaled by a weight, then a MatMul."""
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["rms"]),
    ]
    if reciprocal:
        nodes += [helper.make_node("Reciprocal", ["rms"], ["inv"]), helper.make_node("Mul", ["x", "inv"], ["n"])]
    else:
        nodes.append(helper.make_node("Div", ["x", "rms"], ["n"]))
    nodes += [helper.make_node("Mul", ["g", "n"], ["sn"]), helper.make_node("MatMul", ["sn", "w"], ["y"])]
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        _w("g", HIDDEN),
        _w("w", HIDDEN, HIDDEN),
    ]
    return make(nodes, [vi("x", [1, SEQ, HIDDEN])], [vi("y", [1, SEQ, HIDDEN])], inits)


def _lrn_net(lrn_shape: tuple[int, int, int, int] = (1, 16, 14, 14), opset: int = 9) -> onnx.ModelProto:
    """A model-zoo-style stem: Conv, Relu, LRN, MaxPool."""
    n, c, h, w = lrn_shape
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("LRN", ["r"], ["n"], size=5, alpha=1e-4, beta=0.75, bias=1.0),
        helper.make_node("MaxPool", ["n"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    return make(nodes, [vi("x", [n, 3, h, w])], [vi("y", [n, c, h // 2, w // 2])], [_w("w", c, 3, 3, 3)], opset=opset)


def _squeeze_excite(keepdims: int = 1) -> onnx.ModelProto:
    """An EfficientNet-style squeeze-and-excitation block as a dynamo export writes it: the squeeze is a ReduceMean
    over the spatial axes (keepdims 1), not a GlobalAveragePool; with keepdims 0, a head's pooled features."""
    c = 64
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("ReduceMean", ["r"], ["m"], axes=[-1, -2], keepdims=keepdims),
    ]
    if not keepdims:
        return make(nodes, [vi("x", [1, 3, 56, 56])], [vi("m", [1, c])], [_w("w", c, 3, 3, 3)])
    nodes += [
        helper.make_node("Conv", ["m", "w1"], ["s1"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["s1"], ["s2"]),
        helper.make_node("Conv", ["s2", "w2"], ["s3"], kernel_shape=[1, 1]),
        helper.make_node("Sigmoid", ["s3"], ["g"]),
        helper.make_node("Mul", ["r", "g"], ["e"]),
        helper.make_node("Conv", ["e", "w3"], ["y"], kernel_shape=[1, 1]),
    ]
    inits = [_w("w", c, 3, 3, 3), _w("w1", 16, c, 1, 1), _w("w2", c, 16, 1, 1), _w("w3", c, c, 1, 1)]
    return make(nodes, [vi("x", [1, 3, 56, 56])], [vi("y", [1, c, 56, 56])], inits)


def _cost(tmp_path, outputs: str = DEFAULT_OUTPUTS) -> MeasuredCost:
    return MeasuredCost("cpu", cache_path=tmp_path / "costs.sqlite3", progress=False, max_seconds=0.3, outputs=outputs)


def _cost_of_the_run(tmp_path, model: onnx.ModelProto) -> MeasuredCost:
    """The cost model of an `_optimize` run of `model`: its cache, sized by the graph the run read, so that pricing
    a node the run priced finds the run's own price and does not time it again (a second timing, under other load,
    can order two close prices the other way)."""
    cost = _cost(tmp_path)
    cost.observe_graph(onnx_io.import_model(model, runtime_fusions=True))
    return cost


def _priced_by_the_run(tmp_path, model: onnx.ModelProto, *others: onnx.ModelProto) -> tuple[list[float], MeasuredCost]:
    """What the `_optimize` run of `model` priced it and each of `others` at, each read and priced as the run prices
    a graph (`runtime_cost`), from the run's cache; asserts that none was timed anew."""
    cost = _cost_of_the_run(tmp_path, model)
    prices = [runtime_cost(onnx_io.import_model(m, runtime_fusions=True), cost) for m in (model, *others)]
    assert cost.stats.measured == 0
    return prices, cost


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return make_session(model.SerializeToString(), "cpu").run(None, {"x": x})[0]


def _optimize(
    model: onnx.ModelProto, tmp_path, monkeypatch, cost_outputs: str = DEFAULT_OUTPUTS, **options
) -> tensat.OptimizeResult:
    """`tensat.optimize_with_details` of `model` with measured costs cached in `tmp_path` (`cost_outputs`: where
    the units without weights find their output buffers, `MeasuredCost.outputs`)."""
    monkeypatch.setattr(
        api, "make_cost_model", lambda name, device="auto", progress=False: _cost(tmp_path, cost_outputs)
    )
    options = {"cost": "measured", "latency_check": 0, "pre_pass": "none", **options}
    return tensat.optimize_with_details(model, **options)


# -- reading the input as the kernels onnxruntime runs


def test_a_residual_add_and_its_layernorm_are_read_as_the_kernel_onnxruntime_runs() -> None:
    model = _post_norm()
    assert runtime_ops(model)["SkipLayerNormalization"] == 1
    found = fusions.runtime_fusions(model)
    assert [k.op_type for k in found.kernels.values()] == ["SkipLayerNormalization"]
    graph = onnx_io.import_model(model, runtime_fusions=True).compact()
    assert graph.summary()["skip_layernorm"] == 1 and "layernorm" not in graph.summary()
    x = RNG.standard_normal((1, SEQ, HIDDEN)).astype(np.float32)
    np.testing.assert_allclose(_run(onnx_io.export_model(graph), x), _run(model, x), rtol=1e-4, atol=1e-4)
    assert "skip_layernorm" not in onnx_io.import_model(model).summary()  # without asking onnxruntime: as written


def test_the_cost_report_reads_a_model_as_the_kernels_onnxruntime_runs(tmp_path) -> None:
    """`tensat cost-report` and `tensat profile` price a model file as `tensat optimize` reads it: a residual Add
    and its LayerNormalization as the one kernel onnxruntime runs, not as two ops priced apart."""
    path = tmp_path / "post_norm.onnx"
    onnx.save(_post_norm(), str(path))
    graph = load_graph(path)
    assert graph.summary()["skip_layernorm"] == 1 and "layernorm" not in graph.summary()


def test_an_rms_norm_onnxruntime_fuses_is_read_as_its_kernel_and_one_it_does_not_as_written() -> None:
    fused = onnx_io.import_model(_rms_norm(reciprocal=False), runtime_fusions=True).compact()
    assert fused.summary()["rms_norm"] == 1 and "reciprocal" not in fused.summary()
    plain = onnx_io.import_model(_rms_norm(reciprocal=True), runtime_fusions=True).compact()
    assert "rms_norm" not in plain.summary() and plain.summary()["reciprocal"] == 1


def test_a_pre_norm_sum_read_again_stays_plain_ops() -> None:
    """Where the residual sum is read again after the LayerNormalization, onnxruntime's kernel emits it as a second
    output, which the op does not model: the subgraph is read as written."""
    nodes = [
        helper.make_node("Add", ["x", "z"], ["res"]),
        helper.make_node("LayerNormalization", ["res", "g", "beta"], ["n"], axis=-1, epsilon=1e-5),
        helper.make_node("Add", ["n", "res"], ["y"]),
    ]
    model = make(
        nodes,
        [vi("x", [1, SEQ, HIDDEN]), vi("z", [1, SEQ, HIDDEN])],
        [vi("y", [1, SEQ, HIDDEN])],
        [_w("g", HIDDEN), _w("beta", HIDDEN)],
    )
    graph = onnx_io.import_model(model, runtime_fusions=True).compact()
    assert "skip_layernorm" not in graph.summary() and "opaque" not in graph.summary()
    assert graph.summary()["layernorm"] == 1 and graph.summary()["add"] == 2


# -- each kernel and form is timed as onnxruntime runs it


@pytest.mark.parametrize(
    "op, shapes, attrs",
    [
        ("skip_layernorm", [(1, SEQ, HIDDEN), (1, SEQ, HIDDEN), (HIDDEN,), (HIDDEN,)], {"epsilon": 1e-5}),
        ("layernorm", [(1, SEQ, HIDDEN), (HIDDEN,), (HIDDEN,)], {"axis": 2, "epsilon": 1e-5}),
        ("rms_norm", [(1, SEQ, HIDDEN), (HIDDEN,)], {"epsilon": 1e-6}),
        ("gelu", [(1, SEQ, HIDDEN)], {"approximate": 0}),
        ("lrn", [(1, 16, 14, 14)], {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}),
        ("band", [], {"channels": 16, "size": 5, "alpha": 1e-4}),
        (
            "conv1d",
            [(1, 32, 400), (32, 16, 3), (32,)],
            {"strides": (2,), "pads": (1, 1), "dilations": (1,), "group": 2},
        ),
        ("multihead_attention", [(1, SEQ, HIDDEN)] * 3 + [(1, 1, SEQ, SEQ)], {"num_heads": 4, "scale": 0.125}),
        (
            "attention",
            [(1, SEQ, HIDDEN), (HIDDEN, 3 * HIDDEN), (3 * HIDDEN,), (1, 1, SEQ, SEQ)],
            {"num_heads": 4, "scale": 0.125},
        ),
    ],
)
def test_each_kernel_and_form_is_timed_as_onnxruntime_runs_it(op: str, shapes: list, attrs: dict, tmp_path) -> None:
    cost = _cost(tmp_path)
    out = ops.shape_of(op, shapes, attrs)
    activations = {"skip_layernorm": (0, 1), "multihead_attention": (0, 1, 2, 3), "attention": (0, 3)}.get(op, (0,))
    const = [k not in activations for k in range(len(shapes))]  # the others are weights
    price = cost(Node(op, (), tuple(attrs.items()), out, "float32"), shapes, const)
    if ops.constant_leaf(op):
        assert price == 0.0 and cost.stats.measured == 0  # a constant costs nothing: it is folded
        return
    assert price > 0 and cost.stats.measured == 1 and cost.stats.analytic == 0


# -- the extraction chooses, and what is written is what runs


def test_the_residual_add_is_written_as_sum_exactly_where_the_two_ops_price_below_the_kernel(
    tmp_path, monkeypatch
) -> None:
    model = _post_norm()
    result = _optimize(model, tmp_path, monkeypatch)
    plain_model = onnx.ModelProto()
    plain_model.CopyFrom(model)
    (residual,) = [n for n in plain_model.graph.node if n.op_type == "Add" and "x" in n.input]
    residual.op_type = "Sum"  # onnxruntime does not fuse a Sum into the LayerNormalization
    (kernel, plain), cost = _priced_by_the_run(tmp_path, model, plain_model)
    unfused = result.rules.get("skip-layernorm-unfuse") == 1
    tolerance = cost.resolution
    if plain * (1 + tolerance.relative) + 2 * tolerance.ms < kernel:
        assert unfused and result.returned_input is None
    if kernel < plain:
        assert not unfused
    kernels = runtime_ops(result.output)
    assert (kernels["SkipLayerNormalization"], kernels["Sum"]) == ((0, 1) if unfused else (1, 0))
    assert fusions.check_kernels(result.output).match


def test_an_rms_norm_the_runtime_does_not_fuse_becomes_its_kernel_where_that_prices_lower(
    tmp_path, monkeypatch
) -> None:
    model = _rms_norm(reciprocal=True)
    assert runtime_ops(model)["SimplifiedLayerNormalization"] == 0
    result = _optimize(model, tmp_path, monkeypatch)
    x = RNG.standard_normal((1, SEQ, HIDDEN)).astype(np.float32)
    np.testing.assert_allclose(_run(result.output, x), _run(model, x), rtol=1e-4, atol=1e-4)
    fused = "rms-norm-fuse" in result.rules
    assert runtime_ops(result.output)["SimplifiedLayerNormalization"] == (1 if fused else 0)
    assert fused == (result.returned_input is None and result.cost_after < result.cost_before)
    assert fusions.check_kernels(result.output).match


def test_an_lrn_onnxruntime_runs_slower_is_written_as_its_definition_and_timed_faster(tmp_path, monkeypatch) -> None:
    """onnxruntime's CPU LRN kernel walks one window at a time; written as its definition, a band Conv and Sqrts,
    the stem runs several times faster: the rules offer it, the extraction chooses it, the check times it."""
    model = _lrn_net((1, 64, 56, 56))
    result = _optimize(model, tmp_path, monkeypatch, latency_check=5)
    assert result.returned_input is None and "LRN" not in {n.op_type for n in result.output.graph.node}
    assert result.rules.get("lrn-definition") == 1 and "(unexplained)" not in result.rules
    assert result.latency is not None and result.latency.kept
    assert result.latency.by_threads[1].speedup > 1.5
    x = RNG.standard_normal((1, 3, 56, 56)).astype(np.float32)
    np.testing.assert_allclose(_run(result.output, x), _run(model, x), rtol=1e-5, atol=1e-6)


POOL_RULES = ("band-conv-as-channel-pool", "band-conv-as-channel-pool-3d")


@pytest.mark.parametrize(("channels", "size", "forms"), [(256, 27, {POOL_RULES[0]}), (192, 56, {None, POOL_RULES[1]})])
def test_lrn_sums_its_window_with_the_form_that_prices_lowest(
    channels: int, size: int, forms: set[str | None], tmp_path, monkeypatch
) -> None:
    """LRN's window sum over the channels is a 1x1 Conv with a band weight (channels squared multiply-adds a pixel),
    an average pool down the channels made the rows of a one-channel image, or a 3-D pool down the channels made the
    depth of a one-channel volume. Over CaffeNet's second LRN (256 channels of 27x27) onnxruntime's 2-D pool is the
    fastest by far; over GoogLeNet's second (192 of 56x56) the 2-D pool, over rows of 3136, is several times slower
    than the Conv and the 3-D pool, and which of those two is faster depends on the machine (the 3-D pool by several
    times on an AMD EPYC, the two a few percent apart on an Intel Xeon). The rules offer every form and the
    extraction chooses by measured cost; every change is traced to the rule that made it. The pools are priced with
    their outputs warm: cold (the default) brings CaffeNet's 2-D and 3-D pools within the noise of one window of
    each other (0.14-0.32 against 0.22-0.42 ms on an AMD EPYC), and which form wins is then the noise's choice."""
    model = _lrn_net((1, channels, size, size))
    result = _optimize(model, tmp_path, monkeypatch, cost_outputs="warm")
    written = collections.Counter(n.op_type for n in result.output.graph.node)
    chosen = [r for r in POOL_RULES if r in result.rules]
    assert len(chosen) <= 1 and (chosen[0] if chosen else None) in forms
    assert (written["AveragePool"], written["Conv"]) == ((1, 1) if chosen else (0, 2))
    assert result.rules.get("lrn-definition") == 1 and "(unexplained)" not in result.rules
    x = RNG.standard_normal((1, 3, size, size)).astype(np.float32)
    np.testing.assert_allclose(_run(result.output, x), _run(model, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("keepdims", [1, 0])
def test_a_spatial_mean_becomes_a_global_average_pool_where_that_prices_lower(
    keepdims: int, tmp_path, monkeypatch
) -> None:
    """onnxruntime runs a GlobalAveragePool in its blocked layout and a ReduceMean over the same axes behind a
    reorder of its whole input: the rules offer the pool, and the extraction takes it where it prices lower."""
    model = _squeeze_excite(keepdims)
    result = _optimize(model, tmp_path, monkeypatch)
    x = RNG.standard_normal((1, 3, 56, 56)).astype(np.float32)
    np.testing.assert_allclose(_run(result.output, x), _run(model, x), rtol=1e-4, atol=1e-5)
    rule = "reducemean-spatial-as-globalavgpool" if keepdims else "reducemean-spatial-drop-as-globalavgpool"
    pooled = rule in result.rules
    assert pooled == (result.returned_input is None and result.cost_after < result.cost_before)
    written = {n.op_type for n in result.output.graph.node}
    assert ("GlobalAveragePool" in written, "ReduceMean" in written) == (pooled, not pooled)
    cost = _cost_of_the_run(tmp_path, model)
    shape, out = (1, 64, 56, 56), (1, 64, 1, 1)
    mean = cost(
        Node("reducemean", (), (("axes", (2, 3)), ("keepdims", keepdims)), out if keepdims else out[:2], "float32"),
        [shape],
    )
    pool = cost(Node("globalavgpool", (), (), out, "float32"), [shape])
    tolerance = cost.resolution
    assert cost.stats.measured == 0  # the prices the extraction chose by, not a second timing
    if keepdims and pool * (1 + tolerance.relative) + tolerance.ms < mean:
        assert pooled
    assert fusions.check_kernels(result.output).match


def test_a_pool_that_is_one_window_over_its_input_becomes_the_global_pool_where_that_prices_lower(
    tmp_path, monkeypatch
) -> None:
    """EfficientNet-B0 exports its global average pool as a ceil_mode AveragePool of a 1280 kernel over 7x7, read as
    the 7x7 pool it computes: the rules offer the global pool, and the extraction takes it where it prices lower."""
    c = 256
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("AveragePool", ["c"], ["y"], kernel_shape=[1280, 1280], strides=[1280, 1280], ceil_mode=1),
    ]
    model = make(nodes, [vi("x", [1, 64, 7, 7])], [vi("y", [1, c, 1, 1])], [_w("w", c, 64, 1, 1)])
    assert "globalavgpool" not in onnx_io.import_model(model).summary()
    result = _optimize(model, tmp_path, monkeypatch)
    x = RNG.standard_normal((1, 64, 7, 7)).astype(np.float32)
    np.testing.assert_allclose(_run(result.output, x), _run(model, x), rtol=1e-4, atol=1e-5)
    pooled = "avgpool-whole-input-as-globalavgpool" in result.rules
    assert pooled == (result.returned_input is None and result.cost_after < result.cost_before)
    written = {n.op_type for n in result.output.graph.node}
    assert ("GlobalAveragePool" in written, "AveragePool" in written) == (pooled, not pooled)
    cost = _cost_of_the_run(tmp_path, model)
    shape, out = (1, c, 7, 7), (1, c, 1, 1)
    window = (("kernel", (7, 7)), ("strides", (1280, 1280)), ("pads", (0, 0, 0, 0)))
    windowed = cost(Node("avgpool", (), window + (("count_include_pad", 0),), out, "float32"), [shape])
    pool = cost(Node("globalavgpool", (), (), out, "float32"), [shape])
    tolerance = cost.resolution
    assert cost.stats.measured == 0  # the prices the extraction chose by, not a second timing
    if pool * (1 + tolerance.relative) + tolerance.ms < windowed:
        assert pooled


def test_a_1d_convolution_becomes_the_2d_one_over_a_height_of_1_where_that_prices_lower(tmp_path, monkeypatch) -> None:
    """A speech encoder's feature convolution is read as the 1-D Conv it is, and priced as onnxruntime runs that;
    the rule `conv1d-as-conv2d` offers the 2-D form (blocked on the CPU), and the extraction takes it where it
    prices lower."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3], strides=[2], pads=[1, 1]),
        helper.make_node("Tanh", ["c"], ["y"]),
    ]
    model = make(nodes, [vi("x", [1, 64, 801])], [vi("y", [1, 64, 401])], [_w("w", 64, 64, 3), _w("b", 64)])
    assert onnx_io.import_model(model).summary()["conv1d"] == 1
    result = _optimize(model, tmp_path, monkeypatch)
    x = RNG.standard_normal((1, 64, 801)).astype(np.float32)
    np.testing.assert_allclose(_run(result.output, x), _run(model, x), rtol=1e-4, atol=1e-5)
    two_d = "conv1d-as-conv2d" in result.rules
    assert two_d == (result.returned_input is None and result.cost_after < result.cost_before)
    kernels = [n.attribute for n in result.output.graph.node if n.op_type == "Conv"]
    assert len(kernels) == 1
    written = next(a for a in kernels[0] if a.name == "kernel_shape").ints
    assert list(written) == ([1, 3] if two_d else [3])
    cost = _cost_of_the_run(tmp_path, model)
    window = (("strides", (2,)), ("pads", (1, 1)), ("dilations", (1,)), ("group", 1))
    one_d = cost(Node("conv1d", (), window, (1, 64, 401), "float32"), [(1, 64, 801), (64, 64, 3), (64,)], [0, 1, 1])
    window_2d = (("strides", (1, 2)), ("pads", (0, 1, 0, 1)), ("dilations", (1, 1)), ("group", 1), ("act", 0))
    plain = cost(
        Node("conv2d", (), window_2d, (1, 64, 1, 401), "float32"),
        [(1, 64, 1, 801), (64, 64, 1, 3), (64,)],
        [0, 1, 1],
    )
    assert cost.stats.measured == 0  # the prices the extraction chose by, not a second timing
    tolerance = cost.resolution
    if one_d * (1 - tolerance.relative) - tolerance.ms > plain * 1.5:
        assert two_d
    assert fusions.check_kernels(result.output).match


def test_attention_written_as_einsums_becomes_matmuls_where_they_price_lower(tmp_path, monkeypatch) -> None:
    """Attention whose scores and context an export wrote as Einsums (`bhqd,bhkd->bhqk`, `bhqk,bhkd->bhqd`): the
    rules offer each as a matmul (the scores' by a transpose, which onnxruntime fuses), and the extraction takes
    the matmul where it prices lower. The result computes the model's output."""
    shape = [1, 4, 64, 32]
    nodes = [
        helper.make_node("Einsum", ["q", "k"], ["s"], equation="bhqd,bhkd->bhqk"),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("Einsum", ["p", "v"], ["y"], equation="bhqk,bhkd->bhqd"),
    ]
    model = make(nodes, [vi(n, shape) for n in "qkv"], [vi("y", shape)], [])
    result = _optimize(model, tmp_path, monkeypatch)
    feeds = {n: RNG.standard_normal(shape).astype(np.float32) for n in "qkv"}
    (got,) = make_session(result.output.SerializeToString(), "cpu").run(None, feeds)
    (want,) = make_session(model.SerializeToString(), "cpu").run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    context = "einsum-as-matmul-4d" in result.rules
    written = collections.Counter(n.op_type for n in result.output.graph.node)
    assert written["Einsum"] == 2 - context - ("einsum-as-matmul-transposed-4d" in result.rules)
    cost = _cost_of_the_run(tmp_path, model)
    scores = (1, 4, 64, 64)
    equation = ("equation", ops.einsum_subscripts("bhqk,bhkd->bhqd"))
    einsum = cost(Node("einsum", (), (equation, ("shape", tuple(shape))), tuple(shape), "float32"), [scores, shape])
    matmul = cost(Node("matmul", (), (), tuple(shape), "float32"), [scores, shape])
    tolerance = cost.resolution
    assert cost.stats.measured == 0  # the prices the extraction chose by, not a second timing
    if matmul * (1 + tolerance.relative) + tolerance.ms < einsum:
        assert context


@pytest.mark.parametrize("equation", ["bsd,df->bsf", "bsd,fd->bsf"])
def test_a_linear_layer_written_as_an_einsum_becomes_a_matmul_where_that_prices_lower(
    equation: str, tmp_path, monkeypatch
) -> None:
    """A linear layer an export wrote as an Einsum of its weight, as laid out for a matmul or as torch lays it out:
    the rules offer it as a matmul by the weight (transposed at export, where torch's layout), and the extraction
    takes the matmul where it prices lower."""
    weight = (HIDDEN, 4 * HIDDEN) if equation == "bsd,df->bsf" else (4 * HIDDEN, HIDDEN)
    node = helper.make_node("Einsum", ["x", "w"], ["y"], equation=equation)
    model = make([node], [vi("x", [1, SEQ, HIDDEN])], [vi("y", [1, SEQ, 4 * HIDDEN])], [_w("w", *weight)])
    result = _optimize(model, tmp_path, monkeypatch)
    x = RNG.standard_normal((1, SEQ, HIDDEN)).astype(np.float32)
    np.testing.assert_allclose(_run(result.output, x), _run(model, x), rtol=1e-4, atol=1e-4)
    rule = "einsum-as-matmul-by-matrix-3d" if equation == "bsd,df->bsf" else "einsum-as-matmul-by-transposed-matrix-3d"
    chosen = rule in result.rules
    written = {n.op_type for n in result.output.graph.node}
    assert ("MatMul" in written, "Einsum" in written) == (chosen, not chosen)
    cost = _cost_of_the_run(tmp_path, model)
    out = (1, SEQ, 4 * HIDDEN)
    attrs = (("equation", ops.einsum_subscripts(equation)), ("shape", out))
    einsum = cost(Node("einsum", (), attrs, out, "float32"), [(1, SEQ, HIDDEN), weight], [0, 1])
    matmul = cost(Node("matmul", (), (), out, "float32"), [(1, SEQ, HIDDEN), (1, HIDDEN, 4 * HIDDEN)], [0, 1])
    tolerance = cost.resolution
    assert cost.stats.measured == 0  # the prices the extraction chose by, not a second timing
    if matmul * (1 + tolerance.relative) + tolerance.ms < einsum:
        assert chosen


def test_the_kernels_check_sees_a_fusion_the_model_did_not_write() -> None:
    """A LayerNormalization after an Add is written as two ops; onnxruntime runs it as SkipLayerNormalization."""
    check = fusions.check_kernels(_post_norm())
    assert check.written == {"LayerNormalization": 1} and check.run == {"SkipLayerNormalization": 1}
    assert not check.match


def test_an_add_chosen_apart_from_its_layernorm_is_written_so_that_it_runs_apart() -> None:
    """An Add and the LayerNormalization reading it, chosen as two ops and priced as two, are written with the Add
    as a Sum: onnxruntime runs the two kernels priced, not its SkipLayerNormalization (which the extraction prices
    as its own op where it chooses it). The outputs are the model's."""
    model = _post_norm()
    graph = onnx_io.import_model(model).compact()
    assert {n.op for n in graph.nodes} >= {"add", "layernorm"}
    out = onnx_io.export_model(graph)
    written = [n.op_type for n in out.graph.node]
    assert "Sum" in written and "LayerNormalization" in written
    check = fusions.check_kernels(out)
    assert check.match and check.run == {"LayerNormalization": 1}
    x = RNG.standard_normal((1, SEQ, HIDDEN)).astype(np.float32)
    np.testing.assert_allclose(_run(out, x), _run(model, x), rtol=1e-5, atol=1e-5)
    summed = Graph()
    x = summed.input("x", (1, SEQ, HIDDEN))
    z = summed.input("z", (1, SEQ, HIDDEN))
    g = summed.weight(np.ones(HIDDEN, np.float32), "g")
    b = summed.weight(np.zeros(HIDDEN, np.float32) + 0.5, "b")
    summed.output("y", summed.add("layernorm", [summed.add("sum", [x, z]), g, b], axis=2, epsilon=1e-5))
    assert fusions.check_kernels(onnx_io.export_model(summed)).match


# -- standard ONNX ops only


def test_with_standard_onnx_every_kernel_is_written_as_the_ops_it_computes() -> None:
    """A post-norm sub-layer is read as onnxruntime's SkipLayerNormalization, and an RMSNorm onnxruntime fuses as its
    SimplifiedLayerNormalization; written for another runtime, the model holds ops of the ONNX standard only."""
    for model in (_post_norm(), _rms_norm(reciprocal=False)):
        read = onnx_io.import_model(model, runtime_fusions=True)
        assert not all(ops.standard(read.nodes[i].op, 17) for i in read.live())
        result = tensat.optimize_with_details(model, cost="analytic", latency_check=0, standard_onnx=True)
        written = result.output if result.returned_input is None else model
        assert all(n.domain in ("", "ai.onnx") for n in written.graph.node)
        onnx.checker.check_model(written, full_check=True)
        x = RNG.standard_normal((1, SEQ, HIDDEN)).astype(np.float32)
        np.testing.assert_allclose(_run(written, x), _run(model, x), rtol=1e-4, atol=1e-4)
    default = tensat.optimize_with_details(_rms_norm(reciprocal=False), cost="analytic", latency_check=0)
    assert default.returned_input is not None or "SimplifiedLayerNormalization" in {
        n.op_type for n in default.output.graph.node
    }


def test_with_standard_onnx_a_kernel_no_rule_rewrote_returns_the_input() -> None:
    """With no exploration, the kernel the input was read as has no alternative in the e-graph: the input, whose
    ops are the standard's, is returned, and the run says why."""
    result = tensat.optimize_with_details(
        _post_norm(), cost="analytic", latency_check=0, standard_onnx=True, iter_limit=0
    )
    assert result.returned_input == "no graph of ONNX standard ops was found"
    assert any("skip_layernorm" in w for w in result.warnings)


def test_a_matmul_onnxruntime_runs_as_a_fused_matmul_is_written_as_one() -> None:
    """Attention's scale moved onto the keys and their transpose, chosen as a Mul, a Transpose and a MatMul, run as
    one FusedMatMul (onnxruntime folds both into it): that kernel is what the model is written with, unless it is
    kept to standard ops. The outputs are the same either way."""
    g = Graph()
    q = g.input("q", (1, 4, 64, 16))
    k = g.input("k", (1, 4, 64, 16))
    scaled = g.add(
        "mul", [g.add("transpose", [k], perm=(0, 1, 3, 2)), g.add("fill", [], value=0.25, shape=(1, 1, 1, 1), dtype=1)]
    )
    g.output("s", g.add("softmax", [g.add("matmul", [q, scaled])], axis=3))
    plain = onnx_io.export_model(g)
    assert not fusions.check_kernels(plain).match  # Mul + Transpose + MatMul written, FusedMatMul run
    fused = onnx_io.export_model(g, fuse_matmuls=True)
    (node,) = [n for n in fused.graph.node if n.op_type == "FusedMatMul"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["transB"] == 1 and attrs["transA"] == 0 and attrs["alpha"] == pytest.approx(0.25)
    assert not {"Mul", "Transpose", "MatMul"} & {n.op_type for n in fused.graph.node}
    assert fusions.check_kernels(fused).match
    feeds = {
        "q": RNG.standard_normal((1, 4, 64, 16)).astype(np.float32),
        "k": RNG.standard_normal((1, 4, 64, 16)).astype(np.float32),
    }
    got, want = (make_session(m, "cpu", 1).run(None, feeds)[0] for m in (fused, plain))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert onnx_io.import_model(fused).compact().nodes  # tensat reads back what it wrote


def test_a_scale_of_a_matmul_s_output_is_written_into_its_fused_matmul() -> None:
    """LeViT's scores: q @ k, both transposed in ways no FusedMatMul folds, then a Mul by a scalar. onnxruntime runs
    the MatMul and the Mul as one FusedMatMul (MatMulScaleFusion folds a scale of the output too), so the model is
    written with it; where the product is read by another node as well, the Mul stays its own."""
    g = Graph()
    x = g.input("x", (1, 16, 4, 8))
    q, k = g.add("transpose", [x], perm=(0, 2, 1, 3)), g.add("transpose", [x], perm=(0, 2, 3, 1))
    product = g.add("matmul", [q, k])
    scale = g.add("fill", [], value=0.25, shape=(), dtype=1)
    g.output("s", g.add("softmax", [g.add("mul", [product, scale])], axis=3))
    plain, fused = onnx_io.export_model(g), onnx_io.export_model(g, fuse_matmuls=True)
    assert not fusions.check_kernels(plain).match
    (node,) = [n for n in fused.graph.node if n.op_type == "FusedMatMul"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["alpha"] == pytest.approx(0.25) and attrs["transA"] == attrs["transB"] == 0
    assert not {"Mul", "MatMul"} & {n.op_type for n in fused.graph.node}
    assert fusions.check_kernels(fused).match
    feeds = {"x": RNG.standard_normal((1, 16, 4, 8)).astype(np.float32)}
    got, want = (make_session(m, "cpu", 1).run(None, feeds)[0] for m in (fused, plain))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    g.output("p", product)  # read twice: onnxruntime leaves the Mul, and so does the export
    both = onnx_io.export_model(g, fuse_matmuls=True)
    assert "Mul" in {n.op_type for n in both.graph.node} and fusions.check_kernels(both).match


HEADS = 4


def _attention(
    g: Graph, bias: bool = True, joined: tuple[int, ...] = (SEQ, HIDDEN), projected: tuple[str, ...] = ()
) -> int:
    """A BERT-style attention block as the transformers exporter writes it: projections of the flattened tokens
    split into heads by a Reshape and a Transpose each, scores scaled and masked, Softmax, the heads joined again
    (a Reshape to `joined`). With `projected`, the tokens are (1, SEQ, HIDDEN), as the dynamo exporter leaves them,
    and the projections named there (of "wq", "wk", "wv") add a bias."""
    x = g.input("x", (1, SEQ, HIDDEN) if projected else (SEQ, HIDDEN))
    head = HIDDEN // HEADS

    def split(name: str, perm: tuple[int, ...]) -> int:
        weight = (0.1 * RNG.standard_normal((HIDDEN, HIDDEN))).astype(np.float32)
        proj = g.add("matmul", [x, g.weight(weight[None] if projected else weight, name)])
        if name in projected:
            offset = (0.1 * RNG.standard_normal((1, 1, HIDDEN))).astype(np.float32)
            proj = g.add("add", [proj, g.weight(offset, f"b{name}")])
        return g.add("transpose", [g.reshape(proj, (1, SEQ, HEADS, head))], perm=perm)

    q, k, v = split("wq", (0, 2, 1, 3)), split("wk", (0, 2, 3, 1)), split("wv", (0, 2, 1, 3))
    scale = g.add("fill", [], value=1.0 / np.sqrt(head), shape=(1, 1, 1, 1), dtype=1)
    scores = g.add("mul", [g.add("matmul", [q, k]), scale])
    if bias:
        mask = np.where(RNG.random((1, 1, SEQ, SEQ)) < 0.2, -1e4, 0.0).astype(np.float32)
        scores = g.add("add", [scores, g.weight(mask, "mask")])
    context = g.add("transpose", [g.add("matmul", [g.add("softmax", [scores], axis=3), v])], perm=(0, 2, 1, 3))
    return g.reshape(context, joined)


class _KernelCheap:
    """The analytic cost with one of onnxruntime's kernels (`op`) priced at a tenth: a selection that takes it."""

    name = "kernel-cheap"

    def __init__(self, op: str) -> None:
        self.op = op

    def __call__(self, node: Node, in_shapes: Sequence[Sequence[int]], const: Sequence[Const] = ()) -> float:
        price = AnalyticCost()(node, in_shapes, const)
        return price / 10 if node.op == self.op else price


@pytest.mark.parametrize("joined", [(SEQ, HIDDEN), (1, SEQ, HIDDEN)], ids=["2-d", "the-kernels-own-shape"])
def test_a_chosen_multihead_attention_is_explained_by_the_attention_rule(joined: tuple[int, ...]) -> None:
    """Where the extraction takes the kernel, the change is traced to the rule that offered it, also where the
    block's heads are joined by a Reshape to the kernel's own output shape: the Reshape of the kernel's Reshape folds
    to the identity, and the kernel lands in the e-class of the input's Reshape, which no rule rewrote into it."""
    g = Graph()
    g.output("y", _attention(g, joined=joined))
    names = ("multihead-attention-fuse", "reshape-reshape", "reshape-identity")
    te = TensorEGraph(g, [r for r in rewrites.rule_set("hand") if r.name in names])
    te.explore(iter_limit=4)
    xg, decoded, forbidden = te.export(_KernelCheap("multihead_attention"))
    found = extraction.ilp_extract(xg, forbidden=frozenset(forbidden), time_limit=20)
    assert any(decoded[nid].op == "multihead_attention" for nid in found.choices.values())
    rules = te.rules_behind(found.choices, decoded, xg.roots, te.class_shapes(decoded))
    assert rules.get("multihead-attention-fuse") == 1 and provenance.UNEXPLAINED not in rules


@pytest.mark.parametrize("bias", [True, False])
def test_an_attention_block_is_offered_as_onnxruntimes_multihead_attention(bias: bool) -> None:
    """The e-graph holds the block's MultiHeadAttention beside its written-out form (the rule matches the flattened
    projections through Reshapes), and a graph with the kernel chosen runs as that kernel in onnxruntime, with the
    block's outputs: the bias as its attention_bias, or none where the block has none."""
    g = Graph()
    g.output("y", _attention(g, bias))
    rules = [r for r in rewrites.rule_set("hand") if r.name.startswith("multihead-attention")]
    te = TensorEGraph(g, rules)
    te.explore(iter_limit=1)
    _, decoded, _ = te.export(AnalyticCost())
    (mha,) = [d for d in decoded.values() if d.op == "multihead_attention"]
    assert mha.attrs == {"num_heads": HEADS, "scale": pytest.approx(0.125)}

    chosen = Graph()
    x = chosen.input("x", (SEQ, HIDDEN))
    qkv = [
        chosen.reshape(chosen.add("matmul", [x, chosen.weight(g.weights[w], w)]), (1, SEQ, HIDDEN))
        for w in ("wq", "wk", "wv")
    ]
    if bias:
        attn_bias = chosen.weight(g.weights["mask"], "mask")
    else:
        attn_bias = chosen.add("fill", [], value=0.0, shape=(1, 1, SEQ, SEQ), dtype=1)
    out = chosen.add("multihead_attention", [*qkv, attn_bias], num_heads=HEADS, scale=0.125)
    chosen.output("y", chosen.reshape(out, (SEQ, HIDDEN)))
    model = onnx_io.export_model(chosen)
    (node,) = [n for n in model.graph.node if n.op_type == "MultiHeadAttention"]
    assert node.domain == ops.CONTRIB and len(node.input) == (6 if bias else 3)
    check = fusions.check_kernels(model)
    assert check.match and check.run.get("MultiHeadAttention") == 1
    feeds = {"x": RNG.standard_normal((SEQ, HIDDEN)).astype(np.float32)}
    got = make_session(model, "cpu", 1).run(None, feeds)[0]
    want = make_session(onnx_io.export_model(g), "cpu", 1).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_an_attention_without_a_bias_is_timed_as_the_kernel_written_without_one() -> None:
    """The exporter leaves a bias of zeros out of the MultiHeadAttention it writes, and onnxruntime then runs the
    kernel without one: the unit is timed with the bias's value, so it is the same kernel."""
    from tensat.cost import item_of
    from tensat.measure.units import Unit, unit_model

    g = Graph()
    q = g.input("q", (1, SEQ, HIDDEN))
    zeros = g.add("fill", [], value=0.0, shape=(1, 1, SEQ, SEQ), dtype=1)
    mha = g.add("multihead_attention", [q, q, q, zeros], num_heads=4, scale=0.125)
    g.output("y", mha)
    model = unit_model(Unit.single(*item_of(g, g.nodes[mha], {zeros})))
    (written,) = [n for n in model.graph.node if n.op_type == "MultiHeadAttention"]
    assert len(written.input) == 3


@pytest.mark.parametrize("scale", [None, 0.0, 0.25], ids=["unset", "zero", "given"])
def test_a_multihead_attention_read_from_a_model_computes_what_onnxruntime_runs(scale: float | None) -> None:
    """A MultiHeadAttention a model already holds is read with the scale onnxruntime runs it with: one over the
    square root of the head size where the attribute is absent, and also where it is 0, which onnxruntime reads as
    unset."""
    attrs = {"num_heads": 4} if scale is None else {"num_heads": 4, "scale": scale}
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain="com.microsoft", **attrs)
    shape = [1, SEQ, HIDDEN]
    model = make([node], [vi(n, shape) for n in "qkv"], [vi("y", shape)], extra_opsets=[("com.microsoft", 1)])
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
    (expected,) = make_session(model, "cpu", 1).run(None, feeds)
    graph = onnx_io.import_model(model)
    (out,) = [i for _, i in graph.outputs]
    np.testing.assert_allclose(graph.evaluate(feeds)[out], expected, rtol=1e-4, atol=1e-5)


_PROJECTED = {"biased": ("wq", "wk", "wv"), "keys-unbiased": ("wq", "wv"), "unbiased": ("none",)}


@pytest.mark.parametrize("projected", list(_PROJECTED), ids=list(_PROJECTED))
def test_a_chosen_attention_is_explained_by_its_rule_and_the_multihead_attention_rule(projected: str) -> None:
    """Self-attention whose three projections read one input becomes onnxruntime's Attention (the projections'
    weights side by side) through the MultiHeadAttention its heads make; where the extraction takes it, in the
    input's own e-class (the heads joined to the kernel's output shape), both rules are credited."""
    g = Graph()
    g.output("y", _attention(g, joined=(1, SEQ, HIDDEN), projected=_PROJECTED[projected]))
    names = ("multihead-attention-fuse", "reshape-reshape", "reshape-identity")
    rules = [r for r in rewrites.rule_set("hand") if r.name in names or r.name.startswith("attention-fuse")]
    te = TensorEGraph(g, rules)
    te.explore(iter_limit=6)
    xg, decoded, forbidden = te.export(_KernelCheap("attention"))
    found = extraction.ilp_extract(xg, forbidden=frozenset(forbidden), time_limit=20)
    assert any(decoded[nid].op == "attention" for nid in found.choices.values())
    rule = {"biased": "attention-fuse", "keys-unbiased": "attention-fuse-unbiased-keys"}.get(projected)
    credited = te.rules_behind(found.choices, decoded, xg.roots, te.class_shapes(decoded))
    assert credited == {rule or "attention-fuse-unbiased": 1, "multihead-attention-fuse": 1}


@pytest.mark.parametrize("bias, projected", [(True, "keys-unbiased"), (False, "keys-unbiased"), (False, "unbiased")])
def test_an_attention_is_written_as_onnxruntimes_attention_and_runs_as_it(bias: bool, projected: str) -> None:
    """The exporter writes the op as onnxruntime's Attention (its weights and biases side by side, the projections'
    biases also where all are zeros, T5's: onnxruntime's kernel crashes without them; a scores' bias of zeros left
    out), onnxruntime runs that kernel with the outputs of the written-out block, and tensat reads it back."""
    g = Graph()
    g.output("y", _attention(g, bias, joined=(1, SEQ, HIDDEN), projected=_PROJECTED[projected]))
    chosen = Graph()
    x = chosen.input("x", (1, SEQ, HIDDEN))
    zero = np.zeros((1, 1, HIDDEN), np.float32)
    weights = np.concatenate([g.weights[w][0] for w in ("wq", "wk", "wv")], axis=1)
    offsets = np.concatenate([g.weights.get(f"b{w}", zero) for w in ("wq", "wk", "wv")], axis=2).reshape(-1)
    if bias:
        scores_bias = chosen.weight(g.weights["mask"], "mask")
    else:
        scores_bias = chosen.add("fill", [], value=0.0, shape=(1, 1, SEQ, SEQ), dtype=1)
    out = chosen.add(
        "attention",
        [x, chosen.weight(weights, "w"), chosen.weight(offsets, "b"), scores_bias],
        num_heads=HEADS,
        scale=0.125,
    )
    chosen.output("y", out)
    model = onnx_io.export_model(chosen)
    (node,) = [n for n in model.graph.node if n.op_type == "Attention"]
    assert node.domain == ops.CONTRIB and len(node.input) == (6 if bias else 3) and node.input[2]
    check = fusions.check_kernels(model)
    assert check.match and check.run.get("Attention") == 1
    feeds = {"x": RNG.standard_normal((1, SEQ, HIDDEN)).astype(np.float32)}
    got = make_session(model, "cpu", 1).run(None, feeds)[0]
    want = make_session(onnx_io.export_model(g), "cpu", 1).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert onnx_io.import_model(model).compact().summary().get("attention") == 1
