"""Cost models: what an operator costs to run, in milliseconds.

The analytic model is a roofline (FLOPs against peak compute, bytes against memory bandwidth, plus a fixed
per-op launch overhead). It is deterministic, so tests and `--cost analytic` can rely on it; the measured model
(onnxruntime on the target device) replaces it where real costs matter.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from tensat import ops
from tensat.ir import Graph, Node

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


# Activations onnxruntime fuses into the Conv before them (FusedConv), as conv2d's fused activation code. A
# convolution with one is priced as the plain convolution by every cost model: onnxruntime applies the activation
# in the convolution's output loop, at no cost worth a measurement, so a Conv and the Relu it fuses price as the
# Conv alone (`runtime_fusions`), and writing the fusion into the graph (`conv-relu-fuse`) gains nothing.
FUSED_ACTIVATIONS = {name: code for name, code in ops.ACT_CODES.items() if code != ops.ACT_NONE}


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


def _leading_ones(shape: Sequence[int], keep: int) -> bool:
    """Whether `shape` has at least `keep` dims and only 1s before its last `keep`."""
    return len(shape) >= keep and all(d == 1 for d in shape[: len(shape) - keep])


def gemm_bias(product: Sequence[int], weight: Sequence[int], bias: Sequence[int]) -> bool:
    """Whether adding a constant of shape `bias` to the output (of shape `product`) of a MatMul by a constant of
    shape `weight` is a bias onnxruntime's CPU session fuses with the MatMul into a Gemm: the weight a matrix (after
    leading 1s, which tensat's export drops) and the bias a vector of the product's last dim (or, for a 2-D product,
    a row). The Add must not broadcast the product, and be the MatMul's only reader (see onnxruntime's
    MatMulAddFusion)."""
    return len(product) >= 2 and _leading_ones(weight, 2) and _leading_ones(bias, 1) and bias[-1] == product[-1]


Operand = tuple[Shape, bool]  # an operand's shape, and whether it is computable from weights alone
FUSION_PRODUCERS = frozenset({"conv2d", "matmul"})  # the ops `fuses_into` fuses a reader into
FUSION_READERS = frozenset({*FUSED_ACTIVATIONS, "batchnorm", "add"})  # the ops it may fuse into their producer


def fuses_into(
    op: str,
    shape: Shape,
    operands: Sequence[Operand],
    k: int,
    producer_op: str,
    producer_attrs: Mapping[str, Any],
    producer_operands: Sequence[Operand],
    device: str,
) -> bool:
    """Whether onnxruntime on `device` runs a node (`op`, of output `shape`, over `operands`) fused into the node
    computing its operand `k` (`producer_op` with `producer_attrs`, over `producer_operands`), where it is that
    operand's only reader: a BatchNormalization with constant parameters, or a Relu, Sigmoid or Tanh, into a
    convolution without an activation; on the CPU, the Add of a constant bias into a MatMul of a computed operand by
    a constant matrix (a Gemm, see `gemm_bias`). Every pricing of a graph as onnxruntime runs it decides by this: the
    graph's own (`runtime_fusions`), the extraction's and the sequential search's."""
    if producer_op == "conv2d":
        return (
            k == 0
            and producer_attrs.get("act") == ops.ACT_NONE
            and (op in FUSED_ACTIVATIONS or (op == "batchnorm" and all(c for _, c in operands[1:])))
        )
    if producer_op == "matmul" and op == "add" and device == "cpu" and len(operands) == 2:
        (_, a_const), (weight, w_const) = producer_operands
        product, (bias, b_const) = operands[k][0], operands[1 - k]
        return not a_const and w_const and b_const and shape == product and gemm_bias(product, weight, bias)
    return False


def pads_into_conv(pad: Node) -> bool:
    """Whether onnxruntime takes the Pad `pad` into the pads of a Conv that is its only reader (its PadFusion):
    zeros added on the spatial axes only."""
    p, r = pad.attr["pads"], len(pad.shape)
    return pad.attr["value"] == 0.0 and min(p) >= 0 and not any(p[a] or p[a + r] for a in (0, 1))


def runtime_fusions(graph: Graph, device: str = "cpu") -> tuple[dict[int, int], dict[int, int]]:
    """What onnxruntime fuses in `graph` on its own on `device` (`fuses_into`): each node folded or fused into the
    node before it, its only reader -> that node (a BatchNormalization, then an activation, into a convolution; on
    the CPU a bias Add into a MatMul), and each convolution -> the activation code fused into it. A Pad of zeros
    before a convolution, its only reader, maps to that convolution (`pads_into_conv`): it runs as the
    convolution's own padding, whose work the convolution's price already counts."""
    const = graph.weight_only()
    live = [i for i in graph.live() if not graph.nodes[i].is_leaf and i not in const]
    outputs = {n for _, n in graph.outputs}
    readers = graph.readers(live)

    def operands(n: Node) -> list[Operand]:
        return [(graph.nodes[j].shape, j in const) for j in n.inputs]

    owner: dict[int, int] = {}  # a folded or fused node -> the conv2d or matmul that absorbs it
    act: dict[int, int] = {}  # a conv2d -> the activation fused into it
    for i in live:
        n = graph.nodes[i]
        if n.op == "pad" and i not in outputs and len(rs := readers.get(i, [])) == 1:
            conv = graph.nodes[rs[0]]
            if conv.op == "conv2d" and conv.inputs[0] == i and pads_into_conv(n):
                owner[i] = rs[0]
            continue
        for k, x in enumerate(n.inputs):
            if x in const or x in outputs or len(readers.get(x, ())) != 1:
                continue
            p = owner.get(x, x)  # through a BatchNormalization folded into its convolution
            producer = graph.nodes[p]
            if p in act or (p != x and n.op not in FUSED_ACTIVATIONS):
                continue
            if fuses_into(n.op, n.shape, operands(n), k, producer.op, producer.attr, operands(producer), device):
                owner[i] = p
                if n.op in FUSED_ACTIVATIONS:
                    act[p] = FUSED_ACTIVATIONS[n.op]
                break
    return owner, act


def runtime_items(graph: Graph, device: str = "cpu") -> list[Item]:
    """The graph's runtime nodes as onnxruntime runs them on `device`, for pricing (`runtime_fusions`): a Conv's
    only reader, if a BatchNormalization with constant parameters, is folded into it, and then its only reader, if
    a Relu, Sigmoid or Tanh, is fused into it; on the CPU, a MatMul's bias Add is fused into it (a Gemm). onnxruntime
    does these on its own whatever graph it is given, so a cost that counted them apart would credit an optimization
    with gains the runtime gets for free, and would not see a rewrite that leaves the runtime unable to fuse."""
    const = graph.weight_only()
    owner, act = runtime_fusions(graph, device)
    items: list[Item] = []
    for i in graph.live():
        n = graph.nodes[i]
        if n.is_leaf or i in const or i in owner:
            continue
        if i in act:
            n = Node(n.op, n.inputs, tuple((k, act[i] if k == "act" else v) for k, v in n.attrs), n.shape, n.dtype)
        items.append((n, [graph.nodes[j].shape for j in n.inputs], [j in const for j in n.inputs]))
    return items


def device_of(cost: object) -> str:
    """The device `cost` prices for ("cpu" for a model that names none, as the analytic one)."""
    return str(getattr(cost, "device", "cpu"))


def runtime_cost(graph: Graph, cost: CostModel) -> float:
    """Summed cost of the graph as onnxruntime runs it (`runtime_items`): the cost a run reports before and after,
    so that no gain the runtime already gets for free is claimed."""
    return _priced(runtime_items(graph, device_of(cost)), cost)
