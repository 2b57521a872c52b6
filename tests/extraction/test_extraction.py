"""Tests of the extraction package: validity, optimality against brute force, honesty, CLI."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensat.extraction import (
    EGraph,
    ENode,
    ExtractionResult,
    InputError,
    dag_cost,
    extract,
    greedy_dag,
    ilp_extract,
    load_egraph,
    tree_costs,
    validate,
)
from tensat.extraction.cli import add_arguments, main, run
from tests.helpers import ROOT

DATA = ROOT / "tests" / "data" / "extraction_gym"  # two of extraction-gym's Tensat e-graphs, shipped with the tests


# ---------------------------------------------------------------------------------------------
# helpers


def brute_force(eg: EGraph, forbidden: frozenset[str] = frozenset()) -> float | None:
    """Minimum DAG cost over all (class -> node) assignments whose reachable part is valid."""
    classes = list(eg.classes)
    options = [[n for n in eg.classes[c] if n not in forbidden] or [None] for c in classes]
    best: float | None = None
    for combo in itertools.product(*options):
        choice = {c: n for c, n in zip(classes, combo) if n is not None}
        try:
            validate(eg, _reachable_only(eg, choice))
        except (ValueError, KeyError):
            continue
        cost = dag_cost(eg, choice)
        if best is None or cost < best:
            best = cost
    return best


def _reachable_only(eg: EGraph, choice: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    stack = list(eg.roots)
    while stack:
        c = stack.pop()
        if c in out:
            continue
        out[c] = choice[c]  # KeyError: a reachable class has no usable node
        stack.extend(eg.nodes[choice[c]].children)
    return out


@st.composite
def egraphs(draw: st.DrawFn, max_classes: int = 6, max_nodes: int = 3) -> tuple[EGraph, frozenset[str]]:
    """Random e-graphs (cycles allowed, including self-loops) plus a random forbidden set."""
    n_classes = draw(st.integers(1, max_classes))
    nodes: dict[str, ENode] = {}
    for c in range(n_classes):
        for i in range(draw(st.integers(1, max_nodes))):
            kids = draw(st.lists(st.integers(0, n_classes - 1), max_size=3))
            cost = draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 7.0]))
            nodes[f"n{c}_{i}"] = ENode(f"op{c}_{i}", cost, f"c{c}", tuple(f"c{k}" for k in kids))
    roots = draw(st.lists(st.sampled_from([f"c{c}" for c in range(n_classes)]), min_size=1, max_size=2))
    forbidden = draw(st.frozensets(st.sampled_from(sorted(nodes)), max_size=2))
    return EGraph(nodes, roots), forbidden


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------------------------
# random e-graphs: validity, optimality, forbidden nodes


@FAST
@given(egraphs())
def test_greedy_valid_or_none_exists(case: tuple[EGraph, frozenset[str]]) -> None:
    eg, forbidden = case
    best = brute_force(eg, forbidden)
    if best is None:
        with pytest.raises(ValueError):
            greedy_dag(eg, forbidden)
        return
    res = greedy_dag(eg, forbidden)
    validate(eg, res)
    assert not forbidden & set(res.choices.values())
    assert res.cost >= best - 1e-9
    assert res.status == "greedy" and res.method == "greedy" and res.bound is None


@FAST
@given(egraphs())
def test_ilp_matches_brute_force(case: tuple[EGraph, frozenset[str]]) -> None:
    eg, forbidden = case
    best = brute_force(eg, forbidden)
    if best is None:
        with pytest.raises(ValueError):
            ilp_extract(eg, forbidden=forbidden)
        return
    res = ilp_extract(eg, forbidden=forbidden, time_limit=20)
    validate(eg, res)
    assert not forbidden & set(res.choices.values())
    assert res.cost == pytest.approx(best, abs=1e-9)
    assert res.status == "optimal" and res.info["stop"] == "gap"
    assert res.bound is not None and res.bound <= res.cost + 1e-9
    assert res.gap() <= res.info["gap_tolerance"] * (1 + 1e-9)  # float slack


@settings(max_examples=8, deadline=None)
@given(egraphs(max_classes=5))
def test_ilp_cbc_matches_brute_force(case: tuple[EGraph, frozenset[str]]) -> None:
    eg, forbidden = case
    best = brute_force(eg, forbidden)
    if best is None:
        return
    res = ilp_extract(eg, solver="cbc", forbidden=forbidden, time_limit=20)
    validate(eg, res)
    assert res.cost == pytest.approx(best, abs=1e-9)
    assert res.status == "optimal"


@settings(max_examples=30, deadline=None)
@given(egraphs())
def test_json_round_trip(case: tuple[EGraph, frozenset[str]]) -> None:
    eg, _ = case
    again = EGraph.from_json(json.loads(json.dumps(eg.to_json())))
    assert again.nodes == eg.nodes and again.roots == eg.roots and again.classes == eg.classes


def test_cycles_are_avoided() -> None:
    # a = f(b) is cheap but b's only cheap node needs a: the cheap pair is a cycle.
    nodes = {
        "a_cyc": ENode("f", 0.0, "a", ("b",)),
        "a_leaf": ENode("leaf", 5.0, "a", ()),
        "b_cyc": ENode("g", 0.0, "b", ("a",)),
        "b_leaf": ENode("leaf", 4.0, "b", ()),
        "r": ENode("root", 1.0, "r", ("a", "b")),
    }
    eg = EGraph(nodes, ["r"])
    for res in (greedy_dag(eg), ilp_extract(eg)):
        validate(eg, res)
        assert res.cost == pytest.approx(5.0)  # r + b_leaf, a = f(b)


@st.composite
def rings(draw: st.DrawFn) -> EGraph:
    """A ring of classes, each with a cheap node needing the next class and a costly leaf, plus
    random extra nodes: the cheapest ILP relaxation is the cycle, so lazy cuts are needed."""
    k = draw(st.integers(3, 6))
    nodes: dict[str, ENode] = {"root": ENode("root", 1.0, "r", tuple(f"c{i}" for i in range(k)))}
    for i in range(k):
        nodes[f"cyc{i}"] = ENode("cyc", draw(st.sampled_from([0.0, 0.5])), f"c{i}", (f"c{(i + 1) % k}",))
        nodes[f"leaf{i}"] = ENode("leaf", draw(st.sampled_from([3.0, 4.0, 6.0])), f"c{i}", ())
        if draw(st.booleans()):
            other = draw(st.integers(0, k - 1))
            nodes[f"x{i}"] = ENode("x", draw(st.sampled_from([1.0, 2.0])), f"c{i}", (f"c{other}",))
    return EGraph(nodes, ["r"])


@FAST
@given(rings())
def test_ring_needs_cycle_cuts(eg: EGraph) -> None:
    best = brute_force(eg)
    res = ilp_extract(eg)
    validate(eg, res)
    assert res.cost == pytest.approx(best, abs=1e-9) and res.status == "optimal"
    validate(eg, greedy_dag(eg))


def test_lazy_cuts_used() -> None:
    nodes = {"root": ENode("root", 1.0, "r", ("a", "b", "c"))}
    for c, nxt in (("a", "b"), ("b", "c"), ("c", "a")):  # equal leaves: no pruning settles it
        nodes[f"{c}_cyc"] = ENode("cyc", 0.0, c, (nxt,))
        nodes[f"{c}_leaf"] = ENode("leaf", 3.0, c, ())
    eg = EGraph(nodes, ["r"])
    for solver in ("highs", "cbc"):
        res = ilp_extract(eg, solver=solver)
        validate(eg, res)
        assert res.cost == pytest.approx(4.0) and res.status == "optimal"
        assert res.info["cuts"] >= 1 and res.info["iterations"] >= 2


def test_sharing_counted_once() -> None:
    # Tree cost would pick x twice; DAG cost shares it.
    nodes = {
        "x": ENode("x", 3.0, "x", ()),
        "y1": ENode("y1", 1.0, "y", ("x",)),
        "y2": ENode("y2", 2.5, "y", ()),
        "z1": ENode("z1", 1.0, "z", ("x",)),
        "z2": ENode("z2", 2.5, "z", ()),
        "r": ENode("r", 0.0, "r", ("y", "z")),
    }
    eg = EGraph(nodes, ["r"])
    assert ilp_extract(eg).cost == pytest.approx(5.0)
    assert greedy_dag(eg).cost <= 5.0 + 1e-9


def test_tree_costs_price_each_enode_with_the_cheapest_work_below_it():
    eg = _shared_leaf()
    trees = tree_costs(eg)
    assert trees["s"] == 1.0 and trees["a1"] == trees["b1"] == 2.0 and trees["a2"] == 1.9
    assert trees["r"] == 1.0 + 1.9 + 1.9  # a tree does not share s
    assert tree_costs(eg, forbidden=frozenset({"a2"}))["r"] == 1.0 + 2.0 + 1.9
    assert tree_costs(eg, forbidden=frozenset({"s"}))["a1"] == float("inf")


def _shared_leaf() -> EGraph:
    """Greedy keeps the cheaper unshared leaves (1 + 1.9 + 1.9 = 4.8); sharing s is optimal (4.0).

    The pruning lower bound is 3.0 (r plus the cheapest node of a and of b), so the greedy
    selection is within 40% of a bound known before any solver call.
    """
    nodes = {
        "r": ENode("r", 1.0, "r", ("a", "b")),
        "a1": ENode("a1", 1.0, "a", ("s",)),
        "a2": ENode("a2", 1.9, "a", ()),
        "b1": ENode("b1", 1.0, "b", ("s",)),
        "b2": ENode("b2", 1.9, "b", ()),
        "s": ENode("s", 1.0, "s", ()),
    }
    return EGraph(nodes, ["r"])


def test_gap_tolerance_stops_on_a_bound_within_it() -> None:
    eg = _shared_leaf()
    assert greedy_dag(eg).cost == pytest.approx(4.8) and brute_force(eg) == pytest.approx(4.0)
    loose = ilp_extract(eg, gap_tolerance=0.4)
    validate(eg, loose)
    assert loose.info["stop"] == "gap" and loose.info["iterations"] == 0  # no solver call was needed
    assert loose.cost == pytest.approx(4.8) and loose.status == "optimal"  # optimal within 40%, as documented
    assert loose.bound <= 4.0 + 1e-9 and loose.cost - loose.bound <= 0.4 * loose.cost
    exact = ilp_extract(eg, gap_tolerance=0.0)
    assert exact.cost == pytest.approx(4.0) and exact.status == "optimal" and exact.gap() == 0.0
    assert exact.info["incumbents"][-1][1] == pytest.approx(4.0) and exact.info["incumbents"][0][2] == "initial"


@pytest.mark.parametrize("kw", [{"gap_tolerance": -1e-3}, {"gap_tolerance": float("nan")}, {"stall_seconds": 0.0}])
def test_stop_rule_parameters_are_checked(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ilp_extract(_shared_leaf(), **kw)


def test_forbidden_everything_raises() -> None:
    nodes = {"a": ENode("a", 1.0, "r", ()), "b": ENode("b", 2.0, "r", ())}
    eg = EGraph(nodes, ["r"])
    with pytest.raises(ValueError, match="forbidden"):
        greedy_dag(eg, frozenset({"a", "b"}))
    with pytest.raises(ValueError):
        ilp_extract(eg, forbidden=frozenset({"a", "b"}))
    assert ilp_extract(eg, forbidden=frozenset({"a"})).choices == {"r": "b"}


def test_root_only_in_cycle_raises() -> None:
    eg = EGraph({"a": ENode("a", 1.0, "r", ("r",))}, ["r"])
    with pytest.raises(ValueError, match="acyclic"):
        greedy_dag(eg)
    with pytest.raises(ValueError, match="acyclic"):
        extract(eg)


def test_extract_dispatch() -> None:
    eg = EGraph({"a": ENode("a", 1.0, "r", ())}, ["r"])
    assert extract(eg, "greedy", time_limit=1, solver="cbc").method == "greedy"
    assert extract(eg, "ilp").method == "ilp"
    with pytest.raises(ValueError):
        extract(eg, "magic")


# ---------------------------------------------------------------------------------------------
# validate()


def _small() -> EGraph:
    nodes = {
        "r0": ENode("r", 1.0, "r", ("a",)),
        "a0": ENode("a", 1.0, "a", ("b",)),
        "a1": ENode("a'", 9.0, "a", ()),
        "b0": ENode("b", 1.0, "b", ("a",)),
        "b1": ENode("b'", 2.0, "b", ()),
    }
    return EGraph(nodes, ["r"])


def test_validate_accepts_valid() -> None:
    validate(_small(), {"r": "r0", "a": "a0", "b": "b1"})


@pytest.mark.parametrize(
    "choices, forbidden, message",
    [
        ({"a": "a1"}, (), "root"),
        ({"r": "r0", "a": "a0"}, (), "child e-class"),
        ({"r": "r0", "a": "a1"}, ("a1",), "forbidden"),
        ({"r": "r0", "a": "a0", "b": "b0"}, (), "cyclic"),
        ({"r": "r0", "a": "b1", "b": "b1"}, (), "another class"),
        ({"r": "r0", "a": "nope"}, (), "unknown"),
    ],
)
def test_validate_rejects(choices: dict[str, str], forbidden: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate(_small(), choices, forbidden)


def test_validate_checks_result_cost_and_own_forbidden() -> None:
    eg = _small()
    good = {"r": "r0", "a": "a0", "b": "b1"}
    with pytest.raises(ValueError, match="cost"):
        validate(eg, ExtractionResult(good, 1.0, None, "greedy", 0.0, "greedy"))
    res = greedy_dag(eg, frozenset({"b1"}))
    validate(eg, res)
    res.choices = good
    res.cost = 4.0
    with pytest.raises(ValueError, match="forbidden"):
        validate(eg, res)


# ---------------------------------------------------------------------------------------------
# malformed input


@pytest.mark.parametrize(
    "data, message",
    [
        ([], "object"),
        ({"root_eclasses": ["c"]}, "nodes"),
        (
            {"nodes": {"a": {"op": "x", "cost": 1, "eclass": "c", "children": ["zz"]}}, "root_eclasses": ["c"]},
            "unknown child",
        ),
        (
            {"nodes": {"a": {"op": "x", "cost": 1, "eclass": "c", "children": []}}, "root_eclasses": ["d"]},
            "root e-class",
        ),
        ({"nodes": {"a": {"op": "x", "cost": 1, "eclass": "c", "children": []}}}, "root_eclasses"),
        ({"nodes": {"a": {"op": "x", "cost": -1, "eclass": "c", "children": []}}, "root_eclasses": ["c"]}, "cost"),
        ({"nodes": {"a": {"op": "x", "cost": "1", "eclass": "c", "children": []}}, "root_eclasses": ["c"]}, "cost"),
        ({"nodes": {"a": {"op": "x", "cost": 1, "children": []}}, "root_eclasses": ["c"]}, "eclass"),
    ],
)
def test_from_json_rejects(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EGraph.from_json(data)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# status honesty under a time limit


@pytest.fixture
def no_path_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weaken the pruning's path bound to 0 (still a valid bound): vgg's critical path proves its optimum at once,
    and the tests using this fixture need an ILP that must cut cycles to close, as vgg's does without it."""
    from tensat.extraction import ilp

    monkeypatch.setattr(ilp, "_critical_paths", lambda ix, alive: [0.0] * len(ix.class_ids))
    monkeypatch.setattr(ilp, "_root_paths", lambda ix, alive: [0.0] * len(ix.class_ids))


