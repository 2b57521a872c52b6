"""Matching rewrite rules on concrete tensor graphs, and applying a match.

The e-graph explorer compiles rules to egglog; the sequential search (and anything else that rewrites one concrete
graph at a time) uses this module, reading the same parsed `Rule`s.

Graphs are held in a `TermGraph`: a hash-consed, append-only store where every distinct (op, inputs, attributes)
term has exactly one id and ids are topologically ordered. A graph is then just its output ids: two graphs with the
same live structure have the same outputs, however they were reached. A term never changes, so whether a rule
matches at a node is a property of the node id alone: after a rewrite only nodes that were not live before can
start new matches, and of those, the ancestors rebuilt farther above the rewritten roots than any pattern reaches
match exactly as their old versions did (`Matcher.update` carries those matches over and matches afresh only near
the change).

A match binds the left side's tensor variables to node ids and its attribute variables to values. Single-pattern
matching at a node is deterministic (one binding or none). A multi-pattern match is a pair of distinct roots whose
bindings agree on shared variables; partners are found by walking up from the node bound to a shared variable
(TASO enumerates every pair), and a symmetric rule keeps one order of each pair, as its egglog form does.

Applying a match (`rewrite`) builds the right side (attributes via `eval_expr` on concrete shapes; an ill-typed
node rejects the match), then rebuilds every ancestor of the matched roots over the replacements. Nodes no longer
reachable from the outputs are simply not part of the new graph. A match is rejected when the right side would
read a node that the rewrite replaces (a matched root or one of its ancestors): in a graph that is a cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from tensat import ops
from tensat.ir import Graph, OpaqueSpec

from . import select_rules
from .dsl import Lit, Rule, RuleError, Term, Var, attr_value, eval_expr

Outputs = tuple[tuple[str, int], ...]

# Errors an expression or guard may raise on concrete values that do not fit it (a dim index out of range, a
# division by zero, a let-term that is ill-typed): the match does not apply.
_EVAL_ERRORS = (ArithmeticError, IndexError, KeyError, TypeError, ValueError)


class NotApplicable(Exception):
    """A match whose rewrite cannot be applied: ill-typed right side, a cycle, or a no-op."""


def _canon(value: Any) -> Any:
    """An attribute value in the IR's canonical hashable form (as `Graph.add` stores it)."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(_canon(v) for v in value)
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    return value


