"""Computations onnxruntime runs faster written one way than another: each is timed both ways on the device, and
the input is written the faster way.

onnxruntime's graph optimizer matches fixed patterns, and its kernels differ in how well they are written. Whether
the kernel a pattern becomes beats the ops it replaces depends on the device and on the onnxruntime build, and
whether it matches at all depends on how the exporter wrote the computation; a cost model pricing ops one by one
sees neither. Three such forms are handled:
- a residual Add read by a LayerNormalization, which onnxruntime fuses into a SkipLayerNormalization (a BERT-style
  post-norm encoder has one per sub-layer; `tensat.onnx.fusions.skip_adds` finds them as onnxruntime fuses them).
  Written as ONNX Sum (the `sum` op, the same value), it is not fused;
- an RMSNorm scaling its input by the Reciprocal of a Sqrt (as torch.onnx's dynamo exporter writes `rsqrt`), which
  onnxruntime does not fuse. Written as a Div by the Sqrt (as the TorchScript exporter writes it), it becomes one
  SimplifiedLayerNormalization;
- an LRN (AlexNet's and GoogLeNet's local response normalization across channels), which onnxruntime's CPU kernel
  computes one window at a time. Written as its definition, x / (bias + alpha / size * window sum of x^2)^beta,
  the window sum is a 1x1 Conv whose weight is a band of alpha / size (with bias as its bias), and the power a Pow
  (or Sqrts, for the betas of 1/4, 1/2 and 3/4 that are theirs).

Each is timed as a small model at the shape it has in the graph, both ways, interleaved, by the measured cost model
(`MeasuredCost.compare_forms`, cached with its costs), and rewritten where the other form is faster by more than
the cost model tells apart. The end-to-end check then times the whole graph against the input, as for any other
change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import AttributeProto, ModelProto, helper, numpy_helper

from tensat import ops
from tensat.cost import runtime_cost
from tensat.ir import Graph, Node, OpaqueSpec
from tensat.measure import MeasuredCost
from tensat.onnx.common import ir_version_for
from tensat.onnx.exporter import export_model
from tensat.onnx.fusions import SKIP_LAYERNORM

Shape = tuple[int, ...]
OPSET = 17  # the first with LayerNormalization
EPSILON = 1e-5
RMS_NORM = "SimplifiedLayerNormalization"
LRN = "LRN"
WRITTEN = {
    SKIP_LAYERNORM: "residual Add as Sum",
    RMS_NORM: "RMSNorm's Reciprocal as Div",
    LRN: "LRN as a channel-band Conv",
}


@dataclass(frozen=True)
class FormTiming:
    """The computations of one kind and shape in a graph, timed as the input writes them and the other way."""

    kind: str  # the kernel onnxruntime runs one of the forms as (`WRITTEN`)
    shape: Shape
    input_ms: float  # one of them as the input writes it
    other_ms: float  # written the other way
    count: int  # how many the graph has
    rewritten: bool  # whether they were written the other way
    priced_ms: float = 0.0  # how much more per-op costs price one as the input writes it than the other way

    @property
    def written(self) -> str:
        """The other form, in words."""
        return WRITTEN[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "shape": list(self.shape),
            "input_ms": self.input_ms,
            "other_ms": self.other_ms,
            "count": self.count,
            "rewritten": self.rewritten,
            "priced_ms": self.priced_ms,
        }


@dataclass
class Forms:
    """What `choose_forms` timed and rewrote."""

    timings: list[FormTiming] = field(default_factory=list)

    @property
    def rewritten(self) -> dict[str, int]:
        """How many computations were written the other way, by what was done ("residual Add as Sum": n)."""
        out: dict[str, int] = {}
        for t in self.timings:
            if t.rewritten:
                out[t.written] = out.get(t.written, 0) + t.count
        return out

    @property
    def excess_ms(self) -> float:
        """What the input's forms of the rewritten computations cost beyond the forms written, as timed, less what
        per-op costs already price them above those: their part of the input's price as onnxruntime runs it that
        per-op costs do not show."""
        return sum(t.count * (t.input_ms - t.other_ms - t.priced_ms) for t in self.timings if t.rewritten)

    def summary(self) -> str:
        """One line per kind and shape: the two timings and what was done."""
        return "; ".join(
            f"{t.count} {t.kind} form{'s' if t.count > 1 else ''} at {'x'.join(map(str, t.shape))}: "
            f"{t.input_ms:.4g} ms as written, {t.other_ms:.4g} ms the other way"
            + (f" (written: {t.written})" if t.rewritten else " (kept)")
            for t in self.timings
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "rewritten": self.rewritten,
            "excess_ms": self.excess_ms,
            "timings": [t.to_dict() for t in self.timings],
        }


def _model(name: str, nodes: list[Any], inputs: Sequence[str], shape: Sequence[int], dtype: str, inits: list[Any]):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, elem, list(shape)) for n in inputs],
        [helper.make_tensor_value_info("y", elem, list(shape))],
        inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = ir_version_for({"": OPSET})
    return m


def _vector(name: str, shape: Sequence[int], dtype: str, center: float) -> Any:
    rng = np.random.default_rng(0)
    return numpy_helper.from_array((center + 0.1 * rng.standard_normal(int(shape[-1]))).astype(dtype), name)


def skip_norm_models(shape: Sequence[int], dtype: str = "float32") -> tuple[ModelProto, ModelProto]:
    """The residual pair at `shape`, normalized over its last axis: written with Add (which onnxruntime fuses
    into a SkipLayerNormalization) and with Sum (which it does not)."""
    inits = [_vector("scale", shape, dtype, 1.0), _vector("bias", shape, dtype, 0.0)]

    def model(op: str) -> ModelProto:
        nodes = [
            helper.make_node(op, ["x", "skip"], ["s"]),
            helper.make_node("LayerNormalization", ["s", "scale", "bias"], ["y"], axis=-1, epsilon=EPSILON),
        ]
        return _model(f"skip_norm_{op.lower()}", nodes, ("x", "skip"), shape, dtype, inits)

    return model("Add"), model("Sum")


def rms_norm_models(shape: Sequence[int], dtype: str = "float32") -> tuple[ModelProto, ModelProto]:
    """An RMSNorm over the last axis of `shape` (x * 1/sqrt(mean(x^2) + eps) * scale): scaling x by the Reciprocal
    of the Sqrt (which onnxruntime does not fuse) and dividing x by the Sqrt (which it fuses into a
    SimplifiedLayerNormalization)."""
    two = numpy_helper.from_array(np.array(2.0, dtype), "two")
    eps = numpy_helper.from_array(np.array(EPSILON, dtype), "eps")
    inits = [two, eps, _vector("scale", shape, dtype, 1.0)]

    def model(op: str) -> ModelProto:
        nodes = [
            helper.make_node("Pow", ["x", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
            helper.make_node("Add", ["ms", "eps"], ["v"]),
            helper.make_node("Sqrt", ["v"], ["rms"]),
        ]
        if op == "Div":
            nodes.append(helper.make_node("Div", ["x", "rms"], ["n"]))
        else:
            nodes += [helper.make_node("Reciprocal", ["rms"], ["inv"]), helper.make_node("Mul", ["x", "inv"], ["n"])]
        nodes.append(helper.make_node("Mul", ["scale", "n"], ["y"]))
        return _model(f"rms_norm_{op.lower()}", nodes, ("x",), shape, dtype, inits)

    return model("Reciprocal"), model("Div")


# -- finding each form in the IR, and writing it the other way


Site = tuple[int, ...]  # the nodes one rewrite needs: the node replaced first


def _opaque_type(graph: Graph, i: int) -> str:
    n = graph.nodes[i]
    return graph.opaque[n.attr["key"]].op_type if n.op == "opaque" else ""


def _skip_sites(graph: Graph, readers: dict[int, list[int]]) -> list[Site]:
    """The residual Adds onnxruntime fuses with their LayerNormalization (`Graph.skip_adds`), of two operands of
    their own shape."""
    out: list[Site] = []
    for i in sorted(graph.skip_adds):
        n = graph.nodes[i]
        if n.op == "add" and all(graph.nodes[j].shape == n.shape for j in n.inputs):
            out.append((i,))
    return out


def _as_sum(graph: Graph, site: Site) -> None:
    n = graph.nodes[site[0]]
    graph.replace(site[0], Node("sum", n.inputs, n.attrs, n.shape, n.dtype))


def _rms_sites(graph: Graph, readers: dict[int, list[int]]) -> list[Site]:
    """RMSNorms written mul(x, Reciprocal(Sqrt(add(ReduceMean(Pow(x, 2)), eps)))) and then scaled by a weight
    (the pattern onnxruntime's SimplifiedLayerNormalization fusion matches, but with Div): (the mul, x, the Sqrt,
    the scale, and the Pow, ReduceMean and add between them)."""
    const = graph.weight_only()
    out: list[Site] = []
    for i in graph.live():
        n = graph.nodes[i]
        if n.op != "mul" or len(readers.get(i, ())) != 1:
            continue
        (scale,) = readers[i]
        if graph.nodes[scale].op != "mul" or not any(j in const for j in graph.nodes[scale].inputs):
            continue
        for k, r in enumerate(n.inputs):
            x = n.inputs[1 - k]
            if _opaque_type(graph, r) != "Reciprocal" or readers.get(r) != [i] or graph.nodes[x].shape != n.shape:
                continue
            sqrt = graph.nodes[r].inputs[0]
            if _opaque_type(graph, sqrt) != "Sqrt":
                continue
            eps = graph.nodes[graph.nodes[sqrt].inputs[0]]
            means = [j for j in eps.inputs if _opaque_type(graph, j) == "ReduceMean"]
            if eps.op != "add" or len(means) != 1 or not any(j in const for j in eps.inputs):
                continue
            power = graph.nodes[means[0]].inputs[0]
            if _opaque_type(graph, power) == "Pow" and graph.nodes[power].inputs[0] == x and _squares(graph, power):
                out.append((i, x, sqrt, scale, power, means[0], graph.nodes[sqrt].inputs[0]))
    return out


def _squares(graph: Graph, power: int) -> bool:
    """Whether the Pow node `power` raises to a constant 2."""
    inputs = graph.nodes[power].inputs
    if len(inputs) != 2 or graph.nodes[inputs[1]].op != "weight":
        return False
    exponent = graph.weights[graph.nodes[inputs[1]].attr["name"]]
    return exponent.size == 1 and float(exponent.reshape(-1)[0]) == 2.0


def _as_div(graph: Graph, site: Site) -> None:
    """Divide x by the Sqrt in place of the mul by its Reciprocal; the fused subgraph is then pinned and sealed as
    the importer pins those onnxruntime fuses in the input (`Graph.pinned`), so that no rewrite takes it apart (a
    scale folded into the MatMul after it, say)."""
    i, x, sqrt, scale, *inner = site
    n = graph.nodes[i]
    key = f"Div_rms_{i}"
    graph.opaque[key] = OpaqueSpec("Div", "", (), 1)
    attrs = (("key", key), ("index", 0), ("shape", n.shape), ("dtype", n.dtype))
    graph.replace(i, Node("opaque", (x, sqrt), attrs, n.shape, n.dtype))
    graph.pinned.update((i, sqrt, scale, *inner))
    graph.sealed.update((i, sqrt, *inner))


# -- LRN, written as its definition


LRN_DEFAULTS = {"alpha": 1e-4, "beta": 0.75, "bias": 1.0}
Params = tuple[tuple[str, float], ...]  # a computation's attributes that its forms depend on, sorted


def _lrn_sites(graph: Graph, readers: dict[int, list[int]]) -> list[Site]:
    """The float32 LRNs of 4-D (N, C, H, W) tensors."""
    del readers
    out: list[Site] = []
    for i in graph.live():
        n = graph.nodes[i]
        if n.op == "opaque" and len(n.shape) == 4 and n.dtype == "float32" and len(n.inputs) == 1:
            spec = graph.opaque[n.attr["key"]]
            if spec.op_type == LRN and spec.domain == "" and spec.num_outputs == 1:
                out.append((i,))
    return out


def _lrn_params(graph: Graph, site: Site) -> Params:
    """alpha, beta, bias and size of the LRN at `site`, ONNX's defaults filled in."""
    spec = graph.opaque[graph.nodes[site[0]].attr["key"]]
    found = {a.name: helper.get_attribute_value(a) for a in map(AttributeProto.FromString, spec.attributes)}
    values = {k: float(found.get(k, v)) for k, v in LRN_DEFAULTS.items()}
    values["size"] = float(found["size"])
    return tuple(sorted(values.items()))


