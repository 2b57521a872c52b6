"""Which equations a rule set proves by equality saturation: the e-graph side of the rule generator's minimization
(`rewrites.generate`), and of the check that a generated set derives the hand-written rules.

A `Prover` keeps one egglog e-graph across calls, as Ruler keeps its e-graph: the rules it was given stay, each
call adds only the new ones and the new pairs' terms, and what earlier calls proved stays proved (every rule is
verified, so an equality once derived holds). It starts afresh when the e-graph outgrows its node limit.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from egglog import bindings

from tensat import ops
from tensat.egraph.lower import egg_value, enode_count
from tensat.egraph.pool import run_program
from tensat.rewrites.dsl import Pattern, Rule, Term, Var, attr_value, bind_lets, eval_expr, literal, to_egglog
from tensat.rewrites.verify import bindings as rule_bindings

NODE_LIMIT = 50_000  # e-nodes: no iteration starts beyond it, and an e-graph beyond it starts afresh
MATCH_LIMIT = 200  # matches of a rule in one iteration beyond which it is not applied
ITER_LIMIT = 6  # rule iterations per call
TIME_LIMIT = 20.0  # seconds of rule iterations per call
BATCH = 256  # commands per egglog call

Shape = tuple[int, ...]


class UnsoundRules(RuntimeError):
    """Equality saturation merged two terms of different shapes: one of `names`, the rules new to the e-graph, is
    wrong where the verifier did not look. The e-graph has started afresh without them."""

    def __init__(self, names: list[str], message: str) -> None:
        super().__init__(f"rules {', '.join(names)} merged terms of different shapes ({message})")
        self.names = names


class Prover:
    """Equality saturation over rule sets and pairs of terms, in one e-graph kept across calls."""

    def __init__(
        self, node_limit: int = NODE_LIMIT, iter_limit: int = ITER_LIMIT, time_limit: float = TIME_LIMIT
    ) -> None:
        self.node_limit, self.iter_limit, self.time_limit = node_limit, iter_limit, time_limit
        self._reset()

    def _reset(self) -> None:
        self.egraph = bindings.EGraph()
        program = [ops.egg_declarations(), "(function side (i64) T :no-merge)", "(ruleset gen)"]
        run_program(self.egraph, "\n".join(program + ops.egg_shape_rules()))
        self._rules: set[str] = set()
        self._sides = 0

    def __call__(
        self,
        rules: Sequence[Rule],
        pairs: Sequence[tuple[Pattern, Pattern]],
        shape: Shape,
        shapes: Mapping[str, Shape] | None = None,
    ) -> list[bool]:
        """For each pair, whether `rules` (with those of earlier calls since the last fresh start) make its two
        sides one e-class, every variable an input of `shape` (or of its shape in `shapes`). A pair not typed at
        those shapes is not proved."""
        if enode_count(self.egraph) > self.node_limit:
            self._reset()
        new = [r for r in rules if r.name not in self._rules]
        self._commands([to_egglog(r, "gen") for r in new])
        self._rules.update(r.name for r in new)
        commands: list[str] = []
        sides: list[int | None] = []
        for a, b in pairs:
            try:
                left, right = self._expr(a, shape, shapes), self._expr(b, shape, shapes)
            except (ops.ShapeError, ValueError, IndexError, KeyError):
                sides.append(None)
                continue
            k = self._sides
            self._sides += 2
            commands += [f"(set (side {k}) {left[0]})", f"(set (side {k + 1}) {right[0]})"]
            sides.append(k)
        self._commands(commands)
        try:
            run_program(self.egraph, "(run-schedule (saturate shapes))")
            self._saturate()
        except Exception as exc:  # egglog's panic on a union of two shapes: one of the new rules is wrong
            self._reset()
            raise UnsoundRules([r.name for r in new], str(exc)) from None
        return [k is not None and self._equal(k) for k in sides]

    def _commands(self, commands: Sequence[str]) -> None:
        for k in range(0, len(commands), BATCH):
            run_program(self.egraph, "\n".join(commands[k : k + BATCH]))

    def _saturate(self) -> None:
        """The rules, an iteration at a time, until nothing grows or a limit is reached. In an iteration, a rule
        with more than MATCH_LIMIT matches is not applied (egglog's back-off scheduler, as egg's bounds Tensat's
        search): a rule that rewrites every term of a large e-graph would multiply it in one iteration."""
        start = time.perf_counter()
        size = enode_count(self.egraph)
        for _ in range(self.iter_limit):
            run_program(
                self.egraph,
                f"(run-schedule (let-scheduler bo (back-off :match-limit {MATCH_LIMIT})) (run-with bo gen) "
                "(saturate shapes))",
            )
            grown = enode_count(self.egraph)
            if grown == size or grown > self.node_limit or time.perf_counter() - start > self.time_limit:
                return
            size = grown

    def _equal(self, k: int) -> bool:
        try:
            run_program(self.egraph, f"(check (= (side {k}) (side {k + 1})))")
        except Exception:  # noqa: BLE001 - egglog's failed check is its only answer
            return False
        return True

    def _expr(self, p: Pattern, shape: Shape, shapes: Mapping[str, Shape] | None) -> tuple[str, Shape]:
        """The egglog term of pattern `p` and its shape (ops.ShapeError where ill-typed)."""
        if isinstance(p, Var):
            leaf = tuple((shapes or {}).get(p.name, shape))
            d = ops.get("input")
            values = {"name": p.name, "shape": leaf}
            return f"({d.egg} {' '.join(egg_value(kind, values[name]) for name, kind in d.attrs)})", leaf
        d = ops.get(p.op)
        args = [self._expr(a, shape, shapes) for a in p.args]
        attrs = {name: attr_value(eval_expr(value, {}, {})) for name, value in p.attrs}
        out = ops.shape_of(p.op, [s for _, s in args], attrs)
        parts = [text for text, _ in args] + [egg_value(kind, attrs[name]) for name, kind in d.attrs]
        return f"({d.egg} {' '.join(parts)})", out


def proved(
    rules: Sequence[Rule],
    pairs: Sequence[tuple[Pattern, Pattern]],
    shape: Shape,
    *,
    shapes: Mapping[str, Shape] | None = None,
    **limits: Any,
) -> list[bool]:
    """For each pair, whether `rules` prove its two sides equal, in a fresh e-graph (see `Prover`)."""
    return Prover(**limits)(rules, pairs, shape, shapes)


def _concrete(
    p: Pattern, prefix: str, env: Mapping[str, Any], shapes: Mapping[str, Any], lets: Mapping[str, Any]
) -> Pattern:
    """Pattern `p` of a rule at one binding: attributes evaluated, `:let` terms inlined, variables prefixed."""
    if isinstance(p, Var):
        return _concrete(lets[p.name], prefix, env, shapes, lets) if p.name in lets else Var(prefix + p.name)
    attrs = tuple((k, literal(attr_value(eval_expr(e, env, shapes)))) for k, e in p.attrs)
    return Term(p.op, tuple(_concrete(a, prefix, env, shapes, lets) for a in p.args), attrs)


def derived(rules: Sequence[Rule], targets: Sequence[Rule], seed: int = 0, **limits: Any) -> dict[str, str]:
    """For each single-pattern rule of `targets`: "derived" where `rules` prove its two sides equal at a binding
    the verifier samples (`rewrites.verify.bindings`), else "not derived", or "not instantiated" where the verifier
    finds no binding. Every target's instance is in one e-graph, each with variables of its own."""
    pairs: list[tuple[Pattern, Pattern]] = []
    names: list[str] = []
    leaves: dict[str, Shape] = {}
    out: dict[str, str] = {}
    for k, rule in enumerate(t for t in targets if not t.multi):
        found = rule_bindings(rule, seed=seed)
        if not found:
            out[rule.name] = "not instantiated"
            continue
        shapes, attrs = found[0]
        env, lets = bind_lets(rule, attrs, shapes)
        prefix = f"r{k}_"
        leaves.update({prefix + v: tuple(shape) for v, shape in shapes.items()})
        lhs = _concrete(rule.lhs[0], prefix, env, shapes, lets)
        pairs.append((lhs, _concrete(rule.rhs[0], prefix, env, shapes, lets)))
        names.append(rule.name)
    results = proved(rules, pairs, (), shapes=leaves, **limits) if pairs else []
    out.update({name: "derived" if ok else "not derived" for name, ok in zip(names, results)})
    return {t.name: out[t.name] for t in targets if t.name in out}