def _consistent(res: ExtractionResult, greedy_cost: float) -> None:
    assert res.bound is not None and res.bound <= res.cost + 1e-9
    if res.status == "optimal":
        assert res.gap() is not None and res.gap() <= res.info["gap_tolerance"] * 1.01
    elif res.status == "feasible":
        assert res.cost < greedy_cost and res.gap() > 1e-6
    else:
        assert res.status == "fallback"
        assert res.cost == pytest.approx(greedy_cost)


@pytest.mark.parametrize(
    "limit, solver", [(0.3, "highs"), (2.0, "highs"), pytest.param(2.5, "cbc", marks=pytest.mark.slow)]
)
def test_time_limit_status_is_honest(limit: float, solver: str, no_path_bound: None) -> None:
    eg = load_egraph(DATA / "vgg.json")  # its ILP does not close within seconds
    greedy = greedy_dag(eg)
    res = ilp_extract(eg, time_limit=limit, initial=greedy, solver=solver)
    validate(eg, res)
    _consistent(res, greedy.cost)
    assert res.status != "optimal"
    assert res.seconds <= limit + 1.0


def test_vgg_gap_tolerance_ends_the_cut_loop(no_path_bound: None) -> None:
    """vgg's first relaxation bound (2.64) is within 50% of greedy's 4.851 (the MIP start): a 0.5 tolerance, passed
    to the solver as its own gap, ends the run after the first solve instead of cutting cycles for 30 s."""
    eg = load_egraph(DATA / "vgg.json")
    greedy = greedy_dag(eg)
    res = ilp_extract(eg, time_limit=30, initial=greedy, gap_tolerance=0.5)
    validate(eg, res)
    _consistent(res, greedy.cost)
    assert res.info["stop"] == "gap" and res.info["iterations"] == 1
    assert res.status == "optimal" and res.cost == pytest.approx(greedy.cost)
    assert res.cost - res.bound <= 0.5 * res.cost and res.bound <= 4.85076 + 1e-9


