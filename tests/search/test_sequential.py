"""The concrete-graph matcher (rewrites/match.py), the TASO-style sequential search and `tensat compare`."""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

import numpy as np
import pytest

from tensat import onnx_io, ops, rewrites
from tensat.cost import AnalyticCost, graph_cost
from tensat.errors import TensatError
from tensat.ir import Graph
from tensat.models import build_model
from tensat.rewrites.dsl import Var, attr_value, eval_expr, evaluate_sides, parse_rules
from tensat.rewrites.match import Context, Matcher, TermGraph, apply_match, find_matches, rewrite
from tensat.sequential import SequentialSearch, _State, sequential_search

# Small versions of the benchmark graphs (the same structure, sizes that evaluate in milliseconds).
SMALL = {
    "bert": dict(layers=1, seq=8, hidden=32, heads=4),
    "nasrnn": dict(steps=2, hidden=16),
    "resnext50": dict(image=32),
    "nasnet_a": dict(image=32, channels=8, stages=1, cells=2),
    "inception_v3": dict(image=75),
    "squeezenet": dict(image=32),
    "vgg19": dict(image=32, fc=32),
    "resnet50": dict(image=32),
}


def small_graph(name: str) -> Graph:
    return onnx_io.import_model(build_model(name, **SMALL[name])).compact()


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


def _instances(rule: rewrites.Rule, wanted: int = 2) -> list[tuple[dict[str, tuple[int, ...]], dict[str, Any]]]:
    """Shapes and attribute values satisfying the rule's left side and guards, from the rule verifier's sampler."""
    try:
        from tensat.rewrites import verify as rv

        plan = rv._Plan(rule)
        rng = random.Random(f"match:{rule.name}")
        assignments = plan.rank_assignments(rng)
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
            for _ in range(20):
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


@pytest.mark.parametrize("rule", rewrites.all_rules(), ids=lambda r: r.name)
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
                assert_same_outputs(g, g2, feeds, 1e-9, f"{m.rule.name} on the left side of {rule.name}")


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


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_match_on_benchmark_graphs_computes_its_roots(name):
    """Matches of every rule on the benchmark graphs (up to 12 per rule and graph): the right side computes what
    the matched roots do."""
    from tensat.rewrites.match import NotApplicable, build_rhs

    g = small_graph(name)
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
    g = small_graph(name)
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


# ---------------------------------------------------------------------------------------------------------------
# The search: incremental pricing, hashing and matching agree with building the graphs


@pytest.mark.parametrize("name", ["nasrnn", "bert", "nasnet_a", "squeezenet"])
def test_incremental_pricing_and_matching_agree_with_rebuilding(name):
    g = small_graph(name)
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
    assert st.cost == pytest.approx(graph_cost(g, search.cost_model), rel=1e-12)
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
                assert cost == pytest.approx(graph_cost(built, search.cost_model), rel=1e-9), m.rule.name
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

    g = small_graph("squeezenet")
    result = sequential_search(g, AnalyticCost(), budget=15)
    assert result.expansions == 15 and result.stop_reason == "budget"
    assert result.cost_after < result.cost_before
    assert result.cost_after == pytest.approx(graph_cost(result.graph, AnalyticCost()), rel=1e-12)
    assert result.ops_after <= 2 * result.ops_before
    assert result.applied and set(result.applied) <= set(result.rules)
    assert verify(onnx_io.export_model(g), onnx_io.export_model(result.graph)).ok


def test_budget_alpha_and_queue_end():
    g = small_graph("vgg19")
    none = sequential_search(g, AnalyticCost(), budget=0)
    assert none.expansions == 0 and none.cost_after == none.cost_before and none.applied == []
    strict = sequential_search(g, AnalyticCost(), alpha=0.5, budget=10)
    assert strict.expansions == 1 and strict.stop_reason == "queue_empty" and strict.pushed == 0
    assert strict.rejected["cost"] > 0
    few = sequential_search(g, AnalyticCost(), budget=3)
    assert few.expansions == 3 and len(few.trace) == 3
    assert [t["best"] for t in few.trace] == sorted((t["best"] for t in few.trace), reverse=True)


