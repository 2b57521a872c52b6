"""Greedy DAG-cost extraction (extraction-gym's faster-greedy-dag, made cycle-safe).

Each e-class gets a *cost set*: the classes of the sub-DAG under its best node, mapped to the cost of the node
chosen there. A node's cost set is the union of its child classes' sets plus itself, so shared sub-terms are counted
once. Classes are improved bottom-up with a worklist ordered by a lower bound of each node's total (its cost plus
its costliest child's), so cheap sub-DAGs settle first and are seldom improved again; a node is only considered once
all of its child classes have a cost set, never when that bound is no better than its class's total, and never if
its own class is already in the union (that would be a cycle).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterable

from .egraph import EGraph, ExtractionResult, _Index, copy_result, dag_cost, reachable_selection

_INF = math.inf


def _forbidden_mask(ix: _Index, forbidden: Iterable[str]) -> list[bool]:
    """Per node index, True if the node is forbidden (unknown ids are ignored)."""
    mask = [False] * len(ix.node_ids)
    for nid in forbidden:
        p = ix.node_pos.get(nid)
        if p is not None:
            mask[p] = True
    return mask


def _faster_greedy(ix: _Index, banned: list[bool], costs: list[float] | None = None) -> list[int]:
    """Return the chosen node index per class (-1 when the class has no acyclic term).

    ``costs`` overrides the node costs (used to bias a repair towards a given selection).
    """
    n_classes = len(ix.class_ids)
    sets: list[dict[int, float] | None] = [None] * n_classes
    totals = [_INF] * n_classes
    choice = [-1] * n_classes
    kids, ncls, parents = ix.kids, ix.node_class, ix.parents
    cost = ix.cost if costs is None else costs
    heap: list[tuple[float, int]] = []
    queued: dict[int, float] = {}
    for n, ks in enumerate(kids):
        if not ks and not banned[n]:
            heap.append((cost[n], n))
            queued[n] = cost[n]
    heapq.heapify(heap)
    while heap:
        _, n = heapq.heappop(heap)
        queued.pop(n, None)
        c = ncls[n]
        best = totals[c]
        ks = kids[n]
        if not ks:
            new: dict[int, float] = {c: cost[n]}
            total = cost[n]
        else:
            if c in ks:
                continue
            if cost[n] + max(totals[k] for k in ks) >= best:  # its cost set holds each child's: no cheaper
                continue
            child_sets = [sets[k] for k in ks]
            big = max(child_sets, key=len)  # type: ignore[arg-type]
            new = dict(big)  # type: ignore[arg-type]
            for s in child_sets:
                if s is not big:
                    new.update(s)  # type: ignore[arg-type]
            if c in new:
                continue
            new[c] = cost[n]
            total = math.fsum(new.values())
        if total < best:
            sets[c] = new
            totals[c] = total
            choice[c] = n
            for p in parents[c]:
                if banned[p]:
                    continue
                if all(sets[k] is not None for k in kids[p]):
                    # keyed by a lower bound of its total: cheap sub-DAGs settle first and are seldom improved
                    key = cost[p] + max(totals[k] for k in kids[p])
                    old = queued.get(p)
                    if old is None or key < old:
                        queued[p] = key
                        heapq.heappush(heap, (key, p))
    return choice


def _settle(ix: _Index, banned: list[bool], prefer: list[int]) -> list[int]:
    """Acyclic-by-construction selection: classes are fixed once, in Dijkstra order of DAG cost.

    A node becomes usable when all its child classes are fixed; among usable nodes of a class the
    one with the smallest DAG cost (over the fixed sub-DAGs) fixes the class. ``prefer`` (a choice
    per class, may be -1) breaks near-ties towards a previous selection.
    """
    n_classes = len(ix.class_ids)
    kids, cost, ncls, parents = ix.kids, ix.cost, ix.node_class, ix.parents
    fixed = [False] * n_classes
    choice = [-1] * n_classes
    under: list[frozenset[int]] = [frozenset()] * n_classes  # node indices of the fixed sub-DAG (read once fixed)
    missing = [len(ks) for ks in kids]
    heap: list[tuple[float, int, int]] = []

    def node_cost(n: int) -> tuple[float, frozenset[int]]:
        ks = kids[n]
        if not ks:
            return cost[n], frozenset((n,))
        big = max((under[k] for k in ks), key=len)
        acc = set(big)
        for k in ks:
            s = under[k]
            if s is not big:
                acc.update(s)
        acc.add(n)
        return math.fsum(cost[m] for m in acc), frozenset(acc)

    for n, ks in enumerate(kids):
        if not ks and not banned[n]:
            heapq.heappush(heap, (cost[n], 0 if prefer[ncls[n]] == n else 1, n))
    while heap:
        _, _, n = heapq.heappop(heap)
        c = ncls[n]
        if fixed[c]:
            continue
        fixed[c] = True
        choice[c] = n
        under[c] = node_cost(n)[1]
        for p in parents[c]:
            missing[p] -= 1
            if missing[p] == 0 and not banned[p] and not fixed[ncls[p]]:
                t, _ = node_cost(p)
                heapq.heappush(heap, (t, 0 if prefer[ncls[p]] == p else 1, p))
    return choice


def _to_choices(ix: _Index, choice: list[int]) -> dict[str, str]:
    """Index-level choice per class -> {class id: node id}."""
    return {ix.class_ids[c]: ix.node_ids[n] for c, n in enumerate(choice) if n >= 0}


def post_order(ix: _Index, choice: list[int]) -> list[int] | None:
    """The e-classes reachable from the roots through ``choice``, children before parents, or None if that part is
    cyclic or incomplete."""
    kids = ix.kids
    state = [0] * len(choice)  # 0 new, 1 on stack, 2 done
    order: list[int] = []
    for r in ix.roots:
        if state[r]:
            continue
        if choice[r] < 0:
            return None
        state[r] = 1
        stack = [(r, iter(kids[choice[r]]))]
        while stack:
            c, it = stack[-1]
            k = next(it, None)
            if k is None:
                stack.pop()
                state[c] = 2
                order.append(c)
                continue
            if state[k] == 1:
                return None
            if state[k] == 0:
                if choice[k] < 0:
                    return None
                state[k] = 1
                stack.append((k, iter(kids[choice[k]])))
    return order


def selection_cost(ix: _Index, choice: list[int]) -> float | None:
    """DAG cost of the part of ``choice`` reachable from the roots, or None if it is cyclic or incomplete."""
    order = post_order(ix, choice)
    return None if order is None else math.fsum(ix.cost[choice[c]] for c in order)


def acyclic_choice(ix: _Index, banned: list[bool], costs: list[float] | None = None) -> list[int] | None:
    """A valid acyclic choice per class (greedy under ``costs``, real costs when None), or None if impossible.

    faster-greedy-dag's choices, unless they close a cycle (its cost sets are snapshots, so a later
    improvement of a child can); then the settle-once pass, which is acyclic by construction.
    """
    fg = _faster_greedy(ix, banned, costs)
    if any(fg[r] < 0 for r in ix.roots):
        return None
    if selection_cost(ix, fg) is not None:
        return fg
    settled = _settle(ix, banned, fg)
    return settled if selection_cost(ix, settled) is not None else None


def greedy_dag(eg: EGraph, forbidden: frozenset[str] = frozenset()) -> ExtractionResult:
    """Fast greedy DAG-cost extraction; always acyclic, ValueError if no valid extraction exists.

    Runs faster-greedy-dag; since its cost sets are snapshots (a later improvement of a child could
    close a cycle), its selection is checked and, if cyclic, replaced by a settle-once pass that is
    acyclic by construction.
    """
    key = ("greedy", frozenset(forbidden))
    known = eg.memo.get(key)
    if known is not None:
        return copy_result(known)
    t0 = time.perf_counter()
    ix = eg.index
    choice = acyclic_choice(ix, _forbidden_mask(ix, forbidden))
    if choice is None:
        raise ValueError(
            "no acyclic extraction exists for the root e-class(es) "
            + ", ".join(repr(r) for r in eg.roots)
            + (" avoiding the forbidden e-nodes" if forbidden else "")
        )
    chosen = reachable_selection(eg, _to_choices(ix, choice))
    result = ExtractionResult(
        choices=chosen,
        cost=dag_cost(eg, chosen),
        bound=None,
        status="greedy",
        seconds=time.perf_counter() - t0,
        method="greedy",
        info={"forbidden": frozenset(forbidden)} if forbidden else {},
    )
    eg.memo[key] = copy_result(result)
    return result
