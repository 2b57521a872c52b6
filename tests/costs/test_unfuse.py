"""A residual Add that onnxruntime fuses with the LayerNormalization reading it into a SkipLayerNormalization is
found as onnxruntime fuses it, timed both ways on the device, and written as Sum where the fused kernel is slower
(`tensat.unfuse`): the same value, which onnxruntime then runs as two kernels."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import tensat
from tensat import onnx_io
from tensat.cost import runtime_cost
from tensat.measure import MeasuredCost
from tensat.onnx import fusions
from tensat.session import make_session
from tensat.unfuse import skip_norm_models, unfuse
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


def test_adds_are_written_as_sum_exactly_where_the_fused_pair_is_measured_slower(tmp_path) -> None:
    graph = onnx_io.import_model(_post_norm(True), runtime_fusions=True).compact()
    cost = _cost(tmp_path)
    found = unfuse(graph, cost)
    (timing,) = found.timings
    assert timing.shape == (1, SEQ, HIDDEN) and timing.adds == 1
    assert timing.fused_ms > 0 and timing.unfused_ms > 0
    tol = cost.resolution
    assert timing.written_as_sum == (timing.fused_ms > timing.unfused_ms * (1 + tol.relative) + tol.ms)
    sums = [n for n in graph.nodes if n.op == "sum"]
    assert len(sums) == found.sums == (1 if timing.written_as_sum else 0)
    assert found.excess_ms == pytest.approx(timing.fused_ms - timing.unfused_ms if timing.written_as_sum else 0.0)

    again = _cost(tmp_path)  # a new process's model: the pair's timing comes from the cache
    second = unfuse(onnx_io.import_model(_post_norm(True), runtime_fusions=True).compact(), again)
    assert second.timings == found.timings and again.stats.measured == 0


def test_an_add_written_as_sum_computes_the_same_and_is_not_fused() -> None:
    model = _post_norm(True)
    graph = onnx_io.import_model(model, runtime_fusions=True).compact()
    (add,) = graph.skip_adds
    graph.relabel(add, "sum")
    written = onnx_io.export_model(graph)
    kernels = runtime_ops(written)
    assert kernels["SkipLayerNormalization"] == 0 and kernels["Sum"] == 1 and kernels["LayerNormalization"] == 1
    x = RNG.standard_normal((1, SEQ, HIDDEN)).astype(np.float32)
    np.testing.assert_allclose(_run(written, x), _run(model, x), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError):  # not a value of the same shape
        graph.relabel(add, "matmul")


def test_the_run_prices_the_fused_kernel_and_returns_what_its_timing_decided(tmp_path, monkeypatch) -> None:
    from tensat import api

    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: _cost(tmp_path))
    model = _post_norm(True)
    result = tensat.optimize_with_details(model, cost="measured", latency_check=0, time_limit=10, ilp_time_limit=10)
    assert result.unfused is not None
    (timing,) = result.unfused.timings
    read = result.original_graph
    assert [read.nodes[i].op for i in read.skip_adds] == ["add"]  # the input as read, not as rewritten
    assert result.cost_before == pytest.approx(runtime_cost(read, _cost(tmp_path)) + result.unfused.excess_ms)
    kernels = runtime_ops(result.output)
    if timing.written_as_sum:
        assert result.returned_input is None
        assert kernels["SkipLayerNormalization"] == 0 and kernels["Sum"] == 1
        assert result.cost_after == pytest.approx(result.cost_before - result.unfused.excess_ms, rel=0.05)
        assert "written as Sum" in result.summary()
    else:
        assert kernels["SkipLayerNormalization"] == 1
    assert result.to_dict()["unfused"]["sums"] == result.unfused.sums


def test_the_analytic_cost_model_times_nothing_and_leaves_the_adds() -> None:
    result = tensat.optimize_with_details(_post_norm(False), cost="analytic", latency_check=0)
    assert result.unfused is None
    assert runtime_ops(result.output)["SkipLayerNormalization"] == 1