@pytest.mark.parametrize("solver", ["highs", pytest.param("cbc", marks=pytest.mark.slow)])
def test_vgg_stall_window_stops_the_search(solver: str, no_path_bound: None) -> None:
    """No cheaper selection than greedy turns up on vgg: the stall window ends the run, honestly."""
    eg = load_egraph(DATA / "vgg.json")
    greedy = greedy_dag(eg)
    stall = 2.0 if solver == "highs" else 2.5  # CBC's calls take whole seconds
    res = ilp_extract(eg, time_limit=30, initial=greedy, solver=solver, stall_seconds=stall)
    validate(eg, res)
    _consistent(res, greedy.cost)
    assert res.info["stop"] == "stall" and res.status == "fallback"
    assert res.info["incumbent_seconds"] == 0.0 and res.cost == pytest.approx(greedy.cost)
    assert res.seconds <= stall + 1.0 + (1.0 if solver == "cbc" else 0.0)


def test_vgg_optimum_is_proven_by_its_critical_path() -> None:
    """vgg is a chain of layers: every acyclic term holds a root-to-leaf path as costly as greedy's whole DAG, so the
    pruning's bound proves 4.85076 optimal with no ILP (the cut loop alone ends near 4.1 after 100 s)."""
    from tensat.extraction import ilp

    eg = load_egraph(DATA / "vgg.json")
    ix = eg.index
    greedy = greedy_dag(eg)
    below = ilp._critical_paths(ix, [True] * len(ix.node_ids))
    assert below[ix.roots[0]] == pytest.approx(greedy.cost, rel=1e-12) == pytest.approx(4.85076, abs=1e-5)
    res = ilp_extract(eg, time_limit=10, initial=greedy, gap_tolerance=0.0)
    validate(eg, res)
    assert res.status == "optimal" and res.info["stop"] == "gap" and res.info["model"].startswith("not built")
    assert res.bound == pytest.approx(res.cost, rel=1e-12) and res.cost == pytest.approx(greedy.cost)
    assert res.info["prune"]["path_bound"] > 0


