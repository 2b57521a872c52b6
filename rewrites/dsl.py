"""The rule language: s-expression rewrite rules over tensat's operators, parsed once, used everywhere.

A rule file holds forms like

    (rule matmul-assoc
      (matmul ?x (matmul ?y ?z))
      (matmul (matmul ?x ?y) ?z))

    (multi matmul-merge-shared-input
      ((matmul ?x ?w1) (matmul ?x ?w2))
      ((slice ?m :axis ?last :start 0 :size (dim ?w1 -1))
       (slice ?m :axis ?last :start (dim ?w1 -1) :size (dim ?w2 -1)))
      :let ((?last (- (rank ?x) 1)) (?m (matmul ?x (concat ?w1 ?w2 :axis (- (rank ?w1) 1)))))
      :when ((same-except ?w1 ?w2 (- (rank ?w1) 1))))

Patterns are `(op tensor-args... :attr value ...)`; `?name` is a variable. In a left side, attributes left out match
anything. `:let` binds integer expressions or shared right-side terms; `:when` lists guards. Expressions: integers
and reals, variables, `(dim ?t i)` (a negative literal i counts from the end), `(rank ?t)`, `(shape ?t)`,
`(vec a b ...)`, `(vec-get v i)`, `(vec-set v i x)`, `(ones r)` (a vector of r ones: the shape of a constant that
broadcasts to any tensor of rank r), `(+ - * / % min max ...)`; guards: `(= a b)`, `(!= a b)`, `(< a b)`,
`(<= a b)`, `(> a b)`, `(>= a b)`, `(same-except ?a ?b axis)` (shapes equal but on one axis; a negative literal axis
counts from the end), `(same-shape ?a ?b)`. A constant its attributes define (`fill`, `band`) is a pattern like an
op: a left side matches one by value. `:tolerance` is the relative error the verifier allows between the sides (0,
the default, for an identity; a float32 epsilon's order where a side's constants are float32 roundings).

The same parsed `Rule` compiles to an egglog rule (`to_egglog`) and evaluates with numpy (`instantiate`), so the
e-graph explorer, the sequential search and the verifier all read one definition.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensat import ops


class RuleError(ValueError):
    """A rule that cannot be parsed or is not well formed."""


# ---------------------------------------------------------------------------------------------------------------
# S-expressions

_COMMENT = re.compile(r";[^\n]*")
_FLOAT_WORDS = frozenset({"inf", "nan", "infinity"})


def _atom(tok: str) -> Any:
    """An int, a float, or else the symbol itself (a variable, an op, a keyword: most tokens, told by their first
    character without trying the numbers)."""
    if tok[0].isalpha() or tok[0] in "?:_":
        return float(tok) if tok.lower() in _FLOAT_WORDS else tok
    try:
        return int(tok)
    except ValueError:
        pass
    try:
        return float(tok)
    except ValueError:
        return tok


def parse_sexprs(text: str) -> list[Any]:
    """Parse text into nested lists of atoms (ints, floats and symbol strings); `;` starts a comment."""
    stack: list[list[Any]] = [[]]
    for tok in _COMMENT.sub(" ", text).replace("(", " ( ").replace(")", " ) ").split():
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) == 1:
                raise RuleError("unbalanced parentheses: unexpected ')'")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(_atom(tok))
    if len(stack) > 1:
        raise RuleError("unbalanced parentheses: missing ')'")
    return stack[0]


# ---------------------------------------------------------------------------------------------------------------
# AST


@dataclass(frozen=True)
class Var:
    name: str  # without the '?'

    def __repr__(self) -> str:  # the dataclass's text, without its recursion guard: the generator sorts by it
        return f"Var(name={self.name!r})"


@dataclass(frozen=True)
class Lit:
    value: Any  # int, float or tuple of ints

    def __repr__(self) -> str:
        return f"Lit(value={self.value!r})"


@dataclass(frozen=True)
class Call:
    """An integer/vector expression or guard: fn applied to args."""

    fn: str
    args: tuple[Expr, ...]

    def __repr__(self) -> str:
        return f"Call(fn={self.fn!r}, args={self.args!r})"


@dataclass(frozen=True)
class Term:
    """An operator pattern: op applied to tensor patterns, with attribute expressions."""

    op: str
    args: tuple[Pattern, ...]
    attrs: tuple[tuple[str, Expr], ...]

    def __repr__(self) -> str:
        return f"Term(op={self.op!r}, args={self.args!r}, attrs={self.attrs!r})"


Expr = Var | Lit | Call
Pattern = Var | Term

EXPR_FNS = {"+", "-", "*", "/", "%", "min", "max", "dim", "rank", "shape", "vec", "vec-get", "vec-set", "ones"}
GUARDS = {"=", "!=", "<", "<=", ">", ">=", "same-except", "same-shape"}


@dataclass(frozen=True)
class Rule:
    """A rewrite: left patterns (1, or 2 for a multi-pattern rule) become right patterns where guards hold."""

    name: str
    lhs: tuple[Term, ...]
    rhs: tuple[Pattern, ...]
    lets: tuple[tuple[str, Any], ...] = ()  # (var, Expr or Pattern)
    guards: tuple[Call, ...] = ()
    source: str = field(default="", compare=False)
    # the relative error both sides may differ by in float64: 0 for an identity, the float32 epsilon's order for
    # one whose constants are float32 roundings of what the other side computes exactly (a GELU's sqrt(2))
    tolerance: float = 0.0

    @property
    def multi(self) -> bool:
        return len(self.lhs) > 1

    @property
    def symmetric(self) -> bool:
        """A multi-pattern rule whose two left patterns are the same up to renaming their own variables.

        Such a rule matches every pair twice (once per order); the compiled rule keeps one order only.
        The guards must be unchanged by swapping the two patterns' own variables too (a guard that orders the pair,
        such as one kernel smaller than the other, needs both orders tried).
        """
        if not self.multi:
            return False
        a, b = self.lhs
        shared = set(_all_vars(a)) & set(_all_vars(b))
        mapping: dict[str, str] = {}
        if not (_same_up_to_renaming(a, b, mapping, shared) and len(set(mapping.values())) == len(mapping)):
            return False
        swap = {**mapping, **{v: k for k, v in mapping.items()}}
        guards = [inline_lets(g, self.lets) for g in self.guards]
        return {_guard_key(g, {}) for g in guards} == {_guard_key(g, swap) for g in guards}

    def produced_ops(self) -> set[str]:
        """Operators the right side (and its :let terms) builds."""
        found: set[str] = set()
        for t in self.rhs:
            _collect_ops(t, found)
        for _, value in self.lets:
            _collect_ops(value, found)
        return found

    def ops(self) -> set[str]:
        """Operators the left side needs (for rule selection)."""
        return pattern_ops(*self.lhs)

    def tensor_vars(self) -> list[str]:
        """Tensor variables of the left side, in order of first appearance."""
        out: list[str] = []
        for t in self.lhs:
            _collect_tensor_vars(t, out)
        return out


def pattern_ops(*patterns: Pattern) -> set[str]:
    """Operators the patterns use."""
    found: set[str] = set()
    for p in patterns:
        _collect_ops(p, found)
    return found


def _collect_ops(p: Pattern, found: set[str]) -> None:
    if isinstance(p, Term):
        found.add(p.op)
        for a in p.args:
            _collect_ops(a, found)


def _collect_tensor_vars(p: Pattern, out: list[str]) -> None:
    if isinstance(p, Var):
        if p.name not in out:
            out.append(p.name)
    else:
        for a in p.args:
            _collect_tensor_vars(a, out)


def _all_vars(p: Any) -> list[str]:
    return list(_vars_of(p))


_SYMMETRIC_GUARDS = {"=", "!=", "same-shape"}


def inline_lets(e: Any, lets: tuple[tuple[str, Any], ...]) -> Any:
    """`e` with integer :let variables replaced by their definitions."""
    values = {n: v for n, v in lets if not isinstance(v, Term)}

    def go(x: Any, depth: int = 0) -> Any:
        if isinstance(x, Var) and x.name in values and depth < 16:
            return go(values[x.name], depth + 1)
        if isinstance(x, Call):
            return Call(x.fn, tuple(go(a, depth) for a in x.args))
        return x

    return go(e)


def _rename(x: Any, mapping: Mapping[str, str]) -> Any:
    """`x` (expression or pattern) with variables renamed by `mapping`."""
    if isinstance(x, Var):
        return Var(mapping.get(x.name, x.name))
    if isinstance(x, Call):
        return Call(x.fn, tuple(_rename(a, mapping) for a in x.args))
    if isinstance(x, Term):
        return Term(
            x.op, tuple(_rename(a, mapping) for a in x.args), tuple((k, _rename(v, mapping)) for k, v in x.attrs)
        )
    return x


def _guard_key(g: Call, mapping: Mapping[str, str]) -> str:
    """A guard renamed by `mapping`, written so that equivalent argument orders compare equal."""
    g = _rename(g, mapping)
    fn, args = g.fn, [repr(a) for a in g.args]
    if fn in (">", ">="):
        fn, args = {">": "<", ">=": "<="}[fn], args[::-1]
    if fn in _SYMMETRIC_GUARDS:
        args = sorted(args)
    elif fn == "same-except":
        args = sorted(args[:2]) + args[2:]
    return f"({fn} {' '.join(args)})"


def canonical_form(rule: Rule) -> str:
    """The rule written with variables renamed in order of first appearance (its name left out).

    Two rules with the same canonical form are the same rule up to variable renaming.
    """
    order: dict[str, str] = {}

    def visit(x: Any) -> None:
        for v in _vars_of(x):
            order.setdefault(v, f"v{len(order)}")

    for t in rule.lhs:
        visit(t)
    for name, value in rule.lets:
        order.setdefault(name, f"v{len(order)}")
        visit(value)
    for g in rule.guards:
        visit(g)
    for p in rule.rhs:
        visit(p)
    lhs = [repr(_rename(t, order)) for t in rule.lhs]
    lets = [(order[n], repr(_rename(v, order))) for n, v in rule.lets]
    guards = sorted(_guard_key(g, order) for g in rule.guards)
    rhs = [repr(_rename(t, order)) for t in rule.rhs]
    return repr((lhs, lets, guards, rhs))


def _same_up_to_renaming(a: Any, b: Any, mapping: dict[str, str], shared: set[str]) -> bool:
    """Whether b is a with b's own variables renamed consistently (shared variables stay themselves)."""
    if isinstance(a, Var) and isinstance(b, Var):
        if a.name in shared or b.name in shared:
            return a.name == b.name
        return mapping.setdefault(b.name, a.name) == a.name
    if isinstance(a, Lit) and isinstance(b, Lit):
        return a == b
    if isinstance(a, Call) and isinstance(b, Call):
        return (
            a.fn == b.fn
            and len(a.args) == len(b.args)
            and all(_same_up_to_renaming(x, y, mapping, shared) for x, y in zip(a.args, b.args))
        )
    if isinstance(a, Term) and isinstance(b, Term):
        if a.op != b.op or len(a.args) != len(b.args) or [k for k, _ in a.attrs] != [k for k, _ in b.attrs]:
            return False
        return all(_same_up_to_renaming(x, y, mapping, shared) for x, y in zip(a.args, b.args)) and all(
            _same_up_to_renaming(x, y, mapping, shared) for (_, x), (_, y) in zip(a.attrs, b.attrs)
        )
    return False


