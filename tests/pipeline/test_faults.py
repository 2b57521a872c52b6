"""Faults: every way an optimization run can go wrong ends in a valid graph (at worst the input) with a warning, a
clear one-line error, or a VerificationError; never a wrong graph, a crash, or a partial output file.

Covered: ILP time-outs and crashes, greedy crashes, egglog errors and panics, failures in lowering, export and
rebuild, node/time/iteration limits, cost models that fail per node or cannot be built, a wrong or costlier
extracted graph, an unexportable result, Ctrl-C and crashes while optimizing and while writing, bad input files
through the API and the command line (one-line error, exit code 1), a pickle scan of the repository, and the
measured cost model's cache when its database is corrupted or locked.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pulp
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensat
import tensat.api as api
import tensat.onnx_io as onnx_io
from tensat import extraction
from tensat.cli import main
from tensat.cost import AnalyticCost, Shape, runtime_cost
from tensat.egraph import TensorEGraph
from tensat.errors import ModelError, TensatError, VerificationError
from tensat.extraction import ilp as ilp_mod
from tensat.extraction import portfolio
from tensat.ir import Graph, Node
from tensat.onnx import external
from tensat.onnx_io import export_model, save_model
from tensat.verify import run_model
from tests.helpers import ROOT, bad_model_inputs, interrupt_rename_onto

FAST = dict(iter_limit=3, time_limit=10.0, ilp_time_limit=10.0, cost="analytic", latency_check=0)


def _graph() -> Graph:
    """Two matmuls sharing an input and a conv followed by a relu: rules fire and extraction has choices."""
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    g = Graph()
    x = g.input("x", (4, 8))
    img = g.input("img", (1, 3, 6, 6))
    g.output("a", g.add("relu", [g.add("matmul", [x, g.weight(w(8, 6), "w1")])]))
    g.output("b", g.add("tanh", [g.add("matmul", [x, g.weight(w(8, 5), "w2")])]))
    conv = g.add(
        "conv2d",
        [img, g.weight(w(4, 3, 3, 3), "wc"), g.weight(w(4), "bc")],
        strides=(1, 1),
        pads=(1, 1, 1, 1),
        dilations=(1, 1),
        group=1,
        act=0,
    )
    twice = g.add("transpose", [g.add("transpose", [x], perm=(1, 0))], perm=(1, 0))  # cancels: a real gain
    g.output("d", g.add("sigmoid", [twice]))
    g.output("c", g.add("relu", [conv]))
    return g


def _shared_weight_graph() -> Graph:
    """Three products of one weight: merged (inputs stacked, one product, read back through slices) they read the
    weight once, so the extracted graph uses merges and guided rounds run."""
    rng = np.random.default_rng(1)
    g = Graph()
    weight = g.weight((rng.standard_normal((256, 256)) / 16).astype(np.float32), "w")
    for k in range(3):
        g.output(f"y{k}", g.add("tanh", [g.add("matmul", [g.input(f"x{k}", (1, 256)), weight])]))
    return g


def _optimize(graph: Graph | str | onnx.ModelProto, **options: Any) -> tensat.OptimizeResult:
    """optimize_with_details with FAST limits."""
    return tensat.optimize_with_details(graph, **{**FAST, **options})


def _valid(result: tensat.OptimizeResult, graph: Graph) -> None:
    """The result is verified, no costlier than the input, and agrees with numpy on fresh inputs."""
    assert result.verification is not None and result.verification.ok
    assert result.cost_after <= result.cost_before * (1 + 1e-9)
    rng = np.random.default_rng(7)
    feeds = {graph.input_name(i): rng.standard_normal(graph.nodes[i].shape).astype(np.float32) for i in graph.input_ids}
    want = graph.evaluate(feeds, [n for _, n in graph.outputs])
    got = run_model(export_model(result.graph), feeds)
    for name, node in graph.outputs:
        np.testing.assert_allclose(got[name], want[node], rtol=1e-4, atol=1e-5)


def _warned(result: tensat.OptimizeResult, *needles: str) -> None:
    """Some one-line warning of the run mentions every needle."""
    assert any(all(n in w for n in needles) for w in result.warnings), (needles, result.warnings)
    assert all("\n" not in w for w in result.warnings), result.warnings


def _same_graph(a: Graph, b: Graph) -> bool:
    """The same live nodes and outputs."""
    return a.compact().nodes == b.compact().nodes and a.compact().outputs == b.compact().outputs


def test_the_fault_graph_is_optimized_when_nothing_goes_wrong() -> None:
    graph = _graph()
    result = _optimize(graph)
    _valid(result, graph)
    assert result.cost_after < result.cost_before and not _same_graph(result.graph, graph)
    assert all(
        w.startswith(("exploration stopped at its", "extraction reached its ILP time limit")) for w in result.warnings
    )


# -------------------------------------------------------------------------------------------------------------------
# extraction


def test_ilp_time_out_without_a_solution_returns_the_greedy_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The solver hits its time limit with no solution: the greedy selection comes back, flagged."""
    monkeypatch.setattr(ilp_mod, "_closed", lambda cost, bound: False)
    monkeypatch.setattr(
        ilp_mod._Model, "solve", lambda self, solver, seconds, start: ilp_mod._Solve(None, None, None, False)
    )
    graph = _graph()
    greedy = _optimize(graph, extractor="greedy")
    result = _optimize(graph, extractor="ilp")
    assert result.extraction is not None and result.extraction.status != "optimal"
    assert result.extraction.cost == pytest.approx(greedy.extraction.cost)
    assert result.cost_after == pytest.approx(greedy.cost_after)
    assert result.extraction.info["ilp_stop"].startswith("not proven optimal"), result.extraction.info
    _valid(result, graph)


