"""The onnxslim pre-pass (the default; `--pre-pass none` turns it off): tensat reads onnxslim's output, prices and
checks the result against the model as given, leaves the caller's proto alone, and reads the model as given where
the pre-pass fails or writes something tensat cannot read."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxslim
import pytest
from onnx import helper, numpy_helper

import tensat
from tensat import onnx_io
from tensat.cli import main
from tensat.cost import AnalyticCost, runtime_cost
from tensat.errors import TensatError
from tensat.options import Options
from tensat.verify import random_inputs, run_model
from tests.helpers import make, vi

FAST = {"cost": "analytic", "latency_check": 0, "time_limit": 5, "ilp_time_limit": 5}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own cache directory: a pre-pass result kept by one (or by a detour standing in for onnxslim)
    is not read by another."""
    monkeypatch.setenv("TENSAT_CACHE_DIR", str(tmp_path / "cache"))


def _model() -> onnx.ModelProto:
    """x[1,8,16] @ W + b, Relu, then @ V1 @ V2: onnxslim writes the 3-D MatMul+Add as Reshape, Gemm, Reshape;
    tensat folds the product of the two weights V1 @ V2 (onnxslim does not)."""
    rng = np.random.default_rng(0)
    shapes = {"W": (16, 32), "b": (32,), "V1": (32, 64), "V2": (64, 8)}
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in shapes.items()]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("MatMul", ["r", "V1"], ["p"]),
        helper.make_node("MatMul", ["p", "V2"], ["y"]),
    ]
    return make(nodes, [vi("x", [1, 8, 16])], [vi("y", [1, 8, 8])], inits)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_the_graph_read_is_onnxslims_and_the_result_is_checked_against_the_model_as_given() -> None:
    model = _model()
    before = model.SerializeToString()
    result = tensat.optimize_with_details(model, **FAST)  # the default pre-pass
    assert model.SerializeToString() == before  # onnxslim edits the proto it is given; the caller's is untouched
    assert result.returned_input is None
    assert "Gemm" in _ops(result.output)  # onnxslim's Reshape, Gemm, Reshape
    assert _ops(result.output).count("MatMul") == 1  # tensat's own rewrite on top: V1 @ V2 folded
    assert (result.nodes_before, result.nodes_read) == (5, 6) and "pre_pass" in result.times and result.pre_passed
    assert "6 read after the onnxslim pre-pass" in result.summary()
    assert result.verification is not None and result.verification.ok
    feeds = random_inputs(model, seed=3)
    np.testing.assert_allclose(run_model(result.output, feeds)["y"], run_model(model, feeds)["y"], rtol=1e-4, atol=1e-4)


def test_without_the_pre_pass_tensat_reads_the_model_as_given() -> None:
    result = tensat.optimize_with_details(_model(), pre_pass="none", **FAST)
    assert "Gemm" not in _ops(result.output) and "pre_pass" not in result.times
    assert result.nodes_read == result.nodes_before == 5


def test_the_input_is_priced_as_given_so_what_the_pre_pass_gains_is_returned() -> None:
    """onnxslim cancels the two Transposes before tensat reads the model: the graph read costs less than the model as
    given, and that gain alone makes the result, even with no rule to add and no end-to-end check."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["t1"], perm=[1, 0]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0]),
        helper.make_node("Relu", ["t2"], ["y"]),
    ]
    model = make(nodes, [vi("x", [64, 32])], [vi("y", [64, 32])])
    result = tensat.optimize_with_details(model, **FAST)
    given = onnx_io.import_model(model).compact()
    assert result.nodes_read == 1 and len(result.original_graph.nodes) == len(given.nodes)
    assert result.cost_before == pytest.approx(runtime_cost(given, AnalyticCost()))
    assert result.returned_input is None and _ops(result.output) == ["Relu"]
    assert result.cost_after < result.cost_before


def test_the_result_takes_the_inputs_the_model_as_given_declares() -> None:
    """onnxslim drops a graph input nothing reads; the result keeps it, so it runs with the same feeds (and the
    end-to-end check can time it)."""
    model = _model()
    model.graph.input.append(vi("unused", [2, 3]))
    result = tensat.optimize_with_details(model, cost="analytic", latency_check=0.5, time_limit=5, ilp_time_limit=5)
    assert [i.name for i in result.output.graph.input] == ["x", "unused"]
    assert not [w for w in result.warnings if "latency check could not run" in w], result.warnings
    assert result.latency is not None


def test_a_pre_pass_graph_that_prices_above_the_model_as_given_is_not_searched_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A peer's output that costs more than the model as given (here two Transposes that cancel, in front of the
    Relu) is not where the search starts: the model as given is."""

    def detour(model: onnx.ModelProto) -> onnx.ModelProto:
        relu = model.graph.node[0]
        relu.input[0] = "t2"
        model.graph.node.insert(0, helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0]))
        model.graph.node.insert(0, helper.make_node("Transpose", ["x"], ["t1"], perm=[1, 0]))
        return model

    monkeypatch.setattr(onnxslim, "slim", detour)
    model = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [64, 32])], [vi("y", [64, 32])])
    result = tensat.optimize_with_details(model, **FAST)
    assert "pre_pass" in result.times and not result.pre_passed
    assert result.nodes_read == result.nodes_before == 1 and "pre-pass" not in result.summary()
    assert result.to_dict()["pre_passed"] is False
    assert _ops(result.output) == ["Relu"] and not result.warnings


