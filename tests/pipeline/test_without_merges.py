"""A candidate whose merges the end-to-end check did not find faster: the run searches again without multi-pattern
rules, and returns what that search finds where it passes the same checks.

The check's verdict is given by the models' content here (a merged product times slower, as BERT's merged query, key
and value projections did at two threads): the timing itself is tested in tests/costs/test_measure.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensat
from tensat import api
from tensat.cost import AnalyticCost
from tensat.latency import LatencyComparison
from tensat.session import Serialized

OPTIONS = dict(ilp_time_limit=5, time_limit=20, iter_limit=6, latency_check=5, pre_pass="none")


class _ProductsDear(AnalyticCost):
    """The analytic cost, but each MatMul priced at 1 ms and a Slice at next to nothing: merging two products of
    one input into one pays."""

    def __call__(self, node, in_shapes, const=()):  # type: ignore[no-untyped-def]
        if node.op == "matmul":
            return 1.0
        if node.op == "slice":
            return 1e-3
        return super().__call__(node, in_shapes, const)


def _two_products(cancelling_transposes: bool = True) -> onnx.ModelProto:
    """x (through two Transposes that cancel, which a single-pattern rule removes) times two weights."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), n) for n in ("wq", "wk")]
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
        helper.make_node("Transpose", ["xt"], ["xx"], perm=[1, 0]),
    ]
    read = "xx"
    if not cancelling_transposes:
        nodes, read = [], "x"
    nodes += [helper.make_node("MatMul", [read, "wq"], ["y"]), helper.make_node("MatMul", [read, "wk"], ["y2"])]
    graph = helper.make_graph(
        nodes,
        "two_products",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 8]) for n in ("y", "y2")],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _matmuls(model: Serialized) -> int:
    return sum(n.op_type == "MatMul" for n in model.proto.graph.node)


def _timing(speedup: float) -> LatencyComparison:
    return LatencyComparison(1.0, 1.0 / speedup, speedup, (speedup - 0.01, speedup + 0.01), 40, 5, 1.0)


@pytest.fixture
def checks(monkeypatch) -> list[tuple[int, int]]:
    """The end-to-end checks the run makes, as (MatMuls of the candidate, k_multi of its search): a candidate with
    fewer MatMuls than the input (merged) times 0.95x at one thread, any other 1.05x at both thread counts."""
    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: _ProductsDear())
    made: list[tuple[int, int]] = []

    def verdict(original: Serialized, optimized: Serialized, device: str, opts: Any, log: Any, predicted=1.0):
        merged = _matmuls(optimized) < _matmuls(original)
        made.append((_matmuls(optimized), opts.k_multi))
        if merged:
            return api.LatencyCheck({1: _timing(0.95)}, False)
        return api.LatencyCheck({1: _timing(1.05), 2: _timing(1.05)}, True)

    monkeypatch.setattr(api, "_end_to_end_check", verdict)
    return made


def test_a_rejected_merge_is_searched_again_without_multi_pattern_rules(checks) -> None:
    result = tensat.optimize_with_details(_two_products(), **OPTIONS)
    assert checks == [(1, 1), (2, 0)]  # the merged candidate, then the one found without merges
    assert result.returned_input is None and result.verification.ok
    first = result.with_merges
    assert first is not None and "matmul-merge-shared-input" in first.rules and not first.check.kept
    assert "matmul-merge-shared-input" not in result.rules and result.rules  # the Transposes' removal is kept
    assert result.options.k_multi == 1  # the options asked for
    assert [n.op_type for n in result.output.graph.node] == ["MatMul", "MatMul"]
    assert "searched again without multi-pattern rules" in result.summary()
    assert result.to_dict()["with_merges"]["rules"] == first.rules


def test_where_the_second_search_finds_nothing_both_reasons_are_given(checks) -> None:
    result = tensat.optimize_with_details(_two_products(cancelling_transposes=False), **OPTIONS)
    assert checks == [(1, 1)]  # without merges nothing costs less: not timed
    assert result.returned_input is not None and result.with_merges is not None
    assert result.returned_input.startswith(result.with_merges.reason)
    assert "searched again without multi-pattern rules: no graph found that costs less" in result.returned_input
    assert [n.op_type for n in result.output.graph.node] == ["MatMul", "MatMul"]  # the input


def test_no_second_search_without_merges_or_without_the_time_for_it(checks, monkeypatch) -> None:
    result = tensat.optimize_with_details(_two_products(), **{**OPTIONS, "k_multi": 0})
    assert checks == [(2, 0)] and result.with_merges is None and result.returned_input is None
    checks.clear()
    monkeypatch.setattr(api, "RUN_SECONDS", 1.0)  # less than a search budget and a check
    result = tensat.optimize_with_details(_two_products(), **OPTIONS)
    assert checks == [(1, 1)] and result.with_merges is None and result.returned_input is not None