def test_ilp_time_out_with_an_incumbent_returns_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The solver stops at its time limit with an unproven incumbent: the best selection found is used, flagged."""
    real = ilp_mod._Model.solve

    def unproven(self: Any, solver: str, seconds: float, start: Any) -> Any:
        res = real(self, solver, seconds, start)
        res.proven, res.bound = False, None
        return res

    monkeypatch.setattr(ilp_mod, "_closed", lambda cost, bound: False)
    monkeypatch.setattr(ilp_mod._Model, "solve", unproven)
    graph = _graph()
    greedy = _optimize(graph, extractor="greedy")
    result = _optimize(graph, extractor="ilp")
    assert result.extraction is not None and result.extraction.status != "optimal"
    assert result.extraction.cost <= greedy.extraction.cost + 1e-12
    assert result.extraction.info["ilp_stop"].startswith("not proven optimal"), result.extraction.info
    _valid(result, graph)


def test_an_ilp_time_limit_too_short_to_build_a_model_returns_the_incumbent() -> None:
    graph = _graph()
    greedy = _optimize(graph, extractor="greedy")
    result = _optimize(graph, extractor="ilp", ilp_time_limit=1e-6)
    assert result.extraction is not None and result.extraction.cost <= greedy.extraction.cost + 1e-12
    _valid(result, graph)


@pytest.mark.parametrize(
    "error", [RuntimeError("solver crashed"), pulp.PulpSolverError("HiGHS: not available"), MemoryError()]
)
def test_an_ilp_crash_falls_back_to_the_greedy_selection(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    def crash(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(portfolio, "ilp_extract", crash)
    graph = _graph()
    result = _optimize(graph, extractor="ilp")
    assert result.extraction is not None and result.extraction.method in ("greedy", "input")
    _warned(result, "ILP solver failed", type(error).__name__, "--solver cbc")
    _valid(result, graph)


def test_a_greedy_crash_keeps_the_input_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("greedy broke")

    monkeypatch.setattr(portfolio, "greedy_dag", crash)
    graph = _graph()
    result = _optimize(graph, extractor="greedy")
    assert result.extraction is not None and result.extraction.method == "input"
    _warned(result, "greedy extraction failed", "greedy broke")
    _valid(result, graph)


def test_a_proof_on_the_cycle_filtered_e_graph_is_not_claimed_for_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The filtered pass proves its sub-problem optimal, the whole e-graph's pass crashes: the result is the
    filtered pass's, flagged unproven, with no bound (the sub-problem's bound does not hold for the whole)."""
    xg = extraction.EGraph.from_json(
        {
            "nodes": {
                "r0": {"op": "f", "children": ["a0"], "eclass": "r", "cost": 1.0},
                "a0": {"op": "x", "children": [], "eclass": "a", "cost": 1.0},
                "a1": {"op": "g", "children": ["b0"], "eclass": "a", "cost": 1.0},
                "b0": {"op": "k", "children": ["a0"], "eclass": "b", "cost": 1.0},
            },
            "root_eclasses": ["r"],
        }
    )
    real = extraction.ilp_extract
    passes: list[frozenset[str]] = []

    def whole_pass_crashes(eg: Any, **kw: Any) -> extraction.ExtractionResult:
        passes.append(kw["forbidden"])
        if "a1" not in kw["forbidden"]:
            raise RuntimeError("solver crashed")
        return real(eg, **kw)

    monkeypatch.setattr(portfolio, "ilp_extract", whole_pass_crashes)
    greedy = extraction.greedy_dag(xg)
    warned: list[str] = []
    best = extraction.extract_best(xg, greedy, blacklist={"a1"}, time_limit=5, warn=warned.append)
    assert passes == [frozenset({"a1"}), frozenset()]
    assert best.method == "ilp" and best.cost == pytest.approx(2.0)
    assert best.status != "optimal" and best.bound is None, best
    assert any("failed on the whole e-graph" in n for n in warned)
    assert best.info["ilp_stop"] == "not proven optimal: optimal only on the cycle-filtered e-graph"


