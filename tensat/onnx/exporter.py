"""Export: tensat IR -> ONNX model for the source model's opset (`export_model`).

Weight-only subgraphs are folded into initializers; each IR node is emitted through `EXPORTERS`, built from the
operator registry: an op without attributes becomes its ONNX op (`OpDef.onnx`) with no code here; ops with
attributes and opaque nodes have emitters below.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, ModelProto, NodeProto, TensorProto, helper, numpy_helper

from tensat import ops
from tensat._version import __version__
from tensat.errors import ModelError
from tensat.ir import FLOAT, Graph, OpaqueSpec, merged_concats
from tensat.onnx.common import (
    NONDETERMINISTIC,
    OUTER,
    OUTER_RE,
    elem_type,
    free_names,
    ir_version_for,
    onnx_schema,
    rename_free,
    run_node,
)
from tensat.onnx.external import external_tensor, file_region, set_external_dir, subgraphs


class _Namer:
    """Unique, deterministic tensor and node names."""

    def __init__(self, reserved: Sequence[str] = ()) -> None:
        self.used: set[str] = set(reserved)

    def __call__(self, base: str) -> str:
        base = base or "t"
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name


# a MatMul written as a FusedMatMul: {operand index: the tensor read there}, the nodes folded into it, its
# attributes, and the node whose tensor it writes (the MatMul's own, or the scale of its output folded in)
FusedMatMulPlan = tuple[dict[int, int], set[int], dict[str, Any], int]


@dataclass
class _Exporter:
    """Builds the ONNX graph for one IR graph; the emitters in EXPORTERS append nodes through it."""

    graph: Graph
    keep_external: bool = False  # weights mapped from a file stay there (see `export_model`)
    fuse_matmuls: bool = False  # MatMuls onnxruntime folds a Transpose or a scale into written as FusedMatMul
    opset: int = 17
    nodes: list[NodeProto] = field(default_factory=list)
    initializers: list[tuple[np.ndarray, str]] = field(default_factory=list)  # written into the model at the end
    names: dict[int, str] = field(default_factory=dict)
    consts: dict[int, np.ndarray] = field(default_factory=dict)
    domains: set[str] = field(default_factory=set)
    _int_consts: dict[tuple[int, ...], str] = field(default_factory=dict)
    _opaque_values: dict[tuple[str, tuple[int, ...]], list[np.ndarray | None] | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.opset = int(self.graph.opset_imports.get("", 17))
        g = self.graph
        self.live = g.live()
        reserved = [g.input_name(i) for i in g.input_ids] + [name for name, _ in g.outputs]
        self.namer = _Namer(reserved)
        self.node_namer = _Namer()

    # -- helpers used by exporters -------------------------------------------------------------------------------

    def tensor(self, i: int) -> str:
        """ONNX name of IR node `i`'s tensor."""
        return self.names[i]

    def emit(
        self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], base: str, domain: str = "", **attrs: Any
    ) -> NodeProto:
        node = helper.make_node(
            op_type, list(inputs), list(outputs), name=self.node_namer(base), domain=domain or None, **attrs
        )
        self.nodes.append(node)
        return node

    def int64(self, values: Sequence[int], base: str) -> str:
        """An int64 1-D initializer (shared between identical uses)."""
        key = tuple(int(v) for v in values)
        if key not in self._int_consts:
            name = self.namer(base)
            self.initializers.append((np.asarray(key, dtype=np.int64), name))
            self._int_consts[key] = name
        return self._int_consts[key]

    # -- driver -------------------------------------------------------------------------------------------------

    def run(self) -> ModelProto:
        g = self.graph
        self._fold()
        self._name_outputs()
        uses: dict[int, int] = {}
        emitted = [i for i in self.live if not g.nodes[i].is_leaf and i not in self.consts]
        for i in emitted:
            for j in g.nodes[i].inputs:
                uses[j] = uses.get(j, 0) + 1
        self.uses = uses
        self.output_ids = {n for _, n in g.outputs}
        self.readers = self._consumers(emitted)
        self.gemms = self._find_gemms(emitted)
        self.fused_matmuls = self._find_fused_matmuls(emitted) if self.fuse_matmuls else {}
        self.summed = self._find_summed(emitted)
        self.transposed_b = self._find_transposed_b()
        self.squeezed = self._find_squeezable(emitted)
        for i in self.live:
            n = g.nodes[i]
            if n.op == "input":
                self.names[i] = n.attr["name"]
        self._materialize(emitted)
        for i in emitted:
            if i not in self.names:
                self.names[i] = self.namer(f"{g.nodes[i].op}_{i}")
        self.splits = self._find_splits(emitted)
        self.absorbed = set(  # inner concats of a same-axis chain, merged into one N-ary Concat
            merged_concats(
                g, emitted, lambda j: j not in self.consts and self.uses.get(j) == 1 and j not in self.output_ids
            )
        )
        self.topk_groups: dict[tuple[Any, ...], dict[int, int]] = {}
        for i in emitted:
            n = g.nodes[i]
            if n.op == "topk":
                self.topk_groups.setdefault(ops.topk_kernel(n.inputs, n.attr), {})[n.attr["output"]] = i
        self.opaque_done: set[tuple[str, tuple[int, ...]]] = set()
        self.opaque_groups: dict[tuple[str, tuple[int, ...]], dict[int, int]] = {}
        for i in emitted:
            n = g.nodes[i]
            if n.op == "opaque":
                self.opaque_groups.setdefault((n.attr["key"], n.inputs), {})[n.attr["index"]] = i
        fused = set(self.gemms.values()).union(*(plan[1] for plan in self.fused_matmuls.values()))
        for i in emitted:
            n = g.nodes[i]
            if i in self.absorbed or i in fused or (n.op == "slice" and i in self.splits and self.splits[i] is None):
                continue
            if i in self.gemms:
                _ex_gemm(self, i)
                continue
            if i in self.fused_matmuls:
                _ex_matmul_as_fused(self, i)
                continue
            EXPORTERS["sum" if i in self.summed else n.op](self, i)
        self._emit_output_aliases()
        return self._model()

    def _fold(self) -> None:
        """Evaluate every weight-only node (numpy; opaque ones in onnxruntime when possible)."""
        g = self.graph
        for i in self.live:
            n = g.nodes[i]
            if n.op == "weight":
                self.consts[i] = g.weights[n.attr["name"]]
            elif ops.constant_leaf(n.op):
                self.consts[i] = g.constant(i)  # type: ignore[assignment]
            elif n.op == "input" or not n.inputs or not all(j in self.consts for j in n.inputs):
                continue
            elif n.op == "opaque":
                value = self._fold_opaque(i)
                if value is not None:
                    self.consts[i] = value
            else:
                value = ops.evaluate(n.op, [self.consts[j] for j in n.inputs], n.attr)
                try:
                    value = value.astype(np.dtype(n.dtype), copy=False)
                except TypeError:
                    pass
                self.consts[i] = value

    def _fold_opaque(self, i: int) -> np.ndarray | None:
        g = self.graph
        n = g.nodes[i]
        key = n.attr["key"]
        spec = g.opaque[key]
        if spec.op_type in NONDETERMINISTIC or any(subgraphs(AttributeProto.FromString(b)) for b in spec.attributes):
            return None
        group = (key, n.inputs)
        if group not in self._opaque_values:
            outputs = _output_names(g, spec, {k: f"y{k}" for k in range(spec.num_outputs)}, lambda k: f"y{k}")
            node, _ = _opaque_node(g, key, [f"x{k}" for k in range(len(n.inputs))], outputs)
            values = iter(self.consts[j] for j in n.inputs)
            arrays = [next(values) if name else None for name in node.input]
            try:
                self._opaque_values[group] = run_node(node, arrays, g.opset_imports)
            except Exception:  # noqa: BLE001 - leave it to run at inference
                self._opaque_values[group] = None
        results = self._opaque_values[group]
        return None if results is None or n.attr["index"] >= len(results) else results[n.attr["index"]]

    def _name_outputs(self) -> None:
        """Graph outputs name the tensors that compute them (first claim wins; others get Identity nodes)."""
        g = self.graph
        self.aliases: list[tuple[str, int]] = []
        claimed: dict[str, int] = {}
        for name, i in g.outputs:
            if name in claimed:
                if claimed[name] != i:
                    raise ModelError(f"graph output '{name}' names two different tensors")
                continue
            claimed[name] = i
            n = g.nodes[i]
            if n.op == "input":
                if n.attr["name"] != name:
                    self.aliases.append((name, i))
            elif i in self.names:
                self.aliases.append((name, i))
            else:
                self.names[i] = name

    def _materialize(self, emitted: Sequence[int]) -> None:
        """Initializers for constants read by computed nodes or named as outputs (zero conv biases dropped)."""
        g = self.graph
        needed: list[int] = []
        for i in emitted:
            n = g.nodes[i]
            ins = n.inputs[:2] if n.op in ("conv2d", "conv1d") and self._zero_bias(i) else n.inputs
            needed += [j for j in ins if j in self.consts]
        needed += [i for _, i in g.outputs if i in self.consts]
        needed += [i for _, i in self.aliases if i in self.consts]
        for i in sorted(set(needed)):
            n = g.nodes[i]
            if i not in self.names:
                base = n.attr["name"] if n.op == "weight" else f"{n.op}_{i}_folded"
                self.names[i] = self.namer(base)
            array = self.consts[i].T if i in self.transposed_b else self.consts[i]
            if i in self.squeezed:
                keep = 2 if any(g.nodes[k].op == "matmul" for k in self.readers.get(i, ())) else 1
                array = array.reshape(_without_leading_ones(array.shape, keep))
            self.initializers.append((array, self.names[i]))

    def _consumers(self, emitted: Sequence[int]) -> dict[int, list[int]]:
        """Emitted nodes reading each node, in order."""
        readers: dict[int, list[int]] = {}
        for i in emitted:
            for j in self.graph.nodes[i].inputs:
                readers.setdefault(j, []).append(i)
        return readers

    def _find_squeezable(self, emitted: Sequence[int]) -> set[int]:
        """Constants that are a vector behind leading 1s read only as broadcast operands of Add/Mul, or a matrix
        behind leading 1s read only as the right operand of MatMuls, whose other operand has the output's rank.

        The importer gives a low-rank constant operand (a bias of shape (N,), a (K, N) weight of a batched product)
        the rank of the other operand, so the e-graph's shape rules stay simple; broadcasting makes the leading
        ones redundant, and onnxruntime's kernels and fusions (a 2-D packed weight, MatMul+Add into Gemm, bias
        fusions) look for the constant in its usual shape. Exported without them, the constant is what the
        exporter of the input model wrote. (Other constants keep their shape: a (1, T, C) position embedding
        stays as the input had it.)"""
        g = self.graph
        readers = self.readers
        out = set()
        for j, users in readers.items():
            if j not in self.consts or j in self.output_ids or not users:
                continue
            shape = self.consts[j].shape
            keep = 2 if any(g.nodes[i].op == "matmul" for i in users) else 1
            stripped = _without_leading_ones(shape, keep)
            if len(stripped) == len(shape) or len(stripped) != keep:
                continue
            ok = True
            for i in users:
                n = g.nodes[i]
                others = [k for k in n.inputs if k != j]
                if (
                    not (ops.get(n.op).kind == "broadcast" or n.op == "matmul")
                    or (n.op == "matmul" and n.inputs[0] == j)
                    or not others
                    or any(len(g.nodes[k].shape) != len(n.shape) for k in others)
                ):
                    ok = False
                    break
            if ok:
                out.add(j)
        return out

    def _find_summed(self, emitted: Sequence[int]) -> set[int]:
        """Add nodes written as a Sum (the same sum): those a LayerNormalization normalizes. onnxruntime fuses an
        Add before a LayerNormalization into its SkipLayerNormalization kernel, which tensat prices as its own op
        (`skip_layernorm`, written as that kernel where the extraction chose it); where the extraction chose the Add
        and the LayerNormalization apart, as priced, a Sum is what keeps onnxruntime running them apart."""
        g = self.graph
        return {
            i
            for i in emitted
            if g.nodes[i].op == "add"
            and i not in self.gemms
            and any(g.nodes[r].op == "layernorm" and g.nodes[r].inputs[0] == i for r in self.readers.get(i, ()))
        }

    def _find_gemms(self, emitted: Sequence[int]) -> dict[int, int]:
        """Add nodes that export with the MatMul they read as one Gemm: add id -> matmul id.

        A 2-D MatMul of a computed operand by a constant, read only by an Add of a constant bias that broadcasts
        to the product's shape: the importer lowers a Gemm to exactly this, and the Gemm is what onnxruntime runs
        fastest (it fuses MatMul+Add into Gemm itself where it can; exporting the Gemm keeps that fusion whatever
        shape the bias took in the e-graph)."""
        g = self.graph
        out: dict[int, int] = {}
        for i in emitted:
            n = g.nodes[i]
            if n.op != "add" or len(n.shape) != 2 or n.dtype != FLOAT:
                continue
            for m, bias in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
                mm = g.nodes[m]
                if (
                    mm.op == "matmul"
                    and m not in self.consts
                    and bias in self.consts
                    and self.uses.get(m) == 1
                    and m not in self.output_ids
                    and len(g.nodes[mm.inputs[0]].shape) == 2
                    and mm.inputs[0] not in self.consts
                    and mm.inputs[1] in self.consts
                    and len(self.consts[mm.inputs[1]].shape) == 2
                    and _broadcasts_to(self.consts[bias].shape, n.shape)
                ):
                    out[i] = m
                    break
        return out

    def _find_fused_matmuls(self, emitted: Sequence[int]) -> dict[int, FusedMatMulPlan]:
        """MatMuls onnxruntime's CPU session runs as a FusedMatMul, with what it folds into them: matmul id ->
        ({operand index: the tensor the FusedMatMul reads there}, the nodes folded, FusedMatMul's attributes, the
        node whose tensor it writes). It folds into an operand a Transpose of the last two axes
        (`tensat.cost.transposes_into_matmul`'s swap) and a Mul by a one-element constant (its MatMulScaleFusion),
        each read by nothing else, in either order; and, where the MatMul is read by nothing else, a Mul of its
        output by a one-element constant, whose tensor the FusedMatMul then writes. Written as the FusedMatMul it
        runs, the model asks for the kernel it gets (`tensat.onnx.fusions.check_kernels`)."""
        g = self.graph
        in_gemm = set(self.gemms.values())
        out: dict[int, FusedMatMulPlan] = {}
        claimed: set[int] = set()  # folded into an earlier MatMul's FusedMatMul (a scale of its output)
        for i in emitted:
            n = g.nodes[i]
            if n.op != "matmul" or i in in_gemm or n.dtype != FLOAT:
                continue
            reads: dict[int, int] = {}
            folded: set[int] = set()
            attrs: dict[str, Any] = {"transA": 0, "transB": 0, "alpha": 1.0}
            for k, j in enumerate(n.inputs):
                trans = "transA" if k == 0 else "transB"
                while j not in self.consts and self.uses.get(j) == 1 and j not in self.output_ids | claimed:
                    src = g.nodes[j]
                    rank = len(src.shape)
                    scale = self._scale_of(j)
                    if src.op == "transpose" and not attrs[trans]:
                        if tuple(src.attr["perm"]) != (*range(rank - 2), rank - 1, rank - 2):
                            break
                        attrs[trans] = 1
                    elif scale is not None:
                        attrs["alpha"] *= float(self.consts[scale].reshape(()))
                    else:
                        break
                    folded.add(j)
                    j = next(x for x in src.inputs if x != scale)
                    reads[k] = j
            writes = i
            if self.uses.get(i) == 1 and i not in self.output_ids:
                (r,) = self.readers[i]
                scale = self._scale_of(r)
                if scale is not None:
                    attrs["alpha"] *= float(self.consts[scale].reshape(()))
                    folded.add(r)
                    writes = r
            if folded:
                out[i] = (reads, folded, attrs, writes)
                claimed |= folded
        return out

    def _scale_of(self, i: int) -> int | None:
        """The one-element constant node `i` multiplies a tensor by, where `i` is such a Mul (what onnxruntime's
        MatMulScaleFusion folds into a FusedMatMul's alpha), else None."""
        n = self.graph.nodes[i]
        scales = [x for x in n.inputs if x in self.consts and self.consts[x].size == 1]
        if n.op == "mul" and len(scales) == 1 and len(n.inputs) == 2 and len(set(n.inputs)) == 2:
            return scales[0]
        return None

    def _find_transposed_b(self) -> set[int]:
        """2-D constants held as the transposed view of a weight (the importer reads a Gemm with transB so), read
        only as the right operand of Gemms. They are exported as the weight was stored, with transB, instead of
        as a transposed copy: a layout the extraction did not choose, and a strided copy of what may be hundreds
        of megabytes."""
        g = self.graph
        fused = set(self.gemms.values())
        aliased = {i for _, i in self.aliases} | self.output_ids
        out: set[int] = set()
        for m in fused:
            b = g.nodes[m].inputs[1]
            array = self.consts[b]
            if (
                array.ndim == 2
                and not array.flags.c_contiguous
                and array.T.flags.c_contiguous
                and b not in aliased
                and all(r in fused and g.nodes[r].inputs[0] != b for r in self.readers[b])
            ):
                out.add(b)
        return out

    def _zero_bias(self, i: int) -> bool:
        b = self.graph.nodes[i].inputs[2]
        return b in self.consts and not np.any(self.consts[b])

    def _find_splits(self, emitted: Sequence[int]) -> dict[int, tuple[int, ...] | None]:
        """Slices partitioning one tensor along one axis: first slice id -> group, other members -> None."""
        g = self.graph
        groups: dict[tuple[int, int], list[int]] = {}
        for i in emitted:
            n = g.nodes[i]
            if n.op == "slice":
                groups.setdefault((n.inputs[0], n.attr["axis"]), []).append(i)
        out: dict[int, tuple[int, ...] | None] = {}
        for (src, axis), members in groups.items():
            if len(members) < 2:
                continue
            members.sort(key=lambda i: g.nodes[i].attr["start"])
            pos = 0
            for i in members:
                if g.nodes[i].attr["start"] != pos:
                    break
                pos += g.nodes[i].attr["size"]
            else:
                if pos == g.nodes[src].shape[axis]:
                    first = min(members)
                    out.update({i: None for i in members})
                    out[first] = tuple(members)
        return out

    def concat_operands(self, i: int) -> list[int]:
        out = []
        for j in self.graph.nodes[i].inputs:
            out += self.concat_operands(j) if j in self.absorbed else [j]
        return out

    def _emit_output_aliases(self) -> None:
        for name, i in self.aliases:
            self.emit("Identity", [self.tensor(i)], [name], f"output_{name}")

    def _model(self) -> ModelProto:
        g = self.graph
        inputs = [
            helper.make_tensor_value_info(g.input_name(i), elem_type(g.nodes[i].dtype), list(g.nodes[i].shape))
            for i in g.input_ids
        ]
        outputs = [
            helper.make_tensor_value_info(name, elem_type(g.nodes[i].dtype), list(g.nodes[i].shape))
            for name, i in g.outputs
        ]
        opsets = {"": self.opset}
        for domain in sorted(self.domains - {""}):
            opsets[domain] = int(g.opset_imports.get(domain, 1))
        # Built in place: helper.make_graph and make_model would copy every initializer twice more.
        model = ModelProto(producer_name="tensat", producer_version=__version__)
        model.opset_import.extend(helper.make_opsetid(d, v) for d, v in opsets.items())
        graph = model.graph
        graph.name = g.name or "tensat"
        graph.node.extend(self.nodes)
        graph.input.extend(inputs)
        graph.output.extend(outputs)
        directory = _weights_dir(array for array, _ in self.initializers) if self.keep_external else None
        for array, name in self.initializers:
            stub = external_tensor(array, name, directory) if directory is not None else None
            if stub is not None:  # a weight read from a file tensat kept on disk stays there
                graph.initializer.append(stub)
            else:
                _put_tensor(graph.initializer.add(), array, name)
        set_external_dir(model, directory)
        dtypes = sorted({n.dtype for n in g.nodes})
        model.ir_version = ir_version_for(opsets, dtypes)
        return model


