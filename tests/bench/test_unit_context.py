"""The unit-context bench: onnxruntime's profile read per kernel, and the report's ratios."""

from __future__ import annotations

import math

from bench.unit_context import kernel_times, render


def _event(name: str, op: str, dur: float) -> dict[str, object]:
    return {"cat": "Node", "name": f"{name}_kernel_time", "dur": dur, "args": {"op_name": op}}


def test_kernel_times_are_medians_in_the_order_the_first_run_ran_them() -> None:
    events = [
        {"cat": "Session", "name": "model_run", "dur": 99},
        _event("b", "Relu", 50.0),
        _event("a", "Conv", 900.0),
        _event("b", "Relu", 2.0),
        _event("a", "Conv", 10.0),
        _event("b", "Relu", 4.0),
        _event("a", "Conv", 30.0),
        {"cat": "Node", "name": "a_fence_before", "dur": 1, "args": {"op_name": "Conv"}},
    ]
    assert kernel_times(events, skip=1) == [("b", "Relu", 3.0), ("a", "Conv", 20.0)]


def test_the_report_sets_each_sum_against_the_kernels_in_the_graph() -> None:
    info = {"cpu": "cpu", "cores": 2, "memory_gib": 1, "gpus": [], "python": "3", "versions": {}, "highs": "1"}
    info["date"] = "today"
    kernel = {"kernel": "conv2d", "shapes": [], "price_us": 80.0, "first_copy_us": 110.0, "later_copies_us": 70.0}
    matched = {
        "model": "m",
        "matched": True,
        "kernels": [{**kernel, "in_graph_us": 100.0}, {**kernel, "first_copy_us": math.nan, "in_graph_us": 5.0}],
        "price_ms": 0.16,
        "in_graph_ms": 0.105,
        "reorders_ms": 0.0,
    }
    other = {**matched, "model": "n", "matched": False, "kernels": [kernel]}
    table = render([matched, other], info)
    assert "| m | 2 | 0.16 | 0.10 | 0.00 | 0.11 | 0.07 | 0.80 | 1.10 | 0.70 |" in table
    assert "| n | 1 (not matched) |" in table and table.rstrip().endswith("| — | — | — |")
