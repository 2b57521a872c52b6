"""Large models: running out of memory is named (the stage, the model's size, what gives the run more room), never
blamed on the model, and leaves no output; a long run shows its progress in logs too."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import tensat
import tensat.onnx_io as onnx_io
import tensat.verify as verify_mod
from tensat.cli import main
from tensat.egraph import TensorEGraph
from tensat.errors import out_of_memory
from tensat.ir import Graph
from tensat.onnx.external import external_dir, external_info, file_region, has_external
from tensat.onnx_io import export_model, import_model, save_model, weight_bytes
from tensat.progress import StderrProgress
from tensat.verify import run_model
from tests.helpers import interrupt_rename_onto

BAD_ALLOC = "[ONNXRuntimeError] : 1 : FAIL : Exception during loading: std::bad_alloc"


def _model(tmp_path: Path) -> Path:
    """A small model whose search changes it (a Transpose pair cancels), saved to a file."""
    rng = np.random.default_rng(0)
    g = Graph()
    x = g.input("x", (4, 8))
    y = g.add("matmul", [x, g.weight(rng.standard_normal((8, 6)).astype(np.float32), "w")])
    g.output("y", g.add("relu", [g.add("transpose", [g.add("transpose", [y], perm=(1, 0))], perm=(1, 0))]))
    path = tmp_path / "in.onnx"
    save_model(export_model(g), path)
    return path


def _fail_on_call(monkeypatch: pytest.MonkeyPatch, target: Any, name: str, call: int, error: BaseException) -> None:
    """Make `target.name` raise `error` on its `call`-th call (1-based), and work as before otherwise."""
    real = getattr(target, name)
    calls = [0]

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == call:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, failing)


# where the allocation fails -> (what to patch, which call fails, the error, the stage the message names)
FAILURES = {
    "verify-original": (verify_mod, "run_model", 1, RuntimeError(BAD_ALLOC), "verifying"),
    "verify-optimized": (verify_mod, "run_model", 2, RuntimeError(BAD_ALLOC), "verifying"),
    "explore": (TensorEGraph, "explore", 1, MemoryError(), "exploring the e-graph"),
}


@pytest.mark.parametrize("where", list(FAILURES))
def test_running_out_of_memory_names_the_stage_and_writes_nothing(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An allocation that fails in verification (onnxruntime's std::bad_alloc, for the model as given or for the
    optimized one) or in the search (a MemoryError) ends the run with one line naming the stage and the model's
    size, and saying how to give the run more room; the model is not blamed, and no file is written."""
    src = _model(tmp_path)
    out = tmp_path / "out.onnx"
    target, name, call, error, stage = FAILURES[where]
    _fail_on_call(monkeypatch, target, name, call, error)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--cost", "analytic", "--latency-check", "0"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("tensat: error: out of memory while"), err
    assert stage in err and "GiB of weights" in err and "--verify off" in err and "--latency-check 0" in err
    assert "fails in onnxruntime" not in err and "model is" not in err
    assert sorted(os.listdir(tmp_path)) == ["in.onnx"]


def test_what_counts_as_running_out_of_memory() -> None:
    """Python's MemoryError and the messages of the libraries tensat calls; not any other failure."""
    assert out_of_memory(MemoryError())
    assert out_of_memory(RuntimeError(BAD_ALLOC))
    assert out_of_memory(RuntimeError("Failed to allocate memory for requested buffer of size 123"))
    with pytest.raises(MemoryError) as too_large:
        np.empty(2**62, np.uint8)
    assert out_of_memory(too_large.value)
    assert out_of_memory(OSError(12, "Cannot allocate memory"))
    assert not out_of_memory(RuntimeError("[ONNXRuntimeError] : 10 : INVALID_GRAPH : Load model failed"))
    assert not out_of_memory(ValueError("shape mismatch"))


