"""Getting selections out of an explored e-graph: the extraction e-graph with every e-node priced (shapes
re-checked in Python, dominated e-nodes priced by estimate, pricing under a time limit), the e-nodes decoded back
into IR ops, the input graph's own selection, and the IR graph a selection describes."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tensat import ops
from tensat.cost import AnalyticCost
from tensat.egraph.lower import LoweredGraph
from tensat.extraction import EGraph as XGraph
from tensat.extraction import ENode, tree_costs
from tensat.ir import Graph, Node

UNCHOSEN_MS = 1e-9  # added to the cost of e-nodes the input graph does not use: a tie-break, not a price
PRICE_BATCH = 32  # e-nodes priced per prefetch call when pricing has a time limit
COMPETITIVE_SLACK_MS = 0.005  # an estimate this close to its e-class's cheapest is competitive whatever the ratio

CostFn = Callable[[Node, Sequence[tuple[int, ...]], Sequence[bool]], float]


@dataclass
class DecodedNode:
    """An e-node read back from egglog: an IR op with attributes over child e-classes."""

    op: str
    attrs: dict[str, Any]
    children: tuple[int, ...]
    eclass: int


class Export(LoweredGraph):
    """Exporting an explored graph for the extractor, and rebuilding the IR graph of an extracted selection."""

    def export(
        self,
        node_cost: CostFn,
        competitive: float | None = None,
        price_seconds: float | None = None,
    ) -> tuple[XGraph, dict[str, DecodedNode], set[str]]:
        """The e-graph for the extractor: costs from `node_cost`, roots the graph outputs.

        Returns the extraction e-graph, the decoded e-node behind every node id, and the ids of e-nodes that must
        not be chosen (their shape does not check, or a child has no shape). Every e-node the input graph does not
        use costs `UNCHOSEN_MS` more, so that of equal-cost graphs the extraction keeps the input's own operand
        order and layout (onnxruntime's fusions match operands in the order exporters write them).

        With `competitive` (for a cost model that measures, where every price takes time), only e-nodes that can
        appear in a competitive selection are priced by `node_cost`: those whose cheapest tree under the analytic
        estimate (the e-node and the work it needs below it) is at most `competitive` times the cheapest tree of
        their e-class (plus `COMPETITIVE_SLACK_MS`). The others (a depthwise convolution turned dense, a merge of
        its groups) are priced at their estimate times the largest ratio of price to estimate among the priced
        ones: dominated in their own e-class, never worth a measurement.
        With `price_seconds` as well, pricing (through `node_cost.prefetch`, in batches) stops once it has taken
        that long: the input graph's own e-nodes come first, then the others, costliest estimate first (where a
        wrong price would cost most); those left are priced like the dominated ones, so they are chosen only
        where they win by far.
        """
        eg = self.egraph
        frozen = eg.freeze()
        class_ids: dict[Any, int] = {}

        def cid(value: Any) -> int:
            return class_ids.setdefault(value, len(class_ids))

        shapes = {
            cid(r.inputs[0]): tuple(eg.value_to_i64(v) for v in eg.value_to_vec(r.output))
            for r in frozen.functions["shape-of"].rows
        }
        decoded: dict[str, DecodedNode] = {}
        for name, fn in frozen.functions.items():
            d = ops.BY_EGG.get(name)
            if d is None:
                continue
            for k, row in enumerate(fn.rows):
                if row.subsumed:
                    continue
                args = list(row.inputs)
                if d.inputs is None:
                    children = tuple(cid(v) for v in eg.value_to_vec(args[-1]))
                    attr_values = args[:-1]
                else:
                    children = tuple(cid(v) for v in args[: d.inputs])
                    attr_values = args[d.inputs :]
                attrs = {n: self._decode(kind, v) for (n, kind), v in zip(d.attrs, attr_values)}
                decoded[f"{name}#{k}"] = DecodedNode(d.name, attrs, children, cid(row.output))
        const = self._constant_classes(decoded)
        forbidden: set[str] = set()
        costs: dict[str, float] = {}
        to_price: dict[str, tuple[Node, list[tuple[int, ...]], list[bool]]] = {}
        for nid, dn in decoded.items():
            out_shape = shapes.get(dn.eclass)
            child_shapes = [shapes.get(c) for c in dn.children]
            ok = out_shape is not None and all(s is not None for s in child_shapes)
            if ok and ops.get(dn.op).inputs is not None:
                try:
                    ok = ops.shape_of(dn.op, child_shapes, dn.attrs) == out_shape  # type: ignore[arg-type]
                except ops.ShapeError:
                    ok = False
            if not ok:
                forbidden.add(nid)
                costs[nid] = 0.0
            elif dn.op in ("input", "weight") or (
                dn.op != "opaque" and dn.children and all(c in const for c in dn.children)
            ):
                costs[nid] = 0.0
            else:
                dtype = dn.attrs.get("dtype", "float32")
                node = Node(dn.op, (), tuple(dn.attrs.items()), out_shape, dtype)  # type: ignore[arg-type]
                to_price[nid] = (node, child_shapes, [c in const for c in dn.children])  # type: ignore[assignment]
        node_of = {eg.value_to_i64(r.inputs[0]): cid(r.output) for r in frozen.functions["node-of"].rows}
        self._node_of = node_of
        self._chosen_of = {eg.value_to_i64(r.inputs[0]): cid(r.output) for r in frozen.functions["chosen-of"].rows}
        estimate: dict[str, float] = {}
        dominated: set[str] = set()
        prefetch = getattr(node_cost, "prefetch", None)
        original = set(self.original_selection(decoded).values())
        if competitive:
            estimate, dominated, order = self._dominated(decoded, to_price, costs, forbidden, competitive, original)
            if prefetch is not None:
                dominated.update(self._prefetch(prefetch, order, to_price, price_seconds))
        elif prefetch is not None:
            prefetch(list(to_price.values()))
        scale = 1.0
        for nid, (node, in_shapes, flags) in to_price.items():
            if nid not in dominated:
                costs[nid] = float(node_cost(node, in_shapes, flags))
                if dominated and estimate[nid] > 0:
                    scale = max(scale, costs[nid] / estimate[nid])
        for nid in dominated:
            costs[nid] = estimate[nid] * scale
        nodes = {
            nid: ENode(
                ops.get(dn.op).egg,
                costs[nid] + (0.0 if nid in original else UNCHOSEN_MS),
                str(dn.eclass),
                tuple(str(c) for c in dn.children),
            )
            for nid, dn in decoded.items()
        }
        roots = list(dict.fromkeys(str(node_of[n]) for _, n in self.graph.outputs))
        return XGraph(nodes, roots), decoded, forbidden

    def _dominated(
        self,
        decoded: dict[str, DecodedNode],
        to_price: dict[str, tuple[Node, list[tuple[int, ...]], list[bool]]],
        costs: dict[str, float],
        forbidden: set[str],
        ratio: float,
        original: set[str],
    ) -> tuple[dict[str, float], set[str], list[str]]:
        """The analytic estimate of every e-node of `to_price`; those whose cheapest tree under it (the e-node with
        the work it needs below it) exceeds `ratio` times the cheapest tree of their e-class (never one of
        `original`, the input graph's own); and the others in pricing order (see `export`)."""
        analytic = AnalyticCost()
        estimate = {nid: float(analytic(*item)) for nid, item in to_price.items()}
        estimated = XGraph(
            {
                nid: ENode(
                    ops.get(dn.op).egg,
                    estimate.get(nid, costs.get(nid, 0.0)),
                    str(dn.eclass),
                    tuple(str(c) for c in dn.children),
                )
                for nid, dn in decoded.items()
            },
            [str(self._node_of[n]) for _, n in self.graph.outputs],
        )
        tree = tree_costs(estimated, frozenset(forbidden))
        cheapest: dict[int, float] = {}
        for nid, dn in decoded.items():
            cheapest[dn.eclass] = min(cheapest.get(dn.eclass, tree[nid]), tree[nid])
        dominated = {
            nid
            for nid in estimate
            if tree[nid] > ratio * cheapest[decoded[nid].eclass] + COMPETITIVE_SLACK_MS and nid not in original
        }
        order = sorted(
            (nid for nid in to_price if nid not in dominated), key=lambda nid: (nid not in original, -estimate[nid])
        )
        return estimate, dominated, order

    @staticmethod
    def _prefetch(
        prefetch: Callable[[Any], None],
        order: Sequence[str],
        to_price: dict[str, tuple[Node, list[tuple[int, ...]], list[bool]]],
        seconds: float | None,
    ) -> list[str]:
        """Prefetch the prices of `order` in batches until `seconds` have passed; the ids left unpriced."""
        if seconds is None:
            prefetch([to_price[nid] for nid in order])
            return []
        start = time.perf_counter()
        for k in range(0, len(order), PRICE_BATCH):
            if k and time.perf_counter() - start > seconds:
                return list(order[k:])
            prefetch([to_price[nid] for nid in order[k : k + PRICE_BATCH]])
        return []

    @staticmethod
    def _constant_classes(decoded: dict[str, DecodedNode]) -> set[int]:
        """E-classes computable from weights alone (their e-nodes over them cost nothing: folded at export)."""
        const: set[int] = set()
        changed = True
        while changed:
            changed = False
            for dn in decoded.values():
                if dn.eclass in const:
                    continue
                if dn.op == "weight" or (
                    dn.op not in ("input", "opaque") and dn.children and all(c in const for c in dn.children)
                ):
                    const.add(dn.eclass)
                    changed = True
        return const

    def original_selection(self, decoded: dict[str, DecodedNode]) -> dict[str, str]:
        """The e-node chosen in each e-class by the input graph itself: a valid, acyclic selection.

        Where rewrites merged the classes of several input nodes (e.g. slice(concat(a, b)) and a), the earliest
        node in topological order is chosen; ids then strictly decrease along every chosen edge, so the selection
        cannot be cyclic.
        """
        return self._selection(decoded, self.graph, self.live, self._node_of)

    def chosen_selection(self, decoded: dict[str, DecodedNode], graph: Graph, base: int) -> dict[str, str]:
        """The selection of the last export that describes `graph`, marked by `guide` under offset `base`."""
        ids = {i: self._chosen_of[base + i] for i in graph.live()}
        return self._selection(decoded, graph, graph.live(), ids)

    @staticmethod
    def _selection(
        decoded: dict[str, DecodedNode], graph: Graph, live: Sequence[int], class_of: dict[int, int]
    ) -> dict[str, str]:
        """The e-node of each of `graph`'s nodes (in topological order; the first wins where classes merged)."""
        index: dict[tuple[Any, ...], str] = {}
        for nid, dn in decoded.items():
            index[(dn.op, dn.children, tuple(sorted(dn.attrs.items())))] = nid
        choices: dict[str, str] = {}
        for i in live:
            n = graph.nodes[i]
            key = (n.op, tuple(class_of[j] for j in n.inputs), tuple(sorted(n.attr.items())))
            choices.setdefault(str(class_of[i]), index[key])
        return choices

    def rebuild(self, choices: dict[str, str], decoded: dict[str, DecodedNode]) -> Graph:
        """The IR graph a selection (e-class -> e-node id) describes, with the original inputs and outputs."""
        src = self.graph
        out = Graph(opset_imports=dict(src.opset_imports), name=src.name)
        built: dict[int, int] = {}
        for i in src.input_ids:  # keep every graph input, in order
            n = src.nodes[i]
            built[self._node_of[i]] = out.input(n.attr["name"], n.shape, n.dtype)
        for _, root in src.outputs:
            stack = [self._node_of[root]]
            while stack:
                c = stack[-1]
                if c in built:
                    stack.pop()
                    continue
                dn = decoded[choices[str(c)]]
                pending = [ch for ch in dn.children if ch not in built]
                if pending:
                    stack.extend(pending)
                    continue
                stack.pop()
                built[c] = self._build_node(out, dn, [built[ch] for ch in dn.children])
        out.outputs = [(name, built[self._node_of[n]]) for name, n in src.outputs]
        return out

    def _build_node(self, out: Graph, dn: DecodedNode, inputs: list[int]) -> int:
        src = self.graph
        if dn.op == "input":
            node = next(src.nodes[i] for i in src.input_ids if src.nodes[i].attr["name"] == dn.attrs["name"])
            return out.input(dn.attrs["name"], node.shape, node.dtype)
        if dn.op == "weight":
            return out.weight(src.weights[dn.attrs["name"]], dn.attrs["name"])
        if dn.op == "opaque":
            out.opaque[dn.attrs["key"]] = src.opaque[dn.attrs["key"]]
        return out.add(dn.op, inputs, **dn.attrs)