class TermGraph:
    """A hash-consed store of tensor terms; the source graph's nodes keep their ids.

    Per id: `op`, `inputs`, `attrs` (canonical tuple, in the op's attribute order), `attr` (as a dict), `shape`,
    `dtype`, `const` (computable from weights alone, folded at export), `mh` (a structural hash of the whole term,
    independent of ids: a hash of `sig`, the op and attributes, and `input_mh`, the inputs' hashes).
    """

    def __init__(self, source: Graph) -> None:
        self.weights: dict[str, np.ndarray] = source.weights
        self.opaque: dict[str, OpaqueSpec] = source.opaque
        self.opset_imports = dict(source.opset_imports)
        self.name = source.name
        self.input_ids: list[int] = source.input_ids
        self.op: list[str] = []
        self.inputs: list[tuple[int, ...]] = []
        self.attrs: list[tuple[tuple[str, Any], ...]] = []
        self.attr: list[dict[str, Any]] = []
        self.shape: list[tuple[int, ...]] = []
        self.dtype: list[str] = []
        self.const: list[bool] = []
        self.sig: list[int] = []
        self.mh: list[int] = []
        self.input_mh: list[tuple[int, ...]] = []
        self.index: dict[tuple[Any, ...], int] = {}
        for n in source.nodes:
            i = self._append(n.op, n.inputs, n.attrs, n.shape, n.dtype)
            if i != len(self.op) - 1:
                raise ValueError("source graph holds duplicate nodes")

    def __len__(self) -> int:
        return len(self.op)

    def _append(
        self, op: str, inputs: tuple[int, ...], attrs: tuple[tuple[str, Any], ...], shape: tuple[int, ...], dtype: str
    ) -> int:
        key = (op, inputs, attrs)
        found = self.index.get(key)
        if found is not None:
            return found
        i = len(self.op)
        self.index[key] = i
        self.op.append(op)
        self.inputs.append(inputs)
        self.attrs.append(attrs)
        self.attr.append(dict(attrs))
        self.shape.append(shape)
        self.dtype.append(dtype)
        const = self.const
        self.const.append(
            ops.constant_leaf(op) or (op not in ("input", "opaque") and bool(inputs) and all(const[j] for j in inputs))
        )
        sig = hash((op, attrs))
        self.sig.append(sig)
        input_mh = tuple([self.mh[j] for j in inputs])
        self.input_mh.append(input_mh)
        self.mh.append(hash((sig, input_mh)))
        return i

    def is_leaf(self, i: int) -> bool:
        """Whether node `i` is a graph input or a constant leaf."""
        return ops.get(self.op[i]).leaf

    def add(self, op: str, inputs: Sequence[int], attrs: Mapping[str, Any]) -> int:
        """The id of `op(inputs, attrs)`, appended if new; raises ops.ShapeError when it is ill-typed."""
        d = ops.get(op)
        if (d.leaf and not ops.constant_leaf(op)) or op in ("weight", "opaque"):
            raise RuleError(f"a rewrite cannot build a {op!r} node")
        try:
            frozen = tuple((k, _canon(attrs[k])) for k in d.attr_names)
        except KeyError as exc:
            raise RuleError(f"{op} needs attribute {exc.args[0]!r}") from None
        inputs = tuple(inputs)
        found = self.index.get((op, inputs, frozen))
        if found is not None:
            return found
        shape = ops.shape_of(op, [self.shape[j] for j in inputs], dict(frozen))
        dtype = ops.dtype_of(op, [self.dtype[j] for j in inputs], dict(frozen))
        return self._append(op, inputs, frozen, shape, dtype)

    def rebuild(self, i: int, inputs: tuple[int, ...]) -> int:
        """Node `i` over new inputs of the same shapes (no shape check needed)."""
        return self._append(self.op[i], inputs, self.attrs[i], self.shape[i], self.dtype[i])

    def lookup(self, i: int, inputs: tuple[int, ...]) -> int | None:
        """The id of node `i` rebuilt over `inputs`, if that term exists already."""
        return self.index.get((self.op[i], inputs, self.attrs[i]))

    def live(self, outputs: Outputs) -> list[int]:
        """Ids reachable from `outputs` plus every graph input, ascending (topological)."""
        seen = set(self.input_ids)
        stack = [o for _, o in outputs]
        inputs = self.inputs
        while stack:
            i = stack.pop()
            if i not in seen:
                seen.add(i)
                stack.extend(inputs[i])
        return sorted(seen)

    def graph_key(self, outputs: Outputs) -> int:
        """Structural hash of the graph with these outputs (independent of ids)."""
        return hash(tuple((name, self.mh[o]) for name, o in outputs))

    def to_graph(self, outputs: Outputs) -> Graph:
        """The IR graph with these outputs: live nodes only, renumbered, original inputs kept."""
        out = Graph(opset_imports=dict(self.opset_imports), name=self.name)
        remap: dict[int, int] = {}
        for i in self.live(outputs):
            op, attr = self.op[i], self.attr[i]
            if op == "input":
                remap[i] = out.input(attr["name"], self.shape[i], self.dtype[i])
            elif op == "weight":
                remap[i] = out.weight(self.weights[attr["name"]], attr["name"])
            else:
                if op == "opaque":
                    out.opaque[attr["key"]] = self.opaque[attr["key"]]
                remap[i] = out.add(op, [remap[j] for j in self.inputs[i]], **attr)
        out.outputs = [(name, remap[o]) for name, o in outputs]
        return out


