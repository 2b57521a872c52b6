"""The rule verifier: both sides of every rule, evaluated with numpy on random tensors, must agree.

For each rule the verifier derives bindings that satisfy the rule's left side and guards, then compares the left and
right sides numerically:

1. Ranks. Every tensor position of the left side gets a rank; operators tie them (element-wise operands share a
   rank, conv operands are 4-D, ...). Ranks left free are enumerated (1 to 4) or sampled.
2. Attributes. Attribute variables defined by an equality guard (`(= ?a (- (rank ?x) 1))`, `(= ?n (dim ?x ?a))`)
   are derived; slice starts and sizes, reshape targets and enlarge sizes are solved with the shapes; every other
   attribute variable is enumerated over a small domain that depends on where it occurs (activation codes, axes
   below the rank, every permutation, groups, strides, pads, dilations, pooling windows, epsilons). Every
   combination of enumerated values is tried.
3. Dimensions. Each tensor position gets symbolic dimensions; operators and equality guards add equations between
   them (inner dims of a matmul agree, a concat's axis dim is the sum, a conv's input channels are the weight's times
   the group, a slice fits inside its input). A small solver unifies equal symbols, defines a symbol by a linear
   equation where it can, and samples the rest; remaining equations are checked after sampling. Element-wise and
   batch dims are sometimes broadcast (set to 1 on one side) so guards against broadcasting are exercised.
4. Checks. A sample whose left side is ill-typed or whose guards fail is rejected and resampled. Where the guards
   hold, the right side must be well-typed and of the left side's shape (a failure, not a rejection), and the values
   must agree: to 1e-9 in float64, and exactly on integer tensors (as TASO's fingerprints) when every operator the
   rule uses is exact on integers.

A rule that cannot be instantiated at all fails: an unverifiable rule never passes silently.

What the verifier knows about each operator (its ranks, shape equations, attribute domains, the attributes solved
with the shapes, exactness on integers) is declared with the operator, in its `tensat.ops.OpDef`.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from tensat import ops

from . import all_rules
from .dsl import (
    Call,
    Evaluation,
    Lit,
    Pattern,
    Rule,
    Term,
    Var,
    attr_value,
    bind_lets,
    eval_expr,
    guards_hold,
    inline_lets,
)
from .workers import Workers

MAX_RANK = 4
FLOAT_SCALES = (0.25, 1.0, 4.0, 16.0)  # the spreads of the random tensors each binding is checked at
# the least magnitude drawn for an input an op takes positive or nonzero: small enough that a reciprocal crosses a
# clip's bound of 6, so that a rule true only away from zero is caught
SAMPLE_FLOOR = 0.05
SPREADS = (*FLOAT_SCALES, None)  # the float spreads, then small whole numbers (None), which hold zeros and ties


def draw(rng: np.random.Generator, shape: tuple[int, ...], scale: float | None) -> np.ndarray:
    """Random float64 values of `shape` at one of `SPREADS`: normal of spread `scale`, or small whole numbers."""
    if scale is None:
        return rng.integers(-2, 3, size=shape).astype(np.float64)
    return scale * rng.standard_normal(shape)


def away_from_zero(values: np.ndarray, positive: bool) -> np.ndarray:
    """Random `values` moved at least `SAMPLE_FLOOR` from zero, for an input an op takes positive (`OpDef.positive`:
    made positive) or nonzero (`OpDef.nonzero`, a divisor: each keeps its sign, which a rule must not assume)."""
    if positive:
        return np.abs(values) + SAMPLE_FLOOR
    return values + np.where(values < 0, -SAMPLE_FLOOR, SAMPLE_FLOOR)


def draw_leaves(
    rng: np.random.Generator,
    shapes: Mapping[str, tuple[int, ...]],
    scale: float | None,
    positive: set[str],
    nonzero: set[str],
) -> dict[str, np.ndarray]:
    """One draw (`draw`) per leaf of `shapes`, in its order, those of `positive` or `nonzero` moved away from zero
    (`away_from_zero`; `kept_from_zero` names them)."""
    out = {}
    for v, shape in shapes.items():
        drawn = draw(rng, shape, scale)
        out[v] = away_from_zero(drawn, v in positive) if v in positive or v in nonzero else drawn
    return out


def kept_from_zero(patterns: Iterable[Pattern]) -> tuple[set[str], set[str]]:
    """The variables that an op of `patterns` takes, as themselves, positive (`OpDef.positive`), and those taken only
    nonzero (`OpDef.nonzero`): drawn away from zero (`away_from_zero`). A rule's are its left side's, which the graph
    already computes: one whose right side alone takes a logarithm of ?x must hold where ?x is negative."""
    positive: set[str] = set()
    nonzero: set[str] = set()
    stack = list(patterns)
    while stack:
        p = stack.pop()
        if isinstance(p, Var):
            continue
        d = ops.get(p.op)
        positive |= {a.name for k, a in enumerate(p.args) if k in d.positive and isinstance(a, Var)}
        nonzero |= {a.name for k, a in enumerate(p.args) if k in d.nonzero and isinstance(a, Var)}
        stack.extend(p.args)
    return positive, nonzero - positive


class Reject(Exception):
    """This sample (or attribute combination) does not instantiate the rule."""


class Inadmissible(Reject):
    """An op's shape equations reject the rank assignment and attribute values (`Equations.reject`: a slice's axis
    beyond the rank, a reduction's output of another rank): every sample of the combination would be rejected."""


class _Unbound(Reject):
    """An attribute variable not known yet."""


