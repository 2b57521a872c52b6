"""How well summed measured costs predict end-to-end latency: fusion-aware graph costs and the accuracy report.

onnxruntime does not run a graph node by node: it fuses Conv+activation (FusedConv), MatMul+Add(+activation) into
Gemm/FusedGemm, Transpose into a following MatMul (FusedMatMul), and on CPU a Conv followed by a residual Add (and
Relu) into one blocked convolution. `fusion_groups` finds those groups in an IR graph (a node joins its consumer's
group only when that consumer is its only reader), and `fused_graph_cost` prices every group as one unit, timed as
onnxruntime runs it (the group's own model, fused by onnxruntime itself), plus the fixed per-run overhead of a
session. `cost_report` sets that sum beside the graph's measured end-to-end latency, for the original graph and
the tensat-optimized one, measuring the groups afresh between the graphs' end-to-end runs (on a shared machine
latency moves by tens of percent from one minute to the next, so both figures must be taken under the same load).
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
from tensat.cost import FUSED_ACTIVATIONS
from tensat.ir import Graph
from tensat.latency import Interleaved, time_models
from tensat.measure import MeasuredCost, Unit, UnitNode
from tensat.onnx_io import export_model

ACTIVATIONS = tuple(FUSED_ACTIVATIONS)  # the ops onnxruntime fuses into a Conv before them


def runtime_nodes(graph: Graph) -> list[int]:
    """Live nodes that run at inference (not inputs, weights or weight-only nodes), in topological order."""
    const = graph.weight_only()
    return [i for i in graph.live() if not graph.nodes[i].is_leaf and i not in const]


def fusion_groups(graph: Graph) -> list[list[int]]:
    """A partition of the runtime nodes into the groups onnxruntime fuses (singletons elsewhere), each in
    topological order with the group's output last."""
    const = graph.weight_only()
    nodes = runtime_nodes(graph)
    readers = graph.readers(nodes)
    outputs = {n for _, n in graph.outputs}
    owner: dict[int, int] = {}
    groups: dict[int, list[int]] = {}

    def only_reader(i: int) -> int | None:
        rs = readers.get(i, [])
        return rs[0] if len(rs) == 1 and i not in outputs else None

    def take(members: list[int]) -> None:
        root = members[-1]
        groups[root] = sorted(members)
        for m in members:
            owner[m] = root

    def free(i: int) -> bool:
        return i not in owner

    def extend_act(members: list[int]) -> None:
        nxt = only_reader(members[-1])
        if nxt is not None and free(nxt) and graph.nodes[nxt].op in ACTIVATIONS:
            members.append(nxt)

    for i in nodes:
        n = graph.nodes[i]
        if not free(i):
            continue
        if n.op == "conv2d" and n.attr["act"] == 0:
            nxt = only_reader(i)
            if nxt is None or not free(nxt):
                continue
            m = graph.nodes[nxt]
            if m.op in ACTIVATIONS:
                take([i, nxt])
            elif m.op == "add" and _residual_operand(graph, nxt, i, const):
                members = [i, nxt]
                extend_act(members)
                take(members)
        elif n.op == "matmul" and len(n.shape) == 2:
            nxt = only_reader(i)
            if nxt is None or not free(nxt) or graph.nodes[nxt].op != "add":
                continue
            first = min(
                (
                    j
                    for j in graph.nodes[nxt].inputs
                    if graph.nodes[j].op == "matmul"
                    and len(graph.nodes[j].shape) == 2
                    and only_reader(j) == nxt
                    and free(j)
                ),
                default=None,
            )
            if first != i:
                continue
            members = [i, nxt]
            extend_act(members)
            take(members)
    for i in nodes:
        n = graph.nodes[i]
        if n.op != "matmul" or not free(i):
            continue
        fused = [
            j
            for j in dict.fromkeys(n.inputs)
            if j not in const and graph.nodes[j].op == "transpose" and free(j) and only_reader(j) == i
        ]
        if fused:
            take(fused + [i])
    chains: dict[int, list[int]] = {}
    for i in nodes:
        n = graph.nodes[i]
        if n.op != "concat" or not free(i):
            continue
        root = i
        while True:
            nxt = only_reader(root)
            if (
                nxt is None
                or not free(nxt)
                or graph.nodes[nxt].op != "concat"
                or graph.nodes[nxt].attr["axis"] != n.attr["axis"]
            ):
                break
            root = nxt
        chains.setdefault(root, []).append(i)
    for root, members in chains.items():
        take(sorted(set(members) | {root}))
    for i in nodes:
        if free(i):
            take([i])
    return [groups[root] for root in sorted(groups)]


