"""Getting selections out of an explored e-graph: the extraction e-graph with every e-node priced (shapes
re-checked in Python, dominated e-nodes priced by estimate, pricing under a time limit), the e-nodes decoded back
into IR ops, the input graph's own selection, and the IR graph a selection describes."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Container, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tensat import ops
from tensat.cost import (
    EXACT,
    FUSION_PRODUCERS,
    FUSION_READERS,
    AnalyticCost,
    Computed,
    Const,
    Operand,
    Resolution,
    Scalar,
    device_of,
    fused_cost,
    fused_item,
    fuses_into,
    graph_layout,
)
from tensat.egraph import provenance
from tensat.egraph.lower import LoweredGraph
from tensat.egraph.provenance import DecodedNode
from tensat.extraction import EGraph as XGraph
from tensat.extraction import ENode, tree_costs
from tensat.ir import FLOAT, Graph, Node

UNCHOSEN_MS = 1e-9  # added to the cost of e-nodes the input graph does not use: a tie-break, not a price
COMPETITIVE_SLACK_MS = 0.005  # an estimate this close to its e-class's cheapest is competitive whatever the ratio
AVOIDED_MS = 1e6  # added to the cost of an e-node of an op to avoid (see `Export.export`)
PROMISING_ROUNDS = 8  # rounds of pricing the alternatives that could win against the e-nodes priced so far
PROMISING_SHARE = 0.5  # ... each round those whose gain is at least this share of the round's largest (`_Promising`)

CostFn = Callable[[Node, Sequence[tuple[int, ...]], Sequence[Const]], float]


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused (if it runs): an export allocates tens of thousands of acyclic
    objects, and the collections they trigger would scan the whole heap (the e-graph's and the extractor's
    structures) again and again."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass
class _ExportMemo:
    """What exports of one e-graph share: keyed by values that mean the same in every export (an e-node's op,
    attributes, shapes and which children are constant), never by e-class ids, which are numbered per export."""

    shape_ids: dict[tuple[int, ...], int] = field(default_factory=dict)  # shapes numbered as first met
    shape_list: list[tuple[int, ...]] = field(default_factory=list)  # the shape of each id
    shapes: dict[tuple[Any, ...], int | None] = field(default_factory=dict)  # the shape id a check gives; None: error
    items: dict[tuple[Any, ...], tuple[Node, list[tuple[int, ...]], list[Const]]] = field(default_factory=dict)
    estimates: dict[tuple[Any, ...], float] = field(default_factory=dict)  # analytic, for `competitive`
    prices: dict[tuple[Any, ...], float] = field(default_factory=dict)  # by `price_model`
    price_model: Any = None
    index_for: dict[str, DecodedNode] | None = None  # the decoded e-nodes `index` was made for
    index: dict[tuple[Any, ...], str] = field(default_factory=dict)
    shapes_for: dict[str, DecodedNode] | None = None  # the decoded e-nodes of the last export, whose ...
    class_shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)  # ... e-classes have these shapes

    def shape_id(self, shape: tuple[int, ...]) -> int:
        """The id of `shape`, numbered now if it is new."""
        sid = self.shape_ids.get(shape)
        if sid is None:
            sid = self.shape_ids[shape] = len(self.shape_list)
            self.shape_list.append(shape)
        return sid


class Export(LoweredGraph):
    """Exporting an explored graph for the extractor, and rebuilding the IR graph of an extracted selection."""

    _export_memo: _ExportMemo

    def export(
        self,
        node_cost: CostFn,
        competitive: float | None = None,
        price_seconds: float | None = None,
        avoided: Container[str] = (),
    ) -> tuple[XGraph, dict[str, DecodedNode], set[str]]:
        """The e-graph for the extractor: costs from `node_cost`, roots the graph outputs.

        Returns the extraction e-graph, the decoded e-node behind every node id, and the ids of e-nodes that must
        not be chosen (their shape does not check, or a child has no shape). Every e-node the input graph does not
        use costs `UNCHOSEN_MS` more, so that of equal-cost graphs the extraction keeps the input's own operand
        order and layout (onnxruntime's fusions match operands in the order exporters write them). Where
        `node_cost` declares a `resolution` (a measuring model, whose prices carry timing noise), such an e-node
        priced unlike every input node (another op, shape or operand order) also costs that resolution more: a
        change is chosen only where it gains more than two measurements can tell apart, not where two equal
        computations (a Mul before or after a Reshape) measured a hair apart. An e-node priced like an input node
        shares that node's measurement, so a graph that drops an Add and keeps its MatMuls' prices still wins.
        An e-node onnxruntime fuses into the e-node below it costs what it adds to that e-node's kernel
        (`_runtime_fused`, `tensat.cost.fused_cost`), as the runtime runs it: nothing for a BatchNormalization or a
        Relu over an e-class that holds a convolution; for another activation there (a Clip, a Sigmoid), the price of
        the convolution timed with it less the plain convolution's, at most the activation's own; on the CPU, for an
        Add over one that holds a MatMul (a Gemm: any addend of a 2-D product, a constant bias of an N-D one), the
        Gemm's price less the MatMul's, at most the Add's own. The fusions only a whole graph shows (an activation
        through the node it fuses after, a Transpose folded into a MatMul, onnxruntime's blocked layout) are left
        to the graph's price. So writing a fusion the runtime makes anyway gains nothing (a convolution with its
        fused activation code prices as the pair, see `tensat.cost.fused_item`), and a rewrite that takes one apart
        (a Relu moved past a MaxPool, a Transpose moved between a MatMul and its bias) pays for the node it leaves
        on its own. The price assumes the convolution or MatMul is chosen, and read by that node alone; where the
        extracted graph differs, its price as written (`tensat.cost.runtime_cost`) tells.

        With `competitive` (for a cost model that measures, where every price takes time), only e-nodes that can
        appear in a competitive selection are priced by `node_cost`: those whose cheapest tree under the analytic
        estimate (the e-node and the work it needs below it) is at most `competitive` times the cheapest tree of
        their e-class (plus `COMPETITIVE_SLACK_MS`). The others (a depthwise convolution turned dense, a merge of
        its groups) are priced at their estimate times the largest ratio of price to estimate among the priced
        ones: dominated in their own e-class, never worth a measurement.
        With `price_seconds` as well, pricing (through `node_cost.prefetch`, with a deadline) starts no
        measurement after that long: the input graph's own e-nodes come first, then, once they are all priced,
        the others for that long again, costliest estimate first (where a wrong price would cost most): where the
        input's took most of the time (CaffeNet's fully connected layers, each timed cold) the three forms of its
        LRN's window sum were otherwise left unpriced but the first, and that one won. Those left are priced like
        the dominated ones, so they are chosen only where they win by far.

        Shape checks, pricing items and prices are kept in `_ExportMemo` by the e-node's op, attributes and
        shapes (values that mean the same in every export, unlike e-class ids), so a later export of this e-graph
        (after a guided round) redoes only the e-nodes it has not seen; `node_cost` must price a node by its
        arguments alone (the analytic model computes, the measured one memoizes).

        E-nodes of the ops in `avoided` cost `AVOIDED_MS` more: chosen only where their e-class has no other (an
        onnxruntime kernel, where the model must keep to the ONNX standard's ops).

        An e-node's computed 4-D operands are priced in the layout the input graph holds their e-class in
        (`_class_layout`: a Resize of a token grid in NCHW, one of a feature map blocked), as the input's own price
        is; an e-class the input does not hold is left to the measuring model's estimate by extent.
        """
        with _collector_paused():
            return self._export(node_cost, competitive, price_seconds, avoided)

    def _export(
        self, node_cost: CostFn, competitive: float | None, price_seconds: float | None, avoided: Container[str]
    ) -> tuple[XGraph, dict[str, DecodedNode], set[str]]:
        """`export`, with the collector paused."""
        eg = self.egraph
        memo = self._memo()
        frozen = eg.freeze()
        class_ids: dict[Any, int] = {}
        setdefault = class_ids.setdefault
        to_i64 = eg.value_to_i64
        to_vec = eg.value_to_vec

        # shapes by id (`memo.shape_ids`): keys of small ints hash fast, and the ids hold across exports
        shape_list = memo.shape_list
        vec_ids: dict[Any, int] = {}
        shape_id: dict[int, int] = {}
        for r in frozen.functions["shape-of"].rows:
            c = setdefault(r.inputs[0], len(class_ids))
            v = r.output
            sid = vec_ids.get(v)
            if sid is None:
                sid = vec_ids[v] = memo.shape_id(tuple([to_i64(x) for x in to_vec(v)]))
            shape_id[c] = sid
        decoded, attr_items = self._decode_rows(frozen, setdefault, class_ids)
        memo.shapes_for, memo.class_shapes = decoded, {c: shape_list[sid] for c, sid in shape_id.items()}
        const = self._constant_classes(decoded)
        fills = {dn.eclass: float(dn.attrs["value"]) for dn in decoded.values() if dn.op == "fill"}
        node_of = {to_i64(r.inputs[0]): setdefault(r.output, len(class_ids)) for r in frozen.functions["node-of"].rows}
        class_dtype = self._class_dtypes(decoded, node_of)
        layout = self._class_layout(node_of, device_of(node_cost))
        forbidden: set[str] = set()
        costs: dict[str, float] = {}
        to_price: dict[str, tuple[Node, list[tuple[int, ...]], list[Const]]] = {}
        keys: dict[str, tuple[Any, ...]] = {}
        index: dict[tuple[Any, ...], str] = {}
        checked, items = memo.shapes, memo.items
        defs = {d.name: d for d in ops.BY_EGG.values()}
        leaves = {op for op, d in defs.items() if d.leaf}
        fixed = {op for op, d in defs.items() if d.inputs is not None}
        float_ops = {op for op, d in defs.items() if any(kind == "float" for _, kind in d.attrs)}
        unordered = {op for op, d in defs.items() if [n for n, _ in d.attrs] != sorted(n for n, _ in d.attrs)}
        for (nid, dn), attrs_items in zip(decoded.items(), attr_items):
            op, children = dn.op, dn.children
            index[(op, children, tuple(sorted(attrs_items)) if op in unordered else attrs_items)] = nid
            out = shape_id.get(dn.eclass)
            child_ids = tuple([shape_id.get(c) for c in children])
            ok = out is not None and None not in child_ids
            # -0.0 == 0.0: a float attribute is keyed by its text as well
            attrs_key = (op, attrs_items, repr(attrs_items)) if op in float_ops else (op, attrs_items)
            if ok and op in fixed:
                skey = (attrs_key, child_ids)
                if skey in checked:
                    got = checked[skey]
                else:
                    try:
                        shape = ops.shape_of(op, [shape_list[i] for i in child_ids], dn.attrs)  # type: ignore[index]
                    except ops.ShapeError:
                        got = None
                    else:
                        got = memo.shape_id(shape)
                    checked[skey] = got
                ok = got == out
            if not ok:
                forbidden.add(nid)
                costs[nid] = 0.0
                continue
            flags: tuple[Const, ...] = tuple([True if c in const else layout.get(c, False) for c in children])
            if defs[op].value_operands:  # a constant whose value decides the kernel: priced with it (Pow's exponent)
                flags = tuple(
                    Scalar(fills[c]) if k in defs[op].value_operands and c in fills else f
                    for k, (c, f) in enumerate(zip(children, flags))
                )
            if op in leaves or (op != "opaque" and children and all(flags)):
                costs[nid] = 0.0
            else:
                dtype = class_dtype(dn.eclass)
                key = (attrs_key, out, child_ids, flags, dtype)
                item = items.get(key)
                if item is None:
                    node = Node(op, (), attrs_items, shape_list[out], dtype)  # type: ignore[index]
                    in_shapes = [shape_list[i] for i in child_ids]  # type: ignore[index]
                    item = items[key] = (node, in_shapes, list(flags))
                to_price[nid] = item
                keys[nid] = key
        memo.index_for, memo.index = decoded, index
        self._node_of = node_of
        self._chosen_of = {
            to_i64(r.inputs[0]): setdefault(r.output, len(class_ids)) for r in frozen.functions["chosen-of"].rows
        }
        own = self.original_selection(decoded)
        names = [str(c) for c in range(len(class_ids))]
        estimate: dict[str, float] = {}
        dominated: set[str] = set()
        prefetch = getattr(node_cost, "prefetch", None)
        original = set(own.values())
        if competitive:
            deadline = None if price_seconds is None else time.perf_counter() + price_seconds
            measured: dict[str, float] = {}
            if prefetch is not None:  # the input's own e-nodes first: what the others are competing against
                own_items = [nid for nid in to_price if nid in original]
                left = set(self._prefetch(prefetch, own_items, to_price, deadline))
                measured = {nid: float(node_cost(*to_price[nid])) for nid in own_items if nid not in left}
                if price_seconds is not None and not left:  # the others get as long from here
                    deadline = time.perf_counter() + price_seconds
            estimate, dominated, order, promising = self._dominated(
                decoded, to_price, keys, costs, forbidden, competitive, original, names, measured
            )
            if prefetch is not None:
                known = set(measured)
                wanted = {nid for nid in order if nid not in known}
                for _ in range(PROMISING_ROUNDS):  # what could win against what is priced, then against that
                    first = promising(known, wanted, PROMISING_SHARE)
                    if not first:
                        break
                    left = set(self._prefetch(prefetch, first, to_price, deadline))
                    for nid in first:
                        if nid not in left:
                            promising.priced(nid, float(node_cost(*to_price[nid])))
                            known.add(nid)
                            wanted.discard(nid)
                    if left:
                        break
                first = promising(known, wanted)
                placed = set(first)
                rest = first + [nid for nid in order if nid in wanted and nid not in placed]
                dominated.update(self._prefetch(prefetch, rest, to_price, deadline))
        elif prefetch is not None:
            prefetch(list(to_price.values()))
        if memo.price_model is not node_cost:
            memo.price_model, memo.prices = node_cost, {}
        prices = memo.prices
        scale = 1.0
        for nid, (node, in_shapes, const_flags) in to_price.items():
            if nid not in dominated:
                key = keys[nid]
                price = prices.get(key)
                if price is None:
                    price = prices[key] = float(node_cost(node, in_shapes, const_flags))
                costs[nid] = price
                if dominated and estimate[nid] > 0:
                    scale = max(scale, price / estimate[nid])
        for nid in dominated:
            costs[nid] = estimate[nid] * scale
        fused = list(_runtime_fused(decoded, const, memo.class_shapes, device_of(node_cost)))
        gemms = {  # the fused kernels whose price the producer's misses: a MatMul with its Gemm's addend
            nid: item
            for nid, k, pid in fused
            if nid in to_price and pid in to_price and pid not in dominated
            if (item := fused_item(to_price[nid], k, to_price[pid])) is not None
        }
        if prefetch is not None and gemms:
            prefetch([*gemms.values(), *(to_price[nid] for nid in gemms)])
        for nid, k, pid in fused:
            costs[nid] = fused_cost(node_cost, to_price[nid], k, to_price[pid]) if nid in gemms else 0.0
        egg = {op: d.egg for op, d in defs.items()}
        resolution: Resolution = getattr(node_cost, "resolution", EXACT)
        relative, margin = 1.0 + resolution.relative, resolution.ms + UNCHOSEN_MS
        priced_for_input = {keys[nid] for nid in original if nid in keys}

        def offered(nid: str) -> float:
            """The cost the extractor sees: the price, plus the tie-breaks of e-nodes the input does not use (and
            the penalty of an avoided op)."""
            extra = AVOIDED_MS if decoded[nid].op in avoided else 0.0
            if nid in original:
                return costs[nid] + extra
            if keys.get(nid) in priced_for_input:
                return costs[nid] + UNCHOSEN_MS + extra
            return costs[nid] * relative + margin + extra

        nodes = {
            nid: ENode(egg[dn.op], offered(nid), names[dn.eclass], tuple([names[c] for c in dn.children]))
            for nid, dn in decoded.items()
        }
        roots = list(dict.fromkeys(names[node_of[n]] for _, n in self.graph.outputs))
        return XGraph(nodes, roots), decoded, forbidden

    def _memo(self) -> _ExportMemo:
        """This e-graph's export memo, made on first use."""
        memo = self.__dict__.get("_export_memo")
        if memo is None:
            memo = self._export_memo = _ExportMemo()
        return memo

    def _decode_rows(
        self, frozen: Any, setdefault: Callable[[Any, int], int], class_ids: dict[Any, int]
    ) -> tuple[dict[str, DecodedNode], list[tuple[tuple[str, Any], ...]]]:
        """Every tensor e-node of `frozen` not subsumed, by id (`egg-name#row`), and the items of each one's
        attributes (in the same order).

        E-class ids are numbered by `setdefault` in the order they are met (children, then the e-node's own
        class); attribute values repeat across rows, so vectors and strings are decoded once per value."""
        eg = self.egraph
        to_i64, to_vec, to_f64, to_string = eg.value_to_i64, eg.value_to_vec, eg.value_to_f64, eg.value_to_string
        strings = self._strings
        known: dict[Any, Any] = {}
        decoded: dict[str, DecodedNode] = {}
        attr_items: list[tuple[tuple[str, Any], ...]] = []
        for name, fn in frozen.functions.items():
            d = ops.BY_EGG.get(name)
            if d is None:
                continue
            op, n_in, spec = d.name, d.inputs, d.attrs
            for k, row in enumerate(fn.rows):
                if row.subsumed:
                    continue
                args = row.inputs
                if n_in is None:
                    children = tuple([setdefault(v, len(class_ids)) for v in to_vec(args[-1])])
                    attr_values = args[:-1]
                else:
                    children = tuple([setdefault(v, len(class_ids)) for v in args[:n_in]])
                    attr_values = args[n_in:]
                attrs: dict[str, Any] = {}
                for (n, kind), v in zip(spec, attr_values):
                    if kind == "int":
                        attrs[n] = to_i64(v)
                    elif kind == "float":
                        attrs[n] = to_f64(v)
                    else:
                        value = known.get((kind, v))
                        if value is None:
                            if kind == "ints":
                                value = tuple([to_i64(x) for x in to_vec(v)])
                            else:
                                value = strings[int(to_string(v)[1:])]
                            known[(kind, v)] = value
                        attrs[n] = value
                decoded[f"{name}#{k}"] = DecodedNode(op, attrs, children, setdefault(row.output, len(class_ids)))
                attr_items.append(tuple(attrs.items()))
        return decoded, attr_items

    def _dominated(
        self,
        decoded: dict[str, DecodedNode],
        to_price: dict[str, tuple[Node, list[tuple[int, ...]], list[Const]]],
        keys: dict[str, tuple[Any, ...]],
        costs: dict[str, float],
        forbidden: set[str],
        ratio: float,
        original: set[str],
        names: Sequence[str],
        measured: dict[str, float],
    ) -> tuple[dict[str, float], set[str], list[str], _Promising]:
        """The analytic estimate of every e-node of `to_price`; those whose cheapest tree under it (the e-node with
        the work it needs below it) exceeds `ratio` times the cheapest tree of their e-class (never one of
        `original`, the input graph's own); and the others in pricing order (see `export`). The trees count the
        input's e-nodes priced already (`measured`) at their price, in the estimate's units (divided by the median
        ratio of price to estimate over them): a kernel the estimate puts far below what it takes (onnxruntime's
        LRN) does not make the alternatives to it look dominated. Estimates are kept in the export memo under the
        e-node's key in `keys`; `names` are the e-class ids as strings. Also the costs and trees, for the pricing
        order that follows (`_Promising`)."""
        analytic = AnalyticCost()
        known = self._memo().estimates
        estimate: dict[str, float] = {}
        for nid, item in to_price.items():
            key = keys[nid]
            value = known.get(key)
            if value is None:
                value = known[key] = float(analytic(*item))
            estimate[nid] = value
        ratios = [measured[nid] / estimate[nid] for nid in measured if estimate.get(nid, 0.0) > 0 and measured[nid] > 0]
        scale = statistics.median(ratios) if ratios else 1.0
        in_units = {nid: price / scale for nid, price in measured.items()}
        cost = {nid: in_units.get(nid, estimate.get(nid, costs.get(nid, 0.0))) for nid in decoded}
        estimated = XGraph(
            {
                nid: ENode(
                    ops.get(dn.op).egg,
                    cost[nid],
                    names[dn.eclass],
                    tuple([names[c] for c in dn.children]),
                )
                for nid, dn in decoded.items()
            },
            [names[self._node_of[n]] for _, n in self.graph.outputs],
        )
        promising = _Promising(decoded, cost, tree_costs(estimated, frozenset(forbidden)), scale)
        tree, best = promising.tree, promising.best
        dominated = {
            nid
            for nid in estimate
            if tree[nid] > ratio * tree[best[decoded[nid].eclass]] + COMPETITIVE_SLACK_MS and nid not in original
        }
        order = sorted(
            (nid for nid in to_price if nid not in dominated), key=lambda nid: (nid not in original, -estimate[nid])
        )
        return estimate, dominated, order, promising

    @staticmethod
    def _prefetch(
        prefetch: Callable[..., Any],
        order: Sequence[str],
        to_price: dict[str, tuple[Node, list[tuple[int, ...]], list[Const]]],
        deadline: float | None,
    ) -> list[str]:
        """Prefetch the prices of `order`, most wanted first, until `deadline` (a `time.perf_counter()` value); the
        ids left unpriced."""
        left = prefetch([to_price[nid] for nid in order], deadline) or ()
        return [order[i] for i in left]

    def _class_dtypes(self, decoded: dict[str, DecodedNode], node_of: dict[int, int]) -> Callable[[int], str]:
        """The element type of an e-class's tensors: its input node's where it holds one, else its first e-node's
        (`ops.dtype_of` over the children's), float32 where none can be told (a cycle of new e-classes)."""
        known = {c: self.graph.nodes[i].dtype for i, c in node_of.items()}
        members: dict[int, list[DecodedNode]] = {}
        for dn in decoded.values():
            members.setdefault(dn.eclass, []).append(dn)
        visiting: set[int] = set()

        def dtype(c: int) -> str:
            found = known.get(c)
            if found is not None:
                return found
            if c in visiting:
                return FLOAT
            visiting.add(c)
            for dn in members.get(c, ()):
                try:
                    found = ops.dtype_of(dn.op, [dtype(x) for x in dn.children], dn.attrs)
                except (KeyError, TypeError, ValueError):
                    continue
                break
            visiting.discard(c)
            known[c] = found or FLOAT
            return known[c]

        def safe(c: int) -> str:
            try:
                return dtype(c)
            except RecursionError:  # a chain of new e-classes deeper than Python's stack
                return FLOAT

        return safe

    def _class_layout(self, node_of: dict[int, int], device: str) -> dict[int, Computed]:
        """The layout of each e-class holding a computed 4-D float tensor of the input graph: the input's, as
        onnxruntime runs it on `device` (`tensat.cost.graph_layout`). An e-class the input does not hold is left to
        the measuring model's estimate by extent; one the input holds keeps the input's layout whichever of its
        e-nodes the extraction takes, an estimate where a rewrite gives it a producer of another layout."""
        graph = self.graph
        layout = graph_layout(graph, device)
        if not layout:
            return {}
        return {
            node_of[i]: Computed(i in layout)
            for i, n in enumerate(graph.nodes)
            if i in node_of and len(n.shape) == 4 and n.dtype == FLOAT
        }

    @staticmethod
    def _constant_classes(decoded: dict[str, DecodedNode]) -> set[int]:
        """E-classes computable from weights alone (their e-nodes over them cost nothing: folded at export).

        The least fixed point, by a worklist: an e-node counts its children not yet constant, and a class that
        becomes constant counts down the e-nodes over it."""
        const: set[int] = set()
        work: list[int] = []
        waiting: dict[int, list[int]] = {}
        pending: list[int] = []
        owner: list[int] = []
        constants = {name for name in ops.REGISTRY if ops.constant_leaf(name)}
        for dn in decoded.values():
            if dn.op in constants:
                if dn.eclass not in const:
                    const.add(dn.eclass)
                    work.append(dn.eclass)
            elif dn.op not in ("input", "opaque") and dn.children:
                k = len(pending)
                pending.append(len(dn.children))
                owner.append(dn.eclass)
                for c in dn.children:
                    waiting.setdefault(c, []).append(k)
        while work:
            for k in waiting.get(work.pop(), ()):
                pending[k] -= 1
                if pending[k] == 0 and owner[k] not in const:
                    const.add(owner[k])
                    work.append(owner[k])
        return const

    def class_shapes(self, decoded: dict[str, DecodedNode]) -> dict[int, tuple[int, ...]]:
        """The shape of each e-class of the export that returned `decoded`, which must be this e-graph's last:
        e-class ids are numbered per export."""
        memo = self._memo()
        if memo.shapes_for is not decoded:
            raise ValueError("the e-class shapes asked for are not those of this e-graph's last export")
        return memo.class_shapes

    def rules_behind(
        self,
        choices: dict[str, str],
        decoded: dict[str, DecodedNode],
        roots: Sequence[str],
        shapes: dict[int, tuple[int, ...]],
    ) -> dict[str, int]:
        """How many of the changes of the selection `choices` (from `roots`) against the input each rule explains,
        most first (see `provenance.rules_behind`): which rules made the difference. `decoded` and the e-class
        `shapes` (`class_shapes`) are those of the export the selection was made in."""
        index = self._index(decoded)
        inputs = [index[_own_key(self.graph.nodes[i], self._node_of)] for i in self.live]
        original = self.original_selection(decoded)
        return provenance.rules_behind(
            choices, original, inputs, decoded, shapes, roots, self.rules, self._constant_classes(decoded)
        )

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

    def _selection(
        self, decoded: dict[str, DecodedNode], graph: Graph, live: Sequence[int], class_of: dict[int, int]
    ) -> dict[str, str]:
        """The e-node of each of `graph`'s nodes (in topological order; the first wins where classes merged)."""
        index = self._index(decoded)
        choices: dict[str, str] = {}
        for i in live:
            choices.setdefault(str(class_of[i]), index[_own_key(graph.nodes[i], class_of)])
        return choices

    def carried_selection(
        self,
        choices: dict[str, str],
        old: dict[str, DecodedNode],
        roots: Sequence[str],
        decoded: dict[str, DecodedNode],
    ) -> dict[str, str] | None:
        """A selection of an earlier export of this e-graph (`choices` over its decoded e-nodes `old`, reachable
        from its `roots`) read in the later export `decoded`, or None where one of its e-nodes is not found there.

        E-class ids are per export, so each chosen e-node is found again by content (op, attributes and its
        children's classes as carried), children first. Where rewrites merged several of its e-classes into one,
        the one met first in post-order gives the e-node: along every chosen edge that position decreases, so the
        result is acyclic. The caller still validates it against the later export's forbidden e-nodes."""
        index = self._index(decoded)
        carried: dict[int, int] = {}  # e-class in the earlier export -> e-class in the later one
        out: dict[str, str] = {}
        for c, dn in _chosen_post_order([int(r) for r in roots], choices, old, carried):
            nid = index.get((dn.op, tuple([carried[k] for k in dn.children]), tuple(sorted(dn.attrs.items()))))
            if nid is None:
                return None
            carried[c] = decoded[nid].eclass
            out.setdefault(str(carried[c]), nid)
        return out

    def _index(self, decoded: dict[str, DecodedNode]) -> dict[tuple[Any, ...], str]:
        """E-node ids of `decoded` by op, child e-classes and sorted attributes (the last wins): made while
        decoding for the export that returned `decoded` (read again by every selection in it), else here."""
        memo = self._memo()
        if memo.index_for is not decoded:
            index: dict[tuple[Any, ...], str] = {}
            for nid, dn in decoded.items():
                index[(dn.op, dn.children, tuple(sorted(dn.attrs.items())))] = nid
            memo.index_for, memo.index = decoded, index
        return memo.index

    def rebuild(self, choices: dict[str, str], decoded: dict[str, DecodedNode]) -> Graph:
        """The IR graph a selection (e-class -> e-node id) describes, with the original inputs and outputs."""
        src = self.graph
        out = Graph(opset_imports=dict(src.opset_imports), name=src.name)
        built: dict[int, int] = {}
        for i in src.input_ids:  # keep every graph input, in order
            n = src.nodes[i]
            built[self._node_of[i]] = out.input(n.attr["name"], n.shape, n.dtype)
        roots = [self._node_of[root] for _, root in src.outputs]
        for c, dn in _chosen_post_order(roots, choices, decoded, built):
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


class _Promising:
    """Which e-nodes not yet priced could change the extraction's choice, most promising first (`__call__`).

    An alternative to an e-node priced already could win where the e-nodes it adds cost less than that e-node
    does: the e-nodes of its cheapest tree (by `tree`) down to the e-classes the priced e-nodes compute, each
    counted once. Pricing those before the rest means a deadline ends the pricing among alternatives that could not
    have won, not before the timing of a kernel the estimate got wrong (onnxruntime's LRN) has been answered by its
    alternatives'. Costs (`cost`) are in the estimate's units: a price is divided by `scale` (`priced`)."""

    def __init__(
        self, decoded: dict[str, DecodedNode], cost: dict[str, float], tree: dict[str, float], scale: float
    ) -> None:
        self.decoded, self.cost, self.tree, self.scale = decoded, cost, tree, scale
        self.best: dict[int, str] = {}  # each e-class's e-node of the cheapest tree
        self.by_class: dict[int, list[str]] = {}
        for nid, dn in decoded.items():
            self.by_class.setdefault(dn.eclass, []).append(nid)
            b = self.best.get(dn.eclass)
            if b is None or tree[nid] < tree[b]:
                self.best[dn.eclass] = nid

    def priced(self, nid: str, price: float) -> None:
        """Take the price `nid` was measured at in place of its estimate."""
        self.cost[nid] = price / self.scale

    def __call__(self, known: set[str], wanted: set[str], share: float = 0.0) -> list[str]:
        """The e-nodes of `wanted` (not yet priced) that alternatives to the e-nodes of `known` (priced) add. Of the
        alternatives with a gain of at least `share` of the largest, those that cost the least against what they
        would replace come first (the cheapest to time for what they may win), each with the e-nodes it adds."""
        decoded, cost, tree, best = self.decoded, self.cost, self.tree, self.best
        computed = {decoded[nid].eclass for nid in known}

        def added(alt: str) -> list[str] | None:
            """The e-nodes `alt` adds: its cheapest tree's, down to the e-classes computed already other than its
            own (None where that tree needs its own e-class: a slice of a concat of the e-node it would replace)."""
            own = decoded[alt].eclass
            out, stack, seen = [], [alt], computed - {own}
            while stack:
                nid = stack.pop()
                out.append(nid)
                for k in decoded[nid].children:
                    if k == own:
                        return None
                    if k not in seen:
                        seen.add(k)
                        stack.append(best[k])
            return out

        gains: list[tuple[float, float, list[str]]] = []  # the gain, the ratio of the costs, the e-nodes added
        for nid in (nid for nid in decoded if nid in known):  # in the export's order, not a set's: deterministic
            for alt in self.by_class[decoded[nid].eclass]:
                if alt in wanted and tree[alt] < float("inf") and (new := added(alt)) is not None:
                    spent = sum(cost[n] for n in new)
                    if cost[nid] > spent:
                        gains.append((cost[nid] - spent, cost[nid] / max(spent, 1e-12), new))
        if not gains:
            return []
        first: list[str] = []
        placed: set[str] = set()
        least = share * max(g[0] for g in gains)
        for _, _, new in sorted((g for g in gains if g[0] >= least), key=lambda g: -g[1]):
            for nid in new:
                if nid in wanted and nid not in placed:
                    placed.add(nid)
                    first.append(nid)
        return first


def _own_key(n: Node, class_of: dict[int, int]) -> tuple[Any, ...]:
    """The `_index` key of the e-node a graph's node `n` lowered to, its inputs' e-classes given by `class_of`."""
    return (n.op, tuple(class_of[j] for j in n.inputs), tuple(sorted(n.attr.items())))


def _chosen_post_order(
    roots: Sequence[int], choices: dict[str, str], decoded: dict[str, DecodedNode], done: Container[int]
) -> Iterator[tuple[int, DecodedNode]]:
    """The e-classes a valid (acyclic) selection reaches from `roots`, children first, each with its chosen e-node;
    a class is skipped once the caller has put it in `done` (as it does with each one yielded)."""
    for root in roots:
        stack = [root]
        while stack:
            c = stack[-1]
            if c in done:
                stack.pop()
                continue
            dn = decoded[choices[str(c)]]
            pending = [k for k in dn.children if k not in done]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            yield c, dn


def _runtime_fused(
    decoded: dict[str, DecodedNode], const: set[int], shapes: dict[int, tuple[int, ...]], device: str
) -> Iterator[tuple[str, int, str]]:
    """The e-nodes onnxruntime on `device` fuses into an e-node of an e-class they read (`tensat.cost.fuses_into`,
    with the e-classes' shapes `shapes`): a BatchNormalization or an activation (a Clip among them) over an
    e-class holding a convolution, an Add over one holding a MatMul; each with the operand it reads that e-class as,
    and the first e-node there it fuses into."""
    producers: dict[int, list[tuple[str, DecodedNode]]] = {}  # e-class -> its convolutions and MatMuls
    for pid, dn in decoded.items():
        if dn.op in FUSION_PRODUCERS and dn.eclass not in const:
            producers.setdefault(dn.eclass, []).append((pid, dn))

    def operands(dn: DecodedNode) -> list[Operand] | None:
        found: list[Operand] = []
        for c in dn.children:
            shape = shapes.get(c)
            if shape is None:
                return None
            found.append((shape, c in const))
        return found

    for nid, dn in decoded.items():
        if dn.op not in FUSION_READERS or dn.eclass not in shapes:
            continue
        mine = operands(dn)
        if mine is None:
            continue
        found = next(
            (
                (nid, k, pid)
                for k, c in enumerate(dn.children)
                if c not in const and dn.children.count(c) == 1
                for pid, p in producers.get(c, ())
                if (theirs := operands(p)) is not None
                and fuses_into(dn.op, shapes[dn.eclass], mine, k, p.op, p.attrs, theirs, device)
            ),
            None,
        )
        if found is not None:
            yield found