def test_path_bound_prunes_nodes_whose_path_and_term_exceed_the_incumbent() -> None:
    """R is r(X) or r2(L); x(Y) leads to Y = y1(Z1) | y2(Z2) over leaves: every term under x is a chain of three
    unit nodes, though only Y is needed. Against the incumbent r2, L at 2.5 the needed classes bound x by 2, its
    critical path by 3: only the path bound prunes it, and it proves the incumbent."""
    from tensat.extraction import ilp

    nodes = {
        "r": ENode("r", 0.0, "R", ("X",)),
        "r2": ENode("r2", 0.0, "R", ("L",)),
        "l": ENode("l", 2.5, "L", ()),
        "x": ENode("x", 1.0, "X", ("Y",)),
        "y1": ENode("y1", 1.0, "Y", ("Z1",)),
        "y2": ENode("y2", 1.0, "Y", ("Z2",)),
        "z1": ENode("z1", 1.0, "Z1", ()),
        "z2": ENode("z2", 1.0, "Z2", ()),
    }
    eg = EGraph(nodes, ["R"])
    ix = eg.index
    alive = [True] * len(ix.node_ids)
    assert ilp._root_paths(ix, alive)[ix.class_pos["Z1"]] == pytest.approx(2.0)
    assert ilp._critical_paths(ix, alive)[ix.class_pos["X"]] == pytest.approx(3.0)
    red = ilp._reduce(ix, [False] * len(ix.node_ids), 2.5)
    kept = {ix.node_ids[n] for n, al in enumerate(red.alive) if al}
    assert kept == {"r2", "l"} and red.stats["cost_bound"] == 0 and red.stats["path_bound"] >= 1
    assert red.lower_bound == pytest.approx(2.5)
    res = ilp_extract(eg, gap_tolerance=0.0)
    assert res.cost == pytest.approx(2.5) == brute_force(eg) and res.status == "optimal"


