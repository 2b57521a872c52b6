"""The sequential baseline: TASO/MetaFlow best-first backtracking search over concrete graphs.

A priority queue holds candidate graphs ordered by cost. Each step pops the cheapest; every match of every rule
(single- and multi-pattern, the same library the e-graph explorer uses) gives one new candidate, kept when its cost
is below `alpha` times the best cost so far, it has at most twice the original op count, and its structural hash is
new. The search stops after `budget` expansions or when the queue is empty; the result is the cheapest graph seen
among those expanded and the best one still queued.

What makes it fast (and what is incremental):

- Graphs live in one hash-consed term store (`rewrites.match.TermGraph`); a graph is its output ids. The structural
  hash is a (64-bit) Merkle hash of the outputs, so it does not depend on node numbering or on how the graph was
  reached.
- A candidate is priced without being built: its cost is the parent's cost minus the nodes it removes (the matched
  roots, their ancestors, and nodes left without users) plus the nodes it adds (the right side, and the ancestors
  rebuilt over it; an ancestor that collapses onto an existing node is not added). Per-node costs are cached by
  store id and by signature, so each distinct operator is priced once; weight-only nodes cost 0, and so does a
  node onnxruntime fuses into the node computing its operand (`tensat.cost.fuses_into`), as in tensat's
  extraction: the search's costs are the graph's as onnxruntime runs it (`runtime_cost`, which the result
  reports). The Merkle hashes of the rebuilt ancestors are computed on the fly; only a popped candidate is
  materialized in the store.
- Matching is incremental: since terms never change, a parent's match is still valid in the child exactly when its
  roots are still live; a match at an ancestor rebuilt farther above the change than the deepest pattern is carried
  over with its node ids mapped (and so is its right side, rebuilt without evaluating anything); only the right
  side's nodes and the ancestors within pattern depth of the change are matched afresh.
- Every match's right side is built once and cached; the ancestor sets of a popped graph are computed in one
  bottom-up pass.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tensat import ops, rewrites
from tensat.cost import (
    FUSED_ACTIVATIONS,
    FUSED_THROUGH,
    FUSION_PRODUCERS,
    FUSION_READERS,
    Const,
    CostModel,
    Item,
    Operand,
    Shape,
    device_of,
    fused_cost,
    fuses_into,
    runtime_cost,
)
from tensat.ir import Graph, Node
from tensat.rewrites.match import (
    Context,
    Match,
    Matcher,
    NotApplicable,
    TermGraph,
    build_rhs,
    effective_roots,
    rewrite,
    rewrite_mapped,
    rhs_tensor_vars,
)

Progress = Callable[[dict[str, Any]], None]

# Relative cost difference below which two graphs count as equally cheap (sums in another order differ by rounding).
_EPS = 1e-9


@dataclass
class SequentialResult:
    """What the sequential search found and what it took."""

    graph: Graph
    original_graph: Graph
    cost_before: float
    cost_after: float
    ops_before: int
    ops_after: int
    expansions: int
    seconds: float
    stop_reason: str  # budget | queue_empty | time_limit
    alpha: float
    budget: int
    matches: int = 0  # matches tried (one candidate each)
    candidates: int = 0  # well-formed candidate graphs priced
    pushed: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # not_applicable, duplicate, cost, size
    best_expansion: int = 0  # expansion at which the best graph was expanded (or found, if still queued)
    applied: list[str] = field(default_factory=list)  # rule names on the path from the input to the result
    rules: list[str] = field(default_factory=list)
    trace: list[dict[str, float]] = field(default_factory=list)  # per expansion: popped cost, best, queue, seconds

    @property
    def speedup(self) -> float:
        """Cost ratio before/after."""
        return self.cost_before / self.cost_after if self.cost_after > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (without the graphs)."""
        return {
            "cost_before": self.cost_before,
            "cost_after": self.cost_after,
            "speedup": self.speedup,
            "ops_before": self.ops_before,
            "ops_after": self.ops_after,
            "expansions": self.expansions,
            "seconds": self.seconds,
            "stop_reason": self.stop_reason,
            "alpha": self.alpha,
            "budget": self.budget,
            "matches": self.matches,
            "candidates": self.candidates,
            "pushed": self.pushed,
            "rejected": dict(self.rejected),
            "best_expansion": self.best_expansion,
            "applied": list(self.applied),
            "rules": len(self.rules),
        }


