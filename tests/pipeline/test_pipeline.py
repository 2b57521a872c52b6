"""End to end: ONNX in, e-graph, extraction, verified ONNX out — through the API and the CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensat
from tensat import extraction
from tensat.api import Options
from tensat.cli import build_parser, main
from tensat.compare_cli import TENSAT_OPTIONS
from tensat.models import SMALL_SIZES, build_model, model_names
from tensat.options import OPTION_NAMES, option_help, options_from_args
from tensat.verify import run_model
from tests.helpers import bad_model_inputs

SMALL = SMALL_SIZES

FAST = dict(ilp_time_limit=5, time_limit=20, iter_limit=6, cost="analytic", latency_check=0)


def test_small_configs_cover_every_benchmark():
    assert sorted(SMALL) == sorted(model_names())


@pytest.mark.parametrize("name", sorted(SMALL))
def test_benchmark_graph_optimizes_end_to_end(name):
    model = build_model(name, **SMALL[name])
    result = tensat.optimize_with_details(model, **FAST)
    out = result.output
    assert isinstance(out, onnx.ModelProto)
    onnx.checker.check_model(out, full_check=True)
    assert result.verification is not None and result.verification.ok
    assert result.cost_after <= result.cost_before * (1 + 1e-9)
    assert [i.name for i in out.graph.input] == [i.name for i in model.graph.input]
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    assert result.exploration.iterations, "no exploration iteration ran"
    assert set(result.times) >= {"import", "explore", "extract"}
    assert "verify" in result.times or result.returned_input is not None
    ex = result.extraction
    assert ex.bound is None or ex.bound <= ex.cost * (1 + 1e-9)
    assert ex.status != "optimal" or ex.gap() <= extraction.GAP_TOLERANCE


def _attention_with_opaque_ops() -> onnx.ModelProto:
    """Q, K, V projections sharing an input, with LayerNormalization, Softmax and Gather that tensat does not model."""
    rng = np.random.default_rng(0)
    d = 16

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)

    inits = [
        init("wq", d, d),
        init("wk", d, d),
        init("wv", d, d),
        init("ln_scale", d),
        init("ln_bias", d),
        numpy_helper.from_array(np.array([0, 2, 4, 6], dtype=np.int64), "rows"),
    ]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "ln_scale", "ln_bias"], ["xn"], axis=-1),
        helper.make_node("MatMul", ["xn", "wq"], ["q"]),
        helper.make_node("MatMul", ["xn", "wk"], ["k"]),
        helper.make_node("MatMul", ["xn", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
        helper.make_node("MatMul", ["q", "kt"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["att"]),
        helper.make_node("Gather", ["att", "rows"], ["picked"], axis=0),
        helper.make_node("Relu", ["picked"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "attn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, d])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_optimizes_around_ops_tensat_does_not_model():
    model = _attention_with_opaque_ops()
    result = tensat.optimize_with_details(model, **FAST)
    assert result.verification.ok
    merges = sum(it.matches.get("matmul-merge-shared-input", 0) for it in result.exploration.iterations)
    assert merges > 0, "the Q/K/V matmuls around the opaque ops were not explored"
    kept = {n.op_type for n in result.output.graph.node}
    assert {"LayerNormalization", "Softmax", "Gather"} <= kept


def test_api_returns_the_form_it_was_given(tmp_path: Path):
    model = build_model("squeezenet", **SMALL["squeezenet"])
    path = tmp_path / "sq.onnx"
    onnx.save(model, str(path))
    assert isinstance(tensat.optimize(model, **FAST), onnx.ModelProto)
    assert isinstance(tensat.optimize(str(path), **FAST), onnx.ModelProto)
    out = tmp_path / "sq.opt.onnx"
    assert tensat.optimize(path, output=str(out), **FAST) == out and out.exists()
    from tensat.onnx_io import import_model

    graph = import_model(model)
    optimized = tensat.optimize(graph, **FAST)
    assert isinstance(optimized, tensat.Graph)


def test_cli_defaults_are_the_api_defaults():
    """`tensat optimize` without flags runs exactly as `tensat.optimize` with no options."""
    args = build_parser().parse_args(["optimize", "in.onnx", "-o", "out.onnx"])
    assert Options(**options_from_args(args)) == Options()


def _option_flags(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> dict[str, argparse.Action]:
    """The flags of `parser` that parse into the named `Options` fields, by field."""
    return {a.dest: a for a in parser._actions if a.dest in names}


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


@pytest.mark.parametrize(
    "command, names",
    [
        ("optimize", OPTION_NAMES),
        ("compare", ("input_shapes", *TENSAT_OPTIONS)),  # its --cost, --device and --seed are the comparison's own
        ("profile", ("input_shapes", "node_limit", "iter_limit", "time_limit", "k_multi")),
        ("cost-report", ("input_shapes", "node_limit", "iter_limit", "time_limit", "k_multi", "ilp_time_limit")),
    ],
)
def test_every_command_derives_its_option_flags_from_options(
    monkeypatch: pytest.MonkeyPatch, command: str, names: tuple[str, ...]
) -> None:
    """Each command's flags for tensat's options are built from the `Options` fields: the help text is the field's
    and states its default; a changed default changes the flag's default (compare leaves them unset, so tensat's
    applies) and its help."""
    flags = _option_flags(_subcommands()[command], names)
    assert set(flags) == set(names)
    for name, action in flags.items():
        assert action.help == option_help(name)
        f = Options.__dataclass_fields__[name]
        if "{default}" in f.metadata["help"]:
            shown = f"{f.default:g}" if isinstance(f.default, float) else str(f.default)
            assert f"default {shown}" in action.help, action.help
        else:  # a switch, or a flag that adds to a collection
            assert action.nargs == 0 or name == "input_shapes", name
        unset = command == "compare" and name != "input_shapes"
        assert action.default == (None if unset else f.default), name
    monkeypatch.setattr(Options.__dataclass_fields__["node_limit"], "default", 1234)
    action = _option_flags(_subcommands()[command], names)["node_limit"]
    assert "(default 1234)" in action.help and action.default == (None if command == "compare" else 1234)


def test_cli_optimizes_a_builtin_model(tmp_path: Path, capsys):
    out = tmp_path / "squeezenet.opt.onnx"
    stats = tmp_path / "stats.json"
    code = main(["optimize", "--model", "squeezenet", "-o", str(out), "--stats", str(stats), "--ilp-time-limit", "30"])
    assert code == 0
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    data = json.loads(stats.read_text())
    assert data["cost_after"] <= data["cost_before"]
    assert data["exploration"]["iterations"] and data["verification"]["ok"]
    assert "wrote" in capsys.readouterr().out


def test_cli_optimizes_a_file_with_input_shape(tmp_path: Path):
    model = build_model("bert", **SMALL["bert"])
    dynamic = onnx.ModelProto()
    dynamic.CopyFrom(model)
    dim = dynamic.graph.input[0].type.tensor_type.shape.dim[0]
    dim.ClearField("dim_value")
    dim.dim_param = "seq"
    src = tmp_path / "bert.onnx"
    onnx.save(dynamic, str(src))
    out = tmp_path / "bert.opt.onnx"
    assert main(["optimize", str(src), "-o", str(out), "-q"]) == 1
    assert not out.exists()
    assert main(["optimize", str(src), "-o", str(out), "-q", "--input-shape", "x=16,64", "--cost", "analytic"]) == 0
    feeds = {"x": np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)}
    want = run_model(model, feeds)
    got = run_model(onnx.load(str(out)), feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4)


def test_cli_bad_input_one_line_error_no_output(tmp_path: Path, capsys):
    for k, (source, needle) in enumerate(bad_model_inputs(tmp_path)):
        if isinstance(source, onnx.ModelProto):
            path = tmp_path / f"case{k}.onnx"
            path.write_bytes(source.SerializeToString())
            source = str(path)
        out = tmp_path / f"out{k}.onnx"
        assert main(["optimize", str(source), "-o", str(out)]) == 1, needle
        err = capsys.readouterr().err.strip()
        assert err.startswith("tensat: error:") and "\n" not in err, err
        assert needle in err, (needle, err)
        assert not out.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".out{k}")], "temporary file left behind"


def test_cli_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["optimize", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--model",
        "--output",
        "--input-shape",
        "--node-limit",
        "--iter-limit",
        "--time-limit",
        "--k-multi",
        "--extractor",
        "--solver",
        "--ilp-time-limit",
        "--no-verify",
        "--stats",
    ):
        assert flag in text


def test_cli_unknown_model_is_a_clear_error(tmp_path: Path, capsys):
    assert main(["optimize", "--model", "alexnet", "-o", str(tmp_path / "x.onnx")]) == 1
    assert "alexnet" in capsys.readouterr().err