def test_highs_is_interrupted_inside_its_search() -> None:
    """The stop rules reach into a running HiGHS search (callbacks), not only between solver calls."""
    from tensat.extraction import ilp

    eg = load_egraph(DATA / "vgg.json")
    ix = eg.index
    greedy = greedy_dag(eg)
    red = ilp._reduce(ix, ilp._forbidden_mask(ix, frozenset()), greedy.cost)
    model = ilp._Model(ix, red)
    choice = [-1] * len(ix.class_ids)
    for c, n in greedy.choices.items():
        choice[ix.class_pos[c]] = ix.node_pos[n]
    model.stop = ilp._Stop(ix, time.perf_counter(), choice, greedy.cost, 1e-4, 1e-6)  # window already over
    res = model.solve("highs", 30.0, model.start_values(choice))
    assert res.interrupted and model.stop.reason == "stall" and not res.proven
    assert res.bound is None or res.bound <= greedy.cost + 1e-9
    model.stop = ilp._Stop(ix, time.perf_counter(), choice, greedy.cost, 1e-4, None)
    res = model.solve("highs", 30.0, model.start_values(choice))  # no window: the relaxation is solved
    assert not res.interrupted and res.proven and res.objective < greedy.cost


def test_model_building_stops_at_its_deadline() -> None:
    """A model that could not be solved in time is not built: the deadline bounds building too."""
    from tensat.extraction import ilp

    eg = load_egraph(DATA / "vgg.json")
    ix = eg.index
    red = ilp._reduce(ix, ilp._forbidden_mask(ix, frozenset()), greedy_dag(eg).cost)
    with pytest.raises(ilp._OutOfTime):
        ilp._Model(ix, red, deadline=time.perf_counter())
    assert ilp._Model(ix, red).prob.numConstraints() > 0


def test_resnet50_acyclic_proven() -> None:
    eg = load_egraph(DATA / "resnet50_acyclic.json")
    greedy = greedy_dag(eg)
    res = ilp_extract(eg, time_limit=30)
    validate(eg, res)
    _consistent(res, greedy.cost)
    assert res.status == "optimal" and res.cost <= greedy.cost


def test_vgg_real() -> None:
    eg = load_egraph(DATA / "vgg.json")
    greedy = greedy_dag(eg)
    validate(eg, greedy)
    assert greedy.cost <= 4.851 * 1.0001
    res = ilp_extract(eg, time_limit=5, initial=greedy)
    validate(eg, res)
    assert res.cost <= greedy.cost + 1e-12
    assert abs(res.cost - 4.851) <= 0.01 * 4.851


# ---------------------------------------------------------------------------------------------
# command line


def _cli(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "tensat.extraction", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )


def test_cli_ok(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    path.write_text(json.dumps(_small().to_json()))
    for extra in ([], ["--extractor", "greedy"], ["--solver", "cbc", "--time-limit", "5"]):
        proc = _cli(tmp_path, str(path), *extra)
        assert proc.returncode == 0, proc.stderr
        assert "cost     4" in proc.stdout and "status" in proc.stdout and "bound" in proc.stdout


@pytest.mark.parametrize(
    "content",
    [
        None,
        "{not json",
        '{"nodes": {"a": {"op": "x", "cost": 1, "eclass": "c", "children": ["q"]}}, "root_eclasses": ["c"]}',
        '{"nodes": {}, "root_eclasses": ["c"]}',
        b"\xff\xfe\x00",
    ],
)
def test_cli_bad_input(tmp_path: Path, content: str | bytes | None) -> None:
    path = tmp_path / "bad.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    proc = _cli(tmp_path, str(path))
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith(
        f"python -m tensat.extraction: error: {'cannot read ' if content is None else ''}{path}"
    )
    assert proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr


def test_cli_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(_small().to_json()))
    assert run(parser.parse_args([str(path), "--forbid", "b1"])) == 0
    out = capsys.readouterr().out
    assert "cost     10" in out  # r0 + a1 once b1 is forbidden (a0 -> b0 -> a is a cycle)
    missing = tmp_path / "missing.json"
    with pytest.raises(InputError, match=r"^cannot read .*missing\.json: No such file or directory$"):
        run(parser.parse_args([str(missing)]))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InputError, match=r"bad\.json: not valid JSON"):
        run(parser.parse_args([str(tmp_path / "bad.json")]))
    assert capsys.readouterr().out == ""