def _is_var(x: Any) -> bool:
    return isinstance(x, str) and x.startswith("?") and len(x) > 1


def _expr(x: Any) -> Expr:
    if _is_var(x):
        return Var(x[1:])
    if isinstance(x, (int, float)):
        return Lit(x)
    if isinstance(x, list) and x and isinstance(x[0], str) and x[0] in EXPR_FNS | GUARDS:
        return Call(x[0], tuple(_expr(a) for a in x[1:]))
    raise RuleError(f"bad expression {x!r}")


def _pattern(x: Any) -> Pattern:
    if _is_var(x):
        return Var(x[1:])
    if not (isinstance(x, list) and x and isinstance(x[0], str)):
        raise RuleError(f"bad pattern {x!r}")
    op = x[0]
    if op not in ops.REGISTRY or op == "opaque":
        raise RuleError(f"unknown operator {op!r} in pattern")
    d = ops.REGISTRY[op]
    args: list[Pattern] = []
    attrs: list[tuple[str, Expr]] = []
    items = x[1:]
    i = 0
    while i < len(items):
        item = items[i]
        if isinstance(item, str) and item.startswith(":"):
            name = item[1:]
            if name not in d.attr_names:
                raise RuleError(f"{op} has no attribute {name!r}")
            if i + 1 >= len(items):
                raise RuleError(f"attribute :{name} of {op} has no value")
            attrs.append((name, _expr(items[i + 1])))
            i += 2
        else:
            if attrs:
                raise RuleError(f"{op}: tensor arguments must come before attributes")
            args.append(_pattern(item))
            i += 1
    if d.inputs is not None and len(args) != d.inputs:
        raise RuleError(f"{op} takes {d.inputs} tensor arguments, got {len(args)}")
    return Term(op, tuple(args), tuple(attrs))


