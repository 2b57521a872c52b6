"""The time budget (one limit for the whole search, an anytime result) and the exploration's convergence test."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tensat
import tensat.api as api
from bench.zoo_models import build_zoo_model
from tensat import rewrites
from tensat.errors import TensatError
from tensat.ir import Graph
from tensat.measure import make_measured_cost
from tensat.models import SMALL_SIZES, build_model
from tensat.options import Options


def test_a_budget_too_short_to_explore_still_returns_a_verified_graph_no_costlier() -> None:
    """Whether the little time left finds a cheaper graph depends on the machine's load; the result is always a
    verified graph, never costlier than the input, with a warning naming the flag that buys more time."""
    result = tensat.optimize_with_details(build_model("nasrnn"), cost="analytic", latency_check=0, time_budget=0.3)
    assert result.exploration.stop_reason == "time_budget"
    assert any("time budget" in w and "--time-budget" in w for w in result.warnings)
    assert result.verification is not None and result.verification.ok
    assert result.cost_after <= result.cost_before * (1 + 1e-9)


@pytest.mark.slow  # two searches of ResNeXt-50, one to saturation (the default run checks the stop in the next test)
def test_exploration_stops_once_the_sampled_cost_stops_falling_and_loses_nothing() -> None:
    graph = build_model("resnext50", **SMALL_SIZES["resnext50"])  # saturates, but only after its cost stops falling
    sampled = tensat.optimize_with_details(graph, cost="analytic", latency_check=0, verify=False)
    full = tensat.optimize_with_details(graph, cost="analytic", latency_check=0, verify=False, patience=0)
    assert sampled.exploration.stop_reason == "converged"
    assert full.exploration.stop_reason == "saturated"
    assert len(sampled.exploration.iterations) < len(full.exploration.iterations)
    assert sampled.cost_after == pytest.approx(full.cost_after, rel=1e-9)


@pytest.mark.slow  # two full searches of BERT
def test_a_plateau_while_the_back_off_defers_matches_is_not_convergence() -> None:
    """BERT's sampled cost is flat for three iterations in which the back-off banned rules; the merges that save
    a fifth of its cost come only after those rules run again."""
    graph = build_model("bert")
    result = tensat.optimize_with_details(graph, cost="analytic", latency_check=0, verify=False)
    full = tensat.optimize_with_details(graph, cost="analytic", latency_check=0, verify=False, patience=0)
    assert result.cost_after == pytest.approx(full.cost_after, rel=1e-9)
    assert result.cost_after < 0.8 * result.cost_before


@pytest.mark.parametrize("options", [{"time_budget": 0}, {"time_budget": -1.0}, {"patience": -1}])
def test_out_of_range_budget_and_patience_are_one_line_errors(options: dict[str, float]) -> None:
    with pytest.raises(TensatError, match="time|patience"):
        tensat.optimize_with_details(build_model("squeezenet"), cost="analytic", **options)


@pytest.mark.slow
def test_exploration_also_stops_once_the_sampled_cost_has_been_flat_for_a_share_of_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the share at zero, the first sample that does not lower the cost ends the exploration, before the
    patience would."""
    import tensat.api as api

    graph = build_model("resnext50", **SMALL_SIZES["resnext50"])
    monkeypatch.setattr(api, "STALE_SHARE", float("inf"))
    patient = tensat.optimize_with_details(graph, cost="analytic", latency_check=0, verify=False)
    monkeypatch.setattr(api, "STALE_SHARE", 0.0)
    hasty = tensat.optimize_with_details(graph, cost="analytic", latency_check=0, verify=False)
    assert patient.exploration.stop_reason == hasty.exploration.stop_reason == "converged"
    assert len(hasty.exploration.iterations) < len(patient.exploration.iterations)
    assert hasty.cost_after <= hasty.cost_before


@pytest.mark.slow  # a search of BERT through both stages (the default run checks `all` in the test of its checkpoint)
def test_with_every_rule_the_multi_pattern_rules_run_in_the_first_iterations_of_the_whole_exploration() -> None:
    """`--rules all` explores with the hand-written rules, then goes on with the generated ones too: the second stage
    continues the exploration, and does not start over the unthrottled multi-pattern iteration that is meant for
    the input's nodes (over the e-graph the first stage reached, its pairs are most of a search's time)."""
    graph = build_model("bert", **SMALL_SIZES["bert"])
    result = tensat.optimize_with_details(
        graph, rules="all", cost="analytic", latency_check=0, verify=False, time_budget=60, iter_limit=7
    )
    iterations = result.exploration.iterations
    assert [i.multi for i in iterations[:1]] == [True]
    assert len(iterations) > 1 and not any(i.multi for i in iterations[1:])


