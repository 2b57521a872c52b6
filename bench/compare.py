"""Benchmark: TASO-style sequential search against tensat on the 8 benchmark graphs (issue 7).

    python -m bench.compare                 # all graphs -> bench/results/compare.md and compare.json (or --out-dir)
    python -m bench.compare --model bert    # one graph (printed; add --out-dir DIR or --json FILE to keep it)
    python -m bench.compare --render bench/results/compare.json   # re-render the markdown of a saved run

Same flags as `tensat compare`; the markdown and JSON also get the project's targets (issue 7), checked from the
comparison's results: on every graph tensat's cost is at most the sequential search's, and the geometric-mean
search-time ratio (sequential / tensat) is at least 48, the paper's figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from bench import RESULTS_DIR
from tensat import compare_cli
from tensat.compare import Row, Settings, markdown, report
from tensat.errors import TensatError

TIME_RATIO_TARGET = 48.0  # Tensat's Table 1: geometric mean of sequential / tensat search time


def targets(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The targets of issue 7, checked against a comparison's JSON document (`tensat.compare.report`)."""
    s = doc["summary"]
    ratio = s["geomean_time_ratio"]
    return {
        "time_ratio_target": TIME_RATIO_TARGET,
        "cost_target_met": bool(s["tensat_at_most_sequential_everywhere"]),
        "time_ratio_target_met": ratio is not None and ratio >= TIME_RATIO_TARGET,
    }


def target_lines(doc: Mapping[str, Any]) -> list[str]:
    """The markdown section stating whether each target is met, and by how much it is missed."""
    s, t = doc["summary"], targets(doc)
    if t["cost_target_met"]:
        cost = f"met ({s['graphs']} of {s['graphs']})"
    else:
        cost = f"missed on {len(s['worse_on'])} of {s['graphs']} ({', '.join(s['worse_on'])})"
    ratio = s["geomean_time_ratio"]
    if ratio is None:
        time = "not measured"
    else:
        shown = f"{ratio:.1f}" if ratio >= 10 else f"{ratio:.2f}"
        time = (
            f"met ({shown})" if t["time_ratio_target_met"] else f"missed by {TIME_RATIO_TARGET / ratio:.1f}x ({shown})"
        )
    return [
        "Targets (issue 7):",
        "",
        f"- tensat cost <= sequential cost on every graph: {cost}.",
        f"- geometric-mean search-time ratio >= {TIME_RATIO_TARGET:g}: {time}.",
        "",
    ]


def with_targets(doc: Mapping[str, Any], text: str) -> tuple[dict[str, Any], str]:
    """The comparison's JSON document and markdown with the targets added."""
    return dict(doc, targets=targets(doc)), text.rstrip("\n") + "\n\n" + "\n".join(target_lines(doc))


def render(path: str) -> str:
    """The markdown report of a saved comparison JSON, with the targets."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    settings = Settings(**{k: v for k, v in doc["settings"].items() if k in Settings.__dataclass_fields__})
    rows = [Row.from_dict(r) for r in doc["rows"]]
    fresh = report(rows, settings, doc["machine"])  # the summary as the current code computes it
    return with_targets(fresh, markdown(rows, settings, doc["machine"]))[1]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; with no model given, on every benchmark graph."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    compare_cli.add_arguments(parser, require_source=False)
    parser.add_argument(
        "--render", metavar="JSON", help="only re-render the markdown report of a saved compare.json (printed)"
    )
    args = parser.parse_args(argv)
    if args.render:
        try:
            text = render(args.render)
        except OSError as exc:
            return _error(parser, f"cannot read {args.render}: {exc.strerror or exc}")
        except (ValueError, KeyError, TypeError) as exc:
            return _error(parser, f"{args.render}: not a saved comparison ({type(exc).__name__}: {exc})")
        print(text, end="")
        return 0
    if args.input is None and not args.model:
        args.all = True
    if args.all and args.out_dir is None:
        args.out_dir = str(RESULTS_DIR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            rows, doc, text = compare_cli.compare(args)
            doc, text = with_targets(doc, text)
            return compare_cli.finish(args, rows, doc, text)
    except TensatError as exc:
        return _error(parser, str(exc))


def _error(parser: argparse.ArgumentParser, message: str) -> int:
    print(f"{parser.prog}: error: {' '.join(message.split())}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