def _options(items: list[Any], name: str) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if len(items) % 2:
        raise RuleError(f"rule {name}: options must be ':key value' pairs")
    for key, value in zip(items[::2], items[1::2]):
        if key not in (":let", ":when", ":tolerance"):
            raise RuleError(f"rule {name}: unknown option {key!r}")
        opts[key] = value
    return opts


def parse_rules(text: str) -> list[Rule]:
    """Parse every `(rule ...)` and `(multi ...)` form in `text`."""
    rules = []
    for form in parse_sexprs(text):
        if not (isinstance(form, list) and len(form) >= 4 and form[0] in ("rule", "multi")):
            raise RuleError(f"expected (rule NAME LHS RHS ...) or (multi NAME (LHS...) (RHS...) ...), got {form!r:.80}")
        kind, name, lhs, rhs = form[0], str(form[1]), form[2], form[3]
        opts = _options(form[4:], name)
        lhs_t: tuple[Pattern, ...]
        rhs_t: tuple[Pattern, ...]
        if kind == "rule":
            lhs_t, rhs_t = (_pattern(lhs),), (_pattern(rhs),)
        else:
            if not (isinstance(lhs, list) and isinstance(rhs, list) and len(lhs) == len(rhs) == 2):
                raise RuleError(f"multi rule {name}: needs two left and two right patterns")
            lhs_t, rhs_t = tuple(_pattern(p) for p in lhs), tuple(_pattern(p) for p in rhs)
        if not all(isinstance(t, Term) for t in lhs_t):
            raise RuleError(f"rule {name}: a left side must be an operator pattern")
        lets = []
        for binding in opts.get(":let", []):
            if not (isinstance(binding, list) and len(binding) == 2 and _is_var(binding[0])):
                raise RuleError(f"rule {name}: bad :let binding {binding!r}")
            value = binding[1]
            is_term = isinstance(value, list) and value and value[0] in ops.REGISTRY
            lets.append((binding[0][1:], _pattern(value) if is_term else _expr(value)))
        guards = tuple(_expr(g) for g in opts.get(":when", []))
        for g in guards:
            if not (isinstance(g, Call) and g.fn in GUARDS):
                raise RuleError(f"rule {name}: guard {g} is not a comparison")
        tolerance = opts.get(":tolerance", 0.0)
        if not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1e-3:
            raise RuleError(f"rule {name}: :tolerance must be a relative error below 1e-3, got {tolerance!r}")
        rule = Rule(name, lhs_t, rhs_t, tuple(lets), guards, tolerance=float(tolerance))  # type: ignore[arg-type]
        _check_rule(rule)
        rules.append(rule)
    return rules


