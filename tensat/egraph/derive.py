"""Which equations a rule set proves by equality saturation: the e-graph side of the rule generator's minimization
(`rewrites.generate`), and of the check that a generated set derives the hand-written rules.

A `Prover` keeps one egglog e-graph across calls: the rules it was given stay compiled, and each call adds only the
new ones. A call's terms live in an egglog scope (`push` ... `pop`), so the e-graph that the rules run over holds
that call's pairs alone: it stays small, and a rule that matches every term of it is still applied.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from egglog import bindings

from tensat import ops
from tensat.egraph.lower import egg_value, enode_count
from tensat.egraph.pool import run_program
from tensat.rewrites.dsl import (
    Pattern,
    Rule,
    Term,
    Var,
    attr_value,
    bind_lets,
    eval_expr,
    literal,
    pattern_ops,
    to_egglog,
)
from tensat.rewrites.generate import proved_by_sound
from tensat.rewrites.verify import bindings as rule_bindings

NODE_LIMIT = 6_000  # e-nodes of a call's e-graph: no iteration starts beyond it
MATCH_LIMIT = 200  # matches of a rule in one iteration beyond which it is not applied
ITER_LIMIT = 6  # rule iterations per call
BATCH = 256  # commands per egglog call
SAME = re.compile(r"\(same (\d+)\)")

Shape = tuple[int, ...]


class UnsoundRules(RuntimeError):
    """Equality saturation merged two terms of different shapes: rule `names[0]` is wrong where the verifier did
    not look. The e-graph has started afresh: a call without it carries on."""

    def __init__(self, names: list[str], message: str) -> None:
        super().__init__(f"rules {', '.join(names)} merged terms of different shapes ({message})")
        self.names = names


class _Panic(Exception):
    """egglog panicked (a rule merged terms of different shapes); the e-graph has started afresh."""


class Prover:
    """Equality saturation over rule sets and pairs of terms, in one e-graph kept across calls."""

    def __init__(self, node_limit: int = NODE_LIMIT, iter_limit: int = ITER_LIMIT, produced: bool = False) -> None:
        """`produced`: the rules run over a call's pairs are those over their ops and over the ops those rules'
        right sides build, as the search selects them (`rewrites.select_rules`); else over the pairs' ops alone."""
        self.node_limit, self.iter_limit, self.produced = node_limit, iter_limit, produced
        self._reset()

    def _reset(self) -> None:
        self.egraph = bindings.EGraph()
        program = [
            ops.egg_declarations(),
            "(function left (i64) T :no-merge)",
            "(function right (i64) T :no-merge)",
            "(relation same (i64))",
            "(ruleset check)",
            "(rule ((= (left k) (right k))) ((same k)) :ruleset check)",
        ]
        run_program(self.egraph, "\n".join(program + ops.egg_shape_rules()))
        self._rules: set[str] = set()
        self._rulesets: dict[frozenset[str], str] = {}  # the ops a rule's left side uses -> its ruleset
        self._builds: dict[frozenset[str], set[str]] = {}  # ... -> the ops its rules' right sides build

    def __call__(
        self,
        rules: Sequence[Rule],
        pairs: Sequence[tuple[Pattern, Pattern]],
        shape: Shape,
        shapes: Mapping[str, Shape] | None = None,
    ) -> list[bool]:
        """For each pair, whether `rules` (with those of earlier calls, since the last that raised) make its two
        sides one e-class, every variable an input of `shape` (or of its shape in `shapes`). Only the rules whose
        left sides use no op outside the pairs' run: a batch of pairs over a few ops does not pay for every rule
        in every iteration. A pair not typed at those shapes is not proved."""
        try:
            return self._prove(rules, pairs, shape, shapes)
        except _Panic as exc:
            culprit = self._culprit(rules, pairs, shape, shapes)
            raise UnsoundRules([culprit], str(exc)) from None

    def _prove(
        self,
        rules: Sequence[Rule],
        pairs: Sequence[tuple[Pattern, Pattern]],
        shape: Shape,
        shapes: Mapping[str, Shape] | None,
    ) -> list[bool]:
        """`__call__`'s work; _Panic (the e-graph started afresh) where egglog panicked."""
        new = [r for r in rules if r.name not in self._rules]
        self._commands([to_egglog(r, self._ruleset(r)) for r in new])
        self._rules.update(r.name for r in new)
        for r in new:
            self._builds.setdefault(frozenset(r.ops()), set()).update(r.produced_ops())
        present = pattern_ops(*(p for pair in pairs for p in pair))
        while self.produced:
            grown = present.union(*(self._builds[used] for used in self._rulesets if used <= present))
            if grown == present:
                break
            present = grown
        relevant = [name for used, name in self._rulesets.items() if used <= present]
        commands: list[str] = []
        typed: list[bool] = []
        for k, (a, b) in enumerate(pairs):
            try:
                left, right = self._expr(a, shape, shapes), self._expr(b, shape, shapes)
            except (ops.ShapeError, ValueError, IndexError, KeyError):
                typed.append(False)
                continue
            commands += [f"(set (left {k}) {left[0]})", f"(set (right {k}) {right[0]})"]
            typed.append(True)
        run_program(self.egraph, "(push)")
        try:
            self._commands(commands)
            run_program(self.egraph, "(run-schedule (saturate shapes))")
            if relevant:
                run_program(self.egraph, f"(unstable-combined-ruleset relevant {' '.join(relevant)})")
                self._saturate()
            out = run_program(self.egraph, f"(run-schedule (saturate check))\n(print-function same {len(pairs) + 1})")
        except Exception as exc:  # egglog's panic on a union of two shapes: a rule is wrong
            self._reset()
            raise _Panic(str(exc)) from None
        run_program(self.egraph, "(pop)")
        same = {int(k) for k in SAME.findall(str(out[-1]))}
        return [ok and k in same for k, ok in enumerate(typed)]

    def _culprit(
        self,
        rules: Sequence[Rule],
        pairs: Sequence[tuple[Pattern, Pattern]],
        shape: Shape,
        shapes: Mapping[str, Shape] | None,
    ) -> str:
        """The rule whose addition makes egglog panic on `pairs`: the last of the shortest prefix of `rules` that
        does, found by bisection, each prefix in a fresh e-graph. The e-graph is fresh afterwards."""
        lo, hi = 0, len(rules)
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            self._reset()
            try:
                self._prove(rules[:mid], pairs, shape, shapes)
                lo = mid
            except _Panic:
                hi = mid
        self._reset()
        return rules[hi - 1].name

    def _ruleset(self, rule: Rule) -> str:
        """The ruleset of the rules whose left sides use `rule`'s ops, declared where new."""
        used = frozenset(rule.ops())
        if used not in self._rulesets:
            self._rulesets[used] = f"gen{len(self._rulesets)}"
            run_program(self.egraph, f"(ruleset {self._rulesets[used]})")
        return self._rulesets[used]

    def _commands(self, commands: Sequence[str]) -> None:
        for k in range(0, len(commands), BATCH):
            run_program(self.egraph, "\n".join(commands[k : k + BATCH]))

    def _saturate(self) -> None:
        """The rules, an iteration at a time, until nothing grows or a limit is reached. In an iteration, a rule
        with more than MATCH_LIMIT matches is not applied (egglog's back-off scheduler, as egg's bounds Tensat's
        search): a rule that rewrites every term of a large e-graph would multiply it in one iteration. The limits
        count e-nodes and iterations, not seconds, so that what is proved, and a generation's rules, do not depend on
        the machine or its load."""
        size = enode_count(self.egraph)
        for _ in range(self.iter_limit):
            run_program(
                self.egraph,
                f"(run-schedule (let-scheduler bo (back-off :match-limit {MATCH_LIMIT})) (run-with bo relevant) "
                "(saturate shapes))",
            )
            grown = enode_count(self.egraph)
            if grown == size or grown > self.node_limit:
                return
            size = grown

    def _expr(self, p: Pattern, shape: Shape, shapes: Mapping[str, Shape] | None) -> tuple[str, Shape]:
        """The egglog term of pattern `p` and its shape (ops.ShapeError where ill-typed)."""
        if isinstance(p, Var):
            leaf = tuple((shapes or {}).get(p.name, shape))
            d = ops.get("input")
            values = {"name": p.name, "shape": leaf}
            return f"({d.egg} {' '.join(egg_value(kind, values[name]) for name, kind in d.attrs)})", leaf
        d = ops.get(p.op)
        args = [self._expr(a, shape, shapes) for a in p.args]
        in_shapes = [s for _, s in args]
        attrs = ops.resolved({name: attr_value(eval_expr(value, {}, {})) for name, value in p.attrs}, in_shapes)
        out = ops.shape_of(p.op, in_shapes, attrs)
        parts = [text for text, _ in args] + [egg_value(kind, attrs[name]) for name, kind in d.attrs]
        return f"({d.egg} {' '.join(parts)})", out


