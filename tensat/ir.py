"""The tensor graph IR: a hash-consed DAG of single-output nodes over the operator registry.

Every node produces one tensor. Multi-output ONNX ops become one node per output (Split becomes slices; an opaque
op's outputs are `opaque` nodes sharing a key and differing in `index`). Nodes are appended in topological order,
so a node's inputs always have smaller ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensat import ops

FLOAT = "float32"


def _freeze(value: Any) -> Any:
    """Attribute values as hashable, canonical Python values."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        return value
    raise TypeError(f"unsupported attribute value {value!r}")


@dataclass(frozen=True)
class Node:
    """One operator application producing one tensor."""

    op: str
    inputs: tuple[int, ...]
    attrs: tuple[tuple[str, Any], ...]
    shape: tuple[int, ...]
    dtype: str

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)

    @property
    def is_leaf(self) -> bool:
        """A graph input or a constant (a weight, or a constant its attributes define): no tensor inputs."""
        return ops.get(self.op).leaf


@dataclass(frozen=True)
class OpaqueSpec:
    """An ONNX node tensat does not model, kept verbatim (attributes as serialized AttributeProto bytes)."""

    op_type: str
    domain: str
    attributes: tuple[bytes, ...]
    num_outputs: int
    name: str = ""


@dataclass
class Graph:
    """A tensor graph: nodes in topological order, named outputs, weight arrays and opaque-op specs."""

    nodes: list[Node] = field(default_factory=list)
    outputs: list[tuple[str, int]] = field(default_factory=list)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    opaque: dict[str, OpaqueSpec] = field(default_factory=dict)
    opset_imports: dict[str, int] = field(default_factory=lambda: {"": 17})
    name: str = "tensat"
    # for a model read with symbolic dims: the dims of the nodes whose sizes their attributes hold (a graph input,
    # a Reshape, an opaque node...), each symbolic dim at its size in `tensat.onnx.symbolic.SymbolSizes`; the
    # e-graph derives every other node's (`OpDef.symbolic_shape`), for rule guards that hold at every size
    symbolic: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # nodes onnxruntime runs on their own where the graph alone says it fuses them, as it runs the model read: a Pad
    # before a Conv written with `auto_pad` (`tensat.onnx.fusions.Fusions.pads`), which its PadFusion leaves apart
    unfused: set[int] = field(default_factory=set)
    _index: dict[Node, int] = field(default_factory=dict, repr=False)

    # -- construction -------------------------------------------------------------------------------------------

    def _intern(self, node: Node) -> int:
        found = self._index.get(node)
        if found is not None:
            return found
        self.nodes.append(node)
        self._index[node] = len(self.nodes) - 1
        return len(self.nodes) - 1

    def input(self, name: str, shape: Sequence[int], dtype: str = FLOAT) -> int:
        """A graph input of a concrete shape."""
        shape = tuple(int(d) for d in shape)
        return self._intern(Node("input", (), (("name", name), ("shape", shape)), shape, dtype))

    def weight(self, array: np.ndarray, name: str | None = None) -> int:
        """A constant tensor; a fresh unique name is made when `name` is taken by a different array."""
        array = np.asarray(array)
        base = name or "w"
        name, k = base, 0
        while name in self.weights and not (
            self.weights[name].dtype == array.dtype and np.array_equal(self.weights[name], array)
        ):
            k += 1
            name = f"{base}_{k}"
        self.weights[name] = array
        shape = tuple(int(d) for d in array.shape)
        return self._intern(Node("weight", (), (("name", name), ("shape", shape)), shape, str(array.dtype)))

    def add(self, op: str, inputs: Sequence[int], **attrs: Any) -> int:
        """Append `op(inputs, attrs)`, returning the id of an identical existing node where there is one.

        Element-wise operands of unequal rank and 1-D or rank-mismatched matmul operands are reshaped first, so
        every node in the IR has the equal-rank operands the egglog shape rules expect. Raises ops.ShapeError when
        the op does not accept its inputs.
        """
        d = ops.get(op)
        inputs = tuple(int(i) for i in inputs)
        if d.kind == "broadcast":
            inputs = self._equal_ranks(inputs)
        elif op == "matmul":
            return self._matmul(inputs)
        frozen = {k: _freeze(v) for k, v in attrs.items()}
        missing = set(d.attr_names) - set(frozen)
        extra = set(frozen) - set(d.attr_names)
        if missing or extra:
            raise ValueError(f"{op}: missing attributes {sorted(missing)}, unknown {sorted(extra)}")
        ordered = tuple((k, frozen[k]) for k in d.attr_names)
        if op == "opaque":
            shape, dtype = tuple(frozen["shape"]), frozen["dtype"]
        else:
            shape = ops.shape_of(op, [self.nodes[i].shape for i in inputs], frozen)
            dtype = ops.dtype_of(op, [self.nodes[i].dtype for i in inputs], frozen)
        return self._intern(Node(op, inputs, ordered, shape, dtype))

    def reshape(self, x: int, shape: Sequence[int]) -> int:
        """`x` reshaped to `shape` (no-op when already that shape)."""
        shape = tuple(int(s) for s in shape)
        if self.nodes[x].shape == shape:
            return x
        return self.add("reshape", [x], shape=shape)

    def _equal_ranks(self, inputs: tuple[int, ...]) -> tuple[int, ...]:
        rank = max(len(self.nodes[i].shape) for i in inputs)
        return tuple(self.reshape(i, (1,) * (rank - len(self.nodes[i].shape)) + self.nodes[i].shape) for i in inputs)

    def _matmul(self, inputs: tuple[int, ...]) -> int:
        a, b = inputs
        sa, sb = self.nodes[a].shape, self.nodes[b].shape
        if not sa or not sb:
            raise ops.ShapeError(f"matmul of a scalar: {sa} @ {sb}")
        squeeze_a, squeeze_b = len(sa) == 1, len(sb) == 1
        if squeeze_a:
            a = self.reshape(a, (1,) + sa)
        if squeeze_b:
            b = self.reshape(b, sb + (1,))
        a, b = self._equal_ranks((a, b))
        shape = ops.shape_of("matmul", [self.nodes[a].shape, self.nodes[b].shape], {})
        out = self._intern(Node("matmul", (a, b), (), shape, self.nodes[a].dtype))
        final = list(shape)
        if squeeze_b:
            final.pop(-1)
        if squeeze_a:
            final.pop(-2 if not squeeze_b else -1)
        target = tuple(final)
        if target == shape:
            return out
        if not target:
            raise ops.ShapeError("matmul of two vectors (a scalar result) is not supported")
        return self.reshape(out, target)

    def output(self, name: str, node: int) -> None:
        """Mark `node` as the graph output `name`."""
        self.outputs.append((name, node))

    # -- queries ------------------------------------------------------------------------------------------------

    @property
    def input_ids(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.op == "input"]

    def input_name(self, node: int) -> str:
        return self.nodes[node].attr["name"]

    def live(self) -> list[int]:
        """Ids of nodes reachable from the outputs (plus every graph input), in topological order."""
        seen = set(self.input_ids)
        stack = [n for _, n in self.outputs]
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            stack.extend(self.nodes[i].inputs)
        return sorted(seen)

    def readers(self, nodes: Iterable[int] | None = None) -> dict[int, list[int]]:
        """Each node -> the nodes of `nodes` (default: the live ones) that read it, each reader once, in order."""
        out: dict[int, list[int]] = {}
        for i in self.live() if nodes is None else nodes:
            for j in dict.fromkeys(self.nodes[i].inputs):
                out.setdefault(j, []).append(i)
        return out

    def weight_only(self) -> set[int]:
        """Ids of nodes computable from constants alone with numpy (folded into constants at export)."""
        const: set[int] = set()
        for i, n in enumerate(self.nodes):
            if ops.constant_leaf(n.op) or (
                n.op not in ("input", "opaque") and n.inputs and all(j in const for j in n.inputs)
            ):
                const.add(i)
        return const

    def constant(self, i: int) -> np.ndarray | None:
        """The value of node `i` if it is a constant leaf (a weight, or a constant its attributes define)."""
        n = self.nodes[i]
        if n.op == "weight":
            return self.weights[n.attr["name"]]
        if ops.constant_leaf(n.op):
            return ops.evaluate(n.op, [], n.attr).astype(n.dtype, copy=False)
        return None

    def opaque_count(self) -> int:
        """ONNX nodes the live graph keeps verbatim, as opaque nodes (one per ONNX node, whatever its outputs)."""
        return len({self.nodes[i].attr["key"] for i in self.live() if self.nodes[i].op == "opaque"})

    def op_count(self) -> int:
        """Number of live operator nodes that run at inference (not inputs, weights or weight-only nodes)."""
        const = self.weight_only()
        return sum(1 for i in self.live() if not self.nodes[i].is_leaf and i not in const)

    def compact(self) -> Graph:
        """A copy holding only live nodes and the weights they use, ids renumbered in topological order."""
        out = Graph(opset_imports=dict(self.opset_imports), name=self.name)
        remap: dict[int, int] = {}
        for i in self.live():
            n = self.nodes[i]
            if n.op == "weight":
                remap[i] = out.weight(self.weights[n.attr["name"]], n.attr["name"])
                continue
            if n.op == "opaque":
                out.opaque[n.attr["key"]] = self.opaque[n.attr["key"]]
            node = Node(n.op, tuple(remap[j] for j in n.inputs), n.attrs, n.shape, n.dtype)
            remap[i] = out._intern(node)
        out.outputs = [(name, remap[n]) for name, n in self.outputs]
        out.symbolic = {remap[i]: dims for i, dims in self.symbolic.items() if i in remap}
        out.unfused = {remap[i] for i in self.unfused if i in remap}
        return out

    def evaluate(self, feeds: Mapping[str, np.ndarray], nodes: Iterable[int] | None = None) -> dict[int, np.ndarray]:
        """Numpy reference values of `nodes` (default: every live node); opaque nodes are not evaluable."""
        wanted = sorted(set(nodes) if nodes is not None else set(self.live()))
        needed: set[int] = set()
        stack = list(wanted)
        while stack:
            i = stack.pop()
            if i not in needed:
                needed.add(i)
                stack.extend(self.nodes[i].inputs)
        values: dict[int, np.ndarray] = {}
        for i in sorted(needed):
            n = self.nodes[i]
            if n.op == "input":
                values[i] = np.asarray(feeds[n.attr["name"]])
            elif ops.constant_leaf(n.op):
                values[i] = self.constant(i)  # type: ignore[assignment]
            else:
                values[i] = ops.evaluate(n.op, [values[j] for j in n.inputs], n.attr)
        return {i: values[i] for i in wanted}

    def summary(self) -> dict[str, int]:
        """Operator counts of the live graph, by op name."""
        counts: dict[str, int] = {}
        for i in self.live():
            op = self.nodes[i].op
            counts[op] = counts.get(op, 0) + 1
        return dict(sorted(counts.items()))


def merged_concats(graph: Graph, nodes: Iterable[int], single_use: Callable[[int], bool]) -> dict[int, int]:
    """Each concat that a concat of `nodes` on the same axis reads, where that is its only use (`single_use`),
    mapped to that reader: tensat writes such a chain of binary concats as one N-ary Concat."""
    out: dict[int, int] = {}
    for i in nodes:
        n = graph.nodes[i]
        if n.op != "concat":
            continue
        for j in n.inputs:
            m = graph.nodes[j]
            if m.op == "concat" and m.attr["axis"] == n.attr["axis"] and single_use(j):
                out[j] = i
    return out