@dataclass
class VerifyResult:
    """The verdict on one rule."""

    rule: str
    ok: bool
    cases: int = 0  # bindings compared (float64)
    int_cases: int = 0  # bindings compared exactly on integer tensors
    combos: int = 0  # attribute combinations (with ranks) instantiated at least once
    inadmissible: int = 0  # combinations no valid binding was found for (the guards or shapes exclude them)
    message: str = ""
    counterexample: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """One line for `tensat rules --verify`."""
        status = "ok  " if self.ok else "FAIL"
        text = (
            f"{status} {self.rule:40s} {self.cases:4d} float64, {self.int_cases:4d} int64 cases, "
            f"{self.combos} attribute combinations ({self.inadmissible} not admitted)"
        )
        return text + (f": {self.message}" if self.message else "")


# ---------------------------------------------------------------------------------------------------------------
# A small solver over integer symbols: union-find for equalities, definitions by expressions, linear solving.


class Sym:
    """An integer unknown."""

    __slots__ = ("id",)

    def __init__(self, ident: int) -> None:
        self.id = ident

    def __repr__(self) -> str:
        return f"s{self.id}"


@dataclass(frozen=True)
class Ex:
    """An expression over symbols: `fn` applied to the values of `args` (symbols, ints, tuples, expressions)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    linear: tuple[tuple[tuple[Any, int], ...], int] | None = None  # ((term, coefficient)...), constant


def lin(terms: Sequence[tuple[Any, int]], const: int = 0) -> Ex:
    """sum(coef * term) + const."""
    terms = tuple((t, c) for t, c in terms if c)

    def fn(*vals: int) -> int:
        return const + sum(c * v for (_, c), v in zip(terms, vals))

    return Ex(fn, tuple(t for t, _ in terms), (terms, const))


def add(*xs: Any) -> Any:
    """Sum of ints, symbols and expressions."""
    const = sum(x for x in xs if isinstance(x, int))
    others = [(x, 1) for x in xs if not isinstance(x, int)]
    return lin(others, const) if others else const


def sub(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return a - b
    terms = [] if isinstance(a, int) else [(a, 1)]
    terms += [] if isinstance(b, int) else [(b, -1)]
    return lin(terms, (a if isinstance(a, int) else 0) - (b if isinstance(b, int) else 0))


def mul(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if isinstance(a, int):
        return lin([(b, a)])
    if isinstance(b, int):
        return lin([(a, b)])
    return Ex(lambda x, y: x * y, (a, b))


def _symbolic(x: Any) -> bool:
    if isinstance(x, tuple):
        return any(_symbolic(a) for a in x)
    return isinstance(x, (Sym, Ex))


def apply(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn` of the arguments, now if they are all known, else as an expression."""
    if not any(_symbolic(a) for a in args):
        return fn(*args)
    return Ex(fn, args)


