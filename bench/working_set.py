"""How warm a transformer's weights are inside its graph, against the working set tensat prices them at.

    python -m bench.working_set                            # five transformers of the corpus
    python -m bench.working_set --only llama --out-dir DIR

A unit with weights is priced with the rest of the graph's working set (`tensat.measure.graph_working_set`: the
weights and every tensor the graph computes) read through the caches before each timed run. For each model, on a
cold cost cache, one intra-op thread:

- *priced*: the summed price of its matrix products by a weight (with their bias, as onnxruntime runs them) with
  the working set set to each size of `SIZES` in turn;
- *in the graph*: the model end to end, against the model with each such product replaced by a copy of its input
  (a Slice of the last axis, the input first tiled by Concat where the product widens it), timed in turns in one
  process; the difference, plus the copies' own prices, is what the products take inside the graph;
- the working set at which the priced sum equals that time (interpolated in the logarithm of the size): the one
  the graph's weights behave as. Beside it: the working set tensat takes, and the weights' alone.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, helper, numpy_helper

from bench.machine import header
from bench.real_models import per_model_parser, per_model_report
from tensat.cost import runtime_kernels
from tensat.cost_report import kernel_unit, load_graph
from tensat.ir import Graph
from tensat.latency import time_models
from tensat.measure import MeasuredCost, graph_traffic, make_measured_cost
from tensat.onnx_io import export_model

MODELS = ("bert", "gpt2", "llama", "deberta_v2", "t5_encoder")
SIZES = (8, 11, 16, 22, 32, 45, 64)  # MiB, quarter-octave buckets as `tensat.measure` rounds working sets to
RUNS = 300  # end-to-end runs of each variant, in blocks of BLOCK
BLOCK = 10
MIB = 2**20


def _products(model: ModelProto) -> list[tuple[onnx.NodeProto, onnx.NodeProto | None, int, int]]:
    """The MatMuls and Gemms by an initializer of `model`, each with the Add of an initializer that alone reads
    its output (its bias, fused with it by onnxruntime) or None, and its input and output widths."""
    weights = {i.name: i for i in model.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    found = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or node.input[1] not in weights:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("transA"):
            continue
        dims = list(weights[node.input[1]].dims)
        k, n = (dims[-1], dims[-2]) if attrs.get("transB") else (dims[-2], dims[-1])
        users = readers.get(node.output[0], [])
        bias = users[0] if len(users) == 1 and users[0].op_type == "Add" else None
        if bias is not None and not any(x in weights for x in bias.input):
            bias = None
        if node.op_type == "Gemm" and len(node.input) > 2:
            bias = None
        found.append((node, bias, k, n))
    return found


def without_products(model: ModelProto) -> tuple[ModelProto, int]:
    """`model` with each matrix product by a weight (and its bias) replaced by a copy of its input of the product's
    output width, and how many were replaced."""
    out = ModelProto()
    out.CopyFrom(model)
    products = _products(model)
    replaced: dict[str, list[onnx.NodeProto]] = {}
    dropped: set[str] = set()
    for k, (node, bias, width_in, width_out) in enumerate(products):
        tag = f"tensat_copy_{k}"
        x = node.input[0]
        nodes = []
        if width_out > width_in:
            tiled = f"{tag}_tiled"
            nodes.append(helper.make_node("Concat", [x] * -(-width_out // width_in), [tiled], axis=-1))
            x = tiled
        for name, value in (("starts", 0), ("ends", width_out), ("axes", -1)):
            out.graph.initializer.append(numpy_helper.from_array(np.array([value], np.int64), f"{tag}_{name}"))
        result = bias.output[0] if bias is not None else node.output[0]
        nodes.append(helper.make_node("Slice", [x, f"{tag}_starts", f"{tag}_ends", f"{tag}_axes"], [result]))
        replaced[node.output[0]] = nodes
        if bias is not None:
            dropped.add(bias.output[0])
    kept = []
    for node in out.graph.node:
        if node.output[0] in dropped:
            continue
        kept.extend(replaced.get(node.output[0], [node]))
    del out.graph.node[:]
    out.graph.node.extend(kept)
    used = {name for node in out.graph.node for name in node.input}
    inits = [i for i in out.graph.initializer if i.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(inits)
    onnx.checker.check_model(out)
    return out, len(products)


def _is_product(kernel: Any) -> bool:
    """Whether a kernel is a matrix product by a weight (with or without its bias)."""
    unit = kernel_unit(kernel)
    return unit is not None and unit.ops[0] == "matmul" and unit.weighted


def _priced(cost: MeasuredCost, graph: Graph, keep: Any = None) -> float:
    """The summed price (ms) of the graph's kernels that `keep` accepts (every kernel without it)."""
    kernels = [k for k in runtime_kernels(graph, cost.device) if keep is None or keep(k)]
    cost.prefetch([item for _, item in kernels])
    return sum(cost(*item) for _, item in kernels)


