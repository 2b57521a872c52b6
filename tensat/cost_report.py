"""How well summed measured costs predict end-to-end latency: the graph's kernels priced afresh, and the report.

A graph runs in onnxruntime as kernels, not node by node: it folds a BatchNormalization into the Conv before it,
fuses an activation into a Conv, a bias Add into a MatMul (a Gemm), a Pad of zeros into a Conv's padding, and larger
patterns into its own kernels (LayerNormalization, Gelu, FusedMatMul), which tensat reads as ops. Which of these it
makes is tensat's one catalogue (`tensat.cost.runtime_kernels`), the one every price of a graph as it runs is summed
over, in the search and in the run's report. `fused_graph_cost` prices those kernels, plus the fixed per-run
overhead of a session; `cost_report` sets that sum beside the graph's measured end-to-end latency, for the original
graph and the tensat-optimized one, measuring the kernels afresh between the graphs' end-to-end runs (on a shared
machine latency moves by tens of percent from one minute to the next, so both figures must be taken under the same
load). Where the sum misses the latency, the catalogue misses what onnxruntime runs.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onnx import ModelProto

from tensat import onnx_io
from tensat.cost import Kernel, device_of, item_of, runtime_kernels
from tensat.ir import Graph
from tensat.latency import Interleaved, time_models
from tensat.measure import MeasuredCost, Unit, UnitNode, pricing_unit
from tensat.onnx_io import export_model


def runtime_nodes(graph: Graph) -> list[int]:
    """Live nodes that run at inference (not inputs, weights or weight-only nodes), in topological order."""
    const = graph.weight_only()
    return [i for i in graph.live() if not graph.nodes[i].is_leaf and i not in const]


def group_unit(graph: Graph, members: Sequence[int], const: set[int] | None = None) -> Unit:
    """The measurable unit of a group of graph nodes (inputs from outside the group become its externals)."""
    const = graph.weight_only() if const is None else const
    index = {m: k for k, m in enumerate(members)}
    ext: dict[int, int] = {}
    ext_list: list[tuple[tuple[int, ...], bool, str]] = []
    unit_nodes = []
    for m in members:
        n = graph.nodes[m]
        refs = []
        for j in n.inputs:
            if j in index:
                refs.append(("n", index[j]))
                continue
            if j not in ext:
                ext[j] = len(ext_list)
                src = graph.nodes[j]
                ext_list.append((src.shape, j in const, src.dtype))
            refs.append(("x", ext[j]))
        unit_nodes.append(UnitNode(n.op, tuple(n.attrs), tuple(refs)))
    return Unit(tuple(unit_nodes), tuple(ext_list))


@dataclass
class GroupCost:
    """One priced group: its node ids, label, cost in ms, and how the cost was made."""

    nodes: list[int]
    label: str
    ms: float
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class GraphCost:
    """The summed cost of a graph: fused groups, the per-run baseline, and the plain per-node sum beside it."""

    total_ms: float
    baseline_ms: float
    per_node_ms: float
    groups: list[GroupCost]
    analytic_nodes: int

    @property
    def fused_groups(self) -> int:
        return sum(1 for g in self.groups if len(g.nodes) > 1)

    def by_label(self) -> dict[str, float]:
        """Cost summed by group label (op or fused ops), largest first."""
        out: dict[str, float] = {}
        for g in self.groups:
            out[g.label] = out.get(g.label, 0.0) + g.ms
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def per_node_cost(graph: Graph, cost: MeasuredCost) -> float:
    """Every runtime node priced alone (what the extractor sums; no fusion), plus one session's fixed overhead."""
    const = graph.weight_only()
    singles = [item_of(graph, graph.nodes[i], const) for i in runtime_nodes(graph)]
    cost.prefetch(singles)
    return sum(cost(n, s, c) for n, s, c in singles) + cost.baseline_ms


def kernel_unit(kernel: Kernel) -> Unit | None:
    """The unit a kernel is priced by (`tensat.measure.pricing_unit`), or None for an opaque op (priced by the
    cost model's own fallback)."""
    _, (node, shapes, const) = kernel
    return None if node.op == "opaque" else pricing_unit(node, shapes, const)


