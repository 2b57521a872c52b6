"""`tensat profile` (fill the measured-cost cache for a model) and `tensat cost-report` (summed cost beside
end-to-end latency), as argparse builders and runners that `tensat.cli` wires in."""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from tensat.api import optimize_with_details
from tensat.cost import graph_cost
from tensat.cost_report import cost_report, fused_graph_cost, load_graph
from tensat.egraph import TensorEGraph
from tensat.errors import TensatError
from tensat.files import atomic_write_json
from tensat.measure import make_measured_cost
from tensat.models import build_model
from tensat.options import DEVICES, add_option_flags, positive_float, positive_int


def _add_common(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("input", nargs="?", help="an ONNX model file")
    src.add_argument(
        "--model", metavar="NAME", help="a built-in benchmark graph instead of a file (see `tensat models`)"
    )
    add_option_flags(p, ["input_shapes"])
    p.add_argument(
        "--device",
        choices=DEVICES,
        default="auto",
        help="where to measure: auto = CUDA where it loads, else CPU (default auto)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="intra-op threads of measuring sessions (default $TENSAT_MEASURE_THREADS or 1)",
    )
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=None,
        help="directory of the cost cache (default $TENSAT_CACHE_DIR or the user cache directory)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_search(p: argparse.ArgumentParser) -> None:
    """The exploration's flags, as for `tensat optimize`."""
    add_option_flags(p, ("node_limit", "iter_limit", "time_limit", "k_multi"))


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `tensat profile`."""
    parser.description = (
        "Measure and cache the cost of every operator a `tensat optimize --cost measured` run of "
        "the model will price: the graph's own nodes, the fused groups onnxruntime runs, and every "
        "e-node the exploration creates."
    )
    _add_common(parser)
    _add_search(parser)
    parser.add_argument(
        "--no-explore",
        action="store_true",
        help="only the graph's own nodes and fused groups, not the e-graph's alternatives",
    )
    parser.add_argument("--json", metavar="FILE", help="write a JSON summary to FILE")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")


def add_cost_report_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `tensat cost-report`."""
    parser.description = (
        "Print the summed measured cost of a model's graph beside its measured end-to-end latency "
        "in onnxruntime, for the original graph and the tensat-optimized one."
    )
    _add_common(parser)
    _add_search(parser)
    opt = parser.add_mutually_exclusive_group()
    opt.add_argument("--optimized", metavar="FILE", help="compare with this optimized model instead of optimizing")
    opt.add_argument("--no-optimize", action="store_true", help="report on the original graph only")
    add_option_flags(parser, ["ilp_time_limit"])
    parser.add_argument(
        "--runs", type=positive_int, default=60, help="at least this many timed end-to-end runs per graph (default 60)"
    )
    parser.add_argument(
        "--cached",
        action="store_true",
        help="sum the cached costs instead of measuring every fused group again between the "
        "end-to-end runs (quicker, but on a shared machine load moves between the two)",
    )
    parser.add_argument(
        "--windows",
        type=positive_int,
        default=3,
        help="timing windows per fused group when measuring afresh (default 3)",
    )
    parser.add_argument(
        "--block",
        type=positive_int,
        default=10,
        help="consecutive runs of one graph per turn when timing graphs interleaved (default 10)",
    )
    parser.add_argument(
        "--max-seconds",
        type=positive_float,
        default=60.0,
        help="wall-time cap of the end-to-end runs timed after the costs (default 60)",
    )
    parser.add_argument(
        "--sessions",
        type=positive_int,
        default=1,
        help="sessions of each graph timed in turns (default 1): sessions of one model run at speeds that differ "
        "with where their memory lies",
    )
    parser.add_argument("--details", action="store_true", help="also print the cost by op (fused group) kind")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON to FILE")


@contextlib.contextmanager
def _environment(args: argparse.Namespace) -> Iterator[None]:
    """Point `TENSAT_CACHE_DIR` / `TENSAT_MEASURE_THREADS` at the flags while the command runs (so the cost model
    `tensat.optimize` builds uses the same cache and settings), restoring them afterwards."""
    changes = {}
    if args.cache_dir:
        changes["TENSAT_CACHE_DIR"] = os.path.abspath(os.path.expanduser(args.cache_dir))
    if args.threads:
        changes["TENSAT_MEASURE_THREADS"] = str(args.threads)
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _source(args: argparse.Namespace) -> tuple[Any, str]:
    if getattr(args, "input", None) and getattr(args, "model", None):
        raise TensatError("give either a model file or --model, not both")
    if args.model:
        try:
            return build_model(args.model), args.model
        except ValueError as exc:
            raise TensatError(str(exc)) from None
    return args.input, os.path.basename(str(args.input))


def _graph(args: argparse.Namespace) -> tuple[Any, str]:
    source, name = _source(args)
    return load_graph(source, args.input_shapes), name


def _cost_model(args: argparse.Namespace) -> Any:
    return make_measured_cost(args.device, progress=not args.no_progress)


def run_profile(args: argparse.Namespace) -> int:
    """Fill the cost cache for one model; prints what was measured and what was already cached."""
    with _environment(args):
        start = time.perf_counter()
        graph, name = _graph(args)
        cost = _cost_model(args)
        cost.observe_graph(graph)
        graph_cost(graph, cost)
        fused_graph_cost(graph, cost)
        enodes = 0
        if not args.no_explore:
            te = TensorEGraph(graph)
            stats = te.explore(
                node_limit=args.node_limit, iter_limit=args.iter_limit, time_limit=args.time_limit, k_multi=args.k_multi
            )
            enodes = stats.enodes
            te.export(cost)
        seconds = time.perf_counter() - start
        s = cost.stats
        summary = {
            "model": name,
            "enodes": enodes,
            "seconds": round(seconds, 3),
            **cost.describe(),
            "cached_total": cost.cache.count(cost.fingerprint),
        }
        if args.json:
            atomic_write_json(args.json, summary)
        if not args.quiet:
            print(f"profiled  {name} on {cost.info['device']} ({cost.info['provider']}, {cost.threads} thread(s))")
            print(
                f"costs     {s.measured} measured now, {s.cached} already cached"
                + (f", {enodes} e-nodes explored" if enodes else "")
            )
            if s.analytic or s.failed:
                print(
                    f"analytic  {s.analytic + s.failed} priced by the analytic estimate "
                    f"({s.analytic} opaque, {s.failed} onnxruntime could not run)"
                )
            print(f"cache     {cost.cache.path} ({summary['cached_total']} costs for this device)")
            print(f"time      {seconds:.1f}s")
        return 0


def run_cost_report(args: argparse.Namespace) -> int:
    """Print (and optionally save) the accuracy report for one model."""
    with _environment(args):
        graph, name = _graph(args)
        cost = _cost_model(args)
        cost.observe_graph(graph)
        optimized = None
        if args.optimized:
            optimized = load_graph(args.optimized, args.input_shapes)
        elif not args.no_optimize:
            result = optimize_with_details(
                graph,
                cost="measured",
                device=cost.device,
                node_limit=args.node_limit,
                iter_limit=args.iter_limit,
                time_limit=args.time_limit,
                k_multi=args.k_multi,
                ilp_time_limit=args.ilp_time_limit,
            )
            optimized = result.graph
        report = cost_report(
            graph,
            cost,
            optimized=optimized,
            name=name,
            runs=args.runs,
            block=args.block,
            max_seconds=args.max_seconds,
            fresh=not args.cached,
            windows=args.windows,
            sessions=args.sessions,
        )
        print(report.format())
        if args.details:
            for row in report.rows:
                print(f"\n{row.graph}: cost by op")
                for label, ms in row.by_label.items():
                    print(f"  {label:<28} {ms:10.4f} ms")
        if args.json:
            atomic_write_json(args.json, report.to_dict())
        return 0
