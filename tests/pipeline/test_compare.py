"""The comparison of the two searches: `tensat compare`, its summary and markdown (tensat/compare.py), and
`python -m bench.compare`."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from tensat import onnx_io
from tensat.errors import TensatError
from tensat.models import build_model

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
    seq, ts = row["sequential"], row["tensat"]  # each search's time to the other's final cost, within its own time
    reached = ts["seconds_to_sequential_cost"]
    if ts["search_cost"] <= seq["search_cost"] * (1 - 1e-6):  # tensat's graph is cheaper: it got there
        assert reached is not None
    assert reached is None or reached <= ts["seconds"] + 1e-9
    assert seq["seconds_to_tensat_cost"] is None or seq["seconds_to_tensat_cost"] <= seq["seconds"] + 1e-9
    assert "tensat time to the sequential cost (s)" in captured.out
    assert set(row["latency"]) >= {"original", "sequential", "tensat"}
    assert doc["summary"]["graphs"] == 1 and "versions" in doc["machine"]
    assert "pre_pass" not in ts["times"]  # both searches start from the graph read as given


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
