"""E-graph model for extraction, read from the egraph-serialize JSON format.

The format is ``{"nodes": {node_id: {"op", "cost", "eclass", "children"}}, "root_eclasses": [...]}``
where ``children`` are node ids; a child stands for its whole e-class. :class:`EGraph` resolves
children to e-class ids once, so extractors only ever deal with classes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class ENode:
    """One e-node: operator, non-negative cost, owning e-class and child e-class ids (in order)."""

    op: str
    cost: float
    eclass: str
    children: tuple[str, ...]


@dataclass
class ExtractionResult:
    """A selection of one e-node per e-class reachable from the roots, with its DAG cost.

    ``status`` is "optimal" (proven), "feasible" (valid, not proven optimal), "fallback"
    (greedy returned because the ILP failed or found nothing better) or "greedy".
    """

    choices: dict[str, str]
    cost: float
    bound: float | None
    status: str
    seconds: float
    method: str
    info: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        bound = "" if self.bound is None else f", bound {self.bound:.6g}"
        return (
            f"<ExtractionResult {self.method}, {self.status}: cost {self.cost:.6g}{bound}, "
            f"{len(self.choices):,} e-classes chosen, {self.seconds:.2f} s>"
        )

    def gap(self) -> float | None:
        """Relative gap between cost and proven lower bound (0.0 when proven optimal), or None."""
        if self.bound is None:
            return None
        diff = max(0.0, self.cost - self.bound)
        if diff <= 1e-9 * max(1.0, abs(self.cost)):
            return 0.0
        return diff / max(abs(self.cost), 1e-12)


def copy_result(result: ExtractionResult) -> ExtractionResult:
    """A copy its receiver may change (callers set `method`, `seconds` and `info`) without changing `result`."""
    return replace(result, choices=dict(result.choices), info=dict(result.info))


class _Index:
    """Integer-indexed view of an e-graph, built once and shared by the extractors (speed)."""

    def __init__(self, eg: EGraph) -> None:
        self.node_ids: list[str] = list(eg.nodes)
        self.class_ids: list[str] = list(eg.classes)
        self.node_pos: dict[str, int] = {n: i for i, n in enumerate(self.node_ids)}
        self.class_pos: dict[str, int] = {c: i for i, c in enumerate(self.class_ids)}
        cp = self.class_pos
        nodes = [eg.nodes[n] for n in self.node_ids]
        self.cost: list[float] = [float(nd.cost) for nd in nodes]
        self.node_class: list[int] = [cp[nd.eclass] for nd in nodes]
        # Unique child classes per node, in first-occurrence order.
        self.kids: list[tuple[int, ...]] = [tuple(dict.fromkeys(cp[c] for c in nd.children)) for nd in nodes]
        self.class_nodes: list[list[int]] = [[self.node_pos[n] for n in eg.classes[c]] for c in self.class_ids]
        self.roots: list[int] = list(dict.fromkeys(cp[r] for r in eg.roots))
        parents: list[list[int]] = [[] for _ in self.class_ids]
        for n, ks in enumerate(self.kids):
            for k in ks:
                parents[k].append(n)
        self.parents: list[list[int]] = parents


class EGraph:
    """An e-graph: nodes by id, root e-class ids, and the derived e-class -> node ids map."""

    def __init__(self, nodes: dict[str, ENode], roots: list[str]) -> None:
        self.nodes: dict[str, ENode] = dict(nodes)
        self.roots: list[str] = list(roots)
        classes: dict[str, list[str]] = {}
        for nid, node in self.nodes.items():
            if not isinstance(node.cost, (int, float)) or not math.isfinite(node.cost) or node.cost < 0:
                raise ValueError(f"e-node {nid!r} has invalid cost {node.cost!r} (need a finite number >= 0)")
            classes.setdefault(node.eclass, []).append(nid)
        self.classes: dict[str, list[str]] = classes
        for nid, node in self.nodes.items():
            for c in node.children:
                if c not in classes:
                    raise ValueError(f"e-node {nid!r} has child e-class {c!r} with no e-nodes")
        if not self.roots:
            raise ValueError("e-graph has no root e-class")
        for r in self.roots:
            if r not in classes:
                raise ValueError(f"root e-class {r!r} has no e-nodes")
        self._index: _Index | None = None
        # what a deterministic extractor returned on this e-graph, by its arguments: a caller that repeats a run
        # (the extraction after an exploration's last sample, on the same export) gets it without the work
        self.memo: dict[tuple[Any, ...], ExtractionResult | None] = {}

    @property
    def index(self) -> _Index:
        """Cached integer-indexed view used by the extractors."""
        if self._index is None:
            self._index = _Index(self)
        return self._index

    def without(self, removed: Iterable[str]) -> EGraph:
        """This e-graph less the e-nodes `removed`, and less every e-node left reading an e-class with none (an
        e-graph's forbidden e-nodes gone, for a file any extractor can read)."""
        keep = {nid: n for nid, n in self.nodes.items() if nid not in set(removed)}
        while True:
            classes = {n.eclass for n in keep.values()}
            dropped = {nid for nid, n in keep.items() if any(c not in classes for c in n.children)}
            if not dropped:
                return EGraph(keep, self.roots)
            keep = {nid: n for nid, n in keep.items() if nid not in dropped}

    def to_json(self) -> dict[str, Any]:
        """The egraph-serialize dict `from_json` reads back: each e-node with its op, cost, e-class and, for each
        child e-class, the id of an e-node in it."""
        first = {c: ids[0] for c, ids in self.classes.items()}
        return {
            "nodes": {
                nid: {"op": n.op, "cost": n.cost, "eclass": n.eclass, "children": [first[c] for c in n.children]}
                for nid, n in self.nodes.items()
            },
            "root_eclasses": list(self.roots),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EGraph:
        """Build from an egraph-serialize dict; child node ids are resolved to their e-classes."""
        if not isinstance(data, Mapping):
            raise ValueError("e-graph JSON must be an object with 'nodes' and 'root_eclasses'")
        raw_nodes = data.get("nodes")
        if not isinstance(raw_nodes, Mapping):
            raise ValueError("e-graph JSON has no 'nodes' object")
        owner: dict[str, str] = {}
        for nid, nd in raw_nodes.items():
            if not isinstance(nd, Mapping) or "eclass" not in nd:
                raise ValueError(f"e-node {nid!r} is not an object with an 'eclass'")
            owner[str(nid)] = str(nd["eclass"])
        nodes: dict[str, ENode] = {}
        for nid, nd in raw_nodes.items():
            kids = nd.get("children", [])
            if not isinstance(kids, list):
                raise ValueError(f"e-node {nid!r} has non-list 'children'")
            resolved = []
            for k in kids:
                cls_id = owner.get(str(k))
                if cls_id is None:
                    raise ValueError(f"e-node {nid!r} has unknown child node id {k!r}")
                resolved.append(cls_id)
            cost = nd.get("cost", 1.0)
            if isinstance(cost, bool) or not isinstance(cost, (int, float)):
                raise ValueError(f"e-node {nid!r} has non-numeric cost {cost!r}")
            nodes[str(nid)] = ENode(str(nd.get("op", "")), float(cost), owner[str(nid)], tuple(resolved))
        roots = data.get("root_eclasses")
        if not isinstance(roots, list):
            raise ValueError("e-graph JSON has no 'root_eclasses' list")
        return cls(nodes, [str(r) for r in roots])


class InputError(ValueError):
    """An e-graph file that cannot be read or is not a valid e-graph; the message is one line, naming the file."""


def one_line(error: BaseException, *, typed: bool = False, limit: int | None = 300) -> str:
    """An error's message on one line: its first non-empty line, whitespace runs made single spaces, cut to `limit`
    characters ("..." marks a cut); the type's name when there is no message. `typed` prefixes the type's name
    (`RuntimeError: ...`), for a failure inside an extractor, where the type says as much as the message.
    (tensat.errors.one_line is the same for tensat, which this package does not import.)"""
    text = next((" ".join(line.split()) for line in str(error).splitlines() if line.strip()), "")
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    if not text:
        return type(error).__name__
    return f"{type(error).__name__}: {text}" if typed else text


def load_egraph(path: str | os.PathLike[str]) -> EGraph:
    """Read an egraph-serialize JSON file; ValueError on malformed content, OSError on I/O."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("not a UTF-8 text file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    return EGraph.from_json(data)


def reachable_selection(eg: EGraph, choices: Mapping[str, str]) -> dict[str, str]:
    """Restrict ``choices`` to the classes reachable from the roots through chosen nodes.

    Raises ValueError if a reachable class has no choice.
    """
    out: dict[str, str] = {}
    stack = list(dict.fromkeys(eg.roots))
    while stack:
        c = stack.pop()
        if c in out:
            continue
        nid = choices.get(c)
        if nid is None:
            raise ValueError(f"e-class {c!r} is reachable but has no chosen e-node")
        out[c] = nid
        node = eg.nodes.get(nid)
        if node is None:
            raise ValueError(f"chosen e-node {nid!r} does not exist")
        stack.extend(k for k in node.children if k not in out)
    return out


def dag_cost(eg: EGraph, choices: Mapping[str, str]) -> float:
    """Sum of the costs of the distinct chosen nodes reachable from the roots."""
    sel = reachable_selection(eg, choices)
    return float(math.fsum(eg.nodes[n].cost for n in sel.values()))


def find_cycle(eg: EGraph, choices: Mapping[str, str], start: Iterable[str] | None = None) -> list[str] | None:
    """Return the class ids of one cycle in the chosen-node graph (from ``start``, default the roots), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color: dict[str, int] = {}
    for s in eg.roots if start is None else start:
        if color.get(s, WHITE) != WHITE:
            continue
        path: list[str] = [s]
        color[s] = GREY
        iters = [iter(dict.fromkeys(eg.nodes[choices[s]].children))]
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                iters.pop()
                color[path.pop()] = BLACK
                continue
            col = color.get(nxt, WHITE)
            if col == GREY:
                return path[path.index(nxt) :]
            if col == WHITE:
                if nxt not in choices:
                    continue
                color[nxt] = GREY
                path.append(nxt)
                iters.append(iter(dict.fromkeys(eg.nodes[choices[nxt]].children)))
    return None


def validate(eg: EGraph, result: ExtractionResult | Mapping[str, str], forbidden: Iterable[str] = ()) -> None:
    """Check a selection is a valid extraction; raise ValueError naming the first problem.

    Valid means: every root chosen, each chosen node exists and belongs to its class, every child
    class of a chosen node is chosen, no forbidden node chosen, and the chosen graph is acyclic.
    A result's own forbidden set (``result.info["forbidden"]``) is checked as well.
    """
    choices = result.choices if isinstance(result, ExtractionResult) else result
    banned = set(forbidden)
    if isinstance(result, ExtractionResult):
        banned.update(result.info.get("forbidden", ()))
    for r in eg.roots:
        if r not in choices:
            raise ValueError(f"root e-class {r!r} is not chosen")
    for c, nid in choices.items():
        node = eg.nodes.get(nid)
        if node is None:
            raise ValueError(f"e-class {c!r} chooses unknown e-node {nid!r}")
        if node.eclass != c:
            raise ValueError(f"e-class {c!r} chooses e-node {nid!r} of another class {node.eclass!r}")
        if nid in banned:
            raise ValueError(f"forbidden e-node {nid!r} is chosen")
        for k in node.children:
            if k not in choices:
                raise ValueError(f"child e-class {k!r} of chosen e-node {nid!r} is not chosen")
    cyc = find_cycle(eg, choices, start=list(choices))
    if cyc is not None:
        raise ValueError(f"selection is cyclic: {' -> '.join(cyc + cyc[:1])}")
    if isinstance(result, ExtractionResult):
        cost = dag_cost(eg, choices)
        if abs(cost - result.cost) > 1e-6 * max(1.0, abs(cost)):
            raise ValueError(f"reported cost {result.cost} differs from the selection's DAG cost {cost}")
