"""Benchmark: TASO-style sequential search against tensat on the 8 benchmark graphs (issue 7).

    python -m bench.compare                 # all graphs -> bench/results/compare.md and compare.json
    python -m bench.compare --model bert    # one graph (printed; add --out-dir DIR or --json FILE to keep it)
    python -m bench.compare --render bench/results/compare.json   # re-render the markdown of a saved run

Same flags as `tensat compare`. Targets: on every graph tensat's cost is at most the sequential search's, and the
geometric-mean search-time ratio (sequential / tensat) is at least 48, the paper's figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Sequence

from tensat import compare_cli
from tensat.errors import TensatError


def render(path: str) -> str:
    """The markdown report of a saved comparison JSON."""
    from tensat.compare import Row, Settings, markdown

    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    settings = Settings(**{k: v for k, v in doc["settings"].items() if k in Settings.__dataclass_fields__})
    return markdown([Row.from_dict(r) for r in doc["rows"]], settings, doc["machine"])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; with no model given, on every benchmark graph."""
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    compare_cli.add_arguments(parser, require_source=False)
    parser.add_argument("--render", metavar="JSON",
                        help="only re-render the markdown report of a saved compare.json (printed)")
    args = parser.parse_args(argv)
    if args.render:
        print(render(args.render), end="")
        return 0
    if args.input is None and not args.model:
        args.all = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return compare_cli.run(args)
    except TensatError as exc:
        print(f"compare: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