# -------------------------------------------------------------------------------------------------------------------
# exploration and the rest of the search


def test_an_egglog_error_mid_exploration_keeps_the_egraph_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = TensorEGraph._apply
    calls = []

    def failing(self: TensorEGraph, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("egglog: union of tensors of different shapes")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TensorEGraph, "_apply", failing)
    graph = _graph()
    result = _optimize(graph)
    assert result.exploration.stop_reason == "error" and len(result.exploration.iterations) == 1
    _warned(result, "egglog error", "union of tensors")
    _valid(result, graph)


def _panic(self: TensorEGraph, *args: Any, **kwargs: Any) -> Any:
    """A real Rust panic inside egglog (pyo3's PanicException, a BaseException)."""
    return self._run("(run-schedule (run no-such-ruleset))")


def test_an_egglog_panic_during_exploration_still_returns_a_valid_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUST_BACKTRACE", "0")
    monkeypatch.setattr(TensorEGraph, "_apply", _panic)
    graph = _graph()
    result = _optimize(graph)
    assert result.exploration.stop_reason == "error"
    _warned(result, "egglog error")
    _valid(result, graph)


def test_an_egglog_panic_after_exploration_keeps_the_input_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUST_BACKTRACE", "0")
    monkeypatch.setattr(TensorEGraph, "export", _panic)
    graph = _graph()
    result = _optimize(graph)
    _warned(result, "optimization failed", "PanicException", "returned the input model")
    assert _same_graph(result.graph, graph)
    _valid(result, graph)