class Solver:
    """Integer unknowns with equations; `sample` assigns values satisfying them (or raises Reject)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.parent: list[int] = []
        self.lo: list[int] = []
        self.hi: list[int] = []
        self.slack: list[bool] = []
        self.defn: dict[int, Any] = {}
        self.checks: list[tuple[Any, Any]] = []
        self.values: dict[int, int] = {}
        self._busy: set[int] = set()

    def sym(self, lo: int = 1, hi: int = 4, slack: bool = False) -> Sym:
        self.parent.append(len(self.parent))
        self.lo.append(lo)
        self.hi.append(hi)
        self.slack.append(slack)
        return Sym(len(self.parent) - 1)

    def root(self, s: Sym) -> int:
        i = s.id
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def hint(self, x: Any, lo: int, hi: int) -> None:
        """Narrow the sampling range of a symbol."""
        if isinstance(x, Sym):
            r = self.root(x)
            self.lo[r], self.hi[r] = max(self.lo[r], lo), max(min(self.hi[r], hi), max(self.lo[r], lo))

    def _deps(self, x: Any, seen: set[int]) -> None:
        if isinstance(x, Sym):
            r = self.root(x)
            if r not in seen:
                seen.add(r)
                if r in self.defn:
                    self._deps(self.defn[r], seen)
        elif isinstance(x, Ex):
            for a in x.args:
                self._deps(a, seen)
        elif isinstance(x, tuple):
            for a in x:
                self._deps(a, seen)

    def _linear(self, x: Any, depth: int = 0) -> tuple[dict[int, int], int] | None:
        """x as {root: coefficient} + constant, expanding defined symbols; None if not linear."""
        if isinstance(x, int):
            return {}, x
        if isinstance(x, Sym):
            r = self.root(x)
            if r in self.defn and depth < 50:
                got = self._linear(self.defn[r], depth + 1)
                if got is not None:
                    return got
            return {r: 1}, 0
        if isinstance(x, Ex) and x.linear is not None:
            terms, const = x.linear
            out: dict[int, int] = {}
            total = const
            for t, c in terms:
                got = self._linear(t, depth + 1)
                if got is None:
                    return None
                coefs, k = got
                total += c * k
                for r, cc in coefs.items():
                    out[r] = out.get(r, 0) + c * cc
            return {r: c for r, c in out.items() if c}, total
        return None

    def eq(self, a: Any, b: Any) -> None:
        """Require a == b."""
        if isinstance(a, tuple) or isinstance(b, tuple):
            if not (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)):
                raise Reject("vector lengths differ")
            for x, y in zip(a, b):
                self.eq(x, y)
            return
        if isinstance(a, int) and isinstance(b, int):
            if a != b:
                raise Reject(f"{a} != {b}")
            return
        if isinstance(b, Sym) and not isinstance(a, Sym):
            a, b = b, a
        if isinstance(a, Sym) and isinstance(b, Sym):
            ra, rb = self.root(a), self.root(b)
            if ra == rb:
                return
            da, db = self.defn.get(ra), self.defn.get(rb)
            if da is not None and db is not None:
                self._union(ra, rb)
                self.defn.pop(rb)
                self._check(da, db)
                return
            keep, drop = (ra, rb) if da is not None or db is None else (rb, ra)
            if keep in self.defn:
                seen: set[int] = set()
                self._deps(self.defn[keep], seen)
                if drop in seen:
                    self._check(Sym(keep), Sym(drop))
                    return
            self._union(keep, drop)
            return
        if isinstance(a, Sym):
            r = self.root(a)
            if r not in self.defn:
                seen = set()
                self._deps(b, seen)
                if r not in seen:
                    self.defn[r] = b
                    return
        self._check(a, b)

    def _union(self, keep: int, drop: int) -> None:
        self.parent[drop] = keep
        self.lo[keep] = max(self.lo[keep], self.lo[drop])
        self.hi[keep] = max(min(self.hi[keep], self.hi[drop]), self.lo[keep])
        self.slack[keep] = self.slack[keep] and self.slack[drop]

    def _check(self, a: Any, b: Any) -> None:
        """a == b where neither side is a free symbol: solve for a free symbol if linear, else check later."""
        la, lb = self._linear(a), self._linear(b)
        if la is not None and lb is not None:
            coefs = dict(la[0])
            for r, c in lb[0].items():
                coefs[r] = coefs.get(r, 0) - c
            const = la[1] - lb[1]
            coefs = {r: c for r, c in coefs.items() if c}
            if not coefs:
                if const != 0:
                    raise Reject("inconsistent equations")
                return
            free = [r for r, c in coefs.items() if abs(c) == 1 and r not in self.defn]
            free.sort(key=lambda r: (not self.slack[r], r))
            for r in free:
                c = coefs[r]
                rest = [(Sym(q), -cq * c) for q, cq in coefs.items() if q != r]
                expr = lin(rest, -const * c)
                seen: set[int] = set()
                self._deps(expr, seen)
                if r not in seen:
                    self.defn[r] = expr
                    return
        self.checks.append((a, b))

    def value(self, x: Any) -> Any:
        """The sampled value of a symbol or expression (sampling free symbols on first use)."""
        if isinstance(x, Sym):
            r = self.root(x)
            if r in self.values:
                return self.values[r]
            if r in self._busy:
                raise Reject("cyclic definitions")
            if r in self.defn:
                self._busy.add(r)
                v = self.value(self.defn[r])
                self._busy.discard(r)
                if not isinstance(v, int) or v < self.lo[r]:
                    raise Reject(f"derived value {v} below {self.lo[r]}")
            else:
                v = self.rng.randint(self.lo[r], self.hi[r])
            self.values[r] = v
            return v
        if isinstance(x, Ex):
            return x.fn(*[self.value(a) for a in x.args])
        if isinstance(x, tuple):
            return tuple(self.value(a) for a in x)
        return x

    def finish(self) -> None:
        """Check the equations left over after sampling."""
        for a, b in self.checks:
            if self.value(a) != self.value(b):
                raise Reject("equation does not hold")


# ---------------------------------------------------------------------------------------------------------------
# Rule analysis


@dataclass
class _Slot:
    """A tensor position of the left side: a variable (shared) or an operator occurrence."""

    key: str
    term: Term | None


def _slots(rule: Rule) -> tuple[dict[str, _Slot], list[tuple[str, Term, list[str]]]]:
    """Every tensor position, and every operator occurrence as (slot key, term, argument slot keys)."""
    slots: dict[str, _Slot] = {}
    terms: list[tuple[str, Term, list[str]]] = []

    def visit(p: Pattern) -> str:
        if isinstance(p, Var):
            slots.setdefault(p.name, _Slot(p.name, None))
            return p.name
        args = [visit(a) for a in p.args]
        key = f"#{len(terms)}"
        slots[key] = _Slot(key, p)
        terms.append((key, p, args))
        return key

    for t in rule.lhs:
        visit(t)
    return slots, terms


def _expr_vars(e: Any) -> set[str]:
    if isinstance(e, Var):
        return {e.name}
    if isinstance(e, Call):
        return set().union(*[_expr_vars(a) for a in e.args]) if e.args else set()
    return set()


def _mentions_shapes(e: Any, dim_vars: set[str]) -> bool:
    if isinstance(e, Var):
        return e.name in dim_vars
    if isinstance(e, Call):
        if e.fn in ("dim", "shape", "same-shape", "same-except"):
            return True
        return any(_mentions_shapes(a, dim_vars) for a in e.args)
    return False


def _all_patterns(rule: Rule) -> Iterable[Term]:
    stack: list[Any] = [*rule.lhs, *rule.rhs, *(v for _, v in rule.lets if isinstance(v, Term))]
    while stack:
        p = stack.pop()
        if isinstance(p, Term):
            yield p
            stack.extend(p.args)


class _Plan:
    """What the verifier needs to know about a rule, computed once."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.slots, self.terms = _slots(rule)
        self.tensor_vars = rule.tensor_vars()
        lets_terms = {n: v for n, v in rule.lets if isinstance(v, Term)}
        self.evaluation = Evaluation([*rule.lhs, *rule.rhs], self.tensor_vars, lets_terms)  # left sides, then right
        # attribute variables and where they occur
        self.contexts: dict[str, tuple[str, str, str]] = {}  # var -> (op, attr, slot key)
        for key, t, _ in self.terms:
            for name, e in t.attrs:
                if isinstance(e, Var):
                    self.contexts.setdefault(e.name, (t.op, name, key))
        lets = {n for n, _ in rule.lets}
        # guard definitions: (= ?v E) with E free of ?v (integer :let variables inlined)
        self.defs: dict[str, Any] = {}
        self.other_guards: list[Call] = []
        for g in (inline_lets(g, rule.lets) for g in rule.guards):
            if g.fn == "=":
                a, b = g.args
                for v, e in ((a, b), (b, a)):
                    if (
                        isinstance(v, Var)
                        and v.name in self.contexts
                        and v.name not in self.defs
                        and v.name not in _expr_vars(e)
                        and not (_expr_vars(e) & lets)
                    ):
                        self.defs[v.name] = e
                        break
                else:
                    self.other_guards.append(g)
            else:
                self.other_guards.append(g)
        # settle which definitions depend on shapes (solved symbolically) and which only on ranks/attributes
        shape_vars = {
            v for v, (op, attr, _) in self.contexts.items() if attr in ops.get(op).solved and v not in self.defs
        }
        changed = True
        while changed:
            changed = False
            for v, e in self.defs.items():
                if v not in shape_vars and _mentions_shapes(e, shape_vars):
                    shape_vars.add(v)
                    changed = True
        self.shape_vars = shape_vars
        # in the rule's order, not the set's: the solver draws as it meets them, and a set of names iterates in an
        # order that changes with the process's string hashing
        self.shape_order = [v for v in self.contexts if v in shape_vars]
        self.enumerated = [v for v in self.contexts if v not in self.defs and v not in shape_vars]
        self.rank_defs = [v for v in self.defs if v not in shape_vars]
        self.positive_vars, self.nonzero_vars = kept_from_zero(rule.lhs)
        patterns = list(_all_patterns(rule))
        self.int_possible = all(ops.get(t.op).int_exact for t in patterns)
        # attribute values an int-exact op needs to stay exact (conv2d's fused activation: none or relu)
        self.int_conditions = [
            (dict(t.attrs)[name], allowed)
            for t in patterns
            for name, allowed in ops.get(t.op).int_exact_if.items()
            if name in dict(t.attrs)
        ]

    # -- ranks ----------------------------------------------------------------------------------------------------

    def rank_assignments(self, rng: random.Random, limit: int = 12) -> list[dict[str, int]]:
        """Rank per slot: constraint propagation, then every (or a sample of) assignment of the free classes."""
        parent = {k: k for k in self.slots}
        fixed: dict[str, int] = {}
        low: dict[str, int] = {}

        def find(k: str) -> str:
            while parent[k] != k:
                k = parent[k]
            return k

        def same(a: str, b: str) -> None:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[rb] = ra

        def fix(a: str, r: int) -> None:
            fixed.setdefault(a, r)
            if fixed[a] != r:
                fixed[a] = -1

        for key, t, args in self.terms:
            d = ops.get(t.op)
            if d.ranks is None:
                continue
            for slot, rank in zip([key, *args], d.ranks):
                if rank is None:
                    continue
                if rank == ops.SAME:
                    same(key, slot)
                else:
                    fix(slot, rank)
            if d.min_rank > 1:
                low[key] = d.min_rank
        for g in self.rule.guards:
            if g.fn in ("same-shape", "same-except") and all(isinstance(a, Var) for a in g.args[:2]):
                same(g.args[0].name, g.args[1].name)  # type: ignore[union-attr]
            if g.fn == "=" and len(g.args) == 2:
                for a, b in (g.args, g.args[::-1]):
                    if isinstance(a, Call) and a.fn == "rank" and isinstance(a.args[0], Var) and isinstance(b, Lit):
                        fix(a.args[0].name, int(b.value))
        classes: dict[str, list[str]] = {}
        for k in self.slots:
            classes.setdefault(find(k), []).append(k)
        choices: list[list[int]] = []
        roots = list(classes)
        for r in roots:
            members = classes[r]
            values = {fixed[m] for m in members if m in fixed}
            if len(values) > 1 or -1 in values:
                return []
            lo = max([1] + [low.get(m, 1) for m in members])
            choices.append(sorted(values) if values else list(range(lo, MAX_RANK + 1)))
        combos = list(itertools.product(*choices))
        if len(combos) > limit:
            combos = rng.sample(combos, limit)
        return [{k: combo[i] for i, r in enumerate(roots) for k in classes[r]} for combo in combos]

    # -- attributes -----------------------------------------------------------------------------------------------

    def attr_combos(self, ranks: dict[str, int]) -> list[dict[str, Any]]:
        """Every combination of the enumerated attribute variables' domains (domains may depend on ranks)."""
        domains = []
        for v in self.enumerated:
            op, attr, key = self.contexts[v]
            domain = ops.get(op).domains.get(attr)
            if domain is None:
                raise Reject(f"no domain for attribute :{attr} of {op}")
            domains.append(list(domain(ranks[key]) if callable(domain) else domain))
        return [dict(zip(self.enumerated, combo)) for combo in itertools.product(*domains)]

    def derive_rank_defs(self, env: dict[str, Any], ranks: dict[str, int]) -> None:
        """Values of attribute variables defined by rank-level guards (`(= ?a (- (rank ?x) 1))`)."""
        shapes = {v: (1,) * ranks[v] for v in self.tensor_vars}
        pending = list(self.rank_defs)
        for _ in range(len(pending) + 1):
            left = []
            for v in pending:
                try:
                    env[v] = attr_value(eval_expr(self.defs[v], env, shapes))
                except KeyError:
                    left.append(v)
                except (IndexError, ZeroDivisionError, ValueError, TypeError) as exc:
                    raise Reject(f"cannot derive ?{v}: {exc}") from None
            pending = left
        if pending:
            raise Reject(f"cannot derive {pending}")

    def prefilter(self, env: dict[str, Any], ranks: dict[str, int]) -> bool:
        """Guards that depend only on ranks and known attributes."""
        shapes = {v: (1,) * ranks[v] for v in self.tensor_vars}
        known = set(env) | set(self.tensor_vars)
        for g in self.other_guards:
            if _mentions_shapes(g, self.shape_vars) or not _expr_vars(g) <= known:
                continue
            try:
                if not eval_expr(g, env, shapes):
                    return False
            except (IndexError, ZeroDivisionError, ValueError, TypeError, KeyError):
                return False
        return True