def fused_graph_cost(graph: Graph, cost: MeasuredCost, per_node: bool = True) -> GraphCost:
    """Sum of the graph's kernels as onnxruntime runs them (`tensat.cost.runtime_kernels`), plus one session's fixed
    overhead (and, unless `per_node` is False, the plain per-node sum beside it)."""
    kernels = runtime_kernels(graph, device_of(cost))
    cost.prefetch([item for _, item in kernels])
    priced: list[GroupCost] = []
    analytic = 0
    for kernel in kernels:
        members, (node, shapes, const) = kernel
        ms = cost(node, shapes, const)
        unit = kernel_unit(kernel)
        detail = {"fallback": "analytic"} if unit is None else cost.detail(unit)
        analytic += int(detail.get("fallback") == "analytic")
        label = "+".join(graph.nodes[m].op for m in members)
        priced.append(GroupCost(members, label, ms, detail))
    base = cost.baseline_ms
    node_sum = per_node_cost(graph, cost) if per_node else float("nan")
    return GraphCost(sum(g.ms for g in priced) + base, base, node_sum, priced, analytic)


# ---------------------------------------------------------------------------------------------------------------
# The accuracy report


@dataclass
class ReportRow:
    """Summed cost beside measured end-to-end latency for one graph."""

    graph: str
    summed_ms: float
    per_node_ms: float
    e2e_ms: float
    e2e_spread: float
    ops: int
    fused_groups: int
    analytic_nodes: int
    by_label: dict[str, float] = field(default_factory=dict)

    @property
    def error(self) -> float:
        """(summed - measured) / measured."""
        return (self.summed_ms - self.e2e_ms) / self.e2e_ms if self.e2e_ms > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph,
            "summed_ms": self.summed_ms,
            "per_node_ms": None if math.isnan(self.per_node_ms) else self.per_node_ms,
            "e2e_ms": self.e2e_ms,
            "e2e_spread": self.e2e_spread,
            "error": self.error,
            "ops": self.ops,
            "fused_groups": self.fused_groups,
            "analytic_nodes": self.analytic_nodes,
            "by_label": {k: round(v, 5) for k, v in self.by_label.items()},
        }


@dataclass
class Report:
    """Rows for the original and (optionally) the optimized graph, and the interleaved speed comparison."""

    name: str
    rows: list[ReportRow]
    speedup: float | None
    device: Mapping[str, Any]
    seconds: float
    notes: list[str] = field(default_factory=list)
    latency: list[Any] = field(default_factory=list, repr=False)  # LatencyStats of the timed graphs, in row order

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rows": [r.to_dict() for r in self.rows],
            "speedup": self.speedup,
            "device": dict(self.device),
            "seconds": self.seconds,
            "notes": list(self.notes),
        }

    def format(self) -> str:
        """A plain-text table."""
        lines = [
            f"cost report: {self.name}",
            f"{'graph':<10} {'ops':>5} {'fused':>5} {'summed ms':>10} {'per-node ms':>11} "
            f"{'end-to-end ms':>13} {'error':>7}",
        ]
        for r in self.rows:
            per_node = "-" if math.isnan(r.per_node_ms) else f"{r.per_node_ms:.3f}"
            lines.append(
                f"{r.graph:<10} {r.ops:>5} {r.fused_groups:>5} {r.summed_ms:>10.3f} {per_node:>11} "
                f"{r.e2e_ms:>13.3f} {r.error:>+7.1%}"
            )
        if self.speedup is not None:
            lines.append(f"optimized vs original (interleaved medians): {self.speedup:.3f}x")
        flagged = sum(r.analytic_nodes for r in self.rows)
        if flagged:
            lines.append(
                f"{flagged} node(s) priced by the analytic estimate (opaque ops or units onnxruntime could not run)"
            )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def end_to_end(
    models: Sequence[ModelProto],
    cost: MeasuredCost,
    *,
    runs: int = 60,
    block: int = 10,
    max_seconds: float = 60.0,
    clock: str | None = None,
    sessions: int = 1,
) -> list[Any]:
    """Block-interleaved end-to-end latency of `models` with the cost model's device, threads and clock, each model
    in `sessions` sessions taking turns (`tensat.latency.Interleaved`)."""
    return time_models(
        list(models),
        provider=cost.device,
        threads=cost.threads,
        runs=runs,
        block=block,
        max_seconds=max_seconds,
        clock=clock or cost.clock,
        copies=sessions,
    )


def _graph_units(graph: Graph, device: str) -> list[Unit]:
    """The units of the graph's kernels (opaque ops are priced by the cost model's fallback)."""
    return [u for kernel in runtime_kernels(graph, device) if (u := kernel_unit(kernel)) is not None]