def _band(channels: int, size: int, scale: float) -> np.ndarray:
    """The (C, C, 1, 1) weight of a 1x1 Conv summing each channel's LRN window times `scale`: output channel c reads
    channels c - floor((size - 1) / 2) to c + ceil((size - 1) / 2), as ONNX defines the window."""
    below = (size - 1) // 2
    c = np.arange(channels)
    offset = c[None, :] - c[:, None]
    band = (offset >= -below) & (offset <= size - 1 - below)
    return (band * np.float32(scale)).astype(np.float32).reshape(channels, channels, 1, 1)


def _opaque(graph: Graph, op_type: str, key: str, inputs: Sequence[int]) -> int:
    """An ONNX `op_type` node of no attributes over `inputs`, of the first one's shape and type."""
    graph.opaque[key] = OpaqueSpec(op_type, "", (), 1)
    first = graph.nodes[inputs[0]]
    return graph.add("opaque", inputs, key=key, index=0, shape=first.shape, dtype=first.dtype)


def lrn_definition(params: Params, key: str) -> Callable[[Graph, tuple[int, ...]], int]:
    """How to write an LRN of `params` (opaque key `key`) as its definition, for `Graph.compact(expand=...)`:
    x / (bias + alpha / size * band sum of x^2)^beta, the band sum and bias a 1x1 Conv, and x^beta by Sqrts
    where beta is 1/4, 1/2 or 3/4, else by Pow."""
    p = dict(params)
    size, beta = int(p["size"]), p["beta"]

    def build(graph: Graph, inputs: tuple[int, ...]) -> int:
        (x,) = inputs
        channels = graph.nodes[x].shape[1]
        squares = graph.add("mul", [x, x])
        band = graph.weight(_band(channels, size, p["alpha"] / size), f"{key}_band")
        bias = graph.weight(np.full(channels, p["bias"], np.float32), f"{key}_bias")
        window = dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1, act=ops.ACT_NONE)
        d = graph.add("conv2d", [squares, band, bias], **window)
        if beta == 1.0:
            power = d
        elif beta in (0.25, 0.5, 0.75):
            root = _opaque(graph, "Sqrt", f"Sqrt_{key}", [d])
            fourth = _opaque(graph, "Sqrt", f"Sqrt2_{key}", [root]) if beta != 0.5 else root
            power = {0.25: fourth, 0.5: root, 0.75: graph.add("mul", [root, fourth])}[beta]
        else:
            exponent = graph.weight(np.array(beta, np.float32), f"{key}_beta")
            power = _opaque(graph, "Pow", f"Pow_{key}", [d, exponent])
        return _opaque(graph, "Div", f"Div_{key}", [x, power])

    return build