# ---------------------------------------------------------------------------------------------------------------
# Building one sample


class _Builder:
    """Symbolic shapes and attributes for one sample of a rule under fixed ranks and enumerated attributes."""

    def __init__(
        self,
        plan: _Plan,
        ranks: dict[str, int],
        env: dict[str, Any],
        rng: random.Random,
        forced: tuple[int, int, int] | None = None,
    ) -> None:
        self.plan, self.ranks, self.rng, self.forced = plan, ranks, rng, forced
        self.sites: list[int] = []  # the number of dims of each broadcast, in the order the ops ask for them
        self.s = Solver(rng)
        self.dims = {k: tuple(self.s.sym(1, 4) for _ in range(ranks[k])) for k in plan.slots}
        self.attrs: dict[str, Any] = dict(env)
        for v in plan.shape_order:
            if v in plan.defs:
                continue
            op, attr, key = plan.contexts[v]
            self.attrs[v] = ops.get(op).solved[attr](self, self.dims[key])
        pending = [v for v in plan.shape_order if v in plan.defs]
        for _ in range(len(pending) + 1):
            left = []
            for v in pending:
                try:
                    self.attrs[v] = self.value_of(plan.defs[v])
                except _Unbound:
                    left.append(v)
            pending = left
        if pending:
            raise Reject(f"cannot derive {pending}")

    def value_of(self, e: Any) -> Any:
        """A DSL expression as a solver value (int, tuple, symbol or expression)."""
        if isinstance(e, Lit):
            return e.value
        if isinstance(e, Var):
            if e.name in self.attrs:
                return self.attrs[e.name]
            raise _Unbound(e.name)
        fn, args = e.fn, e.args
        if fn in ("dim", "rank", "shape"):
            key = args[0].name
            dims = self.dims[key]
            if fn == "rank":
                return len(dims)
            if fn == "shape":
                return dims
            i = self.value_of(args[1])
            if not isinstance(i, int):
                raise Reject("symbolic dim index")
            if isinstance(args[1], Lit) and i < 0:
                i += len(dims)
            if not 0 <= i < len(dims):
                raise Reject("dim index out of range")
            return dims[i]
        vals = [self.value_of(a) for a in args]
        if fn == "vec":
            return tuple(vals)
        if fn == "ones":
            if not isinstance(vals[0], int):
                raise Reject("symbolic rank")
            return (1,) * vals[0]
        if fn == "vec-set":
            v, i, x = vals
            if not isinstance(v, tuple) or not isinstance(i, int) or not 0 <= i < len(v):
                raise Reject("vec-set out of range")
            return v[:i] + (x,) + v[i + 1 :]
        if fn == "vec-get":
            v, i = vals
            if isinstance(v, tuple) and isinstance(i, int):
                if not 0 <= i < len(v):
                    raise Reject("vec-get out of range")
                return v[i]
            return apply(lambda vv, ii: vv[ii] if 0 <= ii < len(vv) else _raise(), v, i)
        if fn == "+":
            return add(*vals)
        if fn == "-":
            return sub(*vals)
        if fn == "*":
            return mul(*vals)
        if fn == "/":
            return apply(lambda a, b: _tdiv(a, b), *vals)
        if fn == "%":
            return apply(lambda a, b: a - b * _tdiv(a, b), *vals)
        if fn in ("min", "max"):
            return apply(min if fn == "min" else max, *vals)
        raise Reject(f"cannot solve with {fn}")

    def _is_one(self, x: Any) -> bool:
        return isinstance(x, Sym) and self.s.defn.get(self.s.root(x)) == 1

    # -- tensat.ops.Equations: what the ops' `equations` ask for -------------------------------------------------

    def sym(self, lo: int = 1, hi: int = 4, slack: bool = False) -> Sym:
        return self.s.sym(lo, hi, slack)

    def eq(self, a: Any, b: Any) -> None:
        self.s.eq(a, b)

    def hint(self, x: Any, lo: int, hi: int) -> None:
        self.s.hint(x, lo, hi)

    def add(self, *xs: Any) -> Any:
        return add(*xs)

    def mul(self, a: Any, b: Any) -> Any:
        return mul(a, b)

    def prod(self, xs: Sequence[Any]) -> Any:
        return _prod(xs)

    def quotient(self, a: Any, b: Any) -> Any:
        return apply(_exact_quotient, a, b)

    def apply(self, fn: Callable[..., Any], *args: Any) -> Any:
        return apply(fn, *args)

    def reject(self, why: str) -> NoReturn:
        raise Inadmissible(why)

    def broadcast(self, out: Sequence[Sym], a: Sequence[Sym], b: Sequence[Sym], dims: Iterable[int]) -> None:
        """Broadcasting operands: equal dims, except where one side is already 1 or is picked to be 1 (at random, or
        where the sample is `forced`: (broadcast, its dim, which operand))."""
        dims = list(dims)
        site, pick, side = len(self.sites), None, None
        self.sites.append(len(dims))
        if self.forced is None:
            pick = self.rng.choice(dims) if dims and self.rng.random() < 0.3 else None
        elif self.forced[0] == site:
            pick, side = dims[self.forced[1]], self.forced[2] == 0
        for i in dims:
            if self._is_one(a[i]) or self._is_one(b[i]) or i == pick:
                if self._is_one(a[i]):
                    one, other = a, b
                elif self._is_one(b[i]):
                    one, other = b, a
                else:
                    first = self.rng.random() < 0.5 if side is None else side
                    one, other = (a, b) if first else (b, a)
                    if side is not None:
                        self.s.hint(out[i], 2, 4)
                self.s.eq(one[i], 1)
                self.s.eq(other[i], out[i])
            else:
                self.s.eq(a[i], out[i])
                self.s.eq(b[i], out[i])

    def structure(self) -> None:
        """Equations from every operator of the left side (each op's `equations`, see `tensat.ops.Equations`)."""
        for key, t, args in self.plan.terms:
            equations = ops.get(t.op).equations
            if equations is None:
                raise Reject(f"no shape equations for {t.op}")
            equations(
                self, self.dims[key], [self.dims[a] for a in args], {name: self.value_of(e) for name, e in t.attrs}
            )

    def guards(self) -> None:
        """Equality guards as equations."""
        for g in self.plan.other_guards:
            try:
                if g.fn == "same-shape":
                    a, b = (self.dims[x.name] for x in g.args)  # type: ignore[union-attr]
                    if len(a) != len(b):
                        raise Reject("ranks differ")
                    self.s.eq(a, b)
                elif g.fn == "same-except":
                    a, b = (self.dims[x.name] for x in g.args[:2])  # type: ignore[union-attr]
                    ax = self.value_of(g.args[2])
                    if isinstance(g.args[2], Lit) and isinstance(ax, int) and ax < 0:
                        ax += len(a)
                    if len(a) != len(b) or not isinstance(ax, int):
                        raise Reject("same-except")
                    for i in range(len(a)):
                        if i != ax:
                            self.s.eq(a[i], b[i])
                elif g.fn == "=":
                    self.s.eq(self.value_of(g.args[0]), self.value_of(g.args[1]))
            except (KeyError, AttributeError):
                continue

    def sample(self) -> tuple[dict[str, tuple[int, ...]], dict[str, Any]]:
        """Concrete shapes of the tensor variables and values of the attribute variables."""
        shapes = {v: tuple(self.s.value(d) for d in self.dims[v]) for v in self.plan.tensor_vars}
        attrs = {
            k: attr_value(self.s.value(v)) if isinstance(v, (tuple, Sym, Ex)) else v for k, v in self.attrs.items()
        }
        for v in self.plan.contexts:
            if v not in attrs:
                raise Reject(f"?{v} unbound")
        self.s.finish()
        return shapes, attrs