def _check_rule(rule: Rule) -> None:
    """Every variable used on the right or in guards is bound on the left or by :let."""
    bound: set[str] = set(rule.tensor_vars())
    for t in rule.lhs:
        for _, e in _walk_attrs(t):
            if isinstance(e, Var):
                bound.add(e.name)
    for name, value in rule.lets:
        for v in _vars_of(value):
            if v not in bound:
                raise RuleError(f"rule {rule.name}: :let {name} uses unbound ?{v}")
        bound.add(name)
    for item in (*rule.rhs, *rule.guards):
        for v in _vars_of(item):
            if v not in bound:
                raise RuleError(f"rule {rule.name}: ?{v} is not bound on the left side")


def _walk_attrs(p: Pattern) -> Iterator[tuple[str, Expr]]:
    if isinstance(p, Term):
        yield from p.attrs
        for a in p.args:
            yield from _walk_attrs(a)


def _vars_of(x: Any) -> Iterator[str]:
    if isinstance(x, Var):
        yield x.name
    elif isinstance(x, Call):
        for a in x.args:
            yield from _vars_of(a)
    elif isinstance(x, Term):
        for p in x.args:
            yield from _vars_of(p)
        for _, e in x.attrs:
            yield from _vars_of(e)


# ---------------------------------------------------------------------------------------------------------------
# Writing rules back as text (the rule generator's output)


def literal(value: Any) -> Expr:
    """An attribute value as the parser reads it written: a vector as `(vec ...)`, a number as itself."""
    if isinstance(value, (tuple, list)):
        return Call("vec", tuple(Lit(v) for v in value))
    return Lit(value)


def format_expr(e: Any) -> str:
    """An expression, guard or attribute value as the rule language writes it."""
    if isinstance(e, Var):
        return f"?{e.name}"
    if isinstance(e, Lit):
        return format_expr(e.value)
    if isinstance(e, Call):
        return f"({' '.join([e.fn, *(format_expr(a) for a in e.args)])})"
    if isinstance(e, Term):
        return format_pattern(e)
    if isinstance(e, tuple):
        return f"(vec {' '.join(format_expr(v) for v in e)})" if e else "(vec)"
    if isinstance(e, bool) or not isinstance(e, (int, float)):
        raise RuleError(f"cannot write {e!r} in a rule")
    return repr(e)


