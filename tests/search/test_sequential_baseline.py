"""Why the sequential baseline finds nothing on BERT while tensat saves a fifth of its cost: a faithful baseline, not
a broken one.

On the 8-layer BERT graph every one of the default 100 expansions pops a graph that costs exactly what the input
costs: the queue is best-first, and the 8 layers offer thousands of cost-neutral rewrites (operand orders,
transposes that commute) whose combinations all tie with the input, so the budget is spent before any graph on the
way to a cheaper one is expanded. No candidate is pruned by alpha: the bound is not what stops it. On a 2-layer
BERT of the same wiring, with a tenth of the neutral rewrites, the same search reaches tensat's cost within the
budget, and on the 8-layer one a larger budget starts to improve it.
"""

from __future__ import annotations

import pytest

import tensat
from tensat import onnx_io
from tensat.cost import AnalyticCost, runtime_cost
from tensat.models import SMALL_SIZES, build_model
from tensat.sequential import sequential_search

COST = AnalyticCost()


def _bert(**size: int) -> tensat.Graph:
    return onnx_io.import_model(build_model("bert", **size)).compact()


@pytest.mark.slow  # a sequential search of the full-size BERT
def test_on_bert_the_budget_goes_to_graphs_that_tie_with_the_input() -> None:
    graph = _bert()
    found = sequential_search(graph, COST, alpha=1.05, budget=100)
    assert found.cost_after == found.cost_before and found.best_expansion == 0
    start = found.trace[0]["cost"]  # the input, as the search prices it (fusions only a whole graph shows aside)
    assert len(found.trace) == 100 and all(t["cost"] == pytest.approx(start) for t in found.trace)
    assert found.rejected["cost"] == 0  # alpha prunes nothing: the search never reaches a costlier graph
    assert found.candidates > 50 * found.expansions  # the queue it could not get through
    tensat_cost = runtime_cost(tensat.optimize(graph, cost="analytic", latency_check=0), COST)
    assert tensat_cost < 0.85 * found.cost_before


def test_on_a_two_layer_bert_the_same_search_reaches_tensats_cost() -> None:
    graph = _bert(**SMALL_SIZES["bert"])
    found = sequential_search(graph, COST, alpha=1.05, budget=100)
    tensat_cost = runtime_cost(tensat.optimize(graph, cost="analytic", latency_check=0), COST)
    assert found.cost_after <= tensat_cost * (1 + 1e-9) < found.cost_before
    assert found.best_expansion < 100


@pytest.mark.slow
def test_on_bert_a_larger_budget_gets_past_the_ties() -> None:
    graph = _bert()
    found = sequential_search(graph, COST, alpha=1.05, budget=3000)
    assert found.cost_after < found.cost_before and found.best_expansion > 100