def _raise() -> Any:
    raise Reject("index out of range")


def _tdiv(a: int, b: int) -> int:
    if b == 0:
        raise Reject("division by zero")
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _prod(xs: Sequence[Any]) -> Any:
    out: Any = 1
    for x in xs:
        out = mul(out, x) if isinstance(out, int) and isinstance(x, int) else Ex(lambda a, b: a * b, (out, x))
    return out


def _exact_quotient(a: int, b: int) -> int:
    if b == 0 or a % b:
        raise Reject("reshape sizes do not divide")
    return a // b


# ---------------------------------------------------------------------------------------------------------------
# Checking one binding


def pattern_shape(
    p: Pattern, shapes: dict[str, tuple[int, ...]], env: dict[str, Any], lets: dict[str, Any]
) -> tuple[int, ...]:
    """Shape of a pattern under bindings: tensor shapes, attribute values, `:let` terms (ops.ShapeError if
    ill-typed)."""
    if isinstance(p, Var):
        if p.name in shapes:
            return shapes[p.name]
        return pattern_shape(lets[p.name], shapes, env, lets)
    ins = [pattern_shape(a, shapes, env, lets) for a in p.args]
    attrs = {k: attr_value(eval_expr(e, env, shapes)) for k, e in p.attrs}
    return ops.shape_of(p.op, ins, attrs)


