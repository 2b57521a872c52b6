"""``tensat extract`` / ``python -m extraction``: extract a minimum-cost term from an e-graph JSON file."""

from __future__ import annotations

import argparse
import sys

from .api import extract
from .cycles import filter_cycles
from .egraph import load_egraph
from .ilp import GAP_TOLERANCE


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``extract`` command's arguments on ``parser``."""
    parser.add_argument("egraph", metavar="EGRAPH.json", help="e-graph in egraph-serialize JSON format")
    parser.add_argument("--extractor", choices=("ilp", "greedy"), default="ilp",
                        help="ilp: optimal DAG cost (default); greedy: fast faster-greedy-dag")
    parser.add_argument("--solver", choices=("highs", "cbc"), default="highs", help="ILP solver (default highs)")
    parser.add_argument("--time-limit", type=_positive, default=60.0, metavar="S",
                        help="overall ILP time limit in seconds (default 60)")
    parser.add_argument("--gap-tolerance", type=_non_negative, default=GAP_TOLERANCE, metavar="REL",
                        help=f"stop once the cost is proven within this relative gap (default {GAP_TOLERANCE:g}); "
                             "status optimal means optimal within it")
    parser.add_argument("--stall-seconds", type=_positive, default=None, metavar="S",
                        help="stop when no cheaper selection has been found for S seconds (default: no window)")
    parser.add_argument("--forbid", action="append", default=[], metavar="NODE_ID",
                        help="e-node id that must not be chosen (repeatable)")
    parser.add_argument("--filter-cycles", action="store_true",
                        help="first blacklist one e-node per cycle (Tensat's efficient filtering), so the ILP "
                             "needs no cycle cuts; the optimum is then over the filtered e-graph")


def run(args: argparse.Namespace) -> int:
    """Run the command; prints cost, status, bound and time. Returns 0, or 2 on bad input."""
    try:
        eg = load_egraph(args.egraph)
    except OSError as e:
        print(f"error: cannot read {args.egraph}: {e.strerror or e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {args.egraph}: {_one_line(e)}", file=sys.stderr)
        return 2
    forbidden = set(args.forbid)
    if args.filter_cycles:
        blacklist = filter_cycles(eg, (), forbidden)
        print(f"filter   {len(blacklist)} e-nodes blacklisted to break cycles")
        forbidden |= blacklist
    kw: dict[str, object] = {"forbidden": frozenset(forbidden)}
    if args.extractor == "ilp":
        kw.update(solver=args.solver, time_limit=args.time_limit, gap_tolerance=args.gap_tolerance,
                  stall_seconds=args.stall_seconds)
    try:
        res = extract(eg, args.extractor, **kw)
    except ValueError as e:
        print(f"error: {args.egraph}: {_one_line(e)}", file=sys.stderr)
        return 2
    bound = "-" if res.bound is None else f"{res.bound:.6g}"
    gap = res.gap()
    method = f"ilp ({args.solver})" if res.method == "ilp" else res.method
    print(f"e-graph  {len(eg.nodes)} nodes, {len(eg.classes)} classes")
    print(f"method   {method}")
    print(f"cost     {res.cost:.6g}")
    print(f"status   {res.status}")
    print(f"bound    {bound}" + ("" if gap is None else f"  (gap {100 * gap:.3g}%)"))
    print(f"time     {res.seconds:.2f} s" + (f"  (stop: {res.info['stop']})" if "stop" in res.info else ""))
    return 0


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m extraction``."""
    parser = argparse.ArgumentParser(prog="python -m extraction", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
