"""Cost models: what an operator costs to run, in milliseconds.

The analytic model is a roofline (FLOPs against peak compute, bytes against memory bandwidth, plus a fixed
per-op launch overhead). It is deterministic, so tests and `--cost analytic` can rely on it; the measured model
(onnxruntime on the target device) replaces it where real costs matter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from tensat import ops
from tensat.ir import Graph, Node, merged_concats
from tensat.session import nchwc_block

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Scalar:
    """A weight operand holding one repeated value (a `fill`) where that value decides the kernel onnxruntime runs
    (`OpDef.value_operands`): it counts as a weight (it is truthy, as `True` is), and a measuring model times its
    unit with the value."""

    value: float


@dataclass(frozen=True)
class Computed:
    """A computed operand (not a weight) whose layout the priced graph fixes: `blocked`, whether onnxruntime's CPU
    session holds it in its blocked NCHWc layout there (`blocked`). It is falsy, as `False` is: a plain `False`
    leaves the layout to the measuring model's estimate by the tensor's extent, which cannot tell a feature map a
    convolution computed from one of the same extent a Reshape of tokens made (SegFormer's decode head)."""

    blocked: bool

    def __bool__(self) -> bool:
        return False


# per operand: whether it is computable from weights alone (a `Scalar` where its value counts, a `Computed` where its
# layout is known)
Const = bool | Scalar | Computed


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

    def __call__(self, node: Node, in_shapes: Sequence[Shape], const: Sequence[Const] = ()) -> float: ...


class Resolution(NamedTuple):
    """How far apart two prices must be to be told apart: `relative` of the price plus `ms` milliseconds."""

    relative: float
    ms: float


EXACT = Resolution(0.0, 0.0)  # an estimate that computes: equal prices are equal work


# Activations onnxruntime fuses into the Conv before them (FusedConv), as conv2d's fused activation code. A Conv and
# the activation it fuses price as one kernel (`runtime_fusions`, `fused_item`), so writing the fusion into the graph
# (`conv-relu-fuse`) gains nothing.
FUSED_ACTIVATIONS = {name: code for name, code in ops.ACT_CODES.items() if code != ops.ACT_NONE}
# Activations onnxruntime fuses into the Conv before them whose parameters conv2d's activation code does not hold (a
# Clip's bounds, a LeakyRelu's slope).
PARAMETRIC_ACTIVATIONS = frozenset({"clip", "leakyrelu", "hardsigmoid"})
# Of the fused activations, those the convolution applies inside its own output loop (MLAS's Relu), at no cost a
# timing tells apart: a convolution with one is priced as the plain convolution. The others (Sigmoid, Tanh and the
# parametric ones) run as a pass over each block of the output after the convolution computed it, which over a
# large feature map costs a fifth to twice the convolution's own time: the convolution is timed with them.
IN_KERNEL_ACTIVATIONS = frozenset({"relu"})
# The attribute of a conv2d's pricing item that carries the parametric activation fused into it (its op and
# attributes, `fused_item`): a pricing item only, never a node of a graph
FUSED_READER = "fused_reader"


def _bytes(shape: Sequence[int], itemsize: int = 4) -> float:
    return float(math.prod(shape)) * itemsize


@dataclass(frozen=True)
class AnalyticCost:
    """Roofline cost: max(FLOPs / peak, bytes / bandwidth) + overhead, in milliseconds."""

    peak_gflops: float = 40.0
    bandwidth_gbs: float = 12.0
    overhead_us: float = 3.0
    name: str = "analytic"

    def __call__(self, node: Node, in_shapes: Sequence[Shape], const: Sequence[Const] = ()) -> float:
        d = ops.get(node.op)
        if d.leaf or d.view:  # a view op: onnxruntime runs it without touching the data
            return 0.0
        flops = d.flops(in_shapes, node.shape, node.attr)
        moved = sum(_bytes(s) for s in in_shapes) + _bytes(node.shape)
        seconds = max(flops / (self.peak_gflops * 1e9), moved / (self.bandwidth_gbs * 1e9))
        return seconds * 1e3 + self.overhead_us * 1e-3


Item = tuple[Node, list[Shape], list[Const]]


def item_of(graph: Graph, node: Node, const: set[int], layout: Mapping[int, int] | None = None) -> Item:
    """How `node` of `graph` is priced: its operands' shapes, and whether each is a weight (of `const`, the graph's
    weight-only nodes), a `Scalar` for a `fill` operand whose value decides the kernel; with `layout` (the graph's
    blocked tensors, `blocked`), each computed 4-D float operand is `Computed`, blocked or not."""
    values = ops.get(node.op).value_operands
    flags: list[Const] = []
    for k, j in enumerate(node.inputs):
        src = graph.nodes[j]
        if k in values and src.op == "fill":
            flags.append(Scalar(float(src.attr["value"])))
        elif j in const:
            flags.append(True)
        elif layout is not None and len(src.shape) == 4 and src.dtype == "float32":
            flags.append(Computed(j in layout))
        else:
            flags.append(False)
    return node, [graph.nodes[j].shape for j in node.inputs], flags


def _priced(items: Sequence[Item], cost: CostModel) -> float:
    prefetch = getattr(cost, "prefetch", None)
    if prefetch is not None:
        prefetch(items)
    return sum(cost(n, shapes, flags) for n, shapes, flags in items)


def graph_cost(graph: Graph, cost: CostModel) -> float:
    """Summed cost of the graph's live nodes that run at inference (weight-only nodes are folded away)."""
    const = graph.weight_only()
    items = [item_of(graph, n, const) for i in graph.live() if not (n := graph.nodes[i]).is_leaf and i not in const]
    return _priced(items, cost)


def _leading_ones(shape: Sequence[int], keep: int) -> bool:
    """Whether `shape` has at least `keep` dims and only 1s before its last `keep`."""
    return len(shape) >= keep and all(d == 1 for d in shape[: len(shape) - keep])


def gemm_bias(product: Sequence[int], weight: Sequence[int], bias: Sequence[int]) -> bool:
    """Whether adding a constant of shape `bias` to the N-D output (of shape `product`) of a MatMul by a constant of
    shape `weight` is a bias onnxruntime's CPU session fuses with the MatMul into a Gemm between two Reshapes: the
    weight a matrix (after leading 1s, which tensat's export drops) and the bias a vector of the product's last dim.
    The Add must not broadcast the product, and be the MatMul's only reader (see onnxruntime's MatMulAddFusion)."""
    return len(product) >= 2 and _leading_ones(weight, 2) and _leading_ones(bias, 1) and bias[-1] == product[-1]


Operand = tuple[Shape, bool]  # an operand's shape, and whether it is computable from weights alone
FUSION_PRODUCERS = frozenset({"conv2d", "matmul"})  # the ops `fuses_into` fuses a reader into
FUSION_READERS = frozenset(
    {*FUSED_ACTIVATIONS, *PARAMETRIC_ACTIVATIONS, "batchnorm", "add"}
)  # the ops it may fuse into their producer
FUSED_THROUGH = frozenset({"batchnorm", "add"})  # what an activation may be fused through into the node before it


def fuses_into(
    op: str,
    shape: Shape,
    operands: Sequence[Operand],
    k: int,
    producer_op: str,
    producer_attrs: Mapping[str, Any],
    producer_operands: Sequence[Operand],
    device: str,
    through: str | None = None,
) -> bool:
    """Whether onnxruntime on `device` runs a node (`op`, of output `shape`, over `operands`) fused into the node
    computing its operand `k` (`producer_op` with `producer_attrs`, over `producer_operands`), where it is that
    operand's only reader; with `through`, the operand is the output of a node of that op already fused into the
    producer (the producer's shapes and flags are its own). This is tensat's catalogue of the kernels onnxruntime
    makes on its own, whatever graph it is given:
    - into a convolution without an activation: a BatchNormalization with constant parameters, and a Relu, Sigmoid,
      Tanh, Clip, LeakyRelu or HardSigmoid (FusedConv), also through the BatchNormalization, or (a Relu, Sigmoid or
      Tanh) through an Add that
      `runtime_fusions` found summed into the convolution (onnxruntime's blocked layout, which only a whole graph
      shows);
    - on the CPU, into a MatMul: an Add that does not broadcast its product (a Gemm). A 2-D product takes any
      addend and any operands, and then an activation after the Add (FusedGemm); an N-D product only a constant bias
      (`gemm_bias`) over a computed operand times a constant matrix.

    Every pricing of a graph as onnxruntime runs it decides by this: the graph's own (`runtime_fusions`), the
    extraction's and the sequential search's."""
    if producer_op == "conv2d":
        if k != 0 or producer_attrs.get("act") != ops.ACT_NONE:
            return False
        if op in FUSED_ACTIVATIONS:  # through an Add only where `runtime_fusions` summed it into the convolution
            return through in (None, "batchnorm", "add")
        if op in PARAMETRIC_ACTIVATIONS:
            return through in (None, "batchnorm")
        return op == "batchnorm" and through is None and all(c for _, c in operands[1:])
    if producer_op != "matmul" or device != "cpu":
        return False
    if op in FUSED_ACTIVATIONS:
        return through == "add" and len(shape) == 2  # the shape of the Add, which does not broadcast the product
    if op != "add" or through is not None or len(operands) != 2 or shape != (product := operands[k][0]):
        return False
    if len(product) == 2:
        return True
    (_, a_const), (weight, w_const) = producer_operands
    bias, b_const = operands[1 - k]
    return not a_const and w_const and b_const and gemm_bias(product, weight, bias)


def with_activation(conv: Node, code: int) -> Node:
    """`conv` (a conv2d) with the fused activation `code`."""
    return Node(
        conv.op, conv.inputs, tuple((k, code if k == "act" else v) for k, v in conv.attrs), conv.shape, conv.dtype
    )


def conv_activated(conv: Node, act: Node) -> Node | None:
    """The node that prices `conv` (a conv2d without an activation) with the activation `act` fused into it, as
    onnxruntime runs the two: the convolution with `act`'s activation code (a Sigmoid, a Tanh), or with `act` itself
    as its `FUSED_READER` (a Clip with its bounds, a LeakyRelu with its slope); None for an activation the
    convolution applies inside its own output loop (`IN_KERNEL_ACTIVATIONS`: its price counts it), or an op that is
    not an activation."""
    if act.op in IN_KERNEL_ACTIVATIONS:
        return None
    if act.op in FUSED_ACTIVATIONS:
        return with_activation(conv, FUSED_ACTIVATIONS[act.op])
    if act.op in PARAMETRIC_ACTIVATIONS:
        attrs = (*conv.attrs, (FUSED_READER, (act.op, tuple(act.attrs))))
        return Node(conv.op, conv.inputs, attrs, conv.shape, conv.dtype)
    return None


def fused_item(reader: Item, k: int, producer: Item) -> Item | None:
    """The item that prices the kernel of `producer` with `reader` fused into it (reading the product as its operand
    `k`, see `fuses_into`), where that kernel does work the producer's own item does not price:
    - an Add fused into a MatMul is a Gemm, which writes its addend into the output before it accumulates the
      product there, a pass over the output a MatMul does not make; it is priced as the MatMul with the addend as a
      third operand (timed as the MatMul and the Add, which onnxruntime fuses as in the graph, see
      `tensat.measure.pricing_unit`);
    - an activation fused into a convolution that applies it in a pass over the output (`conv_activated`) is priced
      as the convolution with it, timed as the Conv and the activation, which onnxruntime fuses as in the graph.
    None where the producer's price counts the reader: a BatchNormalization folded into a convolution's weights, a
    Relu in its output loop."""
    r_node, r_shapes, r_const = reader
    p_node, p_shapes, p_const = producer
    if p_node.op == "conv2d" and k == 0 and p_node.attr.get("act") == ops.ACT_NONE:
        if FUSED_READER in p_node.attr or (node := conv_activated(p_node, r_node)) is None:
            return None
        return node, list(p_shapes), list(p_const)
    if r_node.op != "add" or p_node.op != "matmul" or len(p_shapes) != 2 or len(r_shapes) != 2:
        return None
    return p_node, [*p_shapes, r_shapes[1 - k]], [*p_const, r_const[1 - k]]


def fused_cost(
    cost: Callable[[Node, Sequence[Shape], Sequence[Const]], float], reader: Item, k: int, producer: Item
) -> float:
    """What `reader`, fused into the kernel of `producer` (see `fused_item`), adds to that kernel's price: the fused
    kernel's price less the producer's alone, never below nothing and never above the reader's own price (the pass
    a Gemm adds writes the addend where a plain Add reads the product and the addend and writes the sum, so a
    difference beyond that is the two timings' noise: a memory-bound product timed twice differs by more than its
    bias costs); nothing where the producer's price counts it."""
    item = fused_item(reader, k, producer)
    return 0.0 if item is None else min(max(0.0, cost(*item) - cost(*producer)), cost(*reader))


def pads_into_conv(pad: Node) -> bool:
    """Whether onnxruntime takes the Pad `pad` into the pads of a Conv that is its only reader (its PadFusion):
    zeros added on the spatial axes only."""
    p, r = pad.attr["pads"], len(pad.shape)
    return pad.attr["value"] == 0.0 and min(p) >= 0 and not any(p[a] or p[a + r] for a in (0, 1))


def transposes_into_matmul(transpose: Node) -> bool:
    """Whether onnxruntime's CPU session folds the Transpose `transpose` into a MatMul reading it (a FusedMatMul):
    a swap of the last two axes, or the first axis moved before the last two (its transBatch), with or without
    that swap."""
    perm, r = tuple(transpose.attr["perm"]), len(transpose.attr["perm"])
    middle = tuple(range(1, r - 1))
    return r >= 2 and perm in ((*range(r - 2), r - 1, r - 2), (*middle, 0, r - 1), (*middle, r - 1, 0))


CHANNEL_ALIGNMENT = 4  # channels onnxruntime's NCHWc reorder reads at a time: a reordered input's must be a multiple


def blocked_conv(weight: Shape, group: int, block: int) -> bool:
    """Whether onnxruntime's CPU session runs a convolution with weights of shape `weight` (constant, float) in
    `group` groups in its blocked NCHWc layout of channel block `block` (its NchwcTransformer), as onnxruntime 1.31
    was seen to on CPUs of block 8 and 16: without groups, one over fewer input channels than the block (read as
    NCHW) or over a multiple of CHANNEL_ALIGNMENT (padded to the block), whatever its output channels; a depthwise
    one over a multiple of CHANNEL_ALIGNMENT; a grouped one whose input and output channels per group are
    multiples of the block."""
    out_channels, in_channels = weight[0], weight[1]
    if group > 1:
        if in_channels == 1 and out_channels == group:
            return out_channels % CHANNEL_ALIGNMENT == 0
        return in_channels % block == 0 and out_channels % group == 0 and (out_channels // group) % block == 0
    return in_channels < block or in_channels % CHANNEL_ALIGNMENT == 0


BLOCKED_POOLS = frozenset({"maxpool", "avgpool"})  # pools onnxruntime blocks whatever their input's layout
BLOCKED_ACTIVATIONS = frozenset({"relu", "sigmoid", "tanh"})  # blocked where their input is; fused into a blocked Conv
BLOCKED_UNARY = BLOCKED_ACTIVATIONS | {"globalavgpool", "globalmaxpool"}  # blocked where their input is
# the Resizes onnxruntime runs as its blocked Upsample where their input is blocked: by whole scales, linear with these
# coordinate transformations, or nearest with the asymmetric one rounding down (its NchwcTransformer, as 1.31 was
# seen to run them)
BLOCKED_RESIZE_LINEAR = frozenset(ops.RESIZE_TRANSFORMS.index(t) for t in ("half_pixel", "align_corners", "asymmetric"))
BLOCKED_RESIZE_NEAREST = (ops.RESIZE_TRANSFORMS.index("asymmetric"), ops.RESIZE_NEAREST.index("floor"))


def blocked_resize(node: Node, in_shape: Shape) -> bool:
    """Whether onnxruntime's CPU session runs the Resize `node` of an input of `in_shape` as its blocked Upsample,
    where that input is blocked."""
    a = node.attr
    whole = all(o % i == 0 for o, i in zip(node.shape[2:], in_shape[2:]))
    if a["mode"] == ops.RESIZE_MODES.index("linear"):
        return whole and a["transform"] in BLOCKED_RESIZE_LINEAR
    return whole and (a["transform"], a["nearest"]) == BLOCKED_RESIZE_NEAREST


BINARY_ELEMENTWISE = frozenset({"add", "mul", "sub", "div"})


def priced_by_layout(op: str, const: Sequence[Const]) -> bool:
    """Whether an element-wise node's price depends on its operands' layout: a binary op of two computed operands,
    which onnxruntime runs blocked or in NCHW between reorders by their layout (`blocked_binary`). One with a
    constant operand is not: onnxruntime folds a Mul or an Add of a convolution's output by a constant of its
    channels into the convolution, which tensat's catalogue of its fusions does not say."""
    return op in BINARY_ELEMENTWISE and len(const) == 2 and not any(const)


def blocked_binary(op: str, shapes: Sequence[Shape], blocked_operands: Sequence[bool]) -> bool:
    """Whether onnxruntime's CPU session runs an element-wise binary op of `shapes` in its blocked layout, its
    operands blocked as `blocked_operands` say: an Add or a Mul of two blocked tensors, the Mul of equal shapes only.
    It runs the others in NCHW, with a reorder out of the layout at each blocked operand (seen with onnxruntime
    1.31: a squeeze-and-excitation's channel scale, a Sub or a Div, an Add of a scalar)."""
    both = len(shapes) == 2 and all(blocked_operands)
    return op in ("add", "mul") and both and (op == "add" or tuple(shapes[0]) == tuple(shapes[1]))


def blocked(graph: Graph, live: Sequence[int], const: set[int], block: int) -> dict[int, int]:
    """The nodes of `live` (in topological order) whose output onnxruntime's CPU session computes in its blocked
    NCHWc layout of channel block `block`, each with its logical channels: 4-D float convolutions
    (`blocked_conv`) and pools over channels a multiple of the block, then what reads only blocked tensors (an Add
    or Mul of equal shapes, a Concat on the channels of block-aligned parts, an activation, a BatchNormalization
    with constant parameters, a global average pool, a Resize by whole scales, `blocked_resize`)."""
    out: dict[int, int] = {}
    for i in live:
        n = graph.nodes[i]
        if len(n.shape) != 4 or n.dtype != "float32":
            continue
        ins = n.inputs
        if n.op == "conv2d":
            if ins[1] in const and ins[2] in const and blocked_conv(graph.nodes[ins[1]].shape, n.attr["group"], block):
                out[i] = n.shape[1]
        elif n.op in BLOCKED_POOLS:
            if n.shape[1] % block == 0:
                out[i] = n.shape[1]
        elif n.op == "batchnorm":
            if ins[0] in out and all(j in const for j in ins[1:]):
                out[i] = out[ins[0]]
        elif not all(j in out for j in ins):
            continue
        elif n.op in BINARY_ELEMENTWISE and len(ins) == 2:
            if out[ins[0]] == out[ins[1]] and blocked_binary(n.op, [graph.nodes[j].shape for j in ins], [True, True]):
                out[i] = out[ins[0]]
        elif n.op == "concat" and n.attr["axis"] == 1 and all(out[j] % block == 0 for j in ins):
            out[i] = sum(out[j] for j in ins)
        elif n.op in BLOCKED_UNARY or (n.op in PARAMETRIC_ACTIVATIONS and graph.nodes[ins[0]].op == "conv2d"):
            out[i] = out[ins[0]]
        elif n.op == "resize" and blocked_resize(n, graph.nodes[ins[0]].shape):
            out[i] = out[ins[0]]
    return out


def graph_layout(graph: Graph, device: str, live: Sequence[int] | None = None) -> dict[int, int]:
    """The nodes of `graph` onnxruntime computes in its blocked layout on `device` (`blocked`; none off the CPU or
    where it runs none), of `live` (its runtime nodes, in topological order) where given."""
    block = nchwc_block() if device == "cpu" else 0
    if not block:
        return {}
    const = graph.weight_only()
    if live is None:
        live = [i for i in graph.live() if not graph.nodes[i].is_leaf and i not in const]
    return blocked(graph, live, const, block)


Extent = tuple[int, int, int]  # a 4-D tensor's batch, height and width


def blocked_extents(graph: Graph, block: int) -> frozenset[Extent]:
    """The extents of the tensors onnxruntime's CPU session holds in its blocked layout of channel block `block` while
    running `graph`: each tensor `blocked` names, and each input of a blocked convolution (reordered into the layout).
    A 4-D tensor of another extent (the heads x tokens x features of an attention) stays in NCHW beside them."""
    const = graph.weight_only()
    live = [i for i in graph.live() if not graph.nodes[i].is_leaf and i not in const]
    layout = blocked(graph, live, const, block) if block else {}
    tensors = [graph.nodes[i].shape for i in layout]
    tensors += [graph.nodes[graph.nodes[i].inputs[0]].shape for i in layout if graph.nodes[i].op == "conv2d"]
    return frozenset((s[0], s[2], s[3]) for s in tensors if len(s) == 4)


def runtime_fusions(graph: Graph, device: str = "cpu") -> tuple[dict[int, int], dict[int, int]]:
    """What onnxruntime runs `graph` as on `device`, beyond the kernels that are ops of the graph: each node it
    folds, fuses or merges into a kernel -> the node whose kernel runs it, and each convolution, MatMul or
    BatchNormalization -> the activation code fused into it:
    - a node fused into the node before it, its only reader (`fuses_into`): a BatchNormalization, then an
      activation, into a convolution; on the CPU an Add, then for a 2-D product an activation, into a MatMul;
    - a Pad of zeros before a convolution, its only reader (`pads_into_conv`): the convolution's own padding, whose
      work the convolution's price already counts; not one onnxruntime was seen to run apart (`Graph.unfused`);
    - on the CPU, a Transpose before a MatMul, its only reader (`transposes_into_matmul`): a FusedMatMul;
    - on the CPU, in the blocked NCHWc layout (`blocked`): an Add of two blocked tensors into a convolution
      computing one of them (its Sum input), then an activation after it; an activation into a blocked
      BatchNormalization, which runs as a convolution;
    - a concat read only by a concat on the same axis, into the last of the chain (`tensat.ir.merged_concats`):
      tensat writes the chain as one N-ary Concat, whose copy the last binary concat's price counts;
    - a TopK's second output into its first: tensat writes the values and the indices of one TopK as one node,
      whose kernel computes both."""
    const = graph.weight_only()
    live = [i for i in graph.live() if not graph.nodes[i].is_leaf and i not in const]
    outputs = {n for _, n in graph.outputs}
    readers = graph.readers(live)

    def operands(n: Node) -> list[Operand]:
        return [(graph.nodes[j].shape, j in const) for j in n.inputs]

    def only_reader(x: int) -> bool:  # whether `x` is a computed tensor read once (by one node, as one operand)
        rs = readers.get(x, ())
        return x not in const and x not in outputs and len(rs) == 1 and graph.nodes[rs[0]].inputs.count(x) == 1

    layout = graph_layout(graph, device, live)
    owner: dict[int, int] = {}  # a folded, fused or merged node -> the node whose kernel runs it
    act: dict[int, int] = {}  # a conv2d, matmul or blocked batchnorm -> the activation fused into it
    summed: set[int] = set()  # the blocked convolutions an Add is summed into

    def summed_into(add: Node) -> int | None:
        """The blocked convolution the blocked Add `add` is summed into (the Sum input of onnxruntime's NCHWc Conv):
        the first of its two operands of equal shapes that a convolution computes (through a BatchNormalization
        folded into it) without an activation, an Add already summed into it, or another reader."""
        if len(add.inputs) != 2 or graph.nodes[add.inputs[0]].shape != graph.nodes[add.inputs[1]].shape:
            return None
        for x in add.inputs:
            p = owner.get(x, x)
            conv = graph.nodes[p]
            if conv.op == "conv2d" and p in layout and only_reader(x) and conv.attr["act"] == ops.ACT_NONE:
                if p not in act and p not in summed:
                    return p
        return None

    topk: dict[tuple[int, ...], int] = {}  # a TopK's input and attributes -> the first of its outputs
    for i in live:
        n = graph.nodes[i]
        if n.op == "topk":
            first = topk.setdefault(ops.topk_kernel(n.inputs, n.attr), i)
            if first != i:
                owner[i] = first
            continue
        if n.op == "pad":
            if i not in graph.unfused and only_reader(i) and pads_into_conv(n):
                conv = readers[i][0]
                if graph.nodes[conv].op == "conv2d" and graph.nodes[conv].inputs[0] == i:
                    owner[i] = conv
            continue
        if n.op == "matmul" and device == "cpu":
            for x in n.inputs:
                if graph.nodes[x].op == "transpose" and only_reader(x) and transposes_into_matmul(graph.nodes[x]):
                    owner[x] = i
            continue
        if n.op == "concat":
            for x in merged_concats(graph, [i], only_reader):
                owner[x] = i
                owner.update({m: i for m, root in owner.items() if root == x})
            continue
        if n.op == "add" and i in layout and (into := summed_into(n)) is not None:
            owner[i] = into
            summed.add(into)
            continue
        if n.op in BLOCKED_ACTIVATIONS and (bn := n.inputs[0]) in layout and graph.nodes[bn].op == "batchnorm":
            if bn not in owner and bn not in act and only_reader(bn):  # a blocked BatchNormalization runs as a Conv
                owner[i], act[bn] = bn, FUSED_ACTIVATIONS[n.op]
                continue
        for k, x in enumerate(n.inputs):
            if not only_reader(x):
                continue
            p = owner.get(x, x)  # through a BatchNormalization or an Add fused into the node before it
            producer, through = graph.nodes[p], None if p == x else graph.nodes[x].op
            if p in act:
                continue
            if fuses_into(
                n.op, n.shape, operands(n), k, producer.op, producer.attr, operands(producer), device, through
            ):
                owner[i] = p
                if n.op in FUSED_ACTIVATIONS or n.op in PARAMETRIC_ACTIVATIONS:
                    act[p] = FUSED_ACTIVATIONS.get(n.op, ops.ACT_NONE)
                break
    return owner, act


Kernel = tuple[list[int], Item]  # the graph's nodes onnxruntime runs as one kernel, and the item that prices it


def runtime_kernels(graph: Graph, device: str = "cpu") -> list[Kernel]:
    """The kernels onnxruntime runs the graph as on `device`, in topological order, by tensat's catalogue of what it
    fuses on its own (`runtime_fusions`; the kernels it makes of larger patterns are ops of the graph, see
    `tensat.ops.KERNELS`): each runtime node no other absorbs, with the nodes it absorbs (all sorted), and the item
    pricing the kernel (a convolution with its fused activation code, a MatMul with the addend of its Gemm, see
    `fused_item`; each computed 4-D operand with its layout, `item_of`). Every price of a graph as it runs is the
    sum of these items, so the cost report's kernels are the ones the search priced."""
    const = graph.weight_only()
    owner, act = runtime_fusions(graph, device)
    layout = graph_layout(graph, device)
    absorbed: dict[int, list[int]] = {}
    for node, root in owner.items():
        absorbed.setdefault(root, []).append(node)
    kernels: list[Kernel] = []
    for i in graph.live():
        n = graph.nodes[i]
        if n.is_leaf or i in const or i in owner:
            continue
        if i in act:
            n = with_activation(n, act[i])
        item = item_of(graph, n, const, layout)
        for m in absorbed.get(i, ()):  # each reading the kernel's node, or a node fused into it (a BatchNormalization)
            reader = graph.nodes[m]
            k = next((k for k, x in enumerate(reader.inputs) if x == i or owner.get(x) == i), None)
            if k is not None:
                item = fused_item(item_of(graph, reader, const, layout), k, item) or item
        kernels.append((sorted([i, *absorbed.get(i, ())]), item))
    return kernels


def runtime_items(graph: Graph, device: str = "cpu") -> list[Item]:
    """The graph's runtime nodes as onnxruntime runs them on `device`, for pricing: one item per kernel of
    `runtime_kernels`. onnxruntime makes those fusions on its own whatever graph it is given, so a cost that counted
    them apart would credit an optimization with gains the runtime gets for free, and would not see a rewrite that
    leaves the runtime unable to fuse."""
    return [item for _, item in runtime_kernels(graph, device)]


def device_of(cost: object) -> str:
    """The device `cost` prices for ("cpu" for a model that names none, as the analytic one)."""
    return str(getattr(cost, "device", "cpu"))


def runtime_cost(graph: Graph, cost: CostModel) -> float:
    """Summed cost of the graph as onnxruntime runs it (`runtime_items`): the cost a run reports before and after,
    so that no gain the runtime already gets for free is claimed."""
    return _priced(runtime_items(graph, device_of(cost)), cost)
