"""Cost models: what an operator costs to run, in milliseconds.

The analytic model is a roofline (FLOPs against peak compute, bytes against memory bandwidth, plus a fixed
per-op launch overhead). It is deterministic, so tests and `--cost analytic` can rely on it; the measured model
(onnxruntime on the target device) replaces it where real costs matter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

from tensat import ops
from tensat.ir import Graph, Node

Shape = tuple[int, ...]

# Ops that onnxruntime runs without touching the data.
VIEW_OPS = {"reshape"}


class CostModel(Protocol):
    """Anything that prices one node, in milliseconds, given its input shapes and which inputs are weights.

    A cost model may also offer `prefetch(items)` with items `(node, in_shapes, const)`: the pipeline calls it
    once with every node it is about to price, so a measuring model can batch its work and show progress.
    """

    name: str

    def __call__(self, node: Node, in_shapes: Sequence[Shape], const: Sequence[bool] = ()) -> float: ...


def _bytes(shape: Sequence[int], itemsize: int = 4) -> float:
    return float(math.prod(shape)) * itemsize


@dataclass(frozen=True)
class AnalyticCost:
    """Roofline cost: max(FLOPs / peak, bytes / bandwidth) + overhead, in milliseconds."""

    peak_gflops: float = 40.0
    bandwidth_gbs: float = 12.0
    overhead_us: float = 3.0
    name: str = "analytic"

    def __call__(self, node: Node, in_shapes: Sequence[Shape], const: Sequence[bool] = ()) -> float:
        if node.op in ("input", "weight") or node.op in VIEW_OPS:
            return 0.0
        flops = ops.get(node.op).flops(in_shapes, node.shape, node.attr)
        moved = sum(_bytes(s) for s in in_shapes) + _bytes(node.shape)
        seconds = max(flops / (self.peak_gflops * 1e9), moved / (self.bandwidth_gbs * 1e9))
        return seconds * 1e3 + self.overhead_us * 1e-3


def graph_cost(graph: Graph, cost: CostModel) -> float:
    """Summed cost of the graph's live nodes that run at inference (weight-only nodes are folded away)."""
    const = graph.weight_only()
    items = [
        (n, [graph.nodes[j].shape for j in n.inputs], [j in const for j in n.inputs])
        for i in graph.live()
        if not (n := graph.nodes[i]).is_leaf and i not in const
    ]
    prefetch = getattr(cost, "prefetch", None)
    if prefetch is not None:
        prefetch(items)
    return sum(cost(n, shapes, flags) for n, shapes, flags in items)