def _lrn_graphs(shape: Sequence[int], dtype: str, params: Params) -> tuple[Graph, Graph]:
    """One LRN of `params` at `shape`, as an ONNX LRN and written as its definition."""
    graph = Graph(opset_imports={"": OPSET}, name="lrn")
    x = graph.input("x", shape, dtype)
    graph.opaque[LRN] = OpaqueSpec(
        LRN, "", tuple(helper.make_attribute(k, int(v) if k == "size" else v).SerializeToString() for k, v in params), 1
    )
    graph.output("y", graph.add("opaque", [x], key=LRN, index=0, shape=tuple(shape), dtype=dtype))
    return graph, graph.compact(expand={graph.outputs[0][1]: lrn_definition(params, LRN)})


def lrn_models(shape: Sequence[int], dtype: str = "float32", params: Params = ()) -> tuple[ModelProto, ModelProto]:
    """An LRN of `params` at `shape`: as onnxruntime's LRN kernel, and written as its definition."""
    lrn, definition = _lrn_graphs(shape, dtype, params)
    return export_model(lrn), export_model(definition)


def _lrn_priced(measured: MeasuredCost, shape: Sequence[int], dtype: str, params: Params) -> float:
    """How much more per-op costs price an LRN than its definition: the one opaque op by the analytic estimate,
    the definition by the ops measured."""
    lrn, definition = _lrn_graphs(shape, dtype, params)
    return runtime_cost(lrn, measured) - runtime_cost(definition, measured)