@pytest.mark.parametrize("method", ["__init__", "export", "original_selection", "rebuild"])
def test_a_failing_search_phase_keeps_the_input_graph(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    def crash(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{method} broke")

    monkeypatch.setattr(TensorEGraph, method, crash)
    graph = _graph()
    result = _optimize(graph)
    _warned(result, "optimization failed", f"{method} broke", "returned the input model")
    assert _same_graph(result.graph, graph) and result.cost_after == result.cost_before
    _valid(result, graph)


def test_a_failing_search_keeps_the_input_model_from_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """From an ONNX file: the written model is the (re-exported) input, verified against the file."""
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    save_model(export_model(_graph()), src)

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(TensorEGraph, "export", crash)
    result = tensat.optimize_with_details(str(src), output=str(out), **FAST)
    _warned(result, "optimization failed", "boom")
    assert result.output == out and result.verification.ok
    assert sorted(os.listdir(tmp_path)) == ["in.onnx", "out.onnx"]


@pytest.mark.parametrize(
    "limit, reason",
    [(dict(node_limit=1), "node_limit"), (dict(time_limit=1e-9), "time_limit"), (dict(iter_limit=1), "iter_limit")],
)
def test_a_limit_hit_returns_a_valid_graph_with_a_warning(limit: dict[str, Any], reason: str) -> None:
    graph = _graph()
    result = _optimize(graph, **limit)
    assert result.exploration.stop_reason == reason
    _warned(result, "exploration stopped at its " + reason.replace("_", " "), "--" + reason.replace("_", "-"))
    _valid(result, graph)
    if reason != "iter_limit":  # nothing was explored: at worst the input graph
        assert not result.exploration.iterations
        assert result.exploration.enodes == result.exploration.initial_enodes


# -------------------------------------------------------------------------------------------------------------------
# cost models


class _FlakyCost:
    """Twice the analytic cost, except: matmuls cannot be measured, tanh measures NaN, sigmoid a negative time."""

    name = "measured"

    def __init__(self) -> None:
        self.analytic = AnalyticCost()

    def __call__(self, node: Node, in_shapes: Sequence[Shape], const: Sequence[bool] = ()) -> float:
        if node.op == "matmul":
            raise RuntimeError("onnxruntime cannot build the unit")
        if node.op == "tanh":
            return float("nan")
        if node.op == "sigmoid":
            return -1.0
        return 2 * self.analytic(node, in_shapes, const)


def test_costs_that_cannot_be_measured_fall_back_to_the_analytic_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: _FlakyCost())
    graph = _graph()
    result = _optimize(graph, cost="measured")
    _warned(result, "could not price", "matmul", "tanh", "analytic estimate")
    flaky, analytic = _FlakyCost(), AnalyticCost()

    def expected(node: Node, in_shapes: Sequence[Shape], const: Sequence[bool] = ()) -> float:
        fails = node.op in ("matmul", "tanh", "sigmoid")
        return analytic(node, in_shapes, const) if fails else flaky(node, in_shapes, const)

    assert result.cost_before == pytest.approx(runtime_cost(graph.compact(), expected))
    assert result.cost_after == pytest.approx(runtime_cost(result.graph, expected))
    _valid(result, graph)


def test_a_cost_model_that_cannot_be_built_falls_back_to_the_analytic_model(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str, device: str = "auto", progress: Any = False) -> Any:
        raise OSError("libcudart.so: cannot open shared object file")

    monkeypatch.setattr(api, "make_cost_model", broken)
    graph = _graph()
    result = _optimize(graph, cost="measured")
    _warned(result, "measured cost model is unavailable", "libcudart", "analytic")
    assert result.cost_before == pytest.approx(runtime_cost(graph.compact(), AnalyticCost()))
    _valid(result, graph)


def test_a_cost_model_refusing_the_request_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(name: str, device: str = "auto", progress: Any = False) -> Any:
        raise TensatError("device 'cuda' requested but CUDA is not available")

    monkeypatch.setattr(api, "make_cost_model", refuse)
    with pytest.raises(TensatError, match="CUDA is not available"):
        _optimize(_graph(), cost="measured", device="cuda")


def test_a_failing_prefetch_is_flagged_and_nodes_are_priced_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoPrefetch(AnalyticCost):
        def prefetch(self, items: Any, deadline: float | None = None) -> list[int]:
            raise RuntimeError("measurement process died")

    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: NoPrefetch())
    graph = _graph()
    result = _optimize(graph, cost="measured")
    _warned(result, "could not measure ops in a batch", "measurement process died", "one by one")
    assert result.cost_before == pytest.approx(runtime_cost(graph.compact(), AnalyticCost()))
    _valid(result, graph)


# -------------------------------------------------------------------------------------------------------------------
# never a wrong or a costlier graph


def _tampered(graph: Graph, *, costlier: bool) -> Graph:
    """`graph` with output "d" = sigmoid(x^T^T) replaced by tanh(x) (wrong, and cheaper, so it is verified) or with
    output "c" = relu(conv) replaced by relu(relu(conv)) (right, costlier)."""
    src = graph.compact()
    out = Graph(opset_imports=dict(src.opset_imports), name=src.name)
    remap: dict[int, int] = {}
    for i, n in enumerate(src.nodes):
        if n.op == "input":
            remap[i] = out.input(n.attr["name"], n.shape, n.dtype)
        elif n.op == "weight":
            remap[i] = out.weight(src.weights[n.attr["name"]], n.attr["name"])
        else:
            remap[i] = out.add(n.op, [remap[j] for j in n.inputs], **n.attr)
    outputs = {k: remap[v] for k, v in src.outputs}
    if costlier:
        assert out.nodes[outputs["c"]].op == "relu"
        outputs["c"] = out.add("relu", [outputs["c"]])
    else:
        outputs["d"] = out.add("tanh", [out.input_ids[0]])
    out.outputs = list(outputs.items())
    return out


def test_a_wrong_extracted_graph_raises_verification_error_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(TensorEGraph, "rebuild", lambda self, choices, decoded: _tampered(self.graph, costlier=False))
    graph = _graph()
    with pytest.raises(VerificationError) as err:
        _optimize(graph)
    assert "output 'd'" in str(err.value) and "\n" not in str(err.value)
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    save_model(export_model(graph), src)
    out.write_bytes(b"previous result")
    assert main(["optimize", str(src), "-o", str(out), "-q", "--cost", "analytic"]) == 1
    assert out.read_bytes() == b"previous result"
    assert sorted(os.listdir(tmp_path)) == ["in.onnx", "out.onnx"]


