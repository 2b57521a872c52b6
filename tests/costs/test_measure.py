"""The measured cost model: units and their models, the persistent cache (across processes, after damage),
fusion groups, the CLI entry points, the CUDA path (skipped without a GPU). No timing ratios are asserted here;
accuracy and repeatability are measured by bench/cost_report.py."""

from __future__ import annotations

import argparse
import collections
import math
import multiprocessing
import os
import sqlite3
import statistics
import subprocess
import sys
import textwrap
import time
import warnings
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import pytest

import tensat
import tensat.api as api
import tensat.measure.model as measure_model
from tensat import ops
from tensat.cost import (
    FUSED_ACTIVATIONS,
    AnalyticCost,
    Computed,
    Scalar,
    graph_cost,
    graph_layout,
    item_of,
    runtime_cost,
    runtime_kernels,
    with_activation,
)
from tensat.cost_report import (
    cost_report,
    fused_graph_cost,
    group_unit,
    interleaved_end_to_end,
    kernel_unit,
    runtime_nodes,
)
from tensat.errors import TensatError
from tensat.ir import Graph, Node
from tensat.latency import Interleaved, compare_latency, compare_many, time_models
from tensat.measure import (
    ALIGNMENT,
    NCHWC_DOMAIN,
    MeasuredCost,
    Progress,
    Unit,
    cuda_available,
    graph_working_set,
    make_measured_cost,
    pricing_unit,
    reorder_model,
    replicate,
    resolve_device,
    time_rounds,
    unit_model,
)
from tensat.measure.cache import CostCache, CostEntry, default_cache_dir
from tensat.measure.model import _bucket
from tensat.measure_cli import add_cost_report_arguments, add_profile_arguments, run_cost_report, run_profile
from tensat.onnx_io import export_model, save_model
from tensat.session import make_session, nchwc_block, runtime_graph
from tensat.verify import random_inputs, timing_inputs
from tests.helpers import decode_head, make, resize, slow_params, vi

RNG = np.random.default_rng(3)
FAST = 0.03  # seconds of timing per unit: enough to exercise the machinery, not to be accurate


def w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.1).astype(np.float32)


def conv_attrs(k: int = 3, act: int = 0) -> dict:
    p = k // 2
    return dict(strides=(1, 1), pads=(p, p, p, p), dilations=(1, 1), group=1, act=act)


def small_cnn() -> Graph:
    """conv+relu, a residual conv+add+relu, a pool, and an MLP head with matmul+add+tanh."""
    g = Graph()
    x = g.input("x", (1, 8, 8, 8))
    c1 = g.add("relu", [g.add("conv2d", [x, g.weight(w(16, 8, 3, 3)), g.weight(w(16))], **conv_attrs())])
    c2 = g.add("conv2d", [c1, g.weight(w(16, 16, 1, 1)), g.weight(w(16))], **conv_attrs(1))
    r = g.add("relu", [g.add("add", [c2, c1])])
    p = g.add("maxpool", [r], kernel=(2, 2), strides=(2, 2), pads=(0, 0, 0, 0))
    flat = g.reshape(p, (1, 256))
    h = g.add("tanh", [g.add("add", [g.add("matmul", [flat, g.weight(w(256, 32))]), g.weight(w(1, 32))])])
    g.output("y", h)
    return g


def attention() -> Graph:
    """Q @ K^T with both operands transposed views (onnxruntime folds them into FusedMatMul)."""
    g = Graph()
    x = g.input("x", (16, 4, 8))
    q = g.add("transpose", [x], perm=(1, 0, 2))
    k = g.add("transpose", [g.add("relu", [x])], perm=(1, 2, 0))
    g.output("y", g.add("matmul", [q, k]))
    return g


def cost_model(tmp_path, **kw) -> MeasuredCost:
    return MeasuredCost("cpu", cache_path=tmp_path / "costs.sqlite3", progress=False, max_seconds=FAST, **kw)


def items(graph: Graph) -> list[tuple[Node, list[tuple[int, ...]], list[bool]]]:
    const = graph.weight_only()
    return [
        (
            graph.nodes[i],
            [graph.nodes[j].shape for j in graph.nodes[i].inputs],
            [j in const for j in graph.nodes[i].inputs],
        )
        for i in runtime_nodes(graph)
    ]


# -- units and their models ------------------------------------------------------------------------------------


def test_unit_signature_names_op_attrs_shapes_and_weights():
    g = small_cnn()
    a, b = items(g)[0], items(g)[1]
    ua, ub = Unit.single(*a), Unit.single(*b)
    assert ua.signature() == Unit.single(*a).signature()
    assert ua.signature() != ub.signature()
    flipped = Unit.single(a[0], a[1], [False] * len(a[2]))
    assert flipped.signature() != ua.signature() and not flipped.weighted and ua.weighted


def test_a_relu_fused_into_a_convolution_costs_nothing_more(tmp_path) -> None:
    """onnxruntime applies a Relu fused into a Conv inside the convolution's output loop: the fused convolution is
    timed and priced as the plain one (both cost models), so writing the fusion gains nothing, and a prefetch
    measures the one unit."""
    node, shapes, const = items(small_cnn())[0]
    assert node.op == "conv2d" and node.attr["act"] == 0
    fused = with_activation(node, ops.ACT_RELU)
    assert pricing_unit(fused, shapes, const) == pricing_unit(node, shapes, const)
    for cost in (cost_model(tmp_path), AnalyticCost()):
        plain = cost(node, shapes, const)
        assert plain > 0 and cost(fused, shapes, const) == pytest.approx(plain)
    (tmp_path / "fresh").mkdir()
    measured = cost_model(tmp_path / "fresh")
    measured.prefetch([(fused, shapes, const)])
    assert measured.stats.measured == 1


def _conv_then(op: str, **attrs: Any) -> Graph:
    g = Graph()
    x = g.input("x", (1, 16, 28, 28))
    conv = g.add("conv2d", [x, g.weight(w(32, 16, 3, 3)), g.weight(w(32))], **conv_attrs())
    g.output("y", g.add(op, [conv], **attrs))
    return g


@pytest.mark.parametrize(
    ("op", "attrs"), [("sigmoid", {}), ("tanh", {}), ("clip", {"min": 0.0, "max": 6.0}), ("leakyrelu", {"alpha": 0.1})]
)
def test_an_activation_fused_into_a_convolution_is_timed_with_it(op: str, attrs: dict, tmp_path) -> None:
    """onnxruntime applies the other activations it fuses into a Conv in a pass over the output (a Clip's, over a
    large feature map, costs a fifth to a half of the convolution): the graph's kernel is priced as the Conv and the
    activation, timed in a unit onnxruntime runs as the one fused kernel it runs in the graph, and the fused pair
    written as the convolution's activation code prices the same."""
    graph = _conv_then(op, **attrs)
    ((nodes, (node, shapes, const)),) = runtime_kernels(graph)
    assert [graph.nodes[i].op for i in nodes] == ["conv2d", op]
    unit = pricing_unit(node, shapes, const)
    assert unit.ops == ("conv2d", op) if op in ("clip", "leakyrelu") else unit.ops == ("conv2d",)
    assert unit != pricing_unit(*items(_conv_then("relu"))[0])
    ran = collections.Counter(n.op_type for n in runtime_graph(unit_model(unit)).graph.node)
    assert (
        ran[next(iter(ran.keys() & {"Conv", "FusedConv"}))] == 1
        and sum(ran.values()) - ran["ReorderInput"] - ran["ReorderOutput"] == 1
    ), ran
    cost = cost_model(tmp_path)
    assert runtime_cost(graph, cost) == pytest.approx(cost(node, shapes, const))
    if op in FUSED_ACTIVATIONS:  # the pair written as one conv2d: the same unit
        assert (
            pricing_unit(with_activation(items(_conv_then("relu"))[0][0], FUSED_ACTIVATIONS[op]), shapes, const) == unit
        )


def test_one_elementwise_computation_written_two_ways_is_priced_once(tmp_path):
    """A Mul by a weight and its mirror image, and a Mul on 1x64x256 and on 64x256, run the same loop: each pair is
    one unit, so no operand order or leading dimension of 1 looks cheaper by measurement noise alone."""

    def mul(shape, a, b, const):
        return pricing_unit(Node("mul", (), (), shape, "float32"), [a, b], const)

    scaled = mul((1, 64, 256), (1, 64, 256), (1, 1, 1), [False, True])
    assert mul((1, 64, 256), (1, 1, 1), (1, 64, 256), [True, False]) == scaled
    assert mul((64, 256), (64, 256), (1, 1), [False, True]) == scaled
    assert scaled.out_shape == (64, 256)
    product = mul((1, 4, 64, 64), (1, 1, 64, 64), (1, 4, 64, 64), [False, False])
    assert mul((1, 4, 64, 64), (1, 4, 64, 64), (1, 1, 64, 64), [False, False]) == product
    assert product.out_shape == (4, 64, 64)
    assert mul((2, 64, 256), (2, 64, 256), (1, 1, 1), [False, True]) != scaled  # a batch of 2 is other work
    cost = cost_model(tmp_path)
    items = [
        (Node("add", (), (), (1, 8, 16), "float32"), [a, b], c)
        for a, b, c in [
            ((1, 8, 16), (1, 1, 16), [False, True]),
            ((1, 1, 16), (1, 8, 16), [True, False]),
            ((1, 8, 16), (1, 1, 16), [False, True]),
        ]
    ]
    prices = {cost(*item) for item in items}
    assert len(prices) == 1 and cost.stats.measured == 1


def test_a_gather_and_a_where_are_timed_with_the_operand_types_onnx_gives_them(tmp_path):
    """A Gather's indices are integers and a Where's condition boolean whatever the output's type: their units are
    timed with those (`OpDef.operand_dtypes`), where a unit of the output's type for every input would not load in
    onnxruntime and fall back to the analytic estimate (which read a whole embedding table for each lookup)."""
    gather = Node("gather", (), (("axis", 0), ("shape", (1, 64, 256))), (1, 64, 256), "float32")
    where = Node("where", (), (), (1, 1, 64, 64), "float32")
    units = [
        pricing_unit(gather, [(8192, 256), (1, 64)], [True, False]),
        pricing_unit(where, [(1, 1, 64, 64), (1, 1, 1, 1), (1, 1, 1, 1)], [False, True, True]),
    ]
    assert [t for _, _, t in units[0].externals] == ["float32", "int64"]
    assert [t for _, _, t in units[1].externals][0] == "bool" and units[1].dtype == "float32"
    cost = cost_model(tmp_path)
    for unit in units:
        assert cost.unit_cost(unit) > 0 and "fallback" not in cost.detail(unit)
    assert cost.stats.failed == 0 and cost.stats.measured == 2


def test_a_constant_exponent_is_timed_with_its_value(tmp_path):
    """onnxruntime computes Pow by multiplication where the exponent is 2 or 3: a unit timed with a random exponent
    priced an RMSNorm's square at several times its kernel."""
    node = Node("pow", (), (), (64, 256), "float32")
    square, cube = (pricing_unit(node, [(64, 256), (1, 1)], [False, Scalar(v)]) for v in (2.0, 3.0))
    assert square.values == ((1, 2.0),) and square.signature() != cube.signature()
    model = unit_model(square)
    (exponent,) = [onnx.numpy_helper.to_array(t) for t in model.graph.initializer]
    assert exponent.size == 1 and exponent.item() == 2.0
    copies = [onnx.numpy_helper.to_array(t).item() for t in replicate(model, 3).graph.initializer]
    assert copies == [2.0] * 3  # a weight of one value is not made distinct per copy
    cost = cost_model(tmp_path)
    assert cost.unit_cost(square) > 0 and "fallback" not in cost.detail(square)
    plain = pricing_unit(node, [(64, 256), (1, 1)], [False, True])
    assert plain.values == () and '"values"' not in plain.signature()


