"""The TASO-style sequential search (tensat/sequential.py): incremental pricing, hashing and matching agree with
building the graphs, and the search improves within its budget."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tensat import onnx_io, rewrites
from tensat.cost import AnalyticCost, runtime_cost
from tensat.ir import Graph
from tensat.rewrites.match import Context, Matcher, TermGraph, rewrite
from tensat.sequential import SequentialSearch, _State, sequential_search
from tests.helpers import slow_params, tiny_graph

# ---------------------------------------------------------------------------------------------------------------
# The search: incremental pricing, hashing and matching agree with building the graphs


def _priced_afresh(graph: Graph) -> float:
    """A graph's cost as the search prices it, from a new store: each node by itself, except those onnxruntime
    fuses into the node before them (free)."""
    search = SequentialSearch(graph, AnalyticCost())
    search._sync()
    return sum(search._cost[i] for i in search._root_ctx.order)


@pytest.mark.parametrize("name", slow_params(["nasrnn", "bert", "nasnet_a", "squeezenet"], ("nasnet_a", "nasrnn")))
def test_incremental_pricing_and_matching_agree_with_rebuilding(name):
    g = tiny_graph(name)
    search = SequentialSearch(g, AnalyticCost())
    search._sync()
    ctx = search._root_ctx
    st = _State(
        sum(search._cost[i] for i in ctx.order),
        sum(search._isop[i] for i in ctx.order),
        0,
        None,
        None,
        0,
        outputs=tuple(g.outputs),
    )
    search._materialize(st)
    assert st.cost == pytest.approx(_priced_afresh(g), rel=1e-12)
    rng = random.Random(1)
    checked = 0
    for _ in range(6):
        assert st.ctx is not None and st.matches is not None
        st.ctx.all_ancestors()
        ok = []
        for m in st.matches:
            verdict, cost, nops, key = search._candidate(st, m, float("inf"), 10**9)
            if verdict != "ok":
                continue
            ok.append((m, cost, nops, key))
            if rng.random() < 0.25:
                outputs = rewrite(st.ctx, m)
                built = search.store.to_graph(outputs)
                assert cost == pytest.approx(_priced_afresh(built), rel=1e-9), m.rule.name
                assert nops == built.op_count(), m.rule.name
                assert key == search.store.graph_key(outputs), m.rule.name
                checked += 1
        if not ok:
            break
        m, cost, nops, key = rng.choice(ok)
        child = _State(cost, nops, key, st, m, 1)
        search._materialize(child)
        assert child.ctx is not None and child.matches is not None
        full = search.matcher.find(child.ctx)
        assert sorted((x.rule.name, x.roots, tuple(sorted(x.tensors))) for x in child.matches) == sorted(
            (x.rule.name, x.roots, tuple(sorted(x.tensors))) for x in full
        )
        st = child
    assert checked > 0


def test_structural_hash_ignores_node_numbering_and_rewrite_order():
    def build(order: list[int]) -> Graph:
        g = Graph()
        x = g.input("x", (1, 2, 6, 6))
        convs = {}
        for k in order:
            w = g.weight(np.full((2, 2, 3, 3), k, np.float32), f"w{k}")
            b = g.weight(np.zeros(2, np.float32), f"b{k}")
            c = g.add("conv2d", [x, w, b], strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1, act=0)
            convs[k] = g.add("relu", [c])
        g.output("y", g.add("add", [convs[0], convs[1]]))
        return g

    a, b = build([0, 1]), build([1, 0])
    assert a.nodes != b.nodes
    assert TermGraph(a).graph_key(tuple(a.outputs)) == TermGraph(b).graph_key(tuple(b.outputs))

    fuse = [r for r in rewrites.all_rules() if r.name == "conv-relu-fuse"]
    store = TermGraph(a)
    matcher = Matcher(fuse)
    ctx = Context(store, tuple(a.outputs))
    first, second = matcher.find(ctx)
    keys = []
    for m1, m2 in ((first, second), (second, first)):
        out1 = rewrite(ctx, m1)
        ctx1 = Context(store, out1)
        (rest,) = [m for m in matcher.find(ctx1) if m.roots == m2.roots]
        keys.append(store.graph_key(rewrite(ctx1, rest)))
    assert keys[0] == keys[1]


def test_search_improves_and_its_result_verifies():
    from tensat.verify import verify

    g = tiny_graph("squeezenet")
    result = sequential_search(g, AnalyticCost(), budget=15)
    assert result.expansions == 15 and result.stop_reason == "budget"
    assert result.cost_after < result.cost_before
    assert result.cost_after == pytest.approx(runtime_cost(result.graph, AnalyticCost()), rel=1e-12)
    assert result.ops_after <= 2 * result.ops_before
    assert result.applied and set(result.applied) <= set(result.rules)
    assert verify(onnx_io.export_model(g), onnx_io.export_model(result.graph)).ok


def test_budget_alpha_and_queue_end():
    g = tiny_graph("vgg19")
    none = sequential_search(g, AnalyticCost(), budget=0)
    assert none.expansions == 0 and none.cost_after == none.cost_before and none.applied == []
    strict = sequential_search(g, AnalyticCost(), alpha=0.5, budget=10)
    assert strict.expansions == 1 and strict.stop_reason == "queue_empty" and strict.pushed == 0
    assert strict.rejected["cost"] > 0
    few = sequential_search(g, AnalyticCost(), budget=3)
    assert few.expansions == 3 and len(few.trace) == 3
    assert [t["best"] for t in few.trace] == sorted((t["best"] for t in few.trace), reverse=True)


def test_what_onnxruntime_fuses_is_no_gain_to_the_search_either():
    """A Conv, its Relu and a MaxPool: fusing the Relu into the Conv, or moving it past the pool (a quarter of the
    data), are gains op by op only; onnxruntime runs the Relu fused into the Conv for nothing. The search prices as
    tensat's extraction does, and keeps the graph."""
    from tests.costs.test_runtime_fusions import _conv_relu_pool

    g = onnx_io.import_model(_conv_relu_pool()).compact()
    rules = [r for r in rewrites.all_rules() if r.name in ("conv-relu-fuse", "maxpool-relu-commute")]
    result = sequential_search(g, AnalyticCost(), rules, budget=10)
    assert result.matches > 0 and result.best_expansion == 0 and result.applied == []
    assert result.cost_after == result.cost_before
