"""`tensat compare`: what equality saturation buys over sequential search, on your model or the benchmarks."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tensat.compare import Settings, compare_model, machine_info, markdown, report
from tensat.errors import TensatError
from tensat.files import atomic_write_text
from tensat.models import build_model, model_names
from tensat.options import COSTS, DEVICES, add_option_flags, options_from_args, positive_float, positive_int
from tensat.progress import wanted as progress_wanted

TENSAT_OPTIONS = (
    "node_limit",
    "iter_limit",
    "time_limit",
    "k_multi",
    "guided_rounds",
    "extractor",
    "solver",
    "ilp_time_limit",
)  # the options of tensat's search the comparison takes from flags


def add_arguments(parser: argparse.ArgumentParser, require_source: bool = True) -> None:
    """Flags of `tensat compare` (`require_source=False`: a model file, --model and --all may all be left out)."""
    src = parser.add_mutually_exclusive_group(required=require_source)
    src.add_argument("input", nargs="?", help="the ONNX model to compare on")
    src.add_argument(
        "--model",
        metavar="NAME",
        action="append",
        help="a built-in benchmark graph instead of a file (repeat for several; see `tensat models`)",
    )
    src.add_argument(
        "--all",
        action="store_true",
        help="every built-in benchmark graph (the table is printed; --out-dir DIR also writes "
        "compare.md and compare.json)",
    )
    add_option_flags(parser, ["input_shapes"])
    seq = parser.add_argument_group("sequential search")
    seq.add_argument(
        "--alpha",
        type=positive_float,
        default=1.05,
        help="keep candidates cheaper than alpha times the best cost (default 1.05)",
    )
    seq.add_argument("--budget", type=int, default=100, help="maximum expansions (default 100)")
    seq.add_argument(
        "--seq-time-limit",
        type=positive_float,
        default=None,
        help="also stop the sequential search after this many seconds (default: no limit)",
    )
    ts = parser.add_argument_group("tensat", "left out, tensat's own default applies")
    add_option_flags(ts, TENSAT_OPTIONS, unset=True)
    both = parser.add_argument_group("both")
    both.add_argument(
        "--cost", choices=COSTS, default="analytic", help="cost model for both searches (default analytic)"
    )
    both.add_argument(
        "--device", choices=DEVICES, default="auto", help="device whose latency the measured cost model uses"
    )
    both.add_argument("--seed", type=int, default=0, help="seed of the verification and timing inputs (default 0)")
    out = parser.add_argument_group("output")
    out.add_argument("--no-latency", action="store_true", help="skip timing the three graphs in onnxruntime")
    out.add_argument(
        "--latency-runs", type=positive_int, default=30, help="timed runs per model, interleaved (default 30)"
    )
    out.add_argument(
        "--latency-seconds",
        type=positive_float,
        default=60.0,
        help="stop timing a model set after this many seconds, with at least 5 runs (default 60)",
    )
    out.add_argument("--json", metavar="FILE", help="also write the comparison as JSON to FILE")
    out.add_argument(
        "--out-dir",
        metavar="DIR",
        default=None,
        help="also write compare.md and compare.json to DIR (default: no files, the table is printed)",
    )
    chatty = out.add_mutually_exclusive_group()
    chatty.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    chatty.add_argument(
        "--progress",
        action="store_true",
        help="progress messages on stderr even when it is not a terminal (on a terminal they always are)",
    )


def _settings(args: argparse.Namespace) -> Any:
    if args.budget < 0:
        raise TensatError(f"--budget must be >= 0, got {args.budget}")
    tensat_opts = options_from_args(args, TENSAT_OPTIONS)
    return Settings(
        cost=args.cost,
        device=args.device,
        alpha=args.alpha,
        budget=args.budget,
        seq_time_limit=args.seq_time_limit,
        tensat=tensat_opts,
        latency=not args.no_latency,
        latency_runs=args.latency_runs,
        latency_seconds=args.latency_seconds,
        seed=args.seed,
        input_shapes=args.input_shapes,
    )


def _progress(args: argparse.Namespace) -> Any:
    """Progress lines on stderr: on a terminal unless --quiet; elsewhere only with --progress."""
    if not progress_wanted(args.quiet, args.progress):
        return None

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    return say


def _write(path: Path | str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)


def compare(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any], str]:
    """Compare on the chosen model(s): the rows, the JSON document (`tensat.compare.report`) and the markdown."""
    settings = _settings(args)
    progress = _progress(args)
    if args.all or args.model:
        names = model_names() if args.all else args.model
        unknown = [n for n in names if n not in model_names()]
        if unknown:
            raise TensatError(f"unknown model {unknown[0]!r}; valid names: {', '.join(model_names())}")
        sources: list[tuple[str, Any]] = [(n, None) for n in names]
    else:
        sources = [(Path(args.input).stem, args.input)]
    rows = []
    for name, source in sources:
        if source is None:
            source = build_model(name)
        rows.append(compare_model(source, name, settings, progress))
    machine = machine_info()
    return rows, report(rows, settings, machine), markdown(rows, settings, machine)


def finish(args: argparse.Namespace, rows: list[Any], doc: dict[str, Any], text: str) -> int:
    """Write the files asked for, print the markdown; 0 when every optimized graph verified, else 1."""
    progress = _progress(args)
    if args.out_dir:
        out_dir = Path(args.out_dir)
        _write(out_dir / "compare.md", text)
        _write(out_dir / "compare.json", json.dumps(doc, indent=2, sort_keys=True) + "\n")
        if progress:
            progress(f"wrote {out_dir / 'compare.md'} and {out_dir / 'compare.json'}")
    if args.json:
        _write(args.json, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(text)
    return 0 if all(r.verified for r in rows) else 1


def run(args: argparse.Namespace) -> int:
    """Compare on the chosen model(s), write the files asked for and print the table; 0 when every optimized graph
    verified, else 1."""
    return finish(args, *compare(args))