def test_weight_bytes_counts_external_data_without_reading_it(tmp_path: Path) -> None:
    g = Graph()
    x = g.input("x", (2, 512))
    g.output("y", g.add("matmul", [x, g.weight(np.ones((512, 1024), np.float32), "w")]))
    path = tmp_path / "m.onnx"
    onnx.save(export_model(g), path, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    assert any(p.suffix == ".data" for p in tmp_path.iterdir())
    assert weight_bytes(path) == 512 * 1024 * 4
    assert weight_bytes(tmp_path / "missing.onnx") is None


def test_a_long_run_shows_its_progress_in_logs_after_a_while() -> None:
    """Off a terminal and without --progress, a run says nothing until `after` seconds have passed; then the
    stage it is in, and one line per stage from then on (not one per detail)."""
    stream = io.StringIO()
    progress = StderrProgress(stream, live=False, after=0.2)
    progress("import", "reading the model")
    progress("explore", "iteration 1")
    assert stream.getvalue() == ""
    time.sleep(0.6)
    assert stream.getvalue().count("\n") == 1 and "explore: iteration 1" in stream.getvalue()
    progress("explore", "iteration 2")
    progress("verify", "running both models in onnxruntime")
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "verify: running both models" in lines[1]


def test_a_short_run_stays_quiet_in_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI off a terminal: a run shorter than the delay prints its summary only."""
    src = _model(tmp_path)
    assert main(["optimize", str(src), "-o", str(tmp_path / "out.onnx"), "--cost", "analytic"]) == 0
    assert "tensat: [" not in capsys.readouterr().err


# -- weights kept on disk


def _external_model(tmp_path: Path) -> Path:
    """A model whose weights lie in an external data file: two products of one weight matrix, and a bias."""
    rng = np.random.default_rng(3)
    g = Graph()
    x, z = g.input("x", (4, 64)), g.input("z", (4, 64))
    w = g.weight(rng.standard_normal((64, 256)).astype(np.float32), "w")
    b = g.weight(rng.standard_normal((256,)).astype(np.float32), "b")
    g.output("y", g.add("relu", [g.add("add", [g.add("matmul", [x, w]), b])]))
    g.output("v", g.add("tanh", [g.add("matmul", [z, w])]))
    path = tmp_path / "big.onnx"
    onnx.save(export_model(g), path, save_as_external_data=True, location="big.onnx.data", size_threshold=0)
    return path


def test_weights_on_disk_are_mapped_once_and_shared(tmp_path: Path) -> None:
    """A model's external data is not read into the proto nor copied into the graph: its weights are arrays mapped
    from the file, and the model as given and a copy of it (the pre-pass's output) read as the same arrays."""
    path = _external_model(tmp_path)
    model = onnx_io.load_model(path, keep_external=True)
    assert external_dir(model) == str(tmp_path) and all(has_external(t) for t in model.graph.initializer)
    first, second = import_model(model, check=False), import_model(onnx_io.pre_pass(model, "none"), check=False)
    assert len(first.weights) == 2 and sorted(first.weights) == sorted(second.weights)
    for name, array in first.weights.items():
        assert file_region(array) is not None and not array.flags.writeable
        assert np.shares_memory(array, second.weights[name])  # one mapping of the file, not two
    assert onnx_io.load_model(path).graph.initializer[0].HasField("raw_data")  # the default still loads it


def test_a_written_model_refers_to_the_weights_it_kept_and_saves_whole(tmp_path: Path) -> None:
    """Exported with `keep_external`, an unchanged weight is a reference to where it lies in the input's data file;
    the model runs in tensat's sessions as it is, and `save_model` writes it whole, its data copied, to a file that
    runs anywhere and computes what the input does."""
    path = _external_model(tmp_path)
    graph = import_model(path)
    written = export_model(graph, keep_external=True)
    assert external_dir(written) == str(tmp_path)
    assert len(written.graph.initializer) == 2 and all(has_external(t) for t in written.graph.initializer)
    assert all(not t.raw_data for t in written.graph.initializer)
    out = tmp_path / "out" / "opt.onnx"
    out.parent.mkdir()
    save_model(written, out)
    assert sorted(os.listdir(out.parent)) == ["opt.onnx", "opt.onnx.data"]
    saved = onnx.load(str(out), load_external_data=False)
    assert external_dir(saved) is None and all(external_info(t)[0] == "opt.onnx.data" for t in saved.graph.initializer)
    feeds = {"x": np.ones((4, 64), np.float32), "z": np.full((4, 64), 0.5, np.float32)}
    expected = run_model(str(path), feeds)
    for source in (written, str(out)):
        got = run_model(source, feeds)
        for name in ("y", "v"):
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-5)
    whole = export_model(graph)  # the default writes every weight into the model
    assert external_dir(whole) is None and not any(has_external(t) for t in whole.graph.initializer)


def test_optimizing_a_model_with_external_data_writes_it_whole(tmp_path: Path) -> None:
    """Through the CLI: the output is a model with its own data file, verified; through the API, a proto holding
    its weights."""
    path = _external_model(tmp_path)
    out = tmp_path / "res" / "out.onnx"
    out.parent.mkdir()
    assert main(["optimize", str(path), "-o", str(out), "-q", "--cost", "analytic", "--latency-check", "0"]) == 0
    saved = onnx.load(str(out), load_external_data=False)
    assert external_dir(saved) is None
    assert all(external_info(t)[0].startswith("out.onnx") for t in saved.graph.initializer if has_external(t))
    feeds = {"x": np.ones((4, 64), np.float32), "z": np.full((4, 64), 0.5, np.float32)}
    np.testing.assert_allclose(run_model(str(out), feeds)["y"], run_model(str(path), feeds)["y"], rtol=1e-5)
    proto = tensat.optimize(str(path), cost="analytic", latency_check=0)
    assert external_dir(proto) is None and not any(has_external(t) for t in proto.graph.initializer)


def test_saving_a_model_that_keeps_its_weights_on_disk_is_atomic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted before the model is renamed into place, a save leaves the previous output and its data file as
    they were, and no other file; completed, it leaves one model and one data file."""
    path = _external_model(tmp_path)
    written = export_model(import_model(path), keep_external=True)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "opt.onnx"
    save_model(written, out)
    before = {p: (out_dir / p).read_bytes() for p in os.listdir(out_dir)}
    interrupt_rename_onto(monkeypatch, out)
    with pytest.raises(KeyboardInterrupt):
        save_model(written, out)
    monkeypatch.undo()
    assert {p: (out_dir / p).read_bytes() for p in os.listdir(out_dir)} == before
    save_model(written, out)
    assert len(os.listdir(out_dir)) == 2
    feeds = {"x": np.ones((4, 64), np.float32), "z": np.zeros((4, 64), np.float32)}
    np.testing.assert_allclose(run_model(str(out), feeds)["y"], run_model(str(path), feeds)["y"], rtol=1e-6)
