"""Benchmark the extractors on the extraction-gym Tensat e-graphs (BERT, ResNet-50, VGG).

For each graph: e-graph size, greedy DAG cost and time, ILP cost, time, status and proven bound per
solver, against the published references (SmoothE artifact: CPLEX 900 s, faster-greedy-dag).
Writes bench/results/extraction_gym.md and .json. Run: ``PYTHONPATH=. python bench/extraction_gym.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.machine import header, machine_info
from tensat.extraction import filter_cycles, greedy_dag, ilp_extract, load_egraph, validate

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "extraction-gym-tensat"  # the shared data folder beside the checkout
OUT = Path(__file__).resolve().parent / "results"
GRAPHS = ["bert", "bert_acyclic", "resnet50", "resnet50_acyclic", "vgg", "vgg_acyclic"]
# Published DAG costs of acyclic extractions (data README: SmoothE artifact, ASPLOS 2025).
REFERENCE = {
    "bert": {"cplex": 0.705, "greedy": 0.825, "cbc_900s": 4.139},
    "resnet50": {"cplex": 4.386, "greedy": 4.397, "cbc_900s": None},
    "vgg": {"cplex": 4.851, "greedy": 4.851, "cbc_900s": None},
}
# Issue targets: (time limit in s, check on the ILP cost).
TIME_LIMIT = {"bert": 60.0, "bert_acyclic": 60.0}
DEFAULT_LIMIT = 10.0
REPEATS = 3  # HiGHS runs per graph (the run of median time is reported); CBC runs to its limit, once


def _median_run(runs: list[tuple[Any, float]]) -> tuple[Any, float, list[float]]:
    """Of (result, seconds) runs, the one of median time, its seconds, and every run's seconds."""
    ordered = sorted(runs, key=lambda r: r[1])
    res, seconds = ordered[(len(ordered) - 1) // 2]
    return res, seconds, [round(s, 3) for _, s in runs]


def target(name: str, cost: float, seconds: float, greedy_cost: float) -> str | None:
    """The issue's target for this graph, as "met"/"missed" (None when it sets none)."""
    ref = REFERENCE.get(name)
    if ref is None:
        return None
    if name == "bert":  # strictly below greedy: the published 0.825 and our own greedy run
        return "met" if cost < min(ref["greedy"], greedy_cost) - 1e-9 and seconds <= 60.0 else "missed"
    return "met" if cost <= ref["cplex"] * 1.01 and seconds <= 10.0 else "missed"


def _stops(res: Any) -> dict[str, Any]:
    """Why the ILP stopped and when its returned selection first appeared (seconds into the run)."""
    return {
        "stop": res.info.get("stop"),
        "incumbent_seconds": res.info.get("incumbent_seconds"),
        "gap_tolerance": res.info.get("gap_tolerance"),
        "stall_seconds": res.info.get("stall_seconds"),
    }


def run_graph(
    name: str, data: Path, solvers: list[str], limit: float | None, stall: float | None = None, repeats: int = REPEATS
) -> dict[str, Any]:
    """Greedy and ILP (per solver) on one graph, every result validated."""
    t0 = time.perf_counter()
    eg = load_egraph(data / f"{name}.json")
    load_s = time.perf_counter() - t0
    eg.index  # noqa: B018 (build the shared index outside the timed runs, as a caller would)
    rec: dict[str, Any] = {
        "graph": name,
        "nodes": len(eg.nodes),
        "classes": len(eg.classes),
        "load_seconds": round(load_s, 3),
        "reference": REFERENCE.get(name),
    }
    greedy = greedy_dag(eg)
    validate(eg, greedy)
    rec["greedy"] = {"cost": greedy.cost, "seconds": round(greedy.seconds, 3)}
    rec["ilp"] = {}
    for solver in solvers:
        tl = limit if limit is not None else TIME_LIMIT.get(name, DEFAULT_LIMIT)
        runs = []
        for _ in range(repeats if solver == "highs" else 1):
            run = ilp_extract(eg, solver=solver, time_limit=tl, stall_seconds=stall)
            validate(eg, run)
            runs.append((run, run.seconds))
        res, seconds, all_seconds = _median_run(runs)
        info = res.info
        rec["ilp"][solver] = {
            "cost": res.cost,
            "bound": res.bound,
            "gap": res.gap(),
            "status": res.status,
            "seconds": round(seconds, 3),
            "seconds_runs": all_seconds,
            "time_limit": tl,
            "iterations": info.get("iterations"),
            "cuts": info.get("cuts"),
            "pruned_nodes": info["prune"]["alive_nodes"],
            "pruned_classes": info["prune"]["alive_classes"],
            "prune": info["prune"],
            "target": target(name, res.cost, seconds, greedy.cost),
            **_stops(res),
        }
        print(
            f"{name:17s} {solver:5s} greedy {greedy.cost:.6f} ({greedy.seconds:.2f}s)  ilp {res.cost:.6f} "
            f"{res.status:8s} bound {res.bound:.6f} ({seconds:.2f}s, stop {res.info['stop']}, "
            f"incumbent at {res.info['incumbent_seconds']:.2f}s)",
            file=sys.stderr,
        )
    tl = limit if limit is not None else TIME_LIMIT.get(name, DEFAULT_LIMIT)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        blacklist = filter_cycles(eg)
        filter_s = time.perf_counter() - t0
        run = ilp_extract(eg, solver="highs", time_limit=tl, forbidden=frozenset(blacklist), stall_seconds=stall)
        validate(eg, run)
        runs.append(((run, filter_s), filter_s + run.seconds))
    (res, filter_s), seconds, all_seconds = _median_run(runs)
    rec["ilp"]["highs + cycle filter"] = {
        "cost": res.cost,
        "bound": res.bound,
        "gap": res.gap(),
        "status": res.status,
        "seconds": round(seconds, 3),
        "seconds_runs": all_seconds,
        "time_limit": tl,
        "iterations": res.info.get("iterations"),
        "cuts": res.info.get("cuts"),
        "pruned_nodes": res.info["prune"]["alive_nodes"],
        "pruned_classes": res.info["prune"]["alive_classes"],
        "prune": res.info["prune"],
        "blacklisted": len(blacklist),
        "filter_seconds": round(filter_s, 4),
        "target": target(name, res.cost, seconds, greedy.cost),
        **_stops(res),
    }
    print(
        f"{name:17s} highs + cycle filter ({len(blacklist)} blacklisted in {filter_s:.3f}s) ilp {res.cost:.6f} "
        f"{res.status:8s} ({seconds:.2f}s)",
        file=sys.stderr,
    )
    return rec


def _f(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _range(runs: list[float] | None) -> str:
    """Fastest-slowest of several runs' seconds ("-" for a single run)."""
    return "-" if not runs or len(runs) < 2 else f"{min(runs):.2f}-{max(runs):.2f}"


def markdown(records: list[dict[str, Any]], mach: dict[str, Any], repeats: int = REPEATS) -> str:
    """The report table and notes."""
    lines = [
        "# Extraction on the extraction-gym Tensat e-graphs",
        "",
        header(mach),
        "",
        "DAG cost of a valid acyclic extraction (every result checked by `extraction.validate`). "
        "Time limit: 60 s for bert, 10 s for the others; times include the greedy warm start, pruning "
        f"and model building. HiGHS rows are the run of median time of {repeats} (`ILP s range`: fastest and "
        "slowest; every run's time is in the JSON), CBC rows one run. `bound` is the best proven lower bound; "
        "status `optimal` means proven "
        "within the gap tolerance (relative gap <= 1e-4 by default: below the cost model's resolution), "
        "`fallback` means the greedy selection was kept (the ILP found nothing cheaper in time). `stop` is "
        "the rule that ended the run (`gap`: bound within the tolerance, `stall`: no better selection "
        "within the stall window, `time`: the time limit); `inc. s` is when the returned selection first "
        "appeared, so `ILP s` minus `inc. s` is what the run spent without improving it. "
        "References: published CPLEX (900 s) and faster-greedy-dag DAG costs. "
        "`highs + cycle filter` first blacklists one e-node per cycle (`extraction.filter_cycles`, Tensat's "
        "efficient filtering; its time is included), so the ILP needs no cycle cuts; its optimum is over the "
        "filtered e-graph, hence `bound` is a bound for that space only.",
        "",
        "| graph | e-nodes | e-classes | greedy cost | greedy s | solver | ILP cost | status | bound | ILP s "
        "| ILP s range | stop | inc. s | pruned nodes | cuts | CPLEX ref | greedy ref | target |",
        "|---|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in records:
        ref = r["reference"] or {}
        for solver, i in r["ilp"].items():
            lines.append(
                f"| {r['graph']} | {r['nodes']} | {r['classes']} | {_f(r['greedy']['cost'])} "
                f"| {r['greedy']['seconds']:.2f} | {solver} | {_f(i['cost'])} | {i['status']} | {_f(i['bound'])} "
                f"| {i['seconds']:.2f} | {_range(i.get('seconds_runs'))} | {i.get('stop') or '-'} "
                f"| {_f(i.get('incumbent_seconds'), 2)} "
                f"| {i['pruned_nodes']} | {i['cuts']} | {_f(ref.get('cplex'), 3)} "
                f"| {_f(ref.get('greedy'), 3)} | {i['target'] or '-'} |"
            )
    notes = []
    for r in records:
        for solver, i in r["ilp"].items():
            if i["status"] != "fallback":
                continue
            why = (
                f"every relaxation solved in time still chose a cyclic selection ({i['cuts']} lazy cuts added)"
                if i["cuts"]
                else "the solver found no selection cheaper than greedy in time"
            )
            if i.get("stop") == "stall":
                why += f" (stopped by the {i['stall_seconds']:g} s stall window)"
            notes.append(f"- {r['graph']} ({solver}): fallback to greedy: {why}; bound = best bound proven.")
    stalls = sorted({i["stall_seconds"] for r in records for i in r["ilp"].values() if i.get("stall_seconds")})
    lines += ["", "Stall window: " + (", ".join(f"{x:g} s" for x in stalls) if stalls else "none") + "."]
    if notes:
        lines += ["", *notes]
    lines += [
        "",
        "Targets (issue 5): resnet50 and vgg within 1% of the CPLEX cost in at most 10 s; bert strictly "
        "below greedy's 0.825 within 60 s.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write the report."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", type=Path, default=DATA, help="folder with the extraction-gym JSON files")
    p.add_argument("--out", type=Path, default=OUT, help="output folder for extraction_gym.md/.json")
    p.add_argument("--graphs", default=",".join(GRAPHS), help="comma-separated graph names")
    p.add_argument("--solvers", default="highs,cbc", help="comma-separated ILP solvers (highs, cbc)")
    p.add_argument("--time-limit", type=float, default=None, help="override the per-graph time limits")
    p.add_argument("--repeats", type=int, default=REPEATS, help="HiGHS runs per graph; the median-time one is reported")
    p.add_argument(
        "--stall-seconds",
        type=float,
        default=None,
        help="stop an ILP run whose best selection has not improved for this long (default: no window)",
    )
    args = p.parse_args(argv)
    mach = machine_info()
    solvers = [s for s in args.solvers.split(",") if s]
    records = [
        run_graph(g, args.data, solvers, args.time_limit, args.stall_seconds, max(1, args.repeats))
        for g in args.graphs.split(",")
        if g
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "extraction_gym.json").write_text(json.dumps({"machine": mach, "results": records}, indent=2) + "\n")
    md = markdown(records, mach, max(1, args.repeats))
    (args.out / "extraction_gym.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