def _behaves_as(sizes: Sequence[float], priced: Sequence[float], target: float) -> float | None:
    """The working set (MiB) at which the priced sums, rising with `sizes`, reach `target`, interpolated in the
    logarithm of the size; None outside the range measured."""
    for (s0, p0), (s1, p1) in zip(zip(sizes, priced), zip(sizes[1:], priced[1:])):
        if min(p0, p1) <= target <= max(p0, p1) and p0 != p1:
            return math.exp(math.log(s0) + (target - p0) / (p1 - p0) * (math.log(s1) - math.log(s0)))
    return None


def model_record(path: Path) -> dict[str, Any]:
    """One model: its products priced at each working set, their time in the graph, and the working sets."""
    graph = load_graph(path)
    model = export_model(graph)
    variant, count = without_products(model)
    variant_graph = load_graph(variant)
    stats = time_models([model, variant], threads=1, runs=RUNS, block=BLOCK, clock="cpu", max_seconds=120)
    with tempfile.TemporaryDirectory(prefix="tensat-working-set-") as tmp:
        cost = make_measured_cost("cpu", os.path.join(tmp, "costs.sqlite3"), progress=False, threads=1)
        cost.observe_graph(graph)
        taken = cost.working_set or 0
        weights, _ = graph_traffic(graph)
        copies = _priced(cost, variant_graph) - _priced(cost, graph, lambda k: not _is_product(k))
        priced = []
        for size in SIZES:
            cost.working_set = size * MIB
            priced.append(_priced(cost, graph, _is_product))
        cost.working_set = taken
        at_taken = _priced(cost, graph, _is_product)
    in_graph = stats[0].median_ms - stats[1].median_ms + copies
    return {
        "model": path.stem,
        "products": count,
        "weights_mib": round(weights / MIB, 1),
        "working_set_mib": round(taken / MIB, 1),
        "sizes_mib": list(SIZES),
        "priced_ms": priced,
        "priced_at_working_set_ms": at_taken,
        "end_to_end_ms": stats[0].median_ms,
        "without_products_ms": stats[1].median_ms,
        "copies_ms": copies,
        "in_graph_ms": in_graph,
        "behaves_as_mib": _behaves_as(SIZES, priced, in_graph),
    }


def render(records: Sequence[dict[str, Any]], info: dict[str, Any]) -> str:
    """The markdown report: one row per model."""
    sizes = records[0]["sizes_mib"] if records else list(SIZES)
    lines = [
        "# The working set a transformer's weights behave as",
        "",
        header(info),
        "",
        "One intra-op thread, CPU, each model on a cold cost cache. *products*: the matrix products by a weight "
        "(with their bias); *priced at N*: their summed price (ms) with a working set of N MiB read through the "
        "caches between two runs of a unit; *in the graph*: the model end to end less the model with each product "
        "replaced by a copy of its input, plus the copies' prices (ms, medians of interleaved blocks); *behaves "
        "as*: the working set at which the priced sum equals that time. See `bench/working_set.py`.",
        "",
        "| model | products | weights (MiB) | tensat's working set (MiB) | priced there (ms) | in the graph (ms) "
        "| behaves as (MiB) | " + " | ".join(f"priced at {s}" for s in sizes) + " |",
        "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(sizes),
    ]
    for r in records:
        behaves = f"{r['behaves_as_mib']:.0f}" if r["behaves_as_mib"] is not None else "outside"
        lines.append(
            f"| {r['model']} | {r['products']} | {r['weights_mib']:.1f} | {r['working_set_mib']:.1f} "
            f"| {r['priced_at_working_set_ms']:.3f} | {r['in_graph_ms']:.3f} | {behaves} | "
            + " | ".join(f"{p:.3f}" for p in r["priced_ms"])
            + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    return per_model_report(per_model_parser("working_set", __doc__, MODELS).parse_args(argv), model_record, render)


if __name__ == "__main__":
    sys.exit(main())