def interleaved_end_to_end(
    models: Sequence[ModelProto],
    pricing: MeasuredCost,
    units: Sequence[Unit],
    *,
    runs: int = 60,
    block: int = 10,
    max_seconds: float = 60.0,
    sessions: int = 1,
) -> list[Any]:
    """Measure `units` with `pricing` while timing `models` end to end in between: after every timing window of a
    unit the models run in turns (blocks of `block`) until the time spent on them has caught up with the time spent
    measuring, so summed costs and end-to-end latency are taken under the same load from other processes. Then
    more turns until every model has `runs` counted runs (for at most `max_seconds` more). Each model runs in
    `sessions` sessions taking turns (`tensat.latency.Interleaved`): sessions of one model run at speeds that
    differ with where their memory lies, and one session's time would partly be that draw."""
    timed = Interleaved(
        list(models),
        provider=pricing.device,
        threads=pricing.threads,
        block=block,
        clock=pricing.clock,
        copies=sessions,
    )
    measuring = 0.0
    mark = time.perf_counter()

    def catch_up() -> None:
        nonlocal measuring, mark
        measuring += time.perf_counter() - mark
        while timed.seconds < measuring:
            timed.turn()
        mark = time.perf_counter()

    pricing.prefetch_units(units, between=catch_up)
    start = time.perf_counter()
    while timed.runs < runs and (timed.runs < 5 or time.perf_counter() - start < max_seconds):
        timed.turn()
    return timed.stats()


def cost_report(
    original: Graph,
    cost: MeasuredCost,
    *,
    optimized: Graph | None = None,
    name: str = "model",
    runs: int = 60,
    block: int = 10,
    max_seconds: float = 60.0,
    per_node: bool = True,
    fresh: bool = True,
    windows: int = 3,
    window_seconds: float = 0.3,
    sessions: int = 1,
) -> Report:
    """Summed measured cost beside measured end-to-end latency for `original` (and `optimized`, timed in blocks
    interleaved with it); the working set of the cost model is taken from `original`.

    With `fresh` (the default) every fused group is measured again now, in `windows` windows of about
    `window_seconds` each (every window sweeping all groups of both graphs), interleaved with the graphs'
    end-to-end runs (`interleaved_end_to_end`): on a shared machine latency moves by tens of percent from one
    minute to the next, so a sum of costs taken at another time says little about today's end-to-end figure.
    Without it the costs come from `cost` (its cache) and the graphs are timed afterwards. The per-node sum is
    priced with `cost` either way. Each graph runs in `sessions` sessions taking turns (`interleaved_end_to_end`)."""
    start = time.perf_counter()
    original = original.compact()
    cost.observe_graph(original)
    graphs = [("original", original)] + ([("optimized", optimized.compact())] if optimized is not None else [])
    models = [export_model(g) for _, g in graphs]
    node_sums = [per_node_cost(g, cost) if per_node else float("nan") for _, g in graphs]
    units = [u for _, g in graphs for u in _graph_units(g, cost.device)]
    pricing = cost
    if fresh:  # one chunk: every window sweeps all groups, so each group's windows span the whole timing
        pricing = cost.uncached(windows=windows, max_seconds=window_seconds * windows, chunk=max(len(units), 1))
    if fresh:
        stats = interleaved_end_to_end(
            models, pricing, units, runs=runs, block=block, max_seconds=max_seconds, sessions=sessions
        )
    else:
        pricing.prefetch_units(units)
        stats = end_to_end(models, cost, runs=runs, block=block, max_seconds=max_seconds, sessions=sessions)
    rows = []
    for (label, g), s, node_sum in zip(graphs, stats, node_sums):
        gc = fused_graph_cost(g, pricing, per_node=False)
        rows.append(
            ReportRow(
                label,
                gc.total_ms,
                node_sum,
                s.median_ms,
                s.spread,
                g.op_count(),
                gc.fused_groups,
                gc.analytic_nodes,
                gc.by_label(),
            )
        )
    speedup = stats[0].median_ms / stats[1].median_ms if len(stats) > 1 and stats[1].median_ms > 0 else None
    notes = []
    if fresh:
        notes.append(
            f"costs measured afresh ({windows} windows per group) between end-to-end runs ({stats[0].runs} per graph)"
        )
    errors = pricing.stats.errors + (cost.stats.errors if fresh else [])
    if errors:
        notes.append(f"{len(errors)} unit(s) could not be measured: {errors[0]}")
    return Report(name, rows, speedup, pricing.describe(), time.perf_counter() - start, notes, list(stats))


def load_graph(
    source: str | os.PathLike[str] | ModelProto | Graph, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Graph:
    """An IR graph from a Graph, ModelProto or .onnx path; a model is read as `tensat optimize` reads its input, as
    the kernels onnxruntime runs it as (a GELU or a LayerNorm written out is the kernel onnxruntime fuses it into),
    so that its price is the price the search starts from."""
    if isinstance(source, Graph):
        return source.compact()
    model = onnx_io.load_model(source, input_shapes)
    return onnx_io.import_model(model, runtime_fusions=True).compact()
