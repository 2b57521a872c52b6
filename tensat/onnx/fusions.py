"""The subgraphs onnxruntime fuses into one kernel, found by asking onnxruntime.

onnxruntime's graph optimizer turns a LayerNorm written as ReduceMean/Sub/Pow/Sqrt/Div/Mul/Add, T5's RMSNorm, a GELU
written with Erf or Tanh, a SiLU, a residual Add and a LayerNorm, a MatMul and the scale or Transpose of its inputs,
into single kernels. Its pattern matchers accept the operand orders and layouts exporters write, no others. So the
kernels an input runs as are found here, by optimizing the model in onnxruntime and reading back which of its
nodes each fused node replaced.

Each is read as what it is: the importer lowers the fused node in place of the subgraph it replaced
(`Fusions.kernels`), so the e-graph starts from the kernels that run, priced as they run. A kernel tensat models
(`tensat.ops.KERNELS`) becomes its op, and the rules offer the plain ops it computes as the alternative; another
(onnxruntime's BiasGelu, say) is kept verbatim, an opaque node of its domain, as any op of a custom domain is. A
fused node over tensors onnxruntime made itself (weights it folded) is not read: its subgraph is read as written.

A convolution's fusions and a MatMul's with its bias Add are read from the graph itself (`as_run`), as ops tensat
has: a Conv, the BatchNormalization it folds and the activation it runs in its output loop as one conv2d with that
activation; a MatMul by a matrix and its bias Add as one `gemm` (onnxruntime's Gemm, between two Reshapes it adds
for an N-D product). Rules take each apart where a rewrite needs the parts (`conv-relu-unfuse`, `gemm-unfuse`) and
merge them as Tensat merges convolutions and MatMuls, and the extraction prices each form by what it costs to run.
onnxruntime's own nodes for them (FusedConv, Gemm) are not read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from onnx import ModelProto, NodeProto

from tensat import ops
from tensat.errors import raise_if_out_of_memory
from tensat.ir import Graph, Node
from tensat.session import runtime_graph

# Op types whose presence lets onnxruntime fuse a normalization, an activation or an attention: a model with none of
# them is not optimized in onnxruntime here (a CNN whose only fusions are its convolutions' and its classifier's).
TRIGGERS = frozenset({"ReduceMean", "Pow", "Sqrt", "Erf", "Tanh", "Sigmoid", "LayerNormalization"})
# fused kinds not read from onnxruntime's graph: `as_run` reads them from the input's own (a Split is what
# onnxruntime makes of Slices that partition a tensor, as tensat's exporter writes them too)
NOT_READ = frozenset({"Conv", "FusedConv", "NhwcFusedConv", "Gemm", "FusedGemm", "Split"})
MAX_REGION = 64  # ONNX nodes in one fused subgraph; a walk that goes further has left the fusion
MAX_GLUE = 4  # nodes onnxruntime adds around a fused node (the Reshapes of an N-D MatMul+Add made a Gemm)


@dataclass(frozen=True)
class Fusions:
    """The kernels onnxruntime runs an input as: the fused node of each, by the input's tensor it computes."""

    kernels: Mapping[str, NodeProto] = field(default_factory=dict)


