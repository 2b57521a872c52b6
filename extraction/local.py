"""Local search over selections: polish an extraction by exact DAG-cost moves.

The ILP's LP relaxation is weak on e-graphs full of merge alternatives (NasRNN: bound 2.1 against 5.8 after two
minutes), so within a time limit it often stops far from the optimum, and the greedy extractor cannot see merges at
all (a merge pays off only when two or more e-classes switch to slices of the merged node at once). This search
starts from a valid acyclic selection and applies moves while they lower the DAG cost:

* swap: one reached e-class picks another e-node;
* adopt: every reached e-class with an e-node over some e-class M switches to it at once (the classes of x1 @ W and
  x2 @ W both switching to slices of concat(x1, x2) @ W); a merge chain is then adopted one link per move.

E-classes a move newly reaches take the root of their cheapest tree (or lowest, where the cheapest closes a cycle).
Every candidate is priced exactly (the DAG cost of the part reachable from the roots) and rejected if it closes a
cycle or uses a forbidden e-node, so the result is always valid and never costlier than the start.
"""

from __future__ import annotations

import heapq
import time

from .egraph import EGraph, ExtractionResult, _Index, copy_result, dag_cost, reachable_selection, validate
from .greedy import _forbidden_mask, _to_choices, post_order, selection_cost

_EPS = 1e-12
MAJOR = 0.5  # a pass applies the moves saving at least this share of its best move's saving
REPRICE = 2000  # up to this many improving moves in a pass, all are re-priced after each one applied


def _tree_choice(ix: _Index, banned: list[bool], height: bool) -> list[int]:
    """Per e-class, the root e-node of its cheapest tree (cost + children's trees) or, with `height`, of its lowest
    tree (1 + the highest child's); -1 where none exists. Knuth's generalization of Dijkstra: a class is settled
    only after all children of its chosen e-node, so the choices form an acyclic selection on their own."""
    return _trees(ix, banned, height)[0]


def tree_costs(eg: EGraph, forbidden: frozenset[str] = frozenset()) -> dict[str, float]:
    """Each e-node's cheapest-tree cost: its own cost plus the cheapest trees of its child e-classes (inf where a
    child has none). A class reached along two paths counts twice, as a tree does not share. This prices an e-node
    together with the work it needs below it, so a fused node (doing its children's work) is compared with the
    unfused chain it replaces, not with the chain's last node alone."""
    ix = eg.index
    banned = _forbidden_mask(ix, forbidden)
    value = _trees(ix, banned, False)[1]
    inf = float("inf")
    return {
        nid: (inf if banned[n] else ix.cost[n] + sum(value[k] for k in ix.kids[n])) for n, nid in enumerate(ix.node_ids)
    }


def _trees(ix: _Index, banned: list[bool], height: bool, longest: bool = False) -> tuple[list[int], list[float]]:
    """`_tree_choice`'s choices and each e-class's tree value (inf where it has no tree). With `longest`, an e-node's
    value is its cost plus its costliest child's: the tree's critical path (`height` counts each e-node as 1)."""
    kids, ncls, cost = ix.kids, ix.node_class, ix.cost
    pending = [len(k) for k in kids]
    value = [float("inf")] * len(ix.class_ids)
    choice = [-1] * len(ix.class_ids)
    heap = [(1.0 if height else cost[n], n) for n, k in enumerate(kids) if not k and not banned[n]]
    heapq.heapify(heap)
    while heap:
        v, n = heapq.heappop(heap)
        c = ncls[n]
        if choice[c] >= 0:
            continue
        choice[c], value[c] = n, v
        for p in ix.parents[c]:
            pending[p] -= 1
            if pending[p] == 0 and not banned[p] and choice[ncls[p]] < 0:
                below = (value[k] for k in kids[p])
                pv = (1.0 if height else cost[p]) + (max(below) if height or longest else sum(below))
                heapq.heappush(heap, (pv, p))
    return choice, value