@pytest.mark.slow
def test_a_generated_set_is_registered_as_the_e_graph_comes_to_hold_its_ops() -> None:
    """`--rules generated` registers the rules over the input's ops, then, stage by stage, those over the ops the
    e-graph came to hold: a rule over an op the input lacks is registered once a rule built it, and the closure of
    what rules could build (`rewrites.select_rules`), most of the set, is not registered up front."""
    graph = Graph()
    x = graph.input("x", (4, 8))
    h = graph.add("relu", [graph.add("matmul", [x, graph.weight(np.ones((8, 8), np.float32))])])
    graph.output("y", graph.add("add", [h, x]))
    present = {graph.nodes[i].op for i in graph.live()}
    result = tensat.optimize_with_details(
        graph, rules="generated", cost="analytic", latency_check=0, verify=False, iter_limit=4
    )
    pool = {r.name: r for r in rewrites.rule_set("generated")}
    registered = [pool[name] for name in result.exploration.rules]
    assert any(not r.ops() <= present for r in registered)
    assert len(registered) < len(rewrites.select_rules(present, rewrites.rule_set("generated")))


@pytest.mark.slow
def test_all_carries_the_graph_of_the_hand_written_rules_into_its_extraction() -> None:
    """`--rules all` explores with the hand-written rules first, extracts a graph from their e-graph, and carries it
    into the final extraction as a start: what `all` extracts costs no more than that graph, however much the
    generated set grew the e-graph after it."""
    said: list[str] = []
    result = tensat.optimize_with_details(
        build_model("squeezenet", **SMALL_SIZES["squeezenet"]),
        rules="all",
        cost="analytic",
        latency_check=0,
        verify=False,
        progress=lambda stage, detail: said.append(detail),
    )
    line = next(d for d in said if d.startswith("the hand-written rules' graph: cost "))
    checkpoint = float(line.removeprefix("the hand-written rules' graph: cost ").split()[0])
    assert any(not rule.startswith("gen-") for rule in result.exploration.rules)
    assert any(rule.startswith("gen-") for rule in result.exploration.rules)
    assert result.extraction is not None and result.extraction.cost <= checkpoint * (1 + 1e-6)


@pytest.mark.slow  # four searches with measured costs, each on an empty cost cache
def test_with_measured_costs_all_finds_what_hand_finds(tmp_path, monkeypatch) -> None:
    """With a cold cost cache the generated set's e-nodes would take the pricing window that the graph `hand`
    chooses needs (SqueezeNet's MaxPools moved over their Concat): `all` prices the hand-written rules' e-graph
    first, as `hand` does, and finds that graph too."""
    model = build_zoo_model("squeezenet10")
    found: dict[str, list[dict[str, int]]] = {"hand": [], "all": []}
    for k in range(2):
        for rules in found:
            monkeypatch.setenv("TENSAT_CACHE_DIR", str(tmp_path / f"{rules}{k}"))
            result = tensat.optimize_with_details(model, rules=rules, cost="measured", latency_check=0, verify=False)
            found[rules].append(result.rules)
    distributed = ["maxpool-concat-distribute" in r for r in found["hand"]]
    assert any(distributed)
    assert all("maxpool-concat-distribute" in r for r, d in zip(found["all"], distributed) if d)


def test_the_time_spent_measuring_prices_is_not_taken_from_the_search_budget(tmp_path) -> None:
    """A first run measures op costs that a warm run finds cached; the budget left to search, price and extract
    (`_budget_left`) leaves out what is measured once the search has begun, so a first run chooses from as many
    measured e-nodes as its pricing windows allow rather than from what the measurements left of the budget. What
    was measured before (the input's price) was never taken from the budget, and is not added to it."""
    g = Graph()
    ops = []
    for k, shape in enumerate([(1, 64, 32, 32), (1, 32, 32, 32), (1, 16, 64, 64)]):
        x = g.input(f"x{k}", shape)
        s = g.add("add", [x, x])
        y = g.add("relu", [s])
        g.output(f"y{k}", y)
        ops += [s, y]
    items = [(g.nodes[i], [g.nodes[j].shape for j in g.nodes[i].inputs], [False] * 2) for i in ops]
    run = api._Run(opts=Options(time_budget=2.0), log=api.RunLog(), source=g)
    run.measured = make_measured_cost("cpu", tmp_path / "costs.sqlite3", progress=False, threads=1)
    run.measured.prefetch(items[::2])  # the adds, as the input is priced before the search
    before = run.measured.stats.seconds
    api._start_search_clock(run)
    run.measured.prefetch(items[1::2])
    measuring = run.measured.stats.seconds - before
    # both well above the tolerance below: a budget counting the first, or leaving the second in, would fail
    assert before > 0.1 and measuring > 0.1
    left = api._budget_left(run)
    elapsed = time.perf_counter() - run.search_start
    assert left == pytest.approx(2.0 + measuring - elapsed, abs=0.05)
    run.measured = None
    assert api._budget_left(run) < left - measuring + 0.05
