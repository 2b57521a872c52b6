"""Which rewrite rules a selection owes its changes to: read back from the explored e-graph, after extraction.

egglog records no proof of why an e-node is in its e-class, but a rule that fired left both its sides in one
e-class. So a change is explained by the rules whose left side matches where the input was and whose right side,
under the same variables, matches what replaced it. Two kinds of change are explained:
- an e-class the selection uses whose chosen e-node is not the input's choice there: the right side must match
  the chosen e-nodes from there down, the left side the input's e-node of that e-class (its inner e-nodes first
  the input's own, else any). A new e-class below it that the right side built as chosen is part of that change;
  one chosen otherwise (a later rewrite of a term the first built) is a change of its own, its left side any
  other e-node of the e-class. A new e-class that no other of its e-nodes explains, built by a rewrite the
  selection does not use and taken as an operand by a later one (relu(concat(concat(a, b), c)) distributed twice,
  then the concats reassociated; a fused kernel under a Reshape that a Reshape of a Reshape folded away), is
  explained by the rule whose right side built it there, and so is a chosen e-node of an input's e-class that no
  rule rewrote the input's e-node into, where a right side built it below and Reshapes folded it in (a fused
  kernel's Reshape back to the shape the input's Reshape gave: one Reshape of the other, then the identity), and
  a later rewrite of such an e-node is credited to both rules (that kernel and its projections as one Attention);
- an input node whose e-class rules merged with an earlier one (a Transpose of a Transpose that is the identity):
  its e-class's choice is the earlier node, so the node is gone without any e-class changing its choice. The left
  side must match the input node, the right side any e-node of its e-class (the first step of the chain).
Tensor variables bind e-classes and attribute variables values; the rule's guards and :let values are evaluated
on the bound e-classes' shapes, and the right side's attributes computed, as the compiled rule does (for one root
of a multi-pattern rule, those reading another root's variables once the right side has bound them). The left side
is first matched on the input graph as written (its inner e-nodes the input's own), and only where that finds no
rule on any e-node: of the rules the e-graph would credit, those that rewrite what the user's graph says. A change
no rule explains is counted under `UNEXPLAINED`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensat import ops, rewrites
from tensat.rewrites.dsl import Lit, Pattern, Term, Var, attr_value, eval_expr


@dataclass
class DecodedNode:
    """An e-node read back from egglog: an IR op with attributes over child e-classes."""

    op: str
    attrs: dict[str, Any]
    children: tuple[int, ...]
    eclass: int


UNEXPLAINED = "(unexplained)"
BUILT_DEPTH = 3  # levels above a new e-class that `rules_behind` looks for the right side that built it
MAX_BINDINGS = 64  # per pattern: enough for any rule over one e-class, and a bound where operand orders multiply
_DEFERRED = "(deferred)"  # in a binding: a right side's attributes to check once its other variables are bound

Env = dict[str, Any]  # tensor variables -> e-class ids, attribute variables -> values
Shape = tuple[int, ...]


def changed_classes(
    choices: Mapping[str, str], original: Mapping[str, str], decoded: Mapping[str, DecodedNode], roots: Sequence[str]
) -> list[str]:
    """The e-classes the selection `choices` uses (from `roots`) whose chosen e-node the input's selection
    `original` does not choose there, children first."""
    out: list[str] = []
    seen: set[str] = set()
    stack = [(r, False) for r in roots]
    while stack:
        c, done = stack.pop()
        if done:
            if choices[c] != original.get(c):
                out.append(c)
            continue
        if c in seen:
            continue
        seen.add(c)
        stack.append((c, True))
        stack.extend((str(ch), False) for ch in decoded[choices[c]].children)
    return out


def rules_behind(
    choices: Mapping[str, str],
    original: Mapping[str, str],
    inputs: Sequence[str],
    decoded: Mapping[str, DecodedNode],
    shapes: Mapping[int, Shape],
    roots: Sequence[str],
    rules: Sequence[rewrites.Rule],
    constant: Iterable[int] = (),
) -> dict[str, int]:
    """For each rule, how many changes of `choices` against the input's selection `original` it explains (see the
    module docstring), most first; `inputs` are the input graph's own e-nodes, `shapes` each e-class's shape.
    Changes no rule explains count under `UNEXPLAINED`. Empty when the selection is the input's own and no input
    node was merged away. Changes of the `constant` e-classes (computable from weights alone) are not counted: the
    exporter folds them into the weights, so the model does not change there."""
    folded = set(constant)
    everything = _Classes(decoded.values())
    chosen = _Classes(decoded[nid] for nid in choices.values())
    own = [decoded[nid] for nid in inputs]
    as_written = _Classes(own)
    matchers = [_Matcher(rule, shapes) for rule in rules]
    counts: Counter[str] = Counter()
    covered: dict[int, str] = {}  # a new e-class a right side built -> the op it built there

    def step(
        tiers: Sequence[tuple[Sequence[DecodedNode], _Classes]],
        right: DecodedNode | None,
        eclass: int,
        from_input: bool,
    ) -> list[str]:
        """The rules that explain one rewrite into `right` (None: any e-node of `eclass`), covering the e-classes
        their right sides built below it. Of the rules that explain it, those whose right sides built the most below
        it: in a new e-class, a commuted copy of the chosen e-node explains it as well as the rule that built it
        (and its terms below), and only the latter traces the terms below to a rule. Of those, the ones matched on
        the chosen e-nodes below it, where any are."""
        for lefts, lhs_classes in tiers:
            found: list[tuple[int, str, list[tuple[int, str]]]] = []
            for tier, rhs_classes in enumerate((chosen, everything) if right is not None else (everything,)):
                for m in matchers:
                    rhs = m.explained_by(lefts, lhs_classes, right, eclass, rhs_classes, from_input)
                    if rhs is not None and all(name != m.rule.name for _, name, _ in found):
                        inner = [] if right is None else list(_inner_classes(rhs, right, choices, decoded, everything))
                        found.append((tier, m.rule.name, inner))
            if found:
                most = max(len(inner) for _, _, inner in found)
                first = min(tier for tier, _, inner in found if len(inner) == most)
                best = [(name, inner) for tier, name, inner in found if len(inner) == most and tier == first]
                for _, inner in best:
                    covered.update(inner)
                return [name for name, _ in best]
        return []

    def explain(
        tiers: Sequence[tuple[Sequence[DecodedNode], _Classes]],
        right: DecodedNode | None,
        eclass: int,
        from_input: bool = True,
        count_unexplained: bool = True,
    ) -> bool:
        """Count the rules that explain one change (`UNEXPLAINED` for none, where `count_unexplained`); whether
        any did."""
        found = step(tiers, right, eclass, from_input)
        if not found and right is not None:  # two rewrites in a row: the first into another e-node of the e-class
            for middle in everything.of.get(eclass, ()):
                if middle is right or (from_input and any(middle in lefts for lefts, _ in tiers)):
                    continue
                second = step([([middle], everything)], right, eclass, False)
                if second:  # the first a rewrite of the input's e-node, or a kernel built below and folded in
                    first = step(tiers, middle, eclass, from_input) or built(middle)
                    if first:
                        found = first + second
                        break
        if found:
            counts.update(found)
        elif count_unexplained:
            counts[UNEXPLAINED] += 1
        return bool(found)

    parents: dict[int, list[DecodedNode]] = {}
    for dn in decoded.values():
        for child in dn.children:
            parents.setdefault(child, []).append(dn)

    def built(now: DecodedNode) -> list[str]:
        """The rules whose right side, matched at an e-node over `now`'s e-class (its parent, else up to
        `BUILT_DEPTH` levels above: a 1-D convolution's 2-D form builds the Reshape of its input two levels down),
        built that e-class as chosen: a new e-class of one e-node that a later rewrite took as an operand (its left
        side bound a variable to it), so that no right side the selection uses built it. What else that right side
        built below it as chosen is that rewrite's too (covered)."""
        level, seen = [now.eclass], {now.eclass}
        for _ in range(BUILT_DEPTH):
            above: list[int] = []
            for c in level:
                for parent in parents.get(c, ()):
                    others = [dn for dn in everything.of[parent.eclass] if dn is not parent]
                    found = []
                    for m in matchers:
                        rhs = m.explained_by(others, everything, parent, parent.eclass, everything, from_input=False)
                        inner = [] if rhs is None else list(_inner_classes(rhs, parent, choices, decoded, everything))
                        if (now.eclass, now.op) in inner:
                            found.append(m.rule.name)
                            covered.update(inner)
                    if found:
                        return found
                    if parent.eclass not in seen:
                        seen.add(parent.eclass)
                        above.append(parent.eclass)
            level = above
        return []

    for name in reversed(changed_classes(choices, original, decoded, roots)):  # parents first
        now = decoded[choices[name]]
        if now.eclass in folded:
            continue
        if name in original:
            was = decoded[original[name]]
            if not explain([([was], as_written), ([was], everything)], now, now.eclass, count_unexplained=False):
                counts.update(built(now) or [UNEXPLAINED])
        elif covered.get(now.eclass) != now.op:  # a new e-class the right side above it did not build as chosen
            others = [dn for dn in everything.of[now.eclass] if dn is not now]
            if not (
                others and explain([(others, everything)], now, now.eclass, from_input=False, count_unexplained=False)
            ):
                counts.update(built(now) or [UNEXPLAINED])
    for nid, dn in zip(inputs, own):
        if not ops.get(dn.op).leaf and original.get(str(dn.eclass)) not in (None, nid):
            explain([([dn], as_written), ([dn], everything)], None, dn.eclass)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _inner_classes(
    p: Pattern,
    node: DecodedNode,
    choices: Mapping[str, str],
    decoded: Mapping[str, DecodedNode],
    everything: _Classes,
) -> Iterator[tuple[int, str]]:
    """The e-classes a right side matched at `node` builds below it (its inner terms), each with the op it builds
    there: on the chosen e-nodes, or, where a later rewrite chose another e-node of an inner term's e-class (an LRN's
    definition whose power became square roots: a change of its own), on an e-node of the term's op there, so the
    terms below it are the first rewrite's too."""
    if isinstance(p, Term):
        for arg, child in zip(p.args, node.children):
            if isinstance(arg, Term):
                yield child, arg.op
                below = decoded[choices[str(child)]] if str(child) in choices else None
                if below is None or below.op != arg.op:
                    below = next((dn for dn in everything.of.get(child, ()) if dn.op == arg.op), None)
                if below is not None:
                    yield from _inner_classes(arg, below, choices, decoded, everything)