def test_constant_indices_are_timed_in_range_and_a_mask_op_as_booleans(tmp_path):
    """A GatherND's constant indices drawn at random fell outside a dim of 1 and the unit failed; a logical And
    priced from the e-graph was built on floats. Both fell back to the analytic estimate."""
    gather = Node("gather_nd", (), (("batch_dims", 0), ("shape", (1, 1, 1, 128))), (1, 1, 1, 128), "bool")
    mask = Node("and", (), (), (1, 1, 128, 128), "bool")
    units = [
        pricing_unit(gather, [(1, 128), (1, 1, 1, 128, 2)], [False, True]),
        pricing_unit(mask, [(1, 1, 128, 1), (1, 1, 1, 128)], [False, False]),
    ]
    assert units[0].values == ((1, 0.0),) and units[1].dtype == "bool"
    cost = cost_model(tmp_path)
    for unit in units:
        assert cost.unit_cost(unit) > 0 and "fallback" not in cost.detail(unit)
    assert cost.stats.failed == 0


def test_replicated_unit_model_runs_with_distinct_weights():
    node, shapes, const = items(small_cnn())[0]
    base = unit_model(Unit.single(node, shapes, const))
    model = replicate(base, 3)
    onnx.checker.check_model(model)
    assert [o.name for o in model.graph.output] == ["y__0", "y__1", "y__2"]
    assert [i.name for i in model.graph.input] == ["x0__0", "x0__1", "x0__2"]  # each copy reads its own input
    floats = [onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    assert len(floats) == 6 and not np.array_equal(floats[0], floats[2])
    outs = make_session(model, "cpu", 1).run(None, random_inputs(model))
    assert len(outs) == 3 and all(o.shape == (1, 16, 8, 8) for o in outs)


def test_replicated_resizes_share_their_scales():
    # a copy's weights are scaled to differ from the first's; a Resize's scales are its parameters, not weights, and
    # 2.002 where 2 was written is a scale its linear mode refuses
    g = Graph()
    g.output("y", resize(g, g.input("x", (1, 8, 14, 14)), (28, 28), "linear", "half_pixel"))
    node, shapes, const = items(g)[0]
    model = replicate(unit_model(Unit.single(node, shapes, const)), 3)
    scales = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and t.dims == [4]}
    assert len(scales) == 1
    outs = make_session(model, "cpu", 1).run(None, random_inputs(model))
    assert len(outs) == 3 and all(o.shape == (1, 8, 28, 28) for o in outs)


def test_working_set_counts_each_weight_once_and_every_computed_tensor():
    g = Graph()
    x = g.input("x", (1, 64))
    wt = g.weight(w(64, 64))
    g.output("y", g.add("matmul", [g.add("matmul", [x, wt]), wt]))
    assert graph_working_set(g) == 64 * 64 * 4 + 2 * 64 * 4


def test_working_set_counts_an_embeddings_rows_read_not_its_table():
    # a language model's token embedding: a lookup reads the rows of its tokens; counting the table (8 MiB in the
    # corpus's decoders) priced their matmuls' weights as colder than they run
    g = Graph()
    ids = g.input("ids", (1, 16), "int64")
    table = g.weight(w(4096, 64))
    rows = g.add("gather", [table, ids], axis=0, shape=(1, 16, 64))
    g.output("y", g.add("relu", [rows]))
    assert graph_working_set(g) == 3 * 16 * 64 * 4  # the rows read, and the gather's and the relu's outputs


@pytest.mark.parametrize(("mib", "bucket"), [(0.2, 1), (4, 4), (13.5, 13), (22.5, 23), (29.7, 32), (400, 256)])
def test_working_sets_are_rounded_to_a_quarter_octave(mib: float, bucket: int) -> None:
    assert _bucket(mib * 2**20) == bucket


# -- the cost model ----------------------------------------------------------------------------------------------


def test_measured_costs_are_positive_and_cached_across_instances(tmp_path):
    g = small_cnn()
    first = cost_model(tmp_path)
    first.observe_graph(g)
    total = graph_cost(g, first)
    assert total > 0 and first.stats.measured > 0 and first.stats.failed == 0
    assert all(first(n, s, c) > 0 for n, s, c in items(g))
    again = cost_model(tmp_path)
    again.observe_graph(g)
    assert graph_cost(g, again) == pytest.approx(total)
    assert again.stats.measured == 0 and again.stats.cached == first.stats.measured


def test_weights_and_opaque_ops_are_not_measured(tmp_path):
    cost = cost_model(tmp_path)
    leaf = Node("weight", (), (("name", "w"), ("shape", (4,))), (4,), "float32")
    assert cost(leaf, [], []) == 0.0
    folded = Node("add", (), (), (4,), "float32")
    assert cost(folded, [(4,), (4,)], [True, True]) == 0.0
    opaque = Node(
        "opaque", (), (("key", "Softmax_0"), ("index", 0), ("shape", (4, 4)), ("dtype", "float32")), (4, 4), "float32"
    )
    assert cost(opaque, [(4, 4)], [False]) > 0
    assert cost.stats.analytic == 1 and cost.stats.measured == 0


def test_prefetch_measures_each_signature_once(tmp_path):
    g = small_cnn()
    cost = cost_model(tmp_path)
    listed = items(g)
    cost.prefetch(listed + listed)
    measured = cost.stats.measured
    assert measured == len({Unit.single(*it).signature() for it in listed})
    for it in listed:
        cost(*it)
    assert cost.stats.measured == measured


def test_prefetch_starts_no_window_after_its_deadline_and_resumes_partly_timed_units(tmp_path):
    listed = items(small_cnn())
    late = cost_model(tmp_path)
    left = late.prefetch(listed, deadline=time.perf_counter())
    assert left and late.stats.measured == 0  # every item to measure is left unpriced
    with CostCache(tmp_path / "costs.sqlite3") as cache:
        assert cache.count() == 0

    cost = cost_model(tmp_path)
    deadline = time.perf_counter() + 2.0
    timed, windows = cost._window, []

    def first_window_overruns(plan):
        timed(plan)
        windows.append(plan)
        time.sleep(max(0.0, deadline - time.perf_counter()))

    cost._window = first_window_overruns
    left = cost.prefetch(listed, deadline=deadline)
    assert len(windows) == 1
    assert len(left) == len(set(left)) and 0 < len(left) < len(listed)
    unit = windows[0].unit
    key = cost._key(unit)
    assert cost(*listed[[i for i in range(len(listed)) if i not in left][0]]) > 0
    with CostCache(tmp_path / "costs.sqlite3") as cache:  # priced for this run from its one window, cached as partial
        (entry,) = cache.get_many(cost.fingerprint, {key: unit}).values()
    assert entry.detail["partial"] and len(entry.detail["windows_us"]) == 1  # it wanted two

    full = cost_model(tmp_path)
    timed_full, resumed = full._window, []

    def count(plan):
        if getattr(plan, "unit", None) is not None and full._key(plan.unit) == key:
            resumed.append(len(plan.windows))
        timed_full(plan)

    full._window = count
    assert full.prefetch(listed, deadline=time.perf_counter() + 600.0) == []
    assert full.stats.deferred == set()
    assert resumed in ([1], [1, 2])  # one more window on top of the cached one (and a third if the two disagree)
    assert full.detail(unit)["windows_us"][0] == entry.detail["windows_us"][0] and "partial" not in full.detail(unit)
    again = cost_model(tmp_path)
    again.prefetch(listed)
    assert again.stats.measured == 0 and again.stats.cached > 0


def test_a_deadline_passing_with_little_left_is_extended_once_by_the_grace():
    """What is left is timed where, at the pace so far, it takes at most half of `GRACE_SECONDS`; else it waits."""
    grace = measure_model.GRACE_SECONDS
    now = time.perf_counter()
    until = measure_model._grace_until(1.0, 100, 10)  # 0.1 s left at that pace
    assert until is not None and now + grace <= until <= time.perf_counter() + grace
    assert measure_model._grace_until(1.0, 10, 10) is None  # a second left: deferred
    assert measure_model._grace_until(0.0, 0, 1) is None  # no pace yet: nothing timed before the deadline
    assert measure_model._grace_until(1.0, 10, 0) is None


def test_a_prefetch_whose_deadline_passes_within_the_grace_prices_every_unit(tmp_path, monkeypatch):
    """The first window overruns the deadline: with a grace that covers the rest at that pace, nothing is left
    (with the default, `test_prefetch_starts_no_window_after_its_deadline...`, most of it is)."""
    monkeypatch.setattr(measure_model, "GRACE_SECONDS", 600.0)
    listed = items(small_cnn())
    cost = cost_model(tmp_path)
    deadline = time.perf_counter() + 0.5
    timed, windows = cost._window, []

    def first_window_overruns(plan):
        timed(plan)
        if not windows:
            time.sleep(max(0.0, deadline - time.perf_counter()))
        windows.append(plan)

    cost._window = first_window_overruns
    assert cost.prefetch(listed, deadline=deadline) == []
    assert cost.stats.deferred == set() and len(windows) > 1
    with CostCache(tmp_path / "costs.sqlite3") as cache:
        units = {cost._key(pricing_unit(*it)): pricing_unit(*it) for it in listed}
        found = cache.get_many(cost.fingerprint, units)
    assert found and not any((e.detail or {}).get("partial") for e in found.values())


def test_units_left_unmeasured_at_a_deadline_are_counted_as_deferred_until_measured(tmp_path):
    listed = items(small_cnn())
    cost = cost_model(tmp_path)
    left = cost.prefetch(listed, deadline=time.perf_counter())
    units = {cost._key(pricing_unit(*listed[i])) for i in left}
    assert cost.describe()["stats"]["deferred"] == len(units) > 1  # counted once per unit, not per item
    first = listed[left[0]]
    cost.prefetch([first])
    assert cost.stats.deferred == units - {cost._key(pricing_unit(*first))}  # measured since: no longer deferred
    cost.prefetch(listed, deadline=time.perf_counter() + 600.0)
    assert cost.stats.deferred == set()
    late = cost_model(tmp_path / "late")
    assert late.prefetch(listed, deadline=time.perf_counter())
    cost_model(tmp_path / "late").prefetch(listed)  # another process fills the cache
    assert late.prefetch(listed, deadline=time.perf_counter()) == []  # found there, not measured
    assert late.stats.deferred == set() and late.stats.measured == 0


def test_a_partly_timed_unit_stays_priced_when_the_next_deadline_passes_before_it(tmp_path):
    listed = items(small_cnn())
    cost = cost_model(tmp_path)
    deadline = time.perf_counter() + 2.0
    timed = cost._window

    def first_window_overruns(plan):
        timed(plan)
        time.sleep(max(0.0, deadline - time.perf_counter()))

    cost._window = first_window_overruns
    left = cost.prefetch(listed, deadline=deadline)
    late = cost_model(tmp_path)
    assert late.prefetch(listed, deadline=time.perf_counter()) == left  # the partial unit is priced from the cache
    assert late.stats.measured == 0


