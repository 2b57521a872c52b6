"""What each op type costs inside the whole graph, against what the cost model says it costs there.

    python -m bench.ablation                                  # four transformer models of the corpus
    python -m bench.ablation --only clip_vision --ops Transpose,Softmax --out-dir DIR

onnxruntime's profiler adds its own time to every kernel it records, which swamps kernels of a few microseconds, so
this bench does not read it. It removes the ops instead: in the model as tensat reads and writes it, every node of
one op type whose output holds as many elements as its first input becomes a Reshape of that input (a view: the
values change, the time of everything else does not). The ablated model is timed against the model, interleaved
(`tensat.latency.compare_many`), and its price is taken under the cost model (`tensat.cost_report.fused_graph_cost`
on a cold cost cache, the kernels onnxruntime runs). The op type's measured cost in the graph is the latency the
ablation saves, its predicted cost the price it saves; where the two differ, the units of that op type are timed
unlike how it runs in the graph.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, helper, numpy_helper

from bench.machine import header
from bench.real_models import per_model_parser, per_model_report
from tensat.cost_report import fused_graph_cost, load_graph
from tensat.latency import compare_many
from tensat.measure import make_measured_cost
from tensat.onnx_io import export_model
from tensat.verify import random_inputs, run_model

MODELS = ("clip_vision", "bert", "convnext", "swin")
VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})  # already views: nothing to remove
PAIRS = 200


def value_shapes(model: ModelProto) -> dict[str, tuple[tuple[int, ...], str]]:
    """The shape and dtype of every value of `model` (inputs, initializers, every node's outputs), from one
    onnxruntime run on seeded inputs: shape inference does not see through onnxruntime's own ops."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    names = [o for n in model.graph.node for o in n.output if o]
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(o) for o in names)
    feeds = random_inputs(model)
    values = {name: np.asarray(v) for name, v in run_model(probe, feeds, threads=1, keep=False).items()}
    values.update(feeds)
    values.update({t.name: numpy_helper.to_array(t) for t in model.graph.initializer})
    return {name: (tuple(v.shape), str(v.dtype)) for name, v in values.items()}


def as_views(
    model: ModelProto, op_type: str, shapes: dict[str, tuple[tuple[int, ...], str]] | None = None
) -> tuple[ModelProto, int]:
    """`model` with every node of `op_type` that has one output, of as many elements and the dtype of its first
    input, replaced by a Reshape of that input to the output's shape; and how many were replaced. A node with
    another input computed by the graph is kept: without it, what computes that input would be dead, and its time
    would go too."""
    shapes = value_shapes(model) if shapes is None else shapes
    weights = {t.name for t in model.graph.initializer}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    count = 0
    for n in out.graph.node:
        outs = [o for o in n.output if o]
        first = n.input[0] if n.input else ""
        if (
            n.op_type != op_type
            or len(outs) != 1
            or first not in shapes
            or outs[0] not in shapes
            or math.prod(shapes[first][0]) != math.prod(shapes[outs[0]][0])
            or shapes[first][1] != shapes[outs[0]][1]
            or any(i and i not in weights for i in n.input[1:])
        ):
            nodes.append(n)
            continue
        target = f"ablation_shape_{count}"
        out.graph.initializer.append(numpy_helper.from_array(np.array(shapes[outs[0]][0], np.int64), target))
        nodes.append(helper.make_node("Reshape", [first, target], outs, name=f"ablation_{count}"))
        count += 1
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, count


def model_record(path: Path, ops: Sequence[str] | None, pairs: int = PAIRS) -> dict[str, Any]:
    """Each op type of one model: nodes replaced, the price and the latency their removal saves."""
    model = export_model(load_graph(path))
    shapes = value_shapes(model)
    present = Counter(n.op_type for n in model.graph.node)
    wanted = [op for op in (ops or sorted(present)) if op in present and op not in VIEWS]
    ablated = [(op, *as_views(model, op, shapes)) for op in wanted]
    ablated = [(op, m, k) for op, m, k in ablated if k]
    with tempfile.TemporaryDirectory(prefix="tensat-ablation-") as cache:
        cost = make_measured_cost("cpu", os.path.join(cache, "costs.sqlite3"), progress=False, threads=1)
        base_graph = load_graph(model)
        cost.observe_graph(base_graph)
        price = fused_graph_cost(base_graph, cost, per_node=False).total_ms
        prices = [fused_graph_cost(load_graph(m), cost, per_node=False).total_ms for _, m, _ in ablated]
    timed = compare_many(model, [m for _, m, _ in ablated], threads=1, pairs=pairs, max_seconds=60.0 * len(ablated))
    rows = []
    for (op, _, count), ms, t in zip(ablated, prices, timed):
        low, high = t.interval
        rows.append(
            {
                "op": op,
                "nodes": present[op],
                "replaced": count,
                "predicted_us": (price - ms) * 1e3,
                "in_graph_us": (t.baseline_ms - t.baseline_ms / t.speedup) * 1e3,
                "in_graph_interval_us": [(t.baseline_ms - t.baseline_ms / s) * 1e3 for s in (low, high)],
                "pairs": t.pairs,
            }
        )
    run_ms = timed[0].baseline_ms if timed else math.nan
    return {"model": path.stem, "predicted_ms": price, "run_ms": run_ms, "ops": rows}


def render(records: Sequence[dict[str, Any]], info: dict[str, Any]) -> str:
    """The markdown report."""
    lines = [
        "# What each op type costs inside the graph",
        "",
        header(info),
        "",
        "One intra-op thread, CPU, each model on a cold cost cache, as tensat reads and writes it. For each op type, "
        "its nodes whose output holds as many elements as their first input are replaced by a Reshape of that input "
        "(a view). `in graph`: the latency that saves, timed interleaved against the model (95% interval); "
        "`predicted`: the price it saves under the cost model. A ratio above 1 is an op type that costs more in the "
        "graph than its units are priced. See `bench/ablation.py`.",
        "",
        "| model | op | replaced / nodes | predicted (us) | in graph (us) | 95% interval (us) | in graph / predicted |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        lines.append(
            f"| {r['model']} | whole model | | {r['predicted_ms'] * 1e3:.0f} | {r['run_ms'] * 1e3:.0f} | | "
            f"{r['run_ms'] / r['predicted_ms']:.2f} |"
        )
        for o in sorted(r["ops"], key=lambda o: -o["in_graph_us"]):
            low, high = o["in_graph_interval_us"]
            ratio = f"{o['in_graph_us'] / o['predicted_us']:.2f}" if o["predicted_us"] > 0 else "—"
            lines.append(
                f"| {r['model']} | {o['op']} | {o['replaced']} / {o['nodes']} | {o['predicted_us']:.0f} | "
                f"{o['in_graph_us']:.0f} | {low:.0f} to {high:.0f} | {ratio} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = per_model_parser("ablation", __doc__, MODELS)
    parser.add_argument("--ops", default="", help="comma-separated ONNX op types (default: every one that has nodes)")
    parser.add_argument("--pairs", type=int, default=PAIRS, help=f"pairs of timed blocks (default {PAIRS})")
    args = parser.parse_args(argv)
    ops = [op for op in args.ops.split(",") if op] or None
    return per_model_report(args, lambda path: model_record(path, ops, args.pairs), render)


if __name__ == "__main__":
    sys.exit(main())