def _opaque_node(graph: Graph, key: str, inputs: Sequence[str], outputs: Sequence[str]) -> tuple[NodeProto, int]:
    """Rebuild the ONNX node of opaque `key` reading `inputs` (explicit then captured); returns (node, #captured)."""
    spec = graph.opaque[key]
    attributes = [AttributeProto.FromString(b) for b in spec.attributes]
    captured = 0
    for attr in attributes:
        for sub in subgraphs(attr):
            for name in free_names(sub):
                m = OUTER_RE.match(name)
                if m:
                    captured = max(captured, int(m.group(1)) + 1)
    explicit = list(inputs[: len(inputs) - captured])
    if captured:
        mapping = {f"{OUTER}{k}": name for k, name in enumerate(inputs[len(inputs) - captured :])}
        for attr in attributes:
            for sub in subgraphs(attr):
                rename_free(sub, mapping)
    if "@" in key:
        for pos in sorted(int(p) for p in key.rsplit("@", 1)[1].split(",")):
            explicit.insert(pos, "")
    node = NodeProto()
    node.op_type = spec.op_type
    if spec.domain:
        node.domain = spec.domain
    node.input.extend(explicit)
    node.output.extend(outputs)
    node.attribute.extend(attributes)
    return node, captured


def _output_names(
    graph: Graph, spec: OpaqueSpec, present: Mapping[int, str], unused: Callable[[int], str]
) -> list[str]:
    """Output list of an opaque node: present outputs by name, absent optional ones empty, others `unused(k)`."""
    schema = onnx_schema(spec.op_type, spec.domain, int(graph.opset_imports.get(spec.domain, 1)))
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    outputs = []
    for k in range(spec.num_outputs):
        if k in present:
            outputs.append(present[k])
        elif schema is not None and k < len(schema.outputs) and schema.outputs[k].option == optional:
            outputs.append("")
        else:
            outputs.append(unused(k))
    while outputs and not outputs[-1]:
        outputs.pop()
    return outputs