def test_a_failing_pre_pass_reads_the_model_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(model: onnx.ModelProto) -> onnx.ModelProto:
        raise RuntimeError("injected onnxslim failure")

    monkeypatch.setattr(onnxslim, "slim", crash)
    result = tensat.optimize_with_details(_model(), pre_pass="onnxslim", **FAST)
    assert any("onnxslim pre-pass failed" in w and "injected onnxslim failure" in w for w in result.warnings)
    assert "Gemm" not in _ops(result.output) and result.nodes_read == 5 and not result.pre_passed
    assert result.verification is not None and result.verification.ok


def test_a_pre_pass_output_tensat_cannot_read_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def dangling(model: onnx.ModelProto) -> onnx.ModelProto:
        model.graph.node[0].input[0] = "nowhere"
        return model

    monkeypatch.setattr(onnxslim, "slim", dangling)
    result = tensat.optimize_with_details(_model(), pre_pass="onnxslim", **FAST)
    assert any("cannot read the onnxslim pre-pass's output" in w and "'nowhere'" in w for w in result.warnings)
    assert result.verification is not None and result.verification.ok


def test_the_pre_pass_without_onnxslim_installed_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxslim", None)  # what `import onnxslim` sees where it is not installed
    with pytest.raises(TensatError, match=r"needs onnxslim: pip install onnxslim") as err:
        tensat.optimize(_model(), pre_pass="onnxslim", **FAST)
    assert "\n" not in str(err.value)


def test_an_unknown_pre_pass_is_refused() -> None:
    with pytest.raises(TensatError, match="unknown pre-pass 'onnxsim'"):
        Options(pre_pass="onnxsim").check()


def test_the_command_line_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_model(), str(src))
    argv = ["optimize", str(src), "-o", str(out), "--pre-pass", "onnxslim", "--cost", "analytic"]
    assert main([*argv, "--latency-check", "0"]) == 0
    assert "read after the onnxslim pre-pass" in capsys.readouterr().out
    assert "Gemm" in _ops(onnx.load(str(out)))


def test_a_second_run_reads_the_pre_pass_result_kept_by_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The result is kept under a digest of the model: the same model again is read from there, with the weights the
    pre-pass left taken from the model (not stored twice); another model, or a damaged entry, runs the pre-pass."""
    kept = tmp_path / "kept"
    model = _model()
    first = onnx_io.cached_pre_pass(model, "onnxslim", kept)
    (entry,) = kept.glob("*.onnx")
    assert entry.stat().st_size < model.ByteSize() / 2  # its weights are the model's: only the graph is stored
    calls = []
    real = onnxslim.slim
    monkeypatch.setattr(onnxslim, "slim", lambda m: calls.append(1) or real(m))
    again = onnx_io.cached_pre_pass(model, "onnxslim", kept)
    assert not calls and again.SerializeToString(deterministic=True) == first.SerializeToString(deterministic=True)
    other = _model()
    other.graph.initializer[0].raw_data = bytes(len(other.graph.initializer[0].raw_data))
    onnx_io.cached_pre_pass(other, "onnxslim", kept)
    assert calls == [1] and len(list(kept.glob("*.onnx"))) == 2
    entry.write_bytes(b"damaged")
    again = onnx_io.cached_pre_pass(model, "onnxslim", kept)
    assert calls == [1, 1] and again.SerializeToString(deterministic=True) == first.SerializeToString(
        deterministic=True
    )
