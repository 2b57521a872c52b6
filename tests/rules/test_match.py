"""The concrete-graph matcher (rewrites/match.py): every rule matches its own left side, and every match on the
benchmark graphs rewrites to a graph computing the same outputs."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from tensat import ops, rewrites
from tensat.ir import Graph
from tensat.rewrites.dsl import Var, attr_value, eval_expr, evaluate_sides, parse_rules
from tensat.rewrites.match import TermGraph, apply_match, find_matches
from tests.helpers import TINY_SIZES, tiny_graph


def feeds_for(graph: Graph, seed: int = 0, dtype: Any = np.float64) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        graph.nodes[i].attr["name"]: rng.standard_normal(graph.nodes[i].shape).astype(dtype) for i in graph.input_ids
    }


def outputs_of(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with np.errstate(all="ignore"):
        values = graph.evaluate(feeds, [o for _, o in graph.outputs])
    return [values[o] for _, o in graph.outputs]


def assert_same_outputs(a: Graph, b: Graph, feeds: dict[str, np.ndarray], rtol: float, what: str) -> None:
    assert [n for n, _ in a.outputs] == [n for n, _ in b.outputs]
    for x, y in zip(outputs_of(a, feeds), outputs_of(b, feeds)):
        assert x.shape == y.shape, what
        finite = np.abs(x[np.isfinite(x)])
        scale = max(1.0, float(finite.max())) if finite.size else 1.0
        np.testing.assert_allclose(y, x, rtol=rtol, atol=rtol * scale, equal_nan=True, err_msg=what)


# ---------------------------------------------------------------------------------------------------------------
# Every rule of the library, on graphs made of its own left side


RARE_ATTEMPTS = 2000  # the sampler's order of combinations varies by process: enough for a rare one in any
RARE_RANKS = 256  # rank assignments tried for such a rule: all of them, for up to four free ranks of 1 to 4


def _instances(
    rule: rewrites.Rule, wanted: int = 2, attempts: int = 20
) -> list[tuple[dict[str, tuple[int, ...]], dict[str, Any]]]:
    """Shapes and attribute values satisfying the rule's left side and guards, from the rule verifier's sampler,
    `attempts` samples per combination of ranks and attributes; a rule none of them fits (valid bindings are rare
    where a kernel's pattern couples many shapes: attention's three head splits) is sampled `RARE_ATTEMPTS` times,
    as the verifier samples such a rule longer (`verify_written`), over every assignment of ranks (a reshape's
    target shape leaves its rank open, and few of them fit)."""
    try:
        from tensat.rewrites import verify as rv

        plan = rv._Plan(rule)
        rng = random.Random(f"match:{rule.name}")
        assignments = plan.rank_assignments(rng, **({"limit": RARE_RANKS} if attempts >= RARE_ATTEMPTS else {}))
    except (ImportError, AttributeError) as exc:
        pytest.skip(f"the rule verifier's sampler is not available: {exc}")
    found = []
    np_rng = np.random.default_rng(0)
    for ranks in assignments:
        for env in plan.attr_combos(ranks):
            try:
                plan.derive_rank_defs(env, ranks)
            except rv.Reject:
                continue
            if not plan.prefilter(env, ranks):
                continue
            for _ in range(attempts):
                try:
                    b = rv._Builder(plan, ranks, dict(env), rng)
                    b.guards()
                    b.structure()
                    shapes, attrs = b.sample()
                    tensors = {v: np_rng.standard_normal(shapes[v]) for v in rule.tensor_vars()}
                    with np.errstate(all="ignore"):
                        ok = evaluate_sides(rule, tensors, attrs) is not None
                except (rv.Reject, ops.ShapeError, IndexError, KeyError, ValueError, TypeError, ZeroDivisionError):
                    continue
                if ok:
                    found.append((shapes, attrs))
                    break
            if len(found) >= wanted:
                return found
    if not found and attempts < RARE_ATTEMPTS:
        return _instances(rule, wanted, RARE_ATTEMPTS)
    return found


def _lhs_graph(
    rule: rewrites.Rule, shapes: dict[str, tuple[int, ...]], attrs: dict[str, Any]
) -> tuple[Graph, list[int]] | None:
    """A graph computing the rule's left side(s) over one input per tensor variable (None if it cannot be built)."""
    g = Graph()
    ids = {v: g.input(v, shapes[v]) for v in rule.tensor_vars()}

    def build(p: Any) -> int:
        if isinstance(p, Var):
            return ids[p.name]
        given = dict(p.attrs)
        values = {name: attr_value(eval_expr(given[name], attrs, shapes)) for name in ops.get(p.op).attr_names}
        return g.add(p.op, [build(a) for a in p.args], **values)

    try:
        roots = [build(t) for t in rule.lhs]
    except (KeyError, ops.ShapeError):
        return None
    for k, r in enumerate(roots):
        g.output(f"out{k}", r)
    return g, roots


# the attention fusions without a bias take seconds each to match and rewrite here, their biased forms (the same
# patterns but for the bias, in the default run) a fraction of one
SLOW_MATCHES = ("multihead-attention-fuse-unbiased", "multihead-attention-fuse-unscaled-unbiased")