class _Failure(Exception):
    """The rule is wrong on this binding."""

    binding: dict[str, Any] = {}


def _check_binding(
    plan: _Plan, shapes: dict[str, tuple[int, ...]], attrs: dict[str, Any], np_rng: np.random.Generator
) -> tuple[bool, bool]:
    """Compare both sides on one binding. Returns (compared, compared-as-int); raises Reject or _Failure."""
    rule = plan.rule
    ill_typed = (ops.ShapeError, IndexError, KeyError, ValueError, TypeError, ZeroDivisionError)
    try:
        env, lets = bind_lets(rule, attrs, shapes)
        leaf_shapes = {v: shapes[v] for v in plan.tensor_vars}
        evaluation, out_shapes = plan.evaluation.bind(leaf_shapes, env)
    except ill_typed as exc:  # the rare case: which side, and whether the guards hold there, decides
        try:
            [pattern_shape(t, shapes, attrs, {}) for t in rule.lhs]
        except ill_typed as lhs_exc:
            raise Reject(f"left side ill-typed: {lhs_exc}") from None
        try:
            env, _ = bind_lets(rule, attrs, shapes)
        except (IndexError, ZeroDivisionError, ValueError, TypeError) as let_exc:
            raise Reject(f"guard not evaluable: {let_exc}") from None
        if not guards_hold(rule, env, shapes):
            raise Reject("guards do not hold") from None
        raise _Failure(f"right side ill-typed where the guards hold: {exc}") from None
    if not guards_hold(rule, env, shapes):
        raise Reject("guards do not hold")
    lhs_shapes, rhs_shapes = out_shapes[: len(rule.lhs)], out_shapes[len(rule.lhs) :]
    if rhs_shapes != lhs_shapes:
        raise _Failure(f"right side shape {rhs_shapes} differs from left side {lhs_shapes}")
    # each binding at every spread: at the larger, a bound such as Clip's 6 is crossed (a clip to [0, 6] is not a
    # relu); at the smallest, values stay inside a clip's bounds (a clip of a sum to [-1, 1] is not its sign); small
    # whole numbers hold zeros and ties (a sign to the power of a sign is not the sign at zero; a relu of a sum of
    # products is not the sum where they are all zero)
    for scale in SPREADS:
        floats = draw_leaves(np_rng, leaf_shapes, scale, plan.positive_vars, plan.nonzero_vars)
        _compare(rule, evaluation, floats, exact=False)
    multiple = int(FLOAT_SCALES[int(np_rng.integers(1, len(FLOAT_SCALES)))])
    use_int = plan.int_possible and all(
        attr_value(eval_expr(e, env, shapes)) in allowed for e, allowed in plan.int_conditions
    )
    if use_int:
        ints = {v: np_rng.integers(-3, 4, size=shapes[v]).astype(np.int64) * multiple for v in plan.tensor_vars}
        _compare(rule, evaluation, ints, exact=True)
    return True, use_int


