"""How long `tensat optimize` takes with default settings on every corpus model: two revisions of tensat, timed
interleaved on the same machine.

    python -m bench.optimize_time --before REV               # REV against HEAD -> results/optimize_time.md, .json
    python -m bench.optimize_time --before REV --only bert   # a subset
    python -m bench.optimize_time --render                   # rewrite the markdown from the JSON

Each revision's `tensat`, `rewrites` and `extraction` are taken from git (`git archive`) into a folder of their own
and run from it, with the environment's packages, so that both load the same way. For each model, each revision
optimizes it as a user runs it (`bench.real_report`'s runner): in a fresh process with an empty cost cache (first),
then again with the cache that run filled (warm). The two revisions take turns, model by model, and which goes first
alternates, so that a machine slowing down or speeding up falls on both alike.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.machine import header
from bench.real_report import _run_tensat, corpus_main

ROOT = Path(__file__).resolve().parents[1]
UNTIMED = "not timed end to end"
# runs the `tensat` package found in the folder given as the first argument, not the installed one
RUN_FROM = (
    "import runpy, sys; tree = sys.argv.pop(1); "
    "sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; sys.path.insert(0, tree); "
    "import tensat; assert tensat.__file__.startswith(tree), tensat.__file__; "
    "sys.argv[0] = 'tensat'; runpy.run_module('tensat', run_name='__main__')"
)
REVISIONS: dict[str, tuple[str, Path]] = {}  # "before"/"after" -> (commit, folder), set by `main`
_TURNS = itertools.count()  # models run so far: which revision goes first alternates


def checkout(revision: str, into: Path) -> Path:
    """The packages of `revision` laid out as installed (`tensat.rewrites`, `tensat.extraction` inside `tensat`)."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "tensat", "rewrites", "extraction"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    (into / "rewrites").rename(into / "tensat" / "rewrites")
    (into / "extraction").rename(into / "tensat" / "extraction")
    return into


def _outcome(run: dict[str, Any]) -> str:
    """What the run returned: the optimized model, or the input, timed end to end or not."""
    if not run.get("ok"):
        return f"failed: {run.get('error', '')}"
    why = run["stats"].get("returned_input")
    if why is None:
        return "optimized"
    return "input, untimed" if UNTIMED in why else "input, timed"


def run_model(name: str, src: Path, work: Path, seconds: float) -> dict[str, Any]:
    """One model's first and warm runs under both revisions, taking turns."""
    rec: dict[str, Any] = {"model": name}
    order = ["before", "after"] if next(_TURNS) % 2 == 0 else ["after", "before"]
    for run in ("first", "warm"):
        for side in order:
            revision, tree = REVISIONS[side]
            cache = work / f"{name}.{side}.cache"
            cache.mkdir(exist_ok=True)
            result = _run_tensat(
                src, work / f"{name}.{side}.{run}.onnx", cache, tensat=(sys.executable, "-c", RUN_FROM, str(tree))
            )
            rec.setdefault(side, {"revision": revision})
            rec[side][run] = result["seconds"]
            rec[side][f"{run}_outcome"] = _outcome(result)
    return rec


def summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians and totals of each revision, first and warm."""
    out: dict[str, Any] = {"models": len(records)}
    for side in ("before", "after"):
        for run in ("first", "warm"):
            times = [r[side][run] for r in records]
            out[f"{side}_{run}_total"] = sum(times)
            out[f"{side}_{run}_median"] = statistics.median(times) if times else None
        out[f"{side}_untimed"] = sum(r[side]["first_outcome"] == "input, untimed" for r in records)
    return out


def markdown(records: Sequence[dict[str, Any]], info: dict[str, Any]) -> str:
    """The report."""
    s = summary(records)
    before = records[0]["before"]["revision"] if records else "?"
    after = records[0]["after"]["revision"] if records else "?"
    lines = [
        "# Time of `tensat optimize` per corpus model, two revisions interleaved",
        "",
        header(info),
        "",
        f"Before: `{before}`; after: `{after}`. Default settings (`tensat optimize MODEL -o OUT`), each run in a "
        "fresh process: first with an empty cost cache, warm with the cache the first filled; the revisions take "
        "turns model by model. Outcome (of the first run): the optimized model, or the input returned, timed end "
        "to end or not (the cost model priced the candidate no lower than the input).",
        "",
        "| model | outcome before | outcome after | first before (s) | first after (s) | after / before "
        "| warm before (s) | warm after (s) | after / before |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        b, a = r["before"], r["after"]
        cells = [r["model"], b["first_outcome"], a["first_outcome"]]
        for run in ("first", "warm"):
            cells += [f"{b[run]:.1f}", f"{a[run]:.1f}", f"{a[run] / b[run]:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if records:
        ratios = {run: [r["after"][run] / r["before"][run] for r in records] for run in ("first", "warm")}
        lines += [
            "",
            f"Over {s['models']} models: first runs {s['before_first_total']:.0f} s before and "
            f"{s['after_first_total']:.0f} s after (median {s['before_first_median']:.1f} -> "
            f"{s['after_first_median']:.1f} s, median ratio {statistics.median(ratios['first']):.2f}); warm runs "
            f"{s['before_warm_total']:.0f} s before and {s['after_warm_total']:.0f} s after (median "
            f"{s['before_warm_median']:.1f} -> {s['after_warm_median']:.1f} s, median ratio "
            f"{statistics.median(ratios['warm']):.2f}). Input returned untimed: {s['before_untimed']} models before, "
            f"{s['after_untimed']} after.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--before", help="the revision timed against (git)")
    p.add_argument("--after", default="HEAD", help="the revision timed (git; default HEAD)")
    known, rest = p.parse_known_args(argv)
    rendering = "--render" in rest or "-h" in rest or "--help" in rest
    if not rendering and known.before is None:
        print("error: give --before REV, the revision to time against", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tensat-revisions-") as tmp:
        if not rendering:
            for side, revision in (("before", known.before), ("after", known.after)):
                commit = subprocess.run(
                    ["git", "-C", str(ROOT), "rev-parse", "--short", revision],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.strip()
                REVISIONS[side] = (commit, checkout(revision, Path(tmp) / side))
        return corpus_main(
            rest,
            prog="python -m bench.optimize_time",
            doc=__doc__ or "",
            stem="optimize_time",
            seconds=0.0,
            run=run_model,
            summarize=summary,
            render=markdown,
        )


if __name__ == "__main__":
    raise SystemExit(main())