# -- exporters: IR op -> ONNX nodes ---------------------------------------------------------------------------------


Emitter = Callable[[_Exporter, int], None]
_EMITTERS: dict[str, Emitter] = {}


def _emitter(*names: str) -> Callable[[Emitter], Emitter]:
    """Register the decorated function as the ONNX emission of IR ops `names` (ops with attributes, opaque)."""

    def register(fn: Emitter) -> Emitter:
        for name in names:
            _EMITTERS[name] = fn
        return fn

    return register


def has_own_emitter(op: str) -> bool:
    """Whether the ONNX layer writes IR op `op` by an emitter of its own (which may write an onnxruntime kernel where
    the opset predates the standard op: Gelu), rather than as its ONNX op alone."""
    return op in _EMITTERS


def _ex_leaf(e: _Exporter, i: int) -> None:
    """Inputs and weights need no node."""


def _split_type(onnx_type: str) -> tuple[str, str]:
    """(domain, op type) of an `OpDef.onnx` name ("com.microsoft:FusedMatMul", or a default-domain "Add")."""
    domain, _, op_type = onnx_type.rpartition(":")
    return domain, op_type


def _ex_plain(onnx_type: str) -> Emitter:
    """The emission of an op with tensor inputs only, as ONNX op `onnx_type` (in its domain, if another)."""
    domain, op_type = _split_type(onnx_type)

    def export(e: _Exporter, i: int) -> None:
        n = e.graph.nodes[i]
        e.emit(op_type, [e.tensor(j) for j in n.inputs], [e.tensor(i)], f"{n.op}_{i}", domain=domain)
        e.domains.add(domain)

    return export