# ---------------------------------------------------------------------------------------------------------------
# tensat compare


def _parser() -> argparse.ArgumentParser:
    from tensat import compare_cli

    p = argparse.ArgumentParser(prog="tensat compare")
    compare_cli.add_arguments(p)
    return p


def test_compare_cli_on_a_model_file(tmp_path, capsys):
    from tensat import compare_cli

    path = tmp_path / "nasrnn.onnx"
    onnx_io.save_model(build_model("nasrnn", steps=1, hidden=16), str(path))
    out = tmp_path / "cmp.json"
    args = _parser().parse_args(
        [
            str(path),
            "--budget",
            "5",
            "--latency-runs",
            "5",
            "--latency-seconds",
            "5",
            "--iter-limit",
            "2",
            "--extractor",
            "greedy",
            "--json",
            str(out),
            "--progress",
        ]
    )
    assert compare_cli.run(args) == 0
    captured = capsys.readouterr()
    assert "| nasrnn |" in captured.out and "sequential: cost" in captured.err
    assert "target" not in captured.out.lower() and "issue" not in captured.out.lower()
    doc = json.loads(out.read_text())
    row = doc["rows"][0]
    assert row["sequential"]["verified"] and row["tensat"]["verified"]
    assert row["sequential"]["expansions"] <= 5
    assert row["tensat"]["enodes"] > 0 and row["time_ratio"] > 0
    assert set(row["latency"]) >= {"original", "sequential", "tensat"}
    assert doc["summary"]["graphs"] == 1 and "versions" in doc["machine"]


def test_compare_cli_rejects_unknown_models_and_needs_a_source():
    from tensat import compare_cli

    with pytest.raises(TensatError, match="unknown model"):
        compare_cli.run(_parser().parse_args(["--model", "alexnet", "--no-latency"]))
    with pytest.raises(SystemExit):
        _parser().parse_args(["--budget", "3"])


def test_compare_all_writes_files_only_to_an_out_dir(tmp_path, monkeypatch, capsys):
    from tensat import compare_cli

    monkeypatch.chdir(tmp_path)
    rows = [argparse.Namespace(verified=True)]
    assert compare_cli.finish(_parser().parse_args(["--all", "-q"]), rows, {"rows": []}, "| table |") == 0
    assert capsys.readouterr().out == "| table |\n" and list(tmp_path.iterdir()) == []
    out = tmp_path / "out"
    assert (
        compare_cli.finish(
            _parser().parse_args(["--all", "-q", "--out-dir", str(out)]), rows, {"rows": []}, "| table |"
        )
        == 0
    )
    assert sorted(p.name for p in out.iterdir()) == ["compare.json", "compare.md"]


def test_bench_compare_writes_every_graph_to_bench_results(monkeypatch):
    from bench import RESULTS_DIR
    from bench import compare as bench_compare
    from tensat import compare_cli

    seen = []

    def stop(args: argparse.Namespace) -> Any:
        seen.append(args)
        raise TensatError("stopped before comparing")

    monkeypatch.setattr(compare_cli, "compare", stop)
    assert bench_compare.main([]) == 1 and bench_compare.main(["--model", "bert"]) == 1
    assert seen[0].all and seen[0].out_dir == str(RESULTS_DIR)
    assert not seen[1].all and seen[1].out_dir is None