def proved(
    rules: Sequence[Rule],
    pairs: Sequence[tuple[Pattern, Pattern]],
    shape: Shape,
    shapes: Mapping[str, Shape] | None = None,
    **limits: Any,
) -> list[bool]:
    """For each pair, whether `rules` prove its two sides equal, in a fresh e-graph (see `Prover`)."""
    return Prover(**limits)(rules, pairs, shape, shapes)


def _concrete(p: Pattern, env: Mapping[str, Any], shapes: Mapping[str, Any], lets: Mapping[str, Any]) -> Pattern:
    """Pattern `p` of a rule at one binding: attributes evaluated, `:let` terms inlined."""
    if isinstance(p, Var):
        return _concrete(lets[p.name], env, shapes, lets) if p.name in lets else p
    attrs = tuple((k, literal(attr_value(eval_expr(e, env, shapes)))) for k, e in p.attrs)
    return Term(p.op, tuple(_concrete(a, env, shapes, lets) for a in p.args), attrs)


def derived(
    rules: Sequence[Rule], targets: Sequence[Rule], seed: int = 0, rank: int | None = None, **limits: Any
) -> dict[str, str]:
    """For each single-pattern rule of `targets`: "derived" where `rules` prove its two sides equal at a binding
    the verifier samples (`rewrites.verify.bindings`; every tensor of rank `rank` where the target has such a
    binding), else "not derived", or "not instantiated" where the verifier finds no binding. Each target is proved
    on its own, as the generator's minimization proves a batch (`Prover`, with `limits`); a rule found unsound on
    the way is left out of the rest. A target the rules over its own ops do not prove is tried again with the rules
    over the ops their right sides build too, as the search selects the rules for a graph (`rewrites.select_rules`:
    a derivation may go through an op the target does not use)."""
    provers = (Prover(**limits), Prover(**limits, produced=True))
    usable = list(rules)
    out: dict[str, str] = {}
    for rule in (t for t in targets if not t.multi):
        found = rule_bindings(rule, seed=seed, rank=rank)
        if not found:
            out[rule.name] = "not instantiated"
            continue
        shapes, attrs = found[0]
        env, lets = bind_lets(rule, attrs, shapes)
        pair = (_concrete(rule.lhs[0], env, shapes, lets), _concrete(rule.rhs[0], env, shapes, lets))
        leaves = {v: tuple(shape) for v, shape in shapes.items()}
        out[rule.name] = "not derived"
        for prover in provers:
            [ok], usable = proved_by_sound(prover, usable, [pair], (), leaves)
            if ok:
                out[rule.name] = "derived"
                break
    return {t.name: out[t.name] for t in targets if t.name in out}