@pytest.mark.parametrize(
    "rule",
    [pytest.param(r, marks=pytest.mark.slow) if r.name in SLOW_MATCHES else r for r in rewrites.all_rules()],
    ids=lambda r: r.name,
)
def test_rule_matches_its_left_side_and_every_match_rewrites_correctly(rule):
    instances = _instances(rule)
    built = [x for x in (_lhs_graph(rule, *inst) for inst in instances) if x is not None]
    if not built:
        pytest.skip("no buildable instance of the left side (an attribute left open)")
    library = rewrites.all_rules()
    for g, roots in built:
        own = find_matches(g, [rule])
        assert any(set(m.roots) == set(roots) for m in own), f"{rule.name} does not match its own left side"
        assert any(apply_match(g, m) is not None for m in own), f"{rule.name} never applies to its left side"
        feeds = feeds_for(g)
        for m in find_matches(g, library):
            g2 = apply_match(g, m)
            if g2 is not None:
                # a rule whose constants are float32 roundings declares its tolerance: on its left side (the graph
                # here), or as the rule applied, values agree to that, in whichever op the constants reach
                tol = max(1e-9, m.rule.tolerance, rule.tolerance)
                assert_same_outputs(g, g2, feeds, tol, f"{m.rule.name} on the left side of {rule.name}")


# ---------------------------------------------------------------------------------------------------------------
# Every match on the benchmark graphs


def store_values(
    store: TermGraph, wanted: list[int], feeds: dict[str, np.ndarray], memo: dict[int, np.ndarray]
) -> list[np.ndarray]:
    """Numpy values of store nodes, reusing (and filling) `memo`."""
    needed: set[int] = set()
    stack = [i for i in wanted if i not in memo]
    while stack:
        i = stack.pop()
        if i not in needed and i not in memo:
            needed.add(i)
            stack.extend(store.inputs[i])
    with np.errstate(all="ignore"):
        for i in sorted(needed):
            op, attr = store.op[i], store.attr[i]
            if op == "input":
                memo[i] = feeds[attr["name"]]
            elif op == "weight":
                memo[i] = store.weights[attr["name"]]
            else:
                memo[i] = ops.evaluate(op, [memo[j] for j in store.inputs[i]], attr)
    return [memo[i] for i in wanted]


@pytest.mark.parametrize("name", sorted(TINY_SIZES))
def test_every_match_on_benchmark_graphs_computes_its_roots(name):
    """Matches of every rule on the benchmark graphs (up to 12 per rule and graph): the right side computes what
    the matched roots do."""
    from tensat.rewrites.match import NotApplicable, build_rhs

    g = tiny_graph(name)
    store = TermGraph(g)
    matches = find_matches(g)
    assert matches, f"no rule matches {name}"
    feeds = feeds_for(g)
    memo: dict[int, np.ndarray] = {}
    built = 0
    per_rule: dict[str, int] = {}
    for m in matches:
        per_rule[m.rule.name] = per_rule.get(m.rule.name, 0) + 1
        if per_rule[m.rule.name] > 12:
            continue
        try:
            new_roots = build_rhs(store, m)
        except NotApplicable:
            continue
        built += 1
        for old, new in zip(
            store_values(store, list(m.roots), feeds, memo), store_values(store, list(new_roots), feeds, memo)
        ):
            assert old.shape == new.shape, m.rule.name
            np.testing.assert_allclose(
                new,
                old,
                rtol=1e-9,
                atol=1e-9 * max(1.0, float(np.max(np.abs(old)))),
                err_msg=f"{m.rule.name} at {m.roots} on {name}",
            )
    assert built > 0


@pytest.mark.parametrize("name", ["bert", "nasrnn", "squeezenet"])
def test_applying_matches_preserves_graph_outputs(name):
    """Whole rewritten graphs (right side built, ancestors rebuilt, dead nodes dropped) compute the same outputs."""
    g = tiny_graph(name)
    feeds = feeds_for(g, dtype=np.float32)
    per_rule: dict[str, int] = {}
    for m in find_matches(g):
        if per_rule.get(m.rule.name, 0) >= 3:
            continue
        g2 = apply_match(g, m)
        if g2 is None:
            continue
        per_rule[m.rule.name] = per_rule.get(m.rule.name, 0) + 1
        assert_same_outputs(g, g2, feeds, 1e-3, f"{m.rule.name} at {m.roots} on {name}")
    assert per_rule


def test_multi_pattern_match_reading_a_replaced_node_is_rejected():
    g = Graph()
    x = g.input("x", (4, 4))
    a = g.add("relu", [x])
    b = g.add("relu", [a])
    g.output("y", b)
    rule = parse_rules("""
        (multi relu-pair ((relu ?x) (relu ?y)) ((slice ?m :axis 0 :start 0 :size (dim ?x 0))
                                              (slice ?m :axis 0 :start (dim ?x 0) :size (dim ?y 0)))
          :let ((?m (relu (concat ?x ?y :axis 0)))) :when ((same-except ?x ?y 0)))""")[0]
    matches = find_matches(g, [rule])
    assert [m.roots for m in matches] == [(a, b)]  # symmetric: one order of the pair
    assert apply_match(g, matches[0]) is None  # relu(x) with relu(relu(x)) would form a cycle


def test_ill_typed_right_side_is_skipped():
    g = Graph()
    x = g.input("x", (2, 3))
    w = g.weight(np.ones((3, 5), np.float32), "w")
    g.output("y", g.add("matmul", [x, w]))
    rule = parse_rules("(rule swap (matmul ?a ?b) (matmul ?b ?a))")[0]
    (m,) = find_matches(g, [rule])
    assert apply_match(g, m) is None


def test_symmetric_multi_rule_keeps_one_order_and_distinct_roots():
    g = Graph()
    x = g.input("x", (2, 4))
    outs = [g.add("matmul", [x, g.weight(np.full((4, k), k, np.float32), f"w{k}")]) for k in (3, 5, 7)]
    for k, o in enumerate(outs):
        g.output(f"y{k}", o)
    rule = next(r for r in rewrites.all_rules() if r.name == "matmul-merge-shared-input")
    assert rule.symmetric
    roots = sorted(m.roots for m in find_matches(g, [rule]))
    assert roots == [(outs[0], outs[1]), (outs[0], outs[2]), (outs[1], outs[2])]