def _compare(
    rule: Rule,
    evaluation: Callable[[Mapping[str, np.ndarray]], list[np.ndarray]],
    tensors: dict[str, np.ndarray],
    exact: bool,
) -> None:
    """Both sides of every output pair (`evaluation`: the rule's left sides, then its right sides, at the binding)
    agree on `tensors` (exactly on integers, to 1e-9 in float64, or to the rule's declared tolerance where it is
    larger)."""
    with np.errstate(all="ignore"):
        values = evaluation(tensors)
        outputs = len(rule.lhs)
        for k, (left, right) in enumerate(zip(values[:outputs], values[outputs:])):
            if left.shape != right.shape:
                raise _Failure(f"output {k}: shapes {left.shape} vs {right.shape}")
            if (left.dtype == bool) != (right.dtype == bool):
                raise _Failure(f"output {k}: element types {left.dtype} vs {right.dtype}")
            if left.dtype == bool:  # a comparison's or a logical op's output: equal, element by element
                if not np.array_equal(left, right):
                    raise _Failure(f"output {k} differs in {int(np.sum(left != right))} elements")
            elif exact:
                if not np.array_equal(left, right):
                    raise _Failure(f"output {k} differs on integer tensors (max |diff| {np.abs(left - right).max()})")
            elif not close(left, right, max(1e-9, rule.tolerance)):
                raise _Failure(f"output {k} differs (max |diff| {float(np.max(np.abs(left - right))):.3g})")


def close(left: np.ndarray, right: np.ndarray, tol: float) -> bool:
    """Whether float `left` and `right` agree to `tol`, relative to the larger of 1 and `left`'s largest finite
    magnitude (an infinity on the left must not make every error small) plus `right`'s: as np.allclose, equal
    infinities agree, without its overhead on tiny tensors; a NaN must be a NaN on both sides."""
    if not left.size:
        return True
    magnitude = np.abs(left)
    if np.isfinite(magnitude).all() and np.isfinite(right).all():  # the common case, in fewer steps
        return bool((np.abs(left - right) <= tol * (max(1.0, float(magnitude.max())) + np.abs(right))).all())
    finite = magnitude[np.isfinite(magnitude)]
    scale = max(1.0, float(finite.max()) if finite.size else 1.0)
    agree = (left == right) | (np.isnan(left) & np.isnan(right))
    with np.errstate(invalid="ignore"):  # inf - inf where both sides are one infinity: `agree` has them
        return bool((agree | (np.abs(left - right) <= tol * (scale + np.abs(right)))).all())


# ---------------------------------------------------------------------------------------------------------------
# Entry points

MIN_CASES = 3