def _residual_operand(graph: Graph, add: int, conv: int, const: set[int]) -> bool:
    """The add's other operand is a computed tensor of the conv's shape (onnxruntime's Conv+Add "sum" fusion)."""
    others = [j for j in graph.nodes[add].inputs if j != conv]
    return len(others) == 1 and others[0] not in const and graph.nodes[others[0]].shape == graph.nodes[conv].shape


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
    singles = [
        (
            graph.nodes[i],
            [graph.nodes[j].shape for j in graph.nodes[i].inputs],
            [j in const for j in graph.nodes[i].inputs],
        )
        for i in runtime_nodes(graph)
    ]
    cost.prefetch(singles)
    return sum(cost(n, s, c) for n, s, c in singles) + cost.baseline_ms


def fused_graph_cost(graph: Graph, cost: MeasuredCost, per_node: bool = True) -> GraphCost:
    """Sum of the graph's fused groups as onnxruntime runs them, plus one session's fixed overhead (and, unless
    `per_node` is False, the plain per-node sum beside it)."""
    const = graph.weight_only()
    groups = fusion_groups(graph)
    units: list[Unit | None] = []
    for members in groups:
        first = graph.nodes[members[0]]
        units.append(None if len(members) == 1 and first.op == "opaque" else group_unit(graph, members, const))
    cost.prefetch_units([u for u in units if u is not None])
    priced: list[GroupCost] = []
    analytic = 0
    for members, unit in zip(groups, units):
        if unit is None:
            n = graph.nodes[members[0]]
            ms = cost(n, [graph.nodes[j].shape for j in n.inputs], [j in const for j in n.inputs])
            priced.append(GroupCost(members, "opaque", ms, {"fallback": "analytic"}))
            analytic += 1
            continue
        ms = cost.unit_cost(unit)
        detail = cost.detail(unit)
        analytic += int(detail.get("fallback") == "analytic")
        priced.append(GroupCost(members, unit.label(), ms, detail))
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
) -> list[Any]:
    """Block-interleaved end-to-end latency of `models` with the cost model's device, threads and clock."""
    return time_models(
        list(models),
        provider=cost.device,
        threads=cost.threads,
        runs=runs,
        block=block,
        max_seconds=max_seconds,
        clock=clock or cost.clock,
    )


def _graph_units(graph: Graph) -> list[Unit]:
    """The measurable units of a graph's fused groups (opaque singletons are priced analytically)."""
    const = graph.weight_only()
    units = []
    for members in fusion_groups(graph):
        if not (len(members) == 1 and graph.nodes[members[0]].op == "opaque"):
            units.append(group_unit(graph, members, const))
    return units


def interleaved_end_to_end(
    models: Sequence[ModelProto],
    pricing: MeasuredCost,
    units: Sequence[Unit],
    *,
    runs: int = 60,
    block: int = 10,
    max_seconds: float = 60.0,
) -> list[Any]:
    """Measure `units` with `pricing` while timing `models` end to end in between: after every timing window of a
    unit the models run in turns (blocks of `block`) until the time spent on them has caught up with the time spent
    measuring, so summed costs and end-to-end latency are taken under the same load from other processes. Then
    more turns until every model has `runs` counted runs (for at most `max_seconds` more)."""
    timed = Interleaved(
        list(models), provider=pricing.device, threads=pricing.threads, block=block, clock=pricing.clock
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
) -> Report:
    """Summed measured cost beside measured end-to-end latency for `original` (and `optimized`, timed in blocks
    interleaved with it); the working set of the cost model is taken from `original`.

    With `fresh` (the default) every fused group is measured again now, in `windows` windows of about
    `window_seconds` each (every window sweeping all groups of both graphs), interleaved with the graphs'
    end-to-end runs (`interleaved_end_to_end`): on a shared machine latency moves by tens of percent from one
    minute to the next, so a sum of costs taken at another time says little about today's end-to-end figure.
    Without it the costs come from `cost` (its cache) and the graphs are timed afterwards. The per-node sum is
    priced with `cost` either way."""
    start = time.perf_counter()
    original = original.compact()
    cost.observe_graph(original)
    graphs = [("original", original)] + ([("optimized", optimized.compact())] if optimized is not None else [])
    models = [export_model(g) for _, g in graphs]
    node_sums = [per_node_cost(g, cost) if per_node else float("nan") for _, g in graphs]
    units = [u for _, g in graphs for u in _graph_units(g)]
    pricing = cost
    if fresh:  # one chunk: every window sweeps all groups, so each group's windows span the whole timing
        pricing = cost.uncached(windows=windows, max_seconds=window_seconds * windows, chunk=max(len(units), 1))
    if fresh:
        stats = interleaved_end_to_end(models, pricing, units, runs=runs, block=block, max_seconds=max_seconds)
    else:
        pricing.prefetch_units(units)
        stats = end_to_end(models, cost, runs=runs, block=block, max_seconds=max_seconds)
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
    """An IR graph from a Graph, ModelProto or .onnx path."""
    if isinstance(source, Graph):
        return source.compact()
    model = onnx_io.load_model(source, input_shapes)
    return onnx_io.import_model(model).compact()