def _moves(ix: _Index, banned: list[bool], choice: list[int], reached: list[int]) -> list[dict[int, int]]:
    """Candidate moves from `choice`, adopt moves first (most classes first), then swaps; each is {class: e-node}.

    An adopt move over e-class M comes once per usable e-node of M not already chosen there (M itself newly
    reached, its greedy e-node is often a concat of the very results the move replaces, which closes a cycle)."""
    kids, cost = ix.kids, ix.cost
    adopt: dict[int, dict[int, int]] = {}
    swaps: list[dict[int, int]] = []
    for c in reached:
        for n in ix.class_nodes[c]:
            if banned[n] or n == choice[c]:
                continue
            swaps.append({c: n})
            for k in kids[n]:
                users = adopt.setdefault(k, {})
                old = users.get(c)
                if old is None or cost[n] < cost[old]:
                    users[c] = n
    out: list[dict[int, int]] = []
    seen: set[tuple[tuple[int, int], ...]] = set()
    for target, users in sorted(adopt.items(), key=lambda kv: -len(kv[1])):
        if len(users) < 2:
            continue
        for n in [choice[target]] + [m for m in ix.class_nodes[target] if not banned[m] and m != choice[target]]:
            move = dict(users)
            move.setdefault(target, n)
            key = tuple(sorted(move.items()))
            if key not in seen:
                seen.add(key)
                out.append(move)
    return out + swaps


def _refcounts(ix: _Index, choice: list[int], reached: list[int]) -> tuple[list[int], list[int]]:
    """Per e-class: how many chosen e-nodes of the reached selection use it (+1 for a root; 0 = not reached), and
    its post-order position in the selection (children before parents; -1 when not reached). `reached` is the
    selection's post-order (`_reached`)."""
    refs = [0] * len(choice)
    pos = [-1] * len(choice)
    for r in ix.roots:
        refs[r] += 1
    for i, c in enumerate(reached):
        pos[c] = i
        for k in ix.kids[choice[c]]:
            refs[k] += 1
    return refs, pos


def _reached(ix: _Index, choice: list[int]) -> list[int]:
    """The e-classes reachable from the roots of a valid selection, children first."""
    order = post_order(ix, choice)
    if order is None:
        raise ValueError("the selection is not a valid acyclic extraction")
    return order


def _negated_kids(ix: _Index) -> list[list[int]]:
    """Per e-node, its child e-classes bit-inverted (~k): `_delta`'s work list holds a class to release as ~k and
    one to take as k, so it needs no (class, step) tuple per entry."""
    return [[~k for k in ks] for ks in ix.kids]


def _delta(
    ix: _Index,
    arr: list[int],
    refs: list[int],
    pos: list[int],
    move: dict[int, int],
    nkids: list[list[int]] | None = None,
    base: float = 0.0,
    goal: float | None = None,
    spare: tuple[list[int], ...] = (),
) -> float | None:
    """The change in DAG cost when `move` is applied to the selection `arr` (reference counts `refs`, post-order
    positions `pos`), or None if the result is cyclic or incomplete. `nkids` is `_negated_kids(ix)`, passed in by
    a caller pricing many moves.

    With `goal`, a change `d` that is not improving (`base + d < goal` false) may be returned without the cycle
    search, for a caller that keeps only improving moves and tries the selections `spare` where `arr` closes a
    cycle: this is done where each of them agrees with `arr` on the e-classes the move newly reaches, as the
    price depends on the selection only there and on the e-classes reached before, so they would price the move
    the same, and none of them can yield an improving move either.

    Only the e-classes whose reference count changes are visited, plus a cycle search from the e-classes that
    changed e-node or became reached: every new cycle passes through one of them. The search skips an unchanged,
    previously reached class below every previously reached class of the move (post-order position lower): its
    old edges lead only to such classes, never back to a changed one. A reached class of the move itself is never
    that low, so the test needs only its position. `arr` and `refs` are updated in place while the move is priced
    and restored before returning (fewer lookups than an overlay of dicts)."""
    kids, cost = ix.kids, ix.cost
    if nkids is None:
        nkids = _negated_kids(ix)
    delta = 0.0
    work: list[int] = []
    old = [arr[c] for c in move]
    limit = len(pos)
    for c, n in move.items():
        if refs[c] > 0:
            a = arr[c]
            delta += cost[n] - cost[a]
            work += nkids[a]
            work += kids[n]
            if pos[c] < limit:
                limit = pos[c]
    for c, n in move.items():
        arr[c] = n
    added: list[int] = []
    done: list[int] = []
    log, pop = done.append, work.pop
    try:
        # Same order as a stack of (class, step) pairs, so the float sum is the same too.
        while work:
            k = pop()
            log(k)
            if k >= 0:
                r = refs[k]
                refs[k] = r + 1
                if r == 0:
                    nd = arr[k]
                    if nd < 0:
                        return None
                    delta += cost[nd]
                    added.append(k)
                    work += kids[nd]
            else:
                k = ~k
                r = refs[k]
                refs[k] = r - 1
                if r == 1:
                    nd = arr[k]
                    delta -= cost[nd]
                    work += nkids[nd]
        if goal is not None and not base + delta < goal and all(o[k] == arr[k] for o in spare for k in added):
            return delta
        # Cycle search over the new selection (absent: new, 1: on the path, 2: done).
        state: dict[int, int] = {}
        seen = state.get
        for s0 in (*move, *added):
            if seen(s0) or refs[s0] <= 0:
                continue
            state[s0] = 1
            path = [s0]
            stack = [iter(kids[arr[s0]])]
            while stack:
                for kid in stack[-1]:
                    st = seen(kid)
                    if st is None:
                        if 0 <= pos[kid] < limit:
                            continue
                        state[kid] = 1
                        path.append(kid)
                        stack.append(iter(kids[arr[kid]]))
                        break
                    if st == 1:
                        return None
                else:
                    state[path.pop()] = 2
                    stack.pop()
        return delta
    finally:
        for k in done:
            if k >= 0:
                refs[k] -= 1
            else:
                refs[~k] += 1
        for c, a in zip(move, old):
            arr[c] = a


