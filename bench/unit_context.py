"""Unit prices beside the same kernels timed inside the graph: where a summed cost misses end-to-end time.

    python -m bench.unit_context                           # five models of the corpus
    python -m bench.unit_context --only mobilenet_v2 --out-dir DIR

For each model, on a cold cost cache: every kernel tensat prices (`tensat.cost.runtime_kernels`, measured as a
search measures it), the time onnxruntime's profiler gives that kernel inside the whole graph (one thread, its
median over the runs), and, inside the kernel's own timed model (`MeasuredCost.copies_for` copies, evicted before
each run as when it is priced), the profiler's time of the first copy and the median of the later ones. The graph's
kernels are matched to tensat's in order, where both list as many (the NCHWc reorders onnxruntime puts around
blocked kernels are counted apart; each row keeps the op type onnxruntime ran); a model where they differ gets its
totals only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from onnx import ModelProto

from bench.machine import header
from bench.real_models import DEFAULT_OUT as CORPUS
from bench.real_models import per_model_report
from tensat.cost import device_of, runtime_kernels
from tensat.cost_report import load_graph
from tensat.measure import MeasuredCost, Unit, make_measured_cost, pricing_unit
from tensat.measure.cache import CostEntry
from tensat.measure.units import replicate, unit_model
from tensat.session import make_session

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("mobilenet_v2", "efficientnet_b0", "resnet50", "bert", "clip_vision")
RUNS = 200  # profiled runs of a graph or a unit's model
WARMUP = 20
REORDERS = ("ReorderInput", "ReorderOutput")


def kernel_times(events: Sequence[dict[str, Any]], skip: int = WARMUP) -> list[tuple[str, str, float]]:
    """(node name, op type, median microseconds) of each kernel of an onnxruntime profile, in the order the first
    run ran them, over the runs after the first `skip`."""
    order: list[str] = []
    op_of: dict[str, str] = {}
    times: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        if name not in times:
            order.append(name)
            op_of[name] = e["args"]["op_name"]
            times[name] = []
        times[name].append(float(e["dur"]))
    return [(n, op_of[n], statistics.median(times[n][skip:] or times[n])) for n in order]


def profiled(
    cost: MeasuredCost,
    model: ModelProto | bytes,
    cold: Callable[[Callable[[], None]], Callable[[], None] | None],
    unit: bool,
) -> list[tuple[str, str, float]]:
    """The kernels of `model` as onnxruntime's profiler times them, one intra-op thread, each run preceded by what
    `cold` gives for the bound run (nothing where it gives None). A unit's timed model runs in a session as units
    are timed (`Runner.session`: common-subexpression elimination off, which would merge its copies), a whole model
    in one as a user runs it."""
    r = cost.runner
    with tempfile.TemporaryDirectory(prefix="tensat-profile-") as tmp:
        data = model if isinstance(model, bytes) else model.SerializeToString()
        prefix = os.path.join(tmp, "p")
        if unit:
            sess = r.session(data, profile_prefix=prefix)
        else:
            sess = make_session(data, "cpu", threads=1, log_severity=4, profile_prefix=prefix)
        run = r.bound(sess)
        before = cold(run)
        for _ in range(WARMUP + RUNS):
            if before is not None:
                before()
            run()
        with open(sess.end_profiling(), encoding="utf-8") as f:
            return kernel_times(json.load(f))


def _copies(cost: MeasuredCost, unit: Unit) -> tuple[float, float]:
    """The profiler's time of the first copy of `unit` in its timed model, and the later copies' median (NaN for a
    unit priced without timing, a view or one onnxruntime cannot run alone, and for one it runs as reorders only)."""
    plan = cost._plan(unit)
    if isinstance(plan, CostEntry) or unit.ops == ("reshape",):
        return math.nan, math.nan
    base = plan.model if plan.model is not None else unit_model(unit)
    model = replicate(base, plan.copies) if plan.copies > 1 else base
    try:
        timed = profiled(cost, model, lambda run: cost.runner.cold_weights(run, plan.evict_bytes), unit=True)
    except Exception:  # noqa: BLE001 - onnxruntime raises many types; the unit is priced by its fallback
        return math.nan, math.nan
    extra = (*REORDERS, "MaxPool") if plan.null_model is not None else REORDERS  # a prologue's pools and samples
    own = [t for _, op, t in timed if op not in extra]
    return (own[0], statistics.median(own[1:] or own)) if own else (math.nan, math.nan)


def model_record(path: Path) -> dict[str, Any]:
    """Every kernel of one model: its price, its time in the graph, and its copies' times in its timed model."""
    with tempfile.TemporaryDirectory(prefix="tensat-cache-") as cache:
        cost = make_measured_cost("cpu", os.path.join(cache, "costs.sqlite3"), progress=False, threads=1)
        graph = load_graph(path)
        cost.observe_graph(graph)
        kernels = [k for k in runtime_kernels(graph, device_of(cost)) if k[1][0].op != "opaque"]
        cost.prefetch([item for _, item in kernels])
        in_graph = profiled(cost, path.read_bytes(), lambda run: None, unit=False)
        ran = [k for k in in_graph if k[1] not in REORDERS]
        rows: list[dict[str, Any]] = []
        units: dict[str, tuple[float, float]] = {}
        for _, (node, shapes, const) in kernels:
            unit = pricing_unit(node, shapes, const)
            key = unit.signature()
            if key not in units:
                units[key] = _copies(cost, unit)
            first, later = units[key]
            rows.append(
                {
                    "kernel": unit.label(),
                    "shapes": [list(s) for s in shapes],
                    "price_us": cost(node, shapes, const) * 1e3,
                    "first_copy_us": first,
                    "later_copies_us": later,
                }
            )
        matched = len(ran) == len(rows)
        for row, (_, op, t) in zip(rows, ran) if matched else ():
            row["ran_as"], row["in_graph_us"] = op, t
        return {
            "model": path.stem,
            "matched": matched,
            "kernels": rows,
            "price_ms": sum(r["price_us"] for r in rows) / 1e3,
            "in_graph_ms": sum(t for _, _, t in ran) / 1e3,
            "reorders_ms": sum(t for _, op, t in in_graph if op in REORDERS) / 1e3,
            "baseline_ms": cost.baseline_ms,
        }