@dataclass(frozen=True)
class _Rhs:
    """A match's right side in the store: its roots, the bindings it reads, the nodes it is made of."""

    roots: tuple[int, ...]
    used: tuple[int, ...]
    built: tuple[int, ...]


# a node as pricing sees it: op, attributes, shape, whether it is weight-only, inputs
_NodeView = tuple[str, tuple[tuple[str, Any], ...], tuple[int, ...], bool, tuple[int, ...], str]
FUSED_INTO = FUSION_PRODUCERS | FUSED_THROUGH  # ops a reader may be fused into (an activation through the latter)


@dataclass(eq=False)
class _State:
    """A search node: a candidate graph, priced; materialized (outputs, context, matches) once popped."""

    cost: float
    ops: int
    key: int
    parent: _State | None
    match: Match | None
    found_at: int
    outputs: tuple[tuple[str, int], ...] | None = None
    ctx: Context | None = None
    matches: list[Match] | None = None


class SequentialSearch:
    """Best-first search over one graph with a rule set and a cost model; `run()` does the search."""

    def __init__(
        self,
        graph: Graph,
        cost: CostModel,
        rules: Sequence[rewrites.Rule] | None = None,
        *,
        alpha: float = 1.05,
        budget: int = 100,
        time_limit: float | None = None,
        progress: Progress | None = None,
    ) -> None:
        if alpha <= 0:
            raise ValueError(f"alpha must be positive, got {alpha}")
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        self.graph = graph.compact()
        self.cost_model = cost
        self.device = device_of(cost)
        self.store = TermGraph(self.graph)
        root_ctx = Context(self.store, tuple(self.graph.outputs))
        present = {self.store.op[i] for i in root_ctx.order}
        self.rules = list(rules) if rules is not None else rewrites.select_rules(present)
        self.matcher = Matcher(self.rules)
        self.alpha, self.budget, self.time_limit, self.progress = alpha, budget, time_limit, progress
        self._sig_cost: dict[tuple[Any, ...], float] = {}
        self._cost: list[float] = []
        self._isop: list[bool] = []
        self._root_ctx = root_ctx
        self._rhs_cache: dict[Match, _Rhs | None] = {}
        self._origin: dict[Match, tuple[Match, dict[int, int]]] = {}

    # -- per-node costs -----------------------------------------------------------------------------------------

    def _price(
        self,
        op: str,
        attrs: tuple[tuple[str, Any], ...],
        shape: tuple[int, ...],
        dtype: str,
        in_shapes: tuple[tuple[int, ...], ...],
        in_const: tuple[bool, ...],
    ) -> float:
        key = (op, attrs, shape, dtype, in_shapes, in_const)
        found = self._sig_cost.get(key)
        if found is None:
            node = Node(op, (), attrs, shape, dtype)
            found = self._sig_cost[key] = float(self.cost_model(node, list(in_shapes), list(in_const)))
        return found

    def _sync(self) -> None:
        """Price every store node not priced yet (a node's cost never changes: it is a term)."""
        s = self.store
        for i in range(len(self._cost), len(s)):
            leaf = ops.get(s.op[i]).leaf
            if leaf or s.const[i]:
                self._cost.append(0.0)
                self._isop.append(False)
                continue
            fused = self._fused_price(i)
            self._cost.append(self._price_alone(i) if fused is None else fused)
            self._isop.append(True)

    def _price_alone(self, i: int) -> float:
        """Store node `i`'s price as a node of its own (by its signature: op, attributes, shapes, weight flags)."""
        s = self.store
        ins = s.inputs[i]
        return self._price(
            s.op[i], s.attrs[i], s.shape[i], s.dtype[i], tuple(s.shape[j] for j in ins), tuple(s.const[j] for j in ins)
        )

    def _store_node(self, i: int) -> _NodeView:
        s = self.store
        return s.op[i], s.attrs[i], s.shape[i], s.const[i], s.inputs[i], s.dtype[i]

    def _fused(self, i: int, view: Callable[[int], _NodeView] | None = None) -> bool:
        """Whether onnxruntime runs node `i` (a store node, or any `view` describes) fused into the node computing
        one of its operands (`_fused_into`)."""
        return self._fused_into(i, view) is not None

    def _fused_price(self, i: int, view: Callable[[int], _NodeView] | None = None) -> float | None:
        """What node `i` costs fused into the node computing one of its operands, as in tensat's extraction
        (`tensat.cost.fused_cost`: nothing, but the fused kernel's price less the producer's, at most the node's
        own, for an Add fused into a MatMul and an activation a convolution applies in a pass over its output);
        None where it is not fused."""
        found = self._fused_into(i, view)
        if found is None:
            return None
        look = view or self._store_node

        def item(n: int) -> Item:
            op, attrs, shape, _, ins, dtype = look(n)
            return Node(op, (), attrs, shape, dtype), [look(j)[2] for j in ins], [look(j)[3] for j in ins]

        def price(node: Node, in_shapes: Sequence[Shape], in_const: Sequence[Const]) -> float:
            flags = tuple(bool(c) for c in in_const)
            return self._price(node.op, tuple(node.attrs), node.shape, node.dtype, tuple(in_shapes), flags)

        k, producer = found
        return fused_cost(price, item(i), k, item(producer))

    def _fused_into(self, i: int, view: Callable[[int], _NodeView] | None = None) -> tuple[int, int] | None:
        """The operand of node `i` (a store node, or any `view` describes) and the node onnxruntime runs it fused
        into, the one computing that operand (`tensat.cost.fuses_into`; an activation also through a
        BatchNormalization or an Add fused into the node before it, the node below them); None where it runs on its
        own."""
        look = view or self._store_node
        op, _, _, _, ins, _ = look(i)
        if op not in FUSION_READERS:
            return None

        def operands(n: int) -> list[Operand]:
            return [(look(j)[2], look(j)[3]) for j in look(n)[4]]

        def fuses(n: int, k: int, p: int, through: str | None = None) -> bool:
            op, _, shape, _, _, _ = look(n)
            p_op, p_attrs, _, _, _, _ = look(p)
            return fuses_into(op, shape, operands(n), k, p_op, dict(p_attrs), operands(p), self.device, through)

        for k, j in enumerate(ins):
            j_op, _, _, j_const, j_ins, _ = look(j)
            if j_const or ins.count(j) > 1:  # an operand read twice is not fused into (an Add of a product to itself)
                continue
            if fuses(i, k, j):
                return k, j
            if j_op in FUSED_THROUGH and op in FUSED_ACTIVATIONS:
                below = next((q for kq, q in enumerate(j_ins) if not look(q)[3] and fuses(j, kq, q)), None)
                return (k, below) if below is not None and fuses(i, k, below, j_op) else None
        return None

    def _refused(self, ctx: Context, roots: tuple[int, ...], new_roots: tuple[int, ...]) -> float:
        """How much the readers of `roots` cost more once they read `new_roots` instead (the same shapes and
        weight-only flags): only whether each is fused into the node it reads can change (`_fused`; a Relu also
        through the BatchNormalization or the Add between it and the node it is fused into)."""
        s = self.store
        if not any(s.op[x] in FUSED_INTO for x in (*roots, *new_roots)):
            return 0.0
        sub = dict(zip(roots, new_roots))
        readers = [c for x in roots for c in ctx.consumers.get(x, ()) if s.op[c] in FUSION_READERS and c not in sub]
        readers += [d for c in readers if s.op[c] in FUSED_THROUGH for d in ctx.consumers.get(c, ())]

        def view(i: int) -> _NodeView:
            op, attrs, shape, const, ins, dtype = self._store_node(i)
            return op, attrs, shape, const, tuple(sub.get(j, j) for j in ins), dtype

        more = 0.0
        for c in dict.fromkeys(readers):
            was, now = self._cost[c], self._fused_price(c, view)
            if now is not None:
                more += now - was
            elif self._fused(c):
                more += self._price_alone(c) - was
        return more

    def _materialize(self, st: _State) -> None:
        """Build a popped candidate in the store and find its matches (incrementally from its parent's)."""
        parent = st.parent
        if parent is None:
            st.ctx = self._root_ctx
            st.matches = self.matcher.find(st.ctx)
            return
        assert parent.ctx is not None and parent.matches is not None and st.match is not None
        rw = rewrite_mapped(parent.ctx, st.match)
        self._sync()
        st.outputs = rw.outputs
        st.ctx = Context(self.store, st.outputs)
        st.matches, origin = self.matcher.update(st.ctx, parent.ctx.live, parent.matches, rw)
        for child_match, parent_match in origin.items():
            self._origin[child_match] = (parent_match, rw.sub)

    # -- pricing a candidate without building it ----------------------------------------------------------------

    def _rhs(self, m: Match) -> _Rhs | None:
        """The right side of a match, built once per match; None if it does not apply (ill-typed).

        A match carried over from a parent graph gets its parent match's right side with node ids mapped (same
        structure, no expressions to evaluate, no shapes to check).
        """
        if m in self._rhs_cache:
            return self._rhs_cache[m]
        carried = self._origin.pop(m, None)
        if carried is not None:
            parent_match, sub = carried
            base = self._rhs(parent_match)
            found = None if base is None else self._translate(base, sub)
        else:
            try:
                new_roots = build_rhs(self.store, m)
            except NotApplicable:
                found = None
            else:
                tensors = dict(m.tensors)
                found = _Rhs(
                    new_roots,
                    tuple(tensors[v] for v in sorted(rhs_tensor_vars(m.rule))),
                    self._built(new_roots, set(tensors.values())),
                )
        self._sync()
        self._rhs_cache[m] = found
        return found

    def _built(self, new_roots: tuple[int, ...], bindings: set[int]) -> tuple[int, ...]:
        """The nodes of a right side above its bindings, in topological order."""
        inputs = self.store.inputs
        seen: set[int] = set()
        stack = [r for r in new_roots if r not in bindings]
        while stack:
            x = stack.pop()
            if x not in seen:
                seen.add(x)
                stack.extend(i for i in inputs[x] if i not in bindings)
        return tuple(sorted(seen))

    def _translate(self, rhs: _Rhs, sub: dict[int, int]) -> _Rhs:
        """A right side rebuilt over bindings renamed by `sub`."""
        s = self.store
        tr: dict[int, int] = {}
        for b in rhs.built:
            tr[b] = s.rebuild(b, tuple([tr.get(i, sub.get(i, i)) for i in s.inputs[b]]))

        def name(i: int) -> int:
            return tr.get(i, sub.get(i, i))

        return _Rhs(tuple(map(name, rhs.roots)), tuple(map(name, rhs.used)), tuple(tr[b] for b in rhs.built))

    def _candidate(self, st: _State, m: Match, bound: float, max_ops: int) -> tuple[str, float, int, int]:
        """Price `st` with `m` applied: (verdict, cost, op count, structural hash).

        The verdict is "ok", or why the candidate is dropped: "not_applicable" (ill-typed or cyclic), "cost" (not
        below `bound`) or "size" (more than `max_ops` ops); the hash is only computed for "ok".
        """
        ctx = st.ctx
        assert ctx is not None
        rhs = self._rhs(m)
        if rhs is None:
            return "not_applicable", 0.0, 0, 0
        used = rhs.used
        roots, new_roots = effective_roots(m.roots, rhs.roots)
        if not roots:
            return "not_applicable", 0.0, 0, 0
        anc = [ctx.ancestors(r) for r in roots]

        def replaced(x: int) -> bool:
            return x in roots or any(x in a for a in anc)

        if any(replaced(x) for x in used) or any(replaced(x) for x in new_roots):
            return "not_applicable", 0.0, 0, 0
        s = self.store
        live, inputs, const = ctx.live, s.inputs, s.const
        if any(r in live for r in new_roots) or any(const[a] != const[b] for a, b in zip(roots, new_roots)):
            return self._candidate_general(st, roots, new_roots, bound, max_ops)
        # Fast path: no rebuilt ancestor can coincide with a node of the graph (the new roots have no users yet)
        # and no ancestor changes cost (same weight-only flags) but the readers fused into a replaced root or its
        # replacement (`_refused`), so the other ancestors cancel out of cost and use counts.
        costs, isop, uses = self._cost, self._isop, ctx.uses
        cost, nops = st.cost + self._refused(ctx, roots, new_roots), st.ops
        delta: dict[int, int] = {}
        for x in set(roots):
            cost -= costs[x]
            nops -= isop[x]
            for i in inputs[x]:
                if not replaced(i):
                    delta[i] = delta.get(i, 0) - 1
        cost, nops = self._add_new(new_roots, live, cost, nops, delta)
        cost, nops = self._drop_dead(delta, uses, inputs, cost, nops)
        if not cost < bound:
            return "cost", cost, nops, 0
        if nops > max_ops:
            return "size", cost, nops, 0
        # Merkle hashes of the rebuilt ancestors, bottom up (the inputs not rebuilt keep their hashes).
        mh, sig, input_mh = s.mh, s.sig, s.input_mh
        h = {r: mh[n] for r, n in zip(roots, new_roots)}
        get = h.get
        if len(roots) == 1:
            for a in ctx.ancestors_sorted(roots[0]):
                h[a] = hash((sig[a], tuple(map(get, inputs[a], input_mh[a]))))
        else:
            for a in sorted(ctx.ancestors_sorted(roots[0]) + ctx.ancestors_sorted(roots[1])):
                if a not in h:
                    h[a] = hash((sig[a], tuple(map(get, inputs[a], input_mh[a]))))
        return "ok", cost, nops, hash(tuple([(name, get(o, mh[o])) for name, o in ctx.outputs]))

    def _add_new(
        self, new_roots: tuple[int, ...], live: set[int], cost: float, nops: int, delta: dict[int, int]
    ) -> tuple[float, int]:
        """Add the right side's nodes that the graph does not have yet."""
        inputs, costs, isop = self.store.inputs, self._cost, self._isop
        stack = [r for r in new_roots if r not in live]
        seen: set[int] = set()
        while stack:
            y = stack.pop()
            if y in seen:
                continue
            seen.add(y)
            cost += costs[y]
            nops += isop[y]
            for i in inputs[y]:
                if i in live:
                    delta[i] = delta.get(i, 0) + 1
                elif i not in seen:
                    stack.append(i)
        return cost, nops

    def _drop_dead(
        self, delta: dict[int, int], uses: dict[int, int], inputs: list[tuple[int, ...]], cost: float, nops: int
    ) -> tuple[float, int]:
        """Remove the nodes whose use count falls to zero, and so on down."""
        costs, isop = self._cost, self._isop
        dead = [x for x, d in delta.items() if d < 0 and uses[x] + d == 0]
        while dead:
            x = dead.pop()
            cost -= costs[x]
            nops -= isop[x]
            for i in inputs[x]:
                d = delta.get(i, 0) - 1
                delta[i] = d
                if uses[i] + d == 0:
                    dead.append(i)
        return cost, nops

    def _candidate_general(
        self, st: _State, roots: tuple[int, ...], new_roots: tuple[int, ...], bound: float, max_ops: int
    ) -> tuple[str, float, int, int]:
        """`_candidate` when rebuilt ancestors may coincide with existing nodes or change their cost."""
        ctx = st.ctx
        assert ctx is not None
        s = self.store
        self._sync()  # the store nodes a rebuilt ancestor may collapse onto are priced
        replaced = ctx.replaced(roots)
        live, uses = ctx.live, ctx.uses
        inputs, const, costs, isop, mh, sig = s.inputs, s.const, self._cost, self._isop, s.mh, s.sig
        cost, nops = st.cost, st.ops
        delta: dict[int, int] = {}
        # Removed: the roots and every ancestor (all rebuilt, or merged into existing nodes).
        for x in replaced:
            cost -= costs[x]
            nops -= isop[x]
            for i in inputs[x]:
                if i not in replaced:
                    delta[i] = delta.get(i, 0) - 1
        cost, nops = self._add_new(new_roots, live, cost, nops, delta)
        # Ancestors rebuilt over the new roots, in topological order. Temporary ids (negative) stand for terms not
        # in the store; their Merkle hashes and weight-only flags are kept on the side.
        sub = dict(zip(roots, new_roots))
        tmp_mh: dict[int, int] = {}
        tmp_const: dict[int, bool] = {}
        tmp_node: dict[int, tuple[int, tuple[int, ...]]] = {}  # a temporary id -> the node it rebuilds, its inputs
        fresh = itertools.count(-1, -1)

        def view(i: int) -> _NodeView:
            if i >= 0:
                return self._store_node(i)
            a, ins = tmp_node[i]
            return s.op[a], s.attrs[a], s.shape[a], tmp_const[i], ins, s.dtype[a]

        for a in sorted(replaced):
            if a in sub:
                continue
            ins = tuple(sub.get(i, i) for i in inputs[a])
            real = s.lookup(a, ins) if all(i >= 0 for i in ins) else None
            if real is not None and real in live:
                sub[a] = real  # collapses onto a node the graph already has
                continue
            if real is not None:
                new_id, c, k = real, costs[real], isop[real]
            else:
                new_id = next(fresh)
                in_const = tuple(tmp_const[i] if i < 0 else const[i] for i in ins)
                is_const = s.op[a] != "opaque" and all(in_const)
                tmp_const[new_id] = is_const
                tmp_mh[new_id] = hash((sig[a], tuple([tmp_mh[i] if i < 0 else mh[i] for i in ins])))
                tmp_node[new_id] = (a, ins)
                fused = None if is_const else self._fused_price(new_id, view)
                if is_const:
                    c, k = 0.0, False
                elif fused is not None:
                    c, k = fused, True
                elif in_const == tuple(const[i] for i in inputs[a]) and not self._fused(a):
                    c, k = costs[a], isop[a]
                else:
                    c = self._price(
                        s.op[a], s.attrs[a], s.shape[a], s.dtype[a], tuple(s.shape[i] for i in inputs[a]), in_const
                    )
                    k = True
            sub[a] = new_id
            cost += c
            nops += k
            for i in ins:
                if i >= 0 and i in live:
                    delta[i] = delta.get(i, 0) + 1
        outputs = []
        for name, o in ctx.outputs:
            n = sub.get(o, o)
            if n != o and n >= 0 and n in live:
                delta[n] = delta.get(n, 0) + 1
            outputs.append((name, tmp_mh[n] if n < 0 else mh[n]))
        for x in replaced:
            delta.pop(x, None)
        cost, nops = self._drop_dead(delta, uses, inputs, cost, nops)
        if not cost < bound:
            return "cost", cost, nops, 0
        if nops > max_ops:
            return "size", cost, nops, 0
        return "ok", cost, nops, hash(tuple(outputs))

    # -- the search ---------------------------------------------------------------------------------------------

    def run(self) -> SequentialResult:
        """Search; the best graph found, with statistics."""
        cost_before = runtime_cost(self.graph, self.cost_model)  # also lets a measuring model prefetch
        self._sync()
        ops_before = self.graph.op_count()
        start = time.perf_counter()
        root_cost = sum(self._cost[i] for i in self._root_ctx.order)
        root_ops = sum(self._isop[i] for i in self._root_ctx.order)
        root = _State(
            root_cost,
            root_ops,
            self.store.graph_key(tuple(self.graph.outputs)),
            None,
            None,
            0,
            outputs=tuple(self.graph.outputs),
        )
        max_ops = 2 * root_ops
        counter = itertools.count()
        heap: list[tuple[float, int, _State]] = [(root.cost, next(counter), root)]
        seen = {root.key}
        best = root
        best_expansion = 0
        expansions = n_matches = n_candidates = pushed = 0
        rejected = {"not_applicable": 0, "duplicate": 0, "cost": 0, "size": 0}
        trace: list[dict[str, float]] = []
        stop = "queue_empty"
        while heap:
            if expansions >= self.budget:
                stop = "budget"
                break
            if self.time_limit is not None and time.perf_counter() - start > self.time_limit:
                stop = "time_limit"
                break
            _, _, st = heapq.heappop(heap)
            self._materialize(st)
            assert st.ctx is not None
            st.ctx.all_ancestors()
            expansions += 1
            if st.cost < best.cost * (1 - _EPS):
                best, best_expansion = st, expansions
            bound = self.alpha * best.cost
            assert st.matches is not None
            for m in st.matches:
                n_matches += 1
                verdict, cost, nops, key = self._candidate(st, m, bound, max_ops)
                if verdict != "not_applicable":
                    n_candidates += 1
                if verdict != "ok":
                    rejected[verdict] += 1
                elif key in seen:
                    rejected["duplicate"] += 1
                else:
                    seen.add(key)
                    pushed += 1
                    heapq.heappush(heap, (cost, next(counter), _State(cost, nops, key, st, m, expansions)))
            assert st.ctx is not None
            st.ctx.forget()
            trace.append(
                {
                    "expansion": expansions,
                    "cost": st.cost,
                    "best": best.cost,
                    "queue": len(heap),
                    "seconds": time.perf_counter() - start,
                }
            )
            if self.progress is not None:
                self.progress(
                    {
                        "expansion": expansions,
                        "budget": self.budget,
                        "best": best.cost,
                        "cost_before": root.cost,
                        "queue": len(heap),
                        "candidates": n_candidates,
                        "seconds": time.perf_counter() - start,
                    }
                )
        if heap and heap[0][0] < best.cost * (1 - _EPS):
            best = heap[0][2]
            best_expansion = best.found_at
            if best.outputs is None:
                assert best.parent is not None and best.parent.ctx is not None and best.match is not None
                best.outputs = rewrite(best.parent.ctx, best.match)
        seconds = time.perf_counter() - start
        assert best.outputs is not None
        result_graph = self.store.to_graph(best.outputs)
        applied: list[str] = []
        node: _State | None = best
        while node is not None and node.match is not None:
            applied.append(node.match.rule.name)
            node = node.parent
        return SequentialResult(
            graph=result_graph,
            original_graph=self.graph,
            cost_before=cost_before,
            cost_after=runtime_cost(result_graph, self.cost_model),
            ops_before=ops_before,
            ops_after=result_graph.op_count(),
            expansions=expansions,
            seconds=seconds,
            stop_reason=stop,
            alpha=self.alpha,
            budget=self.budget,
            matches=n_matches,
            candidates=n_candidates,
            pushed=pushed,
            rejected=rejected,
            best_expansion=best_expansion,
            applied=applied[::-1],
            rules=[r.name for r in self.rules],
            trace=trace,
        )


def sequential_search(
    graph: Graph,
    cost: CostModel,
    rules: Sequence[rewrites.Rule] | None = None,
    *,
    alpha: float = 1.05,
    budget: int = 100,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> SequentialResult:
    """TASO-style best-first search on `graph` under `cost`, with `rules` (default: `select_rules` for its ops).

    `alpha` (1.05) relaxes the pruning bound, `budget` (100) caps the expansions, `time_limit` (seconds, none by
    default) stops between expansions; `progress` is called with a dict after every expansion.
    """
    return SequentialSearch(
        graph, cost, rules, alpha=alpha, budget=budget, time_limit=time_limit, progress=progress
    ).run()
