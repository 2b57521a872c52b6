"""Sequential search against equality saturation on one model: costs, search times, e-graph size and measured
end-to-end latency, in the shape of Tensat's Table 1 (MLSys 2021).

Both searches use one cost model and one rule set (`rewrites.select_rules` for the graph's operators); both
optimized graphs are exported to ONNX and verified against the input in onnxruntime on the same seeded inputs;
the three models are then timed interleaved (`tensat.latency.time_models`), medians and ratios reported.

Search time, sequential: the whole best-first loop (matching, pricing candidates, materializing popped graphs).
Search time, tensat: exploration + cycle filtering + extraction (as the paper counts it); building the e-graph
(`lower`) and pricing its e-nodes for the extractor (`price`) are reported separately, and a ratio including them
is given too. Time to a cost: when each search's best graph first cost at most the other's final one, in the
summed cost both minimize (the sequential search's trace; tensat's exploration and guided rounds, then the
extraction's improvements, `info["trajectory"]`); "never" where it did not get there.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import onnx

from tensat import api, onnx_io, rewrites
from tensat.cost import EXACT, CostModel, Resolution, runtime_cost
from tensat.errors import VerificationError
from tensat.ir import Graph
from tensat.latency import time_models
from tensat.measure import cpu_name
from tensat.options import Options
from tensat.sequential import SequentialResult, sequential_search
from tensat.verify import verify

Progress = Callable[[str], None]

# Relative slack when asking whether tensat's cost is at most the sequential search's (sums in another order).
COST_TOLERANCE = 1e-9
COST_RESOLUTION = 1e-6  # relative: an extraction's cost carries tie-breaks of 1e-9 ms per e-node, a graph's none
# (and a measuring cost model's resolution on the e-nodes the input does not use)
# The geometric-mean search-time ratio reported in Tensat's Table 1, for reference next to ours.
PAPER_TIME_RATIO = 48.0
TENSAT_SEARCH_PHASES = ("explore", "guided", "cycle_filter", "extract")
TENSAT_OVERHEAD_PHASES = ("lower", "price")


@dataclass(frozen=True)
class Settings:
    """Everything a comparison run depends on."""

    cost: str = "analytic"
    device: str = "auto"
    alpha: float = 1.05
    budget: int = 100
    seq_time_limit: float | None = None
    tensat: Mapping[str, Any] = field(default_factory=dict)  # optimize_with_details options (limits, extractor, ...)
    latency: bool = True
    latency_runs: int = 30
    latency_seconds: float = 60.0
    seed: int = 0
    input_shapes: Mapping[str, Sequence[int]] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tensat"] = dict(self.tensat)
        out["input_shapes"] = None if self.input_shapes is None else {k: list(v) for k, v in self.input_shapes.items()}
        return out


@dataclass
class Row:
    """One model's comparison."""

    name: str
    ops: int
    cost_original: float
    cost_model: str
    sequential: dict[str, Any]
    tensat: dict[str, Any]
    latency: dict[str, Any] | None
    rules: int
    errors: list[str] = field(default_factory=list)

    @property
    def tensat_at_most_sequential(self) -> bool:
        """Whether tensat's cost is at most the sequential search's (up to rounding)."""
        return self.tensat["cost"] <= self.sequential["cost"] * (1 + COST_TOLERANCE)

    @property
    def time_ratio(self) -> float:
        """Sequential search time over tensat search time."""
        return _ratio(self.sequential["seconds"], self.tensat["seconds"])

    @property
    def time_ratio_with_overhead(self) -> float:
        """Sequential search time over tensat time including e-graph building and pricing."""
        return _ratio(self.sequential["seconds"], self.tensat["seconds_with_overhead"])

    @property
    def verified(self) -> bool:
        return bool(self.sequential.get("verified")) and bool(self.tensat.get("verified"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Row:
        """A row back from its `to_dict` form (to re-render a saved comparison)."""
        return cls(
            d["name"],
            d["ops"],
            d["cost_original"],
            d["cost_model"],
            dict(d["sequential"]),
            dict(d["tensat"]),
            d.get("latency"),
            d["rules"],
            list(d.get("errors", [])),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ops": self.ops,
            "rules": self.rules,
            "cost_model": self.cost_model,
            "cost_original": self.cost_original,
            "sequential": self.sequential,
            "tensat": self.tensat,
            "latency": self.latency,
            "tensat_at_most_sequential": self.tensat_at_most_sequential,
            "time_ratio": self.time_ratio,
            "time_ratio_with_overhead": self.time_ratio_with_overhead,
            "verified": self.verified,
            "errors": list(self.errors),
        }


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def _seq_progress(name: str, progress: Progress | None, every: float = 2.0) -> Callable[[dict[str, Any]], None]:
    """A sequential-search callback that reports at most every `every` seconds (and at the last expansion)."""
    last = [time.perf_counter()]

    def report(info: dict[str, Any]) -> None:
        now = time.perf_counter()
        final = info["expansion"] >= info["budget"]
        if progress is None or (now - last[0] < every and not final):
            return
        last[0] = now
        gain = 100.0 * (1 - info["best"] / info["cost_before"]) if info["cost_before"] > 0 else 0.0
        progress(
            f"[{name}] sequential: {info['expansion']}/{info['budget']} expansions, best {info['best']:.4f} ms "
            f"({gain:+.1f}% saved), {info['queue']} queued, {info['seconds']:.1f} s"
        )

    return report


def _verify(original: onnx.ModelProto, optimized: onnx.ModelProto, seed: int) -> dict[str, Any]:
    try:
        report = verify(original, optimized, seed=seed)
    except VerificationError as exc:
        return {"verified": False, "verify_error": str(exc)}
    return {"verified": bool(report.ok), "max_abs_error": report.max_abs_error, "max_rel_error": report.max_rel_error}


def compare_model(
    source: str | os.PathLike[str] | onnx.ModelProto,
    name: str,
    settings: Settings = Settings(),
    progress: Progress | None = None,
) -> Row:
    """Run both searches on one model (a path or a ModelProto) and measure the results."""
    _say(progress, f"[{name}] loading")
    original = onnx_io.load_model(source, settings.input_shapes)
    graph = onnx_io.import_model(original).compact()
    cost = api.make_cost_model(settings.cost, settings.device, progress=progress is not None)
    present = {graph.nodes[i].op for i in graph.live()}
    rules = rewrites.select_rules(present, rewrites.rule_set(settings.tensat.get("rules", Options.rules)))
    cost_original = runtime_cost(graph, cost)
    errors: list[str] = []

    _say(
        progress,
        f"[{name}] sequential search: {len(rules)} rules, alpha {settings.alpha:g}, "
        f"budget {settings.budget} expansions",
    )
    seq: SequentialResult = sequential_search(
        graph,
        cost,
        rules,
        alpha=settings.alpha,
        budget=settings.budget,
        time_limit=settings.seq_time_limit,
        progress=_seq_progress(name, progress),
    )
    seq_model = onnx_io.export_model(seq.graph)
    seq_info: dict[str, Any] = {
        "cost": _written_cost(seq_model, cost),
        "search_cost": seq.cost_after,
        "seconds": seq.seconds,
        "ops": len(seq_model.graph.node),
        "expansions": seq.expansions,
        "matches": seq.matches,
        "candidates": seq.candidates,
        "pushed": seq.pushed,
        "rejected": seq.rejected,
        "stop_reason": seq.stop_reason,
        "best_expansion": seq.best_expansion,
        "applied": seq.applied,
    }
    seq_info.update(_verify(original, seq_model, settings.seed))
    if not seq_info["verified"]:
        errors.append(f"sequential result failed verification: {seq_info.get('verify_error', '')}")
    _say(
        progress,
        f"[{name}] sequential: cost {cost_original:.4f} -> {seq_info['cost']:.4f} ms in {seq.seconds:.2f} s "
        f"({seq.expansions} expansions, {seq.candidates} candidates); verified: {seq_info['verified']}",
    )

    _say(progress, f"[{name}] tensat: exploring and extracting")
    options = {"pre_pass": "none", **settings.tensat}  # both searches start from the graph read as given
    result = api.optimize_with_details(
        original,
        cost=settings.cost,
        device=settings.device,
        verify=False,
        latency_check=0,
        seed=settings.seed,
        **options,
    )
    tensat_model = result.output
    times = dict(result.times)
    search = sum(times.get(k, 0.0) for k in TENSAT_SEARCH_PHASES)
    overhead = sum(times.get(k, 0.0) for k in TENSAT_OVERHEAD_PHASES)
    ex = result.exploration
    tensat_info: dict[str, Any] = {
        "cost": result.cost_after,  # the returned model's, as written and priced as onnxruntime runs it
        "search_cost": runtime_cost(result.graph, cost),
        "seconds": search,
        "seconds_with_overhead": search + overhead,
        "times": times,
        "ops": result.nodes_after,
        "enodes": ex.enodes,
        "eclasses": ex.eclasses,
        "iterations": len(ex.iterations),
        "stop_reason": ex.stop_reason,
        "extraction": None
        if result.extraction is None
        else {"method": result.extraction.method, "status": result.extraction.status},
        "warnings": list(result.warnings),
    }
    trajectory = result.extraction.info.get("trajectory", []) if result.extraction is not None else []
    before_extraction = times.get("explore", 0.0) + times.get("guided", 0.0)
    tensat_found = trajectory[-1][1] if trajectory else tensat_info["search_cost"]
    resolution: Resolution = getattr(cost, "resolution", EXACT)  # the extraction's tie-breaks on new e-nodes
    tensat_info["seconds_to_sequential_cost"] = _seconds_to(
        [(before_extraction + t, c) for t, c in trajectory],
        seq.cost_after * (1 + resolution.relative) + resolution.ms * len(graph.nodes),
    )
    seq_info["seconds_to_tensat_cost"] = _seconds_to([(t["seconds"], t["best"]) for t in seq.trace], tensat_found)
    tensat_info.update(_verify(original, tensat_model, settings.seed))
    if not tensat_info["verified"]:
        errors.append(f"tensat result failed verification: {tensat_info.get('verify_error', '')}")
    _say(
        progress,
        f"[{name}] tensat: cost {cost_original:.4f} -> {tensat_info['cost']:.4f} ms in {search:.2f} s "
        f"({ex.enodes} e-nodes, {ex.eclasses} e-classes); verified: {tensat_info['verified']}",
    )

    latency: dict[str, Any] | None = None
    if settings.latency:
        _say(progress, f"[{name}] timing original, sequential and tensat graphs in onnxruntime (interleaved)")
        stats = time_models(
            [original, seq_model, tensat_model],
            runs=settings.latency_runs,
            max_seconds=settings.latency_seconds,
            seed=settings.seed,
        )
        base = stats[0].median_ms
        latency = {"runs": stats[0].runs}
        for key, s in zip(("original", "sequential", "tensat"), stats):
            latency[key] = {
                "median_ms": s.median_ms,
                "p10_ms": s.p10_ms,
                "p90_ms": s.p90_ms,
                "speedup": _ratio(base, s.median_ms),
            }
    return Row(
        name,
        len(original.graph.node),
        cost_original,
        getattr(cost, "name", settings.cost),
        seq_info,
        tensat_info,
        latency,
        len(rules),
        errors,
    )


def _seconds_to(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """When a search's best cost first reached `target` (points: seconds, best cost so far), or None if never."""
    return next((t for t, cost in points if cost <= target * (1 + COST_RESOLUTION)), None)


def _written_cost(model: onnx.ModelProto, cost: CostModel) -> float:
    """The cost of a model tensat exported, read back as written (no onnx.checker pass, as the pipeline reads its own
    export), priced as onnxruntime runs it: the figure every table reports."""
    return runtime_cost(onnx_io.import_model(model, check=False).compact(), cost)


def compare_graph(graph: Graph, name: str, settings: Settings = Settings(), progress: Progress | None = None) -> Row:
    """`compare_model` for an IR graph (exported to ONNX first)."""
    return compare_model(onnx_io.export_model(graph), name, settings, progress)


def summary(rows: Sequence[Row]) -> dict[str, Any]:
    """Where tensat's cost is at most the sequential search's, the geometric-mean time ratios, and the limits the
    tensat runs hit (extractions not proven optimal, explorations stopped before saturation)."""
    ok = [r for r in rows if not r.errors]

    def geomean(values: list[float]) -> float | None:
        finite = [v for v in values if v > 0 and math.isfinite(v)]
        return math.exp(sum(math.log(v) for v in finite) / len(finite)) if finite else None

    return {
        "graphs": len(rows),
        "verified": sum(r.verified for r in rows),
        "tensat_at_most_sequential": sum(r.tensat_at_most_sequential for r in rows),
        "tensat_at_most_sequential_everywhere": all(r.tensat_at_most_sequential for r in rows),
        "worse_on": [r.name for r in rows if not r.tensat_at_most_sequential],
        "geomean_time_ratio": geomean([r.time_ratio for r in rows]),
        "geomean_time_ratio_with_overhead": geomean([r.time_ratio_with_overhead for r in rows]),
        "paper_time_ratio": PAPER_TIME_RATIO,
        "extraction_not_proven_optimal": [r.name for r in rows if _extraction_status(r) not in (None, "optimal")],
        "exploration_not_saturated": {
            r.name: r.tensat["stop_reason"] for r in rows if r.tensat.get("stop_reason") not in ("saturated", None)
        },
        "errors": sum(len(r.errors) for r in rows),
        "all_ok": len(ok) == len(rows),
    }


def _extraction_status(row: Row) -> str | None:
    return (row.tensat.get("extraction") or {}).get("status")


def machine_info() -> dict[str, Any]:
    """The machine and the versions the numbers were taken with."""
    from importlib import metadata

    versions: dict[str, str] = {"python": platform.python_version()}
    for pkg in ("tensat", "egglog", "numpy", "onnx", "onnxruntime", "onnxruntime-gpu", "highspy", "pulp"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "versions": versions,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def report(rows: Sequence[Row], settings: Settings, machine: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document of a comparison."""
    return {
        "machine": dict(machine or machine_info()),
        "settings": settings.to_dict(),
        "summary": summary(rows),
        "rows": [r.to_dict() for r in rows],
    }


def _fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    if ratio >= 10:
        return f"{ratio:.1f}"
    return f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:.2g}"


def _fmt_latency(lat: Mapping[str, Any] | None, key: str) -> str:
    if lat is None:
        return "-"
    s = lat[key]
    return f"{s['median_ms']:.3f}" if key == "original" else f"{s['median_ms']:.3f} ({s['speedup']:.3f}x)"


def table(rows: Sequence[Row]) -> str:
    """The comparison as a markdown table (one row per model)."""
    head = (
        "| graph | ONNX nodes (original / sequential / tensat) | original cost (ms) | sequential cost (ms) | "
        "sequential time (s) | tensat cost (ms) | "
        "tensat time (s) | time ratio | tensat time to the sequential cost (s) | sequential time to the tensat cost "
        "(s) | e-nodes / e-classes | tensat <= sequential | latency original (ms) | "
        "latency sequential (ms) | latency tensat (ms) | verified |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in rows:
        s, t = r.sequential, r.tensat
        lines.append(
            f"| {r.name} | {r.ops} / {s['ops']} / {t['ops']} | {r.cost_original:.4f} | {s['cost']:.4f} | "
            f"{s['seconds']:.2f} | {t['cost']:.4f} | "
            f"{t['seconds']:.2f} | {_fmt_ratio(r.time_ratio)} | {_fmt_seconds(t.get('seconds_to_sequential_cost'))} | "
            f"{_fmt_seconds(s.get('seconds_to_tensat_cost'))} | {t['enodes']} / {t['eclasses']} | "
            f"{'yes' if r.tensat_at_most_sequential else 'NO'} | {_fmt_latency(r.latency, 'original')} | "
            f"{_fmt_latency(r.latency, 'sequential')} | {_fmt_latency(r.latency, 'tensat')} | "
            f"{'yes' if r.verified else 'NO'} |"
        )
    return "\n".join(lines)


def _fmt_seconds(seconds: float | None) -> str:
    """A time to reach a cost, or "never" where the search did not reach it."""
    return "never" if seconds is None else f"{seconds:.2f}"


def _findings(rows: Sequence[Row], s: Mapping[str, Any]) -> list[str]:
    """The summary's bullet points: costs, search times, verification and the limits the tensat runs hit."""
    cost = f"- tensat cost <= sequential cost on {s['tensat_at_most_sequential']} of {s['graphs']} graphs"
    if s["worse_on"]:
        worst = max(
            (r for r in rows if not r.tensat_at_most_sequential),
            key=lambda r: _ratio(r.tensat["cost"], r.sequential["cost"]),
        )
        excess = 100.0 * (_ratio(worst.tensat["cost"], worst.sequential["cost"]) - 1)
        cost += f" (not on: {', '.join(s['worse_on'])}; worst: {worst.name}, {excess:.2f}% above the sequential cost)"
    out = [
        cost + ".",
        f"- Geometric-mean search-time ratio (sequential / tensat): {_fmt_ratio(s['geomean_time_ratio'])} "
        f"(paper: {s['paper_time_ratio']:g}); including tensat's e-graph building and pricing: "
        f"{_fmt_ratio(s['geomean_time_ratio_with_overhead'])}.",
        f"- Both optimized graphs verified against the original in onnxruntime on {s['verified']} of {s['graphs']} "
        "graphs.",
    ]
    by_name = {r.name: r for r in rows}
    if s["extraction_not_proven_optimal"]:
        listed = []
        for name in s["extraction_not_proven_optimal"]:
            ex = by_name[name].tensat.get("extraction") or {}
            listed.append(f"{name} ({ex.get('method')}: {ex.get('status')})")
        out.append(f"- tensat's extraction is not proven optimal on: {', '.join(listed)}.")
    if s["exploration_not_saturated"]:
        stopped = ", ".join(f"{name} ({why})" for name, why in s["exploration_not_saturated"].items())
        out.append(f"- tensat's exploration stopped before saturation on: {stopped}.")
    per_exp = sorted(
        1e3 * r.sequential["seconds"] / r.sequential["expansions"] for r in rows if r.sequential.get("expansions")
    )
    if per_exp:
        out.append(
            f"- Sequential search: {per_exp[0]:.0f} to {per_exp[-1]:.0f} ms per expansion (every match of "
            "every rule priced as a candidate graph)."
        )
    return out


def markdown(rows: Sequence[Row], settings: Settings, machine: Mapping[str, Any] | None = None) -> str:
    """A markdown report: machine and versions, settings, the table, the summary and per-model notes."""
    machine = dict(machine or machine_info())
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
    s = summary(rows)
    tensat_opts = ", ".join(f"{k}={v}" for k, v in sorted(settings.tensat.items())) or "defaults"
    latency = (
        f"Latency: onnxruntime CPU, 1 thread, the three models timed interleaved, median of up to "
        f"{settings.latency_runs} runs each (speedup = original median / median)."
        if settings.latency
        else "Latency: not measured."
    )
    out = [
        "# Sequential search (TASO-style) vs equality saturation (tensat)",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores. {versions}. Run {machine['date']}.",
        "",
        f"Cost model: {settings.cost}. Sequential: best-first, alpha {settings.alpha:g}, budget {settings.budget} "
        f"expansions. Tensat: {tensat_opts}. Same rule set on both sides (`select_rules` for each graph's ops). "
        "Costs are the summed per-operator cost in ms under that model (weight-only nodes free). Sequential time = "
        "the whole search loop; tensat time = exploration + cycle filtering + extraction (e-graph building and "
        "e-node pricing are reported in the JSON and in the ratio with overhead below). " + latency,
        "",
        table(rows),
        "",
        *_findings(rows, s),
    ]
    notes = []
    for r in rows:
        seq, t = r.sequential, r.tensat
        times = t.get("times", {})
        overhead = sum(times.get(k, 0.0) for k in TENSAT_OVERHEAD_PHASES)
        ex = t.get("extraction") or {}
        phases = ", ".join(f"{k} {times[k]:.2f} s" for k in TENSAT_SEARCH_PHASES if k in times)
        notes.append(
            f"- {r.name}: {r.rules} rules; sequential {seq['expansions']} expansions ({seq['stop_reason']}), "
            f"{seq['candidates']} candidates priced, {seq['pushed']} queued, best found at expansion "
            f"{seq['best_expansion']}; tensat {t['iterations']} iterations ({t['stop_reason']}), {phases}"
            + (f" ({ex.get('method')}: {ex.get('status')})" if ex else "")
            + f", e-graph building + pricing {overhead:.2f} s"
            + (f"; errors: {'; '.join(r.errors)}" if r.errors else "")
            + "."
        )
    out += ["", "Per graph:", "", *notes, ""]
    return "\n".join(out)
