"""Optimal DAG-cost extraction by integer linear programming (PuLP; HiGHS or CBC).

Formulation: a binary ``x_n`` per e-node and an activity ``a_c = sum(x_n for n in c)`` per e-class
(at most one node per class); roots active; a chosen node activates each child class; objective
``sum(cost_n * x_n)``, the DAG cost. Acyclicity is guaranteed by lazy cuts: solve, look for cycles
among the chosen nodes reachable from the roots, cut them off, solve again, until the solver's
selection is acyclic or time runs out. Every returned selection is validated.

The pruning and the cuts rest on a must-include analysis, ``needs``: the classes contained in every
acyclic term of a class (a greatest fixpoint, kept as integer bitmasks). With it:

* pruning (each step keeps an optimal extraction): forbidden and unreachable nodes; nodes that can
  only be used in a cycle (a child needs the node's own class); nodes whose cost lower bound (own
  cost + cheapest node of each class it or the roots need) exceeds the greedy incumbent; nodes
  whose path bound (cheapest path from a root down to them, plus the critical path of their term)
  exceeds it; nodes dominated by a cheaper-or-equal node of the same class with a subset of its
  child classes;
* static cuts: if node n of class c needs class j, j must pick a node that does not need c;
* lazy cluster cuts: for the class set S of a cycle of the selection's needs graph, some active
  class of S must pick a node needing no class of S. One cut forbids every cycle through S.

The greedy selection is the warm start (a HiGHS MIP start), the pruning bound and the fallback.
The pruning also gives a lower bound: the larger of the needed classes' cheapest nodes and the roots'
critical paths. When it reaches the incumbent no model is built (VGG: a chain, whose critical path is
its whole cost).

Stop rules (``ilp_extract``): the incumbent within ``gap_tolerance`` of the best bound, no cheaper
incumbent for ``stall_seconds``, or the time limit. HiGHS is watched inside its search through
highspy callbacks: an acyclic improving solution of a relaxation becomes the incumbent at once, and
the search is interrupted as soon as a rule holds; CBC is checked between calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import logging
import math
import os
import re
import sys
import tempfile
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import highspy
import numpy as np
import pulp

from .egraph import EGraph, ExtractionResult, _Index, dag_cost, reachable_selection, validate
from .greedy import _forbidden_mask, _to_choices, acyclic_choice, greedy_dag, selection_cost
from .local import _trees

_log = logging.getLogger(__name__)
_TOP = -1  # bitmask "all classes": the class has no acyclic term (yet)


@dataclass
class _Reduced:
    """The pruned problem: surviving nodes, classes every extraction needs, dominance map."""

    alive: list[bool]
    required: int  # bitmask of class indices
    replace: dict[int, int] = field(default_factory=dict)  # dominated node -> dominating node
    lower_bound: float = 0.0
    stats: dict[str, int] = field(default_factory=dict)
    needs: list[int] = field(default_factory=list)  # per class: bitmask of classes in all its terms


def _needs(ix: _Index, alive: list[bool]) -> list[int]:
    """Per class, the bitmask of classes contained in EVERY acyclic term of it (``_TOP``: none exists).

    Greatest fixpoint of ``N(c) = {c} | AND over alive n in c of (OR over child k of N(k))``, computed
    downwards from TOP with a worklist. Any fixpoint is sound (induction on term size).
    """
    n_classes = len(ix.class_ids)
    g = [_TOP] * n_classes
    kids, ncls, parents = ix.kids, ix.node_class, ix.parents
    members = [[n for n in ns if alive[n]] for ns in ix.class_nodes]
    work = deque(c for c in range(n_classes) if members[c])
    queued = [bool(members[c]) for c in range(n_classes)]
    while work:
        c = work.popleft()
        queued[c] = False
        acc = _TOP
        for n in members[c]:
            u = 0
            for k in kids[n]:
                gk = g[k]
                if gk == _TOP:
                    u = _TOP
                    break
                u |= gk
            if u != _TOP:
                acc &= u
                if acc == 0:
                    break
        new = _TOP if acc == _TOP else acc | (1 << c)  # u >= 0, so acc is TOP iff no node is usable
        if new != g[c]:
            g[c] = new
            for p in parents[c]:
                pc = ncls[p]
                if alive[p] and not queued[pc]:
                    queued[pc] = True
                    work.append(pc)
    return g


_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").astype(np.float64)


def _bits_matrix_sum(masks: list[int], weights: np.ndarray, nbytes: int) -> np.ndarray:
    """For each bitmask, the sum of ``weights`` over its set bits (byte lookup table, numpy)."""
    if not masks:
        return np.zeros(0)
    w = np.zeros(nbytes * 8)
    w[: weights.shape[0]] = weights
    table = (_BYTE_BITS @ w.reshape(nbytes, 8).T).T  # (nbytes, 256): sum of weights for a byte value
    cols = np.arange(nbytes)[None, :]
    out = np.empty(len(masks))
    step = 1024
    for i in range(0, len(masks), step):
        chunk = masks[i : i + step]
        buf = b"".join(m.to_bytes(nbytes, "little") for m in chunk)
        b = np.frombuffer(buf, dtype=np.uint8).reshape(len(chunk), nbytes)
        out[i : i + len(chunk)] = table[cols, b].sum(axis=1)
    return out


def _reduce(ix: _Index, banned: list[bool], upper: float) -> _Reduced:
    """Prune to a fixpoint; raises ValueError if a root has no acyclic term."""
    n_nodes, n_classes = len(ix.node_ids), len(ix.class_ids)
    kids, ncls, cost = ix.kids, ix.node_class, ix.cost
    alive = [not b for b in banned]
    replace: dict[int, int] = {}
    stats = {
        "nodes": n_nodes,
        "classes": n_classes,
        "forbidden": sum(banned),
        "cyclic_only": 0,
        "cost_bound": 0,
        "path_bound": 0,
        "dominated": 0,
        "unreachable": 0,
    }
    nbytes = (n_classes + 8) // 8
    tol = 1e-9 * max(1.0, abs(upper))
    required = 0
    lower_bound = 0.0
    changed = True
    while changed:
        changed = False
        g = _needs(ix, alive)
        for r in ix.roots:
            if g[r] == _TOP:
                raise ValueError(f"root e-class {ix.class_ids[r]!r} has no acyclic extraction")
        required = 0
        for r in ix.roots:
            required |= g[r]
        # Nodes that can only close a cycle (or use an underivable class).
        for n in range(n_nodes):
            if not alive[n]:
                continue
            c = ncls[n]
            for k in kids[n]:
                gk = g[k]
                if gk == _TOP or (gk >> c) & 1:
                    alive[n] = False
                    stats["cyclic_only"] += 1
                    changed = True
                    break
        # Cost lower bound: node + cheapest node of every class it or the roots must contain.
        minc = np.full(n_classes, 0.0)
        seen = [False] * n_classes
        for n in range(n_nodes):
            if alive[n]:
                c = ncls[n]
                if not seen[c] or cost[n] < minc[c]:
                    minc[c] = cost[n]
                    seen[c] = True
        live = [n for n in range(n_nodes) if alive[n]]
        masks = []
        for n in live:
            u = required
            for k in kids[n]:
                u |= g[k]
            masks.append(u & ~(1 << ncls[n]))
        lbs = _bits_matrix_sum(masks, minc, nbytes) + np.array([cost[n] for n in live])
        lower_bound = float(_bits_matrix_sum([required], minc, nbytes)[0]) if required else 0.0
        for n, lb in zip(live, lbs):
            if lb > upper + tol:
                alive[n] = False
                stats["cost_bound"] += 1
                changed = True
        # Path bound: the cheapest root-to-class path above a node plus its critical path below it.
        below = _critical_paths(ix, alive)
        above = _root_paths(ix, alive)
        lower_bound = max([lower_bound] + [below[r] for r in ix.roots if math.isfinite(below[r])])
        for n in range(n_nodes):
            if alive[n]:
                lb = above[ncls[n]] + cost[n] + max((below[k] for k in kids[n]), default=0.0)
                if lb > upper + tol:
                    alive[n] = False
                    stats["path_bound"] += 1
                    changed = True
        # Dominance within a class: cheaper-or-equal node with a subset of the child classes.
        for ns in ix.class_nodes:
            cand = sorted((n for n in ns if alive[n]), key=lambda n: (cost[n], len(kids[n]), n))
            keep: list[tuple[int, frozenset[int]]] = []
            for m in cand:
                km = frozenset(kids[m])
                dom = next((n for n, kn in keep if kn <= km), None)
                if dom is None:
                    keep.append((m, km))
                else:
                    alive[m] = False
                    replace[m] = dom
                    stats["dominated"] += 1
                    changed = True
        # Reachability from the roots through surviving nodes.
        reach = [False] * n_classes
        stack = list(ix.roots)
        for r in stack:
            reach[r] = True
        while stack:
            c = stack.pop()
            for n in ix.class_nodes[c]:
                if alive[n]:
                    for k in kids[n]:
                        if not reach[k]:
                            reach[k] = True
                            stack.append(k)
        for n in range(n_nodes):
            if alive[n] and not reach[ncls[n]]:
                alive[n] = False
                stats["unreachable"] += 1
                changed = True
    g = _needs(ix, alive)
    stats["alive_nodes"] = sum(alive)
    stats["alive_classes"] = len({ncls[n] for n in range(n_nodes) if alive[n]})
    stats["required_classes"] = bin(required).count("1")
    return _Reduced(alive, required, replace, lower_bound, stats, g)


def _critical_paths(ix: _Index, alive: list[bool]) -> list[float]:
    """Per class, a lower bound on the DAG cost of every acyclic term of it (``inf``: no term).

    The least fixpoint of ``B(c) = min over alive n in c of cost(n) + max over children k of B(k)``: an acyclic
    term holds its root node and, disjoint from it, the term of each child, so its DAG cost is at least its most
    expensive root-to-leaf path. Computed by `local._trees` (Knuth's generalization of Dijkstra's algorithm: the
    function is monotone and never below its arguments). On a chain of layers (VGG) it is the whole cost.
    """
    return _trees(ix, [not a for a in alive], False, longest=True)[1]


def _root_paths(ix: _Index, alive: list[bool]) -> list[float]:
    """Per class, the cheapest path of alive nodes from a root down to it, not counting its own node (``inf``: none).

    An acyclic selection using node n reaches n's class by such a path, and none of the path's nodes lies in
    n's term (it would close a cycle), so path plus ``_critical_paths`` below n bound the selection's cost.
    """
    best = [math.inf] * len(ix.class_ids)
    heap = [(0.0, r) for r in ix.roots]
    while heap:
        v, c = heapq.heappop(heap)
        if best[c] <= v:
            continue
        best[c] = v
        for n in ix.class_nodes[c]:
            if alive[n]:
                w = v + ix.cost[n]
                for k in ix.kids[n]:
                    if w < best[k]:
                        heapq.heappush(heap, (w, k))
    return best


def _cycle_conflicts(ix: _Index, red: _Reduced) -> tuple[dict[int, dict[int, list[int]]], dict[int, int]]:
    """Static cycle cuts from the must-include analysis.

    If node n (class c) needs class j (every term under n contains j), then j's chosen node must
    not itself need c, or the selection has a cycle. So ``x_n <= sum(x_m for m in j if c not in
    needs(m))``. Returned as {n: {j: allowed nodes of j}} for the pairs where some node of j needs c,
    with the per-node needs masks.
    """
    g, alive, kids, ncls = red.needs, red.alive, ix.kids, ix.node_class
    live = [n for n in range(len(ix.node_ids)) if alive[n]]
    node_needs: dict[int, int] = {}
    class_needs: dict[int, int] = {}  # classes needed by SOME node of the class
    succ: dict[int, set[int]] = {}
    for n in live:
        u = 0
        for k in kids[n]:
            u |= g[k]
        node_needs[n] = u
        c = ncls[n]
        class_needs[c] = class_needs.get(c, 0) | u
        succ.setdefault(c, set()).update(kids[n])
    # c and j of a conflict lie on a common cycle: only strongly connected classes need a look.
    needed_by: dict[int, list[int]] = {}  # c -> classes of its component with a node that needs c
    for comp in _sccs(succ):
        inside = 0
        for c in comp:
            inside |= 1 << c
        for j in comp:
            for c in _bits(class_needs[j] & inside):
                needed_by.setdefault(c, []).append(j)
    out: dict[int, dict[int, list[int]]] = {}
    for n in live:
        c = ncls[n]
        for j in needed_by.get(c, ()):
            if (node_needs[n] >> j) & 1:
                ok = [m for m in ix.class_nodes[j] if alive[m] and not (node_needs[m] >> c) & 1]
                out.setdefault(n, {})[j] = ok
    return out, node_needs


def _map_choice(ix: _Index, red: _Reduced, choice: list[int]) -> list[int] | None:
    """Carry a valid choice into the pruned problem (dominated -> dominator); None if it leaves it."""
    out = list(choice)
    for c, n in enumerate(out):
        seen = 0
        while n >= 0 and n in red.replace and seen < 64:
            n = red.replace[n]
            seen += 1
        out[c] = n
    if selection_cost(ix, out) is None:
        return None
    sel = _reachable(ix, out)
    if not all(red.alive[out[c]] for c in sel):
        return None
    return [out[c] if c in sel else -1 for c in range(len(out))]


def _reachable(ix: _Index, choice: list[int]) -> set[int]:
    """Classes reachable from the roots through the chosen nodes (a class without choice is a leaf)."""
    seen = set(ix.roots)
    stack = list(ix.roots)
    while stack:
        c = stack.pop()
        if choice[c] < 0:
            continue
        for k in ix.kids[choice[c]]:
            if k not in seen:
                seen.add(k)
                stack.append(k)
    return seen


def _sccs(succ: dict[int, Any]) -> list[list[int]]:
    """Non-trivial strongly connected components (size > 1) of a graph given as successor lists."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on: set[int] = set()
    st: list[int] = []
    sccs: list[list[int]] = []
    counter = 0
    for root in succ:
        if root in index:
            continue
        work = [(root, iter(succ[root]))]
        index[root] = low[root] = counter
        counter += 1
        st.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    st.append(w)
                    on.add(w)
                    work.append((w, iter(succ.get(w, ()))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = st.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    sccs.append(comp)
    return sccs


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _cycles(succ: dict[int, Any], limit: int) -> list[list[int]]:
    """Cycles of a graph: a shortest one through each vertex of every non-trivial strongly
    connected component (deduplicated, up to ``limit``)."""
    sccs = _sccs(succ)
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for comp in sccs:
        members = set(comp)
        for s in comp:
            # BFS from s back to s inside the component.
            prev = {s: -1}
            q = deque([s])
            found = False
            while q and not found:
                v = q.popleft()
                for w in succ[v]:
                    if w not in members:
                        continue
                    if w == s:
                        cyc = [v]
                        while prev[cyc[-1]] != -1:
                            cyc.append(prev[cyc[-1]])
                        cyc.reverse()
                        found = True
                        break
                    if w not in prev:
                        prev[w] = v
                        q.append(w)
            if found:
                i = cyc.index(min(cyc))
                key = tuple(cyc[i:] + cyc[:i])
                if key not in seen:
                    seen.add(key)
                    out.append(list(key))
                    if len(out) >= limit:
                        return out
    return out


_banner_written = False


def quiet_highs() -> highspy.Highs:
    """A new Highs object, made without HiGHS's banner on stdout.

    HiGHS writes its banner from C++ to file descriptor 1 when a process makes its first Highs object, whatever its
    output options say: `tensat optimize -q` printed it, and so would any program embedding the extractor. The first
    object is therefore made with that descriptor on the null device (HiGHS writes the banner once per process)."""
    global _banner_written
    if _banner_written:
        return highspy.Highs()
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no standard output to keep clean
        return highspy.Highs()
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        highs = highspy.Highs()
        with contextlib.suppress(OSError, AttributeError, TypeError):  # C stdio buffers, where libc is reachable
            ctypes.CDLL(None).fflush(None)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
    _banner_written = True
    return highs


class _HiGHSWarm(pulp.HiGHS):
    """pulp.HiGHS plus a MIP start (PuLP's HiGHS interface has none; highspy has) and a bulk
    model transfer (PuLP adds columns and rows one call at a time, ~1 s on bert)."""

    def __init__(self, start: dict[str, float] | None = None, watch: Any = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.start = start
        self.watch = watch  # called back on improving solutions and at interrupt checks (see _Model.solve)

    def buildSolverModel(self, lp: pulp.LpProblem) -> None:  # noqa: N802 (PuLP's method name)
        inf = highspy.kHighsInf
        sense = -1.0 if lp.sense == pulp.LpMaximize else 1.0
        variables = lp.variables()
        for i, var in enumerate(variables):
            var.index = i
        obj = lp.objective
        cost = np.array([sense * obj.get(v, 0.0) for v in variables], dtype=np.float64)
        lower = np.array([-inf if v.lowBound is None else v.lowBound for v in variables], dtype=np.float64)
        upper = np.array([inf if v.upBound is None else v.upBound for v in variables], dtype=np.float64)
        empty_i = np.zeros(0, dtype=np.int32)
        model = lp.solverModel
        model.addCols(len(variables), cost, lower, upper, 0, empty_i, empty_i, np.zeros(0))
        ints = np.array([v.index for v in variables if v.cat == pulp.LpInteger], dtype=np.int32)
        if self.mip and len(ints):
            model.changeColsIntegrality(len(ints), ints, np.full(len(ints), 1, dtype=np.uint8))
        starts: list[int] = []
        index: list[int] = []
        value: list[float] = []
        row_lo: list[float] = []
        row_hi: list[float] = []
        for i, con in enumerate(lp.constraints()):
            starts.append(len(index))
            for var, coef in con.items():
                if coef != 0:
                    index.append(var.index)
                    value.append(coef)
            con.index = i
            lo, hi = con.getLb(), con.getUb()
            row_lo.append(-inf if lo is None else lo)
            row_hi.append(inf if hi is None else hi)
        model.addRows(
            len(starts),
            np.array(row_lo, dtype=np.float64),
            np.array(row_hi, dtype=np.float64),
            len(index),
            np.array(starts, dtype=np.int32),
            np.array(index, dtype=np.int32),
            np.array(value, dtype=np.float64),
        )

    def callSolver(self, lp: pulp.LpProblem) -> None:  # noqa: N802 (PuLP's method name)
        if self.start:
            idx, val = [], []
            for v in lp.variables():
                if v.name in self.start:
                    idx.append(v.index)
                    val.append(self.start[v.name])
            lp.solverModel.setSolution(len(idx), np.array(idx, dtype=np.int32), np.array(val, dtype=np.float64))
        if self.watch is not None:
            h = lp.solverModel
            h.cbMipImprovingSolution.subscribe(lambda e: self.watch.improving(e.data_out.mip_solution))
            h.cbMipInterrupt.subscribe(
                lambda e: e.interrupt() if self.watch.interrupt(e.data_out.mip_dual_bound) else None
            )
        super().callSolver(lp)


@dataclass
class _Solve:
    choice: list[int] | None  # chosen node per class (may be cyclic), None if no solution
    objective: float | None
    bound: float | None  # valid lower bound on this relaxation's optimum
    proven: bool  # relaxation solved to optimality
    others: list[list[int]] = field(default_factory=list)  # other selections met on the way (HiGHS)
    runtime: float | None = None  # the solver's own clock (HiGHS)
    interrupted: bool = False  # stopped by a stop rule (gap reached or stall) or CBC's time slice, not its own criteria


class _Stop:
    """The run's incumbent (best valid acyclic selection) and the rules that end the search early.

    Stop when the incumbent is within ``tol`` (relative) of the best lower bound, or when the
    incumbent has not improved for ``stall`` seconds (None: never). HiGHS calls back with each
    improving solution of the current relaxation (an acyclic one can become the incumbent) and polls
    ``interrupt`` during its search; between solver calls the main loop asks the same questions.
    """

    def __init__(self, ix: _Index, t0: float, choice: list[int], cost: float, tol: float, stall: float | None) -> None:
        self.ix, self.t0, self.tol, self.stall = ix, t0, tol, stall
        self.choice, self.cost = choice, cost
        self.bound = 0.0  # best lower bound known (costs are >= 0)
        self.last = t0  # when the incumbent last improved (the run's start for the initial one)
        self.trace: list[tuple[float, float, str]] = [(0.0, cost, "initial")]
        self.reason: str | None = None

    def offer(self, choice: list[int], cost: float | None, source: str) -> bool:
        """Adopt a valid selection if it is cheaper than the incumbent; True if adopted."""
        if cost is None or cost >= self.cost - 1e-12:
            return False
        now = time.perf_counter()
        self.choice, self.cost, self.last = choice, cost, now
        self.trace.append((round(now - self.t0, 3), cost, source))
        return True

    def raise_bound(self, bound: float | None) -> None:
        """Record a valid lower bound."""
        if bound is not None and math.isfinite(bound):
            self.bound = max(self.bound, bound)

    def closed(self, bound: float) -> bool:
        """True when ``bound`` proves the incumbent optimal within the gap tolerance."""
        return _closed(self.cost, bound + self.tol * abs(self.cost))

    def left(self, now: float) -> float:
        """Seconds left in the stall window (inf without one)."""
        return math.inf if self.stall is None else self.last + self.stall - now

    def interrupt(self, dual_bound: float) -> bool:
        """Polled by the solver: record its bound, and say whether a stop rule now holds."""
        self.raise_bound(dual_bound)
        if self.closed(self.bound):
            self.reason = "gap"
        elif self.left(time.perf_counter()) <= 0:
            self.reason = "stall"
        return self.reason is not None


class _OutOfTime(Exception):
    """Model building passed its deadline: no time would be left for the solver."""


class _Model:
    """The PuLP model of the pruned problem, plus the cuts added so far."""

    def __init__(self, ix: _Index, red: _Reduced, deadline: float = math.inf) -> None:
        """Build the model; raises _OutOfTime once ``deadline`` (a perf_counter time) has passed."""
        if time.perf_counter() > deadline:
            raise _OutOfTime
        self.ix = ix
        live = [n for n in range(len(ix.node_ids)) if red.alive[n]]
        self.live = live
        self.members: dict[int, list[int]] = {}
        for n in live:
            self.members.setdefault(ix.node_class[n], []).append(n)
        req = red.required
        prob = pulp.LpProblem("extract", pulp.LpMinimize)
        self.x = x = {n: prob.add_variable(f"x{n}", 0, 1, cat=pulp.LpBinary) for n in live}
        self.a: dict[int, Any] = {c: 1 if (req >> c) & 1 else prob.add_variable(f"a{c}", 0, 1) for c in self.members}
        a = self.a
        prob += pulp.lpSum(ix.cost[n] * x[n] for n in live if ix.cost[n] != 0.0)
        self.conflicts, self.node_needs = _cycle_conflicts(ix, red)
        if time.perf_counter() > deadline:
            raise _OutOfTime
        for n, per_class in self.conflicts.items():
            for j, ok in per_class.items():
                prob += x[n] <= pulp.lpSum(x[m] for m in ok), f"need{n}_{j}"
        for i, (c, ns) in enumerate(self.members.items()):
            if i % 256 == 0 and time.perf_counter() > deadline:
                raise _OutOfTime
            prob += pulp.lpSum(x[n] for n in ns) == a[c], f"cls{c}"
            common = set(ix.kids[ns[0]]).intersection(*(ix.kids[n] for n in ns[1:]))
            for k in common:
                if not (req >> k) & 1:
                    prob += a[c] <= a[k], f"com{c}_{k}"
            for n in ns:
                for k in ix.kids[n]:
                    if k not in common and not (req >> k) & 1 and k not in self.conflicts.get(n, ()):
                        prob += x[n] <= a[k], f"kid{n}_{k}"
        self.prob = prob
        self.cut_keys: set[tuple[int, ...]] = set()
        self.stop: _Stop | None = None  # set by ilp_extract: incumbent, gap tolerance, stall window
        self._cols: tuple[np.ndarray, np.ndarray] | None = None

    def _choice_of(self, values: Any) -> list[int]:
        """The selection of a solver solution vector (column values)."""
        if self._cols is None:
            nodes = np.array(list(self.x), dtype=np.int64)
            self._cols = nodes, np.array([v.index for v in self.x.values()], dtype=np.int64)
        nodes, cols = self._cols
        choice = [-1] * len(self.ix.class_ids)
        ncls = self.ix.node_class
        for n in nodes[np.asarray(values)[cols] > 0.5].tolist():
            choice[ncls[n]] = n
        return choice

    def improving(self, values: Any) -> None:
        """HiGHS found a better solution of the relaxation: the incumbent if it is acyclic and cheaper."""
        if self.stop is not None:
            choice = self._choice_of(values)
            self.stop.offer(choice, selection_cost(self.ix, choice), "solver")

    def interrupt(self, dual_bound: float) -> bool:
        """HiGHS asks whether to stop (gap within tolerance, or stalled)."""
        return self.stop is not None and self.stop.interrupt(dual_bound)

    def add_cluster_cut(self, classes: list[int]) -> bool:
        """Cut off every selection in which each active class of S picks a node needing S.

        For a set S of classes: if class c0 of S is active, some active class of S must pick a
        node that needs no class of S (else "needs" cycles within S). Valid for every acyclic
        selection, and it blocks all cycles through S at once, not just the one found.
        """
        key = tuple(sorted(set(classes)))
        if key in self.cut_keys:
            return False
        self.cut_keys.add(key)
        inside = 0
        for c in key:
            inside |= 1 << c
        exits = pulp.lpSum(self.x[n] for c in key for n in self.members.get(c, []) if not self.node_needs[n] & inside)
        for c0 in key:
            self.prob.addConstraint(exits >= self.a[c0], f"clu{len(self.cut_keys)}_{c0}")
        return True

    def needs_cycles(self, choice: list[int], limit: int = 500) -> list[list[int]]:
        """Cycles of the selection's "needs" graph (c -> j when c's chosen node needs class j).

        Empty iff the selection reachable from the roots is acyclic; shorter than node-level cycles.
        """
        active = _reachable(self.ix, choice)
        succ = {c: [j for j in _bits(self.node_needs[choice[c]]) if j in active] for c in active if choice[c] >= 0}
        return _cycles(succ, limit)

    def start_values(self, choice: list[int] | None) -> dict[str, float] | None:
        """Variable values of a selection (None if it uses pruned nodes)."""
        if choice is None:
            return None
        vals = {v.name: 0.0 for v in self.x.values()}
        for v in self.a.values():
            if not isinstance(v, int):
                vals[v.name] = 0.0
        for c in _reachable(self.ix, choice):
            n = choice[c]
            if n not in self.x:
                return None
            vals[self.x[n].name] = 1.0
            if not isinstance(self.a[c], int):
                vals[self.a[c].name] = 1.0
        return vals

    def solve(self, solver: str, seconds: float, start: dict[str, float] | None) -> _Solve:
        """One solver call on the model with all cuts so far; status read honestly."""
        prob = self.prob
        tol = self.stop.tol if self.stop is not None else _GAP_REL
        if self.stop is not None:
            self.stop.reason = None
        if solver == "highs":
            s: pulp.LpSolver = _HiGHSWarm(
                start=start,
                watch=self if self.stop is not None else None,
                msg=False,
                timeLimit=max(seconds, 0.01),
                threads=1,
                gapRel=tol,
                gapAbs=1e-9,
                mip_improving_solution_save=True,
            )
        else:
            if start is not None:
                for v in prob.variables():
                    if v.name in start:
                        v.setInitialValue(start[v.name])
            fd, log_path = tempfile.mkstemp(prefix="cbc-", suffix=".log")
            os.close(fd)
            with warnings.catch_warnings():  # PuLP 3.3 flags its bundled CBC as deprecated for 4.0
                warnings.simplefilter("ignore", DeprecationWarning)
                s = pulp.PULP_CBC_CMD(
                    msg=False,
                    timeLimit=max(1, math.floor(seconds - _CBC_SLACK)),
                    logPath=log_path,
                    warmStart=start is not None,
                    gapRel=tol,
                    gapAbs=1e-9,
                )
        bound: float | None = None
        runtime: float | None = None
        if solver == "highs":
            quiet_highs()
            prob.solve(s)
            if getattr(prob, "solverModel", None) is not None:
                db = float(prob.solverModel.getInfo().mip_dual_bound)
                if math.isfinite(db):
                    bound = db
                runtime = float(prob.solverModel.getRunTime())
                if prob.solverModel.getInfo().primal_solution_status != 2:  # kSolutionStatusFeasible
                    prob.assignStatus(pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound)
        else:
            try:
                prob.solve(s)
                bound, runtime = _cbc_log(log_path)
            except pulp.PulpSolverError:  # the CBC process failed (e.g. killed under load): no solution this round,
                return _Solve(None, None, None, False, interrupted=True)  # and the stop rules decide what follows
            finally:
                os.unlink(log_path)
        interrupted = self.stop is not None and self.stop.reason is not None
        sol = prob.sol_status  # LpStatus says "Optimal" on a time limit too; sol_status does not
        proven = sol == pulp.LpSolutionOptimal
        if sol not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            # CBC out of its whole seconds before it found a solution (it reports infeasibility apart): the stop
            # rules decide, as after any slice, not "no solution"
            timed_out = solver == "cbc" and sol not in (pulp.LpSolutionInfeasible, pulp.LpSolutionUnbounded)
            return _Solve(None, None, bound, False, runtime=runtime, interrupted=interrupted or timed_out)
        objective = float(pulp.value(prob.objective) or 0.0)
        if proven:
            # Proven within the relative gap or within gapAbs (the solver stops on either): the dual
            # bound, or objective minus the larger of the two allowed gaps, is valid.
            lo = objective - max(tol * abs(objective), 1e-9)
            bound = max(lo, bound) if bound is not None else max(lo, 0.0)
            bound = min(bound, objective)
        choice = [-1] * len(self.ix.class_ids)
        for n, var in self.x.items():
            if (var.varValue or 0.0) > 0.5:
                choice[self.ix.node_class[n]] = n
        others: list[list[int]] = []
        if solver == "highs":
            cols = [(n, var.index) for n, var in self.x.items()]
            for saved in prob.solverModel.getSavedMipSolutions():
                vals = saved.col_value
                ch = [-1] * len(self.ix.class_ids)
                for n, i in cols:
                    if vals[i] > 0.5:
                        ch[self.ix.node_class[n]] = n
                others.append(ch)
        return _Solve(choice, objective, bound, proven, others, runtime, interrupted)


_CBC_SLACK = 0.5  # CBC's time limit is in whole seconds and it overshoots it a little
# Default relative gap at which a run stops and calls its result optimal. Tensat's costs are measured
# kernel runtimes stored as float32 (about 7 significant digits) whose run-to-run noise is of the order
# of 1% of a kernel's time: two extractions within 1e-4 of each other are indistinguishable under the
# model, so closing the last 1e-4 buys nothing (and on these e-graphs can cost most of the search).
GAP_TOLERANCE = 1e-4
_GAP_REL = GAP_TOLERANCE  # the solvers' own gap when no stop rules are attached (a bare _Model.solve)


def _cbc_log(path: str) -> tuple[float | None, float | None]:
    """CBC's proven lower bound and wall-clock time from its log (PuLP does not report them).

    The bound is the last "best possible" figure (8 significant digits, so lowered by 1e-7
    relative to stay valid); the summary's "Lower bound:" line has only 3 decimals.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None, None
    bound = runtime = None
    found = re.findall(r"best possible ([-+0-9.eE]+)", text)
    if found:
        with contextlib.suppress(ValueError):
            b = float(found[-1])
            bound = b - 1e-7 * abs(b) - 1e-12 if math.isfinite(b) and abs(b) < 1e40 else None
    clock = re.findall(r"Wallclock seconds\):\s*([0-9.]+)", text)
    if clock:
        with contextlib.suppress(ValueError):
            runtime = float(clock[-1])
    return bound, runtime


def _closed(cost: float, bound: float) -> bool:
    """True when ``bound`` (already raised by any allowed gap) reaches ``cost``, up to float slack."""
    return cost - bound <= 1e-12 * abs(cost) + 2e-9


def _repair(ix: _Index, red: _Reduced, choice: list[int], scale: float) -> list[int] | None:
    """A valid acyclic selection close to a (cyclic) solver selection: greedy on the pruned graph
    with every node the solver did not pick made ``scale`` more expensive."""
    chosen = {choice[c] for c in _reachable(ix, choice)}
    biased = [cst if n in chosen else cst + scale for n, cst in enumerate(ix.cost)]
    return acyclic_choice(ix, [not al for al in red.alive], biased)


def ilp_extract(
    eg: EGraph,
    *,
    solver: str = "highs",
    time_limit: float = 60.0,
    forbidden: frozenset[str] = frozenset(),
    initial: ExtractionResult | None = None,
    gap_tolerance: float = GAP_TOLERANCE,
    stall_seconds: float | None = None,
) -> ExtractionResult:
    """Minimum DAG-cost acyclic extraction by ILP with lazy cycle cuts, within ``time_limit`` seconds.

    ``solver`` is "highs" (pulp.HiGHS through highspy, with a MIP start) or "cbc"
    (pulp.PULP_CBC_CMD). The time limit is overall: solver calls get what is left after the greedy
    start, pruning (which always runs, about 1.5 s on a 20k-node e-graph) and model building (about
    1 s there; abandoned at the deadline, when no time would be left to solve).
    ``initial`` (default: the greedy result) is warm start, pruning bound and fallback.

    The run stops at the first of: the incumbent (best valid selection) within ``gap_tolerance``
    (relative) of the best lower bound; no cheaper incumbent for ``stall_seconds`` (None: no stall
    window; counted from the start of the run, so the initial selection's window includes pruning and
    model building, which is abandoned when the window ends);
    the time limit. HiGHS is watched during its search (callbacks), CBC between calls, each CBC call
    capped at the stall window left. ``info["stop"]`` says which rule ended the run ("gap", "stall",
    "time", or "no new cuts"/"no solution" when the solver had nothing more to offer) and
    ``info["incumbents"]`` when each incumbent appeared (seconds, cost, source).

    Status "optimal": proven within ``gap_tolerance`` (cost - bound <= gap_tolerance * cost; use 0
    for an exact proof up to float slack); "feasible": a valid selection cheaper than the initial
    one, not proven; "fallback": the initial selection, the ILP having found nothing cheaper.
    ``bound`` is always a valid lower bound, the best known when the run stopped. Raises ValueError
    if no valid extraction exists.
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    if solver not in ("highs", "cbc"):
        raise ValueError(f"unknown solver {solver!r} (use 'highs' or 'cbc')")
    if not gap_tolerance >= 0:
        raise ValueError(f"gap_tolerance must be >= 0, not {gap_tolerance!r}")
    if stall_seconds is not None and not stall_seconds > 0:
        raise ValueError(f"stall_seconds must be > 0 or None, not {stall_seconds!r}")
    ix = eg.index
    banned = _forbidden_mask(ix, forbidden)
    base = initial if initial is not None else greedy_dag(eg, forbidden)
    validate(eg, base, forbidden)
    base_choice = [-1] * len(ix.class_ids)
    for c, n in base.choices.items():
        base_choice[ix.class_pos[c]] = ix.node_pos[n]
    red = _reduce(ix, banned, base.cost)
    info: dict[str, Any] = {
        "prune": red.stats,
        "prune_seconds": round(time.perf_counter() - t0, 3),
        "iterations": 0,
        "cuts": 0,
        "gap_tolerance": gap_tolerance,
        "stall_seconds": stall_seconds,
    }
    if forbidden:
        info["forbidden"] = frozenset(forbidden)

    # Incumbent: the initial selection carried into the pruned problem, or greedy on it if cheaper.
    stop = _Stop(ix, t0, base_choice, base.cost, gap_tolerance, stall_seconds)
    start = _map_choice(ix, red, base_choice)
    pruned_greedy = acyclic_choice(ix, [not al for al in red.alive])
    pg_cost = selection_cost(ix, pruned_greedy) if pruned_greedy is not None else None
    if pg_cost is not None and (start is None or pg_cost < stop.cost - 1e-12):
        start = pruned_greedy
        stop.offer(pruned_greedy, pg_cost, "pruned greedy")  # type: ignore[arg-type]
    stop.raise_bound(red.lower_bound)
    if stop.closed(stop.bound):  # the pruning's bound already proves the incumbent: no model to solve
        info["model"] = "not built: the pruning bound proves the incumbent"
        info["stop"] = "gap"
        return _finish(eg, base, t0, info, forbidden, stop)

    # Building counts against the stall window too: a model that takes longer to build than the window allows
    # could not improve the incumbent within it.
    stall_end = stop.last + stall_seconds if stall_seconds is not None else math.inf
    try:
        model = _Model(ix, red, min(deadline - 0.1, stall_end))
    except _OutOfTime:  # no time left to build a model and solve it: return the incumbent
        info["model"] = "not built: no time left to solve"
        info["stop"] = "gap" if stop.closed(stop.bound) else "stall" if stall_end < deadline - 0.1 else "time"
        return _finish(eg, base, t0, info, forbidden, stop)
    model.stop = stop
    info["variables"] = len(model.prob.variables())
    info["constraints"] = model.prob.numConstraints()
    info["conflict_rows"] = sum(len(v) for v in model.conflicts.values())
    info["build_seconds"] = round(time.perf_counter() - t0, 3)

    # Solver overhead outside its own clock (model transfer, solution read-back) and the work after
    # the last call (repair, validation): estimated from the model size, then measured.
    overhead = 2e-5 * (info["variables"] + info["constraints"])
    tail = 0.05 + 2e-5 * len(model.live)
    min_call = 1.0 + _CBC_SLACK if solver == "cbc" else 0.05  # CBC takes whole seconds
    reason = "time"
    while True:
        if stop.closed(stop.bound):
            reason = "gap"
            break
        now = time.perf_counter()
        remaining = deadline - now - overhead - tail
        if remaining <= min_call:
            reason = "time"
            break
        if stop.left(now) <= 0:
            reason = "stall"
            break
        values = model.start_values(stop.choice) or model.start_values(start)
        call_start = time.perf_counter()
        seconds = min(remaining, max(stop.left(now), min_call + 0.01))
        res = model.solve(solver, seconds, values)
        if res.runtime is not None:
            overhead = max(0.02, time.perf_counter() - call_start - res.runtime)
        info["iterations"] += 1
        stop.raise_bound(res.bound)
        if res.choice is None:
            if res.interrupted:
                continue  # a stop rule held: the checks above name it
            reason = "no solution"
            break
        cycles = model.needs_cycles(res.choice)
        if not cycles:
            stop.offer(res.choice, selection_cost(ix, res.choice), "solver")
            if res.proven:
                reason = "gap"
                break
            if res.interrupted or seconds < remaining or stop.last >= call_start:
                continue  # a stop rule held, or a slice (CBC) ended: the checks above decide
            reason = "time"
            break
        new = sum(model.add_cluster_cut(cyc) for cyc in cycles)
        for other in res.others:  # cyclic incumbents HiGHS met during the search: cut them too
            if all(other[c] >= 0 for c in _reachable(ix, other)):
                new += sum(model.add_cluster_cut(cyc) for cyc in model.needs_cycles(other))
        info["cuts"] = len(model.cut_keys)
        rep = _repair(ix, red, res.choice, max(stop.cost, 1e-9))
        stop.offer(rep, selection_cost(ix, rep) if rep is not None else None, "repair")  # type: ignore[arg-type]
        _log.debug(
            "iteration %d: objective %s bound %s proven %s, %d cycles (%d new cuts), best %s, %.2fs",
            info["iterations"],
            res.objective,
            res.bound,
            res.proven,
            len(cycles),
            new,
            stop.cost,
            time.perf_counter() - t0,
        )
        if not new:
            reason = "no new cuts"
            break
    info["stop"] = reason
    return _finish(eg, base, t0, info, forbidden, stop)


def _finish(
    eg: EGraph, base: ExtractionResult, t0: float, info: dict[str, Any], forbidden: frozenset[str], stop: _Stop
) -> ExtractionResult:
    """Build, classify honestly (optimal = proven within the gap tolerance) and validate the result."""
    ix = eg.index
    chosen = reachable_selection(eg, _to_choices(ix, stop.choice))
    cost = dag_cost(eg, chosen)
    bound = min(stop.bound, cost)
    info["incumbents"] = stop.trace
    info["incumbent_seconds"] = stop.trace[-1][0]
    if _closed(cost, bound + stop.tol * abs(cost)):
        status = "optimal"
    elif cost < base.cost - 1e-12:
        status = "feasible"
    else:
        status = "fallback"
    result = ExtractionResult(chosen, cost, bound, status, time.perf_counter() - t0, "ilp", info)
    validate(eg, result, forbidden)
    return result