def format_pattern(p: Pattern) -> str:
    """A pattern as the rule language writes it: `(op args... :attr value ...)`."""
    if isinstance(p, Var):
        return f"?{p.name}"
    parts = [p.op, *(format_pattern(a) for a in p.args)]
    parts += [f":{name} {format_expr(value)}" for name, value in p.attrs]
    return f"({' '.join(parts)})"


def format_rule(rule: Rule) -> str:
    """`rule` in the rule language; `parse_rules` reads it back as the same rule."""
    if rule.multi:
        lhs = f"({' '.join(format_pattern(p) for p in rule.lhs)})"
        rhs = f"({' '.join(format_pattern(p) for p in rule.rhs)})"
    else:
        lhs, rhs = format_pattern(rule.lhs[0]), format_pattern(rule.rhs[0])
    lines = [f"({'multi' if rule.multi else 'rule'} {rule.name}", f"  {lhs}", f"  {rhs}"]
    if rule.lets:
        lines.append(f"  :let ({' '.join(f'(?{name} {format_expr(value)})' for name, value in rule.lets)})")
    if rule.guards:
        lines.append(f"  :when ({' '.join(format_expr(g) for g in rule.guards)})")
    if rule.tolerance:
        lines.append(f"  :tolerance {rule.tolerance!r}")
    return "\n".join(lines) + ")"


# ---------------------------------------------------------------------------------------------------------------
# egglog compilation


def _egg_var(name: str) -> str:
    return f"v-{name}"


def _egg_shape(name: str) -> str:
    return f"sh-{name}"


def _egg_symbolic_shape(name: str) -> str:
    return f"sy-{name}"


