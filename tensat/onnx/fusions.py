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

A convolution's fusions (an activation, a residual Add) and a MatMul's with its bias Add (a Gemm; N-D ones between
two Reshapes onnxruntime inserts) are left free: tensat's merges of convolutions and of MatMuls that share an input
(Tensat's own gains) rewrite exactly these nodes, and the cost models price them as onnxruntime runs them
(`tensat.cost.runtime_fusions`; in the extraction, `tensat.egraph.export`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from onnx import ModelProto, NodeProto

from tensat import ops
from tensat.errors import raise_if_out_of_memory
from tensat.session import runtime_graph

# Op types whose presence lets onnxruntime fuse a normalization, an activation or an attention, or leave a Pad apart
# from the Conv after it: a model with none of them is not optimized in onnxruntime here (a CNN whose only fusions are
# its convolutions' and its classifier's).
TRIGGERS = frozenset({"ReduceMean", "Pow", "Sqrt", "Erf", "Tanh", "Sigmoid", "LayerNormalization", "Pad"})
# fused kinds left free (see above; a Split is what onnxruntime makes of Slices that partition a tensor, as tensat's
# exporter writes them too)
FREE = frozenset({"Conv", "FusedConv", "NhwcFusedConv", "Gemm", "FusedGemm", "Split"})
MAX_REGION = 64  # ONNX nodes in one fused subgraph; a walk that goes further has left the fusion
MAX_GLUE = 4  # nodes onnxruntime adds around a fused node (the Reshapes of an N-D MatMul+Add made a Gemm)


@dataclass(frozen=True)
class Fusions:
    """The kernels onnxruntime runs an input as: the fused node of each, by the input's tensor it computes; and the
    outputs of the input's Pads that it runs as Pads. Its PadFusion takes a Pad into the Conv reading it only where
    the model writes that Conv in a form tensat's IR does not keep: not into one written with `auto_pad` (a
    TorchScript export's 'same' padding), which tensat reads as explicit pads."""

    kernels: Mapping[str, NodeProto] = field(default_factory=dict)
    pads: frozenset[str] = frozenset()


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
    kept = frozenset(o for n in optimized.graph.node if n.op_type == "Pad" for o in n.output if o)
    return replace(_absorbed(graph.node, optimized.graph.node, weights, inputs), pads=kept)


def _absorbed(
    original: Iterable[NodeProto], optimized: Sequence[NodeProto], weights: set[str], inputs: set[str]
) -> Fusions:
    """The fused nodes of a new kind, not `FREE`, that replaced two or more original nodes, to be read in place of
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
        if fused.op_type in FREE or (fused.domain or "ai.onnx", fused.op_type) in kinds:
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
