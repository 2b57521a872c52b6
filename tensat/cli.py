"""The `tensat` command: optimize ONNX models, extract from e-graph files, list rules and built-in models."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any, Sequence

from tensat import api, compare_cli, measure_cli, onnx_io
from tensat.cli_args import Parser, non_negative_float, one_line, parse_input_shape, positive_float, positive_int
from tensat.errors import TensatError
from tensat.extraction import InputError
from tensat.extraction import cli as extraction_cli
from tensat.files import atomic_write_json, check_writable
from tensat.models import build_model, catalog, format_catalog
from tensat.progress import StderrProgress, stream_is_tty
from tensat.rewrites import RuleError
from tensat.rewrites import cli as rules_cli


def _add_optimize(sub: Any) -> None:
    p = sub.add_parser("optimize", help="optimize an ONNX model by equality saturation",
                       description="Optimize an ONNX model: explore rewrites in an e-graph, extract the cheapest "
                                   "graph, verify it against the input in onnxruntime, write it out.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("input", nargs="?", help="the ONNX model to optimize")
    src.add_argument("--model", metavar="NAME", help="optimize a built-in benchmark graph instead of a file "
                                                     "(see `tensat models`)")
    p.add_argument("-o", "--output", required=True, help="where to write the optimized ONNX model")
    p.add_argument("--input-shape", metavar="NAME=D1,D2,...", type=parse_input_shape, action="append", default=[],
                   help="concrete shape for an input with dynamic dims (repeat for several inputs)")
    p.add_argument("--node-limit", type=positive_int, default=50_000,
                   help="stop exploring before the e-graph exceeds this many e-nodes (default 50000)")
    p.add_argument("--iter-limit", type=int, default=15, help="maximum exploration iterations (default 15)")
    p.add_argument("--time-limit", type=positive_float, default=60.0,
                   help="exploration time limit in seconds, checked between iterations (default 60)")
    p.add_argument("--k-multi", type=int, choices=(0, 1, 2), default=1,
                   help="number of first iterations in which multi-pattern rules run (default 1)")
    p.add_argument("--guided-rounds", type=int, default=4,
                   help="rounds after exploration that run the multi-pattern rules on pairs of the extracted graph's "
                        "e-classes, extending its merges (default 4; 0 disables)")
    p.add_argument("--extractor", choices=("ilp", "greedy"), default="ilp",
                   help="extraction method: optimal ILP or greedy DAG (default ilp)")
    p.add_argument("--solver", choices=("highs", "cbc"), default="highs", help="ILP solver (default highs)")
    p.add_argument("--ilp-time-limit", type=positive_float, default=60.0,
                   help="ILP solver time limit in seconds (default 60)")
    p.add_argument("--cost", choices=("analytic", "measured"), default="measured",
                   help="cost model: per-op latency measured in onnxruntime on the target device, cached (default), "
                        "or the analytic roofline estimate (quick and reproducible)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="device whose latency the measured cost model uses and the end-to-end check times on "
                        "(default auto: CUDA where it loads and a GPU exists, else CPU)")
    p.add_argument("--latency-check", metavar="SECONDS", type=non_negative_float, default=20.0,
                   help="time the optimized model against the input end to end, at one thread and at every core, "
                        "for up to this long, and keep the input unless the optimized one runs faster (default 20; "
                        "0 skips)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the numerical check of the optimized model against the input in onnxruntime")
    p.add_argument("--seed", type=int, default=0, help="seed of the random verification inputs (default 0)")
    p.add_argument("--stats", metavar="FILE", help="write the run's statistics (growth per iteration, costs, "
                                                   "times) as JSON to FILE")
    out = p.add_mutually_exclusive_group()
    out.add_argument("-q", "--quiet", action="store_true", help="print nothing on success, and no progress")
    out.add_argument("--progress", action="store_true",
                     help="report progress on stderr even when it is not a terminal (on a terminal it always is)")


def progress_reporter(args: argparse.Namespace) -> Any:
    """The CLI's progress reporter on stderr: on a terminal unless --quiet; elsewhere only with --progress."""
    if getattr(args, "quiet", False) or not (getattr(args, "progress", False) or stream_is_tty(sys.stderr)):
        return None
    return StderrProgress()


def _run_optimize(args: argparse.Namespace) -> int:
    for path in (args.output, args.stats):  # before any work, not after it
        if path:
            check_writable(path)
    if args.model:
        try:
            source: Any = build_model(args.model)
        except ValueError as exc:
            raise TensatError(str(exc)) from None
    else:
        source = args.input
    shapes = dict(args.input_shape) if args.input_shape else None
    progress = progress_reporter(args)
    try:
        result = api.optimize_with_details(
            source, progress=progress, input_shapes=shapes, node_limit=args.node_limit, iter_limit=args.iter_limit,
            time_limit=args.time_limit, k_multi=args.k_multi, guided_rounds=args.guided_rounds,
            extractor=args.extractor, solver=args.solver, ilp_time_limit=args.ilp_time_limit, cost=args.cost,
            device=args.device, latency_check=args.latency_check, verify=not args.no_verify, seed=args.seed,
        )
    finally:
        if progress is not None:
            progress.close()
    onnx_io.save_model(result.output, args.output)
    if args.stats:
        atomic_write_json(args.stats, result.to_dict())
    if not args.quiet:
        print(result.summary())
        print(f"wrote     {args.output}")
    return 0


def _add_extract(sub: Any) -> None:
    p = sub.add_parser("extract", help="extract the cheapest acyclic term from an e-graph JSON file",
                       description="Extract from an e-graph in the egraph-serialize JSON format.")
    extraction_cli.add_arguments(p)


def _add_rules(sub: Any) -> None:
    p = sub.add_parser("rules", help="list (and verify) the rewrite rules with counts",
                       description="List every rule of the library: single- and multi-pattern, with counts.")
    rules_cli.add_arguments(p)


def _run_rules(args: argparse.Namespace) -> int:
    return rules_cli.run(args)


def _add_compare(sub: Any) -> None:
    p = sub.add_parser("compare", help="equality saturation vs TASO-style sequential search on a model",
                       description="Run tensat and a TASO-style best-first sequential search with the same rules "
                                   "and cost model; print a Table-1-style comparison with measured latencies.")
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
    sub.add_parser("models", help="list the built-in benchmark graphs", description="List the built-in models.")


def _run_models(args: argparse.Namespace) -> int:
    print(format_catalog(catalog()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `tensat` command."""
    parser = Parser(prog="tensat", description="Tensor-graph superoptimization by equality "
                                                                "saturation.")
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
    handlers = {"optimize": _run_optimize, "rules": _run_rules, "compare": _run_compare, "models": _run_models,
                "profile": _run_profile, "cost-report": _run_cost_report}
    try:
        if args.command == "extract":
            return extraction_cli.run(args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return handlers[args.command](args)
    except (TensatError, RuleError, InputError) as exc:
        print(f"tensat: error: {one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tensat: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