@dataclass
class Context:
    """One live graph in a `TermGraph`: its nodes, their consumers and use counts, nodes by op."""

    store: TermGraph
    outputs: Outputs
    live: set[int] = field(init=False)
    order: list[int] = field(init=False)
    consumers: dict[int, list[int]] = field(init=False)
    uses: dict[int, int] = field(init=False)
    by_op: dict[str, list[int]] = field(init=False)
    _ancestors: dict[int, frozenset[int]] = field(init=False, default_factory=dict)
    _sorted: dict[int, tuple[int, ...]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        store = self.store
        self.order = store.live(self.outputs)
        self.live = set(self.order)
        consumers: dict[int, list[int]] = {}
        uses: dict[int, int] = dict.fromkeys(self.order, 0)
        by_op: dict[str, list[int]] = {}
        for i in self.order:
            by_op.setdefault(store.op[i], []).append(i)
            for j in store.inputs[i]:
                consumers.setdefault(j, []).append(i)
                uses[j] += 1
        for _, o in self.outputs:
            uses[o] += 1
        self.consumers, self.uses, self.by_op = consumers, uses, by_op

    def all_ancestors(self) -> None:
        """Compute `ancestors` of every live operator node at once (cheaper than one walk per node)."""
        anc = self._ancestors
        consumers, leaf = self.consumers, self.store.is_leaf
        empty: frozenset[int] = frozenset()
        for i in reversed(self.order):
            if i in anc or leaf(i):
                continue
            cons = consumers.get(i)
            anc[i] = frozenset(cons).union(*[anc[c] for c in cons]) if cons else empty

    def ancestors(self, root: int) -> frozenset[int]:
        """Live nodes that (transitively) read `root`, not including it."""
        found = self._ancestors.get(root)
        if found is None:
            seen: set[int] = set()
            stack = list(self.consumers.get(root, ()))
            consumers = self.consumers
            while stack:
                c = stack.pop()
                if c not in seen:
                    seen.add(c)
                    stack.extend(consumers.get(c, ()))
            found = self._ancestors[root] = frozenset(seen)
        return found

    def ancestors_sorted(self, root: int) -> tuple[int, ...]:
        """`ancestors(root)` in topological order."""
        found = self._sorted.get(root)
        if found is None:
            found = self._sorted[root] = tuple(sorted(self.ancestors(root)))
        return found

    def replaced(self, roots: tuple[int, ...]) -> frozenset[int]:
        """Nodes a rewrite of `roots` replaces: the roots and all their ancestors."""
        if len(roots) == 1:
            return self.ancestors(roots[0]) | {roots[0]}
        out: set[int] = set(roots)
        for r in roots:
            out |= self.ancestors(r)
        return frozenset(out)

    def forget(self) -> None:
        """Drop the ancestor cache (it can grow quadratically)."""
        self._ancestors, self._sorted = {}, {}

    def walk_up(self, start: int, path: Sequence[tuple[str, int]]) -> list[int]:
        """Live nodes from which `path` ((op, argument index) pairs from a root down) leads to `start`."""
        op, inputs = self.store.op, self.store.inputs
        cands = [start]
        for name, idx in reversed(path):
            found: dict[int, None] = {}
            for x in cands:
                for c in self.consumers.get(x, ()):
                    if op[c] == name and inputs[c][idx] == x:
                        found[c] = None
            cands = list(found)
            if not cands:
                break
        return cands


@dataclass(frozen=True, eq=False)
class Match:
    """A rule matched at `roots` (one per left pattern): tensor variables to node ids, attribute and :let values."""

    rule: Rule
    roots: tuple[int, ...]
    tensors: tuple[tuple[str, int], ...]
    env: tuple[tuple[str, Any], ...]

    @property
    def key(self) -> tuple[str, tuple[int, ...]]:
        return self.rule.name, self.roots


class _Shapes(dict):
    """Tensor shapes by variable; a :let term's shape builds the term on first use."""

    def __init__(self, inst: _Instantiator, base: Mapping[str, tuple[int, ...]]) -> None:
        super().__init__(base)
        self.inst = inst

    def __missing__(self, name: str) -> tuple[int, ...]:
        if name not in self.inst.let_terms:
            raise KeyError(name)
        shape = self.inst.store.shape[self.inst.var(name)]
        self[name] = shape
        return shape


class _Instantiator:
    """Evaluates a rule's expressions and builds its right side under one binding."""

    def __init__(self, store: TermGraph, rule: Rule, tensors: Mapping[str, int], env: Mapping[str, Any]) -> None:
        self.store = store
        self.tensors = tensors
        self.env = dict(env)
        self.let_terms = {name: v for name, v in rule.lets if isinstance(v, Term)}
        self.built: dict[str, int] = {}
        self.shapes = _Shapes(self, {v: store.shape[i] for v, i in tensors.items()})

    def expr(self, e: Any) -> Any:
        return eval_expr(e, self.env, self.shapes)

    def var(self, name: str) -> int:
        i = self.tensors.get(name)
        if i is not None:
            return i
        if name not in self.built:
            self.built[name] = self.build(self.let_terms[name])
        return self.built[name]

    def build(self, p: Any) -> int:
        if isinstance(p, Var):
            return self.var(p.name)
        inputs = [self.build(a) for a in p.args]
        attrs = {k: attr_value(self.expr(e)) for k, e in p.attrs}
        return self.store.add(p.op, inputs, attrs)


def _unify(
    store: TermGraph, p: Any, n: int, tensors: dict[str, int], env: dict[str, Any], deferred: list[tuple[Any, Any]]
) -> bool:
    """Extend the binding so that pattern `p` matches node `n`; False when it cannot."""
    if isinstance(p, Var):
        bound = tensors.get(p.name)
        if bound is None:
            tensors[p.name] = n
            return True
        return bound == n
    if store.op[n] != p.op:
        return False
    inputs = store.inputs[n]
    if len(inputs) != len(p.args):
        return False
    node_attr = store.attr[n]
    for name, e in p.attrs:
        value = node_attr[name]
        if isinstance(e, Var):
            if e.name in env:
                if env[e.name] != value:
                    return False
            else:
                env[e.name] = value
        elif isinstance(e, Lit):
            if _canon(attr_value(e.value)) != value:
                return False
        else:
            deferred.append((e, value))
    for a, c in zip(p.args, inputs):
        if not _unify(store, a, c, tensors, env, deferred):
            return False
    return True


def _depth(p: Any) -> int:
    """Levels of operator nodes in a pattern (a variable is 0, `(relu ?x)` is 1)."""
    if isinstance(p, Var):
        return 0
    return 1 + max((_depth(a) for a in p.args), default=0)


def _paths(p: Any, prefix: tuple[tuple[str, int], ...] = ()) -> dict[str, tuple[tuple[str, int], ...]]:
    """Shortest path ((op, argument index) from the root down) to each tensor variable of a pattern."""
    if isinstance(p, Var):
        return {p.name: prefix}
    out: dict[str, tuple[tuple[str, int], ...]] = {}
    for k, a in enumerate(p.args):
        for name, path in _paths(a, prefix + ((p.op, k),)).items():
            if name not in out or len(path) < len(out[name]):
                out[name] = path
    return out


@dataclass
class _Compiled:
    index: int
    rule: Rule
    symmetric: bool
    # partner[k]: how to find the root of the other pattern from a binding of pattern k: (shared variable, path
    # from the other pattern's root down to it), or None (no shared tensor variable: try every node of its op).
    partner: tuple[tuple[str, tuple[tuple[str, int], ...]] | None, ...] = ()


class Matcher:
    """Finds every match of a rule set in a live graph (optionally only matches with a root in a given set)."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)
        self._single: dict[str, list[_Compiled]] = {}
        self._multi: list[_Compiled] = []
        self._multi_by_op: tuple[dict[str, list[_Compiled]], dict[str, list[_Compiled]]] = ({}, {})
        for k, rule in enumerate(self.rules):
            if not rule.multi:
                self._single.setdefault(rule.lhs[0].op, []).append(_Compiled(k, rule, False))
                continue
            paths = [_paths(t) for t in rule.lhs]
            shared = set(paths[0]) & set(paths[1])
            partner: list[tuple[str, tuple[tuple[str, int], ...]] | None] = []
            for me in (0, 1):
                other = paths[1 - me]
                if shared:
                    var = min(sorted(shared), key=lambda v: len(other[v]))
                    partner.append((var, other[var]))
                else:
                    partner.append(None)
            c = _Compiled(k, rule, rule.symmetric, tuple(partner))
            self._multi.append(c)
            for me in (0, 1):
                self._multi_by_op[me].setdefault(rule.lhs[me].op, []).append(c)
        self._by_name = {c.rule.name: c for cs in self._single.values() for c in cs}
        self._by_name.update((c.rule.name, c) for c in self._multi)
        self.depth = max((_depth(t) for r in self.rules for t in r.lhs), default=0)

    def update(
        self, child: Context, parent_live: set[int], parent_matches: Sequence[Match], rw: Rewritten
    ) -> tuple[list[Match], dict[Match, Match]]:
        """The matches of `child`, the graph `rw` made from a parent with `parent_matches`.

        A parent match whose roots are all still live is kept. One rooted at a rebuilt ancestor farther above the
        rewritten roots than any pattern reaches is carried over (the pattern sees the same structure there, node
        ids mapped); everything else new is matched afresh. When the rewrite collapsed nodes together (which can
        create matches far above the change) every new node is matched afresh. Returns the matches and, for each
        carried-over one, the parent match it comes from.
        """
        live = child.live
        new_nodes = live - parent_live
        if rw.collapsed:
            kept = [m for m in parent_matches if all(r in live for r in m.roots)]
            return kept + self.find(child, roots=new_nodes), {}
        sub, dist, depth = rw.sub, rw.dist, self.depth
        far = {a: n for a, n in sub.items() if dist[a] >= depth}
        out: list[Match] = []
        origin: dict[Match, Match] = {}
        for m in parent_matches:
            if all(r in live for r in m.roots):
                out.append(m)
                continue
            if not all(r in live or r in far for r in m.roots):
                continue
            roots = tuple(far.get(r, r) for r in m.roots)
            tensors = tuple((v, sub.get(i, i)) for v, i in m.tensors)
            c = self._by_name[m.rule.name]
            if c.symmetric and roots[0] > roots[1]:
                continue  # found again below, in the other order
            t = Match(m.rule, roots, tensors, m.env)
            out.append(t)
            origin[t] = m
        rematch = new_nodes - set(far.values())
        pairs = self._symmetric_pairs(parent_matches, live, far)
        found = self.find(child, roots=rematch)
        for c, n1, n2 in pairs:
            got = self._match_pair(child, c, n1, n2)
            if got is not None:
                found.append(got)
        return out + found, origin

    def _symmetric_pairs(
        self, parent_matches: Sequence[Match], live: set[int], far: dict[int, int]
    ) -> list[tuple[_Compiled, int, int]]:
        """Pairs of a symmetric rule whose carried-over roots come out in the other order."""
        out = []
        for m in parent_matches:
            c = self._by_name[m.rule.name]
            if not c.symmetric or all(r in live for r in m.roots) or not all(r in live or r in far for r in m.roots):
                continue
            a, b = (far.get(r, r) for r in m.roots)
            if a > b:
                out.append((c, b, a))
        return out

    def _match_pair(self, ctx: Context, c: _Compiled, n1: int, n2: int) -> Match | None:
        """The match of multi-pattern rule `c` with its first pattern at `n1` and its second at `n2`, if any."""
        store = ctx.store
        tensors: dict[str, int] = {}
        env: dict[str, Any] = {}
        deferred: list[tuple[Any, Any]] = []
        if not (
            _unify(store, c.rule.lhs[0], n1, tensors, env, deferred)
            and _unify(store, c.rule.lhs[1], n2, tensors, env, deferred)
        ):
            return None
        return _finish(store, c.rule, (n1, n2), tensors, env, deferred)

    def find(self, ctx: Context, roots: Iterable[int] | None = None) -> list[Match]:
        """Matches in the live graph `ctx`; with `roots`, only those having a root among them.

        Results are in a deterministic order: by rule, then by roots.
        """
        store = ctx.store
        found: dict[tuple[int, tuple[int, ...]], Match] = {}
        incremental = roots is not None
        nodes = sorted(set(roots) & ctx.live) if roots is not None else ctx.order
        for n in nodes:
            op = store.op[n]
            for c in self._single.get(op, ()):
                m = self._match_single(store, c, n)
                if m is not None:
                    found[(c.index, m.roots)] = m
            for me in (0, 1) if incremental else (0,):
                for c in self._multi_by_op[me].get(op, ()):
                    self._match_multi(ctx, c, me, n, found)
        return [found[k] for k in sorted(found)]

    def _match_single(self, store: TermGraph, c: _Compiled, n: int) -> Match | None:
        tensors: dict[str, int] = {}
        env: dict[str, Any] = {}
        deferred: list[tuple[Any, Any]] = []
        if not _unify(store, c.rule.lhs[0], n, tensors, env, deferred):
            return None
        return _finish(store, c.rule, (n,), tensors, env, deferred)

    def _match_multi(
        self, ctx: Context, c: _Compiled, me: int, n: int, found: dict[tuple[int, tuple[int, ...]], Match]
    ) -> None:
        store = ctx.store
        tensors: dict[str, int] = {}
        env: dict[str, Any] = {}
        deferred: list[tuple[Any, Any]] = []
        if not _unify(store, c.rule.lhs[me], n, tensors, env, deferred):
            return
        other = c.rule.lhs[1 - me]
        info = c.partner[me]
        cands = ctx.walk_up(tensors[info[0]], info[1]) if info is not None else ctx.by_op.get(other.op, [])
        for m in cands:
            if m == n:
                continue
            roots = (n, m) if me == 0 else (m, n)
            if c.symmetric and roots[0] > roots[1]:
                continue
            if (c.index, roots) in found:
                continue
            t2, e2, d2 = dict(tensors), dict(env), list(deferred)
            if not _unify(store, other, m, t2, e2, d2):
                continue
            match = _finish(store, c.rule, roots, t2, e2, d2)
            if match is not None:
                found[(c.index, roots)] = match


def _finish(
    store: TermGraph,
    rule: Rule,
    roots: tuple[int, ...],
    tensors: dict[str, int],
    env: dict[str, Any],
    deferred: list[tuple[Any, Any]],
) -> Match | None:
    """Check computed left-side attributes, evaluate :let values and guards; the match, or None."""
    inst = _Instantiator(store, rule, tensors, env)
    try:
        for name, value in rule.lets:
            if not isinstance(value, Term):
                inst.env[name] = inst.expr(value)
        for e, value in deferred:
            if _canon(attr_value(inst.expr(e))) != value:
                return None
        for g in rule.guards:
            if not inst.expr(g):
                return None
    except (ops.ShapeError, *_EVAL_ERRORS):
        return None
    return Match(rule, roots, tuple(tensors.items()), tuple(inst.env.items()))


@cache
def rhs_tensor_vars(rule: Rule) -> frozenset[str]:
    """Left-side tensor variables the right side reads (directly or through :let terms)."""
    lets = {name: v for name, v in rule.lets if isinstance(v, Term)}
    tensors = set(rule.tensor_vars())
    found: set[str] = set()
    done: set[str] = set()

    def visit(p: Any) -> None:
        if isinstance(p, Var):
            if p.name in tensors:
                found.add(p.name)
            elif p.name in lets and p.name not in done:
                done.add(p.name)
                visit(lets[p.name])
        elif isinstance(p, Term):
            for a in p.args:
                visit(a)

    for p in rule.rhs:
        visit(p)
    return frozenset(found)


def build_rhs(store: TermGraph, match: Match) -> tuple[int, ...]:
    """Build the match's right side in `store`; the new root ids, one per left root.

    Raises NotApplicable when a node is ill-typed or an expression does not evaluate.
    """
    inst = _Instantiator(store, match.rule, dict(match.tensors), dict(match.env))
    try:
        return tuple(inst.build(p) for p in match.rule.rhs)
    except ops.ShapeError as exc:
        raise NotApplicable(f"ill-typed right side: {exc}") from None
    except _EVAL_ERRORS as exc:
        raise NotApplicable(f"right side does not evaluate: {exc!r}") from None


@dataclass
class Rewritten:
    """A graph with a match applied, and how its nodes relate to the graph before."""

    outputs: Outputs
    sub: dict[int, int]  # each replaced node (matched root or ancestor) -> its replacement
    dist: dict[int, int]  # each replaced node -> its distance (in edges) above the nearest matched root
    collapsed: bool  # a replacement coincides with a node the graph had, or two replacements coincide


def rewrite_mapped(ctx: Context, match: Match) -> Rewritten:
    """The graph `ctx` with `match` applied: right side built, the roots' ancestors rebuilt over it.

    Raises NotApplicable for an ill-typed right side, a rewrite that would make a cycle, or a no-op.
    """
    store = ctx.store
    roots, new_roots = effective_roots(match.roots, build_rhs(store, match))
    replaced = ctx.replaced(roots)
    if not roots or any(r in replaced for r in new_roots) or reads_replaced(match, replaced):
        raise NotApplicable("the rewrite leaves the graph unchanged or makes a cycle")
    sub = dict(zip(roots, new_roots))
    dist = dict.fromkeys(roots, 0)
    for a in sorted(replaced):
        if a not in sub:
            ins = store.inputs[a]
            sub[a] = store.rebuild(a, tuple(sub.get(i, i) for i in ins))
            dist[a] = 1 + min(dist[i] for i in ins if i in dist)
    values = list(sub.values())
    collapsed = len(set(values)) < len(values) or any(v in ctx.live for v in values)
    return Rewritten(tuple((name, sub.get(o, o)) for name, o in ctx.outputs), sub, dist, collapsed)


def effective_roots(roots: tuple[int, ...], new_roots: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The matched roots a rewrite really replaces, and their replacements (a multi-pattern rule may give one of its
    roots back unchanged)."""
    pairs = [(r, n) for r, n in zip(roots, new_roots) if r != n]
    return tuple(r for r, _ in pairs), tuple(n for _, n in pairs)


def reads_replaced(match: Match, replaced: frozenset[int] | set[int]) -> bool:
    """Whether the match's right side reads a binding that the rewrite replaces (the graph would get a cycle)."""
    tensors = dict(match.tensors)
    return any(tensors[v] in replaced for v in rhs_tensor_vars(match.rule))


def rewrite(ctx: Context, match: Match) -> Outputs:
    """The outputs of the graph `ctx` with `match` applied (see `rewrite_mapped`)."""
    return rewrite_mapped(ctx, match).outputs


def find_matches(graph: Graph, rules: Sequence[Rule] | None = None) -> list[Match]:
    """Every match of `rules` (default: those `select_rules` picks for the graph's ops) in the live graph.

    Node ids in the matches are the graph's own.
    """
    store = TermGraph(graph)
    ctx = Context(store, tuple(graph.outputs))
    if rules is None:
        rules = select_rules({store.op[i] for i in ctx.order})
    return Matcher(rules).find(ctx)


def apply_match(graph: Graph, match: Match) -> Graph | None:
    """A new graph: `graph` with `match` (from `find_matches` on this graph) applied and dead nodes dropped.

    None when the match does not apply (ill-typed right side, a cycle, or no change).
    """
    store = TermGraph(graph)
    ctx = Context(store, tuple(graph.outputs))
    try:
        outputs = rewrite(ctx, match)
    except NotApplicable:
        return None
    return store.to_graph(outputs)


__all__ = [
    "Context",
    "Match",
    "Matcher",
    "NotApplicable",
    "TermGraph",
    "apply_match",
    "build_rhs",
    "find_matches",
    "Rewritten",
    "effective_roots",
    "reads_replaced",
    "rewrite",
    "rewrite_mapped",
    "rhs_tensor_vars",
]