class _Classes:
    """E-nodes by e-class."""

    def __init__(self, nodes: Iterable[DecodedNode]) -> None:
        self.of: dict[int, list[DecodedNode]] = {}
        for dn in nodes:
            self.of.setdefault(dn.eclass, []).append(dn)


class _Matcher:
    """One rule matched against e-nodes: tensor variables bind e-classes, attribute variables values; the rule's
    integer :let values and guards are evaluated on the bound e-classes' shapes, its right side's attributes
    computed and compared."""

    def __init__(self, rule: rewrites.Rule, shapes: Mapping[int, Shape]) -> None:
        self.rule = rule
        self.shapes = shapes
        self.tensor_vars = set(rule.tensor_vars())
        terms = {name: value for name, value in rule.lets if isinstance(value, Term)}
        self.lets = [(name, value) for name, value in rule.lets if not isinstance(value, Term)]

        def expand(p: Pattern, depth: int = 0) -> Pattern:
            if isinstance(p, Var):
                return expand(terms[p.name], depth + 1) if p.name in terms and depth < 16 else p
            return Term(p.op, tuple(expand(a, depth) for a in p.args), p.attrs)

        self.pairs = [(lhs, expand(rhs)) for lhs, rhs in zip(rule.lhs, rule.rhs)]
        # a multi-pattern rule's side for one of its roots reads the other roots' variables too (their weights'
        # widths, the guards relating the two): bound only by its right side, they are checked once that matched
        self.multi = len(self.pairs) > 1

    def explained_by(
        self,
        lefts: Sequence[DecodedNode],
        lhs_classes: _Classes,
        right: DecodedNode | None,
        eclass: int,
        rhs_classes: _Classes,
        from_input: bool = True,
    ) -> Pattern | None:
        """The right side that, with its left side matching one of `lefts` (inner e-nodes from `lhs_classes`),
        matches the e-node `right` (None: any e-node of `eclass`) under the same bindings, its inner e-nodes from
        `rhs_classes`; None if no pair of sides does. A right side that is one of the left side's variables (a
        Transpose that is the identity) explains a change only where `lefts` are the input's e-nodes
        (`from_input`): among e-nodes rules made, such a left side is a loop of an e-class onto itself, which
        explains nothing."""
        for lhs, rhs in self.pairs:
            for left in lefts:
                for env in self._node(lhs, left, {}, lhs_classes, None):
                    values = self._values(env, partial=self.multi)
                    if values is None:
                        continue
                    if isinstance(rhs, Var):
                        if from_input and env.get(rhs.name) == eclass:
                            return rhs
                        continue
                    if right is None:
                        matched = self._class(rhs, eclass, env, rhs_classes, values)
                    else:
                        matched = self._node(rhs, right, env, rhs_classes, values)
                    if any(self._complete(found) for found in matched):
                        return rhs
        return None

    def _values(self, env: Env, partial: bool = False) -> dict[str, Any] | None:
        """The attribute and :let values under `env`, or None where a guard rejects it (or cannot be evaluated).
        With `partial`, a :let or guard that reads a variable `env` does not bind is left to `_complete`."""
        shapes = self._shapes(env)
        values = {k: v for k, v in env.items() if k not in self.tensor_vars and k != _DEFERRED}
        for name, expr in [*self.lets, *((None, guard) for guard in self.rule.guards)]:  # the :let values, then guards
            try:
                value = eval_expr(expr, values, shapes)
            except KeyError:
                if partial:
                    continue
                return None
            except (IndexError, ZeroDivisionError, ValueError, TypeError):
                return None
            if name is not None:
                values[name] = value
            elif not value:
                return None
        return values

    def _complete(self, env: Env) -> bool:
        """Whether a right side's bindings hold: for a multi-pattern rule, its guards and the attributes left to
        compute (`_node`) under the variables the right side bound as well."""
        if not self.multi:
            return True
        values = self._values(env)
        if values is None:
            return False
        shapes = self._shapes(env)
        try:
            return all(attr_value(eval_expr(expr, values, shapes)) == have for expr, have in env.get(_DEFERRED, ()))
        except (IndexError, KeyError, ZeroDivisionError, ValueError, TypeError):
            return False

    def _class(
        self, p: Pattern, eclass: int, env: Env, classes: _Classes, values: Mapping[str, Any] | None
    ) -> Iterator[Env]:
        """Bindings extending `env` under which `p` matches an e-node of `eclass` (at most `MAX_BINDINGS`)."""
        if isinstance(p, Var):
            bound = env.get(p.name)
            if bound is None:
                yield {**env, p.name: eclass}
            elif bound == eclass:
                yield env
            return
        n = 0
        for dn in classes.of.get(eclass, ()):
            for found in self._node(p, dn, env, classes, values):
                yield found
                n += 1
                if n >= MAX_BINDINGS:
                    return

    def _node(
        self, p: Term, dn: DecodedNode, env: Env, classes: _Classes, values: Mapping[str, Any] | None
    ) -> Iterator[Env]:
        """Bindings extending `env` under which `p` matches the e-node `dn` itself; with `values` (a right side)
        its attributes are computed and must equal the e-node's, else (a left side) they bind or must equal."""
        if dn.op != p.op or len(dn.children) != len(p.args):
            return
        env = dict(env)
        for name, expr in p.attrs:
            have = attr_value(dn.attrs.get(name))
            if values is not None:
                try:
                    want = attr_value(eval_expr(expr, values, self._shapes(env)))
                except KeyError:
                    if not self.multi:
                        return
                    env[_DEFERRED] = (*env.get(_DEFERRED, ()), (expr, have))  # read once the rest is bound
                    continue
                except (IndexError, ZeroDivisionError, ValueError, TypeError):
                    return
            elif isinstance(expr, Var):
                want = env.setdefault(expr.name, have)
            elif isinstance(expr, Lit):
                want = attr_value(expr.value)
            else:
                continue
            if want != have:
                return
        envs = [env]
        for arg, child in zip(p.args, dn.children):
            envs = [e for env_ in envs for e in self._class(arg, child, env_, classes, values)][:MAX_BINDINGS]
            if not envs:
                return
        yield from envs

    def _shapes(self, env: Env) -> dict[str, tuple[int, ...]]:
        return {k: tuple(self.shapes[c]) for k, c in env.items() if k in self.tensor_vars and c in self.shapes}