def _sample(
    plan: _Plan,
    ranks: dict[str, int],
    env: dict[str, Any],
    rng: random.Random,
    forced: tuple[int, int, int] | None = None,
    sites: list[int] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One binding (tensor shapes, attribute values) of a rank/attribute combination, with a broadcast `forced`
    (see `_Builder.broadcast`); Reject where none is found. `sites` receives the number of dims of each broadcast."""
    b = _Builder(plan, ranks, dict(env), rng, forced)
    try:
        b.guards()
        b.structure()
        return b.sample()
    finally:
        if sites is not None:
            sites[:] = b.sites


def _run_job(
    plan: _Plan,
    ranks: dict[str, int],
    env: dict[str, Any],
    wanted: int,
    attempts: int,
    rng: random.Random,
    np_rng: np.random.Generator,
    result: VerifyResult,
    forced: tuple[int, int, int] | None = None,
) -> int:
    """Compare both sides on up to `wanted` bindings of one rank/attribute combination (with a broadcast `forced`,
    see `_Builder.broadcast`); returns how many."""
    got = 0
    for _ in range(attempts):
        try:
            shapes, attrs = _sample(plan, ranks, env, rng, forced)
        except Inadmissible:
            break
        except Reject:
            continue
        try:
            _, as_int = _check_binding(plan, shapes, attrs, np_rng)
        except Reject:
            continue
        except _Failure as exc:
            exc.binding = {"shapes": shapes, "attrs": attrs}
            raise
        got += 1
        result.cases += 1
        result.int_cases += int(as_int)
        if got >= wanted:
            break
    return got


SWEEP_COMBOS = 2  # the admitted combinations, of the highest ranks first, whose broadcasts are each forced
SWEEP_ATTEMPTS = 4  # samples tried per forced broadcast


def _broadcast_sweep(
    plan: _Plan,
    admitted: Sequence[tuple[dict[str, int], dict[str, Any]]],
    rng: random.Random,
    np_rng: np.random.Generator,
    result: VerifyResult,
) -> None:
    """One binding with each broadcast of the left side made real at each of its dims, by each operand in turn, for
    the first admitted combinations of the highest ranks. Random samples broadcast now and then; a rule true only
    where nothing broadcasts (a sum of `x + y` is the sum of `concat(x, y)` only where neither is 1 along the axis)
    must meet the one broadcast that refutes it."""
    chosen = sorted(admitted, key=lambda job: -sum(job[0].values()))[:SWEEP_COMBOS]
    for ranks, env in chosen:
        sites: list[int] = []
        for _ in range(SWEEP_ATTEMPTS):
            try:
                _sample(plan, ranks, env, rng, sites=sites)
                break
            except Reject:
                continue
        for site, count in enumerate(sites):
            for dim in range(count):
                for side in (0, 1):
                    _run_job(plan, ranks, env, 1, SWEEP_ATTEMPTS, rng, np_rng, result, (site, dim, side))


def verify_rule(rule: Rule, trials: int = 3, seed: int = 0, attempts: int = 30, max_cases: int = 400) -> VerifyResult:
    """Check `rule` on `trials` random valid bindings per rank assignment and attribute combination.

    `attempts` bounds the samples tried per combination before it counts as not admitted; `max_cases` bounds the
    comparisons per rule (combinations beyond the budget get one binding each).
    """
    rng = random.Random(f"{seed}:{rule.name}")
    np_rng = np.random.default_rng(rng.getrandbits(32))
    result = VerifyResult(rule.name, ok=False)
    try:
        plan = _Plan(rule)
        assignments = plan.rank_assignments(rng)
    except Reject as exc:
        result.message = f"cannot analyse the rule: {exc}"
        return result
    jobs: list[tuple[dict[str, int], dict[str, Any]]] = []
    for ranks in assignments:
        try:
            combos = plan.attr_combos(ranks)
        except Reject as exc:
            result.message = f"cannot enumerate attributes: {exc}"
            return result
        for env in combos:
            try:
                plan.derive_rank_defs(env, ranks)
            except Reject:
                result.inadmissible += 1
                continue
            if not plan.prefilter(env, ranks):
                result.inadmissible += 1
                continue
            jobs.append((ranks, env))
    per_combo = trials if len(jobs) * trials <= max_cases else 1
    admitted: list[tuple[dict[str, int], dict[str, Any]]] = []
    try:
        for ranks, env in jobs:
            if _run_job(plan, ranks, env, per_combo, attempts, rng, np_rng, result):
                result.combos += 1
                admitted.append((ranks, env))
            else:
                result.inadmissible += 1
        for k in range(MIN_CASES * 4):  # a rule admitting few combinations still gets several shapes
            if result.cases >= MIN_CASES or not admitted:
                break
            ranks, env = admitted[k % len(admitted)]
            _run_job(plan, ranks, env, 1, attempts, rng, np_rng, result)
        _broadcast_sweep(plan, admitted, rng, np_rng, result)
    except _Failure as exc:
        result.message = str(exc)
        result.counterexample = exc.binding
        return result
    if result.cases == 0:
        result.message = "no valid binding found: the verifier could not instantiate this rule"
        return result
    result.ok = True
    return result


def bindings(
    rule: Rule, count: int = 1, seed: int = 0, attempts: int = 30, rank: int | None = None
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Up to `count` bindings (tensor shapes, attribute values) under which the rule's left side is well typed, its
    guards hold and both sides agree: the rule instantiated at concrete shapes, as the verifier samples them (for
    checking that other rules derive it). Bindings of one rank for every tensor come first, of rank `rank` first
    among those."""
    rng = random.Random(f"{seed}:{rule.name}")
    np_rng = np.random.default_rng(rng.getrandbits(32))
    out: list[tuple[dict[str, Any], dict[str, Any]]] = []
    try:
        plan = _Plan(rule)
        assignments = plan.rank_assignments(rng)
    except Reject:
        return out
    assignments.sort(key=lambda ranks: (len(set(ranks.values())), set(ranks.values()) != {rank}))
    for ranks in assignments:
        try:
            combos = plan.attr_combos(ranks)
        except Reject:
            return out
        for env in combos:
            try:
                plan.derive_rank_defs(env, ranks)
            except Reject:
                continue
            if not plan.prefilter(env, ranks):
                continue
            for _ in range(attempts):
                try:
                    shapes, attrs = _sample(plan, ranks, env, rng)
                    _check_binding(plan, shapes, attrs, np_rng)
                except Inadmissible:
                    break
                except (Reject, _Failure):
                    continue
                out.append((shapes, attrs))
                break
            if len(out) >= count:
                return out
    return out


NARROW_ATTEMPTS = 200  # samples per combination where the default attempts found fewer than MIN_CASES bindings


def verify_written(rule: Rule, trials: int = 3, seed: int = 0) -> VerifyResult:
    """`verify_rule` for a rule of the library or a rule file: one whose valid bindings are rare (a kernel's
    pattern couples many shapes: attention's three head splits, its scores and its bias) is sampled longer where
    the default attempts leave it with fewer than `MIN_CASES` comparisons."""
    result = verify_rule(rule, trials=trials, seed=seed)
    if result.ok and result.cases < MIN_CASES:
        result = verify_rule(rule, trials=trials, seed=seed, attempts=NARROW_ATTEMPTS)
    return result


def _verify_task(task: tuple[Rule, int, int]) -> VerifyResult:
    """`verify_written` of one rule, for a worker process."""
    rule, trials, seed = task
    return verify_written(rule, trials=trials, seed=seed)


def verify_each(rules: Sequence[Rule], trials: int = 3, seed: int = 0, jobs: int = 1) -> Iterator[VerifyResult]:
    """`verify_written` of each rule, in order, in `jobs` processes: each verdict as soon as it and those before it
    are done. The verifier's draws follow the rule's name alone, so the verdicts and their cases do not depend on
    `jobs`, on the order, or on the process."""
    with Workers(jobs) as workers:
        yield from workers.each(_verify_task, [(r, trials, seed) for r in rules])


def verify_all(
    rules: Sequence[Rule] | None = None, trials: int = 3, seed: int = 0, jobs: int = 1
) -> list[VerifyResult]:
    """Verify every rule of the library (or `rules`), each by `verify_written`, in `jobs` processes."""
    return list(verify_each(all_rules() if rules is None else rules, trials, seed, jobs))