def _measure_in_subprocess(cache_dir: str, start: int) -> int:
    """Price a fresh family of matmuls (a different one per process) into the shared cache."""
    cost = MeasuredCost("cpu", cache_path=os.path.join(cache_dir, "costs.sqlite3"), progress=False, max_seconds=0.01)
    nodes = []
    for k in range(start, start + 6):
        node = Node("matmul", (), (), (1, 8 + k), "float32")
        nodes.append((node, [(1, 16), (16, 8 + k)], [False, True]))
    cost.prefetch(nodes)
    return cost.stats.measured


def test_two_processes_fill_one_cache_and_a_third_measures_nothing(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        counts = pool.starmap(_measure_in_subprocess, [(str(tmp_path), 0), (str(tmp_path), 6)])
    assert counts == [6, 6]
    with CostCache(tmp_path / "costs.sqlite3") as cache:
        assert cache.count() >= 12
    assert _measure_in_subprocess(str(tmp_path), 0) == 0
    assert _measure_in_subprocess(str(tmp_path), 6) == 0


@pytest.mark.slow
def test_a_second_optimize_run_in_a_new_process_measures_nothing(tmp_path):
    script = textwrap.dedent(f"""
        import numpy as np, tensat
        from tensat.ir import Graph
        from tensat.measure import MeasuredCost
        import tensat.api as api
        made = []
        def make(name, device="auto", progress=False):
            made.append(MeasuredCost("cpu", cache_path={str(tmp_path / "c.sqlite3")!r}, progress=False,
                                     max_seconds=0.01))
            return made[-1]
        api.make_cost_model = make
        rng = np.random.default_rng(0)
        g = Graph()
        x = g.input("x", (2, 16))
        a = g.add("matmul", [x, g.weight(rng.standard_normal((16, 16)).astype(np.float32))])
        b = g.add("matmul", [x, g.weight(rng.standard_normal((16, 16)).astype(np.float32))])
        g.output("y", g.add("add", [a, b]))
        tensat.optimize_with_details(g, cost="measured", ilp_time_limit=10, time_limit=10, latency_check=0)
        print(made[0].stats.measured)
    """)
    runs = [
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120) for _ in range(2)
    ]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert int(runs[0].stdout.split()[-1]) > 0
    assert int(runs[1].stdout.split()[-1]) == 0


# -- how units are timed -----------------------------------------------------------------------------------------


def _group(graph: Graph, ops: tuple[str, ...]) -> Unit:
    """The unit of the first chain of nodes of `ops`, each the only reader of the one before."""
    readers = graph.readers(runtime_nodes(graph))
    for first in runtime_nodes(graph):
        chain = [first]
        for op in ops[1:]:
            after = readers.get(chain[-1], [])
            if len(after) != 1 or graph.nodes[after[0]].op != op:
                break
            chain.append(after[0])
        if tuple(graph.nodes[i].op for i in chain) == ops:
            return group_unit(graph, chain)
    raise AssertionError(f"no chain {ops}")


def _kernel_units(graph: Graph) -> list[Unit]:
    return [u for k in runtime_kernels(graph) if (u := kernel_unit(k)) is not None]


def _blocked_or_skip(cost: MeasuredCost) -> None:
    if not cost.calibration.block:
        pytest.skip("onnxruntime runs no blocked (NCHWc) layout on this CPU")