def test_cli_main_reports_bad_input_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing.json")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        captured.err == f"python -m tensat.extraction: error: cannot read {tmp_path / 'missing.json'}: "
        "No such file or directory\n"
    )
    (tmp_path / "cyclic.json").write_text(
        json.dumps({"nodes": {"a": {"op": "f", "cost": 1, "eclass": "c", "children": ["a"]}}, "root_eclasses": ["c"]})
    )
    assert main([str(tmp_path / "cyclic.json"), "--extractor", "greedy"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"python -m tensat.extraction: error: {tmp_path / 'cyclic.json'}: ") and err.count("\n") == 1


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--time-limit", "0"),
        ("--time-limit", "x"),
        ("--stall-seconds", "-1"),
        ("--gap-tolerance", "-0.1"),
        ("--gap-tolerance", "nan"),
    ],
)
def test_cli_rejects_bad_flag_values_as_usage_errors(flag: str, value: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["g.json", flag, value])
    assert exc.value.code == 2
    assert f"argument {flag}:" in capsys.readouterr().err


def test_cli_accepts_boundary_flag_values() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["g.json", "--gap-tolerance", "0", "--time-limit", "0.5", "--stall-seconds", "2"])
    assert (args.gap_tolerance, args.time_limit, args.stall_seconds) == (0.0, 0.5, 2.0)