class _EggCompiler:
    def __init__(self, rule: Rule, symbolic: bool = False) -> None:
        self.rule = rule
        self.fresh = 0
        self.shapes: set[str] = set()
        # with `symbolic`, guards read dims from `sym-shape-of` (each symbolic dim at a size of its own, see
        # `ir.Graph.symbolic`), so that a rule applies only where its guard holds at every size of them; a tensor
        # whose symbolic dims are not known matches no guard on its dims. Ranks, and the right side's attributes,
        # are read from the shapes at the sizes optimized at, and a dim an attribute reads must be static: the size
        # it writes would hold at one size only.
        self.symbolic = symbolic
        self.in_guard = False
        self.in_attribute = False
        self.symbolic_shapes: set[str] = set()
        self.static: list[str] = []
        self.let_terms = {n: v for n, v in rule.lets if isinstance(v, Term)}
        # egglog looks up a function's table (`ones`) in a query, not in an action: a right side's lookup is bound
        # in the query to a variable of its own
        self.hoisted: dict[str, str] = {}
        # with `symbolic`, a left side's Reshape whose target is a variable is bound to an e-class variable of its
        # own (`self.bound`), and the target read in a guard is that Reshape's symbolic dims: its sizes optimized
        # at would not match a symbolic dim of another tensor
        self.bound: list[str] = []
        self.targets: dict[str, str] = {}

    def expr(self, e: Expr) -> str:
        if isinstance(e, Var):
            if self.in_guard and e.name in self.targets:
                self.symbolic_shapes.add(self.targets[e.name])
                return _egg_symbolic_shape(self.targets[e.name])
            return _egg_var(e.name)
        if isinstance(e, Lit):
            if isinstance(e.value, tuple):
                return f"(vec-of {' '.join(map(str, e.value))})"
            return repr(e.value)
        args = e.args
        if e.fn in ("dim", "rank", "shape", "same-except", "same-shape"):
            return self.shape_expr(e.fn, args)
        if e.fn == "vec":
            return f"(vec-of {' '.join(self.expr(a) for a in args)})"
        if e.fn == "vec-set":
            return f"(vec-set {' '.join(self.expr(a) for a in args)})"
        if e.fn == "ones":
            lookup = f"(ones {self.expr(args[0])})"
            return self.hoisted.setdefault(lookup, f"lookup-{len(self.hoisted)}")
        fn = {">": "<", ">=": "<="}.get(e.fn, e.fn)
        parts = [self.expr(a) for a in args]
        if e.fn in (">", ">="):
            parts.reverse()
        return f"({fn} {' '.join(parts)})"

    def shape_expr(self, fn: str, args: tuple[Expr, ...]) -> str:
        """A function of tensor shapes; the query binds the shapes of its tensor variables (`self.shapes`)."""
        sh = []
        symbolic = self.in_guard and fn != "rank"
        for t in args[: 2 if fn.startswith("same") else 1]:
            if not isinstance(t, Var):
                raise RuleError(f"rule {self.rule.name}: {fn} takes a tensor variable")
            (self.symbolic_shapes if symbolic else self.shapes).add(t.name)
            sh.append(_egg_symbolic_shape(t.name) if symbolic else _egg_shape(t.name))
        static = self.in_attribute and fn in ("dim", "shape")
        if static:  # read at the sizes optimized at: only where it is the same at every size
            self.symbolic_shapes.add(args[0].name)  # type: ignore[union-attr]
        if fn == "dim":
            idx = args[1]
            if isinstance(idx, Lit) and isinstance(idx.value, int) and idx.value < 0:
                at = f"(+ (vec-length {sh[0]}) {idx.value})"
            else:
                at = self.expr(idx)
            if static:
                sy = _egg_symbolic_shape(args[0].name)  # type: ignore[union-attr]
                self._require(f"(= (vec-get {sh[0]} {at}) (vec-get {sy} {at}))")
            return f"(vec-get {sh[0]} {at})"
        if fn == "rank":
            return f"(vec-length {sh[0]})"
        if fn == "shape":
            if static:
                self._require(f"(= {sh[0]} {_egg_symbolic_shape(args[0].name)})")  # type: ignore[union-attr]
            return sh[0]
        a, b = sh
        if fn == "same-shape":
            # Both sides computed, so egglog filters matched terms instead of joining tensors by shape (70x faster
            # on NasNet-A's e-graph than equating the two shape variables).
            return f"(= (vec-push {a} 0) (vec-push {b} 0))"
        ax = self.expr(args[2])  # same-except
        if isinstance(args[2], Lit) and isinstance(args[2].value, int) and args[2].value < 0:
            ax = f"(+ (vec-length {a}) {args[2].value})"
        return f"(= (vec-set {a} {ax} 0) (vec-set {b} {ax} 0))"

    def _require(self, condition: str) -> None:
        if condition not in self.static:
            self.static.append(condition)

    def pattern(self, p: Pattern, lhs: bool) -> str:
        if isinstance(p, Var):
            if not lhs and p.name in self.let_terms:
                return self.pattern(self.let_terms[p.name], lhs)
            return _egg_var(p.name)
        d = ops.REGISTRY[p.op]
        given = dict(p.attrs)
        parts = [self.pattern(a, lhs) for a in p.args]
        for name in d.attr_names:
            if name in given:
                # the dims it reads, through :let too, must be static; but a Reshape's target is written again for
                # every size of the symbolic dims (`tensat.onnx.symbolic.generalize`), and verified at other sizes
                if self.symbolic and not lhs and (p.op, name) != ("reshape", "shape"):
                    self.in_attribute = True
                    self.expr(inline_lets(given[name], self.rule.lets))
                    self.in_attribute = False
                parts.append(self.expr(given[name]))
            elif lhs:
                self.fresh += 1
                parts.append(f"any-{self.fresh}")
            else:
                raise RuleError(f"rule {self.rule.name}: right-side {p.op} needs attribute :{name}")
        term = f"({d.egg} {' '.join(parts)})"
        target = given.get("shape") if p.op == "reshape" else None
        if lhs and self.symbolic and isinstance(target, Var) and target.name not in self.targets:
            node = f"reshape-{len(self.bound)}"
            self.bound.append(f"(= {_egg_var(node)} {term})")
            self.targets[target.name] = node
            return _egg_var(node)
        return term

    def compile(
        self, ruleset: str, guard: str | None = None, name: str | None = None, roots_in: Sequence[tuple[str, int]] = ()
    ) -> str:
        query = [f"({relation} root{k})" for relation, k in roots_in]
        query += [f"(= root{i} {self.pattern(t, True)})" for i, t in enumerate(self.rule.lhs)]
        if guard is not None:  # first: the relation is small, the plain patterns are not
            query = [f"({guard} root{i})" for i in range(len(self.rule.lhs))] + query
        query += self.bound
        if self.rule.multi:
            query.append("(!= root0 root1)")
        if self.rule.symmetric:
            query.append("(= root0 (ordering-min root0 root1))")
        lets = [f"(= {_egg_var(n)} {self.expr(v)})" for n, v in self.rule.lets if not isinstance(v, Term)]
        self.in_guard = self.symbolic
        guards = [self.expr(inline_lets(g, self.rule.lets) if self.symbolic else g) for g in self.rule.guards]
        self.in_guard = False
        actions = [f"(union root{i} {self.pattern(p, False)})" for i, p in enumerate(self.rule.rhs)]
        shapes = [f"(= {_egg_shape(v)} (shape-of {_egg_var(v)}))" for v in sorted(self.shapes)]
        shapes += [f"(= {_egg_symbolic_shape(v)} (sym-shape-of {_egg_var(v)}))" for v in sorted(self.symbolic_shapes)]
        lookups = [f"(= {name} {lookup})" for lookup, name in self.hoisted.items()]
        body = " ".join(query + shapes + lets + lookups + guards + self.static)
        name = (name or self.rule.name).replace('"', "")
        return f'(rule ({body}) ({" ".join(actions)}) :ruleset {ruleset} :name "{name}")'