def test_outputs_that_differ_only_through_onnxruntime_fusions_return_the_input(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same function as written, different outputs with onnxruntime's fusions: the input model is returned."""
    import tensat.verify as verify_mod

    real = verify_mod.compare_models
    calls: list[bool] = []

    def fused_differently(original: Any, optimized: Any, **kw: Any) -> Any:
        report = real(original, optimized, **kw)
        calls.append(kw.get("optimizations", True))
        if kw.get("optimizations", True) and original is not optimized:
            return verify_mod.VerifyReport(False, 1e-3, 1e-3, report.outputs, 0.0, "output 'c' differs: max abs 1e-3")
        return report

    monkeypatch.setattr(verify_mod, "compare_models", fused_differently)
    graph = _graph()
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    save_model(export_model(graph), src)
    result = tensat.optimize_with_details(str(src), output=str(out), **FAST)
    assert calls[:2] == [True, False]
    _warned(result, "computes the input's function", "graph optimizations off", "keeping the input model")
    assert result.cost_after == result.cost_before and result.verification.ok and result.latency is None
    loaded = onnx.load(str(out))
    assert [n.op_type for n in loaded.graph.node] == [n.op_type for n in onnx.load(str(src)).graph.node]


def test_a_costlier_extracted_graph_is_replaced_by_the_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TensorEGraph, "rebuild", lambda self, choices, decoded: _tampered(self.graph, costlier=True))
    graph = _graph()
    result = _optimize(graph)
    assert result.returned_input is not None and "no graph found that costs less" in result.returned_input
    assert _same_graph(result.graph, graph) and result.cost_after == result.cost_before
    _valid(result, graph)


def test_an_unexportable_optimized_graph_is_replaced_by_the_input(monkeypatch: pytest.MonkeyPatch) -> None:
    model = export_model(_graph())
    real = onnx_io.export_model
    calls = []

    def flaky(graph: Graph, **kwargs: Any) -> onnx.ModelProto:
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("no exporter for op 'frobnicate'")
        return real(graph, **kwargs)

    monkeypatch.setattr(onnx_io, "export_model", flaky)
    result = tensat.optimize_with_details(model, **FAST)
    _warned(result, "could not be exported", "frobnicate", "returned the input model")
    assert result.verification.ok and result.cost_after == result.cost_before


# -------------------------------------------------------------------------------------------------------------------
# Ctrl-C and crashes: never a partial output file


