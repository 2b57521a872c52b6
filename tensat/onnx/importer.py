"""Import: a loaded ONNX model -> tensat IR (`import_model`).

Constant subgraphs are folded into weights; each ONNX node is lowered through `IMPORTERS`, built from the operator
registry: an op without attributes is lowered from its ONNX op type (`OpDef.onnx`) with no code here; the ONNX op
types of ops with attributes, and those no op names (pass-throughs, shape queries), have lowering functions below.
A node tensat does not model (another op, another domain, non-float32 data, unsupported attributes) becomes `opaque`
nodes that keep the ONNX node verbatim.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, ModelProto, NodeProto, helper, numpy_helper

from tensat import ops
from tensat.errors import ModelError
from tensat.ir import Graph, OpaqueSpec
from tensat.onnx import fusions as runtime
from tensat.onnx.common import (
    NONDETERMINISTIC,
    OUTER,
    dtype_name,
    free_names,
    node_label,
    norm_domain,
    opset_versions,
    rename_free,
    run_node,
    single_node_model,
    sparse_to_array,
)
from tensat.onnx.external import external_dir, has_external, mapped_array, subgraphs
from tensat.onnx.load import load_model, symbolic_dims
from tensat.onnx.symbolic import Dims, SymbolSizes, tensor_dims


class _Unsupported(Exception):
    """This node cannot be lowered to IR ops; it becomes opaque."""


def _sample(array: np.ndarray) -> bytes:
    """A few of `array`'s elements, evenly spaced: constants that differ almost always differ there, so only those
    that agree are compared in full. Read through `flat`, so that a strided view (a Gemm's transposed weight) is
    not copied whole to look at a few elements."""
    return array.flat[np.arange(0, array.size, max(1, array.size // SAMPLED))[:SAMPLED]].tobytes()


SAMPLED = 64  # elements `_sample` reads


def _uniform(array: np.ndarray) -> float | None:
    """The one value of a constant whose elements are all equal, where a `fill` holds it exactly (an epsilon, an
    exponent, a zero bias: the constants a rule can match by value); else None. A sample is looked at first, so
    that a weight kept on disk is not read whole to find it varies, nor a strided view copied."""
    if not array.size or str(array.dtype) not in ops.TYPE_CODES:
        return None
    first = array.flat[0]
    if not np.all(np.frombuffer(_sample(array), array.dtype) == first) or not np.all(array == first):
        return None
    value = float(first)
    try:
        exact = array.dtype.type(value) == first
    except OverflowError:  # an int64 near its maximum (a Slice's "to the end"), rounded up by the float
        return None
    return value if exact else None


@dataclass
class _Importer:
    """Lowers one loaded model to a Graph; the lowerings in IMPORTERS call back into it."""

    model: ModelProto
    graph: Graph = field(init=False)
    types: dict[str, tuple[str, tuple[int, ...] | None]] = field(default_factory=dict)
    env: dict[str, int] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    opsets: dict[str, int] = field(default_factory=dict)
    node: NodeProto = field(default_factory=NodeProto)
    index: int = 0
    folding: bool = False
    release: bool = False
    attrs: dict[str, Any] = field(default_factory=dict)
    fusions: runtime.Fusions = field(default_factory=runtime.Fusions)  # the kernels onnxruntime runs it as
    # for a model read with symbolic input dims: each tensor's dims at those (`symbolic.tensor_dims`), the constants
    # whose elements vary with the dims' sizes (a mask of those that do), and the node each was computed by
    dims: dict[str, Dims] | None = None
    varying: dict[str, np.ndarray] = field(default_factory=dict)
    producers: dict[str, tuple[int, NodeProto]] = field(default_factory=dict)
    # ... and the dims of the tensors whose sizes tensat may read from attributes, in the e-graph's rule guards
    # (`ir.Graph.symbolic`): each symbolic dim at its size in `symbols`; `probed`: those told by running the model
    symbols: SymbolSizes = field(default_factory=SymbolSizes)
    probed: dict[str, tuple[int, ...]] = field(default_factory=dict)
    named: frozenset[str] = frozenset()  # the input dims' names
    _temp: int = 0
    # the weight nodes made so far, by dtype and shape, each with its `_sample` once one was needed
    _constants: dict[tuple[str, tuple[int, ...]], list[tuple[int, np.ndarray, bytes | None]]] = field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        self.opsets = opset_versions(self.model)
        self.opset = self.opsets[""]
        self.graph = Graph(opset_imports=dict(self.opsets), name=self.model.graph.name or "tensat")
        g = self.model.graph
        for vi in list(g.value_info) + list(g.output) + list(g.input):
            self.types[vi.name] = _value_type(vi)
        given = symbolic_dims(self.model)
        if given is not None:
            self.dims = tensor_dims(self.model, given)
            self.named = frozenset(d for dims in given.values() for d in dims if isinstance(d, str) and d != "?")
            self._probe_symbolic(given)

    def _probe_symbolic(self, given: Mapping[str, Dims]) -> None:
        """The dims shape inference could not name, of the tensors whose sizes the ops computing them read from
        their inputs' values (a Reshape, a Range...) or that tensat may keep opaque: told by running the model at
        other sizes (`SymbolSizes.probed`), while its weights are still in it (see `_record_symbolic`)."""
        assert self.dims is not None
        untold = []
        for node in self.model.graph.node:
            for out in node.output:
                dims = self.dims.get(out)
                if not out or (dims is not None and all(isinstance(d, int) or d in self.named for d in dims)):
                    continue
                # a mask or an index (not a float) may be kept opaque where a float would be modelled
                if (
                    norm_domain(node.domain) != ""
                    or node.op_type in _SIZED
                    or self.types.get(out, ("",))[0] != "float32"
                ):
                    untold.append(out)
        self.probed = self.symbols.probed(self.model, given, untold) if untold else {}

    # -- values -------------------------------------------------------------------------------------------------

    def run(self) -> Graph:
        g = self.model.graph
        directory = external_dir(self.model)
        for tensor in g.initializer:
            if directory is not None and has_external(tensor):  # kept on disk: mapped, not read
                mapped = mapped_array(tensor, directory)
                self.consts[tensor.name] = mapped if mapped is not None else numpy_helper.to_array(tensor, directory)
                continue
            self.consts[tensor.name] = numpy_helper.to_array(tensor).copy()
            if self.release:
                tensor.ClearField("raw_data")  # this proto is private: free its copy of the data early
        for sp in g.sparse_initializer:
            self.consts[sp.values.name] = sparse_to_array(sp)
        for vi in g.input:
            if vi.name not in self.consts:
                dtype, shape = self.types[vi.name]
                self.env[vi.name] = self.graph.input(vi.name, shape or (), dtype)
        for index, node in enumerate(g.node):
            self._lower(index, node)
        for vi in g.output:
            if vi.type.WhichOneof("value") not in (None, "tensor_type"):
                raise ModelError(f"graph output '{vi.name}' is a {vi.type.WhichOneof('value')}; tensat needs tensors")
            self.graph.output(vi.name, self.value_of(vi.name))
        self._record_symbolic()
        return self.graph.compact()

    def _record_symbolic(self) -> None:
        """For a model read with symbolic dims: the dims the model tells for each node whose sizes its attributes
        hold (`ir.Graph.symbolic`), by shape inference, else by running it (`SymbolSizes.probed`); the e-graph
        derives the others'."""
        if self.dims is None:
            return
        for name, v in self.env.items():
            node = self.graph.nodes[v]
            if ops.get(node.op).symbolic_shape is None:
                continue
            dims = self.dims.get(name)
            probed = self.probed.get(name)
            if (
                dims is not None
                and len(dims) == len(node.shape)
                and all(d in self.named or d == s for d, s in zip(dims, node.shape))
            ):
                self.graph.symbolic[v] = self.symbols.of(dims)
            elif probed is not None and len(probed) == len(node.shape):
                self.graph.symbolic[v] = probed

    def value_of(self, name: str) -> int:
        """IR id of tensor `name`: a weight node for a constant, the nodes that compute it for one that varies with
        the sizes of symbolic dims (`_computed`)."""
        if name not in self.env:
            if name in self.varying:  # while folding, its value at the sizes read, not kept for the graph
                if self.folding:
                    return self.constant(self.consts[name], name)
                self._computed(name)
                return self.env[name]
            if name not in self.consts:
                raise ModelError(f"tensor '{name}' is read but never produced")
            self.env[name] = self.constant(self.consts[name], name)
        return self.env[name]

    def constant(self, array: np.ndarray, name: str) -> int:
        """The weight node of `array`: one per distinct value. Exporters write equal constants under several names,
        and onnxslim transposes a weight shared by several MatMuls once per Gemm it writes; a rule that merges the
        products of a shared weight (Tensat's own gains) must see that it is one. Constants of one dtype and shape
        are told apart by a sample of their elements, and compared in full where the samples agree."""
        array = np.asarray(array)
        if array.dtype == object:
            return self.graph.weight(array, name)
        value = _uniform(array)
        if value is not None:
            code = ops.TYPE_CODES[str(array.dtype)]
            return self.graph.add("fill", [], value=value, shape=array.shape, dtype=code)
        bucket = self._constants.setdefault((str(array.dtype), tuple(array.shape)), [])
        if bucket:
            sample = _sample(array)
            for k, (i, other, known) in enumerate(bucket):
                if known is None:
                    known = _sample(other)
                    bucket[k] = (i, other, known)
                if known == sample and np.array_equal(other, array):
                    return i
        else:
            sample = None
        i = self.graph.weight(array, name)
        bucket.append((i, array, sample))
        return i

    def present(self, k: int) -> bool:
        return k < len(self.node.input) and bool(self.node.input[k])

    def value(self, k: int) -> int:
        return self.value_of(self.node.input[k])

    def data(self, k: int) -> int:
        """IR id of data input `k` (the op built over it decides which element types it models: `OpDef.accepts`)."""
        if not self.present(k):
            raise _Unsupported(f"input {k} missing")
        return self.value(k)

    def param(self, k: int) -> np.ndarray:
        """Constant input `k` (shape, axes, split sizes...); a computed one makes the node opaque, and so does one
        that varies with the sizes of symbolic dims (its value at the sizes read would be written into the model)."""
        if self.present(k) and self.node.input[k] in self.varying:
            raise _Unsupported(f"input {k} varies with the sizes of symbolic dims")
        return self.sized_param(k)

    def sized_param(self, k: int) -> np.ndarray:
        """Constant input `k` at the sizes read, where it varies with the sizes of symbolic dims too: a Reshape's
        target, which the result writes again for every size (`symbolic.generalize`, with 0 and -1) and is verified
        at other sizes. A computed one makes the node opaque."""
        if not (self.present(k) and self.node.input[k] in self.consts):
            raise _Unsupported(f"input {k} is not a constant")
        return self.consts[self.node.input[k]]

    def constant_input(self, k: int) -> bool:
        """Whether input `k` is a constant at every size of the model's symbolic dims."""
        return self.present(k) and self.node.input[k] in self.consts and self.node.input[k] not in self.varying

    def shape(self, v: int) -> tuple[int, ...]:
        return self.graph.nodes[v].shape

    def weight(self, array: np.ndarray) -> int:
        self._temp += 1
        base = self.node.output[0] if self.node.output and self.node.output[0] else f"node{self.index}"
        return self.constant(np.asarray(array), f"{base}__{self._temp}")

    def op(self, name: str, inputs: Sequence[int], **attrs: Any) -> int:
        """Add IR op `name`; evaluated at once into a constant when every input is one (numpy broadcasts the
        operands of element-wise ops and matmuls whatever their ranks; the IR pads them to equal ranks). An op over
        element types it does not model (`OpDef.accepts`) is not lowered."""
        g = self.graph
        d = ops.get(name)
        broadcast = d.kind == "broadcast"
        arrays = [g.constant(i) for i in inputs]
        if all(a is not None for a in arrays):
            if not broadcast and name != "matmul":
                ops.shape_of(name, [a.shape for a in arrays], attrs)  # type: ignore[union-attr]
            try:
                value = ops.evaluate(name, arrays, attrs)  # type: ignore[arg-type]
            except ValueError as e:
                raise ops.ShapeError(str(e)) from None
            return self.weight(value)
        dtypes = [g.nodes[i].dtype for i in inputs]
        if not d.accepts(dtypes):
            raise _Unsupported(f"{name} of {', '.join(dtypes)} is not modelled")
        if broadcast:
            rank = max(len(g.nodes[i].shape) for i in inputs)
            fixed = []
            for i, array in zip(inputs, arrays):
                if array is not None and array.ndim < rank:
                    i = self.weight(array.reshape((1,) * (rank - array.ndim) + array.shape))
                fixed.append(i)
            inputs = fixed
        return g.add(name, inputs, **attrs)

    def reshape(self, v: int, shape: Sequence[int]) -> int:
        shape = tuple(int(d) for d in shape)
        if self.shape(v) == shape:
            return v
        return self.op("reshape", [v], shape=shape)

    def slice(self, v: int, axis: int, start: int, size: int) -> int:
        if start == 0 and size == self.shape(v)[axis]:
            return v
        return self.op("slice", [v], axis=axis, start=start, size=size)

    # -- nodes --------------------------------------------------------------------------------------------------

    def _lower(self, index: int, node: NodeProto) -> None:
        """Lower `node`; where it computes the output of a subgraph onnxruntime fuses into a kernel, the kernel
        instead (`fusions.Fusions.kernels`: its op where tensat models it, else the node verbatim; the subgraph's
        other nodes are then read by nothing)."""
        kernel = next((self.fusions.kernels[name] for name in node.output if name in self.fusions.kernels), None)
        if kernel is not None:
            try:
                self._lower_node(index, kernel)
            except ModelError:  # the kernel's own types are not known: the subgraph as written
                pass
            else:
                if kernel.output[0] in self.env:
                    return
        self._lower_node(index, node)

    def _at(self, index: int, node: NodeProto) -> None:
        """Make `node` (the model's `index`-th) the node being lowered."""
        self.node, self.index = node, index
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def _lower_node(self, index: int, node: NodeProto) -> None:
        self._at(index, node)
        domain = norm_domain(node.domain)
        has_graph = any(subgraphs(a) for a in node.attribute)
        handler = IMPORTERS.get(node.op_type if domain == "" else f"{domain}:{node.op_type}")
        inputs = [n for n in node.input if n]
        if not has_graph and node.op_type not in NONDETERMINISTIC and all(n in self.consts for n in inputs):
            arrays = self._fold(handler)
            if arrays is not None:
                masks = self._varying_masks(arrays) if any(n in self.varying for n in inputs) else []
                for name, array in zip(node.output, arrays):
                    if name and array is not None:
                        self.consts[name] = array
                for name, mask in zip(node.output, masks):
                    if name and mask is not None and mask.any():
                        self.varying[name] = mask
                        self.producers[name] = (index, node)
                return
        outs: list[Any] | None = None
        if handler is not None:
            try:
                outs = handler(self, node)
                self._check_shapes(outs)
            except (_Unsupported, ops.ShapeError, KeyError, ValueError):
                outs = None
        if outs is None:
            outs = self._opaque(has_graph)
        for name, v in zip(node.output, outs):
            if not name or v is None:
                continue
            if isinstance(v, np.ndarray):
                self.consts[name] = v
                if name in self.varying:
                    self.producers[name] = (index, node)
            else:
                self.env[name] = v

    def _fold(self, handler: Callable[..., list[Any]] | None) -> list[np.ndarray | None] | None:
        """Values of a node whose inputs are all constant: numpy through the IR ops, else onnxruntime."""
        node = self.node
        if node.op_type == "Constant" and norm_domain(node.domain) == "" and len(node.attribute) == 1:
            attr = node.attribute[0]
            simple = {
                "value_float": np.float32,
                "value_floats": np.float32,
                "value_int": np.int64,
                "value_ints": np.int64,
            }
            if attr.name == "value":
                return [numpy_helper.to_array(attr.t)]
            if attr.name in simple:
                return [np.asarray(self.attrs[attr.name], dtype=simple[attr.name])]
        if handler is not None:
            self.folding = True
            try:
                outs = handler(self, node)
                arrays = []
                for v in outs:
                    if v is None or isinstance(v, np.ndarray):
                        arrays.append(v)
                    elif (value := self.graph.constant(v)) is not None:
                        arrays.append(value)
                    else:
                        raise _Unsupported("not folded")
                return arrays
            except (_Unsupported, ops.ShapeError, ValueError, TypeError):
                pass
            finally:
                self.folding = False
        arrays_in = [self.consts[n] if n else None for n in node.input]
        try:
            return run_node(node, arrays_in, self.opsets)
        except Exception:  # noqa: BLE001 - whatever onnxruntime refuses stays a node
            return None

    def dims_vary(self, name: str, rank: int) -> np.ndarray:
        """Which dims of tensor `name` (of `rank` dims) vary with the sizes of the model's symbolic input dims: none
        in a model without them, all where inference could not tell."""
        if self.dims is None:
            return np.zeros(rank, bool)
        dims = self.dims.get(name)
        if dims is None or len(dims) != rank:
            return np.ones(rank, bool)
        return np.asarray([not isinstance(d, int) for d in dims], bool)

    def _varying_masks(self, outputs: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
        """Which elements of the current node's constant outputs vary with the sizes of symbolic dims, from which
        of its inputs' do: an element-wise op's from those at the same place, an op that moves elements (Gather,
        Slice, Concat, Reshape...) by moving the masks alike; all of them for any other op, or where a varying
        input decides the output's shape or positions."""
        node = self.node
        names = list(node.input)
        every = [np.ones(np.shape(a), bool) if a is not None else None for a in outputs]
        if norm_domain(node.domain) != "" or len(outputs) != 1 or outputs[0] is None:
            return every
        out = np.asarray(outputs[0])
        if node.op_type in _ELEMENTWISE:
            mask = np.zeros(out.shape, bool)
            try:
                for n in names:
                    if n in self.varying:
                        mask |= np.broadcast_to(self.varying[n], out.shape)
            except ValueError:
                return every
            return [mask]
        carried = _MOVING.get(node.op_type)
        if carried is None:
            return every
        positions = range(len(names)) if carried == "all" else carried
        if any(n in self.varying and k not in positions for k, n in enumerate(names)):
            return every
        arrays: list[np.ndarray | None] = []
        for k, n in enumerate(names):
            if not n:
                arrays.append(None)
            elif k in positions:
                value = self.consts[n]
                mask = self.varying.get(n, np.zeros(np.shape(value), bool))
                arrays.append(np.asarray(mask).astype(np.asarray(value).dtype))
            else:
                arrays.append(self.consts[n])
        try:
            moved = run_node(node, arrays, self.opsets)
        except Exception:  # noqa: BLE001 - the masks could not be moved: every element varies
            return every
        return [np.asarray(m) != 0 if m is not None else None for m in moved]

    def _computed(self, name: str) -> None:
        """Bring constant `name`, which varies with the sizes of symbolic dims, into the graph as the ONNX nodes
        that compute it (kept verbatim, as opaque nodes over the tensors whose shapes they read): its value at the
        sizes read must not be written into the model."""
        index, node = self.producers[name]
        saved = (self.node, self.index, self.attrs)
        self._at(index, node)
        for out in node.output:
            if out in self.consts:
                array = np.asarray(self.consts[out])
                self.types[out] = (str(array.dtype), tuple(int(d) for d in array.shape))
        try:
            for out, v in zip(node.output, self._opaque(False)):
                if out and v is not None:
                    self.env[out] = v
        finally:
            self.node, self.index, self.attrs = saved

    def _check_shapes(self, outs: list[Any]) -> None:
        """A lowered node must agree with shape inference; disagreement means keep the ONNX node as is."""
        for name, v in zip(self.node.output, outs):
            if not name or v is None:
                continue
            shape = v.shape if isinstance(v, np.ndarray) else self.shape(v)
            known = self.types.get(name, ("", None))[1]
            if known is not None and tuple(shape) != known:
                raise _Unsupported(f"shape {shape} != inferred {known}")

    def _opaque(self, has_graph: bool) -> list[int | None]:
        node = self.node
        empty = [k for k, n in enumerate(node.input) if not n]
        last = max((k for k, n in enumerate(node.input) if n), default=-1)
        empty = [k for k in empty if k < last]
        inputs = [self.value_of(n) for n in node.input if n]
        attributes = list(node.attribute)
        if has_graph:
            free: list[str] = []
            for attr in attributes:
                for sub in subgraphs(attr):
                    free += [n for n in free_names(sub) if n not in free]
            if free:
                mapping = {n: f"{OUTER}{k}" for k, n in enumerate(free)}
                attributes = [AttributeProto.FromString(a.SerializeToString()) for a in attributes]
                for attr in attributes:
                    for sub in subgraphs(attr):
                        rename_free(sub, mapping)
                for name in free:
                    if name not in self.env and name not in self.consts:
                        raise ModelError(
                            f"{node_label(node, self.index)} reads tensor '{name}' in a subgraph, "
                            "which nothing produces"
                        )
                    inputs.append(self.value_of(name))
        key = f"{node.op_type}_{self.index}" + (f"@{','.join(map(str, empty))}" if empty else "")
        self.graph.opaque[key] = OpaqueSpec(
            node.op_type,
            norm_domain(node.domain),
            tuple(a.SerializeToString() for a in attributes),
            len(node.output),
            node.name,
        )
        outs: list[int | None] = []
        unknown = [k for k, n in enumerate(node.output) if n and not _concrete(self.types.get(n))]
        local = self._local_types() if unknown else {}
        for k, name in enumerate(node.output):
            if not name:
                outs.append(None)
                continue
            dtype, shape = self.types.get(name) or ("", None)
            if not _concrete((dtype, shape)):
                dtype, shape = local.get(k, (dtype, shape))
            if not _concrete((dtype, shape)):
                raise ModelError(
                    f"{node_label(node, self.index)}: the shape of its output '{name}' is unknown after shape "
                    "inference (it depends on data); tensat needs static shapes"
                )
            outs.append(self.graph.add("opaque", inputs, key=key, index=k, shape=shape, dtype=dtype))
        return outs

    def _local_types(self) -> dict[int, tuple[str, tuple[int, ...] | None]]:
        """Output types of the current node from inference on a one-node model with known inputs and constants."""
        node = self.node
        arrays: list[np.ndarray | None] = []
        for name in node.input:
            if not name:
                arrays.append(None)
            elif name in self.consts:
                arrays.append(self.consts[name])
            else:
                n = self.graph.nodes[self.value_of(name)]
                try:
                    arrays.append(np.zeros(n.shape, dtype=np.dtype(n.dtype)))
                except TypeError:
                    return {}
        model = single_node_model(node, arrays, self.opsets)
        consts = {f"i{k}": self.consts[name] for k, name in enumerate(node.input) if name in self.consts}
        for vi in list(model.graph.input):
            if vi.name in consts:
                model.graph.initializer.append(numpy_helper.from_array(consts[vi.name], vi.name))
        out: dict[int, tuple[str, tuple[int, ...] | None]] = {}
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
            for vi in inferred.graph.output:
                out[int(vi.name[1:])] = _value_type(vi)
        except Exception:  # noqa: BLE001
            pass
        if not all(_concrete(t) for t in out.values()) or not out:
            domain = norm_domain(node.domain)
            if domain != "":  # other domains: onnx often cannot infer, onnxruntime can run them
                try:
                    for k, a in enumerate(run_node(node, arrays, self.opsets)):
                        if a is not None:
                            out[k] = (str(a.dtype), tuple(int(d) for d in a.shape))
                except Exception:  # noqa: BLE001
                    pass
        return out


# ONNX ops whose output dims are read from their inputs' values, or from sizes they hold, not derived from their
# inputs' dims: the ops tensat lowers to an op that holds sizes (`OpDef.symbolic_shape`), or keeps opaque
_SIZED = frozenset(
    {
        "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split", "Gather", "GatherND", "GatherElements",
        "Expand", "Tile", "Range", "ConstantOfShape", "Shape", "Size", "NonZero", "TopK", "Resize", "Pad", "OneHot",
        "Compress", "CumSum", "Einsum", "Trilu",
    }
)  # fmt: skip


def _value_type(vi: onnx.ValueInfoProto) -> tuple[str, tuple[int, ...] | None]:
    """(dtype, shape) of a value: shape None when unknown or symbolic; non-tensors get shape ()."""
    kind = vi.type.WhichOneof("value")
    if kind != "tensor_type":
        return (kind or "", () if kind else None)
    tt = vi.type.tensor_type
    dtype = dtype_name(tt.elem_type) if tt.elem_type else ""
    if not tt.HasField("shape"):
        return dtype, None
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 1:
            return dtype, None
        dims.append(int(d.dim_value))
    return dtype, tuple(dims)


_ELEMENTWISE = frozenset(
    "Add Sub Mul Div Mod Pow Neg Abs Sqrt Floor Ceil Max Min Equal Less LessOrEqual Greater GreaterOrEqual Not And "
    "Or Xor Where Cast Sign Clip".split()
)  # ops whose output element depends on the input elements at its own place only (broadcast)
# ops that move elements without computing on them, with the inputs whose elements they move
_MOVING: dict[str, tuple[int, ...] | str] = {
    "Gather": (0,),
    "Slice": (0,),
    "Concat": "all",
    "Unsqueeze": (0,),
    "Squeeze": (0,),
    "Reshape": (0,),
    "Flatten": (0,),
    "Identity": (0,),
    "Transpose": (0,),
    "Expand": (0,),
}


def _concrete(t: tuple[str, tuple[int, ...] | None] | None) -> bool:
    return t is not None and bool(t[0]) and t[1] is not None


# -- lowerings: ONNX op type -> IR ---------------------------------------------------------------------------------


def _ints(values: Any) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


def _text(value: Any, default: str) -> str:
    """A string attribute's value (bytes in a NodeProto), or `default` where the node leaves it out."""
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise _Unsupported(f"axis {axis} out of range")
    return axis + rank if axis < 0 else axis


Lowering = Callable[[_Importer, NodeProto], list[Any]]
_LOWERINGS: dict[str, Lowering] = {}


def _lowering(*op_types: str) -> Callable[[Lowering], Lowering]:
    """Register the decorated function as the lowering of ONNX nodes of `op_types`: types an OpDef names (`onnx`,
    `onnx_also`), or ONNX ops that lower to no tensat op (pass-throughs and shape queries)."""

    def register(fn: Lowering) -> Lowering:
        for op_type in op_types:
            _LOWERINGS[op_type] = fn
        return fn

    return register


def _plain(op: ops.OpDef) -> Lowering:
    """The lowering of an op with tensor inputs only: ONNX input k is the op's input k."""

    def lower(c: _Importer, node: NodeProto) -> list[Any]:
        if len([n for n in node.input if n]) != op.inputs:
            raise _Unsupported(f"{node.op_type} of {len(node.input)} inputs")
        return [c.op(op.name, [c.data(k) for k in range(op.inputs or 0)])]

    return lower


@_lowering("Greater", "GreaterOrEqual")
def _greater(c: _Importer, node: NodeProto) -> list[Any]:
    """a > b as b < a, a >= b as b <= a."""
    return [c.op("less" if node.op_type == "Greater" else "less_or_equal", [c.data(1), c.data(0)])]


@_lowering("Mod")
def _mod(c: _Importer, node: NodeProto) -> list[Any]:
    fmod = int(c.attrs.get("fmod", 0))
    a, b = c.data(0), c.data(1)
    if not fmod and c.graph.nodes[a].dtype == "float32":
        raise _Unsupported("a Mod of floats without fmod")  # ONNX refuses it
    return [c.op("mod", [a, b], fmod=fmod)]


@_lowering("IsInf")
def _isinf(c: _Importer, node: NodeProto) -> list[Any]:
    flags = {k: int(c.attrs.get(k, 1)) for k in ops.get("isinf").attr_names}  # ONNX sets both by default
    return [c.op("isinf", [c.data(0)], **flags)]


@_lowering("Sub")
def _sub(c: _Importer, node: NodeProto) -> list[Any]:
    """x - b as x + (-b) where b is a constant (the rules know add), else as sub."""
    if not c.constant_input(1):
        return [c.op("sub", [c.data(0), c.data(1)])]
    b = c.param(1)
    if b.dtype.kind not in "fi":
        raise _Unsupported("Sub of unsigned or other types")
    return [c.op("add", [c.data(0), c.weight(-b)])]


@_lowering("Sum")
def _sum(c: _Importer, node: NodeProto) -> list[Any]:
    """A Sum of two as `sum` (the form of an add onnxruntime does not fuse), of more as adds."""
    if len(node.input) == 2:
        return [c.op("sum", [c.data(0), c.data(1)])]
    acc = c.data(0)
    for k in range(1, len(node.input)):
        acc = c.op("add", [acc, c.data(k)])
    return [acc]


@_lowering("Gemm")
def _gemm(c: _Importer, node: NodeProto) -> list[Any]:
    a, b = c.data(0), c.data(1)
    if len(c.shape(a)) != 2 or len(c.shape(b)) != 2:
        raise _Unsupported("Gemm needs 2-D operands")
    if c.attrs.get("transA", 0):
        a = c.op("transpose", [a], perm=(1, 0))
    if c.attrs.get("transB", 0):
        b = c.op("transpose", [b], perm=(1, 0))
    y = c.op("matmul", [a, b])
    alpha, beta = float(c.attrs.get("alpha", 1.0)), float(c.attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = c.op("mul", [y, c.weight(np.full((1, 1), alpha, dtype=np.float32))])
    if c.present(2) and beta != 0.0:
        if c.constant_input(2):
            bias = c.param(2)
            if bias.dtype != np.float32:
                raise _Unsupported("non-float Gemm bias")
            cv = c.weight((bias * np.float32(beta)).astype(np.float32) if beta != 1.0 else bias)
        else:
            cv = c.data(2)
            if beta != 1.0:
                cv = c.op("mul", [cv, c.weight(np.full((1,) * len(c.shape(cv)), beta, dtype=np.float32))])
        y = c.op("add", [y, cv])
    return [y]


def _spatial_pads(
    c: _Importer, x: tuple[int, ...], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]
) -> tuple[int, ...]:
    """Explicit pads of the spatial axes of `x` (after N and C), their beginnings then their ends (top, left, bottom,
    right in 2-D), resolving auto_pad."""
    spatial = len(x) - 2
    auto = _text(c.attrs.get("auto_pad"), "NOTSET")
    if auto == "NOTSET":
        pads = tuple(int(p) for p in c.attrs.get("pads", [0] * 2 * spatial))
        if len(pads) != 2 * spatial:
            raise _Unsupported("pads rank")
        return pads
    if auto == "VALID":
        return (0,) * 2 * spatial
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise _Unsupported(f"auto_pad {auto}")
    begin, end = [], []
    for size, k, s, d in zip(x[2:], kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return (*begin, *end)


def _conv1d(c: _Importer, x: int, w: int) -> int:
    """A 1-D Conv as written (`conv1d`): the rule `conv1d-as-conv2d` offers its 2-D form over a height of 1, and
    measured costs choose between the two."""
    sx, sw = c.shape(x), c.shape(w)
    kernel = [int(k) for k in c.attrs.get("kernel_shape", sw[2:])]
    if tuple(kernel) != sw[2:]:
        raise _Unsupported("kernel_shape disagrees with weight")
    strides = [int(s) for s in c.attrs.get("strides", [1])]
    dilations = [int(d) for d in c.attrs.get("dilations", [1])]
    pads = _spatial_pads(c, sx, kernel, strides, dilations)
    b = c.data(2) if c.present(2) else c.graph.weight(np.zeros(sw[0], dtype=np.float32), "zero_bias")
    return c.op(
        "conv1d", [x, w, b], strides=strides, pads=pads, dilations=dilations, group=int(c.attrs.get("group", 1))
    )


@_lowering("Conv")
def _conv(c: _Importer, node: NodeProto) -> list[Any]:
    x, w = c.data(0), c.data(1)
    sx, sw = c.shape(x), c.shape(w)
    if len(sx) == 3 and len(sw) == 3:
        return [_conv1d(c, x, w)]
    if len(sx) != 4 or len(sw) != 4:
        raise _Unsupported("a 3-D conv")
    kernel = [int(k) for k in c.attrs.get("kernel_shape", sw[2:])]
    if tuple(kernel) != sw[2:]:
        raise _Unsupported("kernel_shape disagrees with weight")
    strides = [int(s) for s in c.attrs.get("strides", [1, 1])]
    dilations = [int(d) for d in c.attrs.get("dilations", [1, 1])]
    group = int(c.attrs.get("group", 1))
    pads = _spatial_pads(c, sx, kernel, strides, dilations)
    b = c.data(2) if c.present(2) else c.graph.weight(np.zeros(sw[0], dtype=np.float32), "zero_bias")
    return [c.op("conv2d", [x, w, b], strides=strides, pads=pads, dilations=dilations, group=group, act=ops.ACT_NONE)]


@_lowering("ConvTranspose")
def _conv_transpose(c: _Importer, node: NodeProto) -> list[Any]:
    """A 2-D ConvTranspose with explicit pads (or none); one that gives its output shape or pads automatically is
    kept as written."""
    x, w = c.data(0), c.data(1)
    sw = c.shape(w)
    auto = _text(c.attrs.get("auto_pad"), "NOTSET")
    if len(c.shape(x)) != 4 or len(sw) != 4 or auto != "NOTSET" or "output_shape" in c.attrs:
        raise _Unsupported("a ConvTranspose other than 2-D with explicit pads")
    if tuple(int(k) for k in c.attrs.get("kernel_shape", sw[2:])) != sw[2:]:
        raise _Unsupported("kernel_shape disagrees with weight")
    group = int(c.attrs.get("group", 1))
    b = c.data(2) if c.present(2) else c.graph.weight(np.zeros(sw[1] * group, dtype=np.float32), "zero_bias")
    return [
        c.op(
            "conv_transpose2d",
            [x, w, b],
            strides=[int(s) for s in c.attrs.get("strides", [1, 1])],
            pads=[int(p) for p in c.attrs.get("pads", [0, 0, 0, 0])],
            dilations=[int(d) for d in c.attrs.get("dilations", [1, 1])],
            group=group,
            output_padding=[int(p) for p in c.attrs.get("output_padding", [0, 0])],
        )
    ]


@_lowering("MaxPool", "AveragePool")
def _pool(c: _Importer, node: NodeProto) -> list[Any]:
    if len(node.output) > 1 and node.output[1]:
        raise _Unsupported("MaxPool indices")
    if c.attrs.get("storage_order", 0):
        raise _Unsupported("storage_order")
    if any(int(d) != 1 for d in c.attrs.get("dilations", [])):
        raise _Unsupported("dilated pooling")
    x = c.data(0)
    sx = c.shape(x)
    kernel = [int(k) for k in c.attrs["kernel_shape"]]
    if len(sx) not in ops.POOL_RANKS or len(kernel) != len(sx) - 2:
        raise _Unsupported("pooling over other than 2 or 3 spatial axes")
    strides = [int(s) for s in c.attrs.get("strides", [1] * len(kernel))]
    pads = _spatial_pads(c, sx, kernel, strides, [1] * len(kernel))
    cip = int(c.attrs.get("count_include_pad", 0))
    if c.attrs.get("ceil_mode", 0):
        pads, cip = _ceil_pads(sx, kernel, strides, pads, cip if node.op_type == "AveragePool" else None)
    if not cip:
        kernel, pads = _window_in_input(sx, kernel, strides, pads, c.dims_vary(node.input[0], len(sx))[2:].tolist())
    if node.op_type == "MaxPool":
        return [c.op("maxpool", [x], kernel=kernel, strides=strides, pads=pads)]
    return [c.op("avgpool", [x], kernel=kernel, strides=strides, pads=pads, count_include_pad=cip)]


def _ceil_out(size: int, kernel: int, stride: int, begin: int, end: int) -> int:
    """ONNX's output size of a ceil_mode window along one axis: rounded up, less a last window that would start in
    the end pad."""
    out = -(-(size + begin + end - kernel) // stride) + 1
    return out - 1 if (out - 1) * stride >= size + begin else out


def _ceil_pads(
    x: tuple[int, ...],
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    count_include_pad: int | None,
) -> tuple[tuple[int, ...], int]:
    """A ceil_mode pool as the floor-mode pool it equals: (pads, count_include_pad) with each end pad grown to hold the
    last window where it runs past the input's end (ONNX's ceil output size, less a window that would start in the
    end pad). A max pool takes -inf there; an average pool excludes it from its divisor, as it excludes its pads
    where it does not count them, and as onnxruntime clips a window counting them at the end pad. So an average pool
    counting pads it has, and a pool whose grown pad reaches its kernel, stay as written. `count_include_pad` is None
    for a max pool."""
    spatial = len(kernel)
    ends = []
    for i in range(spatial):
        size, begin, end = x[2 + i], pads[i], pads[spatial + i]
        out = _ceil_out(size, kernel[i], strides[i], begin, end)
        ends.append(max(end, (out - 1) * strides[i] + kernel[i] - size - begin))
    if ends == list(pads[spatial:]):
        return tuple(pads), count_include_pad or 0
    if count_include_pad and any(pads):
        raise _Unsupported("a ceil_mode average pool counting its pads")
    if any(e >= k for e, k in zip(ends, kernel)):
        raise _Unsupported("a ceil_mode pool whose end pad would reach its kernel")
    return (*pads[:spatial], *ends), 0


def _window_in_input(
    x: tuple[int, ...], kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int], varies: Sequence[bool]
) -> tuple[list[int], tuple[int, ...]]:
    """A pool's kernel and pads with each axis's one window cut at the input's end: where the axis has one window
    and it runs past the input into the end pad, that part of it reads pads only, which an average not counting
    its pads leaves out of its divisor and a max reads as -inf, so the kernel ends at the input's end and the end
    pad goes. EfficientNet-B0 exports its global average pool as a ceil_mode pool of a 1280 kernel over 7x7, whose
    floor-mode pool with end pads of 1273 onnxruntime runs over every pad; cut, it is the 7x7 pool it computes. An
    axis whose size `varies` with the model's symbolic dims keeps its window (the cut would fix its size)."""
    spatial = len(kernel)
    kernel, pads = list(kernel), list(pads)
    for i in range(spatial):
        size, begin, end = x[2 + i], pads[i], pads[spatial + i]
        if varies[i]:
            continue
        if ops.conv.window_out(size, kernel[i], strides[i], begin, end) == 1 and kernel[i] > begin + size:
            kernel[i], pads[spatial + i] = begin + size, 0
    return kernel, tuple(pads)


@_lowering("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0)
    if len(c.shape(x)) != 4:
        raise _Unsupported(f"{node.op_type} on non-4-D")
    return [c.op("globalavgpool" if node.op_type == "GlobalAveragePool" else "globalmaxpool", [x])]


@_lowering("Concat")
def _concat(c: _Importer, node: NodeProto) -> list[Any]:
    parts = [c.data(k) for k in range(len(node.input))]
    axis = _axis(int(c.attrs["axis"]), len(c.shape(parts[0])))
    acc = parts[0]
    for p in parts[1:]:
        acc = c.op("concat", [acc, p], axis=axis)
    return [acc]


@_lowering("Split")
def _split(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0)
    shape = c.shape(x)
    axis = _axis(int(c.attrs.get("axis", 0)), len(shape))
    dim, n = shape[axis], len(node.output)
    if c.opset < 13:
        sizes = _ints(c.attrs["split"]) if "split" in c.attrs else None
    else:
        sizes = _ints(c.param(1)) if c.present(1) else None
    if sizes is None:
        if "num_outputs" in c.attrs:
            n = int(c.attrs["num_outputs"])
            chunk = -(-dim // n)
            sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
        else:
            if dim % n:
                raise _Unsupported("uneven split")
            sizes = [dim // n] * n
    if len(sizes) != len(node.output) or sum(sizes) != dim:
        raise _Unsupported("split sizes")
    outs, start = [], 0
    for size in sizes:
        outs.append(c.slice(x, axis, start, size))
        start += size
    return outs


_TO_THE_END = 2**31 - 1  # a Slice end at least this large means the axis's end, whatever its size


@_lowering("Slice")
def _slice(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0)
    shape = c.shape(x)
    if c.opset < 10:
        starts, ends = _ints(c.attrs["starts"]), _ints(c.attrs["ends"])
        axes = _ints(c.attrs["axes"]) if "axes" in c.attrs else list(range(len(starts)))
        steps = [1] * len(starts)
    else:
        starts, ends = _ints(c.param(1)), _ints(c.param(2))
        axes = _ints(c.param(3)) if c.present(3) else list(range(len(starts)))
        steps = _ints(c.param(4)) if c.present(4) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps) or any(s < 1 for s in steps):
        raise _Unsupported("reversed slice")
    y = x
    varying = c.dims_vary(node.input[0], len(shape))
    for axis, start, end, step in zip(axes, starts, ends, steps):
        axis = _axis(axis, len(shape))
        dim = shape[axis]
        if varying[axis] and not (0 <= start < dim and (0 <= end < dim or (start == 0 and end >= _TO_THE_END))):
            raise _Unsupported("a slice whose bounds count from a symbolic dim's end")  # its size varies with it
        start = min(max(start + dim if start < 0 else start, 0), dim)
        end = min(max(end + dim if end < 0 else end, 0), dim)
        if end <= start:
            raise _Unsupported("empty slice")
        size = -(-(end - start) // step)
        if step == 1 or size == 1:
            y = c.slice(y, axis, start, size)
        else:
            y = c.op("stride", [y], axis=axis, start=start, step=step, size=size)
    return [y]


@_lowering("Transpose")
def _transpose(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0)
    rank = len(c.shape(x))
    perm = [int(p) for p in c.attrs.get("perm", list(range(rank))[::-1])]
    if perm == list(range(rank)):
        return [x]
    return [c.op("transpose", [x], perm=perm)]


@_lowering("Reshape")
def _reshape(c: _Importer, node: NodeProto) -> list[Any]:
    if not c.present(0):
        raise _Unsupported("input 0 missing")
    x = c.value(0)
    shape = c.shape(x)
    target = _ints(c.sized_param(1))
    varying = c.varying.get(node.input[1])
    if varying is not None:
        # a target of symbolic sizes is written again as 0 where it copies a symbolic dim of the input in place, and
        # -1 at one other: one that moves two (a (batch x seq, 768) read as (batch, seq, 768)) stays as computed
        copies = c.dims_vary(node.input[0], len(shape))
        moved = [
            j
            for j, v in enumerate(np.asarray(varying).reshape(-1))
            if v and not (j < len(shape) and copies[j] and target[j] in (0, shape[j]))
        ]
        if len(moved) > 1 or (moved and -1 in target):
            raise _Unsupported("a Reshape target whose symbolic sizes no 0 and -1 write")
    allowzero = int(c.attrs.get("allowzero", 0))
    if allowzero and 0 in target:
        raise _Unsupported("zero-size reshape")
    out = [shape[i] if d == 0 and i < len(shape) else d for i, d in enumerate(target)]
    if out.count(-1) > 1:
        raise _Unsupported("several -1")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or math.prod(shape) % known:
            raise _Unsupported("bad -1")
        out[out.index(-1)] = math.prod(shape) // known
    if tuple(out) == shape:  # a no-op on a tensor of any type (an exporter's view of an index tensor)
        return [x]
    return [c.reshape(c.data(0), out)]


@_lowering("Flatten")
def _flatten(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0)
    shape = c.shape(x)
    axis = int(c.attrs.get("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        raise _Unsupported("flatten axis")
    return [c.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])))]


@_lowering("Squeeze")
def _squeeze(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0)
    shape = c.shape(x)
    if c.opset < 13:
        axes = _ints(c.attrs["axes"]) if "axes" in c.attrs else None
    else:
        axes = _ints(c.param(1)) if c.present(1) else None
    if axes is None:
        axes = [i for i, d in enumerate(shape) if d == 1]
    squeezed = {_axis(a, len(shape)) for a in axes}
    if any(shape[a] != 1 for a in squeezed):
        raise _Unsupported("squeeze of a non-1 dim")
    return [c.reshape(x, [d for i, d in enumerate(shape) if i not in squeezed])]


@_lowering("Unsqueeze")
def _unsqueeze(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0)
    shape = c.shape(x)
    axes = _ints(c.attrs["axes"]) if c.opset < 13 else _ints(c.param(1))
    rank = len(shape) + len(axes)
    axes_set = {_axis(a, rank) for a in axes}
    if len(axes_set) != len(axes):
        raise _Unsupported("repeated axes")
    dims = iter(shape)
    return [c.reshape(x, [1 if i in axes_set else next(dims) for i in range(rank)])]


@_lowering("BatchNormalization")
def _batchnorm(c: _Importer, node: NodeProto) -> list[Any]:
    if any(node.output[1:]) or int(c.attrs.get("training_mode", 0)):
        raise _Unsupported("training batchnorm")
    x = c.data(0)
    epsilon = float(c.attrs.get("epsilon", 1e-5))
    if not int(c.attrs.get("spatial", 1)):
        return [_batchnorm_per_activation(c, x, epsilon)]
    params = [c.data(k) for k in range(1, 5)]
    return [c.op("batchnorm", [x, *params], epsilon=epsilon)]


def _batchnorm_per_activation(c: _Importer, x: int, epsilon: float) -> int:
    """Opset 7-8 BatchNormalization with `spatial=0`: parameters shaped like one sample (C, D1, ...) normalize
    each activation; with constant parameters that is x * a + b (a, b folded here), which stays optimizable."""
    scale, shift, mean, var = (np.asarray(c.param(k), dtype=np.float64) for k in range(1, 5))
    sample = c.shape(x)[1:]
    if any(p.shape != sample for p in (scale, shift, mean, var)):
        raise _Unsupported("per-activation batchnorm parameters do not have the shape of one sample")
    a = scale / np.sqrt(var + epsilon)
    b = shift - mean * a
    y = c.op("mul", [x, c.weight(a.astype(np.float32).reshape((1, *sample)))])
    return c.op("add", [y, c.weight(b.astype(np.float32).reshape((1, *sample)))])


@_lowering("Identity")
def _identity(c: _Importer, node: NodeProto) -> list[Any]:
    return [c.value(0)]


@_lowering("Dropout")
def _dropout(c: _Importer, node: NodeProto) -> list[Any]:
    """Inference Dropout: the data passes through; a mask that is read becomes a constant of the data's shape.

    From opset 12 the spec defines the inference mask as all true. Before, it leaves it open and onnxruntime (the
    runtime tensat verifies against) writes zeros (float zeros at opsets 7-9, where the mask has the data's type;
    false at 10-11), so that is the constant; an unread mask is dropped."""
    if c.present(2) and bool(np.asarray(c.param(2)).reshape(-1)[0]):
        raise _Unsupported("training dropout")
    x = c.value(0)
    if len(node.output) < 2 or not node.output[1]:
        return [x]
    dtype = np.dtype(np.bool_) if c.opset >= 10 else np.dtype(c.graph.nodes[x].dtype)
    fill = np.ones if c.opset >= 12 else np.zeros
    return [x, fill(c.shape(x), dtype=dtype)]


@_lowering("Gather")
def _gather(c: _Importer, node: NodeProto) -> list[Any]:
    """Gather of one constant index: a slice of size 1, reshaped without the axis for a scalar index (taking one
    channel or row); of an index tensor (token ids into an embedding table): gather."""
    x = c.data(0)
    shape = c.shape(x)
    axis = _axis(int(c.attrs.get("axis", 0)), len(shape))
    if c.present(1) and (not c.constant_input(1) or np.asarray(c.param(1)).size != 1):
        indices = c.data(1)
        out = shape[:axis] + c.shape(indices) + shape[axis + 1 :]
        return [c.op("gather", [x, indices], axis=axis, shape=out)]
    index = c.param(1)
    if index.dtype.kind not in "iu" or index.ndim > 1:
        raise _Unsupported("Gather of a non-integer index")
    k = int(index.reshape(-1)[0])
    if not -shape[axis] <= k < shape[axis]:
        raise _Unsupported("Gather index out of range")
    y = c.slice(x, axis, k % shape[axis], 1)
    if index.ndim == 0:
        y = c.reshape(y, shape[:axis] + shape[axis + 1 :])
    return [y]


@_lowering("GatherND")
def _gather_nd(c: _Importer, node: NodeProto) -> list[Any]:
    data, index = c.data(0), c.data(1)
    b = int(c.attrs.get("batch_dims", 0))
    dims, at = c.shape(data), c.shape(index)
    if not at or b + at[-1] > len(dims):
        raise _Unsupported("GatherND index deeper than the data")
    return [c.op("gather_nd", [data, index], batch_dims=b, shape=at[:-1] + dims[b + at[-1] :])]


@_lowering("GatherElements")
def _gather_elements(c: _Importer, node: NodeProto) -> list[Any]:
    data = c.data(0)
    return [c.op("gather_elements", [data, c.data(1)], axis=_axis(int(c.attrs.get("axis", 0)), len(c.shape(data))))]


def _no_reduction(c: _Importer) -> None:
    """A scatter is modelled as it replaces elements; one that adds or multiplies into them is kept opaque."""
    reduction = c.attrs.get("reduction", b"none")
    if (reduction.decode() if isinstance(reduction, bytes) else reduction) != "none":
        raise _Unsupported(f"{c.node.op_type} with reduction {reduction!r}")


@_lowering("ScatterND")
def _scatter_nd(c: _Importer, node: NodeProto) -> list[Any]:
    _no_reduction(c)
    return [c.op("scatter_nd", [c.data(0), c.data(1), c.data(2)])]


@_lowering("ScatterElements", "Scatter")
def _scatter_elements(c: _Importer, node: NodeProto) -> list[Any]:
    _no_reduction(c)
    data = c.data(0)
    axis = _axis(int(c.attrs.get("axis", 0)), len(c.shape(data)))
    return [c.op("scatter_elements", [data, c.data(1), c.data(2)], axis=axis)]


@_lowering("Expand")
def _expand(c: _Importer, node: NodeProto) -> list[Any]:
    """x broadcast to the constant target: x reshaped to the output's rank first, as element-wise operands are."""
    x = c.data(0)
    shape = c.shape(x)
    target = _ints(c.param(1))
    rank = max(len(shape), len(target))
    padded = (1,) * (rank - len(shape)) + tuple(shape)
    target = [1] * (rank - len(target)) + target
    out = tuple(max(a, b) if 1 in (a, b) else a for a, b in zip(padded, target))
    if any(a not in (1, b) for a, b in zip(padded, out)) or any(t not in (1, o) for t, o in zip(target, out)):
        raise _Unsupported("Expand does not broadcast")
    x = c.reshape(x, padded)
    return [x if padded == out else c.op("expand", [x], shape=out)]


def _reduce_axes(c: _Importer, rank: int, opset_input: int) -> tuple[int, ...] | None:
    """A reduction's axes, non-negative and sorted: the attribute before `opset_input`, the optional constant input
    from it; every axis where none is given (None: a no-op, noop_with_empty_axes)."""
    if c.opset < opset_input:
        axes = _ints(c.attrs["axes"]) if "axes" in c.attrs else []
    else:
        axes = _ints(c.param(1)) if c.present(1) else []
    if not axes:
        return None if int(c.attrs.get("noop_with_empty_axes", 0)) else tuple(range(rank))
    return tuple(sorted({_axis(a, rank) for a in axes}))


_REDUCTIONS = {onnx_type: name for name in ops.REDUCTIONS for onnx_type in ops.get(name).onnx_types}


@_lowering(*_REDUCTIONS)
def _reduce(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0)
    name = _REDUCTIONS[node.op_type]
    axes = _reduce_axes(c, len(c.shape(x)), ops.axes_input_since(name))
    if axes is None:
        return [x]
    return [c.op(name, [x], axes=axes, keepdims=int(c.attrs.get("keepdims", 1)))]


def _activation(name: str, defaults: Mapping[str, float]) -> Lowering:
    """The lowering of an activation with float attributes, each ONNX's default where the node leaves it out."""

    def lower(c: _Importer, node: NodeProto) -> list[Any]:
        return [c.op(name, [c.data(0)], **{k: float(c.attrs.get(k, v)) for k, v in defaults.items()})]

    return lower


for _name, _defaults in ops.ACTIVATION_DEFAULTS.items():
    _lowering(ops.get(_name).onnx or _name)(_activation(_name, _defaults))


@_lowering("Softmax", "LogSoftmax")
def _softmax(c: _Importer, node: NodeProto) -> list[Any]:
    """Softmax over one axis. Before opset 13 ONNX's Softmax is over the dims from its axis on, flattened into one:
    so it is read, where that is more than the last axis."""
    x = c.data(0)
    shape = c.shape(x)
    rank = len(shape)
    axis = _axis(int(c.attrs.get("axis", -1 if c.opset >= 13 else 1)), rank)
    op = "softmax" if node.op_type == "Softmax" else "log_softmax"
    if c.opset >= 13 or axis == rank - 1:
        return [c.op(op, [x], axis=axis)]
    flat = c.reshape(x, (*shape[:axis], math.prod(shape[axis:])))
    return [c.reshape(c.op(op, [flat], axis=axis), shape)]


@_lowering("CumSum")
def _cumsum(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0)
    axis = _axis(int(np.asarray(c.param(1)).reshape(-1)[0]), len(c.shape(x)))
    flags = {k: int(c.attrs.get(k, 0)) for k in ("exclusive", "reverse")}
    return [c.op("cumsum", [x], axis=axis, **flags)]


@_lowering("Trilu")
def _trilu(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0)
    if len(c.shape(x)) < 2:
        raise _Unsupported("Trilu of rank below 2")
    k = int(np.asarray(c.param(1)).reshape(-1)[0]) if c.present(1) else 0
    return [c.op("trilu", [x], upper=int(c.attrs.get("upper", 1)), k=k)]


@_lowering("Tile")
def _tile(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0)
    repeats = [int(r) for r in np.asarray(c.param(1)).reshape(-1)]
    if all(r == 1 for r in repeats):
        return [x]
    return [c.op("tile", [x], repeats=repeats)]


@_lowering("ArgMax", "ArgMin")
def _arg_reduction(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0)
    axis = _axis(int(c.attrs.get("axis", 0)), len(c.shape(x)))
    flags = {k: int(c.attrs.get(k, default)) for k, default in (("keepdims", 1), ("select_last_index", 0))}
    return [c.op(node.op_type.lower(), [x], axis=axis, **flags)]


@_lowering("TopK")
def _topk(c: _Importer, node: NodeProto) -> list[Any]:
    """A sorted TopK of a constant k: its values and its indices, two ops of one kernel; unsorted stays opaque."""
    x = c.data(0)
    if not int(c.attrs.get("sorted", 1)):
        raise _Unsupported("an unsorted TopK")
    k = int(np.asarray(c.param(1)).reshape(-1)[0]) if c.opset >= 10 else int(c.attrs["k"])
    attrs = {
        "axis": _axis(int(c.attrs.get("axis", -1)), len(c.shape(x))),
        "k": k,
        "largest": int(c.attrs.get("largest", 1)),
    }
    return [c.op("topk", [x], **attrs, output=0), c.op("topk", [x], **attrs, output=1)]


@_lowering("Einsum")
def _einsum(c: _Importer, node: NodeProto) -> list[Any]:
    """An Einsum of two operands; one of an ellipsis, or of other than two operands, stays opaque."""
    if len(node.input) != 2:
        raise _Unsupported("an Einsum of other than two operands")
    a, b = c.data(0), c.data(1)
    subscripts = ops.einsum_subscripts(_text(c.attrs.get("equation"), ""))
    shape = ops.einsum_shape(subscripts, [c.shape(a), c.shape(b)])
    return [c.op("einsum", [a, b], equation=subscripts, shape=shape)]


@_lowering("Clip")
def _clip(c: _Importer, node: NodeProto) -> list[Any]:
    """Clip with constant bounds (attributes before opset 11, inputs from it); a bound left out is infinite."""
    x = c.data(0)
    if c.opset < 11:
        low, high = float(c.attrs.get("min", -np.inf)), float(c.attrs.get("max", np.inf))
    else:
        low = float(np.asarray(c.param(1)).reshape(-1)[0]) if c.present(1) else -np.inf
        high = float(np.asarray(c.param(2)).reshape(-1)[0]) if c.present(2) else np.inf
    return [c.op("clip", [x], min=low, max=high)]


@_lowering("Cast")
def _cast(c: _Importer, node: NodeProto) -> list[Any]:
    to = dtype_name(int(c.attrs["to"]))
    if to not in ops.TYPE_CODES:
        raise _Unsupported(f"Cast to {to}")
    x = c.data(0)
    if c.graph.nodes[x].dtype == to:
        return [x]
    return [c.op("cast", [x], to=ops.TYPE_CODES[to])]


def _first_output_only(c: _Importer, node: NodeProto) -> None:
    if any(node.output[1:]):
        raise _Unsupported(f"{node.op_type}'s statistics outputs are read")


@_lowering("LayerNormalization")
def _layer_norm(c: _Importer, node: NodeProto) -> list[Any]:
    _first_output_only(c, node)
    x = c.data(0)
    shape = c.shape(x)
    axis = _axis(int(c.attrs.get("axis", -1)), len(shape))
    scale = c.data(1)
    if c.shape(scale) != shape[axis:]:
        raise _Unsupported("LayerNormalization scale of another shape than the normalized dims")
    bias = c.data(2) if c.present(2) else c.weight(np.zeros(shape[axis:], np.float32))
    return [c.op("layernorm", [x, scale, bias], axis=axis, epsilon=float(c.attrs.get("epsilon", 1e-5)))]


@_lowering("Pad")
def _pad(c: _Importer, node: NodeProto) -> list[Any]:
    """Padding by constant pads (attributes before opset 11, inputs from it; axes from opset 18): by a constant, or
    by the tensor's own elements (reflect, edge, and wrap from opset 19)."""
    mode = _text(c.attrs.get("mode"), "constant")
    if mode != "constant" and mode not in ops.PAD_MODES:
        raise _Unsupported(f"Pad mode {mode}")
    x = c.data(0)
    rank = len(c.shape(x))
    if c.opset < 11:
        pads, value = _ints(c.attrs["pads"]), float(c.attrs.get("value", 0.0))
    else:
        pads = _ints(c.param(1))
        value = float(np.asarray(c.param(2)).reshape(-1)[0]) if c.present(2) else 0.0
    if c.opset >= 18 and c.present(3):
        axes = [_axis(a, rank) for a in _ints(c.param(3))]
        full = [0] * (2 * rank)
        for k, a in enumerate(axes):
            full[a], full[a + rank] = pads[k], pads[k + len(axes)]
        pads = full
    if len(pads) != 2 * rank:
        raise _Unsupported("pads of another rank")
    if not any(pads):
        return [x]
    if mode != "constant":
        return [c.op("border_pad", [x], pads=pads, mode=ops.PAD_MODES.index(mode))]
    out = c.op("pad", [x], pads=pads, value=value)
    if c.node.output[0] in c.fusions.pads:  # onnxruntime runs it apart from the Conv it could be fused into
        c.graph.unfused.add(out)
    return [out]


@_lowering("Resize", "Upsample")
def _resize(c: _Importer, node: NodeProto) -> list[Any]:
    """Resize (Upsample before opset 10) of an NCHW tensor's height and width, nearest or linear, by constant scales
    or sizes. The scales tensat writes are the sizes' ratios, so a scale another than that (1.5 of 5 pixels, 7) is
    kept as the model wrote it. Before opset 11 the coordinates are asymmetric and the nearest pixel the floor."""
    x = c.data(0)
    shape = c.shape(x)
    mode = _text(c.attrs.get("mode"), "nearest")
    if len(shape) != 4 or mode not in ops.RESIZE_MODES:
        raise _Unsupported(f"{node.op_type} of {len(shape)}-D tensor, mode {mode}")
    if c.opset >= 11:
        transform = _text(c.attrs.get("coordinate_transformation_mode"), "half_pixel")
        nearest = _text(c.attrs.get("nearest_mode"), "round_prefer_floor")
        if int(c.attrs.get("antialias", 0)) or "axes" in c.attrs or transform not in ops.RESIZE_TRANSFORMS:
            raise _Unsupported(f"Resize with {transform} coordinates, antialiasing or axes")
        scales = np.asarray(c.param(2), np.float32) if c.present(2) and c.param(2).size else None
        sizes = _ints(c.param(3)) if scales is None else None
    else:
        transform, nearest = "asymmetric", "floor"
        scales = np.asarray(c.param(1) if c.present(1) else c.attrs["scales"], np.float32)
        sizes = None
        if mode == "nearest" and float(scales.min()) < 1:  # onnxruntime rounds otherwise down there: kept as written
            raise _Unsupported(f"{node.op_type} nearest by scales below 1")
    if scales is not None:
        sizes = [int(np.floor(d * float(s))) for d, s in zip(shape, scales)]
        if any(np.float32(out / d) != s for out, d, s in zip(sizes, shape, scales)):
            raise _Unsupported(f"Resize scales {scales.tolist()} other than its sizes' ratios")
    if sizes is None or len(sizes) != 4 or tuple(sizes[:2]) != shape[:2]:
        raise _Unsupported("Resize of the batch or the channels")
    if mode == "linear":
        nearest = ops.RESIZE_NEAREST[0]
    codes = dict(
        mode=ops.RESIZE_MODES.index(mode),
        transform=ops.RESIZE_TRANSFORMS.index(transform),
        nearest=ops.RESIZE_NEAREST.index(nearest),
    )
    return [c.op("resize", [x], size=tuple(sizes[2:]), **codes)]


@_lowering("DepthToSpace")
def _depth_to_space(c: _Importer, node: NodeProto) -> list[Any]:
    mode = _text(c.attrs.get("mode"), "DCR")
    if mode not in ops.DEPTH_TO_SPACE_MODES:
        raise _Unsupported(f"DepthToSpace mode {mode}")
    blocksize = int(c.attrs["blocksize"])
    return [c.op("depth_to_space", [c.data(0)], blocksize=blocksize, mode=ops.DEPTH_TO_SPACE_MODES.index(mode))]


@_lowering("SpaceToDepth")
def _space_to_depth(c: _Importer, node: NodeProto) -> list[Any]:
    return [c.op("space_to_depth", [c.data(0)], blocksize=int(c.attrs["blocksize"]))]


@_lowering("InstanceNormalization")
def _instance_norm(c: _Importer, node: NodeProto) -> list[Any]:
    return [c.op("instancenorm", [c.data(0), c.data(1), c.data(2)], epsilon=float(c.attrs.get("epsilon", 1e-5)))]


@_lowering("LRN")
def _lrn(c: _Importer, node: NodeProto) -> list[Any]:
    attrs = {"alpha": 1e-4, "beta": 0.75, "bias": 1.0}
    found = {k: float(c.attrs.get(k, v)) for k, v in attrs.items()}
    return [c.op("lrn", [c.data(0)], size=int(c.attrs["size"]), **found)]


@_lowering("Gelu")
def _gelu(c: _Importer, node: NodeProto) -> list[Any]:
    approximate = _text(c.attrs.get("approximate"), "none")
    if approximate not in ops.GELU_APPROXIMATIONS:
        raise _Unsupported(f"Gelu approximation {approximate}")
    return [c.op("gelu", [c.data(0)], approximate=ops.GELU_APPROXIMATIONS.index(approximate))]


@_lowering(f"{ops.CONTRIB}:Gelu")
def _contrib_gelu(c: _Importer, node: NodeProto) -> list[Any]:
    return [c.op("gelu", [c.data(0)], approximate=0)]


@_lowering(f"{ops.CONTRIB}:FastGelu")
def _fast_gelu(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0)
    if c.present(1):
        x = c.op("add", [x, c.data(1)])
    return [c.op("gelu", [x], approximate=1)]


@_lowering(f"{ops.CONTRIB}:FusedMatMul")
def _fused_matmul(c: _Importer, node: NodeProto) -> list[Any]:
    if int(c.attrs.get("transBatchA", 0)) or int(c.attrs.get("transBatchB", 0)):
        raise _Unsupported("FusedMatMul with batch transposes")
    a, b = c.data(0), c.data(1)
    if len(c.shape(a)) != len(c.shape(b)) or len(c.shape(a)) < 2:
        raise _Unsupported("FusedMatMul of operands of other ranks")
    attrs = {"trans_a": int(c.attrs.get("transA", 0)), "trans_b": int(c.attrs.get("transB", 0))}
    return [c.op("fused_matmul", [a, b], alpha=float(c.attrs.get("alpha", 1.0)), **attrs)]


def _plain_attention(c: _Importer, node: NodeProto, also: str = "") -> None:
    """onnxruntime's MultiHeadAttention and Attention as tensat models them: one output, inputs 0-2 and the scores'
    bias at 5; nothing at 3 (`also`: what MultiHeadAttention reads there) or 4 or after 5, and no causal mask."""
    _first_output_only(c, node)
    if any(c.present(j) for j in (3, 4, *range(6, len(node.input)))) or int(c.attrs.get("unidirectional", 0)):
        raise _Unsupported(f"{node.op_type} with {also}a padding mask, past state or causal masking")


def _scores_bias_and_scale(c: _Importer, s: int, t: int, head_size: int) -> tuple[Any, float]:
    """An attention kernel's scores' bias (input 5, zeros of (1, 1, S, T) where absent) and its scale (one over the
    square root of the head size where the attribute is absent or 0, which onnxruntime reads as unset)."""
    bias = c.data(5) if c.present(5) else c.weight(np.zeros((1, 1, s, t), np.float32))
    return bias, float(c.attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(head_size))


@_lowering(f"{ops.CONTRIB}:MultiHeadAttention")
def _multihead_attention(c: _Importer, node: NodeProto) -> list[Any]:
    _plain_attention(c, node, "a projection bias, ")
    q, k, v = c.data(0), c.data(1), c.data(2)
    (_, s, dq), t = c.shape(q), c.shape(k)[1]
    heads = int(c.attrs.get("num_heads", 0))
    if len(c.shape(k)) != 3 or len(c.shape(v)) != 3 or heads < 1 or dq % heads:
        raise _Unsupported("MultiHeadAttention of packed or 4-D inputs")
    bias, scale = _scores_bias_and_scale(c, s, t, dq // heads)
    return [c.op("multihead_attention", [q, k, v, bias], num_heads=heads, scale=scale)]


@_lowering(f"{ops.CONTRIB}:Attention")
def _attention(c: _Importer, node: NodeProto) -> list[Any]:
    _plain_attention(c, node)
    if c.attrs.get("qkv_hidden_sizes") or int(c.attrs.get("do_rotary", 0)) or c.attrs.get("past_present_share_buffer"):
        raise _Unsupported("Attention with unequal projections, rotary embedding or shared past state")
    x, w = c.data(0), c.data(1)
    (_, s, _), cols = c.shape(x), c.shape(w)[-1]
    heads = int(c.attrs.get("num_heads", 0))
    if len(c.shape(w)) != 2 or cols % 3 or heads < 1 or (cols // 3) % heads:
        raise _Unsupported("Attention of its projections in unequal or uneven parts")
    b = c.data(2) if c.present(2) else c.weight(np.zeros(cols, np.float32))
    bias, scale = _scores_bias_and_scale(c, s, s, cols // 3 // heads)
    return [c.op("attention", [x, w, b, bias], num_heads=heads, scale=scale)]


@_lowering(f"{ops.CONTRIB}:QuickGelu")
def _quick_gelu(c: _Importer, node: NodeProto) -> list[Any]:
    return [c.op("quick_gelu", [c.data(0)], alpha=float(c.attrs.get("alpha", 1.702)))]


@_lowering(f"{ops.CONTRIB}:SkipLayerNormalization")
def _skip_layer_norm(c: _Importer, node: NodeProto) -> list[Any]:
    _first_output_only(c, node)
    x, skip, gamma = c.data(0), c.data(1), c.data(2)
    hidden = c.shape(x)[-1:]
    beta = c.data(3) if c.present(3) else c.weight(np.zeros(hidden, np.float32))
    if c.present(4):
        x = c.op("add", [x, c.data(4)])
    return [c.op("skip_layernorm", [x, skip, gamma, beta], epsilon=float(c.attrs.get("epsilon", 1e-12)))]


@_lowering("SimplifiedLayerNormalization")
def _simplified_layer_norm(c: _Importer, node: NodeProto) -> list[Any]:
    _first_output_only(c, node)
    x, scale = c.data(0), c.data(1)
    if _axis(int(c.attrs.get("axis", -1)), len(c.shape(x))) != len(c.shape(x)) - 1:
        raise _Unsupported("SimplifiedLayerNormalization over several axes")
    return [c.op("rms_norm", [x, scale], epsilon=float(c.attrs.get("epsilon", 1e-5)))]


@_lowering("Shape")
def _shape(c: _Importer, node: NodeProto) -> list[Any]:
    shape = c.shape(c.value(0))
    rank = len(shape)
    start = int(c.attrs.get("start", 0))
    end = int(c.attrs.get("end", rank))
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    mask = c.dims_vary(node.input[0], rank)[start:end]
    if mask.any():
        c.varying[node.output[0]] = mask
    return [np.asarray(shape[start:end], dtype=np.int64)]


@_lowering("Size")
def _size(c: _Importer, node: NodeProto) -> list[Any]:
    shape = c.shape(c.value(0))
    if c.dims_vary(node.input[0], len(shape)).any():
        c.varying[node.output[0]] = np.ones((), bool)
    return [np.asarray(math.prod(shape), dtype=np.int64)]


def _importers() -> dict[str, Lowering]:
    """Every op's ONNX op types with their lowerings (registered, or plain for an op without attributes), then the
    registered lowerings of ONNX ops no OpDef names."""
    table: dict[str, Lowering] = {}
    for op in ops.REGISTRY.values():
        for op_type in op.onnx_types:
            if op_type in _LOWERINGS:
                table[op_type] = _LOWERINGS[op_type]
            elif op.attrs or op.inputs is None:
                raise TypeError(f"{op.name} has attributes: the ONNX layer needs a lowering for {op_type}")
            else:
                table[op_type] = _plain(op)
    for op_type, fn in _LOWERINGS.items():
        table.setdefault(op_type, fn)
    return table


IMPORTERS: dict[str, Lowering] = _importers()
"""ONNX op type (default domain) -> lowering to IR, from the registry. A lowering returns one value (IR id or
constant array) per ONNX output, or raises _Unsupported / ops.ShapeError to keep the node as an opaque op."""


def import_model(
    source: str | os.PathLike[str] | ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    check: bool = True,
    runtime_fusions: bool = False,
) -> Graph:
    """Load `source` (path or proto) and lower it to a tensat Graph (see `load_model` for validation and `check`).
    With `runtime_fusions`, the input is read as the kernels onnxruntime runs it as (`fusions.runtime_fusions`): a
    subgraph it fuses into a kernel is read as that kernel, an op where tensat models it, else the kernel's node
    kept verbatim. External data stays on disk: its weights are arrays mapped from their file
    (`tensat.onnx.external.mapped_array`), read only where touched, and shared by every graph read from it."""
    model = load_model(source, input_shapes, check=check, keep_external=True)
    fusions = runtime.runtime_fusions(model) if runtime_fusions else runtime.Fusions()
    return _Importer(model, release=True, fusions=fusions).run()