def to_egglog(
    rule: Rule,
    ruleset: str,
    guard: str | None = None,
    name: str | None = None,
    roots_in: Sequence[tuple[str, int]] = (),
    symbolic: bool = False,
) -> str:
    """The egglog rule command for `rule` in `ruleset`. With `guard` (an egglog relation over tensors), the rule
    matches only where every left pattern's root is in the relation; each (relation, k) of `roots_in` also
    requires the k-th root to be in that relation; `name` overrides the rule's name in egglog's reports. With
    `symbolic`, its guards read the tensors' symbolic dims (`sym-shape-of`): for a graph with symbolic dims."""
    return _EggCompiler(rule, symbolic).compile(ruleset, guard, name, roots_in)


# ---------------------------------------------------------------------------------------------------------------
# Concrete evaluation (verifier, sequential search)


def eval_expr(e: Any, env: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> Any:
    """Value of an expression or guard given attribute/let values `env` and tensor shapes `shapes`."""
    if isinstance(e, Var):
        return env[e.name]
    if isinstance(e, Lit):
        return e.value
    fn, args = e.fn, e.args
    if fn == "dim":
        shape = shapes[args[0].name]
        return shape[_index(args[1], eval_expr(args[1], env, shapes), len(shape))]
    if fn == "rank":
        return len(shapes[args[0].name])
    if fn == "shape":
        return tuple(shapes[args[0].name])
    if fn == "same-shape":
        return shapes[args[0].name] == shapes[args[1].name]
    if fn == "same-except":
        a, b = shapes[args[0].name], shapes[args[1].name]
        ax = eval_expr(args[2], env, shapes)
        if isinstance(args[2], Lit) and ax < 0:
            ax += len(a)
        return len(a) == len(b) and 0 <= ax < len(a) and a[:ax] + a[ax + 1 :] == b[:ax] + b[ax + 1 :]
    vals = [eval_expr(a, env, shapes) for a in args]
    if fn == "vec":
        return tuple(vals)
    if fn == "vec-get":
        return vals[0][_index(args[1], vals[1], len(vals[0]))]
    if fn == "vec-set":
        v = list(vals[0])
        v[_index(args[1], vals[1], len(v))] = vals[2]
        return tuple(v)
    if fn == "ones":
        if not 0 <= vals[0] <= ops.MAX_RANK:
            raise IndexError(f"no shape of {vals[0]} ones")
        return (1,) * vals[0]
    binary: dict[str, Callable[[Any, Any], Any]] = {
        "+": lambda a, b: a + b,
        "-": lambda a, b: a - b,
        "*": lambda a, b: a * b,
        "/": _trunc_div,
        "%": lambda a, b: a - b * _trunc_div(a, b),
        "min": min,
        "max": max,
        "=": lambda a, b: a == b,
        "!=": lambda a, b: a != b,
        "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b,
    }
    return binary[fn](*vals)


def _trunc_div(a: int, b: int) -> int:
    """Integer division rounding toward zero, as egglog's i64 `/` does."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _index(arg: Any, i: int, length: int) -> int:
    """An index as egglog reads it: a negative literal counts from the end, any other index must be in range."""
    if isinstance(arg, Lit) and i < 0:
        i += length
    if not 0 <= i < length:
        raise IndexError(f"index {i} out of range for length {length}")
    return i


def attr_value(value: Any) -> Any:
    """An evaluated attribute in the IR's canonical form."""
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return value


def instantiate(
    p: Pattern, tensors: Mapping[str, np.ndarray], env: Mapping[str, Any], lets: Mapping[str, Any] = {}
) -> np.ndarray:
    """Numpy value of a pattern under variable bindings (tensor values; attribute/let values)."""
    if isinstance(p, Var):
        if p.name in tensors:
            return tensors[p.name]
        return instantiate(lets[p.name], tensors, env, lets)
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    args = [instantiate(a, tensors, env, lets) for a in p.args]
    attrs = {k: attr_value(eval_expr(e, env, shapes)) for k, e in p.attrs}
    ops.shape_of(p.op, [a.shape for a in args], attrs)
    return ops.evaluate(p.op, args, attrs)


class Evaluation:
    """Patterns compiled for evaluation at many bindings, each on many tensors (the verifier's samples, each drawn at
    every spread): each distinct subterm once. `bind` evaluates the attributes and checks the shapes (ops.ShapeError)
    at one binding; the values are `instantiate`'s, operation for operation."""

    def __init__(self, patterns: Sequence[Pattern], tensors: Collection[str], lets: Mapping[str, Pattern] = {}) -> None:
        self._nodes: list[Pattern] = []  # a leaf (a variable of `tensors`) or a term, each after its operands
        self._args: list[tuple[int, ...]] = []
        slots: dict[Pattern, int] = {}

        def slot(p: Pattern) -> int:
            if isinstance(p, Var) and p.name not in tensors:
                return slot(lets[p.name])
            if p not in slots:
                args = () if isinstance(p, Var) else tuple(slot(a) for a in p.args)
                self._nodes.append(p)
                self._args.append(args)
                slots[p] = len(self._nodes) - 1
            return slots[p]

        self.outputs = [slot(p) for p in patterns]

    def bind(
        self, shapes: Mapping[str, tuple[int, ...]], env: Mapping[str, Any]
    ) -> tuple[Callable[[Mapping[str, np.ndarray]], list[np.ndarray]], list[tuple[int, ...]]]:
        """(the patterns' values as a function of tensors of `shapes`, one per leaf variable, attributes from `env`;
        the patterns' shapes)."""
        steps: list[tuple[str, tuple[int, ...], dict[str, Any] | None]] = []  # (op, operands, attrs); a leaf's None
        known: list[tuple[int, ...]] = []
        for p, args in zip(self._nodes, self._args):
            if isinstance(p, Var):
                known.append(tuple(shapes[p.name]))
                steps.append((p.name, args, None))
            else:
                attrs = {k: attr_value(eval_expr(e, env, shapes)) for k, e in p.attrs}
                known.append(ops.shape_of(p.op, [known[a] for a in args], attrs))
                steps.append((p.op, args, attrs))
        outputs = self.outputs

        def values(tensors: Mapping[str, np.ndarray]) -> list[np.ndarray]:
            out: list[np.ndarray] = []
            for name, args, attrs in steps:
                out.append(tensors[name] if attrs is None else ops.evaluate(name, [out[a] for a in args], attrs))
            return [out[k] for k in outputs]

        return values, [known[k] for k in outputs]


def load_rule_files(paths: Sequence[str]) -> list[Rule]:
    """Parse rule files, keeping each rule's file name as its source."""
    rules: list[Rule] = []
    names: set[str] = set()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for r in parse_rules(f.read()):
                if r.name in names:
                    raise RuleError(f"duplicate rule name {r.name!r} in {path}")
                names.add(r.name)
                rules.append(Rule(r.name, r.lhs, r.rhs, r.lets, r.guards, source=str(path), tolerance=r.tolerance))
    return rules


def bind_lets(
    rule: Rule, attrs: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rule's `:let`s at a binding: (the attribute values with each let expression's value, the let terms by
    name). An expression that cannot be evaluated raises as `eval_expr` does."""
    env: dict[str, Any] = dict(attrs)
    lets: dict[str, Any] = {}
    for name, value in rule.lets:
        if isinstance(value, Term):
            lets[name] = value
        else:
            env[name] = eval_expr(value, env, shapes)
    return env, lets


def guards_hold(rule: Rule, env: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """Whether `rule`'s guards hold at a binding (attribute and `:let` values `env`); one that cannot be evaluated
    there (an index out of range, a division by zero) does not, as the compiled egglog rule fails such a match."""
    try:
        return all(eval_expr(g, env, shapes) for g in rule.guards)
    except (IndexError, ZeroDivisionError, ValueError, TypeError):
        return False


def evaluate_sides(
    rule: Rule, tensors: Mapping[str, np.ndarray], attrs: Mapping[str, Any]
) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Numpy values of each (left, right) pair under bindings, or None where the guards reject the bindings.

    `tensors` binds the left side's tensor variables, `attrs` its attribute variables. A guard that cannot be
    evaluated (an index out of range, a division by zero) rejects the bindings, as the compiled egglog rule does.
    """
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    try:
        env, lets = bind_lets(rule, attrs, shapes)
    except (IndexError, ZeroDivisionError, ValueError, TypeError):
        return None  # egglog fails such a match too (out-of-range vec-get, division by zero)
    if not guards_hold(rule, env, shapes):
        return None
    return [
        (instantiate(lhs, tensors, env, lets), instantiate(rhs, tensors, env, lets))
        for lhs, rhs in zip(rule.lhs, rule.rhs)
    ]
