"""Units, what the measured cost model times: one IR node (with its fused activation) or a small group of nodes
onnxruntime runs as one kernel, and the ONNX models built around them (the unit itself, K copies side by side,
onnxruntime's blocked-layout model with its boundary reorders cut off, reorders, null models, calibration chains)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from tensat import ops
from tensat.cost import FUSED_READER, IN_KERNEL_ACTIVATIONS, Computed, Const, Scalar, priced_by_layout
from tensat.ir import Graph, Node
from tensat.onnx.exporter import has_own_emitter
from tensat.onnx_io import export_model
from tensat.session import NCHWC_DOMAIN

Shape = tuple[int, ...]

POOL_1X1 = (("kernel", (1, 1)), ("strides", (1, 1)), ("pads", (0, 0, 0, 0)))


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return value


LINE_BYTES = 64  # a cache line


def streams_weights(weight_bytes: int) -> bool:
    """Whether `weight_bytes` of weights stream through the caches as weights: more than one cache line of them.
    One line (a Where's scalar, an epsilon) costs one fetch cold, and its unit is timed as one without weights."""
    return weight_bytes > LINE_BYTES


@dataclass(frozen=True)
class UnitNode:
    """One node of a unit: op, attributes, and inputs as ("x", k) = external k or ("n", i) = unit node i."""

    op: str
    attrs: tuple[tuple[str, Any], ...]
    inputs: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Unit:
    """A small subgraph timed as one: nodes in topological order (the last is the output), external inputs as
    (shape, is_weight, dtype), the weights timed with one repeated value, as (external, value), and the computed
    externals whose layout the priced graph fixes, as (external, blocked) (`tensat.cost.Computed`). The layouts
    are not part of the signature: the measuring model keys a unit by the layout it times it in."""

    nodes: tuple[UnitNode, ...]
    externals: tuple[tuple[Shape, bool, str], ...]
    values: tuple[tuple[int, float], ...] = ()
    layouts: tuple[tuple[int, bool], ...] = ()

    @staticmethod
    def single(node: Node, in_shapes: Sequence[Sequence[int]], const: Sequence[Const]) -> Unit:
        """The unit of one node: a `Scalar` operand timed with its value, an integer operand the op types
        (`OpDef.operand_dtypes`: a Gather's or a GatherND's indices) that is a weight as zeros, indices in range
        whatever the data's dims, and an integer weight the op divides by (`OpDef.nonzero`: Mod's divisor, which
        onnxruntime checks when it loads the model) as ones."""
        flags = list(const) + [False] * (len(in_shapes) - len(const))
        dtypes = ops.operand_dtypes(node.op, node.dtype, len(in_shapes))
        ext = tuple((tuple(int(d) for d in s), bool(c), t) for s, c, t in zip(in_shapes, flags, dtypes))
        un = UnitNode(node.op, tuple(node.attrs), tuple(("x", k) for k in range(len(in_shapes))))
        d = ops.get(node.op)
        indices = {k for k, t in d.operand_dtypes.items() if np.dtype(t).kind in "iu"}  # as zeros
        divisors = {k for k in d.nonzero if np.dtype(dtypes[k]).kind in "iu"}  # as ones
        values = [
            (k, c.value if isinstance(c, Scalar) else float(k in divisors))
            for k, c in enumerate(flags)
            if isinstance(c, Scalar) or (c and k in indices | divisors)
        ]
        layouts = tuple((k, c.blocked) for k, c in enumerate(flags) if isinstance(c, Computed))
        return Unit((un,), ext, tuple(values), layouts)

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(n.op for n in self.nodes)

    @property
    def weighted(self) -> bool:
        """Whether the unit has weights that stream through the caches (`streams_weights`)."""
        return streams_weights(self.weight_bytes())

    def shapes(self) -> list[Shape]:
        """Output shape of every node."""
        out: list[Shape] = []
        for n in self.nodes:
            ins = [self.externals[i][0] if kind == "x" else out[i] for kind, i in n.inputs]
            attrs = dict(n.attrs)
            out.append(tuple(attrs["shape"]) if n.op == "opaque" else ops.shape_of(n.op, ins, attrs))
        return out

    @property
    def out_shape(self) -> Shape:
        return self.shapes()[-1]

    @property
    def dtype(self) -> str:
        """The element type of the unit's output."""
        types: list[str] = []
        for n in self.nodes:
            ins = [self.externals[i][2] if kind == "x" else types[i] for kind, i in n.inputs]
            types.append(ops.dtype_of(n.op, ins, dict(n.attrs)))
        return types[-1] if types else "float32"

    def weight_bytes(self) -> int:
        return sum(_nbytes(s, d) for s, c, d in self.externals if c)

    def signature(self) -> str:
        """Canonical JSON text naming what is timed."""
        nodes = [[n.op, [[k, _jsonable(v)] for k, v in n.attrs], [list(i) for i in n.inputs]] for n in self.nodes]
        ext = [[list(s), int(c), d] for s, c, d in self.externals]
        named: dict[str, Any] = {"nodes": nodes, "ext": ext}
        if self.values:
            named["values"] = [list(v) for v in self.values]
        return json.dumps(named, sort_keys=True, separators=(",", ":"))

    def label(self) -> str:
        return "+".join(self.ops)


def pricing_unit(node: Node, in_shapes: Sequence[Sequence[int]], const: Sequence[Const]) -> Unit:
    """The unit that prices one node: `Unit.single` of the node as onnxruntime computes it, so that one
    computation written two ways is timed once. Two separate measurements of it would differ by noise alone (or by
    when each was taken), and the extractor would prefer the cheaper-looking form, which can undo what onnxruntime
    fuses (its GELU and LayerNorm fusions match operands in the order exporters write them). So:
    - a convolution with a fused activation is timed with it, as the Conv and the activation, which onnxruntime
      fuses as in the graph (a parametric one, a Clip with its bounds, is the item's `tensat.cost.FUSED_READER`); with
      a Relu, which the convolution applies inside its own output loop (`tensat.cost.IN_KERNEL_ACTIVATIONS`), as the
      plain convolution. The fused and the unfused pair price the same either way (`tensat.cost.fused_item`);
    - an element-wise op is timed without the leading dimensions of size 1 its output has (a Mul on 1x64x1024 and
      on 64x1024 run the same loop), unless its price depends on its operands' layout (`tensat.cost.priced_by_layout`)
      and one is held blocked: then its 4-D shape tells the measuring model the reorders onnxruntime puts around it
      (`MeasuredCost._leaves_layout`);
    - a commutative op is timed with its operands in one order (variables before weights, then by shape);
    - a MatMul given a third operand, the addend of the Gemm onnxruntime fuses it into (`tensat.cost.fused_item`),
      is timed as the MatMul and the Add, which onnxruntime fuses in the unit as in the graph; an N-D product as the
      2-D one the Gemm computes: in the graph the Reshapes onnxruntime puts around it are views, where in a unit the
      one into the unit's output would copy it."""
    d = ops.get(node.op)
    flags = list(const) + [False] * (len(in_shapes) - len(const))
    shapes = [tuple(int(x) for x in s) for s in in_shapes]
    if node.op == "matmul" and len(shapes) == 3:
        a, w, b = shapes
        if len(a) > 2 and all(dim == 1 for dim in (*w[:-2], *b[:-2])):  # a Gemm's operands as it multiplies them
            shapes = [(math.prod(a[:-1]), a[-1]), tuple(w[-2:]), (1,) * (2 - len(b[-2:])) + tuple(b[-2:])]
        product = Unit.single(node, shapes[:2], flags[:2])
        addend = (shapes[2], bool(flags[2]), node.dtype)
        add = UnitNode("add", (), (("n", 0), ("x", 2)))
        return Unit((*product.nodes, add), (*product.externals, addend), product.values, product.layouts)
    blocked = any(isinstance(c, Computed) and c.blocked for c in flags)
    if d.kind in ("unary", "broadcast") and not (blocked and priced_by_layout(node.op, flags)):
        rank = len(node.shape)
        drop = next((k for k, dim in enumerate(node.shape) if dim != 1), max(rank - 1, 0))
        padded = [(1,) * (rank - len(s)) + s for s in shapes]
        shapes = [s[drop:] for s in padded]
    if d.commutative and len(shapes) == 2:
        ordered = sorted(zip(shapes, flags), key=lambda sf: (bool(sf[1]), sf[0]))
        shapes, flags = [s for s, _ in ordered], [f for _, f in ordered]
    unit = Unit.single(node, shapes, flags)
    if node.op != "conv2d":
        return unit
    reader = node.attr.get(FUSED_READER)
    in_kernel = ops.ACT_NAMES[node.attr.get("act", ops.ACT_NONE)] in IN_KERNEL_ACTIVATIONS
    if reader is None and not in_kernel:
        return unit
    head = unit.nodes[0]
    attrs = tuple((k, ops.ACT_NONE if k == "act" and in_kernel else v) for k, v in head.attrs if k != FUSED_READER)
    nodes = [UnitNode(head.op, attrs, head.inputs)]
    if reader is not None:
        nodes.append(UnitNode(reader[0], tuple(reader[1]), (("n", 0),)))
    return Unit(tuple(nodes), unit.externals, unit.values, unit.layouts)


def _nbytes(shape: Sequence[int], dtype: str = "float32") -> int:
    try:
        size = np.dtype(dtype).itemsize
    except TypeError:
        size = 4
    return int(math.prod(shape)) * size


def _random_array(rng: np.random.Generator, shape: Sequence[int], dtype: str) -> np.ndarray:
    """Seeded data of `shape` for a timed model: small floats, integers 0 or 1 (valid as any index, and as the
    attention mask whose cumulative sum OPT reads its positions by, as `tensat.verify.random_inputs` makes them),
    random booleans."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return ((rng.random(tuple(shape), dtype=np.float32) - 0.5) * 0.2).astype(dt, copy=False)
    if dt.kind in "iu":
        return rng.integers(0, 2, size=tuple(shape)).astype(dt)
    if dt.kind == "b":
        return rng.random(tuple(shape)) < 0.5
    raise ValueError(f"cannot make data of type {dtype}")


UNIT_OPSET = 17  # the opset units are written at; onnxruntime's own kernels stand in for later standard ops (Gelu)


def unit_opset(unit: Unit) -> int:
    """The opset `unit` is written at: `UNIT_OPSET`, or the opset one of its ops entered the ONNX standard at where
    nothing stands in for it before (Mish, opset 18)."""
    later = [
        since
        for op in unit.ops
        if (since := ops.get(op).standard_since) is not None and since > UNIT_OPSET and not has_own_emitter(op)
    ]
    return max([UNIT_OPSET, *later])


def unit_model(unit: Unit, seed: int = 0) -> ModelProto:
    """The one-copy ONNX model of `unit`: weights as initializers, other inputs as graph inputs x0, x1, ..."""
    rng = np.random.default_rng(seed)
    g = Graph(opset_imports={"": unit_opset(unit)}, name="unit")
    values = dict(unit.values)
    ext_ids = []
    for k, (shape, const, dtype) in enumerate(unit.externals):
        if const and k in values:
            ext_ids.append(g.weight(np.full(shape, values[k], dtype=dtype), f"w{k}"))
        elif const:
            ext_ids.append(g.weight(_random_array(rng, shape, dtype), f"w{k}"))
        else:
            ext_ids.append(g.input(f"x{k}", shape, dtype))
    built: list[int] = []
    for n in unit.nodes:
        ins = [ext_ids[i] if kind == "x" else built[i] for kind, i in n.inputs]
        built.append(g.add(n.op, ins, **dict(n.attrs)))
    g.output("y", built[-1])

    return export_model(g)


_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
# the inputs of an ONNX op that are its parameters, not data, floats among them (a Resize's scales)
PARAMETER_INPUTS = {"Resize": slice(1, None), "Upsample": slice(1, None)}


def replicate(model: ModelProto, copies: int) -> ModelProto:
    """`copies` copies of a one-output model side by side: integer initializers and parameters (`PARAMETER_INPUTS`)
    shared; graph inputs, other float initializers (the weights) and outputs distinct per copy (x__0, ..., y__0,
    ...). Inside a graph no kernel reads a tensor the kernel before it has just read: copies sharing an input would
    each find it in the nearest caches. Each copy's weights are the first's scaled a little, so that no two are
    equal, but for one-element weights: their value may decide the kernel (Pow's exponent)."""
    g1 = model.graph
    parameters = {x for n in g1.node if n.op_type in PARAMETER_INPUTS for x in n.input[PARAMETER_INPUTS[n.op_type]]}
    shared = {t.name for t in g1.initializer if t.data_type not in _FLOAT_TYPES or t.name in parameters}
    inits = [t for t in g1.initializer if t.name in shared]
    floats = [(t, numpy_helper.to_array(t)) for t in g1.initializer if t.name not in shared]
    nodes: list[onnx.NodeProto] = []
    inputs: list[onnx.ValueInfoProto] = []
    outputs: list[onnx.ValueInfoProto] = []
    for k in range(copies):

        def rn(name: str) -> str:
            return name if not name or name in shared else f"{name}__{k}"

        def renamed(value: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
            v = onnx.ValueInfoProto()
            v.CopyFrom(value)
            v.name = rn(value.name)
            return v

        for t, arr in floats:
            scaled = k > 0 and arr.size > 1
            value = (arr * np.asarray(1.0 + k / 1024.0, dtype=arr.dtype)).astype(arr.dtype) if scaled else arr
            inits.append(numpy_helper.from_array(value, rn(t.name)))
        for n in g1.node:
            c = onnx.NodeProto()
            c.CopyFrom(n)
            del c.input[:]
            del c.output[:]
            c.input.extend(rn(i) for i in n.input)
            c.output.extend(rn(o) for o in n.output)
            if n.name:
                c.name = f"{n.name}__{k}"
            nodes.append(c)
        inputs.extend(renamed(i) for i in g1.input)
        outputs.extend(renamed(o) for o in g1.output)
    graph = helper.make_graph(nodes, g1.name, inputs, outputs, initializer=inits)
    out = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name="tensat-measure")
    out.ir_version = model.ir_version
    return out


def reorder_model(kind: str, shape: Sequence[int], block: int) -> ModelProto:
    """A model of one NCHWc reorder of the NCHW tensor `shape`: "in" = NCHW x -> blocked, "out" = blocked (channels
    padded) -> NCHW y; "in_nhwc" and "out_nhwc" the same reorders reading or writing the tensor channels last (NHWC),
    as onnxruntime runs a Transpose between NHWC and a blocked tensor."""
    n, c = shape[0], shape[1]
    padded = [n, -(-c // block) * block, *shape[2:]]
    plain = [n, *shape[2:], c] if kind.endswith("_nhwc") else list(shape)
    last: dict[str, Any] = {"channels_last": 1} if kind.endswith("_nhwc") else {}
    if kind.startswith("in"):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, plain)
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, padded)
        node = helper.make_node("ReorderInput", ["x"], ["y"], domain=NCHWC_DOMAIN, **last)
    else:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, padded)
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, plain)
        node = helper.make_node("ReorderOutput", ["x"], ["y"], domain=NCHWC_DOMAIN, channels=int(c), **last)
    graph = helper.make_graph([node], f"reorder_{kind}", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(NCHWC_DOMAIN, 1)])
    model.ir_version = 8
    return model