def _onnx_type(op: str) -> str:
    """The ONNX op type of `op`, for an emitter writing one of several ops (an activation, a pooling)."""
    onnx_type = ops.get(op).onnx
    if onnx_type is None:
        raise TypeError(f"the ONNX layer has no ONNX op type for {op}")
    return onnx_type


def _window_attrs(e: _Exporter, i: int) -> dict[str, Any]:
    """The ONNX attributes of a (transposed) convolution node `i`: its kernel's shape, strides, pads, dilations and
    groups."""
    n = e.graph.nodes[i]
    a = n.attr
    return {
        "kernel_shape": list(e.graph.nodes[n.inputs[1]].shape[2:]),
        "strides": list(a["strides"]),
        "pads": list(a["pads"]),
        "dilations": list(a["dilations"]),
        "group": a["group"],
    }


@_emitter("conv2d", "conv1d")
def _ex_conv(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    ins = [e.tensor(j) for j in (n.inputs[:2] if e._zero_bias(i) else n.inputs)]
    act = n.attr.get("act", ops.ACT_NONE)
    out = e.tensor(i) if act == ops.ACT_NONE else e.namer(f"{n.op}_{i}_linear")
    e.emit("Conv", ins, [out], f"{n.op}_{i}", **_window_attrs(e, i))
    if act != ops.ACT_NONE:
        op_type = _onnx_type(ops.ACT_NAMES[act])
        e.emit(op_type, [out], [e.tensor(i)], f"{n.op}_{i}_{op_type.lower()}")


@_emitter("conv_transpose2d")
def _ex_conv_transpose(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    attrs = _window_attrs(e, i) | {"output_padding": list(n.attr["output_padding"])}
    e.emit("ConvTranspose", [e.tensor(j) for j in n.inputs], [e.tensor(i)], f"conv_transpose2d_{i}", **attrs)


@_emitter("maxpool", "avgpool")
def _ex_pool(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    a = n.attr
    attrs: dict[str, Any] = {"kernel_shape": list(a["kernel"]), "strides": list(a["strides"]), "pads": list(a["pads"])}
    if n.op == "avgpool":
        attrs["count_include_pad"] = a["count_include_pad"]
    e.emit(_onnx_type(n.op), [e.tensor(n.inputs[0])], [e.tensor(i)], f"{n.op}_{i}", **attrs)


@_emitter("concat")
def _ex_concat(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    e.emit("Concat", [e.tensor(j) for j in e.concat_operands(i)], [e.tensor(i)], f"concat_{i}", axis=n.attr["axis"])


@_emitter("slice")
def _ex_slice(e: _Exporter, i: int) -> None:
    g = e.graph
    n = g.nodes[i]
    group = e.splits.get(i)
    src = e.tensor(n.inputs[0])
    axis = n.attr["axis"]
    if group:
        sizes = [g.nodes[j].attr["size"] for j in group]
        outs = [e.tensor(j) for j in group]
        if e.opset < 13:
            e.emit("Split", [src], outs, f"split_{i}", axis=axis, split=sizes)
        else:
            e.emit("Split", [src, e.int64(sizes, f"split_{i}_sizes")], outs, f"split_{i}", axis=axis)
        return
    start, end = n.attr["start"], n.attr["start"] + n.attr["size"]
    if e.opset < 10:
        e.emit("Slice", [src], [e.tensor(i)], f"slice_{i}", starts=[start], ends=[end], axes=[axis])
    else:
        ins = [
            src,
            e.int64([start], f"slice_{i}_starts"),
            e.int64([end], f"slice_{i}_ends"),
            e.int64([axis], f"slice_{i}_axes"),
        ]
        e.emit("Slice", ins, [e.tensor(i)], f"slice_{i}")


@_emitter("transpose")
def _ex_transpose(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    e.emit("Transpose", [e.tensor(n.inputs[0])], [e.tensor(i)], f"transpose_{i}", perm=list(n.attr["perm"]))


@_emitter("reshape")
def _ex_reshape(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    shape = e.int64(n.attr["shape"], f"reshape_{i}_shape")
    e.emit("Reshape", [e.tensor(n.inputs[0]), shape], [e.tensor(i)], f"reshape_{i}")


@_emitter("batchnorm")
def _ex_batchnorm(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    e.emit(
        "BatchNormalization",
        [e.tensor(j) for j in n.inputs],
        [e.tensor(i)],
        f"batchnorm_{i}",
        epsilon=float(n.attr["epsilon"]),
    )


@_emitter("opaque")
def _ex_opaque(e: _Exporter, i: int) -> None:
    g = e.graph
    n = g.nodes[i]
    key = n.attr["key"]
    group = (key, n.inputs)
    if group in e.opaque_done:
        return
    e.opaque_done.add(group)
    spec = g.opaque[key]
    members = e.opaque_groups[group]
    outputs = _output_names(
        g, spec, {k: e.tensor(j) for k, j in members.items()}, lambda k: e.namer(f"{key.split('@')[0]}_unused{k}")
    )
    node, _ = _opaque_node(g, key, [e.tensor(j) for j in n.inputs], outputs)
    node.name = e.node_namer(spec.name or key.split("@")[0])
    e.nodes.append(node)
    e.domains.add(spec.domain)


def _weights_dir(arrays: Iterable[np.ndarray]) -> str | None:
    """The directory of the first file a weight is mapped from (`tensat.onnx.external.file_region`), if any: the
    model written refers to the weights under it where they lie, rather than copying them."""
    for array in arrays:
        region = file_region(array)
        if region is not None:
            return os.path.dirname(region[0])
    return None


def _put_tensor(tensor: TensorProto, array: np.ndarray, name: str) -> None:
    """Write `array` into `tensor` as `numpy_helper.from_array` would, copying its bytes once (numeric dtypes in
    native little-endian order; others through from_array)."""
    if array.dtype.kind in "biuf" and array.dtype.byteorder in "=|<" and np.little_endian:
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.dims.extend(array.shape)
        tensor.raw_data = array.tobytes()  # C order whatever the layout of `array`
    else:
        tensor.CopyFrom(numpy_helper.from_array(array, name))


def _without_leading_ones(shape: Sequence[int], keep: int = 1) -> tuple[int, ...]:
    """`shape` without its leading 1s (at least `keep` dimensions kept)."""
    k = 0
    while k < len(shape) - keep and shape[k] == 1:
        k += 1
    return tuple(shape[k:])


def _broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    """Whether a tensor of `shape` broadcasts (unidirectionally, as Gemm's C) to `target`."""
    if len(shape) > len(target):
        return False
    return all(d in (1, t) for d, t in zip(reversed(shape), reversed(target)))


def _ex_gemm(e: _Exporter, i: int) -> None:
    """A MatMul by a constant and the Add of a constant bias (see `_Exporter._find_gemms`) as one Gemm."""
    g = e.graph
    n = g.nodes[i]
    m = e.gemms[i]
    bias = n.inputs[1] if n.inputs[0] == m else n.inputs[0]
    a, b = g.nodes[m].inputs
    transposed: dict[str, Any] = {"transB": 1} if b in e.transposed_b else {}
    e.emit("Gemm", [e.tensor(a), e.tensor(b), e.tensor(bias)], [e.tensor(i)], f"gemm_{i}", **transposed)


def _ex_const(e: _Exporter, array: np.ndarray, base: str) -> str:
    """A float initializer for a weight transform's constant operand."""
    name = e.namer(base)
    e.initializers.append((array, name))
    return name


@_emitter("rsqrt")
def _ex_rsqrt(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    dtype = np.dtype(n.dtype)
    eps = _ex_const(e, np.asarray(n.attr["epsilon"], dtype=dtype), f"rsqrt_{i}_epsilon")
    shifted, root = e.namer(f"rsqrt_{i}_shifted"), e.namer(f"rsqrt_{i}_sqrt")
    e.emit("Add", [e.tensor(n.inputs[0]), eps], [shifted], f"rsqrt_{i}_add")
    e.emit("Sqrt", [shifted], [root], f"rsqrt_{i}_sqrt")
    e.emit("Reciprocal", [root], [e.tensor(i)], f"rsqrt_{i}")


@_emitter("enlarge")
def _ex_enlarge(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    w = e.graph.nodes[n.inputs[0]].shape
    ph, pw = (n.attr["kernel"][0] - w[2]) // 2, (n.attr["kernel"][1] - w[3]) // 2
    pads = [0, 0, ph, pw, 0, 0, ph, pw]
    if e.opset < 11:
        e.emit("Pad", [e.tensor(n.inputs[0])], [e.tensor(i)], f"enlarge_{i}", pads=pads)
    else:
        e.emit("Pad", [e.tensor(n.inputs[0]), e.int64(pads, f"enlarge_{i}_pads")], [e.tensor(i)], f"enlarge_{i}")


@_emitter("merge")
def _ex_merge(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    count = n.attr["count"]
    mask = ops.merge_mask(n.shape, n.attr["group"], count).astype(np.dtype(n.dtype))
    tiled = e.namer(f"merge_{i}_tiled")
    e.emit("Tile", [e.tensor(n.inputs[0]), e.int64([1, count, 1, 1], f"merge_{i}_repeats")], [tiled], f"merge_{i}_tile")
    e.emit("Mul", [tiled, _ex_const(e, mask, f"merge_{i}_mask")], [e.tensor(i)], f"merge_{i}")


@_emitter("clip")
def _ex_clip(e: _Exporter, i: int) -> None:
    """Clip with its bounds as attributes (before opset 11) or constant inputs; an infinite bound is left out."""
    n = e.graph.nodes[i]
    low, high = n.attr["min"], n.attr["max"]
    if e.opset < 11:
        bounds: dict[str, Any] = {k: float(v) for k, v in (("min", low), ("max", high)) if np.isfinite(v)}
        e.emit("Clip", [e.tensor(n.inputs[0])], [e.tensor(i)], f"clip_{i}", **bounds)
        return
    dtype = np.dtype(n.dtype)
    ins = [e.tensor(n.inputs[0])]
    for k, v in (("min", low), ("max", high)):
        ins.append(_ex_const(e, np.asarray(v, dtype), f"clip_{i}_{k}") if np.isfinite(v) else "")
    while ins[-1] == "":
        ins.pop()
    e.emit("Clip", ins, [e.tensor(i)], f"clip_{i}")


@_emitter("gelu")
def _ex_gelu(e: _Exporter, i: int) -> None:
    """ONNX Gelu from opset 20; before, onnxruntime's contrib Gelu (exact) or FastGelu (tanh)."""
    n = e.graph.nodes[i]
    approximate = n.attr["approximate"]
    if e.opset >= 20:
        e.emit(
            "Gelu",
            [e.tensor(n.inputs[0])],
            [e.tensor(i)],
            f"gelu_{i}",
            approximate=ops.GELU_APPROXIMATIONS[approximate],
        )
        return
    op_type = "FastGelu" if approximate else "Gelu"
    e.emit(op_type, [e.tensor(n.inputs[0])], [e.tensor(i)], f"gelu_{i}", domain=ops.CONTRIB)
    e.domains.add(ops.CONTRIB)


@_emitter("softmax", "log_softmax")
def _ex_softmax(e: _Exporter, i: int) -> None:
    """Softmax over one axis; before opset 13 ONNX's flattens the dims from its axis on, so another axis than the
    last is moved there and back."""
    n = e.graph.nodes[i]
    op_type, axis, rank = _onnx_type(n.op), n.attr["axis"], len(n.shape)
    x = e.tensor(n.inputs[0])
    if e.opset >= 13 or axis == rank - 1:
        e.emit(op_type, [x], [e.tensor(i)], f"{n.op}_{i}", axis=axis)
        return
    perm = [d for d in range(rank) if d != axis] + [axis]
    back = [perm.index(d) for d in range(rank)]
    moved, done = e.namer(f"{n.op}_{i}_moved"), e.namer(f"{n.op}_{i}_last")
    e.emit("Transpose", [x], [moved], f"{n.op}_{i}_move", perm=perm)
    e.emit(op_type, [moved], [done], f"{n.op}_{i}", axis=rank - 1)
    e.emit("Transpose", [done], [e.tensor(i)], f"{n.op}_{i}_back", perm=back)


@_emitter("lrn")
def _ex_lrn(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    a = n.attr
    e.emit(
        "LRN",
        [e.tensor(n.inputs[0])],
        [e.tensor(i)],
        f"lrn_{i}",
        size=int(a["size"]),
        alpha=float(a["alpha"]),
        beta=float(a["beta"]),
        bias=float(a["bias"]),
    )


@_emitter(*ops.ACTIVATION_DEFAULTS)
def _ex_activation(e: _Exporter, i: int) -> None:
    """An activation with float attributes, each written as the ONNX attribute of its name."""
    n = e.graph.nodes[i]
    attrs: dict[str, Any] = {k: float(n.attr[k]) for k in ops.ACTIVATION_DEFAULTS[n.op]}
    e.emit(_onnx_type(n.op), [e.tensor(n.inputs[0])], [e.tensor(i)], f"{n.op}_{i}", **attrs)


@_emitter("resize")
def _ex_resize(e: _Exporter, i: int) -> None:
    """Resize by scales (a model with symbolic batch keeps it) where the sizes' ratios are exact in float, else by
    sizes; before opset 11, as an Upsample (asymmetric coordinates, nearest pixel the floor)."""
    n = e.graph.nodes[i]
    x, (height, width) = n.inputs[0], n.shape[2:]
    before = e.graph.nodes[x].shape
    ratios = [1.0, 1.0, height / before[2], width / before[3]]
    exact = all(float(np.float32(r)) == r for r in ratios)
    mode = ops.RESIZE_MODES[n.attr["mode"]]
    name = f"resize_{i}"
    if e.opset < 9:
        e.emit("Upsample", [e.tensor(x)], [e.tensor(i)], name, mode=mode, scales=ratios)
        return
    if e.opset < 11:
        scales = _ex_const(e, np.asarray(ratios, np.float32), f"{name}_scales")
        e.emit("Resize" if e.opset == 10 else "Upsample", [e.tensor(x), scales], [e.tensor(i)], name, mode=mode)
        return
    roi = _ex_const(e, np.zeros(0, np.float32), f"{name}_roi")
    if exact:
        given = [_ex_const(e, np.asarray(ratios, np.float32), f"{name}_scales")]
    else:  # scales may be left out from opset 13, and are empty before it
        empty = "" if e.opset >= 13 else _ex_const(e, np.zeros(0, np.float32), f"{name}_scales")
        given = [empty, e.int64([*before[:2], height, width], f"{name}_sizes")]
    attrs: dict[str, Any] = {
        "mode": mode,
        "coordinate_transformation_mode": ops.RESIZE_TRANSFORMS[n.attr["transform"]],
    }
    if mode == "nearest":
        attrs["nearest_mode"] = ops.RESIZE_NEAREST[n.attr["nearest"]]
    e.emit("Resize", [e.tensor(x), roi, *given], [e.tensor(i)], name, **attrs)


@_emitter("depth_to_space")
def _ex_depth_to_space(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    mode = ops.DEPTH_TO_SPACE_MODES[n.attr["mode"]]
    e.emit(
        "DepthToSpace",
        [e.tensor(n.inputs[0])],
        [e.tensor(i)],
        f"depth_to_space_{i}",
        blocksize=n.attr["blocksize"],
        mode=mode,
    )


@_emitter("space_to_depth")
def _ex_space_to_depth(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    e.emit("SpaceToDepth", [e.tensor(n.inputs[0])], [e.tensor(i)], f"space_to_depth_{i}", blocksize=n.attr["blocksize"])


@_emitter("cumsum")
def _ex_cumsum(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    axis = _ex_const(e, np.asarray(n.attr["axis"], np.int64), f"cumsum_{i}_axis")
    flags: dict[str, Any] = {k: int(n.attr[k]) for k in ("exclusive", "reverse")}
    e.emit("CumSum", [e.tensor(n.inputs[0]), axis], [e.tensor(i)], f"cumsum_{i}", **flags)


@_emitter("trilu")
def _ex_trilu(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    k = _ex_const(e, np.asarray(n.attr["k"], np.int64), f"trilu_{i}_k")
    e.emit("Trilu", [e.tensor(n.inputs[0]), k], [e.tensor(i)], f"trilu_{i}", upper=int(n.attr["upper"]))


@_emitter("tile")
def _ex_tile(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    repeats = _ex_const(e, np.asarray(n.attr["repeats"], np.int64), f"tile_{i}_repeats")
    e.emit("Tile", [e.tensor(n.inputs[0]), repeats], [e.tensor(i)], f"tile_{i}")


@_emitter("argmax", "argmin")
def _ex_arg_reduction(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    flags: dict[str, Any] = {"axis": int(n.attr["axis"]), "keepdims": int(n.attr["keepdims"])}
    if n.attr["select_last_index"]:
        flags["select_last_index"] = 1
    e.emit(ops.get(n.op).onnx or "", [e.tensor(n.inputs[0])], [e.tensor(i)], f"{n.op}_{i}", **flags)


@_emitter("topk")
def _ex_topk(e: _Exporter, i: int) -> None:
    """The values and the indices of one TopK as its two outputs: the first of the pair emitted writes both."""
    n = e.graph.nodes[i]
    a = n.attr
    group = e.topk_groups.pop(ops.topk_kernel(n.inputs, a), None)
    if group is None:
        return
    outs = [
        e.tensor(group[k]) if k in group else e.namer(f"topk_{i}_{name}")
        for k, name in enumerate(("values", "indices"))
    ]
    x = e.tensor(n.inputs[0])
    if e.opset < 10:
        if not a["largest"]:
            raise ValueError(f"a TopK of the smallest elements needs opset 11, not {e.opset}")
        e.emit("TopK", [x], outs, f"topk_{i}", axis=a["axis"], k=a["k"])
        return
    flags: dict[str, Any] = {"axis": a["axis"]}
    if not a["largest"]:
        if e.opset < 11:
            raise ValueError(f"a TopK of the smallest elements needs opset 11, not {e.opset}")
        flags["largest"] = 0
    e.emit("TopK", [x, e.int64([a["k"]], f"topk_{i}_k")], outs, f"topk_{i}", **flags)


@_emitter("mod", "isinf")
def _ex_flagged(e: _Exporter, i: int) -> None:
    """An element-wise op whose attributes are ONNX's own, written as they are."""
    n = e.graph.nodes[i]
    flags: dict[str, Any] = {k: int(n.attr[k]) for k in ops.get(n.op).attr_names}
    e.emit(ops.get(n.op).onnx or "", [e.tensor(j) for j in n.inputs], [e.tensor(i)], f"{n.op}_{i}", **flags)


@_emitter("einsum")
def _ex_einsum(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    ins = [e.tensor(j) for j in n.inputs]
    e.emit("Einsum", ins, [e.tensor(i)], f"einsum_{i}", equation=ops.einsum_equation(n.attr["equation"]))


@_emitter("cast")
def _ex_cast(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    e.emit("Cast", [e.tensor(n.inputs[0])], [e.tensor(i)], f"cast_{i}", to=int(n.attr["to"]))


@_emitter(*ops.REDUCTIONS)
def _ex_reduce(e: _Exporter, i: int) -> None:
    """A reduction with its axes as an attribute, or as an input from the opset that made them one."""
    n = e.graph.nodes[i]
    axes, keep = list(n.attr["axes"]), int(n.attr["keepdims"])
    x = e.tensor(n.inputs[0])
    if e.opset < ops.axes_input_since(n.op):
        e.emit(_onnx_type(n.op), [x], [e.tensor(i)], f"{n.op}_{i}", axes=axes, keepdims=keep)
    else:
        e.emit(_onnx_type(n.op), [x, e.int64(axes, f"{n.op}_{i}_axes")], [e.tensor(i)], f"{n.op}_{i}", keepdims=keep)


@_emitter("pad")
def _ex_pad(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    pads, value = list(n.attr["pads"]), float(n.attr["value"])
    x = e.tensor(n.inputs[0])
    if e.opset < 11:
        e.emit("Pad", [x], [e.tensor(i)], f"pad_{i}", pads=pads, value=value)
        return
    fill = _ex_const(e, np.asarray(value, np.dtype(n.dtype)), f"pad_{i}_value")
    e.emit("Pad", [x, e.int64(pads, f"pad_{i}_pads"), fill], [e.tensor(i)], f"pad_{i}")


@_emitter("border_pad")
def _ex_border_pad(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    pads, mode = list(n.attr["pads"]), ops.PAD_MODES[n.attr["mode"]]
    x = e.tensor(n.inputs[0])
    if e.opset < 11:
        e.emit("Pad", [x], [e.tensor(i)], f"border_pad_{i}", pads=pads, mode=mode)
        return
    e.emit("Pad", [x, e.int64(pads, f"border_pad_{i}_pads")], [e.tensor(i)], f"border_pad_{i}", mode=mode)


@_emitter("instancenorm")
def _ex_instance_norm(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    e.emit(
        "InstanceNormalization",
        [e.tensor(j) for j in n.inputs],
        [e.tensor(i)],
        f"instancenorm_{i}",
        epsilon=float(n.attr["epsilon"]),
    )


@_emitter("layernorm")
def _ex_layer_norm(e: _Exporter, i: int) -> None:
    """LayerNormalization (an ONNX op from opset 17; onnxruntime runs it at every opset)."""
    n = e.graph.nodes[i]
    e.emit(
        "LayerNormalization",
        [e.tensor(j) for j in n.inputs],
        [e.tensor(i)],
        f"layernorm_{i}",
        axis=int(n.attr["axis"]),
        epsilon=float(n.attr["epsilon"]),
    )


@_emitter("gather")
def _ex_gather(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    e.emit("Gather", [e.tensor(j) for j in n.inputs], [e.tensor(i)], f"gather_{i}", axis=int(n.attr["axis"]))


@_emitter("gather_elements")
def _ex_gather_elements(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    ins = [e.tensor(j) for j in n.inputs]
    e.emit("GatherElements", ins, [e.tensor(i)], f"gather_elements_{i}", axis=int(n.attr["axis"]))


@_emitter("scatter_elements")
def _ex_scatter_elements(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    ins = [e.tensor(j) for j in n.inputs]
    op_type = "ScatterElements" if e.opset >= 11 else "Scatter"  # its name before opset 11
    e.emit(op_type, ins, [e.tensor(i)], f"scatter_elements_{i}", axis=int(n.attr["axis"]))


@_emitter("gather_nd")
def _ex_gather_nd(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    batch: dict[str, Any] = {"batch_dims": int(n.attr["batch_dims"])} if n.attr["batch_dims"] else {}
    e.emit("GatherND", [e.tensor(j) for j in n.inputs], [e.tensor(i)], f"gather_nd_{i}", **batch)


@_emitter("expand")
def _ex_expand(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    shape = e.int64(n.attr["shape"], f"expand_{i}_shape")
    e.emit("Expand", [e.tensor(n.inputs[0]), shape], [e.tensor(i)], f"expand_{i}")


@_emitter("stride")
def _ex_stride(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    a = n.attr
    if e.opset < 10:
        raise ModelError(f"a strided slice needs opset 10 or later; the model has opset {e.opset}")
    start, end = a["start"], a["start"] + a["step"] * (a["size"] - 1) + 1
    ins = [
        e.tensor(n.inputs[0]),
        e.int64([start], f"stride_{i}_starts"),
        e.int64([end], f"stride_{i}_ends"),
        e.int64([a["axis"]], f"stride_{i}_axes"),
        e.int64([a["step"]], f"stride_{i}_steps"),
    ]
    e.emit("Slice", ins, [e.tensor(i)], f"stride_{i}")


def _ex_matmul_as_fused(e: _Exporter, i: int) -> None:
    """A MatMul written as the FusedMatMul onnxruntime runs it as (`_Exporter._find_fused_matmuls`)."""
    reads, _, attrs, writes = e.fused_matmuls[i]
    operands = [e.tensor(reads.get(k, j)) for k, j in enumerate(e.graph.nodes[i].inputs)]
    e.emit("FusedMatMul", operands, [e.tensor(writes)], f"fused_matmul_{i}", domain=ops.CONTRIB, **attrs)
    e.domains.add(ops.CONTRIB)


@_emitter("fused_matmul")
def _ex_fused_matmul(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    a = n.attr
    e.emit(
        "FusedMatMul",
        [e.tensor(j) for j in n.inputs],
        [e.tensor(i)],
        f"fused_matmul_{i}",
        domain=ops.CONTRIB,
        transA=int(a["trans_a"]),
        transB=int(a["trans_b"]),
        alpha=float(a["alpha"]),
    )
    e.domains.add(ops.CONTRIB)


@_emitter("quick_gelu")
def _ex_quick_gelu(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    domain, op_type = _split_type(_onnx_type(n.op))
    e.emit(op_type, [e.tensor(n.inputs[0])], [e.tensor(i)], f"quick_gelu_{i}", domain=domain, alpha=n.attr["alpha"])
    e.domains.add(domain)


@_emitter("skip_layernorm", "rms_norm")
def _ex_norm_kernel(e: _Exporter, i: int) -> None:
    """onnxruntime's SkipLayerNormalization (contrib) and SimplifiedLayerNormalization (ONNX domain) kernels."""
    n = e.graph.nodes[i]
    domain, op_type = _split_type(_onnx_type(n.op))
    attrs: dict[str, Any] = {"epsilon": float(n.attr["epsilon"])}
    if n.op == "rms_norm":
        attrs["axis"] = -1
    e.emit(op_type, [e.tensor(j) for j in n.inputs], [e.tensor(i)], f"{n.op}_{i}", domain=domain, **attrs)
    e.domains.add(domain)


@_emitter("multihead_attention", "attention")
def _ex_attention_kernel(e: _Exporter, i: int) -> None:
    """onnxruntime's MultiHeadAttention (queries, keys, values) and Attention (the input, the projections' weights
    and biases side by side): the three inputs, and the scores' bias as the attention_bias both read at input 5,
    left out where it is all zeros. Attention's projection biases are always written: onnxruntime's CPU kernel
    crashes the process without them."""
    n = e.graph.nodes[i]
    *three, bias = n.inputs
    zero = bias in e.consts and not np.any(e.consts[bias])
    ins = [*(e.tensor(j) for j in three), *([] if zero else ["", "", e.tensor(bias)])]
    attrs = {"num_heads": int(n.attr["num_heads"]), "scale": float(n.attr["scale"])}
    _, op_type = _split_type(_onnx_type(n.op))
    e.emit(op_type, ins, [e.tensor(i)], f"{n.op}_{i}", domain=ops.CONTRIB, **attrs)
    e.domains.add(ops.CONTRIB)


def _exporters() -> dict[str, Emitter]:
    """Every op's emission: none for leaves, registered for ops with attributes, plain (its `onnx` op) otherwise."""
    table: dict[str, Emitter] = {}
    for op in ops.REGISTRY.values():
        if op.leaf:
            table[op.name] = _ex_leaf
        elif op.name in _EMITTERS:
            table[op.name] = _EMITTERS[op.name]
        elif op.onnx is None or op.attrs or op.inputs is None:
            raise TypeError(f"the ONNX layer has no emitter for {op.name}")
        else:
            table[op.name] = _ex_plain(op.onnx)
    return table


EXPORTERS: dict[str, Emitter] = _exporters()
"""IR op name -> ONNX emission, for every op in tensat.ops.REGISTRY."""


def export_model(graph: Graph, *, keep_external: bool = False, fuse_matmuls: bool = False) -> ModelProto:
    """Export `graph` as an ONNX model for its source opset: weight-only subgraphs folded into initializers,
    slices partitioning a tensor as one Split, names deterministic (the same graph exports byte-identically).

    With `keep_external`, a weight mapped from a model's external data file (`import_model` keeps it on disk) is
    written as a reference to where it lies, with the directory recorded in the model
    (`tensat.onnx.external.external_dir`): tensat's sessions and `save_model` read it from there, and the weights
    never pass through Python. Without it, every weight is written into the model.

    With `fuse_matmuls`, a MatMul onnxruntime would run as a FusedMatMul (a Transpose or a scale of an operand
    folded in) is written as that FusedMatMul, onnxruntime's contrib op: the kernel the cost model priced it as."""
    return _Exporter(graph, keep_external, fuse_matmuls).run()