def test_cli_help_says_where_the_result_goes(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "printed to stdout" in text and "nothing is written to files" in text
    assert all(word in text for word in ("cost", "status", "bound", "time"))


def test_tensat_extract_help_says_where_the_result_goes(capsys) -> None:
    from tensat.cli import main as tensat_main

    with pytest.raises(SystemExit):
        tensat_main(["extract", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "printed to stdout" in text and "nothing is written to files" in text


def test_tensat_extract_bad_input_is_one_error_line(tmp_path: Path, capsys) -> None:
    """Needs tensat/cli.py to catch extraction.InputError (exit 1, `tensat: error: ...`)."""
    from tensat.cli import main as tensat_main

    assert tensat_main(["extract", str(tmp_path / "missing.json")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("tensat: error: cannot read ") and captured.err.count("\n") == 1


def test_filter_cycles_leaves_no_cycle_and_keeps_protected_nodes():
    import random

    from tensat.extraction import filter_cycles

    for seed in range(300):
        rng = random.Random(seed)
        n_classes = rng.randint(2, 9)
        nodes: dict[str, ENode] = {}
        # a protected acyclic selection: class k's first node uses only classes > k
        protected = []
        for k in range(n_classes):
            kids = tuple(str(j) for j in range(k + 1, n_classes) if rng.random() < 0.4)
            nodes[f"p{k}"] = ENode("op", 1.0, str(k), kids)
            protected.append(f"p{k}")
            for extra in range(rng.randint(0, 3)):
                kids = tuple(str(rng.randrange(n_classes)) for _ in range(rng.randint(1, 3)))
                nodes[f"n{k}_{extra}"] = ENode("op", rng.random(), str(k), kids)
        eg = EGraph(nodes, ["0"])
        preferred = [i for i in nodes if i not in protected and rng.random() < 0.5] if seed % 2 else []
        blacklist = filter_cycles(eg, protected, preferred=preferred)
        assert not blacklist & set(protected)
        usable = {i: n for i, n in nodes.items() if i not in blacklist}
        # no cycle among usable nodes reachable from the root: DFS over classes
        state: dict[str, int] = {}

        def visit(c: str) -> None:
            state[c] = 1
            for n in usable.values():
                if n.eclass == c:
                    for ch in n.children:
                        assert state.get(ch) != 1, f"cycle left through class {ch} (seed {seed})"
                        if not state.get(ch):
                            visit(ch)
            state[c] = 2

        visit("0")


def test_filter_cycles_spares_preferred_nodes_where_a_cycle_has_another_victim():
    from tensat.extraction import filter_cycles

    # class a: input node pa (leaf) and s = slice(b); class b: input node pb (leaf) and c = concat(a)
    nodes = {
        "pa": ENode("leaf", 1.0, "a", ()),
        "s": ENode("slice", 1.0, "a", ("b",)),
        "pb": ENode("leaf", 1.0, "b", ()),
        "c": ENode("concat", 1.0, "b", ("a",)),
        "r": ENode("add", 1.0, "r", ("a", "b")),
    }
    eg = EGraph(nodes, ["r"])
    protected = ["pa", "pb", "r"]
    assert len(filter_cycles(eg, protected)) == 1
    assert filter_cycles(eg, protected, preferred=["s"]) == {"c"}
    assert filter_cycles(eg, protected, preferred=["c"]) == {"s"}
    assert len(filter_cycles(eg, protected, preferred=["s", "c"])) == 1


def test_cli_filter_cycles_on_vgg(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args([str(DATA / "vgg.json"), "--filter-cycles", "--time-limit", "20"])) == 0
    out = capsys.readouterr().out
    assert "blacklisted" in out and "status   optimal" in out
    cost = float(out.split("cost")[1].split()[0])
    assert cost <= 4.851 * 1.01


def test_filter_cycles_blacklists_the_costly_recombination_not_the_slice_a_merge_needs():
    from tensat.extraction import filter_cycles
    from tensat.extraction.cycles import regrets

    # a = x@w1 (pa) or slice(m) (sa); b likewise; m = matmul(concat(x), concat(w1, w2)) (mm) or concat(a, b) (mc)
    nodes = {
        "x": ENode("input", 0.0, "x", ()),
        "pa": ENode("matmul", 10.0, "a", ("x",)),
        "sa": ENode("slice", 1.0, "a", ("m",)),
        "pb": ENode("matmul", 10.0, "b", ("x",)),
        "sb": ENode("slice", 1.0, "b", ("m",)),
        "mm": ENode("matmul", 12.0, "m", ("x",)),
        "mc": ENode("concat", 1.0, "m", ("a", "b")),
        "r": ENode("add", 1.0, "r", ("b", "a")),
    }
    eg = EGraph(nodes, ["r"])
    assert regrets(eg) == {"x": 0.0, "pa": 0.0, "sa": 3.0, "pb": 0.0, "sb": 3.0, "mm": 0.0, "mc": 9.0, "r": 0.0}
    protected = ["x", "pa", "pb", "r"]
    assert filter_cycles(eg, protected) == {"mc"}
    assert {"sa", "sb"} & filter_cycles(eg, protected, by_cost=False)  # the closing e-node first: a slice goes


# ---------------------------------------------------------------------------------------------
# local search


def _merge_chain_egraph() -> EGraph:
    """Three products x_i @ w (10 each) feeding r; a pair merge (12) and a three-way merge (13) over concatenated
    inputs (0.5 each), slices (1 each) back to each product, and concats of the products closing cycles like the
    e-graph's recombinations do."""
    nodes = {
        "x1": ENode("input", 0.0, "x1", ()),
        "x2": ENode("input", 0.0, "x2", ()),
        "x3": ENode("input", 0.0, "x3", ()),
    }
    for i in (1, 2, 3):
        nodes[f"p{i}"] = ENode("matmul", 10.0, f"a{i}", (f"x{i}",))
    nodes["x12"] = ENode("concat", 0.5, "x12", ("x1", "x2"))
    nodes["x123"] = ENode("concat", 0.5, "x123", ("x12", "x3"))
    nodes["m12"] = ENode("matmul", 12.0, "m12", ("x12",))
    nodes["c12"] = ENode("concat", 1.0, "m12", ("a1", "a2"))
    nodes["s1"] = ENode("slice", 1.0, "a1", ("m12",))
    nodes["s2"] = ENode("slice", 1.0, "a2", ("m12",))
    nodes["m123"] = ENode("matmul", 13.0, "m123", ("x123",))
    nodes["c123"] = ENode("concat", 1.0, "m123", ("m12", "a3"))
    nodes["t12"] = ENode("slice", 1.0, "m12", ("m123",))
    nodes["t3"] = ENode("slice", 1.0, "a3", ("m123",))
    nodes["r"] = ENode("add", 1.0, "r", ("a1", "a2", "a3"))
    return EGraph(nodes, ["r"])


def test_local_search_adopts_a_merge_chain_greedy_misses():
    from tensat.extraction import local_search

    eg = _merge_chain_egraph()
    greedy = greedy_dag(eg)
    assert greedy.cost == 31.0  # three separate products: a merge pays only when both users switch at once
    res = local_search(eg, greedy, time_limit=5)
    validate(eg, res)
    # r + slices of m12 (2) + m12 as a slice of m123 (1) + slice a3 (1) + m123 (13) + the two concats of inputs (1)
    assert res.cost == pytest.approx(brute_force(eg)) == 19.0
    assert res.choices["a1"] == "s1" and res.choices["m12"] == "t12" and res.choices["m123"] == "m123"
    assert res.method == "greedy+local" and res.status == "feasible" and res.info["moves"] >= 2


def test_local_search_returns_the_start_when_it_is_optimal():
    from tensat.extraction import local_search

    eg = _merge_chain_egraph()
    best = ilp_extract(eg, time_limit=20)
    assert local_search(eg, best, time_limit=5) is best


def test_the_cycle_filter_runs_only_when_time_is_left_for_the_ilp():
    from tensat.extraction import extract_best, filter_cycles

    eg = _merge_chain_egraph()
    assert filter_cycles(eg, ())  # the e-graph has cycles to filter
    initial = greedy_dag(eg)
    rushed = extract_best(eg, initial, time_limit=0.0)
    assert rushed.info["cycle_filter"] == {"blacklisted": 0, "seconds": 0.0}
    assert rushed.info["ilp_stop"] == "not proven optimal: no time was left for it"
    full = extract_best(eg, initial, time_limit=20)
    assert full.info["cycle_filter"]["blacklisted"] > 0 and full.status == "optimal" and full.cost == 19.0


def test_greedy_and_a_finished_local_search_are_memoized_on_the_egraph_as_copies():
    """A repeated run on the same e-graph (an exploration sample's, repeated by the extraction) does no work, and
    what a caller changes in a result does not reach the memo; a search cut by its time limit is not memoized."""
    from tensat.extraction import local_search

    eg = _merge_chain_egraph()
    greedy = greedy_dag(eg)
    greedy.method, greedy.info["mark"] = "changed", 1
    again = greedy_dag(eg)
    assert again.method == "greedy" and "mark" not in again.info and again.choices == greedy.choices
    cut = local_search(eg, greedy_dag(eg), time_limit=0.0)
    assert cut.cost == 31.0 and not any(key[0] == "local" for key in eg.memo)
    first = local_search(eg, greedy_dag(eg), time_limit=5)
    first.choices["r"] = "changed"
    second = local_search(eg, greedy_dag(eg), time_limit=5)
    assert second.cost == 19.0 and second.choices["r"] == "r" and second is not first
    start = greedy_dag(eg)
    start.choices = dict(second.choices)
    start.cost = second.cost
    assert local_search(eg, start, time_limit=5) is start  # its result is a local optimum: a search there stops
    eg.memo.clear()
    assert local_search(eg, start, time_limit=5) is start  # and finds so when it searches


@FAST
@given(egraphs(max_classes=6, max_nodes=3), st.integers(0, 2**31 - 1))
def test_local_search_valid_never_worse_and_priced_exactly(case: tuple[EGraph, frozenset[str]], seed: int) -> None:
    import random

    from tensat.extraction import local_search
    from tensat.extraction.greedy import _forbidden_mask, selection_cost
    from tensat.extraction.local import _delta, _reached, _refcounts, _tree_choice

    eg, forbidden = case
    if brute_force(eg, forbidden) is None:
        return
    start = greedy_dag(eg, forbidden)
    res = local_search(eg, start, forbidden=forbidden, time_limit=5)
    validate(eg, res, forbidden)
    assert res.cost <= start.cost + 1e-9
    assert res.cost >= brute_force(eg, forbidden) - 1e-9
    # The incremental pricing agrees with a full recount wherever it accepts a move, and accepts no cyclic one.
    ix = eg.index
    rng = random.Random(seed)
    banned = _forbidden_mask(ix, forbidden)
    arr = _tree_choice(ix, banned, False)
    for c, n in start.choices.items():
        arr[ix.class_pos[c]] = ix.node_pos[n]
    refs, pos = _refcounts(ix, arr, _reached(ix, arr))
    base = selection_cost(ix, arr)
    usable = [n for n in range(len(ix.node_ids)) if not banned[n]]
    for _ in range(20):
        move = {}
        for n in rng.sample(usable, rng.randint(1, min(3, len(usable)))):
            move[ix.node_class[n]] = n
        new = list(arr)
        for c, n in move.items():
            new[c] = n
        full = selection_cost(ix, new)
        d = _delta(ix, arr, refs, pos, move)
        if d is not None:
            assert full is not None and full == pytest.approx(base + d, abs=1e-9)
        if full is None:
            assert d is None


@FAST
@given(egraphs(max_classes=6, max_nodes=3), st.integers(0, 2**31 - 1))
def test_delta_with_goal_skips_only_cycle_searches_that_cannot_matter(
    case: tuple[EGraph, frozenset[str]], seed: int
) -> None:
    import random

    from tensat.extraction.greedy import _forbidden_mask
    from tensat.extraction.local import _delta, _negated_kids, _reached, _refcounts, _tree_choice

    eg, forbidden = case
    if brute_force(eg, forbidden) is None:
        return
    ix = eg.index
    rng = random.Random(seed)
    banned = _forbidden_mask(ix, forbidden)
    arr = _tree_choice(ix, banned, False)
    spare = _tree_choice(ix, banned, True)
    start = greedy_dag(eg, forbidden)
    for c, n in start.choices.items():
        arr[ix.class_pos[c]] = spare[ix.class_pos[c]] = ix.node_pos[n]
    refs, pos = _refcounts(ix, arr, _reached(ix, arr))
    nkids = _negated_kids(ix)
    usable = [n for n in range(len(ix.node_ids)) if not banned[n]]
    for _ in range(20):
        move = {ix.node_class[n]: n for n in rng.sample(usable, rng.randint(1, min(3, len(usable))))}
        goal = rng.uniform(-3.0, 1.0)
        before = (list(arr), list(refs))
        full = _delta(ix, arr, refs, pos, move, nkids)
        lazy = _delta(ix, arr, refs, pos, move, nkids, 0.0, goal, (spare,))
        assert (list(arr), list(refs)) == before  # priced in place, then restored
        if full is not None and full < goal or lazy is not None and lazy < goal:
            assert lazy == full  # an improving price is always searched for cycles
        elif lazy is not None and full is None:
            # Unsearched and cyclic: the spare selection then prices the move no better.
            other = _delta(ix, spare, refs, pos, move, nkids)
            assert other is None or not other < goal


def test_highs_banner_stays_off_stdout() -> None:
    """HiGHS writes a banner to the process's stdout when the first Highs object is made; the ILP makes its first one
    through `quiet_highs`, so a solve leaves stdout empty (a fresh process: the banner is written once per process)."""
    bare = "import highspy; highspy.Highs()"
    solve = (
        "from tensat.extraction.ilp import quiet_highs; import highspy; quiet_highs(); h = highspy.Highs(); "
        "h.setOptionValue('output_flag', False); h.run()"
    )
    runs = [[sys.executable, "-c", code] for code in (bare, solve)]
    out = [subprocess.run(cmd, capture_output=True, text=True, check=True) for cmd in runs]
    assert "HiGHS" in out[0].stdout  # the banner this guards against is still written
    assert out[1].stdout == ""