def strip_reorders(model: ModelProto, block: int) -> ModelProto:
    """onnxruntime's optimized `model` with its boundary reorders cut off: a ReorderInput of a graph input becomes a
    blocked graph input, a ReorderOutput giving a graph output becomes a blocked graph output (channels padded to
    `block`)."""
    g = model.graph
    dims = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in [*g.input, *g.output]}
    inputs = {vi.name for vi in g.input}
    outputs = {vi.name for vi in g.output}

    def padded(shape: Sequence[int]) -> list[int]:
        return [shape[0], -(-shape[1] // block) * block, *shape[2:]]

    blocked_in: dict[str, list[int]] = {}
    renamed_out: dict[str, str] = {}
    nodes = []
    for n in g.node:
        nchwc = n.domain == NCHWC_DOMAIN
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if nchwc and n.op_type == "ReorderInput" and n.input[0] in inputs and not attrs.get("channels_last", 0):
            blocked_in[n.output[0]] = padded(dims[n.input[0]])
        elif nchwc and n.op_type == "ReorderOutput" and n.output[0] in outputs and not attrs.get("channels_last", 0):
            renamed_out[n.output[0]] = n.input[0]
        else:
            nodes.append(n)
    used = {i for n in nodes for i in n.input}
    kept = [vi for vi in g.input if vi.name in used]
    kept += [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
        for name, shape in blocked_in.items()
        if name in used
    ]
    outs = [
        helper.make_tensor_value_info(renamed_out[vi.name], TensorProto.FLOAT, padded(dims[vi.name]))
        if vi.name in renamed_out
        else vi
        for vi in g.output
    ]
    used_inits = [t for t in g.initializer if t.name in used]
    out = helper.make_model(
        helper.make_graph(nodes, g.name, kept, outs, initializer=used_inits),
        opset_imports=list(model.opset_import),
        producer_name="tensat-measure",
    )
    out.ir_version = model.ir_version
    return out


def sample_outputs(model: ModelProto) -> ModelProto:
    """`model` with each 4-D graph output read by a strided 1x1 max pool (blocked) taking one pixel, the pools'
    outputs as the graph outputs: the tensors become buffers onnxruntime allocates and may update in place."""
    g = model.graph
    nodes, outs = list(g.node), []
    for vi in g.output:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        name = f"{vi.name}__sample"
        nodes.append(
            helper.make_node(
                "MaxPool",
                [vi.name],
                [name],
                domain=NCHWC_DOMAIN,
                kernel_shape=[1, 1],
                strides=dims[2:],
                pads=[0, 0, 0, 0],
            )
        )
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [*dims[:2], 1, 1]))
    out = helper.make_model(
        helper.make_graph(nodes, g.name, list(g.input), outs, initializer=list(g.initializer)),
        opset_imports=list(model.opset_import),
        producer_name="tensat-measure",
    )
    out.ir_version = model.ir_version
    return out


