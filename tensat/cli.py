"""The `tensat` command: optimize ONNX models, extract from e-graph files, list rules and built-in models."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from tensat import api, compare_cli, generate_cli, measure_cli, onnx_io
from tensat._version import __version__
from tensat.cli_args import Parser
from tensat.errors import TensatError, one_line
from tensat.extraction import InputError
from tensat.extraction import cli as extraction_cli
from tensat.files import atomic_write_json, check_writable
from tensat.measure.cache import default_cache_path
from tensat.models import build_model, catalog, format_catalog, model_names
from tensat.options import OPTION_NAMES, add_option_flags, options_from_args
from tensat.progress import LOG_AFTER, StderrProgress
from tensat.progress import wanted as progress_wanted
from tensat.rewrites import RuleError
from tensat.rewrites import cli as rules_cli


def _add_optimize(sub: Any) -> None:
    p = sub.add_parser(
        "optimize",
        help="optimize an ONNX model by equality saturation",
        description="Optimize an ONNX model: explore rewrites in an e-graph, extract the cheapest "
        "graph, verify it against the input in onnxruntime, write it out. Measured op costs are cached in "
        f"{default_cache_path()}, and the pre-pass's results beside it (set TENSAT_CACHE_DIR to keep them "
        "elsewhere).",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("input", nargs="?", help="the ONNX model to optimize")
    src.add_argument(
        "--model",
        metavar="NAME",
        type=_model_name,
        help="optimize a built-in benchmark graph instead of a file (see `tensat models`)",
    )
    p.add_argument("-o", "--output", required=True, help="where to write the optimized ONNX model")
    add_option_flags(p, ("input_shapes", *(name for name in OPTION_NAMES if name != "input_shapes")))
    p.add_argument(
        "--stats",
        metavar="FILE",
        help="write the run's statistics (growth per iteration, costs, times) as JSON to FILE",
    )
    p.add_argument(
        "--save-egraph",
        metavar="FILE",
        help="write the e-graph the graph was extracted from, its e-nodes priced, as egraph-serialize JSON to FILE "
        "(what `tensat extract` reads)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("-q", "--quiet", action="store_true", help="print nothing on success, and no progress")
    out.add_argument(
        "--progress",
        action="store_true",
        help="report progress on stderr even when it is not a terminal (on a terminal it always is)",
    )


def _model_name(text: str) -> str:
    """A built-in model's name, as `--model` takes it: an unknown one is a bad flag value."""
    if text not in model_names():
        raise argparse.ArgumentTypeError(f"unknown model {text!r}; valid names: {', '.join(model_names())}")
    return text


def progress_reporter(args: argparse.Namespace) -> Any:
    """The CLI's progress reporter on stderr: on a terminal unless --quiet; elsewhere every step with --progress,
    and without it one line per stage once the run has taken `LOG_AFTER` seconds (a long batch job shows where it
    is; a short one prints its summary only)."""
    if progress_wanted(args.quiet, args.progress):
        return StderrProgress()
    return None if args.quiet else StderrProgress(live=False, after=LOG_AFTER)


def _run_optimize(args: argparse.Namespace) -> int:
    for path in (args.output, args.stats, args.save_egraph):  # before any work, not after it
        if path:
            check_writable(path)
    source: Any = build_model(args.model) if args.model else args.input
    progress = progress_reporter(args)
    try:
        result = api.optimize_with_details(  # written by the run: weights kept on disk are copied, not loaded
            source, progress=progress, output=args.output, **options_from_args(args)
        )
    finally:
        if progress is not None:
            progress.close()
    if args.stats:
        atomic_write_json(args.stats, result.to_dict())
    if args.save_egraph:
        if result.egraph is None:
            print(f"tensat: no e-graph to write to {args.save_egraph}: the search did not run", file=sys.stderr)
        else:
            atomic_write_json(args.save_egraph, result.egraph.to_json())
    if not args.quiet:
        print(result.summary())
        print(f"wrote     {args.output}")
    return 0