def _as_definition(graph: Graph, sites: Sequence[Site]) -> Graph:
    return graph.compact(
        expand={i: lrn_definition(_lrn_params(graph, (i,)), graph.nodes[i].attr["key"]) for (i, *_) in sites}
    )


# -- choosing


def _each(rewrite: Callable[[Graph, Site], None]) -> Callable[[Graph, Sequence[Site]], Graph]:
    """A rewrite of each site in place, as a rewrite of them all."""

    def apply(graph: Graph, sites: Sequence[Site]) -> Graph:
        for site in sites:
            rewrite(graph, site)
        return graph

    return apply


def _no_params(graph: Graph, site: Site) -> Params:
    return ()


def _alike(measured: MeasuredCost, shape: Sequence[int], dtype: str, params: Params) -> float:
    """Per-op costs price the two forms alike: the same ops, one of them written as another of the same cost."""
    return 0.0


@dataclass(frozen=True)
class _Kind:
    """One computation whose form is chosen: where it is, what its forms depend on beyond shape and type, its two
    forms as models, how to write the other one at given sites (a new graph, or the one given), and how much more
    per-op costs price its input form than the other."""

    name: str
    sites: Callable[[Graph, dict[int, list[int]]], list[Site]]
    models: Callable[[Sequence[int], str, Params], tuple[ModelProto, ModelProto]]
    rewrite: Callable[[Graph, Sequence[Site]], Graph]
    params: Callable[[Graph, Site], Params] = _no_params
    priced: Callable[[MeasuredCost, Sequence[int], str, Params], float] = _alike


