"""The surface a user meets: progress, early output checks, summaries true of the written file, warnings, reprs and
a readable summary (the command line's one error style is in tests/cli/test_cli.py)."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import re
import time
import warnings
from pathlib import Path
from typing import Any

import onnx
import pytest

import tensat
import tensat.api as api
from tensat import ops
from tensat.cli import main
from tensat.cost import AnalyticCost, graph_cost, runtime_cost, with_activation
from tensat.models import SMALL_SIZES, build_model
from tensat.onnx_io import import_model
from tensat.progress import STAGES, StderrProgress

FAST = dict(cost="analytic", latency_check=0, ilp_time_limit=10)
QUICK = ["--cost", "analytic", "--latency-check", "0", "--ilp-time-limit", "10"]


def _squeezenet(tmp_path: Path) -> Path:
    path = tmp_path / "squeezenet.onnx"
    onnx.save(build_model("squeezenet", **SMALL_SIZES["squeezenet"]), str(path))
    return path


# -------------------------------------------------------------------------------------------------------------------
# progress


def test_the_api_reports_every_stage_in_order() -> None:
    seen: list[tuple[str, str]] = []
    result = tensat.optimize_with_details(
        build_model("squeezenet", **SMALL_SIZES["squeezenet"]), progress=lambda s, d: seen.append((s, d)), **FAST
    )
    stages = list(dict.fromkeys(s for s, _ in seen))
    assert stages[:3] == ["import", "cost", "explore"] and set(stages) <= set(STAGES)
    assert "extract" in stages and stages.index("extract") > stages.index("explore")
    assert any(re.fullmatch(r"iteration \d+: [\d,]+ e-nodes, [\d,]+ e-classes", d) for s, d in seen if s == "explore")
    order = [
        "pre_pass",  # run while importing, recorded before it
        "import",
        "forms",
        "rules",  # the rule set read, before the search's time budget starts
        "lower",
        "explore",
        "price",
        "guided",
        "cycle_filter",
        "extract",
        "export",
        "verify",
        "latency_check",
    ]  # the stages timed, in the order they run
    assert list(result.times) == [k for k in order if k in result.times], result.times
    assert {"pre_pass", "import", "lower", "explore", "price", "cycle_filter", "extract"} <= set(result.times)
    assert all(seconds >= 0 for seconds in result.times.values())


def test_a_failing_progress_callback_does_not_break_the_run() -> None:
    def broken(stage: str, detail: str) -> None:
        raise ValueError("display gone")

    result = tensat.optimize_with_details(
        build_model("squeezenet", **SMALL_SIZES["squeezenet"]), progress=broken, **FAST
    )
    assert result.verification.ok


def test_cli_progress_is_off_when_stderr_is_not_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = _squeezenet(tmp_path)
    assert main(["optimize", str(src), "-o", str(tmp_path / "a.onnx"), *QUICK]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "wrote" in out


def test_cli_progress_on_request_is_one_line_per_step(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = _squeezenet(tmp_path)
    assert main(["optimize", str(src), "-o", str(tmp_path / "a.onnx"), "--progress", *QUICK]) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) >= 5 and "\r" not in err
    assert all(
        re.match(r"tensat: \[ *\d+\.\ds\] (import|cost|explore|price|guided|extract|export|verify)", ln) for ln in lines
    ), lines
    assert any("explore: iteration 1:" in ln for ln in lines)


def test_cli_quiet_prints_nothing_and_excludes_progress(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = _squeezenet(tmp_path)
    assert main(["optimize", str(src), "-o", str(tmp_path / "a.onnx"), "-q", *QUICK]) == 0
    assert capsys.readouterr() == ("", "")
    with pytest.raises(SystemExit) as exc:
        main(["optimize", str(src), "-o", str(tmp_path / "b.onnx"), "-q", "--progress"])
    assert exc.value.code == 2


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_one_line_redrawn_with_a_ticking_clock() -> None:
    stream = _Terminal()
    with StderrProgress(stream, tick=0.05) as progress:
        progress("extract", "ILP on the whole e-graph (at most 60 s)")
        time.sleep(1.3)  # no report for a while: the clock keeps ticking
    text = stream.getvalue()
    assert "\n" not in text and text.count("\r") >= 3
    assert "extract: ILP on the whole e-graph (at most 60 s) (1." in text  # the stage's own elapsed time
    assert text.endswith("\r")  # the line is cleared when the run ends


# -------------------------------------------------------------------------------------------------------------------
# outputs are checked before any work


def test_cli_checks_the_output_directory_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("optimization started")

    monkeypatch.setattr(api, "optimize_with_details", never)
    src = _squeezenet(tmp_path)
    for flags in (
        ["-o", str(tmp_path / "missing" / "out.onnx")],
        ["-o", str(tmp_path / "out.onnx"), "--stats", str(tmp_path / "missing" / "s.json")],
        ["-o", str(tmp_path)],
    ):
        assert main(["optimize", str(src), *flags]) == 1
        err = capsys.readouterr().err
        assert err.startswith("tensat: error: cannot write") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["squeezenet.onnx"]


def test_the_api_checks_the_output_directory_before_reading_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tensat.onnx_io as onnx_io

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model was read")

    monkeypatch.setattr(onnx_io, "load_model", never)
    with pytest.raises(tensat.TensatError, match="directory .*missing does not exist"):
        tensat.optimize(str(tmp_path / "in.onnx"), output=str(tmp_path / "missing" / "out.onnx"))


# -------------------------------------------------------------------------------------------------------------------
# summaries are true of the written file


def test_the_summary_describes_the_file_written(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, out, stats = _squeezenet(tmp_path), tmp_path / "opt.onnx", tmp_path / "stats.json"
    assert main(["optimize", str(src), "-o", str(out), "--stats", str(stats), *QUICK]) == 0
    printed = capsys.readouterr().out
    data = json.loads(stats.read_text())
    written = onnx.load(str(out))
    before, after = re.search(r"nodes +(\d+) -> (\d+) ONNX nodes", printed).groups()
    assert int(before) == len(onnx.load(str(src)).graph.node) == data["onnx_nodes_before"]
    assert int(after) == len(written.graph.node) == data["onnx_nodes_after"]
    cost_after = float(re.search(r"cost +[\d.]+ -> ([\d.]+) ms", printed).group(1))
    assert cost_after == pytest.approx(data["cost_after"], abs=1e-4)
    # the written file, optimized again, is priced at what the first run said it costs
    again = tensat.optimize_with_details(str(out), **FAST)
    assert again.cost_before == pytest.approx(data["cost_after"], rel=1e-9)
    assert again.cost_before == pytest.approx(runtime_cost(import_model(written), AnalyticCost()), rel=1e-9)


def test_no_gain_onnxruntime_gets_by_itself_is_claimed() -> None:
    """A Conv followed by Relu is one FusedConv in onnxruntime: priced as onnxruntime runs it, the Relu costs
    nothing more, fusing it in the IR is no gain (the fused convolution prices as the plain one), and a conv whose
    only change is that fusion comes back as the input model."""
    graph = tensat.Graph()
    x = graph.input("x", (1, 3, 8, 8))
    import numpy as np

    w = graph.weight(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = graph.weight(np.zeros(4, np.float32) + 0.1, "b")
    conv = graph.add("conv2d", [x, w, b], strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1, act=0)
    graph.output("y", graph.add("relu", [conv]))
    cost = AnalyticCost()
    c = graph.nodes[conv]
    fused = with_activation(c, ops.ACT_RELU)
    plain = cost(c, [(1, 3, 8, 8), (4, 3, 3, 3), (4,)])
    assert (
        runtime_cost(graph, cost)
        == pytest.approx(plain)
        == pytest.approx(cost(fused, [(1, 3, 8, 8), (4, 3, 3, 3), (4,)]))
    )
    assert graph_cost(graph, cost) > runtime_cost(graph, cost)  # op by op, the Relu counts
    result = tensat.optimize_with_details(graph, **FAST)
    assert result.cost_after == result.cost_before and result.returned_input is not None
    assert "no graph found that costs less" in result.returned_input


def test_a_candidate_that_costs_the_same_returns_the_input_untimed() -> None:
    """The cost model predicts no gain for a Relu moved past a Transpose: the input is returned, and the end-to-end
    check, on or off, does not time it; the reason says so."""
    graph = tensat.Graph()
    x = graph.input("x", (4, 8))
    graph.output("y", graph.add("relu", [graph.add("transpose", [x], perm=(1, 0))]))
    for check in (0, 0.5):
        result = tensat.optimize_with_details(graph, cost="analytic", latency_check=check)
        assert result.returned_input is not None and "no graph found that costs less" in result.returned_input
        assert "not timed end to end" in result.returned_input and result.latency is None
        assert "latency_check" not in result.times


def test_the_summary_figures_agree() -> None:
    """The latency line gives one measurement, the median of the pairs' ratios, with the interval around it (two
    medians beside it could point the other way); the cost line names its cost model, in ms."""
    graph = tensat.Graph()
    x = graph.input("x", (64, 64))
    graph.output(
        "y", graph.add("relu", [graph.add("transpose", [graph.add("transpose", [x], perm=(1, 0))], perm=(1, 0))])
    )
    result = tensat.optimize_with_details(graph, cost="analytic", latency_check=0.5)
    assert result.latency is not None
    lines = result.summary().splitlines()
    timed = [line for line in lines if line.startswith("latency")]
    assert len(timed) == len(result.latency.by_threads)
    for line, (threads, comparison) in zip(timed, result.latency.by_threads.items()):
        found = re.fullmatch(
            r"latency   (\d+\.\d{3})x end to end at (\d+) threads? \(95% interval (\d+\.\d{3})-(\d+\.\d{3}), "
            r"(\d+) pairs of timed blocks\)",
            line,
        )
        assert found, line
        ratio, low, high = (float(found[k]) for k in (1, 3, 4))
        assert int(found[2]) == threads and int(found[5]) == comparison.pairs
        assert low <= high and ratio == round(comparison.speedup, 3)
        assert " ms" not in line
    cost = next(line for line in lines if line.startswith("cost"))
    assert " ms (" in cost and "under the analytic cost model" in cost


# -------------------------------------------------------------------------------------------------------------------
# warnings: one channel, words that match the numbers


def test_warnings_go_to_the_result_and_the_logger_not_to_python_warnings(caplog: pytest.LogCaptureFixture) -> None:
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, logger="tensat"):
        warnings.simplefilter("always")
        result = tensat.optimize_with_details(
            build_model("squeezenet", **SMALL_SIZES["squeezenet"]), iter_limit=1, **FAST
        )
    assert not [w for w in caught if "tensat" in str(w.filename)], [str(w.message) for w in caught]
    assert result.warnings and any("iter limit" in w for w in result.warnings)
    assert [r.getMessage() for r in caplog.records if r.name == "tensat"] == result.warnings
    assert all("raising iter_limit" in w for w in result.warnings if "iter limit" in w)


def test_a_quick_extraction_does_not_warn_about_its_time_limit() -> None:
    result = tensat.optimize_with_details(build_model("squeezenet", **SMALL_SIZES["squeezenet"]), **FAST)
    assert not any("time limit" in w for w in result.warnings), result.warnings
    assert (
        result.extraction.info["ilp_stop"] in ("proven optimal",) or "not proven" in result.extraction.info["ilp_stop"]
    )


def test_a_result_not_kept_says_why_with_its_figures() -> None:
    from tensat.latency import LatencyComparison

    slower = LatencyComparison(3.725, 3.736, 0.997, (0.990, 1.004), 10, 5, 1.0)
    check = api.LatencyCheck({1: slower}, kept=api._faster({1: slower}))
    assert not check.kept
    assert check.figures() == "0.997x at 1 thread, 95% interval 0.990-1.004"
    assert "slower" not in repr(check) and "not kept" in repr(check)
    assert api._not_faster(check) == (
        "the optimized graph was not measurably faster end to end at 1 thread "
        "(0.997x at 1 thread, 95% interval 0.990-1.004)"
    )
    marginal = LatencyComparison(3.736, 3.705, 1.008, (1.004, 1.012), 10, 5, 1.0)
    check = api.LatencyCheck({1: marginal}, kept=api._faster({1: marginal}))
    assert not check.kept and api._not_faster(check).startswith(
        "the optimized graph was faster end to end at 1 thread by less than the 1% two sessions of one model can "
        "differ by"
    )
    clear = LatencyComparison(3.736, 3.5, 1.067, (1.05, 1.08), 10, 5, 1.0)
    check = api.LatencyCheck({1: clear, 2: marginal}, kept=api._faster({1: clear, 2: marginal}))
    assert not check.kept and api._not_faster(check) == (
        "the optimized graph was faster end to end at 2 threads by less than the 1% two sessions of one model can "
        "differ by (1.067x at 1 thread, 95% interval 1.050-1.080, 1.008x at 2 threads, 95% interval 1.004-1.012)"
    )


# -------------------------------------------------------------------------------------------------------------------
# short reprs and a readable summary


def test_results_have_short_reprs_and_a_summary() -> None:
    result = tensat.optimize_with_details(build_model("nasrnn", **SMALL_SIZES["nasrnn"]), **FAST)
    for obj in (result, result.exploration, result.extraction, *result.exploration.iterations):
        text = repr(obj)
        assert len(text) < 300 and "\n" not in text, text
    assert repr(result).startswith("<OptimizeResult ")
    lines = result.summary().splitlines()
    assert [ln.split()[0] for ln in lines[:3]] == ["cost", "nodes", "e-graph"]
    assert lines[-1].startswith(("result", "warning")) and all(len(ln) < 400 for ln in lines)


def test_the_summary_says_when_prices_were_left_to_a_later_run() -> None:
    """A run whose pricing share ran out before every unit was measured says how many, and what a later run or a
    larger budget does about it; a run that measured everything it wanted says nothing of it."""
    result = tensat.optimize_with_details(build_model("nasrnn", **SMALL_SIZES["nasrnn"]), **FAST)
    assert not any(line.startswith("prices") for line in result.summary().splitlines())
    cut = dataclasses.replace(result, measurement={"stats": {"measured": 40, "deferred": 3}})
    (line,) = [line for line in cut.summary().splitlines() if line.startswith("prices")]
    assert line.startswith("prices    3 unit(s) left unmeasured") and "--time-budget" in line


def test_the_extract_line_names_the_selection_returned_and_why_not_the_ilp_s() -> None:
    """Where the portfolio's greedy or local-search selection is returned under the ILP extractor, the line says so,
    and what the ILP did; where the ILP's own is returned, it names the ILP."""
    result = tensat.optimize_with_details(build_model("squeezenet", **SMALL_SIZES["squeezenet"]), **FAST)
    line = next(line for line in result.summary().splitlines() if line.startswith("extract"))
    x = result.extraction
    if x.method == "ilp":
        assert line == f"extract   ilp ({x.info.get('ilp_stop') or x.status})"
    else:
        assert line.startswith(f"extract   {x.method}'s selection: the ILP found none cheaper (")
    greedy = tensat.optimize_with_details(
        build_model("squeezenet", **SMALL_SIZES["squeezenet"]), extractor="greedy", **FAST
    )
    line = next(line for line in greedy.summary().splitlines() if line.startswith("extract"))
    assert line.startswith("extract   greedy (") and "ILP" not in line
