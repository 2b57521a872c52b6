"""Cycle filtering before extraction: blacklist e-nodes so that no cycle is left among the usable ones.

Equality saturation merges e-classes, and merged classes often reach themselves (x = slice(concat(x, y))). An
extractor must avoid such cycles; an ILP does it with extra constraints or cuts that cost solve time. Tensat's
"efficient filtering" instead removes one e-node per cycle before solving, never one the input itself uses, so
the input stays extractable and the ILP rarely meets a cycle. This is that pass: one depth-first search from the
roots over the usable e-nodes; whenever an e-node leads back to an e-class on the search path, one e-node of that
cycle is blacklisted. If it is not the e-node closing the cycle, the search backs up to the class of the
blacklisted e-node, forgetting the classes above it (they are searched again when reached), so one pass suffices.

Tensat blacklists the newest e-node of each cycle (egglog does not expose e-node ages). Here the victim is chosen
by what the extractor is likely to want: never a `protected` e-node; where possible not a `preferred` one either
(the pipeline passes the greedy extractor's selection, itself acyclic, so the filtered e-graph keeps a good graph
besides the input); then the one with the highest regret, its cheapest tree's cost above its class's. In a merge
cycle a = slice(m), m = concat(a, b), m = matmul(concat(x1, x2), w) that is the concat (it recomputes both
halves), not the slice the merge needs. On NasRNN (k_multi=1) the filtered optimum fell from 6.85 to 6.25 ms with
regret, and it was never worse on the other graphs tried.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping

from .egraph import EGraph


def filter_cycles(
    eg: EGraph,
    protected: Iterable[str] = (),
    forbidden: Iterable[str] = (),
    preferred: Iterable[str] = (),
    by_cost: bool = True,
) -> set[str]:
    """E-node ids to blacklist so the e-nodes reachable from the roots, less `forbidden`, form no cycle.

    Never blacklists a `protected` e-node: when the protected e-nodes are themselves an acyclic selection (the
    input graph), every cycle holds an unprotected e-node and the selection survives. Blacklists a `preferred`
    e-node only on a cycle of protected and preferred e-nodes alone. Raises ValueError if a cycle consists of
    protected e-nodes only.

    Invariant of the search: a finished class reaches only finished classes through usable e-nodes (a back edge
    found below it was cut, or the search backed up above it), so when every reachable class is finished no cycle
    is left.
    """
    protected = set(protected)
    preferred = set(preferred) - protected
    dead = set(forbidden)
    regret = regrets(eg, dead) if by_cost else {}
    blacklist: set[str] = set()
    state: dict[str, int] = {}  # 1 on the search path, 2 finished
    for root in eg.roots:
        if state.get(root):
            continue
        # Each frame: [class, its usable node ids, index of the node being expanded, index of its next child].
        path: list[list] = []
        on_path: dict[str, int] = {}

        def enter(cls: str) -> None:
            state[cls] = 1
            on_path[cls] = len(path)
            path.append([cls, [n for n in eg.classes.get(cls, []) if n not in dead], 0, 0])

        enter(root)
        while path:
            frame = path[-1]
            cls, nodes, ni, ci = frame
            if ni >= len(nodes):
                state[cls] = 2
                del on_path[cls]
                path.pop()
                continue
            node = nodes[ni]
            children = eg.nodes[node].children
            if node in blacklist or ci >= len(children):
                frame[2], frame[3] = ni + 1, 0
                continue
            frame[3] = ci + 1
            child = children[ci]
            if state.get(child) == 1:
                start = on_path[child]
                at = _victim([f[1][f[2]] for f in path[start:]], protected, preferred, regret)
                if at is None:
                    raise ValueError(f"a cycle through e-class {child} consists of protected e-nodes only")
                victim_frame = path[start + at]
                blacklist.add(victim_frame[1][victim_frame[2]])
                while len(path) > start + at + 1:  # back up to the victim's class, forgetting the classes above
                    dropped = path.pop()
                    del on_path[dropped[0]]
                    del state[dropped[0]]
                victim_frame[2], victim_frame[3] = victim_frame[2] + 1, 0
            elif not state.get(child):
                enter(child)
    return blacklist


def _victim(cycle: list[str], protected: set[str], preferred: set[str], regret: Mapping[str, float]) -> int | None:
    """Position in `cycle` of the e-node to blacklist, or None if all are protected.

    Neither protected nor preferred if possible (else only not protected); among those, the one with the highest
    regret (how much more its cheapest tree costs than its class's: the one an extractor is least likely to
    want); among equals, the last.
    """
    for allowed in (lambda n: n not in protected and n not in preferred, lambda n: n not in protected):
        best: int | None = None
        for k, n in enumerate(cycle):
            if allowed(n) and (best is None or regret.get(n, 0.0) >= regret.get(cycle[best], 0.0)):
                best = k
        if best is not None:
            return best
    return None


def regrets(eg: EGraph, forbidden: Iterable[str] = ()) -> dict[str, float]:
    """Per usable e-node: the cost of its cheapest tree (its cost plus its children's classes' cheapest trees)
    minus its class's cheapest tree; infinite where a child class has no finite tree.

    Cheapest trees by Knuth's generalization of Dijkstra (costs are non-negative, sums are monotone).
    """
    dead = set(forbidden)
    usable = [n for n in eg.nodes if n not in dead]
    pending: dict[str, int] = {}
    parents: dict[str, list[str]] = {}
    heap: list[tuple[float, int, str]] = []
    tick = 0
    for n in usable:
        kids = set(eg.nodes[n].children)
        pending[n] = len(kids)
        for c in kids:
            parents.setdefault(c, []).append(n)
        if not kids:
            heap.append((float(eg.nodes[n].cost), tick, eg.nodes[n].eclass))
            tick += 1
    heapq.heapify(heap)
    best: dict[str, float] = {}
    while heap:
        value, _, cls = heapq.heappop(heap)
        if cls in best:
            continue
        best[cls] = value
        for n in parents.get(cls, ()):
            pending[n] -= 1
            if pending[n] == 0:
                node = eg.nodes[n]
                if node.eclass not in best:
                    tick += 1
                    heapq.heappush(heap, (float(node.cost) + sum(best[c] for c in node.children), tick, node.eclass))
    out: dict[str, float] = {}
    for n in usable:
        node = eg.nodes[n]
        if node.eclass in best and all(c in best for c in node.children):
            out[n] = float(node.cost) + sum(best[c] for c in node.children) - best[node.eclass]
        else:
            out[n] = math.inf
    return out
