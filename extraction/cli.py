"""``tensat extract`` / ``python -m tensat.extraction``: extract a minimum-cost term from an e-graph JSON file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from .api import extract
from .cycles import filter_cycles
from .egraph import InputError, load_egraph, one_line
from .ilp import GAP_TOLERANCE

DESCRIPTION = "Extract a minimum-cost acyclic term from an e-graph in the egraph-serialize JSON format."
EPILOG = (
    "Output: the result (e-graph size, method, cost, status, bound and time) is printed to stdout; nothing is "
    "written to files. Errors go to stderr."
)


def _number(minimum: float, *, inclusive: bool) -> Callable[[str], float]:
    """An argparse type: a float > minimum (>= with ``inclusive``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (value >= minimum if inclusive else value > minimum):
            raise argparse.ArgumentTypeError(f"must be {'>=' if inclusive else '>'} {minimum:g}: {text!r}")
        return value

    return parse


_positive = _number(0, inclusive=False)
_non_negative = _number(0, inclusive=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``extract`` command's arguments on ``parser`` (and, where it has none, the epilog saying where
    the output goes)."""
    if parser.epilog is None:
        parser.epilog = EPILOG
    parser.add_argument("egraph", metavar="EGRAPH.json", help="e-graph in egraph-serialize JSON format")
    parser.add_argument(
        "--extractor",
        choices=("ilp", "greedy"),
        default="ilp",
        help="ilp: optimal DAG cost (default); greedy: fast faster-greedy-dag",
    )
    parser.add_argument("--solver", choices=("highs", "cbc"), default="highs", help="ILP solver (default highs)")
    parser.add_argument(
        "--time-limit", type=_positive, default=60.0, metavar="S", help="overall ILP time limit in seconds (default 60)"
    )
    parser.add_argument(
        "--gap-tolerance",
        type=_non_negative,
        default=GAP_TOLERANCE,
        metavar="REL",
        help=f"stop once the cost is proven within this relative gap (default {GAP_TOLERANCE:g}); "
        "status optimal means optimal within it",
    )
    parser.add_argument(
        "--stall-seconds",
        type=_positive,
        default=None,
        metavar="S",
        help="stop when no cheaper selection has been found for S seconds (default: no window)",
    )
    parser.add_argument(
        "--forbid",
        action="append",
        default=[],
        metavar="NODE_ID",
        help="e-node id that must not be chosen (repeatable)",
    )
    parser.add_argument(
        "--filter-cycles",
        action="store_true",
        help="first blacklist one e-node per cycle (Tensat's efficient filtering), so the ILP "
        "needs no cycle cuts; the optimum is then over the filtered e-graph",
    )


def run(args: argparse.Namespace) -> int:
    """Run the command: print e-graph size, method, cost, status, bound and time to stdout; return 0.

    Raises InputError (one line, naming the file) when the file cannot be read or holds no valid e-graph."""
    try:
        eg = load_egraph(args.egraph)
    except OSError as e:
        raise InputError(f"cannot read {args.egraph}: {e.strerror or e}") from None
    except ValueError as e:
        raise InputError(f"{args.egraph}: {one_line(e, limit=None)}") from None
    forbidden = set(args.forbid)
    try:
        if args.filter_cycles:
            blacklist = filter_cycles(eg, (), forbidden)
            print(f"filter   {len(blacklist)} e-nodes blacklisted to break cycles")
            forbidden |= blacklist
        kw: dict[str, object] = {"forbidden": frozenset(forbidden)}
        if args.extractor == "ilp":
            kw.update(
                solver=args.solver,
                time_limit=args.time_limit,
                gap_tolerance=args.gap_tolerance,
                stall_seconds=args.stall_seconds,
            )
        res = extract(eg, args.extractor, **kw)
    except ValueError as e:
        raise InputError(f"{args.egraph}: {one_line(e, limit=None)}") from None
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


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tensat.extraction``: 0 on success, 1 on bad input (one line on stderr), 2 on bad
    usage."""
    parser = argparse.ArgumentParser(prog="python -m tensat.extraction", description=DESCRIPTION, epilog=EPILOG)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except InputError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 1