def _memo_key(choices: dict[str, str], forbidden: frozenset[str], major_only: bool) -> tuple[object, ...]:
    """The key under which `local_search` memoizes a search from `choices` on its e-graph."""
    return ("local", frozenset(choices.items()), frozenset(forbidden), major_only)


def local_search(
    eg: EGraph,
    start: ExtractionResult,
    *,
    forbidden: frozenset[str] = frozenset(),
    time_limit: float = 10.0,
    major_only: bool = False,
) -> ExtractionResult:
    """Improve `start` (a valid selection avoiding `forbidden`) by swap and adopt moves until none lowers the cost or
    `time_limit` seconds pass. Returns `start` itself when nothing cheaper was found.

    With `major_only`, moves saving less per e-class they change than MAJOR times the first pass's best such saving
    are never applied: the search takes the large gains (a merge saving a weight read) and leaves the e-classes that
    small ones, even many taken at once, would change as they are, so that a merge a later round of exploration
    extends is not blocked by them.

    A search that ends at a local optimum (not at its time limit) is memoized on `eg`: the same search again (the
    extraction repeating an exploration sample's, on the same export) returns its result without the work."""
    key = _memo_key(start.choices, forbidden, major_only)
    if key in eg.memo:
        known = eg.memo[key]
        return start if known is None else copy_result(known)
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    ix = eg.index
    banned = _forbidden_mask(ix, forbidden)
    # Where a move newly reaches an e-class, it takes the root of the class's cheapest tree, or where that closes a
    # cycle, of its lowest tree. Both are acyclic by construction.
    fills = [_tree_choice(ix, banned, False), _tree_choice(ix, banned, True)]
    nkids = _negated_kids(ix)
    current = [-1] * len(ix.class_ids)
    for c, n in start.choices.items():
        current[ix.class_pos[c]] = ix.node_pos[n]

    def overlay(selection: list[int]) -> tuple[list[list[int]], list[int], list[int], list[int]]:
        """For a valid selection (ValueError otherwise): the selection over each fill, its reference counts and
        post-order positions, and its reached e-classes."""
        reached = _reached(ix, selection)
        out = []
        for fill in fills:
            arr = list(fill)
            for c in reached:
                arr[c] = selection[c]
            out.append(arr)
        return (out, *_refcounts(ix, selection, reached), reached)

    arrays, refs, pos, reached = overlay(current)
    first = selection_cost(ix, arrays[0])
    if first is None:  # never: overlay has raised ValueError for an invalid selection already
        raise ValueError("the selection is not a valid acyclic extraction")
    best = first
    moves_applied = passes = evaluated = 0
    density = 0.0  # with major_only: the least saving per changed e-class a move may have (set by the first pass)
    finished = False  # the search ended at a local optimum, not at its time limit

    def attempt(move: dict[int, int]) -> None:
        """Apply `move` under the first fill that keeps it acyclic if that beats `best` (recounted exactly)."""
        nonlocal arrays, best, evaluated, moves_applied, refs, pos, reached
        for arr in arrays:
            evaluated += 1
            d = _delta(ix, arr, refs, pos, move, nkids)
            if d is None:
                continue  # the next fills only stand in where this one closes a cycle
            if d < -_EPS * max(1.0, abs(best)):
                new = list(arr)
                for c, n in move.items():
                    new[c] = n
                exact = selection_cost(ix, new)
                if exact is not None and exact < best - _EPS * max(1.0, abs(best)):
                    best = exact
                    moves_applied += 1
                    arrays, refs, pos, reached = overlay(new)
            return

    def price(move: dict[int, int]) -> float | None:
        """The cost of `move` under the first fill that keeps it acyclic, if that beats `best`; else None. A fill's
        price that does not beat `best` is searched for cycles only where a later fill would price the move
        differently: most moves are then priced without any cycle search."""
        nonlocal evaluated
        goal = best - _EPS * max(1.0, abs(best))
        for i, arr in enumerate(arrays):
            evaluated += 1
            d = _delta(ix, arr, refs, pos, move, nkids, best, goal, tuple(arrays[i + 1 :]))
            if d is not None:
                return best + d if best + d < goal else None
        return None

    # Each pass prices every move against the current selection, then applies the improving ones best first (each
    # re-priced, as earlier ones change the selection), and only those saving at least MAJOR times the pass's best
    # saving: a merge across time steps saving a whole weight read goes in, and is extended in the next pass,
    # before a small local gain (two gates of one step merged) that would block the extension.
    while time.perf_counter() < deadline:
        passes += 1
        before = best
        gains: list[tuple[float, int, dict[int, int]]] = []
        cut = False
        for k, move in enumerate(_moves(ix, banned, arrays[0], reached)):
            if k % 64 == 0 and time.perf_counter() >= deadline:
                cut = True
                break
            found = price(move)
            if found is not None:
                gains.append((found, k, move))
        gains.sort(key=lambda g: (g[0], g[1]))
        if not gains:
            finished = not cut
            break
        floor = MAJOR * (before - gains[0][0])  # the least saving a move of this pass may have
        if major_only and passes == 1:
            density = MAJOR * max((before - found) / len(move) for found, _, move in gains)

        def eligible(found: float, move: dict[int, int]) -> bool:
            saving = before - found
            return saving >= floor and (not major_only or saving / len(move) >= density)

        if len(gains) <= REPRICE:
            # Re-price the rest after each move: a move that now shares what an applied one pays for (the same
            # concatenated rows under another gate's weight) overtakes an equal one that does not.
            pending = [move for _, _, move in gains]
            while pending:
                priced = [(price(m), k) for k, m in enumerate(pending)]
                fine = [(c, k) for c, k in priced if c is not None and eligible(c + before - best, pending[k])]
                if not fine:
                    break
                _, k = min(fine)
                attempt(pending.pop(k))
        else:
            for found, _, move in gains:  # one pricing each
                if eligible(found, move) and not all(arrays[0][c] == n for c, n in move.items()):
                    attempt(move)
        if best >= before - _EPS * max(1.0, abs(before)):
            finished = not cut
            break
    choice = arrays[0]
    if best >= first - _EPS * max(1.0, abs(first)):
        if finished:
            eg.memo[key] = None
        return start
    chosen = reachable_selection(eg, _to_choices(ix, choice))
    info = {"start_cost": start.cost, "moves": moves_applied, "passes": passes, "evaluated": evaluated}
    result = ExtractionResult(
        chosen, dag_cost(eg, chosen), None, "feasible", time.perf_counter() - t0, f"{start.method}+local", info
    )
    validate(eg, result, forbidden)
    if finished:
        eg.memo[key] = copy_result(result)
        if not major_only:  # its last pass found no improving move from the result: a search from it stops there
            eg.memo[_memo_key(chosen, forbidden, False)] = None
    return result
