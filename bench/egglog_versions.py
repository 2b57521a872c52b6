"""Two egglog versions (or more) on the benchmark graphs: the same tensat code run under interpreters that differ in
the installed egglog, interleaved, with the new features of an egglog that has them tried as variants.

Each measurement is a fresh process (``--child``): it builds one benchmark graph, runs
``tensat.optimize_with_details(model, cost="analytic", latency_check=0, verify=False)`` and prints the times to
lower (register the rules and build the e-graph), explore and extract, the e-nodes, e-classes, iterations and stop
reason, and the extracted cost. The parent runs the (interpreter, variant) pairs one after the other for each graph,
the order reversed every other round, so slow spells of a shared machine fall on every version alike; it reports
medians and the ratio of each pair's median exploration time to the first pair's.

Variants (a variant an egglog does not support is skipped for it):

- ``default``: tensat as it is. egglog 13 runs rules on rayon's global pool (RAYON_NUM_THREADS, else one thread per
  CPU); egglog 14 on the e-graph's own pool, one thread unless told otherwise.
- ``threads=N``: N worker threads (egglog 14: ``bindings.EGraph(num_threads=N)``; egglog 13: RAYON_NUM_THREADS=N).
- ``no-decomp``: egglog 14 with its new query planner's tree decomposition off (``EGraph(no_decomp=True)``).
- ``native-backoff``: egglog 14's persistent back-off scheduler (a top-level ``let-scheduler``, match limit 1000,
  ban length 5, kept across runs) bans rules instead of tensat's Python ``Backoff``; tensat then cannot see the
  bans, so it may call the run saturated while egglog still holds a rule banned.

Run from the repository root, naming each interpreter (each with tensat installed editable from this checkout and
its own egglog)::

    python -m bench.egglog_versions --python eg13=PATH/TO/venv13/bin/python --python eg14=PATH/TO/venv14/bin/python \\
        --variants eg13:default,eg14:default,eg14:threads=2 --rounds 3 --out bench/results/egglog14.json

``--variants`` takes LABEL:VARIANT pairs (default: ``default`` for every interpreter). Writes the raw runs and the
medians as JSON and prints a markdown table per graph.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("bert", "resnext50", "nasnet_a", "nasrnn", "inception_v3", "squeezenet", "vgg19", "resnet50")
FIELDS = ("lower_s", "explore_s", "extract_s", "total_s", "enodes", "eclasses", "iterations", "cost_after")

# -- child: one measurement in a fresh process


def _patch_egraph(**kwargs: Any) -> None:
    """Make the pool create its egglog e-graphs with `kwargs` (egglog 14's num_threads, no_decomp)."""
    from tensat.egraph import pool  # in the child only: the parent process measures nothing

    original = pool.bindings.EGraph
    pool.bindings = types.SimpleNamespace(EGraph=lambda: original(**kwargs))  # type: ignore[assignment]


def _native_backoff() -> None:
    """Throttle with one persistent egglog back-off scheduler per e-graph instead of tensat's Backoff."""
    from tensat.egraph import lower, runner  # in the child only: the parent process measures nothing

    init = lower.LoweredGraph.__init__

    def lowered(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._scheduler = f"pb{id(self)}"
        self._run(f"(let-scheduler {self._scheduler} (back-off :match-limit {runner.MATCH_LIMIT} :ban-length 5))")

    def apply(self: Any, schedule: list[tuple[str, list[str], int | None]]) -> list[Any]:
        runs = [f"(run {rs})" if limit is None else f"(run-with {self._scheduler} {rs})" for rs, _, limit in schedule]
        return self._run(f"(run-schedule {' '.join(runs)} (saturate shapes))")

    lower.LoweredGraph.__init__ = lowered  # type: ignore[method-assign]
    runner.Exploration._apply = apply  # type: ignore[method-assign]
    runner.Backoff.record = lambda self, schedule, found, iteration: set()  # type: ignore[method-assign]


def supported(variant: str) -> bool:
    """Whether this process's egglog has what `variant` needs."""
    from egglog import bindings

    new = hasattr(bindings.EGraph, "set_num_threads")
    return variant == "default" or variant.startswith("threads=") or new


def child(model_name: str, variant: str) -> dict[str, Any]:
    from importlib import metadata

    from egglog import bindings

    if not supported(variant):
        return {"skipped": True}
    threads: str | int = os.environ.get("RAYON_NUM_THREADS", "rayon default")
    if hasattr(bindings.EGraph, "set_num_threads"):
        threads = int(variant.split("=")[1]) if variant.startswith("threads=") else 1
        _patch_egraph(num_threads=threads, no_decomp=variant == "no-decomp")
    if variant == "native-backoff":
        _native_backoff()

    import tensat  # after the variant's patches to egglog and the pool
    from tensat.models import build_model  # after the variant's patches, as tensat

    model = build_model(model_name)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        r = tensat.optimize_with_details(model, cost="analytic", latency_check=0, verify=False)
    ex = r.exploration
    return {
        "egglog": metadata.version("egglog"),
        "python": sys.version.split()[0],
        "threads": threads,
        "lower_s": r.times["lower"],
        "explore_s": r.times["explore"],
        "extract_s": r.times.get("extract", 0.0),
        "total_s": time.perf_counter() - t0,
        "enodes": ex.enodes,
        "eclasses": ex.eclasses,
        "iterations": len(ex.iterations),
        "stop_reason": ex.stop_reason,
        "cost_before": r.cost_before,
        "cost_after": r.cost_after,
        "this_checkout": Path(tensat.__file__).resolve().is_relative_to(ROOT),
    }


# -- parent: interleaved runs, medians, table


def run_child(python: str, model: str, variant: str) -> dict[str, Any]:
    env = dict(os.environ)
    if variant.startswith("threads="):
        env["RAYON_NUM_THREADS"] = variant.split("=")[1]
    cmd = [python, "-m", "bench.egglog_versions", "--child", model, variant]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict[str, Any]], pairs: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per graph and pair: the medians of the numeric fields, the stop reasons seen and the run count."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run in runs:
        if "error" in run["result"] or run["result"].get("skipped"):
            continue
        out.setdefault(run["model"], {}).setdefault(run["pair"], {"runs": []})["runs"].append(run["result"])
    for per_pair in out.values():
        for s in per_pair.values():
            rs = s.pop("runs")
            s.update({f: statistics.median(r[f] for r in rs) for f in FIELDS})
            s["stop_reason"] = "/".join(sorted({r["stop_reason"] for r in rs}))
            s["n"] = len(rs)
            s["egglog"] = rs[0]["egglog"]
            s["threads"] = rs[0]["threads"]
        base = per_pair.get(pairs[0])
        for s in per_pair.values():
            s["explore_ratio"] = s["explore_s"] / base["explore_s"] if base and base["explore_s"] else None
            s["lower_ratio"] = s["lower_s"] / base["lower_s"] if base and base["lower_s"] else None
    return out


def markdown(summary: dict[str, dict[str, dict[str, Any]]], pairs: list[str]) -> str:
    lines = []
    for model, per_pair in summary.items():
        lines += [
            f"### {model}",
            "",
            "| run | egglog | threads | n | lower s | explore s | explore ratio | extract s | e-nodes | e-classes "
            "| iterations | stopped by | cost after |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
        ]
        for pair in pairs:
            s = per_pair.get(pair)
            if s is None:
                continue
            ratio = "" if s["explore_ratio"] is None else f"{s['explore_ratio']:.2f}"
            lines.append(
                f"| {pair} | {s['egglog']} | {s['threads']} | {s['n']} | {s['lower_s']:.3f} | {s['explore_s']:.3f} "
                f"| {ratio} | {s['extract_s']:.3f} | {s['enodes']:.0f} | {s['eclasses']:.0f} | {s['iterations']:.0f} "
                f"| {s['stop_reason']} | {s['cost_after']:.4f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--child", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    p.add_argument("--python", action="append", default=[], metavar="LABEL=INTERPRETER", help="repeatable")
    p.add_argument("--variants", default="", help="LABEL:VARIANT,... (default: LABEL:default for each --python)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, help="JSON file for the raw runs and medians")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    pythons = dict(item.split("=", 1) for item in args.python)
    if not pythons:
        p.error("name at least one interpreter with --python LABEL=INTERPRETER")
    specs = [v.split(":", 1) for v in args.variants.split(",") if v] or [[label, "default"] for label in pythons]
    pairs = [f"{label}:{variant}" for label, variant in specs]
    runs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        for model in args.models.split(","):
            order = specs if rnd % 2 == 0 else specs[::-1]
            for label, variant in order:
                result = run_child(pythons[label], model, variant)
                runs.append({"round": rnd, "model": model, "pair": f"{label}:{variant}", "result": result})
                shown = result.get("error") or ("skipped" if result.get("skipped") else f"{result['explore_s']:.3f}")
                print(f"round {rnd} {model} {label}:{variant} explore {shown}", file=sys.stderr, flush=True)
    summary = summarize(runs, pairs)
    if args.out:
        args.out.write_text(json.dumps({"pairs": pairs, "runs": runs, "summary": summary}, indent=1) + "\n")
    print(markdown(summary, pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
