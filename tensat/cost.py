"""Cost models: what an operator costs to run, in milliseconds.

The analytic model is a roofline (FLOPs against peak compute, bytes against memory bandwidth, plus a fixed
per-op launch overhead). It is deterministic, so tests and `--cost analytic` can rely on it; the measured model
(onnxruntime on the target device) replaces it where real costs matter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from tensat import ops
from tensat.ir import Graph, Node
from tensat.onnx.fusions import as_run

Shape = tuple[int, ...]


class CostModel(Protocol):
    """Anything that prices one node, in milliseconds, given its input shapes and which inputs are weights.

    A cost model may also offer `prefetch(items, deadline=None)` with items `(node, in_shapes, const)`: the
    pipeline calls it once with every node it is about to price, so a measuring model can batch its work and show
    progress. It returns the indices of the items it left unpriced because `deadline` (a `time.perf_counter()`
    value) passed. It may also declare `resolution` (a `Resolution`): how far apart two of its prices must be to
    tell them apart; without it prices are exact.
    """

    @property
    def name(self) -> str: ...  # read only, so a frozen dataclass's field satisfies it

    def __call__(self, node: Node, in_shapes: Sequence[Shape], const: Sequence[bool] = ()) -> float: ...


class Resolution(NamedTuple):
    """How far apart two prices must be to be told apart: `relative` of the price plus `ms` milliseconds."""

    relative: float
    ms: float


EXACT = Resolution(0.0, 0.0)  # an estimate that computes: equal prices are equal work


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
        d = ops.get(node.op)
        if d.leaf or d.view:  # a view op: onnxruntime runs it without touching the data
            return 0.0
        flops = d.flops(in_shapes, node.shape, node.attr)
        moved = sum(_bytes(s) for s in in_shapes) + _bytes(node.shape)
        seconds = max(flops / (self.peak_gflops * 1e9), moved / (self.bandwidth_gbs * 1e9))
        return seconds * 1e3 + self.overhead_us * 1e-3


Item = tuple[Node, list[Shape], list[bool]]


def _priced(items: Sequence[Item], cost: CostModel) -> float:
    prefetch = getattr(cost, "prefetch", None)
    if prefetch is not None:
        prefetch(items)
    return sum(cost(n, shapes, flags) for n, shapes, flags in items)


def graph_cost(graph: Graph, cost: CostModel) -> float:
    """Summed cost of the graph's live nodes that run at inference (weight-only nodes are folded away)."""
    const = graph.weight_only()
    items = [
        (n, [graph.nodes[j].shape for j in n.inputs], [j in const for j in n.inputs])
        for i in graph.live()
        if not (n := graph.nodes[i]).is_leaf and i not in const
    ]
    return _priced(items, cost)


def device_of(cost: object) -> str:
    """The device `cost` prices for ("cpu" for a model that names none, as the analytic one)."""
    return str(getattr(cost, "device", "cpu"))


def runtime_cost(graph: Graph, cost: CostModel) -> float:
    """Summed cost of the graph as onnxruntime runs it: read with the fusions it makes of any graph as the ops they
    are (`tensat.onnx.fusions.as_run`: a convolution with its activation, a `gemm`), each priced as one kernel, so
    that no gain the runtime already gets for free is claimed."""
    return graph_cost(as_run(graph), cost)