def runtime_fusions(model: ModelProto) -> Fusions:
    """The kernels onnxruntime fuses subgraphs of `model` into (see the module docstring); none where the model has
    no op such a fusion starts from, or where onnxruntime cannot load it. The model is optimized in onnxruntime's
    CPU session at the extended level (the fusions; not the CPU's blocked layout)."""
    graph = model.graph
    if not TRIGGERS.intersection(n.op_type for n in graph.node):
        return Fusions()
    try:
        optimized = runtime_graph(model)
    except Exception as exc:  # noqa: BLE001 - a model onnxruntime cannot run has nothing it fuses; verification says why
        raise_if_out_of_memory(exc)
        return Fusions()
    weights = {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
    inputs = {vi.name for vi in graph.input}
    return _absorbed(graph.node, optimized.graph.node, weights, inputs)


def _absorbed(
    original: Iterable[NodeProto], optimized: Sequence[NodeProto], weights: set[str], inputs: set[str]
) -> Fusions:
    """The fused nodes of a new kind, not `NOT_READ`, that replaced two or more original nodes, to be read in place of
    them (`_as_kernel`). The original nodes a fused node replaced are those between its outputs and its inputs
    (read through the nodes onnxruntime added around it), walking the original graph back from the outputs; a
    fused node whose walk reaches a graph input it does not read, or goes on too long, is skipped: its inputs are
    tensors onnxruntime made."""
    producer: dict[str, NodeProto] = {}
    kinds: set[tuple[str, str]] = set()
    for node in original:
        kinds.add((node.domain or "ai.onnx", node.op_type))
        for out in node.output:
            if out:
                producer[out] = node
    made = {out: node for node in optimized for out in node.output if out and out not in producer}
    readers: dict[str, list[NodeProto]] = {}
    for node in optimized:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    kernels: dict[str, NodeProto] = {}
    known = producer.keys() | weights | inputs
    for fused in optimized:
        if fused.op_type in NOT_READ or (fused.domain or "ai.onnx", fused.op_type) in kinds:
            continue
        outs = {o for name in fused.output for o in _original_after(name, producer, readers)}
        stops = {i for name in fused.input for i in _original_before(name, producer, weights, made)}
        region = _region(outs, stops, producer, weights)
        if region is None or len(region) < 2:
            continue
        kernel = _as_kernel(fused, outs, known, readers)
        if kernel is not None:
            kernels[kernel.output[0]] = kernel
    return Fusions(kernels)


def _as_kernel(
    fused: NodeProto, outs: set[str], known: Iterable[str], readers: Mapping[str, list[NodeProto]]
) -> NodeProto | None:
    """The fused node, to be read in place of the subgraph it replaced, where it has one output read, the input's
    own tensor, and reads tensors of the input (not ones onnxruntime made); else None. Its other outputs are left
    out: nothing reads them."""
    if len(outs) != 1 or not fused.output or fused.output[0] not in outs:
        return None
    if any(name and readers.get(name) for name in fused.output[1:]):
        return None
    names = set(known)
    if not all(name in names for name in fused.input if name):
        return None
    node = NodeProto()
    node.CopyFrom(fused)
    del node.output[1:]
    return node


def _original_before(
    name: str, producer: dict[str, NodeProto], weights: set[str], made: dict[str, NodeProto], depth: int = 0
) -> set[str]:
    """The original tensors tensor `name` of the optimized graph is computed from through added nodes."""
    if name in producer or name in weights or name not in made or depth >= MAX_GLUE:
        return {name}
    return {t for i in made[name].input if i for t in _original_before(i, producer, weights, made, depth + 1)}


def _original_after(name: str, producer: dict[str, NodeProto], readers: dict[str, list[NodeProto]]) -> set[str]:
    """The original tensors tensor `name` of the optimized graph reaches through a chain of added nodes."""
    for _ in range(MAX_GLUE):
        if name in producer:
            return {name}
        after = readers.get(name, [])
        if len(after) != 1 or len(after[0].output) != 1:
            return set()
        name = after[0].output[0]
    return {name} if name in producer else set()


def _region(
    outs: set[str], stops: set[str], producer: dict[str, NodeProto], weights: set[str]
) -> list[NodeProto] | None:
    """The original nodes computing `outs` from `stops` and `weights`, or None where the walk escapes (reaches
    another graph input, or more than `MAX_REGION` nodes)."""
    if not outs:
        return None
    seen: dict[int, NodeProto] = {}
    stack = [producer[o] for o in outs]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        if len(seen) > MAX_REGION:
            return None
        for name in node.input:
            if not name or name in stops:
                continue
            if name in producer:
                stack.append(producer[name])
            elif name not in weights:
                return None
    return list(seen.values())


@dataclass(frozen=True)
class KernelCheck:
    """The kernels of tensat's catalogue (`tensat.ops.KERNELS`) a model as written asks for, by op type, and those
    onnxruntime runs it with: equal where what is written is what runs (onnxruntime fused no plain ops the model
    chose to keep plain, and kept every kernel it chose)."""

    written: dict[str, int]
    run: dict[str, int]

    @property
    def match(self) -> bool:
        return self.written == self.run

    def to_dict(self) -> dict[str, Any]:
        return {"written": dict(self.written), "run": dict(self.run), "match": self.match}


def _catalogued(nodes: Iterable[NodeProto]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for n in nodes:
        domain = "" if n.domain in ("", "ai.onnx") else n.domain
        if n.op_type in ops.KERNELS.get(domain, ()):
            counts[n.op_type] += 1
    return dict(sorted(counts.items()))


def check_kernels(model: ModelProto, provider: str = "cpu") -> KernelCheck:
    """Count the catalogued kernels `model` writes and those onnxruntime runs it with on `provider`, in the graph
    its optimizer writes (`tensat.session.runtime_graph`)."""
    return KernelCheck(_catalogued(model.graph.node), _catalogued(runtime_graph(model, provider).graph.node))


ACTIVATIONS = {name: code for name, code in ops.ACT_CODES.items() if code != ops.ACT_NONE}
"""The activations onnxruntime runs in the output loop of the Conv before them (its FusedConv), by conv2d's code. A
convolution with one is priced as the plain convolution by every cost model, at no cost worth a measurement."""


def as_run(graph: Graph) -> Graph:
    """`graph` with the fusions onnxruntime's sessions make of any graph read as the ops they are:
    - a BatchNormalization with constant parameters that is the only reader of a conv2d without an activation, as
      that conv2d with its weights and bias scaled (onnxruntime folds it so);
    - a Relu, Sigmoid or Tanh that is the only reader of a conv2d without an activation, as that conv2d with it;
    - an Add of a bias weight to a MatMul of a computed operand by a constant matrix, its only reader, as a `gemm`,
      where no other MatMul reads that matrix: the products of a weight shared across a recurrent cell's steps stay
      MatMuls, for the rules that merge them across the steps (`matmul-merge-shared-weight`), where one step's read
      as a Gemm would hide its product from the guided rounds that extend those merges.

    A graph output is not fused into its reader, since it must stay a tensor of its own."""
    const = graph.weight_only()
    outputs = {n for _, n in graph.outputs}
    readers = graph.readers()
    out = replace(graph, nodes=list(graph.nodes), weights=dict(graph.weights), _index=dict(graph._index))
    fused = False
    for i in graph.live():
        n = graph.nodes[i]
        if i in const or not n.inputs:
            continue
        for k, p in enumerate(n.inputs):
            producer = out.nodes[p]
            if p in const or p in outputs or readers.get(p) != [i]:
                continue
            if producer.op == "conv2d" and producer.attr["act"] == ops.ACT_NONE and n.op in ACTIVATIONS:
                attrs = tuple((key, ACTIVATIONS[n.op] if key == "act" else v) for key, v in producer.attrs)
                out.nodes[i] = Node("conv2d", producer.inputs, attrs, n.shape, n.dtype)
            elif producer.op == "conv2d" and producer.attr["act"] == ops.ACT_NONE and n.op == "batchnorm" and k == 0:
                folded = _folded(out, const, producer, n)
                if folded is None:
                    continue
                out.nodes[i] = folded
            elif (
                n.op == "add"
                and producer.op == "matmul"
                and readers.get(producer.inputs[1]) == [p]
                and _bias(graph, const, producer, n.inputs[1 - k], n)
            ):
                out.nodes[i] = Node("gemm", (*producer.inputs, n.inputs[1 - k]), (), n.shape, n.dtype)
            else:
                continue
            fused = True
            break
    return out.compact() if fused else graph


def _folded(graph: Graph, const: set[int], conv: Node, bn: Node) -> Node | None:
    """The conv2d `conv` with the BatchNormalization `bn` over it folded into its weights and bias (new weights of
    `graph`), where the convolution's weights and the normalization's parameters are constants; else None."""
    if not all(j in const for j in (*conv.inputs[1:], *bn.inputs[1:])):
        return None
    w, b, scale, shift, mean, var = (graph.evaluate({}, [j])[j] for j in (*conv.inputs[1:], *bn.inputs[1:]))
    inv = scale / np.sqrt(var + np.asarray(bn.attr["epsilon"], var.dtype))
    weight = graph.weight((w * inv.reshape(-1, 1, 1, 1)).astype(w.dtype), "bn_folded_weight")
    bias = graph.weight(((b - mean) * inv + shift).astype(b.dtype), "bn_folded_bias")
    return Node("conv2d", (conv.inputs[0], weight, bias), conv.attrs, bn.shape, bn.dtype)


def _bias(graph: Graph, const: set[int], product: Node, bias: int, add: Node) -> bool:
    """Whether `add` adds the weight `bias` to `product`, a MatMul of a computed operand by a constant matrix, as
    one `gemm` (its shape rule: the matrix's and the bias's leading dims 1). A bias computed from weights (a
    recurrent cell's first step, whose state is a constant) stays an Add of its own, as the other steps' sums of
    two products are: the rules that merge the products across steps see them all alike."""
    a, w = product.inputs
    if a in const or w not in const or graph.nodes[bias].op != "weight":
        return False
    try:
        shape = ops.shape_of("gemm", [graph.nodes[j].shape for j in (a, w, bias)], {})
    except ops.ShapeError:
        return False
    return shape == add.shape