def test_blocked_unit_is_timed_without_its_boundary_reorders(tmp_path):
    cost = cost_model(tmp_path)
    _blocked_or_skip(cost)
    block = cost.calibration.block
    unit = _group(small_cnn(), ("conv2d", "relu"))
    model, null = cost._blocked_model(unit)
    assert null is None
    assert not any(n.op_type.startswith("Reorder") for n in model.graph.node)
    assert any(n.domain == NCHWC_DOMAIN and n.op_type == "Conv" for n in model.graph.node)
    out = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert out == [1, -(-16 // block) * block, 8, 8]
    run = cost.runner.bound(cost.runner.session(model))
    run()
    assert run._keep[3][0].shape == tuple(out) and np.abs(run._keep[3][0]).sum() > 0


def test_reorders_are_charged_only_at_tensors_the_graph_holds_blocked(tmp_path):
    g = Graph()
    x = g.input("x", (1, 8, 16, 16))
    conv = g.add("conv2d", [x, g.weight(w(16, 8, 3, 3)), g.weight(w(16))], **conv_attrs())
    fm = g.add("transpose", [conv], perm=(0, 1, 3, 2))
    q = g.input("q", (1, 4, 32, 8))
    kt = g.add("transpose", [q], perm=(0, 1, 3, 2))
    qk = g.add("matmul", [q, kt])
    g.output("y", fm)
    g.output("s", qk)
    cost = cost_model(tmp_path)
    _blocked_or_skip(cost)

    def unit(i: int) -> Unit:
        return pricing_unit(g.nodes[i], [g.nodes[j].shape for j in g.nodes[i].inputs], [False] * 2)

    feature_map, scores = unit(fm), unit(qk)
    # before a graph is observed, any 4-D tensor of aligned channels may be blocked
    assert cost._plan(scores).add_us > 0
    cost.observe_graph(g)
    assert cost.blocked_extents == {(1, 16, 16)}  # the convolution's input and output; not the attention's
    assert cost._plan(feature_map).add_us > 0 and "|nchw=" not in cost._key(feature_map)
    assert cost._plan(scores).add_us == 0 and "|nchw=0,1,-1|" in cost._key(scores) + "|"


def test_a_transpose_between_nhwc_and_a_blocked_tensor_is_priced_as_the_reorder_onnxruntime_folds_it_into(tmp_path):
    # ConvNeXt's and SegFormer's Transposes beside their convolutions: onnxruntime runs no Transpose there, but the
    # reorder into or out of the blocked layout, reading or writing channels last
    g = Graph()
    x = g.input("x", (1, 16, 16, 32))
    nchw = g.add("transpose", [x], perm=(0, 3, 1, 2))
    conv = g.add("conv2d", [nchw, g.weight(w(16, 32, 3, 3)), g.weight(w(16))], **conv_attrs())
    nhwc = g.add("transpose", [conv], perm=(0, 2, 3, 1))
    swapped = g.add("transpose", [conv], perm=(0, 1, 3, 2))
    g.output("y", nhwc)
    g.output("z", swapped)
    cost = cost_model(tmp_path)
    _blocked_or_skip(cost)
    session = make_session(export_model(g).SerializeToString(), "cpu", 1, optimized_path=str(tmp_path / "ran.onnx"))
    assert session is not None
    ran = onnx.load(str(tmp_path / "ran.onnx")).graph.node
    assert [n.op_type for n in ran].count("Transpose") == 1  # only the swap of height and width runs as one
    last = {n.op_type for n in ran for a in n.attribute if a.name == "channels_last" and a.i == 1}
    assert last == {"ReorderInput", "ReorderOutput"}
    cost.observe_graph(g)

    def unit(i: int) -> Unit:
        return pricing_unit(g.nodes[i], [g.nodes[j].shape for j in g.nodes[i].inputs], [False])

    into, out_of = cost._plan(unit(nchw)), cost._plan(unit(nhwc))
    assert isinstance(into, CostEntry) and into.detail["nchwc_reorder"] == "in_nhwc"
    assert isinstance(out_of, CostEntry) and out_of.detail["nchwc_reorder"] == "out_nhwc"
    assert into.ms * 1e3 == pytest.approx(cost._reorder_us("in_nhwc", (1, 32, 16, 16)))
    assert out_of.ms * 1e3 == pytest.approx(cost._reorder_us("out_nhwc", (1, 16, 16, 16)))
    other = cost._plan(unit(swapped))
    assert not isinstance(other, CostEntry) and other.add_us > 0  # timed as a Transpose, plus the reorder out


def _token_grid(entry_nhwc: bool, exit_nhwc: bool) -> Graph:
    """SegFormer's Mix-FFN: tokens (N, H*W, C) read as an image for a depthwise convolution, and back, with each
    side's Transpose of the last two axes as written (False) or as the Transpose between NHWC and NCHW that
    `transpose-reshape-to-nchw` / `reshape-transpose-from-nchw` write (True)."""
    g = Graph()
    tokens = g.input("x", (1, 3136, 64))
    if entry_nhwc:
        image = g.add("transpose", [g.add("reshape", [tokens], shape=(1, 56, 56, 64))], perm=(0, 3, 1, 2))
    else:
        image = g.add("reshape", [g.add("transpose", [tokens], perm=(0, 2, 1))], shape=(1, 64, 56, 56))
    attrs = {**conv_attrs(), "group": 64}
    conv = g.add("conv2d", [image, g.weight(w(64, 1, 3, 3), "w"), g.weight(w(64), "b")], **attrs)
    if exit_nhwc:
        back = g.add("reshape", [g.add("transpose", [conv], perm=(0, 2, 3, 1))], shape=(1, 3136, 64))
    else:
        back = g.add("transpose", [g.add("reshape", [conv], shape=(1, 64, 3136))], perm=(0, 2, 1))
    g.output("y", g.add("add", [back, tokens]))
    return g


def test_a_token_grids_transposes_beside_its_convolution_are_rewritten_into_the_reorders(tmp_path, monkeypatch):
    # The rules offer each side's Transpose as one between NHWC and NCHW, which onnxruntime folds into the blocked
    # convolution's reorder. Whether that is cheaper is the device's to say: the extraction must take the cheapest of
    # the four forms by the measured costs, and onnxruntime must then run no Transpose on a side it rewrote
    monkeypatch.setenv("TENSAT_CACHE_DIR", str(tmp_path / "cache"))
    if not nchwc_block():
        pytest.skip("onnxruntime runs no blocked (NCHWc) layout on this CPU")
    result = tensat.optimize_with_details(_token_grid(False, False), cost="measured", latency_check=0, pre_pass="none")
    chosen = ("transpose-reshape-to-nchw" in result.rules, "reshape-transpose-from-nchw" in result.rules)
    cost = MeasuredCost("cpu", progress=False)  # the run's cost cache: the prices the extraction saw
    priced = {(a, b): runtime_cost(_token_grid(a, b), cost) for a in (False, True) for b in (False, True)}
    assert result.cost_after == pytest.approx(priced[chosen], rel=1e-6)
    assert result.cost_after <= min(priced.values()) * 1.02  # forms within 2% may be ordered apart by the e-graph
    make_session(export_model(result.graph).SerializeToString(), "cpu", 1, optimized_path=str(tmp_path / "ran.onnx"))
    ran = [n.op_type for n in onnx.load(str(tmp_path / "ran.onnx")).graph.node]
    assert ran.count("Transpose") == chosen.count(False)
    assert {"ReorderInput", "ReorderOutput"} <= set(ran)


def test_reorders_read_and_write_channels_last_as_a_transpose_would(tmp_path):
    cost = cost_model(tmp_path)
    _blocked_or_skip(cost)
    block = cost.calibration.block
    x = w(1, 6, 5, 12)  # NHWC, channels not a multiple of the block
    into = make_session(reorder_model("in_nhwc", (1, 12, 6, 5), block).SerializeToString(), "cpu", 1)
    blocked = into.run(None, {"x": x})[0]
    back = make_session(reorder_model("out_nhwc", (1, 12, 6, 5), block).SerializeToString(), "cpu", 1)
    np.testing.assert_array_equal(back.run(None, {"x": blocked})[0], x)
    plain = make_session(reorder_model("in", (1, 12, 6, 5), block).SerializeToString(), "cpu", 1)
    np.testing.assert_array_equal(plain.run(None, {"x": x.transpose(0, 3, 1, 2).copy()})[0], blocked)


def test_residual_add_is_fused_in_place_and_its_prologue_cancels(tmp_path):
    cost = cost_model(tmp_path)
    _blocked_or_skip(cost)
    unit = _group(small_cnn(), ("conv2d", "add", "relu"))
    model, null = cost._blocked_model(unit)
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == 1 and len(convs[0].input) == 4  # the Add is the convolution's Sum input
    assert [n.op_type for n in null.graph.node] == ["MaxPool", "MaxPool"]  # the prologue pool and the sampling
    assert [[d.dim_value for d in o.type.tensor_type.shape.dim][2:] for o in model.graph.output] == [[1, 1]]
    for m in (model, null):
        cost.runner.bound(cost.runner.session(m))()
    plan = cost._plan(unit)
    assert plan.null_model is not None and plan.blocked
    entry = cost._measure(unit)
    assert entry.ms > 0 and entry.detail["nchwc"]


def test_a_batchnorm_on_a_blocked_input_is_timed_as_the_blocked_conv_onnxruntime_runs_it(tmp_path):
    # DenseNet's BatchNormalization before a convolution: from a blocked producer onnxruntime runs it as a blocked
    # Conv; from a graph input it would run plain BatchNormalization between two reorders
    cost = cost_model(tmp_path)
    _blocked_or_skip(cost)
    g = Graph()
    x = g.input("x", (1, 32, 14, 14))
    c = g.add("conv2d", [x, g.weight(w(32, 32, 1, 1)), g.weight(w(32))], **conv_attrs(1))
    bn = g.add("batchnorm", [c, *(g.weight(w(32)) for _ in range(3)), g.weight(np.abs(w(32)) + 1)], epsilon=1e-5)
    g.output("y", g.add("conv2d", [bn, g.weight(w(32, 32, 1, 1)), g.weight(w(32))], **conv_attrs(1)))
    cost.observe_graph(g)
    unit = pricing_unit(g.nodes[bn], [g.nodes[j].shape for j in g.nodes[bn].inputs], [False] + [True] * 4)
    model, null = cost._blocked_model(unit)
    assert [(n.op_type, n.domain) for n in model.graph.node][:2] == [("MaxPool", NCHWC_DOMAIN), ("Conv", NCHWC_DOMAIN)]
    assert [n.op_type for n in null.graph.node] == ["MaxPool", "MaxPool"]  # the prologue pool and the sampling
    plan = cost._plan(unit)
    assert plan.blocked and plan.add_us == 0  # no reorders charged around it
    assert cost._measure(unit).detail["nchwc"]


@pytest.mark.parametrize("after_conv", [True, False])
def test_a_resize_by_whole_scales_on_a_blocked_input_is_timed_as_the_blocked_upsample_onnxruntime_runs(
    tmp_path, after_conv
):
    # DPT's bilinear upsampling after a convolution: onnxruntime runs it as a blocked Upsample, taking and giving
    # blocked tensors; from a graph input it would run plain Resize, priced with the reorders around it. Where the
    # graph holds no tensor of its extent blocked (a token grid reshaped to an image), it stays plain
    cost = cost_model(tmp_path)
    _blocked_or_skip(cost)
    g = Graph()
    x = g.input("x", (1, 32, 14, 14))
    if after_conv:
        x = g.add("conv2d", [x, g.weight(w(32, 32, 1, 1)), g.weight(w(32))], **conv_attrs(1))
    up = g.add("resize", [x], size=(28, 28), mode=1, transform=ops.RESIZE_TRANSFORMS.index("align_corners"), nearest=2)
    g.output("y", g.add("conv2d", [up, g.weight(w(32, 32, 1, 1)), g.weight(w(32))], **conv_attrs(1)))
    cost.observe_graph(g)
    unit = pricing_unit(g.nodes[up], [g.nodes[x].shape], [False])
    plan = cost._plan(unit)
    if not after_conv:
        assert cost._blocked_model(unit) is None and not plan.blocked and plan.add_us > 0
        return
    model, null = cost._blocked_model(unit)
    assert [(n.op_type, n.domain) for n in model.graph.node][:2] == [
        ("MaxPool", NCHWC_DOMAIN),
        ("Upsample", NCHWC_DOMAIN),
    ]
    assert [n.op_type for n in null.graph.node] == ["MaxPool", "MaxPool"]  # the prologue pool and the sampling
    assert plan.blocked and plan.add_us == 0  # no reorders charged around it
    assert cost._measure(unit).detail["nchwc"]


@pytest.mark.parametrize(
    "mode,transform,nearest,size",
    [
        ("linear", "half_pixel", "floor", (28, 28)),
        ("linear", "align_corners", "floor", (56, 56)),
        ("linear", "asymmetric", "floor", (14, 28)),
        ("linear", "pytorch_half_pixel", "floor", (28, 28)),
        ("linear", "half_pixel", "floor", (21, 21)),
        ("linear", "half_pixel", "floor", (7, 7)),
        ("nearest", "asymmetric", "floor", (28, 28)),
        ("nearest", "asymmetric", "round_prefer_floor", (28, 28)),
        ("nearest", "half_pixel", "floor", (28, 28)),
    ],
)
def test_the_resizes_tensat_holds_blocked_are_those_onnxruntime_runs_as_its_blocked_upsample(
    tmp_path, mode, transform, nearest, size
):
    # onnxruntime's NchwcTransformer takes a Resize after a convolution into the blocked layout only by whole scales,
    # linear but for pytorch_half_pixel, or nearest with the asymmetric transformation rounding down
    if not nchwc_block():
        pytest.skip("onnxruntime runs no blocked (NCHWc) layout on this CPU")
    g = Graph()
    c = g.add("conv2d", [g.input("x", (1, 16, 14, 14)), g.weight(w(32, 16, 1, 1)), g.weight(w(32))], **conv_attrs(1))
    up = resize(g, c, size, mode, transform, nearest)
    g.output("y", g.add("conv2d", [up, g.weight(w(32, 32, 1, 1)), g.weight(w(32))], **conv_attrs(1)))
    path = tmp_path / "ran.onnx"
    make_session(export_model(g).SerializeToString(), "cpu", 1, optimized_path=str(path))
    ran = {(n.domain, n.op_type) for n in onnx.load(str(path)).graph.node}
    assert ((NCHWC_DOMAIN, "Upsample") in ran) == (up in graph_layout(g, "cpu"))


def _binary_between_convolutions(op: str, operand: str) -> tuple[Graph, int, int]:
    """A convolution's output combined by `op` with `operand` (a channel scale a squeeze-and-excitation computes,
    a second convolution's output of the same shape, or a scalar), then convolved again: the graph, the binary
    node, and the convolution after it."""
    g = Graph()
    x = g.input("x", (1, 32, 14, 14))
    a = g.add("conv2d", [x, g.weight(w(32, 32, 1, 1)), g.weight(w(32))], **conv_attrs(1))
    if operand == "scale":
        pooled = g.add("globalavgpool", [a])
        squeezed = g.add("conv2d", [pooled, g.weight(w(16, 32, 1, 1)), g.weight(w(16))], **conv_attrs(1))
        b = g.add("sigmoid", [g.add("conv2d", [squeezed, g.weight(w(32, 16, 1, 1)), g.weight(w(32))], **conv_attrs(1))])
    elif operand == "same":
        b = g.add("conv2d", [x, g.weight(w(32, 32, 1, 1)), g.weight(w(32))], **conv_attrs(1))
    else:
        b = g.weight(np.array(2.0, np.float32))
    combined = g.add(op, [a, b])
    after = g.add("conv2d", [combined, g.weight(w(32, 32, 1, 1)), g.weight(w(32))], **conv_attrs(1))
    g.output("y", after)
    return g, combined, after


@pytest.mark.parametrize(
    "op,operand",
    [("mul", "scale"), ("mul", "same"), ("add", "scale"), ("add", "scalar"), ("sub", "same"), ("div", "same")],
)
def test_the_binary_ops_tensat_holds_blocked_are_those_onnxruntime_runs_without_reorders(tmp_path, op, operand):
    # onnxruntime keeps an Add of blocked tensors, and a Mul of two of one shape, in the blocked layout; a channel
    # scale, a Sub, a Div or an operand that is a constant takes it out, with a reorder out at each blocked operand
    if not nchwc_block():
        pytest.skip("onnxruntime runs no blocked (NCHWc) layout on this CPU")
    g, combined, _ = _binary_between_convolutions(op, operand)
    path = tmp_path / "ran.onnx"
    make_session(export_model(g).SerializeToString(), "cpu", 1, optimized_path=str(path))
    ran = onnx.load(str(path)).graph.node
    reordered = {o for n in ran if n.op_type == "ReorderOutput" for o in n.output}
    (node,) = [n for n in ran if n.op_type == ops.get(op).onnx]
    assert (not reordered & set(node.input)) == (combined in graph_layout(g, "cpu"))


def test_a_channel_scale_between_blocked_convolutions_is_charged_its_reorders(tmp_path):
    # a squeeze-and-excitation's Mul runs in NCHW: out of the layout at both operands, back into it for the next
    # convolution. A Mul of two tensors of one shape runs blocked, and is charged none, as is one by a constant
    cost = cost_model(tmp_path)
    _blocked_or_skip(cost)
    for operand, charged in (("scale", True), ("same", False)):
        g, combined, _ = _binary_between_convolutions("mul", operand)
        cost.observe_graph(g)
        kernels = {members[0]: item for members, item in runtime_kernels(g)}
        node, shapes, flags = kernels[combined]
        assert flags == [Computed(True), Computed(True)]
        unit = pricing_unit(node, shapes, flags)
        plan = cost._plan(unit)
        reorders = sum(cost._reorder_us("out", s) for s in shapes) + cost._reorder_us("in", node.shape)
        assert plan.add_us == (pytest.approx(reorders) if charged else 0.0)
        plain = pricing_unit(node, shapes, [Computed(False), Computed(False)])
        assert cost._plan(plain).add_us == 0.0 and cost._key(plain) != cost._key(unit)
    g, combined, _ = _binary_between_convolutions("mul", "scalar")  # one onnxruntime folds into the convolution
    kernels = {members[0]: item for members, item in runtime_kernels(g)}
    assert cost._plan(pricing_unit(*kernels[combined])).add_us == 0.0


def test_a_resize_of_a_token_grid_is_priced_in_nchw_beside_feature_maps_of_its_extent(tmp_path):
    # by extent alone, the token grid's Resize would be timed as the blocked Upsample its neighbour runs (a fourth
    # of its time in NCHW); the graph's layout, carried by each operand, tells them apart
    cost = cost_model(tmp_path)
    _blocked_or_skip(cost)
    g, of_grid, of_conv = decode_head()
    cost.observe_graph(g)
    kernels = {members[0]: item for members, item in runtime_kernels(g)}
    assert kernels[of_grid][2] == [Computed(False)] and kernels[of_conv][2] == [Computed(True)]
    plain, blocked = (pricing_unit(*kernels[i]) for i in (of_grid, of_conv))
    assert cost._blocked_model(plain) is None and "|nchw=0|" in cost._key(plain) + "|"
    assert not cost._plan(plain).blocked
    assert cost._plan(blocked).blocked and "|nchw=" not in cost._key(blocked)
    unknown = pricing_unit(kernels[of_grid][0], kernels[of_grid][1], [False])
    assert cost._plan(unknown).blocked  # the estimate by extent, where no layout is known
    in_nchw, in_blocked = cost._measure(plain), cost._measure(blocked)
    assert "fallback" not in in_nchw.detail and in_nchw.detail["copies"] > 1  # its scales shared by the copies
    assert in_nchw.ms > in_blocked.ms


def test_weights_are_evicted_only_where_the_copies_do_not_span_the_working_set(tmp_path):
    cost = cost_model(tmp_path, working_set=8 * 2**20)
    assert cost.evict_bytes(0, 4) == 0
    assert cost.evict_bytes(2**20, 3) == 5 * 2**20
    assert cost.evict_bytes(2**20, 8) == 0
    assert cost.evict_bytes(4, 1) == 0  # one cache line of weights (a scalar) is not worth the eviction
    order: list[str] = []
    timing = time_rounds(
        [lambda: order.append("a"), lambda: order.append("b")],
        lambda t: t[0] - t[1],
        min_rounds=5,
        max_rounds=5,
        warmup=0,
        before=lambda: order.append("before"),
    )
    assert timing.rounds == 5
    assert order[::2] == ["before"] * 10 and sorted(order[1::2]) == ["a"] * 5 + ["b"] * 5


def test_outputs_places_every_unit_without_weights_outputs_in_the_last_level_cache_or_out_of_every_cache(tmp_path):
    """`outputs` (the `bench.cold_outputs` experiment) times a unit without weights with its output buffers pushed out
    of the core's level-2 cache ("llc": twice that cache streamed) or out of every cache ("cold", as a Transpose is
    timed), only its input read again, and caches it under its own key; a unit whose weights stream through the
    caches is timed as before. A place it does not know is refused."""
    g = Graph()
    x = g.input("x", (1, 64, 256))
    s = g.add("add", [x, x])
    y = g.add("matmul", [s, g.weight(w(256, 512))])
    g.output("y", y)
    units = {
        i: pricing_unit(g.nodes[i], [g.nodes[j].shape for j in g.nodes[i].inputs], [False, i == y]) for i in (s, y)
    }
    warm = cost_model(tmp_path / "warm", outputs="warm")
    llc, cold = cost_model(tmp_path / "llc", outputs="llc"), cost_model(tmp_path / "cold", outputs="cold")
    assert units[y].weighted and not units[s].weighted
    assert warm._plan(units[s]).output_place == "warm" and warm._plan(units[s]).evict_bytes == 0
    plan = cold._plan(units[s])
    assert plan.output_place == "cold" and plan.evict_bytes == cold.runner.evict_cap
    near = llc.runner.near_cache
    assert llc._plan(units[s]).output_place == "llc"
    assert llc._plan(units[s]).evict_bytes == (2 * near if near else 0) < cold.runner.evict_cap
    assert len({m._key(units[s]) for m in (warm, llc, cold)}) == 3
    for m in (llc, cold):
        assert m._plan(units[y]).output_place == "warm" and m._key(units[y]) == warm._key(units[y])
    assert cold._measure(units[s]).detail["outputs"] == "cold"
    assert llc._measure(units[s]).detail["outputs"] == "llc"
    assert cold.uncached(windows=1)._plan(units[s]).output_place == "cold"
    with pytest.raises(TensatError, match="outputs must be one of warm, llc, cold"):
        cost_model(tmp_path / "bad", outputs="hot")


def test_a_transpose_is_timed_writing_to_buffers_out_of_the_caches(tmp_path, monkeypatch):
    """A Transpose's strided stores go, inside a graph, to a recycled buffer last used long before: its unit is timed
    with the whole cache evicted and only its input read again (`OpDef.cold_output`). A MatMul of activations, and a
    unit where a Transpose is only part of the kernel, keep their outputs warm and evict nothing where the others
    are warm (`outputs="warm"`)."""
    cost = cost_model(tmp_path, outputs="warm")
    g = Graph()
    q = g.input("q", (1, 4, 32, 8))
    kt = g.add("transpose", [q], perm=(0, 1, 3, 2))
    qk = g.add("matmul", [q, kt])
    g.output("s", qk)

    def unit(i: int) -> Unit:
        return pricing_unit(g.nodes[i], [g.nodes[j].shape for j in g.nodes[i].inputs], [False] * 2)

    transpose, product = cost._plan(unit(kt)), cost._plan(unit(qk))
    assert transpose.output_place == "cold" and transpose.evict_bytes == cost.runner.evict_cap
    assert product.output_place == "warm" and product.evict_bytes == 0
    assert cost._plan(_group(g, ("transpose", "matmul"))).output_place == "warm"
    seen: list[tuple[int, bool]] = []
    cold_weights = cost.runner.cold_weights
    monkeypatch.setattr(
        cost.runner,
        "cold_weights",
        lambda run, nbytes, warm_outputs=True: (
            seen.append((nbytes, warm_outputs)) or cold_weights(run, nbytes, warm_outputs)
        ),
    )
    entry = cost._measure(unit(kt))
    assert entry.ms > 0 and entry.detail["outputs"] == "cold"
    assert seen and all(s == (cost.runner.evict_cap, False) for s in seen)


def test_bound_buffers_are_aligned_and_receive_the_outputs(tmp_path):
    cost = cost_model(tmp_path)
    model = export_model(small_cnn())
    sess = cost.runner.session(model)
    run = cost.runner.bound(sess)
    run()
    inputs, outputs = run._keep[0], run._keep[3]
    assert all(a.ctypes.data % ALIGNMENT == 0 for a in inputs + outputs)
    expected = sess.run(None, {sess.get_inputs()[0].name: inputs[0]})[0]
    np.testing.assert_allclose(outputs[0], expected, rtol=1e-5, atol=1e-6)
    before = cost.runner.cold_weights(run, 2**20)
    assert before is not None and cost.runner.cold_weights(run, 0) is None
    before()
    np.testing.assert_allclose(outputs[0], expected, rtol=1e-5, atol=1e-6)


def test_windows_and_the_between_hook(tmp_path):
    g = small_cnn()
    cost = cost_model(tmp_path, windows=3)
    cost.observe_graph(g)
    units = {u.signature(): u for u in _kernel_units(g) if u.ops != ("reshape",)}
    calls = []
    cost.prefetch_units(units.values(), between=lambda: calls.append(1))
    assert len(calls) == 3 * len(units)
    assert all(len(cost.detail(u)["windows_us"]) == 3 for u in units.values())
    with pytest.raises(TensatError):
        cost_model(tmp_path, windows=0)


def test_end_to_end_runs_are_interleaved_with_the_measuring(tmp_path):
    g = small_cnn()
    cost = cost_model(tmp_path)
    cost.observe_graph(g)
    units = _kernel_units(g)
    pricing = cost.uncached(windows=2, max_seconds=0.02)
    windows: list[int] = []
    timing_window = pricing._window

    def counted(plan):
        timing_window(plan)
        windows.append(1)

    pricing._window = counted
    turns: list[int] = []
    original = Interleaved.turn

    def counting(self, size=None):
        turns.append(len(windows))
        original(self, size)

    Interleaved.turn = counting
    try:
        stats = interleaved_end_to_end([export_model(g)], pricing, units, runs=2, block=2)
    finally:
        Interleaved.turn = original
    assert stats[0].runs >= 2 and len(turns) >= 2
    assert 1 <= turns[0] < len(windows)  # end-to-end runs began after the first window, long before the last


def test_interleaved_turns_count_runs_per_model():
    models = [export_model(small_cnn()), export_model(attention())]
    with pytest.raises(ValueError):
        Interleaved(models[:1], clock="cpu", threads=2)
    timed = Interleaved(models[:1] * 2, block=3, warmup=0)
    timed.turn()
    timed.turn(1)
    assert timed.runs == 4 and [len(s) for s in timed.samples] == [4, 4] and timed.seconds > 0
    assert all(s.runs == 4 for s in timed.stats())


def _masked_lookup() -> onnx.ModelProto:
    """Token ids looked up in a table, scaled by an attention mask, as a transformer reads its two integer inputs."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "axis"], ["mu"]),
        helper.make_node("Mul", ["emb", "mu"], ["y"]),
    ]
    ints = [vi(n, [1, 16], TensorProto.INT64) for n in ("input_ids", "attention_mask")]
    inits = [numpy_helper.from_array(w(4, 8), "table"), numpy_helper.from_array(np.array([-1], np.int64), "axis")]
    return make(nodes, ints, [vi("y", [1, 16, 8])], inits)


def test_the_end_to_end_timing_feeds_an_unpadded_batch() -> None:
    """Timed end to end, a model's integer inputs are ones (token ids of 1, an attention mask of ones), as an
    unpadded batch runs; verification draws zeros and ones, which test what the mask computes."""
    model = _masked_lookup()
    timed = Interleaved([model, model], warmup=0)
    assert set(timed.feeds) == {"input_ids", "attention_mask"}
    assert all(v.dtype == np.int64 and (v == 1).all() for v in timed.feeds.values())
    drawn = random_inputs(model)
    assert all(set(np.unique(v)) == {0, 1} for v in drawn.values())
    assert all(np.array_equal(timing_inputs(model, 3)[k], v) for k, v in timed.feeds.items())


def test_fresh_cost_report_notes_how_it_was_taken(tmp_path):
    g = small_cnn()
    report = cost_report(g, cost_model(tmp_path), runs=4, block=2, windows=2, window_seconds=0.01)
    assert any("afresh" in n for n in report.notes) and report.rows[0].summed_ms > 0
    assert report.latency[0].runs >= 4 and math.isfinite(report.rows[0].per_node_ms)
    cached = cost_report(g, cost_model(tmp_path), runs=4, block=2, fresh=False, per_node=False)
    assert not any("afresh" in n for n in cached.notes) and math.isnan(cached.rows[0].per_node_ms)


@pytest.mark.parametrize("fresh", [True, False])
def test_cost_report_times_each_graph_in_its_sessions_in_turns(tmp_path, monkeypatch, fresh):
    used: list[tuple[int, int]] = []  # (sessions of each model, the session set a turn ran), calibration's too

    class Recording(Interleaved):
        def turn(self, size=None):
            used.append((len(self.copies), (self._turns // 2) % len(self.copies)))
            super().turn(size)

    monkeypatch.setattr("tensat.cost_report.Interleaved", Recording)
    monkeypatch.setattr("tensat.latency.Interleaved", Recording)
    report = cost_report(
        small_cnn(), cost_model(tmp_path), runs=12, block=2, windows=1, window_seconds=0.01, fresh=fresh, sessions=3
    )
    assert report.latency[0].runs >= 12
    assert {k for n, k in used if n == 3} == {0, 1, 2}


# -- the end-to-end latency check ----------------------------------------------------------------------------------


def relu_chain(length: int) -> Graph:
    """relu applied `length` times to a small input: the same function for every length, slower the longer."""
    g = Graph()
    y = g.input("x", (1, 64))
    for _ in range(length):
        y = g.add("relu", [y])
    g.output("y", y)
    return g


def test_compare_latency_tells_the_slower_model():
    fast, slow = export_model(relu_chain(1)), export_model(relu_chain(300))
    slower = compare_latency(fast, slow, max_seconds=2.0)
    assert slower.speedup < 1 and slower.measurably_slower and slower.candidate_ms > slower.baseline_ms
    assert slower.interval[0] <= slower.speedup <= slower.interval[1]
    assert 5 <= slower.pairs <= 40 and 1 <= slower.block <= 10
    faster = compare_latency(slow, fast, max_seconds=2.0, clock="cpu")
    assert faster.speedup > 1 and not faster.measurably_slower
    assert set(faster.to_dict()) == {"baseline_ms", "candidate_ms", "speedup", "interval", "pairs", "block", "seconds"}
    futile = compare_latency(fast, slow, max_seconds=30.0, futile_after=6)
    assert futile.pairs == 6 and futile.speedup < 1  # no gain after 6 pairs: the timing stops
    gaining = compare_latency(slow, fast, max_seconds=30.0, pairs=12, futile_after=6)
    assert gaining.pairs == 12 and gaining.speedup > 1  # a gain is timed to the end


def test_eviction_streams_twice_the_last_level_cache_within_its_bounds():
    from tensat.measure.timing import EVICT_CAP, EVICT_FLOOR, Runner, evict_cap, last_level_cache

    assert evict_cap(48 * 2**20) == 96 * 2**20
    assert evict_cap(4 * 2**20) == EVICT_FLOOR and evict_cap(512 * 2**20) == EVICT_CAP
    assert evict_cap(None) == EVICT_CAP  # unknown: stream the most
    found = last_level_cache()
    assert found is None or found > 0
    assert Runner("cpu", 1).evict_cap == evict_cap(found)


def test_a_unit_s_weights_are_cooled_by_at_most_half_the_last_level_cache(tmp_path, monkeypatch):
    """A unit with weights evicts the rest of a large working set only up to the runner's cap, half the last-level
    cache; a unit whose output is timed cold still streams the whole eviction."""
    from tensat.measure.timing import EVICT_CAP, Runner, weight_evict_cap

    assert weight_evict_cap(32 * 2**20) == 16 * 2**20 and weight_evict_cap(1024 * 2**20) == EVICT_CAP
    assert weight_evict_cap(None) == EVICT_CAP
    monkeypatch.setattr("tensat.measure.timing.last_level_cache", lambda: 12 * 2**20)
    assert Runner("cpu", 1).weight_evict_cap == 6 * 2**20
    cost = cost_model(tmp_path, working_set=256 * 2**20)
    g = Graph()
    x = g.input("x", (1, 64, 28, 28))
    k, b = g.weight(w(64, 64, 1, 1)), g.weight(w(64))
    y = g.add("conv2d", [x, k, b], **conv_attrs(1))
    g.output("y", y)
    plan = cost._plan(pricing_unit(g.nodes[y], [g.nodes[j].shape for j in (x, k, b)], [False, True, True]))
    rest = 256 * 2**20 - plan.copies * plan.unit.weight_bytes()
    assert plan.evict_bytes == min(cost.runner.weight_evict_cap, rest) > 0
    monkeypatch.setattr(cost.runner, "weight_evict_cap", 2**20)
    assert cost._plan(plan.unit).evict_bytes == 2**20


def test_a_calibration_is_read_back_as_stored_and_measured_again_where_a_field_is_missing(tmp_path):
    from tensat.measure.timing import Calibration

    cost = cost_model(tmp_path)
    cal = cost.calibration
    assert Calibration.from_dict(cal.to_dict()) == cal
    assert Calibration.from_dict({"node_us": 0.3, "run_us": 9.0}) is None
    cost.cache.put_device(cost.fingerprint, cost.info, {"node_us": 0.3, "run_us": 9.0})
    again = cost_model(tmp_path)
    assert again.calibration.block == cal.block
    assert "block" in again.cache.device(again.fingerprint)[1]


def _ratios_timed(ratios: list[float]) -> SimpleNamespace:
    """An `Interleaved`'s samples whose block ratios (baseline over candidate, one run a block) are `ratios`."""
    return SimpleNamespace(samples=[list(ratios), [1.0] * len(ratios)], block=1)


def test_timing_stops_as_futile_only_where_its_interval_rules_out_a_gain():
    from tensat.latency import FUTILE_HIGH, _futile

    no_gain = [0.97, 0.99, 1.0, 0.98, 1.01, 0.99, 1.0, 0.98, 0.99, 1.0]
    assert _futile(_ratios_timed(no_gain))
    burst = [0.9, 0.95, 0.97, 0.99, 1.2, 1.25, 0.93, 1.3, 0.96, 1.15]  # median below 1, interval up to 1.2
    assert statistics.median(burst) <= 1.0 and _futile(_ratios_timed(burst)) is False
    assert not _futile(_ratios_timed([x + 0.05 for x in no_gain]))  # a median gain is timed on
    assert _futile(_ratios_timed([x + 0.005 for x in no_gain]))  # a gain within the timing's resolution is not ...
    small_gain = [x + 0.015 for x in no_gain]  # median 1.005: timed on only by a caller that keeps any gain
    assert _futile(_ratios_timed(small_gain)) and not _futile(_ratios_timed(small_gain), keep_above=1.0)
    assert FUTILE_HIGH > 1.0


def test_a_candidate_is_undecided_while_it_looks_faster_and_is_not_yet_measurably():
    from tensat.latency import RESOLUTION, _undecided

    open_gain = [*np.linspace(0.92, 1.0, 20), *np.linspace(1.03, 1.12, 21)]  # median 1.03, interval reaching below 1
    assert statistics.median(open_gain) > 1 + RESOLUTION and _undecided(_ratios_timed(open_gain))
    assert not _undecided(_ratios_timed([1.1 + 0.001 * k for k in range(40)]))  # measurably faster: decided
    assert not _undecided(_ratios_timed(list(np.linspace(0.9, 1.08, 40))))  # no gain in the median ...
    assert _undecided(_ratios_timed(list(np.linspace(0.9, 1.12, 40))), keep_above=1.0)  # ... but some above 1
    assert not _undecided(_ratios_timed([1.005 + 0.0001 * k for k in range(40)]), keep_above=1.0)  # decided above 1


def test_whether_a_candidate_is_timed_on_follows_the_interval_its_verdict_gives():
    """At the cap of pairs, a candidate is timed on where the verdict's own interval (its draws, its seed) leaves
    it open: one of fewer draws could put its low end above the keep line where the verdict's is below it, and the
    candidate, faster in the median, was then neither timed on nor kept."""
    from tensat.latency import _undecided, median_interval

    rng = np.random.default_rng(0)
    for _ in range(200):
        ratios = list(1.05 + 0.06 * rng.standard_normal(40))
        quick, verdict = median_interval(ratios, draws=400)[0], median_interval(ratios)[0]
        if verdict < quick:
            break
    else:
        pytest.fail("no sample whose quick interval ends above the verdict's")
    keep = (quick + verdict) / 2
    assert statistics.median(ratios) > keep
    assert _undecided(_ratios_timed(ratios), keep_above=keep)
    for seed in (1, 2):
        low = median_interval(ratios, seed)[0]
        assert _undecided(_ratios_timed(ratios), keep_above=low + 1e-9, seed=seed)
        assert not _undecided(_ratios_timed(ratios), keep_above=low - 1e-9, seed=seed)


def test_a_candidate_faster_beyond_doubt_is_decided():
    from tensat.latency import _decided

    clear = [1.4 + 0.01 * (k % 5) for k in range(10)]
    assert _decided(_ratios_timed(clear), 1.06)
    assert not _decided(_ratios_timed([1.05 + 0.01 * (k % 5) for k in range(10)]), 1.06)
    assert not _decided(_ratios_timed([0.8, 1.5, 0.9, 1.6, 1.0, 1.4, 0.85, 1.55, 0.95, 1.45]), 1.06)  # a wide spread


def test_a_clearly_faster_candidate_stops_being_timed_once_decided():
    fast, slow = export_model(relu_chain(1)), export_model(relu_chain(300))
    decided = compare_latency(slow, fast, max_seconds=30.0, pairs=30, futile_after=6, decided_above=1.5)
    assert decided.pairs == 6 and decided.interval[0] > 1.5
    timed_on = compare_latency(slow, fast, max_seconds=30.0, pairs=12, futile_after=6)
    assert timed_on.pairs == 12  # without `decided_above`, a gain is timed to the end


def test_an_undecided_candidate_is_timed_on_to_the_extended_pairs_and_a_decided_one_is_not(monkeypatch):
    import tensat.latency as latency

    fast, slow = export_model(relu_chain(1)), export_model(relu_chain(300))
    decided = compare_latency(slow, fast, max_seconds=30.0, pairs=8, extend_to=20)
    assert decided.pairs == 8 and decided.interval[0] > 1 + latency.RESOLUTION
    monkeypatch.setattr(latency, "_undecided", lambda timed, keep_above, seed: True)
    extended = compare_latency(slow, fast, max_seconds=30.0, pairs=8, extend_to=20)
    assert extended.pairs == 20
    cut = compare_latency(slow, fast, max_seconds=30.0, pairs=8, extend_to=20, extend_seconds=0.0)
    assert cut.pairs == 9  # the extension's seconds were spent before it began: one turn more, then it stops
    assert compare_latency(slow, fast, max_seconds=30.0, pairs=8).pairs == 8  # no extension asked for


def _check_a_clear_gain(monkeypatch, budget: float) -> tuple[api.LatencyCheck | None, list[dict]]:
    """The end-to-end check of a model 300 times shorter against the longer one, with the keyword arguments it
    timed each thread count with."""
    calls: list[dict] = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return compare_latency(*args, **kwargs)

    monkeypatch.setattr(api, "compare_latency", spy)
    fast, slow = export_model(relu_chain(1)), export_model(relu_chain(300))
    return api._end_to_end_check(slow, fast, "cpu", api.Options(latency_check=budget), api.RunLog()), calls


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one thread count to time at")
def test_every_thread_count_is_timed_against_the_resolution(monkeypatch):
    """The keep rule (`api.measurably_faster`) asks for a gain beyond the timing's resolution at every thread count,
    so the check's futility stop and extension use that bar at each one."""
    check, calls = _check_a_clear_gain(monkeypatch, 20.0)
    assert check is not None and check.kept and list(check.by_threads) == list(api.check_threads())
    assert [c["keep_above"] for c in calls] == [1.0 + api.LATENCY_RESOLUTION] * len(api.check_threads())


def test_a_gain_within_the_resolution_at_one_thread_count_keeps_the_input():
    """A clear gain at one thread count does not make up for a gain within the resolution at another: the user may
    run at either."""
    beyond, within = 1.0 + 2 * api.LATENCY_RESOLUTION, 1.0 + api.LATENCY_RESOLUTION / 2
    assert api.measurably_faster([beyond, beyond])
    assert not api.measurably_faster([beyond, within]) and not api.measurably_faster([within, beyond])
    assert not api.measurably_faster([beyond, 0.99]) and not api.measurably_faster([])


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one thread count to time at")
def test_a_thread_count_decided_early_leaves_its_seconds_to_the_next(monkeypatch):
    """A gain beyond doubt stops the first thread count's timing after a few pairs; the next thread count may use
    what is left of the check's seconds, not only its equal part."""
    budget, counts = 20.0, len(api.check_threads())
    check, calls = _check_a_clear_gain(monkeypatch, budget)
    seconds = [c["max_seconds"] for c in calls]
    assert check is not None and check.kept and len(seconds) == counts
    assert seconds[0] == budget / counts and seconds[1] > budget / counts
    assert sum(c.seconds for c in check.by_threads.values()) < budget


def test_multi_threaded_interleaved_sessions_do_not_spin_between_runs():
    model = export_model(relu_chain(2))
    entry = "session.intra_op.allow_spinning"
    assert make_session(model, threads=2, spinning=False).get_session_options().get_session_config_entry(entry) == "0"
    timed = Interleaved([model, model], threads=2)
    assert all(s.get_session_options().get_session_config_entry(entry) == "0" for s in timed.sessions)
    single = Interleaved([model, model], threads=1)
    for s in single.sessions:  # one thread per session: onnxruntime's default, spinning
        with pytest.raises(RuntimeError):
            s.get_session_options().get_session_config_entry(entry)


def test_verification_and_the_check_at_one_thread_open_one_session_per_model(monkeypatch):
    import tensat.latency as latency
    import tensat.session as session_mod
    from tensat.session import Serialized, shared_session
    from tensat.verify import compare_models

    opened: list[int | None] = []
    real = session_mod.make_session

    def counting(*args: object, **kw: object) -> object:
        opened.append(args[2] if len(args) > 2 else None)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(session_mod, "make_session", counting)
    monkeypatch.setattr(latency, "make_session", counting)
    base, cand = Serialized(export_model(relu_chain(3))), Serialized(export_model(relu_chain(1)))
    assert compare_models(base, cand).ok and opened == [1, 1]
    single = Interleaved([base, cand], threads=1)
    assert opened == [1, 1]  # the sessions verification opened
    assert single.sessions == [shared_session(base, "cpu", 1), shared_session(cand, "cpu", 1)]
    Interleaved([base, cand], threads=2)  # other settings: new sessions, which replace those kept
    assert opened == [1, 1, 2, 2]
    compare_models(export_model(relu_chain(3)), export_model(relu_chain(1)))  # protos keep nothing
    assert opened == [1, 1, 2, 2, 1, 1]
    Interleaved([base, cand], threads=2, copies=2)  # the kept sessions, and one more of each model
    assert opened == [1, 1, 2, 2, 1, 1, 2, 2]


def test_the_check_times_one_session_per_model_where_copies_take_too_long_to_open():
    """The end-to-end check's extra sessions cost their opening time: where the models' sessions, as verification
    opened them, took long enough that the copies would eat more than COPIES_SHARE of the check's seconds, each
    model is timed in one session."""
    from tensat.api import CHECK_SESSIONS, COPIES_SHARE, check_copies
    from tensat.session import Serialized
    from tensat.verify import compare_models

    base, cand = Serialized(export_model(relu_chain(3))), Serialized(export_model(relu_chain(1)))
    assert check_copies(base, cand, 2, 20.0) == CHECK_SESSIONS  # nothing opened yet: no time known
    assert compare_models(base, cand).ok
    assert base.opened is not None and cand.opened is not None and base.opened > 0
    opening = (base.opened + cand.opened) * (CHECK_SESSIONS - 1) * 2
    assert check_copies(base, cand, 2, 1.01 * opening / COPIES_SHARE) == CHECK_SESSIONS
    assert check_copies(base, cand, 2, 0.99 * opening / COPIES_SHARE) == 1
    assert check_copies(base.proto, cand.proto, 2, 0.0) == CHECK_SESSIONS  # protos keep no time


def test_copies_of_each_model_take_turns_two_by_two_in_both_orders():
    models = [export_model(relu_chain(2)), export_model(relu_chain(3))]
    timed = Interleaved(models, copies=2, warmup=0)
    assert len(timed.copies) == 2 and timed.copies[0] == timed.runs_of
    ran: list[tuple[int, int]] = []
    for c, runs in enumerate(timed.copies):
        runs[:] = [lambda c=c, m=m, run=run: ran.append((c, m)) or run() for m, run in enumerate(runs)]
    for _ in range(4):
        timed.turn()
    assert ran == [(0, 0), (0, 1), (0, 1), (0, 0), (1, 0), (1, 1), (1, 1), (1, 0)]
    assert timed.runs == 4


def test_compare_many_ranks_every_candidate_against_one_baseline():
    base, quicker, slower = (export_model(relu_chain(n)) for n in (100, 1, 300))
    to_quicker, to_slower = compare_many(base, [quicker, slower], max_seconds=3.0, clock="cpu")
    assert to_quicker.speedup > 1 > to_slower.speedup and to_slower.measurably_slower
    assert to_quicker.baseline_ms == to_slower.baseline_ms and to_quicker.pairs == to_slower.pairs >= 5


def test_the_latency_check_keeps_the_input_unless_the_optimized_model_runs_faster():
    opts = api.Options(latency_check=2.0)
    fast, slow = export_model(relu_chain(1)), export_model(relu_chain(300))
    log = api.RunLog()
    check = api._end_to_end_check(fast, slow, "cpu", opts, log)
    assert check is not None and not check.kept and list(check.by_threads) == [1]  # rejected: 2 threads not timed
    assert check.by_threads[1].pairs == api.FUTILE_PAIRS  # stopped once no gain showed
    assert check.by_threads[1].speedup < 1 and check.by_threads[1].measurably_slower
    assert not log.warnings and "x at 1 thread, 95% interval" in check.figures()
    check = api._end_to_end_check(slow, fast, "cpu", opts, log)
    assert check is not None and check.kept and not log.warnings
    assert all(c.speedup > 1 for c in check.by_threads.values()) and check.by_threads[1].interval[0] > 1
    assert set(check.to_dict()) == {"kept", *(f"threads={t}" for t in api.check_threads())}


def test_a_candidate_predicted_faster_is_timed_for_the_check_s_pairs_before_it_is_rejected():
    """Ten pairs on a shared machine span a few percent: where the cost model predicts a gain beyond the timing's
    resolution, a thread count is not stopped as futile before `CHECK_PAIRS` pairs."""
    opts = api.Options(latency_check=20.0)
    fast, slow = export_model(relu_chain(1)), export_model(relu_chain(300))
    check = api._end_to_end_check(fast, slow, "cpu", opts, api.RunLog(), predicted=1.03)
    assert check is not None and not check.kept and list(check.by_threads) == [1]
    assert check.by_threads[1].pairs == api.CHECK_PAIRS
    within = api._end_to_end_check(fast, slow, "cpu", opts, api.RunLog(), predicted=1.005)
    assert within is not None and within.by_threads[1].pairs == api.FUTILE_PAIRS


def test_optimizing_with_measured_costs_times_the_result_against_the_input(monkeypatch, tmp_path):
    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: cost_model(tmp_path))
    g = Graph()
    x = g.input("x", (4, 1024))
    weight = g.weight(w(1024, 1024))  # 4 MiB, read twice
    g.output("y", g.add("add", [g.add("matmul", [x, weight]), g.add("matmul", [x, weight])]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = tensat.optimize_with_details(
            g, cost="measured", latency_check=1.0, iter_limit=2, time_limit=10, ilp_time_limit=5
        )
        unchecked = tensat.optimize_with_details(
            g, cost="measured", latency_check=0, iter_limit=2, time_limit=10, ilp_time_limit=5
        )
    assert unchecked.cost_after < unchecked.cost_before and unchecked.latency is None  # one matmul is shared
    assert unchecked.measurement["stats"]["cached"] > 0
    assert unchecked.measurement["working_set_mib"] == 4  # the weights one inference reads, each counted once
    check = result.latency
    assert check is not None and "latency_check" in result.times
    assert all(c.pairs >= 5 for c in check.by_threads.values())
    assert result.to_dict()["latency_check"]["threads=1"]["pairs"] == check.by_threads[1].pairs
    kept_input = result.returned_input is not None and "end to end" in result.returned_input
    assert kept_input == (not check.kept) == (not api._faster(check.by_threads))
    assert (result.graph.op_count() == g.op_count()) == kept_input
    with pytest.raises(TensatError, match="latency_check"):
        tensat.optimize_with_details(g, cost="measured", latency_check=-1)


def test_a_second_run_on_the_same_model_reads_the_first_run_s_end_to_end_verdict(monkeypatch, tmp_path):
    """A verdict near its threshold can fall either way when timed again: a second run on the same model, whose
    candidate is the same, reads the first run's verdict from the cost cache and returns what the first returned;
    other check seconds time anew."""
    measured = cost_model(tmp_path)
    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: measured)
    g = Graph()
    x = g.input("x", (4, 1024))
    weight = g.weight(w(1024, 1024))
    g.output("y", g.add("add", [g.add("matmul", [x, weight]), g.add("matmul", [x, weight])]))
    timed = []
    real_check = api._end_to_end_check

    def counted(*args, **kw):
        timed.append(args[0])
        return real_check(*args, **kw)

    monkeypatch.setattr(api, "_end_to_end_check", counted)
    kw = dict(cost="measured", latency_check=1.0, iter_limit=2, time_limit=10, ilp_time_limit=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        first = tensat.optimize_with_details(g, **kw)
        second = tensat.optimize_with_details(g, **kw)
    assert first.latency is not None and not first.latency.reused and len(timed) == 1
    assert second.latency is not None and second.latency.reused and len(timed) == 1  # not timed again
    assert second.latency.to_dict() == {**first.latency.to_dict(), "reused": True}
    assert second.returned_input == first.returned_input
    assert export_model(second.graph).SerializeToString() == export_model(first.graph).SerializeToString()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        third = tensat.optimize_with_details(g, **{**kw, "latency_check": 1.5})
    assert third.latency is not None and not third.latency.reused and len(timed) == 2


def test_exploration_samples_are_priced_analytically_and_only_the_extraction_measures(monkeypatch, tmp_path):
    """Measuring each iteration's new e-nodes spent the exploration's time on pricing: a sample of the extracted
    cost is priced by the analytic estimate; the measured model prices the input and the extraction's export."""
    measured = cost_model(tmp_path)
    stage, prefetched = ["start"], []
    real_prefetch = measured.prefetch

    def prefetch(items, deadline=None):
        prefetched.append(stage[0])
        return real_prefetch(items, deadline)

    measured.prefetch = prefetch
    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: measured)
    samples = []
    real_sampler = api._Sampler.__call__
    monkeypatch.setattr(api._Sampler, "__call__", lambda self, it: samples.append(it) or real_sampler(self, it))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = tensat.optimize_with_details(
            small_cnn(), cost="measured", latency_check=0, progress=lambda name, detail: stage.__setitem__(0, name)
        )
    assert samples, "the exploration should have sampled its extracted cost"
    assert "explore" not in prefetched and "price" in prefetched
    assert result.cost_after <= result.cost_before


# -- the cache ---------------------------------------------------------------------------------------------------


def test_cache_round_trip_and_json_details(tmp_path):
    path = tmp_path / "c.sqlite3"
    with CostCache(path) as cache:
        cache.put("fp", "sig", CostEntry(1.25, 0.1, 9, "relu", {"copies": 4}))
        cache.put_device("fp", {"device": "x"}, {"node_us": 0.4})
    with CostCache(path) as cache:
        entry = cache.get("fp", "sig")
        assert entry is not None and entry.ms == 1.25 and entry.detail == {"copies": 4} and entry.runs == 9
        assert cache.get("other", "sig") is None
        assert cache.device("fp") == ({"device": "x"}, {"node_us": 0.4})
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()


def test_damaged_cache_is_moved_aside_and_rebuilt(tmp_path):
    path = tmp_path / "costs.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.warns(RuntimeWarning, match="damaged"):
        cache = CostCache(path)
    cache.put("fp", "sig", CostEntry(2.0, 0.0, 1))
    assert cache.get("fp", "sig").ms == 2.0
    assert any(p.name.startswith("costs.sqlite3.corrupt-") for p in tmp_path.iterdir())
    cache.close()


def test_cache_damaged_between_runs_or_while_open_does_not_stop_pricing(tmp_path):
    g = small_cnn()
    first = cost_model(tmp_path)
    graph_cost(g, first)
    first.cache.close()
    (tmp_path / "costs.sqlite3").write_bytes(b"\0garbage" * 512)
    with pytest.warns(RuntimeWarning, match="damaged"):
        cost = cost_model(tmp_path)
    assert graph_cost(g, cost) > 0
    for suffix in ("", "-wal", "-shm"):
        target = tmp_path / f"costs.sqlite3{suffix}"
        if target.exists():
            target.write_bytes(b"\1junk" * 4096)
    fresh = Node("relu", (), (), (3, 5), "float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert cost(fresh, [(3, 5)], [False]) > 0


def test_unwritable_cache_directory_falls_back_to_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.warns(RuntimeWarning, match="memory"):
        cache = CostCache(blocker / "sub" / "costs.sqlite3")
    cache.put("fp", "s", CostEntry(1.0, 0.0, 1))
    assert cache.memory_only and cache.get("fp", "s").ms == 1.0


def test_cache_directory_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSAT_CACHE_DIR", str(tmp_path / "here"))
    assert default_cache_dir() == tmp_path / "here"
    monkeypatch.delenv("TENSAT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert default_cache_dir() == tmp_path / "xdg" / "tensat"


# -- the kernels and the report ------------------------------------------------------------------------------------


def _kernel_ops(graph: Graph) -> set[tuple[str, ...]]:
    return {tuple(graph.nodes[i].op for i in members) for members, _ in runtime_kernels(graph)}


def test_kernels_follow_onnxruntime():
    cnn = _kernel_ops(small_cnn())
    assert ("conv2d", "relu") in cnn and ("matmul", "add", "tanh") in cnn
    assert (("conv2d", "add", "relu") in cnn) == bool(nchwc_block())  # summed into the blocked convolution
    assert ("transpose", "transpose", "matmul") in _kernel_ops(attention())


def _preactivation() -> Graph:
    """DenseNet's pattern: a BatchNormalization and a Relu over a concat of convolutions (a blocked BatchNormalization
    runs as a convolution, with the Relu fused), then MobileNetV2's: a convolution with a Clip, and a residual Add."""
    g = Graph()
    x = g.input("x", (1, 16, 8, 8))
    a = g.add("conv2d", [x, g.weight(w(16, 16, 1, 1)), g.weight(w(16))], **conv_attrs(1))
    b = g.add("conv2d", [x, g.weight(w(16, 16, 1, 1)), g.weight(w(16))], **conv_attrs(1))
    cat = g.add("concat", [a, b], axis=1)
    stats = [g.weight(np.abs(w(32)) + 0.5) for _ in range(4)]
    r = g.add("relu", [g.add("batchnorm", [cat, *stats], epsilon=1e-5)])
    c = g.add(
        "clip", [g.add("conv2d", [r, g.weight(w(32, 32, 1, 1)), g.weight(w(32))], **conv_attrs(1))], min=0.0, max=6.0
    )
    d = g.add("conv2d", [c, g.weight(w(32, 32, 1, 1)), g.weight(w(32))], **conv_attrs(1))
    g.output("y", g.add("add", [d, c]))
    return g


KERNEL_GRAPHS = ["nasrnn", "squeezenet", "resnext50", "bert", "inception_v3", "resnet50", "nasnet_a", "vgg19"]


@pytest.mark.parametrize("name", slow_params([*KERNEL_GRAPHS, "preactivation"]))
def test_the_catalogue_counts_the_kernels_onnxruntime_runs(name, tmp_path):
    """tensat's catalogue of what onnxruntime fuses (`runtime_kernels`) gives as many kernels as onnxruntime's own
    optimized model of the graph tensat writes has nodes (its layout reorders aside): each fusion it misses, or
    claims where onnxruntime does not make it, changes the count."""
    from tensat.models import SMALL_SIZES, build_model
    from tensat.onnx_io import import_model

    if name == "preactivation":
        g = _preactivation()
    else:
        g = import_model(build_model(name, **SMALL_SIZES[name]), runtime_fusions=True).compact()
    optimized = tmp_path / "opt.onnx"
    make_session(export_model(g), optimized_path=str(optimized))
    ran = [
        n.op_type for n in onnx.load(str(optimized)).graph.node if n.op_type not in ("ReorderInput", "ReorderOutput")
    ]
    assert len(runtime_kernels(g)) == len(ran), sorted(ran)


@pytest.mark.parametrize(
    ("in_channels", "out_channels", "group"),
    [(3, 8, 1), (18, 8, 1), (20, 8, 1), (34, 16, 1), (40, 6, 1), (48, 16, 1), (6, 6, 6), (8, 8, 8), (12, 12, 12),
     (24, 24, 2), (32, 64, 2), (48, 48, 3)],
)  # fmt: skip
def test_blocked_convolutions_are_those_onnxruntime_blocks(in_channels, out_channels, group, tmp_path):
    """`blocked_conv` says which convolutions onnxruntime runs in its NCHWc layout, as its optimized model shows (a
    blocked one is written between reorders): the Sum fusion and the blocked activations follow from it."""
    from tensat.cost import blocked_conv

    block = nchwc_block()
    if not block:
        pytest.skip("no NCHWc kernels on this CPU")
    shape = (out_channels, in_channels // group, 3, 3)
    g = Graph()
    x = g.input("x", (1, in_channels, 8, 8))
    weight = g.weight(np.ones(shape, np.float32))
    attrs = {**conv_attrs(3), "group": group}
    g.output("y", g.add("conv2d", [x, weight, g.weight(np.zeros(out_channels, np.float32))], **attrs))
    optimized = tmp_path / "opt.onnx"
    make_session(export_model(g), optimized_path=str(optimized))
    reordered = any(n.op_type == "ReorderOutput" for n in onnx.load(str(optimized)).graph.node)
    assert blocked_conv(shape, group, block) == reordered


def test_group_unit_keeps_internal_edges():
    g = small_cnn()
    unit = _group(g, ("conv2d", "add", "relu"))
    assert unit.label() == "conv2d+add+relu"
    assert unit.nodes[1].inputs[0] == ("n", 0) and unit.out_shape == (1, 16, 8, 8)
    onnx.checker.check_model(unit_model(unit))


def test_fused_graph_cost_adds_the_session_baseline(tmp_path):
    cost = cost_model(tmp_path)
    gc = fused_graph_cost(small_cnn(), cost)
    assert gc.baseline_ms > 0 and gc.total_ms > gc.baseline_ms
    assert gc.fused_groups == 3 and gc.analytic_nodes == 0
    assert sum(len(grp.nodes) for grp in gc.groups) == len(runtime_nodes(small_cnn()))


# -- devices ---------------------------------------------------------------------------------------------------


def test_cuda_probe_is_silent(capfd):
    cuda_available()
    out, err = capfd.readouterr()
    assert "CUDA" not in err and "cuda" not in err.lower() and not out


def test_device_selection():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") in ("cpu", "cuda")
    with pytest.raises(TensatError):
        resolve_device("tpu")
    if not cuda_available():
        with pytest.raises(TensatError, match="CUDA"):
            resolve_device("cuda")


def test_cuda_measurement_and_timing(tmp_path):
    if not cuda_available():
        pytest.skip("onnxruntime's CUDA execution provider does not run here")
    cost = MeasuredCost("cuda", cache_path=tmp_path / "c.sqlite3", progress=False, max_seconds=FAST)
    assert cost.info["provider"] == "CUDAExecutionProvider" and cost.clock == "wall"
    assert graph_cost(small_cnn(), cost) > 0
    stats = time_models([export_model(small_cnn())], provider="cuda", runs=5)
    assert stats[0].median_ms > 0


def test_cpu_clock_needs_one_thread():
    model = export_model(small_cnn())
    assert time_models([model], clock="cpu", runs=4, block=2)[0].runs == 4
    with pytest.raises(ValueError):
        time_models([model], clock="cpu", threads=2, runs=2)


def test_progress_is_silent_without_a_terminal(capsys):
    bar = Progress(3, "measuring", enabled=True)
    for _ in range(3):
        bar.step("op")
    bar.close()
    assert capsys.readouterr().err == ""


def test_thread_count_is_part_of_the_fingerprint(tmp_path):
    one = cost_model(tmp_path)
    two = MeasuredCost("cpu", cache_path=tmp_path / "costs.sqlite3", progress=False, threads=2)
    assert one.fingerprint != two.fingerprint and two.clock == "wall"
    with pytest.raises(TensatError):
        make_measured_cost("cpu", tmp_path / "x.sqlite3", threads=0)


# -- CLI entry points ------------------------------------------------------------------------------------------


def _parser(add) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add(p)
    return p


def test_profile_command_fills_the_cache(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    save_model(export_model(small_cnn()), path)
    argv = [
        str(path),
        "--device",
        "cpu",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--iter-limit",
        "2",
        "--time-limit",
        "10",
    ]
    args = _parser(add_profile_arguments).parse_args(argv)
    assert run_profile(args) == 0
    out = capsys.readouterr().out
    assert "measured now" in out and str(tmp_path / "cache") in out
    assert run_profile(_parser(add_profile_arguments).parse_args(argv)) == 0
    assert "0 measured now" in capsys.readouterr().out
    assert "TENSAT_CACHE_DIR" not in os.environ or os.environ["TENSAT_CACHE_DIR"] != str(tmp_path / "cache")


def test_cost_report_command(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    save_model(export_model(small_cnn()), path)
    out_json = tmp_path / "r.json"
    argv = [
        str(path),
        "--device",
        "cpu",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--runs",
        "6",
        "--block",
        "2",
        "--iter-limit",
        "2",
        "--time-limit",
        "10",
        "--ilp-time-limit",
        "10",
        "--json",
        str(out_json),
        "--details",
        "--sessions",
        "2",
    ]
    assert run_cost_report(_parser(add_cost_report_arguments).parse_args(argv)) == 0
    out = capsys.readouterr().out
    assert "original" in out and "optimized" in out and "end-to-end" in out
    assert '"rows"' in out_json.read_text()


@pytest.mark.parametrize("near_mib", [None, 1])
def test_copies_whose_inputs_and_outputs_overflow_the_level_two_cache_are_fewer(tmp_path, near_mib) -> None:
    """A unit's copies each read an input of their own, touched again before each timed run; inside a graph the
    input was just computed and sits in the level-2 cache where it fits. So the copies' inputs and outputs together
    fit in it: a Relu over 256 KiB (512 KiB with its output) gets two copies in 1 MiB, and eight without the cap."""
    cost = cost_model(tmp_path)
    cost.runner.near_cache = near_mib and near_mib * 2**20
    shape = (1, 64, 32, 32)
    unit = pricing_unit(Node("relu", (), (), shape, "float32"), [shape], [False])
    assert cost.copies_for(unit) == (8 if near_mib is None else 2)


def test_a_unit_whose_weights_fit_in_one_cache_line_is_timed_as_one_without_weights(tmp_path):
    """A Where of a scalar constant (the NaN guard transformers' attention is exported with) fetches one cache line
    of weights cold in the graph: its unit evicts nothing for its weights (its outputs warm here), spans no working
    set, and its key names none."""
    cost = cost_model(tmp_path, working_set=64 * 2**20, outputs="warm")
    g = Graph()
    c = g.input("c", (3, 64, 64), "bool")
    x = g.input("x", (3, 64, 64))
    y = g.add("where", [c, g.weight(np.zeros((1, 1, 1), np.float32), "zero"), x])
    scale = g.add("mul", [x, g.weight(np.ones((64,), np.float32), "scale")])
    g.output("y", y)
    g.output("s", scale)
    const = g.weight_only()
    where, mul = (pricing_unit(*item_of(g, g.nodes[i], const)) for i in (y, scale))
    assert where.weight_bytes() == 4 and not where.weighted
    assert cost._plan(where).evict_bytes == 0 and "ws=" not in cost._key(where)
    assert mul.weighted and cost._plan(mul).evict_bytes > 0 and "ws=64MiB" in cost._key(mul)