def _add_extract(sub: Any) -> None:
    p = sub.add_parser(
        "extract",
        help="extract the cheapest acyclic term from an e-graph JSON file",
        description="Extract from an e-graph in the egraph-serialize JSON format.",
    )
    extraction_cli.add_arguments(p)


def _add_rules(sub: Any) -> None:
    p = sub.add_parser(
        "rules",
        help="list (and verify) the rewrite rules with counts",
        description="List every rule of the library: single- and multi-pattern, with counts.",
    )
    rules_cli.add_arguments(p)
    actions = p.add_subparsers(dest="rules_action", metavar="ACTION")
    g = actions.add_parser(
        "generate",
        help="generate rules: enumerate terms over the operator registry, pair equal fingerprints, prune, "
        "minimize by equality saturation, verify, and write a rule file",
        description="Generate rewrite rules as TASO does (enumerated terms, fingerprints, pruning), minimized with "
        "an e-graph as Ruler does, every rule verified.",
    )
    generate_cli.add_arguments(g)


def _run_rules(args: argparse.Namespace) -> int:
    if args.rules_action == "generate":
        return generate_cli.run(args)
    return rules_cli.run(args)


def _add_compare(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="equality saturation vs TASO-style sequential search on a model",
        description="Run tensat and a TASO-style best-first sequential search with the same rules "
        "and cost model; print a Table-1-style comparison with measured latencies.",
    )
    compare_cli.add_arguments(p)


def _run_compare(args: argparse.Namespace) -> int:
    return compare_cli.run(args)


def _add_profile(sub: Any) -> None:
    p = sub.add_parser("profile", help="measure and cache the per-operator costs of a model on this device")
    measure_cli.add_profile_arguments(p)


def _add_cost_report(sub: Any) -> None:
    p = sub.add_parser("cost-report", help="summed measured cost beside end-to-end latency, before and after")
    measure_cli.add_cost_report_arguments(p)


def _run_profile(args: argparse.Namespace) -> int:
    return measure_cli.run_profile(args)


def _run_cost_report(args: argparse.Namespace) -> int:
    return measure_cli.run_cost_report(args)


def _add_models(sub: Any) -> None:
    p = sub.add_parser(
        "models",
        help="list the built-in benchmark graphs, or write one as ONNX",
        description="List the built-in models, or write one as an ONNX file (--export NAME -o FILE) to try the "
        "commands that take a model file on.",
    )
    p.add_argument("--export", metavar="NAME", type=_model_name, help="the built-in model to write")
    p.add_argument("-o", "--output", metavar="FILE", help="where --export writes it")


def _run_models(args: argparse.Namespace) -> int:
    if args.export is None:
        print(format_catalog(catalog()))
        return 0
    check_writable(args.output)
    onnx_io.save_model(build_model(args.export), args.output)
    print(f"wrote     {args.output} (the built-in {args.export})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `tensat` command."""
    parser = Parser(prog="tensat", description="Tensor-graph superoptimization by equality saturation.")
    parser.add_argument("--version", action="version", version=f"tensat {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_optimize(sub)
    _add_extract(sub)
    _add_rules(sub)
    _add_compare(sub)
    _add_profile(sub)
    _add_cost_report(sub)
    _add_models(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: returns the process exit code (0 success, 1 failure, 2 bad usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "optimize" and args.input is not None and args.model is not None:
        parser.error("give either a model file or --model, not both")
    if args.command == "models" and (args.export is None) != (args.output is None):
        parser.error("--export NAME writes a built-in model to -o FILE: give both, or neither to list the models")
    handlers = {
        "optimize": _run_optimize,
        "rules": _run_rules,
        "compare": _run_compare,
        "models": _run_models,
        "profile": _run_profile,
        "cost-report": _run_cost_report,
    }
    try:
        if args.command == "extract":
            return extraction_cli.run(args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return handlers[args.command](args)
    except (TensatError, RuleError, InputError) as exc:
        print(f"tensat: error: {one_line(exc, limit=None)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tensat: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