def prologue_model(stripped: ModelProto, count: int) -> ModelProto:
    """The null model of a unit with a prologue: the first `count` nodes of its stripped model (the pools
    `_with_prologue` put first), their outputs sampled (`sample_outputs`) as the unit's output is."""
    g = stripped.graph
    pools = list(g.node)[:count]
    inputs = {vi.name: vi for vi in g.input}
    outs = [
        helper.make_tensor_value_info(
            n.output[0], TensorProto.FLOAT, [d.dim_value for d in inputs[n.input[0]].type.tensor_type.shape.dim]
        )
        for n in pools
    ]
    out = helper.make_model(
        helper.make_graph(pools, "prologue", [inputs[n.input[0]] for n in pools], outs),
        opset_imports=list(stripped.opset_import),
        producer_name="tensat-measure",
    )
    out.ir_version = stripped.ir_version
    return sample_outputs(out)


def _tiny_model(op: str = "Relu", shape: Sequence[int] = (1, 1)) -> ModelProto:
    """A one-node model `op` over one float tensor of `shape` (the CUDA probe's, and the null model's copy)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "tiny", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def chain_model(length: int) -> ModelProto:
    """`length` one-element Relus in a chain (to measure the per-node dispatch cost)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])
    names = ["x"] + [f"t{k}" for k in range(length - 1)] + ["y"]
    nodes = [helper.make_node("Relu", [names[k]], [names[k + 1]]) for k in range(length)]
    model = helper.make_model(helper.make_graph(nodes, "chain", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def null_model(copies: int) -> ModelProto:
    """`copies` one-element Relus side by side on one input: the interface cost of a K-copy unit model."""
    return replicate(_tiny_model(), copies)


def _is_plausibly_blocked(shape: Sequence[int], dtype: str = "float32") -> bool:
    """A 4-D float tensor whose channels the NCHWc layout accepts (a multiple of 4)."""
    return len(shape) == 4 and np.dtype(dtype).kind == "f" and shape[1] % 4 == 0 and shape[1] > 0


def _prologue_fed(unit: Unit) -> dict[str, slice]:
    """The ops of `unit` whose operands `_with_prologue` may feed blocked, each with the operands it may."""
    if "conv2d" in unit.ops:
        return {"add": slice(None)}
    if unit.ops in (("batchnorm",), ("resize",)):
        return {unit.ops[0]: slice(0, 1)}  # the data; not the statistics
    return {}


def prologue_operands(unit: Unit) -> list[int]:
    """The computed externals of `unit` that `_with_prologue` feeds blocked where they arrive blocked."""
    fed = _prologue_fed(unit)
    found: list[int] = []
    for n in unit.nodes:
        if n.op not in fed:
            continue
        for kind, i in n.inputs[fed[n.op]]:
            if kind == "x" and not unit.externals[i][1] and i not in found:
                found.append(i)
    return found


def _with_prologue(unit: Unit, arrives_blocked: Callable[[int], bool] | None = None) -> tuple[Unit, list[Unit]]:
    """Inside a graph, some operands arrive in the blocked layout, and onnxruntime runs what reads them blocked only
    then: it fuses the residual Add of a Conv+Add into the convolution, runs a BatchNormalization (DenseNet's,
    before its convolution) as a blocked Conv, and a Resize by whole scales (DPT's, after its convolutions) as a
    blocked Upsample; from a graph input it would do none of these. So feed such operands (the externals
    `arrives_blocked` accepts, by index; without it, those `_is_plausibly_blocked`) through a 1x1 max pool (which
    runs blocked), returning the unit to optimize and the prologue pools (one unit each)."""
    fed = _prologue_fed(unit)

    def plausibly(i: int) -> bool:
        return _is_plausibly_blocked(unit.externals[i][0], unit.externals[i][2])

    targets = [i for i in prologue_operands(unit) if (arrives_blocked or plausibly)(i)]
    if not targets:
        return unit, []
    where = {i: k for k, i in enumerate(targets)}
    head = [UnitNode("maxpool", POOL_1X1, (("x", i),)) for i in targets]
    body = []
    for n in unit.nodes:
        refs = []
        for kind, i in n.inputs:
            if kind == "n":
                refs.append(("n", i + len(head)))
            elif n.op in fed and i in where:
                refs.append(("n", where[i]))
            else:
                refs.append((kind, i))
        body.append(UnitNode(n.op, n.attrs, tuple(refs)))
    prologue = [Unit((UnitNode("maxpool", POOL_1X1, (("x", 0),)),), (unit.externals[i],)) for i in targets]
    return Unit(tuple(head + body), unit.externals, unit.values, unit.layouts), prologue