def test_compare_summary_and_markdown():
    from tensat.compare import Row, Settings, markdown, summary
    from tensat.compare import report as compare_report

    def row(name: str, seq_cost: float, seq_s: float, t_cost: float, t_s: float) -> Row:
        return Row(
            name,
            10,
            2.0,
            "analytic",
            {
                "cost": seq_cost,
                "seconds": seq_s,
                "verified": True,
                "expansions": 100,
                "stop_reason": "budget",
                "ops": 8,
                "candidates": 5,
                "pushed": 4,
                "best_expansion": 3,
            },
            {
                "cost": t_cost,
                "seconds": t_s,
                "seconds_with_overhead": 2 * t_s,
                "verified": True,
                "enodes": 9,
                "ops": 7,
                "eclasses": 5,
                "iterations": 2,
                "stop_reason": "saturated",
                "times": {"lower": 0.1},
            },
            None,
            7,
        )

    rows = [row("a", 1.0, 10.0, 0.9, 0.1), row("b", 1.0, 1.0, 1.2, 1.0)]
    rows[0].tensat.update(stop_reason="iter_limit", extraction={"method": "ilp", "status": "feasible"})
    rows[1].tensat.update(extraction={"method": "ilp", "status": "optimal"})
    s = summary(rows)
    assert s["tensat_at_most_sequential"] == 1 and s["worse_on"] == ["b"]
    assert s["geomean_time_ratio"] == pytest.approx(10.0)
    assert s["extraction_not_proven_optimal"] == ["a"] and s["exploration_not_saturated"] == {"a": "iter_limit"}
    assert not any("target" in key for key in s)
    machine = {"cpu": "cpu", "cores": 2, "versions": {"python": "3"}, "date": "today"}
    text = markdown(rows, Settings(), machine)
    assert "| a | 10 / 8 / 7 |" in text and "not on: b; worst: b, 20.00% above the sequential cost" in text
    assert "search-time ratio (sequential / tensat): 10.0" in text
    assert "extraction is not proven optimal on: a (ilp: feasible)" in text
    assert "stopped before saturation on: a (iter_limit)" in text
    for internal in ("target", "Target", "issue", "missed by", "noisy"):
        assert internal not in text
    report = json.dumps(compare_report(rows, Settings(), machine))
    assert "target" not in report and "issue" not in report


def test_bench_compare_checks_the_targets_from_the_report(tmp_path, capsys):
    from bench import compare as bench_compare
    from tensat.compare import Row, Settings, report

    def row(name: str, seq_s: float, t_s: float, t_cost: float) -> Row:
        return Row(
            name,
            10,
            2.0,
            "analytic",
            {
                "cost": 1.0,
                "seconds": seq_s,
                "verified": True,
                "expansions": 10,
                "stop_reason": "budget",
                "ops": 8,
                "candidates": 5,
                "pushed": 4,
                "best_expansion": 3,
            },
            {
                "cost": t_cost,
                "seconds": t_s,
                "seconds_with_overhead": t_s,
                "verified": True,
                "enodes": 9,
                "ops": 7,
                "eclasses": 5,
                "iterations": 2,
                "stop_reason": "saturated",
                "times": {},
            },
            None,
            7,
        )

    machine = {"cpu": "cpu", "cores": 2, "versions": {"python": "3"}, "date": "today"}
    slow = report([row("a", 1.0, 2.0, 1.0), row("b", 1.0, 0.5, 1.1)], Settings(), machine)
    assert bench_compare.targets(slow) == {
        "time_ratio_target": 48.0,
        "cost_target_met": False,
        "time_ratio_target_met": False,
    }
    lines = "\n".join(bench_compare.target_lines(slow))
    assert "missed on 1 of 2 (b)" in lines and "missed by 48.0x (1.00)" in lines
    fast = report([row("a", 100.0, 1.0, 1.0)], Settings(), machine)
    assert bench_compare.targets(fast)["cost_target_met"] and bench_compare.targets(fast)["time_ratio_target_met"]
    saved = tmp_path / "compare.json"
    saved.write_text(json.dumps(slow))
    assert bench_compare.main(["--render", str(saved)]) == 0
    out = capsys.readouterr().out
    assert out.index("| a | 10 / 8 / 7 |") < out.index("Targets (issue 7):")
    assert bench_compare.main(["--render", str(tmp_path / "missing.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("python -m bench.compare: error: cannot read ") and err.count("\n") == 1