def test_ctrl_c_during_the_search_propagates_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def interrupt(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(TensorEGraph, "explore", interrupt)
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    save_model(export_model(_graph()), src)
    with pytest.raises(KeyboardInterrupt):
        tensat.optimize(str(src), output=str(out), **FAST)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--cost", "analytic"]) == 130
    assert sorted(os.listdir(tmp_path)) == ["in.onnx"]


class _HalfWriter:
    """A file whose write stores half the data, then is interrupted."""

    def __init__(self, f: Any) -> None:
        self.f = f

    def __enter__(self) -> _HalfWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.f.close()

    def write(self, data: bytes) -> int:
        self.f.write(data[: len(data) // 2])
        self.f.flush()
        raise KeyboardInterrupt

    def flush(self) -> None:
        self.f.flush()

    def fileno(self) -> int:
        return self.f.fileno()


@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
@pytest.mark.parametrize("existing", [False, True])
def test_ctrl_c_while_writing_leaves_no_partial_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, existing: bool
) -> None:
    """Interrupted at any point of the write: exit 130, the previous output (if any) untouched, no temporary file."""
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    save_model(export_model(_graph()), src)
    if existing:
        out.write_bytes(b"previous result")
    real_replace = os.replace

    def interrupt(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    if where == "write":
        real_fdopen = os.fdopen
        monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: _HalfWriter(real_fdopen(fd, *a, **k)))
    elif where == "fsync":
        monkeypatch.setattr(os, "fsync", interrupt)
    else:
        monkeypatch.setattr(os, "replace", lambda a, b: interrupt() if str(b) == str(out) else real_replace(a, b))
    assert main(["optimize", str(src), "-o", str(out), "-q", "--cost", "analytic"]) == 130
    assert "interrupted" in capsys.readouterr().err
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == (["in.onnx", "out.onnx"] if existing else ["in.onnx"])
    if existing:
        assert out.read_bytes() == b"previous result"


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), PermissionError(13, "Permission denied")])
def test_a_failed_write_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], error: OSError
) -> None:
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    save_model(export_model(_graph()), src)
    out.write_bytes(b"previous result")

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(os, "fsync", fail)
    assert main(["optimize", str(src), "-o", str(out), "-q"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("tensat: error: cannot write") and error.strerror in err and "\n" not in err, err
    monkeypatch.undo()
    assert out.read_bytes() == b"previous result" and sorted(os.listdir(tmp_path)) == ["in.onnx", "out.onnx"]


def test_an_output_path_that_is_a_directory_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    save_model(export_model(_graph()), src)
    out.mkdir()
    assert main(["optimize", str(src), "-o", str(out), "-q"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("tensat: error: cannot write") and "\n" not in err, err
    assert sorted(os.listdir(tmp_path)) == ["in.onnx", "out.onnx"] and not os.listdir(out)


def test_a_crash_while_writing_never_leaves_a_partial_output(tmp_path: Path) -> None:
    """The process is killed (SIGKILL) after the data is written but before the rename: the output path keeps its
    previous contents; at most a hidden temporary file is left next to it."""
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    save_model(export_model(_graph()), src)
    out.write_bytes(b"previous result")
    script = textwrap.dedent(f"""
        import os, signal
        import onnx
        from tensat.onnx_io import save_model
        os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
        save_model(onnx.load({str(src)!r}), {str(out)!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert out.read_bytes() == b"previous result"
    left = sorted(set(os.listdir(tmp_path)) - {"in.onnx", "out.onnx"})
    assert all(name.startswith(".out.onnx.") and name.endswith(".tmp") for name in left), left


def _external_matmul(value: float) -> onnx.ModelProto:
    """x @ w with w a 64x32 initializer full of `value`."""
    w = numpy_helper.from_array(np.full((64, 32), value, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_ctrl_c_while_saving_external_data_keeps_the_previous_output(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(external, "PROTO_LIMIT", 4096)
    monkeypatch.setattr(external, "_LARGE_TENSOR", 1024)
    out = tmp_path / "out.onnx"
    save_model(_external_matmul(1.0), out)
    feeds = {"x": np.ones((2, 64), np.float32)}
    before = run_model(str(out), feeds)["y"]
    real_replace = os.replace
    interrupt_rename_onto(monkeypatch, out)
    with pytest.raises(KeyboardInterrupt):
        save_model(_external_matmul(2.0), out)
    monkeypatch.setattr(os, "replace", real_replace)
    np.testing.assert_array_equal(run_model(str(out), feeds)["y"], before)
    assert sorted(os.listdir(tmp_path)) == ["out.onnx", "out.onnx.data"]


def test_saving_over_an_external_data_model_replaces_its_data_and_leaves_one_data_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(external, "PROTO_LIMIT", 4096)
    monkeypatch.setattr(external, "_LARGE_TENSOR", 1024)
    out = tmp_path / "out.onnx"
    feeds = {"x": np.ones((2, 64), np.float32)}
    for scale in (1.0, 2.0, 3.0):
        save_model(_external_matmul(scale), out)
        data = [p for p in os.listdir(tmp_path) if p != "out.onnx"]
        assert len(data) == 1 and data[0].endswith(".data"), os.listdir(tmp_path)
        np.testing.assert_allclose(run_model(str(out), feeds)["y"], np.full((2, 32), 64 * scale), rtol=1e-6)


# -------------------------------------------------------------------------------------------------------------------
# bad input: one-line errors and exit codes (the corpus is tests/helpers.bad_model_inputs; the command line's
# handling of it is tests/cli/test_cli.py::test_cli_bad_input_one_line_error_no_output)


def _write_case(tmp_path: Path, k: int, source: object) -> str:
    """A corpus case as a path (protos are written to a file as they are, unchecked)."""
    if isinstance(source, onnx.ModelProto):
        path = tmp_path / f"case{k}.onnx"
        path.write_bytes(source.SerializeToString())
        return str(path)
    return str(source)


def test_the_api_raises_one_line_model_errors_for_the_bad_input_corpus_and_writes_nothing(tmp_path: Path) -> None:
    for k, (source, needle) in enumerate(bad_model_inputs(tmp_path)):
        out = tmp_path / f"out{k}.onnx"
        with pytest.raises(ModelError) as err:
            tensat.optimize(_write_case(tmp_path, k, source), output=str(out), **FAST)
        assert needle in str(err.value) and "\n" not in str(err.value), (needle, str(err.value))
        assert not [p for p in os.listdir(tmp_path) if p.startswith(f"out{k}") or p.startswith(f".out{k}")]


def test_the_tensat_process_exits_1_with_one_line_for_bad_input(tmp_path: Path) -> None:
    """The real executable, for a missing file and a cyclic graph: status 1, one stderr line, nothing else."""
    cases = {needle: source for source, needle in bad_model_inputs(tmp_path)}
    for k, needle in enumerate(["not found", "cycle"]):
        out = tmp_path / f"out{k}.onnx"
        proc = subprocess.run(
            [sys.executable, "-m", "tensat", "optimize", _write_case(tmp_path, k, cases[needle]), "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 1 and proc.stdout == "", (proc.returncode, proc.stdout)
        assert proc.stderr.startswith("tensat: error:") and proc.stderr.count("\n") == 1, proc.stderr
        assert needle in proc.stderr and not out.exists()


def _dynamic_model(tmp_path: Path) -> str:
    """The fault graph as a file whose input x has a symbolic dimension that is not a batch (a batch is taken as 1)."""
    model = export_model(_graph())
    dim = model.graph.input[0].type.tensor_type.shape.dim[1]
    dim.ClearField("dim_value")
    dim.dim_param = "seq"
    path = tmp_path / "dynamic.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


def test_a_symbolic_dim_the_model_runs_at_no_default_size_of_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """x[4, seq] feeds a MatMul whose weight fixes seq at 8: the default sizes tried all fail to run, and the error
    names the dim and the flag that sizes it."""
    src, out = _dynamic_model(tmp_path), tmp_path / "out.onnx"
    assert main(["optimize", src, "-o", str(out), "--cost", "analytic"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("tensat: error:") and "\n" not in err, err
    assert "symbolic dim seq at any of 128, 512, 2048, 16384" in err and "--input-shape" in err
    assert not out.exists()
    assert main(["optimize", src, "-o", str(out), "-q", "--input-shape", "x=4,8", "--cost", "analytic"]) == 0
    assert out.exists()


def _external_model(directory: Path) -> Path:
    """A model keeping its weight in `weights.bin` next to it."""
    model = _external_matmul(0.5)
    path = directory / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    return path


@pytest.mark.parametrize("kind", ["parent", "absolute", "symlink"])
def test_external_data_outside_the_model_directory_is_refused_by_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    path = _external_model(inner)
    os.replace(inner / "weights.bin", tmp_path / "x.bin")
    if kind == "symlink":
        os.symlink(tmp_path / "x.bin", inner / "weights.bin")
    else:
        model = onnx.load(str(path), load_external_data=False)
        location = "../x.bin" if kind == "parent" else str(tmp_path / "x.bin")
        for entry in model.graph.initializer[0].external_data:
            if entry.key == "location":
                entry.value = location
        onnx.save_model(model, str(path))
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(path), "-o", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("tensat: error:") and "\n" not in err and "outside the model's directory" in err, err
    assert not out.exists()


def test_a_model_with_external_data_over_the_proto_limit_works_through_the_cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The > 2 GiB path (limit lowered; the real 2.25 GiB model is tests/onnx/test_onnx_io.py's slow test): external
    data in, optimized, verified, written with external data next to the output."""
    monkeypatch.setattr(external, "PROTO_LIMIT", 4096)
    monkeypatch.setattr(external, "_LARGE_TENSOR", 1024)
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    src = tmp_path / "in" / "big.onnx"
    save_model(_external_matmul(0.25), src)
    assert (tmp_path / "in" / "big.onnx.data").exists()
    out = tmp_path / "out" / "big.opt.onnx"
    assert main(["optimize", str(src), "-o", str(out), "-q", "--cost", "analytic"]) == 0
    assert sorted(os.listdir(tmp_path / "out")) == ["big.opt.onnx", "big.opt.onnx.data"]
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}
    np.testing.assert_allclose(run_model(str(out), feeds)["y"], run_model(str(src), feeds)["y"], rtol=1e-5)


# -------------------------------------------------------------------------------------------------------------------
# safe by construction


UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}


def _unsafe_uses(tree: ast.AST) -> list[str]:
    """Imports of deserializers that run code, `allow_pickle=True`, and `torch.load` / `pickle.load(s)` calls."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in UNSAFE_MODULES:
            found.append(f"from {node.module} import")
        elif (
            isinstance(node, ast.keyword)
            and node.arg == "allow_pickle"
            and not (isinstance(node.value, ast.Constant) and node.value.value is False)
        ):
            found.append("allow_pickle")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and ((node.value.id == "torch" and node.attr == "load") or node.value.id in UNSAFE_MODULES)
        ):
            found.append(f"{node.value.id}.{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "__import__"
            and any(isinstance(a, ast.Constant) and str(a.value).split(".")[0] in UNSAFE_MODULES for a in node.args)
        ):
            found.append("__import__")
    return found


def test_the_scan_finds_unsafe_deserialization() -> None:
    sample = "import pickle\nfrom shelve import open\nnp.load(f, allow_pickle=True)\ntorch.load(p)\nmarshal.loads(b)\n"
    assert len(_unsafe_uses(ast.parse(sample))) == 5
    assert not _unsafe_uses(ast.parse("np.load(f, allow_pickle=False)\nonnx.load(p)\njson.loads(s)\n"))


def test_no_pickle_anywhere() -> None:
    """No Python file of the project imports a code-running deserializer or enables pickle loading."""
    files = []
    for folder, dirs, names in os.walk(ROOT):  # pruned as it walks: a virtual environment inside is not read
        dirs[:] = [d for d in dirs if not (d.startswith(".") or d in ("build", "venv") or d.endswith(".egg-info"))]
        files += [Path(folder, n) for n in names if n.endswith(".py")]
    assert len(files) > 20
    bad = {str(p.relative_to(ROOT)): uses for p in files if (uses := _unsafe_uses(ast.parse(p.read_text(), str(p))))}
    assert not bad, bad


# -------------------------------------------------------------------------------------------------------------------
# the measured cost model's cache (tensat/measure/cache.py): damage and locks never stop an optimization


@pytest.fixture
def quick_measured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """`cost="measured"` with its cache in a fresh directory and timing cut short; returns the database path."""
    from tensat import measure

    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    monkeypatch.setenv("TENSAT_CACHE_DIR", str(cache_dir))

    def quick(device: str = "auto", cache_path: Any = None, *args: Any, **kwargs: Any) -> Any:
        return measure.MeasuredCost(device, cache_path, False, max_seconds=0.02)

    monkeypatch.setattr(measure, "make_measured_cost", quick)
    from tensat.measure.cache import default_cache_path

    return default_cache_path()


@pytest.mark.slow
def test_a_corrupted_cost_cache_is_rebuilt_and_the_optimization_runs(quick_measured: Path) -> None:
    quick_measured.write_bytes(b"this is not an SQLite database" * 100)
    graph = _graph()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = tensat.optimize_with_details(graph, **{**FAST, "cost": "measured"})
    assert any("damaged" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert not [w for w in result.warnings if "cost model" in w], result.warnings
    assert list(quick_measured.parent.glob(f"{quick_measured.name}.corrupt-*"))
    from tensat.measure.cache import CostCache

    with CostCache(quick_measured) as cache:
        assert cache.count() > 0
    _valid(result, graph)


def test_a_locked_cost_cache_is_waited_for_and_the_optimization_runs(quick_measured: Path) -> None:
    import sqlite3
    import threading
    import time

    from tensat.measure.cache import CostCache

    CostCache(quick_measured).close()
    holder = sqlite3.connect(str(quick_measured), isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    released: list[float] = []

    def let_go() -> None:
        holder.commit()
        released.append(time.perf_counter())

    release = threading.Timer(1.5, let_go)
    release.start()
    try:
        graph = _graph()
        result = _optimize(graph, cost="measured")
        finished = time.perf_counter()
    finally:
        release.join()
        holder.close()
    assert released and finished > released[0]
    assert not [w for w in result.warnings if "cost model" in w], result.warnings
    with CostCache(quick_measured) as cache:  # written to the file, so after the lock was released: it waited
        assert cache.count() > 0
    _valid(result, graph)


def test_guided_rounds_are_skipped_when_the_extracted_graph_uses_no_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    real = TensorEGraph.explore
    guided: list[bool] = []

    def explore(self: TensorEGraph, **kw: Any) -> Any:
        guided.append(bool(kw.get("guided")))
        return real(self, **kw)

    monkeypatch.setattr(TensorEGraph, "explore", explore)
    result = _optimize(_graph())  # its gains are fusions (a conv with its relu), no merge to extend
    assert result.cost_after < result.cost_before and guided == [False]
    guided.clear()
    _optimize(_shared_weight_graph())
    assert guided[0] is False and True in guided


def test_a_failing_guided_round_keeps_the_explored_egraph(monkeypatch: pytest.MonkeyPatch) -> None:
    real = TensorEGraph.explore

    def explore(self: TensorEGraph, **kw: Any) -> Any:
        if kw.get("guided"):
            raise RuntimeError("egglog panicked in a guided round")
        return real(self, **kw)

    monkeypatch.setattr(TensorEGraph, "explore", explore)
    graph = _shared_weight_graph()
    result = _optimize(graph)
    _warned(result, "guided rounds failed", "egglog panicked")
    assert result.cost_after < result.cost_before
    _valid(result, graph)