KINDS = (
    _Kind(SKIP_LAYERNORM, _skip_sites, lambda shape, dtype, _: skip_norm_models(shape, dtype), _each(_as_sum)),
    _Kind(RMS_NORM, _rms_sites, lambda shape, dtype, _: rms_norm_models(shape, dtype), _each(_as_div)),
    _Kind(LRN, _lrn_sites, lrn_models, _as_definition, _lrn_params, _lrn_priced),
)


def choose_forms(graph: Graph, measured: MeasuredCost) -> tuple[Graph, Forms]:
    """`graph` with each computation of `KINDS` written the other way where, at its shape, that form is measured
    faster than the input's by more than the cost model tells apart (`MeasuredCost.resolution`); and what was
    timed. `graph` itself is not changed."""
    graph = graph.compact()
    forms = Forms()
    tolerance = measured.resolution
    for kind in KINDS:
        groups: dict[tuple[Shape, str, Params], list[Site]] = {}
        for site in kind.sites(graph, graph.readers()):
            n = graph.nodes[site[0]]
            if n.dtype in ("float32", "float16"):
                groups.setdefault((n.shape, n.dtype, kind.params(graph, site)), []).append(site)
        chosen: list[Site] = []
        for (shape, dtype, params), sites in groups.items():
            what: dict[str, Any] = {"fusion": kind.name, "shape": list(shape), "dtype": dtype}
            if params:
                what["params"] = dict(params)
            input_ms, other_ms = measured.compare_forms(json.dumps(what), *kind.models(shape, dtype, params))
            faster = other_ms * (1 + tolerance.relative) + tolerance.ms < input_ms
            priced = 0.0
            if faster:
                priced = kind.priced(measured, shape, dtype, params)
                chosen += sites
            forms.timings.append(FormTiming(kind.name, shape, input_ms, other_ms, len(sites), faster, priced))
        if chosen:
            graph = kind.rewrite(graph, chosen)
    return graph.compact(), forms


def has_sites(graph: Graph) -> bool:
    """Whether `graph` has a computation whose form `choose_forms` would time."""
    readers = graph.readers()
    return any(kind.sites(graph, readers) for kind in KINDS)
