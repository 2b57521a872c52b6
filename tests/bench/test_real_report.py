"""The real-model report (`bench.real_report`): its verdicts per model from the records one run writes."""

from __future__ import annotations

from typing import Any

import onnx
import pytest

from bench import real_report
from bench.machine import machine_info
from tensat.models import SMALL_SIZES, build_model


def _record(name: str, rules: dict[str, int], *, returned_input: str | None = None, **extra: Any) -> dict[str, Any]:
    timing = {"speedup": 1.1, "interval": [1.05, 1.15], "baseline_ms": 11.0, "ms": 10.0, "pairs": 60}
    stats = {
        "rules": rules,
        "returned_input": returned_input,
        "pre_passed": True,
        "onnx_nodes_before": 10,
        "onnx_nodes_read": 10,
        "options": {"pre_pass": "onnxslim"},
        "modelled": 0.99,
        "cost_after": 9.0,
        "speedup": 1.1,
        "warnings": [],
    }
    latency = {who: {"threads=1": dict(timing)} for who in ("tensat", "onnxsim", "onnxslim")}
    if returned_input:
        latency["tensat"]["threads=1"] = {"speedup": 1.0, "interval": [1.0, 1.0], "same_model": True}
    rec = {
        "model": name,
        "import": "ok",
        "ops_before": 10,
        "ops_after": 8,
        "predicted": 1.1,
        "tensat_first": {"ok": True, "seconds": 9.0, "stats": stats},
        "tensat_warm": {"ok": True, "seconds": 5.0, "stats": stats},
        "latency": latency,
        **{peer: {"ok": True, "seconds": 0.5} for peer in real_report.PEERS},
    }
    rec.update(extra)
    return rec


def test_a_change_is_explained_by_rules_only_where_every_change_is_a_rules() -> None:
    assert real_report.explained(_record("a", {"skip-layernorm-unfuse": 9})) == "yes"
    assert real_report.explained(_record("b", {"mul-comm": 1, "(unexplained)": 1})) == "no"
    assert real_report.explained(_record("c", {})) == "pre-pass only"
    assert real_report.explained(_record("d", {"mul-comm": 1}, returned_input="not faster")) == "—"


def test_the_prediction_is_read_against_the_time_of_the_model_returned() -> None:
    assert real_report.optimize_ratio(_record("a", {"r": 1})) == 9.0 / 10.0
    returned = _record("b", {}, returned_input="not faster")
    assert real_report.optimize_ratio(returned) == 9.0 / 11.0  # the input itself, as the peers' timings saw it
    assert real_report.predicted_ratio(returned) is None  # not priced under the same load
    assert real_report.predicted_ratio(_record("c", {}, same_load={"ratio": 0.95})) == 0.95


@pytest.mark.slow  # a real model priced afresh and timed end to end
def test_a_model_is_priced_and_timed_under_the_same_load(tmp_path) -> None:
    """The same-load figure of a real (small) model: its kernels priced afresh and its end-to-end time, both
    positive, their ratio theirs; a file that is no model gets an error, not a ratio."""
    path = tmp_path / "m.onnx"
    onnx.save(build_model("squeezenet", **SMALL_SIZES["squeezenet"]), str(path))
    figures = real_report.same_load(path)
    assert figures["predicted_ms"] > 0 and figures["run_ms"] > 0
    assert figures["ratio"] == figures["predicted_ms"] / figures["run_ms"]
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert "error" in real_report.same_load(bad)


def test_the_report_shows_the_new_columns_and_the_targets() -> None:
    kernels = {"written": {"LayerNormalization": 9}, "run": {"LayerNormalization": 9}, "match": True}
    wrong = {"written": {"LayerNormalization": 1}, "run": {"SkipLayerNormalization": 1}, "match": False}
    records = [
        _record("bert", {"skip-layernorm-unfuse": 9}, kernels=kernels, same_load={"ratio": 0.8}),
        _record("odd", {"(unexplained)": 2}, kernels=wrong),
    ]
    text = real_report.markdown(records, machine_info())
    head = "| predicted | predicted / run | at optimize / run | kernels run = chosen | rules explain the change |"
    assert head in text
    assert "| 99.0% | 1.100 | 0.80 | 0.90 | yes (LayerNormalization 9) | yes |" in text
    assert "no (LayerNormalization 1; runs {'SkipLayerNormalization': 1}) | no |" in text
    s = real_report.summary(records)
    assert s["changed_unexplained"] == ["odd"] and s["kernels_not_run_as_chosen"] == ["odd"]
    assert s["modelled_min"] == 0.99 and s["at_optimize_over_run_outside_10pct"] == []
    assert s["predicted_over_run_outside_10pct"] == ["bert"] and s["same_load_missing"] == ["odd"]
    assert "Models returned changed where a change is no rule's: odd." in text


def test_a_model_s_same_load_ratio_is_the_median_of_its_checks_shown_with_their_range(tmp_path) -> None:
    """Checks of one model minutes apart move with the machine's load: its ratio is their median, the report shows
    their range, and a model outside 10% in any check is named beside those outside in the median."""
    checks = [
        {"predicted_ms": 2.2, "run_ms": 2.0, "ratio": 1.1 + 0.02},
        {"error": "RuntimeError: no session"},
        {"predicted_ms": 2.0, "run_ms": 2.0, "ratio": 1.0},
        {"predicted_ms": 2.1, "run_ms": 2.0, "ratio": 1.05},
    ]
    figures = real_report.same_load_checks(checks)
    assert figures["ratio"] == 1.05 and figures["predicted_ms"] == 2.1 and len(figures["checks"]) == 4
    assert real_report.same_load_checks([{"error": "e1"}, {"error": "e2"}]) == {
        "error": "e2",
        "checks": [{"error": "e1"}, {"error": "e2"}],
    }
    rec = _record("llama", {"rms-norm-fuse": 9}, same_load=figures)
    text = real_report.markdown([rec], machine_info())
    assert "| 1.05 (1.00-1.12) |" in text
    s = real_report.summary([rec])
    assert s["predicted_over_run_outside_10pct"] == [] and s["predicted_over_run_a_check_outside_10pct"] == ["llama"]
    assert "(in a check: llama)" in text


@pytest.mark.slow  # two same-load checks of a real model
def test_the_rounds_after_the_rows_check_each_model_tensat_returned_again(tmp_path) -> None:
    path = real_report.tensat_output(tmp_path, "squeezenet")
    onnx.save(build_model("squeezenet", **SMALL_SIZES["squeezenet"]), str(path))
    # the row's own check, as `run_model` takes it: the rounds add the others
    first = real_report.same_load_checks([{"predicted_ms": 2.0, "run_ms": 1.0, "ratio": 2.0}])
    records = [_record("squeezenet", {}, same_load=first), _record("failed", {})]
    real_report.more_same_load_checks(records, tmp_path)
    checks = records[0]["same_load"]["checks"]
    assert len(checks) == real_report.SAME_LOAD_CHECKS and all(c["ratio"] > 0 for c in checks)
    assert records[0]["same_load"]["ratio"] == sorted(c["ratio"] for c in checks)[len(checks) // 2]
    assert "same_load" not in records[1]
