"""Accuracy of the measured cost model and safety of optimizing with it, on the 8 benchmark graphs.

For every graph: optimize with `tensat.optimize_with_details(model, cost="measured")`; measure every kernel of the
original and the optimized graph afresh while both graphs run end to end in between
(`tensat.cost_report.cost_report`), and set the summed cost (the kernels of `tensat.cost.runtime_kernels`, the price
the search sums, plus one run's fixed overhead) beside the end-to-end latency; compare the two graphs' latency
(interleaved blocks of runs) to see whether the optimized one is ever slower; re-measure a sample of cached costs from
scratch to see how well the same signature reproduces. Before that, two processes fill one fresh cache at once, and a
second `tensat optimize` in a new process measures nothing new.

Latency is the CPU time of the (single) inference thread (`clock="cpu"`): on this shared machine wall time also
counts the time other processes had the core. Wall-time medians are reported beside it.

Writes bench/results/cost_report.md and .json. Run: ``PYTHONPATH=. python bench/cost_report.py`` (about 30 minutes;
``--models`` picks graphs, ``--quick`` shrinks the timing budgets).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import tensat
from bench.machine import header, machine_info
from tensat.cost import runtime_kernels
from tensat.cost_report import cost_report, end_to_end, kernel_unit, runtime_nodes
from tensat.files import atomic_write_json, atomic_write_text
from tensat.latency import block_ratios, median_interval
from tensat.measure import LONG_WEIGHTS, Unit, graph_working_set, make_measured_cost
from tensat.models import build_model, model_names
from tensat.onnx_io import export_model, import_model

OUT = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
TARGET_ERROR = 0.05
REPEAT_TOL = 0.10
NOTES = """
How a kernel is measured (tensat/measure/): K copies of it in one model (each with its own weights, so that
the copies' weights span the graph's weight working set), alternated with a null model, (t_unit - t_null) / K
plus one node's dispatch cost; where the copies do not span the working set the rest is evicted from the caches
before every timed run and the inputs and output buffers are touched again (inside a graph an op's weights are
cold, its input has just been computed, its output goes to a recycled buffer); a kernel onnxruntime runs in the
blocked NCHWc layout is timed as onnxruntime's own optimized model of it with the boundary reorders cut off; all
bound buffers are 64-byte aligned like onnxruntime's own.
No factor is fitted to the end-to-end figures.

Never measurably slower: a summed cost cannot promise that (see below), so `tensat.optimize` with measured costs
times its result against the input end to end (interleaved blocks, at most 20 s) and keeps the input unless the
result runs measurably faster (docs/cost-model.md). Where the gain the cost model predicts is within the few
percent that two runs of the same graph differ by here, the check may keep the input, as it did for the graphs
whose cost before and after are equal above; the graph it keeps is then compared with itself.

Why some graphs miss the 5% target:

- Load from other processes. The machine is shared (load average about 2 on 2 cores during the run): the same
  graph's end-to-end median moved by up to 50% between runs minutes apart (SqueezeNet 7.1 to 10.0 ms, NasRNN 4.0
  to 9.3 ms, BERT 45 to 70 ms). Costs and end-to-end runs are therefore taken interleaved, but a short timed group
  and a whole streaming graph do not slow down alike under memory contention, so per-graph errors move by 5-10
  points from one run to the next, and more from one machine to another (BERT's kernels sum to within 1% of its
  end-to-end time on one machine and 10-15% above it on another).
- NasRNN: its matrix-vector products (1x512 @ 512x512, 16 MiB of weights, each weight reused across time steps)
  are memory-bound, and their cost depends on how much of the 16 MiB weight cycle survives in the shared L3. On
  this machine one product costs about 23 us with its weights in L2, 57 us from L3 and 106 us cold; the K-copy
  model cycles the same 16 MiB as the graph and measures 55-66 us, but inside the graph (and in a chain of 16 such
  products with distinct weights) a product takes 70-100 us depending on the load. So the sum under-predicts
  NasRNN by 10-40%, more for the optimized graph, whose merged products (several rows against one weight) replace
  reads that were partly cache-hot in the original. An additive per-op cost cannot see when a weight was last
  read; the graph's order decides that.
