"""The `tensat` command: every command's flags derive from the API's options, `tensat optimize` on built-in models
and files, help, `tensat models`, and one error style across every subcommand."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tensat.api import Options
from tensat.cli import build_parser, main
from tensat.compare_cli import TENSAT_OPTIONS
from tensat.models import SMALL_SIZES, build_model
from tensat.options import OPTION_NAMES, option_help, options_from_args
from tensat.verify import run_model
from tests.helpers import bad_model_inputs


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
    model = build_model("bert", **SMALL_SIZES["bert"])
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
    shaped = ["optimize", str(src), "-o", str(out), "-q", "--input-shape", "x=16,64", "--cost", "analytic"]
    assert main([*shaped, "--iter-limit", "2"]) == 0
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


def test_cli_unknown_model_is_a_bad_flag_value(tmp_path: Path, capsys):
    """An unknown `--model` is a bad flag value: one line naming it and the valid names, exit 2, nothing written."""
    with pytest.raises(SystemExit) as exc:
        main(["optimize", "--model", "alexnet", "-o", str(tmp_path / "x.onnx")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown model 'alexnet'" in err and "squeezenet" in err
    assert not (tmp_path / "x.onnx").exists()


def test_cli_states_its_version(capsys):
    from tensat._version import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out == f"tensat {__version__}\n"


# -------------------------------------------------------------------------------------------------------------------
# built-in models


def test_cli_models_lists_sizes_and_descriptions(capsys: pytest.CaptureFixture) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["name", "ONNX", "nodes"]
    squeeze = next(ln for ln in out if ln.startswith("squeezenet "))
    assert "SqueezeNet" in squeeze and "1x3x224x224" in squeeze


# -------------------------------------------------------------------------------------------------------------------
# one error style


@pytest.mark.parametrize(
    "argv",
    [
        ["optimize", "m.onnx", "-o", "x.onnx", "--node-limit", "-5"],
        ["optimize", "m.onnx", "-o", "x.onnx", "--cost", "guess"],
        ["optimize", "m.onnx", "--model", "bert", "-o", "x.onnx"],
        ["extract", "e.json", "--time-limit", "0"],
        ["rules", "--trials", "many"],
        ["compare", "--budget", "lots"],
        ["profile", "--device", "tpu"],
        ["cost-report", "--bogus"],
        ["models", "--bogus"],
        ["models", "--export", "bert"],
        ["models", "-o", "x.onnx"],
        ["models", "--export", "resnet18", "-o", "x.onnx"],
        ["frobnicate"],
    ],
)
def test_every_usage_error_is_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tensat: error: ") and err.count("\n") == 1 and "--help" in err, err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["optimize", "missing.onnx", "-o", "x.onnx"], "missing.onnx"),
        (["extract", "missing.json"], "missing.json"),
        (["rules", "--file", "missing.rules"], "missing.rules"),
        (["compare", "missing.onnx", "--no-latency"], "missing.onnx"),
        (["profile", "missing.onnx"], "missing.onnx"),
    ],
)
def test_every_input_error_is_one_line_and_exit_1(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("tensat: error: ") and err.count("\n") == 1 and needle in err, err


def test_help_states_defaults_and_where_output_goes(capsys: pytest.CaptureFixture) -> None:
    for argv in (["optimize", "--help"], ["extract", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
    text = " ".join(capsys.readouterr().out.split())
    assert "(default auto: CUDA where it loads" in text
    assert "stdout" in text and "nothing is written" in text.lower()


def test_the_parser_is_the_one_error_style_for_subcommands() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert all(type(p) is type(parser) for p in subparsers.choices.values())


# -------------------------------------------------------------------------------------------------------------------
# the files the README's examples start from


def test_models_export_writes_a_built_in_model_that_optimizes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`tensat models --export NAME -o FILE` writes the built-in model as ONNX: the file the README's `model.onnx`
    examples start from, which runs as the built-in model does and optimizes from the command line."""
    path = tmp_path / "squeezenet.onnx"
    assert main(["models", "--export", "squeezenet", "-o", str(path)]) == 0
    assert str(path) in capsys.readouterr().out
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    built = build_model("squeezenet")
    dims = [d.dim_value for d in built.graph.input[0].type.tensor_type.shape.dim]
    feeds = {built.graph.input[0].name: np.random.default_rng(0).standard_normal(dims).astype(np.float32)}
    got, expected = run_model(model, feeds), run_model(built, feeds)
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])
    out = tmp_path / "opt.onnx"
    argv = ["optimize", str(path), "-o", str(out), "-q", "--cost", "analytic", "--latency-check", "0"]
    assert main([*argv, "--iter-limit", "2"]) == 0
    assert out.exists()


def test_save_egraph_writes_what_extract_reads(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`tensat optimize --save-egraph FILE` writes the e-graph the graph was extracted from as egraph-serialize JSON;
    `tensat extract` reads it, and finds no graph cheaper than the run's own extraction did."""
    from tensat.extraction import EGraph

    egraph, out = tmp_path / "egraph.json", tmp_path / "opt.onnx"
    argv = ["optimize", "--model", "squeezenet", "-o", str(out), "-q", "--cost", "analytic", "--latency-check", "0"]
    argv += ["--iter-limit", "2"]  # an e-graph of a few hundred e-nodes: the ILP proves its optimum in seconds
    assert main([*argv, "--stats", str(tmp_path / "stats.json"), "--save-egraph", str(egraph)]) == 0
    data = json.loads(egraph.read_text())
    read = EGraph.from_json(data)
    again = EGraph.from_json(read.to_json())
    assert again.nodes == read.nodes and again.roots == read.roots and len(read.nodes) > 100
    stats = json.loads((tmp_path / "stats.json").read_text())
    capsys.readouterr()
    assert main(["extract", str(egraph), "--extractor", "ilp", "--time-limit", "20"]) == 0
    found = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("cost"))
    assert float(found.split()[1]) <= stats["extraction"]["cost"] * (1 + 1e-5)


def test_the_defaults_the_readme_states_are_the_code_s() -> None:
    """Every option whose default the README's options paragraph gives as a number (`name` (N ...), and the time
    budget's shares for exploration and the guided rounds, are the code's."""
    import re

    from tensat import api
    from tests.helpers import ROOT

    readme = (ROOT / "README.md").read_text()
    paragraph = readme[readme.index("Options (API keyword = CLI flag):") :].split("\n\n", 1)[0]
    stated = {
        name: float(value.replace(",", ""))
        for name, value in re.findall(r"`(\w+)` \((\d[\d,]*(?:\.\d+)?)", " ".join(paragraph.split()))
    }
    defaults = Options()
    assert {"time_budget", "patience", "node_limit", "iter_limit", "time_limit", "k_multi"} <= set(stated)
    assert {"guided_rounds", "ilp_time_limit", "latency_check"} <= set(stated)
    for name, value in stated.items():
        assert getattr(defaults, name) == value, (name, value, getattr(defaults, name))
    shares = re.search(r"exploration ends by (\d+)% of it and the guided rounds by (\d+)%", " ".join(paragraph.split()))
    assert shares is not None
    assert (float(shares[1]) / 100, float(shares[2]) / 100) == (api.EXPLORE_SHARE, api.GUIDED_SHARE)
