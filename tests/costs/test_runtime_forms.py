"""Computations onnxruntime runs faster in one form than another are timed both ways on the device and written the
faster way (`tensat.runtime_forms`): a residual Add that onnxruntime fuses with the LayerNormalization reading it
into a SkipLayerNormalization, found as onnxruntime fuses it, is written as Sum where the fused kernel is slower;
an RMSNorm scaling by the Reciprocal of a Sqrt, which onnxruntime does not fuse, is written as a Div by it where
the SimplifiedLayerNormalization it then becomes is faster; an LRN is written as its definition, a channel-band
Conv and a power, where onnxruntime runs that faster than its LRN kernel."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import tensat
from tensat import onnx_io
from tensat.cost import runtime_cost
from tensat.ir import Node
from tensat.measure import MeasuredCost
from tensat.onnx import fusions
from tensat.runtime_forms import (
    LRN,
    RMS_NORM,
    SKIP_LAYERNORM,
    choose_forms,
    has_sites,
    lrn_models,
    rms_norm_models,
    skip_norm_models,
)
from tensat.session import make_session
from tests.helpers import make, vi
from tests.onnx.test_fusions import runtime_ops

RNG = np.random.default_rng(11)
SEQ, HIDDEN = 128, 256  # a BERT-style encoder's sub-layer output


def _w(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((0.1 * RNG.standard_normal(shape)).astype(np.float32), name)


def _post_norm(bias: bool) -> onnx.ModelProto:
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


def _cost(tmp_path) -> MeasuredCost:
    return MeasuredCost("cpu", cache_path=tmp_path / "costs.sqlite3", progress=False, max_seconds=0.3)


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return make_session(model.SerializeToString(), "cpu").run(None, {"x": x})[0]


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "with bias"])
def test_the_residual_add_onnxruntime_fuses_is_found_and_imported(bias: bool) -> None:
    model = _post_norm(bias)
    assert runtime_ops(model)["SkipLayerNormalization"] == 1
    assert fusions.runtime_fusions(model).skip_adds == {"res"}
    graph = onnx_io.import_model(model, runtime_fusions=True).compact()
    assert [graph.nodes[i].op for i in graph.skip_adds] == ["add"]
    assert onnx_io.import_model(model).skip_adds == set()  # without asking onnxruntime, nothing is known


def test_a_pre_norm_add_read_twice_is_found_only_as_onnxruntime_fuses_it() -> None:
    """Where the residual sum is read again after the LayerNormalization, the fused kernel emits it as a second
    output: whatever onnxruntime does, what is found is what it did."""
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
    fused = runtime_ops(model)["SkipLayerNormalization"]
    assert len(fusions.runtime_fusions(model).skip_adds) == fused


def test_the_two_forms_compute_the_same_and_only_the_add_is_fused() -> None:
    added, summed = skip_norm_models((1, SEQ, HIDDEN))
    assert runtime_ops(added)["SkipLayerNormalization"] == 1
    assert runtime_ops(summed)["SkipLayerNormalization"] == 0
    feeds = {n: RNG.standard_normal((1, SEQ, HIDDEN)).astype(np.float32) for n in ("x", "skip")}
    a, s = (make_session(m.SerializeToString(), "cpu").run(None, feeds)[0] for m in (added, summed))
    np.testing.assert_allclose(a, s, rtol=1e-4, atol=1e-4)


def _consistent(forms, cost: MeasuredCost) -> None:
    """Each kind was rewritten exactly where its other form is measured faster by more than the model tells apart."""
    tol = cost.resolution
    for t in forms.timings:
        assert t.input_ms > 0 and t.other_ms > 0
        assert t.rewritten == (t.other_ms * (1 + tol.relative) + tol.ms < t.input_ms)
    rewritten = [t for t in forms.timings if t.rewritten]
    assert forms.excess_ms == pytest.approx(sum(t.count * (t.input_ms - t.other_ms - t.priced_ms) for t in rewritten))


def test_adds_are_written_as_sum_exactly_where_the_fused_pair_is_measured_slower(tmp_path) -> None:
    graph = onnx_io.import_model(_post_norm(True), runtime_fusions=True).compact()
    cost = _cost(tmp_path)
    chosen, forms = choose_forms(graph, cost)
    (timing,) = forms.timings
    assert timing.kind == SKIP_LAYERNORM and timing.shape == (1, SEQ, HIDDEN) and timing.count == 1
    _consistent(forms, cost)
    assert sum(n.op == "sum" for n in chosen.nodes) == (1 if timing.rewritten else 0)
    assert not any(n.op == "sum" for n in graph.nodes)  # the graph given is left as it was

    again = _cost(tmp_path)  # a new process's model: the pair's timing comes from the cache
    _, second = choose_forms(onnx_io.import_model(_post_norm(True), runtime_fusions=True).compact(), again)
    assert second.timings == forms.timings and again.stats.measured == 0


def test_an_add_written_as_sum_computes_the_same_and_is_not_fused() -> None:
    model = _post_norm(True)
    graph = onnx_io.import_model(model, runtime_fusions=True).compact()
    (add,) = graph.skip_adds
    n = graph.nodes[add]
    graph.replace(add, Node("sum", n.inputs, n.attrs, n.shape, n.dtype))
    written = onnx_io.export_model(graph)
    kernels = runtime_ops(written)
    assert kernels["SkipLayerNormalization"] == 0 and kernels["Sum"] == 1 and kernels["LayerNormalization"] == 1
    x = RNG.standard_normal((1, SEQ, HIDDEN)).astype(np.float32)
    np.testing.assert_allclose(_run(written, x), _run(model, x), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError):  # not a value of the node's shape
        graph.replace(add, Node("matmul", n.inputs, (), n.shape, n.dtype))


def _rms_norm(reciprocal: bool = True, scaled: bool = True, power: float = 2.0) -> onnx.ModelProto:
    """T5's and Llama's RMSNorm as torch.onnx's dynamo exporter writes it: x * Reciprocal(Sqrt(mean(x^2) + eps))
    (or, as the TorchScript exporter writes it, x / Sqrt(...)), then scaled by a weight, then a MatMul."""
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
    if scaled:
        nodes.append(helper.make_node("Mul", ["g", "n"], ["sn"]))
    nodes.append(helper.make_node("MatMul", ["sn" if scaled else "n", "w"], ["y"]))
    inits = [
        numpy_helper.from_array(np.array(power, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        _w("g", HIDDEN),
        _w("w", HIDDEN, HIDDEN),
    ]
    return make(nodes, [vi("x", [1, SEQ, HIDDEN])], [vi("y", [1, SEQ, HIDDEN])], inits)


def test_the_two_rms_norm_forms_compute_the_same_and_only_the_div_is_fused() -> None:
    reciprocal, div = rms_norm_models((1, SEQ, HIDDEN))
    assert runtime_ops(reciprocal)[RMS_NORM] == 0 and runtime_ops(div)[RMS_NORM] == 1
    x = {"x": RNG.standard_normal((1, SEQ, HIDDEN)).astype(np.float32)}
    a, b = (make_session(m.SerializeToString(), "cpu").run(None, x)[0] for m in (reciprocal, div))
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_an_rms_norm_is_written_with_div_where_the_fused_kernel_is_measured_faster(tmp_path) -> None:
    model = _rms_norm()
    assert runtime_ops(model)[RMS_NORM] == 0  # as exported, onnxruntime does not fuse it
    graph = onnx_io.import_model(model, runtime_fusions=True).compact()
    cost = _cost(tmp_path)
    chosen, forms = choose_forms(graph, cost)
    (timing,) = forms.timings
    assert timing.kind == RMS_NORM and timing.count == 1
    _consistent(forms, cost)
    written = onnx_io.export_model(chosen)
    x = RNG.standard_normal((1, SEQ, HIDDEN)).astype(np.float32)
    np.testing.assert_allclose(_run(written, x), _run(model, x), rtol=1e-4, atol=1e-4)
    if timing.rewritten:
        assert runtime_ops(written)[RMS_NORM] == 1
        scale = next(i for i, n in enumerate(chosen.nodes) if n.op == "mul")
        assert scale in chosen.pinned  # no rule folds the scale into the MatMul and takes the fusion apart
    else:
        assert runtime_ops(written)[RMS_NORM] == 0


@pytest.mark.parametrize(
    "model",
    [_rms_norm(reciprocal=False), _rms_norm(scaled=False), _rms_norm(power=3.0)],
    ids=["written with Div already", "without a scale, which onnxruntime's pattern needs", "not of squares"],
)
def test_only_the_rms_norms_onnxruntime_would_fuse_as_div_are_timed(model: onnx.ModelProto) -> None:
    assert not has_sites(onnx_io.import_model(model, runtime_fusions=True).compact())


def test_onnxruntime_fuses_an_rms_norm_written_with_div_only_with_its_scale() -> None:
    assert runtime_ops(_rms_norm(reciprocal=False, scaled=True))[RMS_NORM] == 1
    assert runtime_ops(_rms_norm(reciprocal=False, scaled=False))[RMS_NORM] == 0


def test_the_run_prices_the_input_as_it_runs_and_returns_what_the_timing_decided(tmp_path, monkeypatch) -> None:
    from tensat import api

    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: _cost(tmp_path))
    model = _post_norm(True)
    result = tensat.optimize_with_details(
        model, cost="measured", latency_check=0, time_limit=10, ilp_time_limit=10, pre_pass="none"
    )  # the pre-pass's own changes would move the price of the result
    assert result.forms is not None
    (timing,) = result.forms.timings
    read = result.original_graph
    assert [read.nodes[i].op for i in read.skip_adds] == ["add"]  # the input as read, not as rewritten
    assert result.cost_before == pytest.approx(runtime_cost(read, _cost(tmp_path)) + result.forms.excess_ms)
    kernels = runtime_ops(result.output)
    if timing.rewritten:
        assert result.returned_input is None
        assert kernels["SkipLayerNormalization"] == 0 and kernels["Sum"] == 1
        assert result.cost_after == pytest.approx(result.cost_before - result.forms.excess_ms, rel=0.05)
        assert "residual Add as Sum" in result.summary()
    else:
        assert kernels["SkipLayerNormalization"] == 1
    assert result.to_dict()["forms"]["rewritten"] == result.forms.rewritten


def test_the_analytic_cost_model_times_nothing_and_leaves_the_input_as_written() -> None:
    result = tensat.optimize_with_details(_post_norm(False), cost="analytic", latency_check=0)
    assert result.forms is None
    assert runtime_ops(result.output)["SkipLayerNormalization"] == 1


def _lrn_params(size: int = 5, beta: float = 0.75, alpha: float = 1e-4, bias: float = 1.0) -> tuple:
    return tuple(sorted({"alpha": alpha, "beta": beta, "bias": bias, "size": float(size)}.items()))


def _lrn_reference(x: np.ndarray, size: int, beta: float, alpha: float, bias: float) -> np.ndarray:
    """ONNX's definition of LRN, channel by channel: the window of channel c runs from c - floor((size - 1) / 2) to
    c + ceil((size - 1) / 2), clipped to the channels there are."""
    channels = x.shape[1]
    below, above = (size - 1) // 2, size - 1 - (size - 1) // 2
    square_sum = np.stack(
        [(x[:, max(0, c - below) : min(channels - 1, c + above) + 1] ** 2).sum(axis=1) for c in range(channels)],
        axis=1,
    )
    return x / (bias + alpha / size * square_sum) ** beta


@pytest.mark.parametrize(
    "size, beta, alpha, bias",
    [(5, 0.75, 1e-4, 1.0), (4, 0.5, 1e-2, 2.0), (3, 1.0, 0.5, 1.0), (5, 0.25, 1e-3, 1.0), (2, 0.6, 0.1, 0.5)],
    ids=["AlexNet's", "even size, square root", "beta 1", "fourth root", "Pow"],
)
def test_an_lrn_written_as_its_definition_computes_what_onnx_defines(
    size: int, beta: float, alpha: float, bias: float
) -> None:
    """The band covers ONNX's window (asymmetric for an even size, which onnxruntime's kernel refuses) at the edges
    as in the middle; where onnxruntime runs the LRN, the two agree."""
    lrn, definition = lrn_models((1, 12, 5, 7), "float32", _lrn_params(size, beta, alpha, bias))
    assert [n.op_type for n in lrn.graph.node] == ["LRN"]
    assert "LRN" not in {n.op_type for n in definition.graph.node}
    assert ("Pow" in {n.op_type for n in definition.graph.node}) == (beta not in (0.25, 0.5, 0.75, 1.0))
    x = (3 * RNG.standard_normal((1, 12, 5, 7))).astype(np.float32)
    written = make_session(definition.SerializeToString(), "cpu").run(None, {"x": x})[0]
    expected = _lrn_reference(x.astype(np.float64), size, beta, alpha, bias)
    np.testing.assert_allclose(written, expected, rtol=1e-5, atol=1e-6)
    if size % 2:
        np.testing.assert_allclose(written, _run(lrn, x), rtol=1e-5, atol=1e-6)


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


def test_lrns_are_written_as_their_definition_exactly_where_that_is_measured_faster(tmp_path) -> None:
    model = _lrn_net()
    graph = onnx_io.import_model(model).compact()
    assert has_sites(graph)
    cost = _cost(tmp_path)
    chosen, forms = choose_forms(graph, cost)
    (timing,) = forms.timings
    assert timing.kind == LRN and timing.shape == (1, 16, 14, 14) and timing.count == 1
    _consistent(forms, cost)
    written = onnx_io.export_model(chosen)
    kinds = {n.op_type for n in written.graph.node}
    assert ("LRN" in kinds) != timing.rewritten and ("Conv" in kinds)
    if timing.rewritten:
        assert timing.priced_ms < 0  # the one opaque op is priced below the ops of its definition
        assert "LRN as a channel-band Conv" in forms.rewritten
    x = RNG.standard_normal((1, 3, 14, 14)).astype(np.float32)
    np.testing.assert_allclose(_run(written, x), _run(model, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 16, 14), (1, 16, 4, 4, 4)], ids=["3-D", "5-D"])
def test_only_4d_lrns_are_timed(shape: tuple[int, ...]) -> None:
    model = make(
        [helper.make_node("LRN", ["x"], ["y"], size=3)], [vi("x", list(shape))], [vi("y", list(shape))], opset=13
    )
    assert not has_sites(onnx_io.import_model(model).compact())


def test_an_lrn_that_onnxruntime_runs_slower_is_optimized_and_timed_faster_end_to_end(tmp_path, monkeypatch) -> None:
    """onnxruntime's CPU LRN kernel walks one window at a time; written as its definition, a band Conv and Sqrts,
    the stem runs several times faster, which the run returns once the end-to-end check has timed it so."""
    from tensat import api

    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: _cost(tmp_path))
    model = _lrn_net((1, 64, 56, 56))
    result = tensat.optimize_with_details(model, cost="measured", latency_check=5, pre_pass="none")
    assert result.forms is not None
    (timing,) = result.forms.timings
    assert timing.rewritten and timing.input_ms > 2 * timing.other_ms
    assert result.returned_input is None and "LRN" not in {n.op_type for n in result.output.graph.node}
    assert result.latency is not None and result.latency.kept
    assert result.latency.by_threads[1].speedup > 1.5
    assert "LRN as a channel-band Conv" in result.summary()


def test_a_node_expands_only_into_a_value_of_its_own_shape_and_type() -> None:
    """`Graph.compact(expand=...)` puts the nodes computing a value another way before its readers, and refuses an
    expansion that computes something of another shape."""
    graph = onnx_io.import_model(_lrn_net()).compact()
    (site,) = [i for i, n in enumerate(graph.nodes) if n.op == "opaque"]
    graph.pinned.add(site)
    doubled = graph.compact(expand={site: lambda g, inputs: g.add("add", [inputs[0], inputs[0]])})
    adds = [i for i, n in enumerate(doubled.nodes) if n.op == "add"]
    assert len(adds) == 1 and not doubled.pinned
    assert all(j < adds[0] for j in doubled.nodes[adds[0]].inputs)
    assert any(adds[0] in n.inputs for n in doubled.nodes)  # the MaxPool reads it
    with pytest.raises(ValueError, match="expanded to a value of"):
        graph.compact(expand={site: lambda g, inputs: g.reshape(inputs[0], (1, 16, 196))})