- Early layers of the CNNs: ops on tensors larger than L2 (SqueezeNet's first convolution writes 3.2 MB) run
  slower inside the graph than in their own model (the graph's buffers for them were last touched one inference
  earlier), which leaves SqueezeNet a few percent under.
"""


def _run(code: str, env: dict[str, str], timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cache_checks(cache_dir: str) -> dict[str, Any]:
    """Two processes profiling at once into one fresh cache, then `tensat optimize` twice in new processes."""
    env = {**os.environ, "TENSAT_CACHE_DIR": cache_dir, "PYTHONPATH": str(ROOT)}
    profile = """
        import argparse, sys
        from tensat.measure_cli import add_profile_arguments, run_profile
        p = argparse.ArgumentParser(); add_profile_arguments(p)
        sys.exit(run_profile(p.parse_args(sys.argv[1:] if len(sys.argv) > 1 else {argv!r})))
    """
    count = """
        from tensat.measure.cache import CostCache
        print(CostCache().count())
    """
    t = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(profile.format(argv=argv))],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in (
            ["--model", "squeezenet", "--device", "cpu", "--no-explore", "--no-progress"],
            ["--model", "nasrnn", "--device", "cpu", "--no-explore", "--no-progress"],
        )
    ]
    outs = [p.communicate(timeout=1800) for p in procs]
    concurrent = {
        "returncodes": [p.returncode for p in procs],
        "stderr": [e.strip()[-300:] for _, e in outs],
        "stdout": [o.strip().replace(cache_dir, "$TENSAT_CACHE_DIR") for o, _ in outs],  # no temporary path
        "seconds": round(time.perf_counter() - t, 1),
        "rows": int(_run(count, env).stdout.strip() or 0),
    }
    runs = []
    with tempfile.TemporaryDirectory(prefix="tensat-bench-") as tmp:
        for k in range(2):
            t = time.perf_counter()
            cmd = [
                sys.executable,
                "-m",
                "tensat",
                "optimize",
                "--model",
                "squeezenet",
                "--cost",
                "measured",
                "--device",
                "cpu",
                "-o",
                os.path.join(tmp, f"out{k}.onnx"),
                "-q",
            ]
            r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
            rows = int(_run(count, env).stdout.strip() or 0)
            runs.append(
                {
                    "returncode": r.returncode,
                    "seconds": round(time.perf_counter() - t, 1),
                    "rows_after": rows,
                    "stderr": r.stderr.strip()[-300:],
                }
            )
    return {
        "concurrent_profiles": concurrent,
        "optimize_twice": runs,
        "second_optimize_new_rows": runs[1]["rows_after"] - runs[0]["rows_after"],
    }


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Optimize one graph with measured costs and compare summed costs with end-to-end latency."""
    rec: dict[str, Any] = {"model": name}
    model = build_model(name)
    graph = import_model(model).compact()
    ws = graph_working_set(graph)
    rec["working_set_mib"] = round(ws / 2**20, 1)
    t = time.perf_counter()
    result = tensat.optimize_with_details(
        model, cost="measured", device="cpu", time_limit=args.time_limit, ilp_time_limit=args.ilp_time_limit
    )
    rec["optimize_seconds"] = round(time.perf_counter() - t, 1)
    rec["optimize"] = {
        "cost_before": result.cost_before,
        "cost_after": result.cost_after,
        "ops_before": graph.op_count(),
        "ops_after": result.graph.op_count(),
        "enodes": result.exploration.enodes,
        "stop": result.exploration.stop_reason,
        "times": {k: round(v, 2) for k, v in result.times.items()},
        "measured": None if result.measurement is None else result.measurement["stats"],
        "latency_check": None if result.latency is None else result.latency.to_dict(),
        "warnings": list(result.warnings),
    }
    cost = make_measured_cost("cpu", working_set=ws, progress=args.progress)
    report = cost_report(
        graph,
        cost,
        optimized=result.graph,
        name=name,
        runs=args.runs,
        block=args.block,
        max_seconds=args.e2e_seconds,
        windows=args.windows,
        window_seconds=args.window_seconds,
    )
    rec["report"] = report.to_dict()
    rec["per_node_ms"] = [row.per_node_ms for row in report.rows]
    cpu = report.latency
    models = [export_model(graph), export_model(result.graph.compact())]
    wall = end_to_end(models, cost, runs=100_000, block=args.block, max_seconds=args.e2e_seconds / 3, clock="wall")
    ratios = block_ratios(cpu[0].samples_ms, cpu[1].samples_ms, args.block)
    low, high = median_interval(ratios, seed=len(name))
    rec["comparison"] = {
        "cpu_ms": [s.median_ms for s in cpu],
        "wall_ms": [s.median_ms for s in wall],
        "speedup_cpu": cpu[0].median_ms / cpu[1].median_ms,
        "speedup_wall": wall[0].median_ms / wall[1].median_ms,
        "block_ratios": [round(r, 4) for r in ratios],
        "block_ratio_ci95": [low, high],
        "slower_blocks": sum(1 for r in ratios if r < 1.0),
        "measurably_slower": high < 1.0,
        "runs": [s.runs for s in cpu],
    }
    if args.repeat:
        rec["repeat"] = repeat_check(cost, cost.uncached(), graph, args.repeat, seed=len(name))
    return rec


def repeat_check(cost: Any, fresh: Any, graph: Any, count: int, seed: int = 0) -> dict[str, Any]:
    """How well a cost reproduces: the graph's kernels measured twice in a row from scratch; and single-node costs
    cached while optimizing (minutes earlier), measured again now."""
    g = graph.compact()
    const = g.weight_only()
    groups = {}
    for kernel in runtime_kernels(g, cost.device):
        u = kernel_unit(kernel)
        if u is not None and u.ops != ("reshape",) and u.weight_bytes() <= LONG_WEIGHTS:
            groups.setdefault(u.signature(), u)
    singles = {}
    for i in runtime_nodes(g):
        n = g.nodes[i]
        u = Unit.single(n, [g.nodes[j].shape for j in n.inputs], [j in const for j in n.inputs])
        if n.op not in ("reshape", "opaque") and u.weight_bytes() <= LONG_WEIGHTS:
            singles.setdefault(u.signature(), u)
    rng = random.Random(seed)
    out: dict[str, Any] = {}
    for kind, units, model in (("back_to_back", groups, fresh), ("minutes_apart", singles, cost)):
        sample = rng.sample(sorted(units), min(count, len(units)))
        ratios = []
        for sig in sample:
            unit = units[sig]
            before = fresh._measure(unit).ms if kind == "back_to_back" else model.unit_cost(unit)
            again = fresh._measure(unit).ms
            ratios.append({"unit": unit.label(), "first_ms": before, "again_ms": again, "ratio": again / before})
        within = sum(1 for r in ratios if abs(r["ratio"] - 1) <= REPEAT_TOL)
        out[kind] = {"sampled": len(ratios), "within_10pct": within, "ratios": ratios}
    return out


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def markdown(
    records: list[dict[str, Any]],
    checks: dict[str, Any] | None,
    mach: dict[str, Any],
    device: dict[str, Any] | None,
    seconds: float,
) -> str:
    lines = ["# Measured cost model: accuracy report", "", header(mach), ""]
    if device:
        cal = device["calibration"]
        lines += [
            f"Measured on {device['device']['device']} with {device['device']['provider']}, "
            f"{device['device']['threads']} intra-op thread(s), clock: {device['device']['clock']} time, "
            f"onnxruntime {device['device']['onnxruntime']}. Calibration: per-node dispatch "
            f"{cal['node_us']:.2f} us, per-run overhead {cal['run_us']:.1f} us, NCHWc block {cal['block']}.",
            "",
        ]
    lines += [
        "Summed cost = the graph's kernels as tensat's catalogue says onnxruntime runs them (what the search "
        "sums), + one run's fixed overhead; every kernel is measured afresh (in several timing windows) while the "
        "original and the optimized graph run end to end in between, so both figures are taken under the same load "
        "from other processes. Per-node = every IR node priced alone from the cache filled while optimizing "
        "(onnxruntime's fusions not applied). End-to-end = median CPU time of the inference thread over blocks of "
        "runs, original and optimized alternating. "
        f"Error = (summed - end-to-end) / end-to-end; target |error| <= {TARGET_ERROR:.0%}.",
        "",
        "| graph | ops | summed ms | per-node ms | end-to-end ms | error | optimized ops | summed ms | per-node ms | "
        "end-to-end ms | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        rows = {row["graph"]: row for row in r["report"]["rows"]}
        o, p = rows["original"], rows.get("optimized")
        pn = r.get("per_node_ms", [float("nan")] * 2)
        cells = [
            r["model"],
            str(o["ops"]),
            f"{o['summed_ms']:.3f}",
            f"{pn[0]:.3f}",
            f"{o['e2e_ms']:.3f}",
            _pct(o["error"]),
        ]
        if p:
            cells += [str(p["ops"]), f"{p['summed_ms']:.3f}", f"{pn[1]:.3f}", f"{p['e2e_ms']:.3f}", _pct(p["error"])]
        lines.append("| " + " | ".join(cells) + " |")
    errors = [abs(row["error"]) for r in records for row in r["report"]["rows"]]
    if errors:
        met = sum(1 for e in errors if e <= TARGET_ERROR)
        lines += [
            "",
            f"Within {TARGET_ERROR:.0%}: {met} of {len(errors)} graphs (original and optimized); "
            f"median |error| {statistics.median(errors):.1%}, largest {max(errors):.1%}.",
        ]
    lines += [
        "",
        "## Optimized vs original (interleaved blocks of runs)",
        "",
        "Speedup = original / optimized median latency. The optimized graph is *measurably slower* when the "
        "95% bootstrap interval of the median block ratio (original / optimized, per pair of blocks) lies "
        "below 1. Check at optimize = `tensat.optimize`'s own end-to-end check of its result against the input "
        "(`latency_check`; the input is kept unless the result runs measurably faster, see docs/cost-model.md): "
        "its speedup at one thread, and which graph it kept.",
        "",
        "| graph | cost before -> after (per-node, ms) | check at optimize | CPU ms orig / opt | speedup (CPU) | "
        "95% interval | wall ms orig / opt | speedup (wall) | blocks where optimized was slower | "
        "measurably slower | e-nodes | optimize s | costs measured |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        c, o = r["comparison"], r["optimize"]
        measured = o["measured"]["measured"] if o["measured"] else "-"
        low, high = c["block_ratio_ci95"]
        check = o.get("latency_check")
        one = (check or {}).get("threads=1")
        kept = "optimized" if check and check["kept"] else "input"
        checked = f"{one['speedup']:.3f}x, {kept} kept" if one else (f"{kept} kept" if check else "-")
        lines.append(
            f"| {r['model']} | {o['cost_before']:.3f} -> {o['cost_after']:.3f} | {checked} | {c['cpu_ms'][0]:.3f} / "
            f"{c['cpu_ms'][1]:.3f} | {c['speedup_cpu']:.3f}x | {low:.3f} - {high:.3f} | {c['wall_ms'][0]:.3f} / "
            f"{c['wall_ms'][1]:.3f} | {c['speedup_wall']:.3f}x | {c['slower_blocks']} of {len(c['block_ratios'])} | "
            f"{'yes' if c['measurably_slower'] else 'no'} | {o['enodes']} | {r['optimize_seconds']} | {measured} |"
        )
    reps = [r["repeat"] for r in records if r.get("repeat")]
    if reps:
        lines += ["", "## Repeatability", ""]
        for kind, text in (
            ("back_to_back", "kernel costs measured twice in a row from scratch"),
            ("minutes_apart", "single-node costs cached while optimizing, measured again minutes later"),
        ):
            total = sum(x[kind]["sampled"] for x in reps)
            within = sum(x[kind]["within_10pct"] for x in reps)
            ratios = [q["ratio"] for x in reps for q in x[kind]["ratios"]]
            if ratios:
                lines.append(
                    f"- {text}: {within} of {total} within {REPEAT_TOL:.0%}; ratio median "
                    f"{statistics.median(ratios):.3f}, range {min(ratios):.3f} - {max(ratios):.3f}."
                )
    if checks:
        cc, runs = checks["concurrent_profiles"], checks["optimize_twice"]
        lines += [
            "",
            "## Cache across processes",
            "",
            f"Two `tensat profile` processes (squeezenet, nasrnn) filling one fresh cache at once: exit codes "
            f"{cc['returncodes']}, {cc['rows']} rows, {cc['seconds']} s.",
            f"`tensat optimize --model squeezenet --cost measured` twice in new processes: "
            f"{runs[0]['seconds']} s then {runs[1]['seconds']} s; rows after each {runs[0]['rows_after']}, "
            f"{runs[1]['rows_after']}: the second run measured {checks['second_optimize_new_rows']} new costs.",
        ]
    lines += ["", "## Notes", "", NOTES.strip(), "", f"Total benchmark time {seconds / 60:.1f} min.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=model_names(), help="graphs to run (default: all 8)")
    p.add_argument("--cache-dir", help="cost cache directory (default: a fresh temporary one)")
    p.add_argument(
        "--e2e-seconds",
        type=float,
        default=24.0,
        help="wall-time cap of the end-to-end runs timed after the costs (to reach --runs)",
    )
    p.add_argument("--runs", type=int, default=40, help="at least this many end-to-end runs per graph")
    p.add_argument("--windows", type=int, default=4, help="timing windows per kernel in the report")
    p.add_argument("--window-seconds", type=float, default=0.3, help="seconds per timing window")
    p.add_argument("--block", type=int, default=8, help="runs per block in interleaved timing")
    p.add_argument("--repeat", type=int, default=12, help="cached costs to re-measure per graph (0: none)")
    p.add_argument("--time-limit", type=float, default=30.0, help="exploration seconds per graph (default 30)")
    p.add_argument("--ilp-time-limit", type=float, default=30.0, help="ILP seconds per graph (default 30)")
    p.add_argument("--no-checks", action="store_true", help="skip the cross-process cache checks")
    p.add_argument("--quick", action="store_true", help="small timing budgets (a smoke run)")
    p.add_argument("--progress", action="store_true", help="show measuring progress bars")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument(
        "--render",
        action="store_true",
        help="only rewrite cost_report.md from the cost_report.json in --out (no measuring)",
    )
    args = p.parse_args(argv)
    if args.render:
        data = json.loads((args.out / "cost_report.json").read_text())
        atomic_write_text(
            args.out / "cost_report.md",
            markdown(data["results"], data["checks"], data["machine"], data["device"], data["seconds"]),
        )
        print(f"wrote {args.out / 'cost_report.md'}")
        return 0
    if args.quick:
        args.e2e_seconds, args.repeat, args.runs, args.windows, args.window_seconds = 4.0, 3, 16, 2, 0.15
    start = time.perf_counter()
    tmp = None
    if not args.cache_dir:
        tmp = tempfile.TemporaryDirectory(prefix="tensat-costs-")
        args.cache_dir = tmp.name
    os.environ["TENSAT_CACHE_DIR"] = args.cache_dir
    checks = None
    if not args.no_checks:
        checks = cache_checks(os.path.join(args.cache_dir, "checks"))
        print(
            f"cache checks: {json.dumps({k: v for k, v in checks.items() if k != 'concurrent_profiles'})}", flush=True
        )
    records = []
    device = None
    for name in args.models:
        t = time.perf_counter()
        rec = run_model(name, args)
        rec["seconds"] = round(time.perf_counter() - t, 1)
        rec["load_average"] = os.getloadavg()[0]
        device = rec["report"]["device"]
        records.append(rec)
        rows = ", ".join(
            f"{r['graph']} {r['summed_ms']:.3f} vs {r['e2e_ms']:.3f} ms ({r['error']:+.1%})"
            for r in rec["report"]["rows"]
        )
        print(f"{name}: {rows}; speedup {rec['comparison']['speedup_cpu']:.3f}x ({rec['seconds']} s)", flush=True)
    seconds = time.perf_counter() - start
    mach = machine_info()
    args.out.mkdir(parents=True, exist_ok=True)
    data = {
        "machine": mach,
        "device": device,
        "checks": checks,
        "results": records,
        "seconds": round(seconds, 1),
        "settings": {
            "e2e_seconds": args.e2e_seconds,
            "runs": args.runs,
            "windows": args.windows,
            "window_seconds": args.window_seconds,
            "block": args.block,
            "repeat": args.repeat,
            "time_limit": args.time_limit,
            "ilp_time_limit": args.ilp_time_limit,
        },
    }
    atomic_write_json(args.out / "cost_report.json", data)
    atomic_write_text(args.out / "cost_report.md", markdown(records, checks, mach, device, seconds))
    print(f"wrote {args.out / 'cost_report.md'}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