def render(records: Sequence[dict[str, Any]], info: dict[str, Any]) -> str:
    """The markdown report."""
    lines = [
        "# Unit prices and the same kernels inside the graph",
        "",
        header(info),
        "",
        "One intra-op thread, CPU, each model on a cold cost cache. `priced`: the kernels' measured prices summed "
        "(what a search sums); `in graph`: onnxruntime's profiler times of the same kernels in a run of the whole "
        "model (the NCHWc reorders apart); `first copy` and `later copies`: inside each kernel's own timed model, "
        "evicted before each run as when it is priced, the first copy's time and the later copies' median, summed "
        "over the kernels matched. See `bench/unit_context.py`.",
        "",
        "| model | kernels | priced (ms) | in graph (ms) | reorders in graph (ms) | first copy (ms) "
        "| later copies (ms) | priced / in graph | first copy / in graph | later copies / in graph |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        rows = [k for k in r["kernels"] if "in_graph_us" in k and not math.isnan(k["first_copy_us"])]
        g = sum(k["in_graph_us"] for k in rows) / 1e3
        first = sum(k["first_copy_us"] for k in rows) / 1e3
        later = sum(k["later_copies_us"] for k in rows) / 1e3
        priced = sum(k["price_us"] for k in rows) / 1e3
        ratios = [f"{v / g:.2f}" if g else "—" for v in (priced, first, later)] if r["matched"] else ["—"] * 3
        lines.append(
            f"| {r['model']} | {len(r['kernels'])}{'' if r['matched'] else ' (not matched)'} | {r['price_ms']:.2f} | "
            f"{r['in_graph_ms']:.2f} | {r['reorders_ms']:.2f} | {first:.2f} | {later:.2f} | {' | '.join(ratios)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.unit_context", description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="the corpus directory (default bench/corpus)")
    parser.add_argument("--only", default=",".join(MODELS), help="comma-separated model names")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where to write unit_context.md/.json")
    args = parser.parse_args(argv)
    return per_model_report(
        "python -m bench.unit_context", "unit_context", args.corpus, args.only, args.out_dir, model_record, render
    )


if __name__ == "__main__":
    sys.exit(main())
