"""Generated rules: TASO's substitution generator over the operator registry, minimized with an e-graph as Ruler
does, and verified.

1. **Enumeration.** Every term of up to `max_ops` operators over the leaf tensors `?x ?y ?z` (all of rank `rank`,
   every dim the same size), the vectors `?b ?c` of that size where asked (a conv's bias), and the constants where
   asked (`constant_leaf`: a float32 scalar of shape ones(rank), a power's exponent or a scale), and the registry's
   ops, each attribute drawn from the domain its `OpDef` declares for the verifier, or from the values it declares
   for the generator (`OpDef.generated`: a slice's start and size, valid at every leaf size; a conv's pads that fit
   its n x n kernel). As in Ruler, terms are built from one representative per class of
   equal fingerprints: a term equal to a smaller one is a candidate rule, not a building block, since the rule that
   equates them derives every larger term built from it. A term whose value is one number whatever the leaves
   (x - x) is left out.
2. **Fingerprints.** Each term is evaluated with numpy (float64) on random leaves (small integers, as TASO's, of
   either sign, or positive ones where asked: sqrt of a negative leaf leaves its term out) at
   every size of `sizes`, so that an equality holding at one shape only (a transpose of a 1x1 tensor) is not taken
   for a rule. Values are compared rounded to float32: an equality that float64 rounding blurs is still a
   candidate, and the verifier decides.
3. **Candidate pairs**, from equal fingerprints, each pruned as TASO prunes: the same up to variable renaming, or an
   instance of a smaller candidate with a subterm both sides share made a variable.
4. **Refutation.** A pair whose sides differ on random float leaves is an integer coincidence, dropped before the
   e-graph and the verifier spend time on it.
5. **Minimization.** Smallest first, and those over one set of ops together, candidates are checked against the
   rules kept so far by equality saturation (a `Prover`, run by the caller: the e-graph lives above the rule
   library); one the kept rules derive is dropped.
6. **Verification.** A candidate not derived becomes the rules of its valid orientations (a left side that is an op,
   a right side whose variables the left binds). Each must keep its shape at every leaf shape of a small set
   (`shape_sound`: broadcasts are where the verifier's samples miss most) and pass `rewrites.verify` at two seeds
   (each variant on the way, below, is screened at the first; the rule kept is checked at both). A constant leaf is
   written for any rank, as the hand-written rules write a scalar (`_broadcast_constants`).
   One that fails is retried with guards of the enumeration's two assumptions, its leaves' rank and their equal
   shapes (`same-shape`), but not where the binding that refuted it satisfies them; one that fails with both is
   rejected. A rule that fixes an integer attribute (an axis, a perm, pads) is only tried guarded to the rank: the
   value means something else at another.
   A rule kept is **generalized**: each attribute value its left side fixes becomes a variable wherever the rule
   still holds, for attributes the verifier checks at every value (an axis, a permutation, a slice's start and
   size; `OpDef.exhaustive` and `OpDef.solved`), or at each case it samples, as a hand-written rule is (a conv's
   strides, pads, dilations and group; `OpDef.sampled`). Found at axis 0, `relu(concat(x, y))` = `concat(relu(x),
   relu(y))` is kept for every axis, and derives the candidates of the other axes; left with no integer attribute
   fixed, it sheds its rank guards where it holds at every rank.
7. **Multi-pattern rules**, over pairs of terms: a candidate `concat(a, b) = m` whose halves are terms that share
   an input becomes the rule that rewrites the pair (a, b) into the two slices of m, as Tensat merges two matmuls
   through concat and split. It is verified like the others, and one whose patterns are an instance of a kept
   one's is dropped.

The result is written as a rule file (`rules_text`) whose header says how to make it again.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

import numpy as np

from tensat import ops

from .dsl import (
    Call,
    Expr,
    Lit,
    Pattern,
    Rule,
    Term,
    Var,
    _rename,
    _vars_of,
    attr_value,
    bind_lets,
    canonical_form,
    eval_expr,
    format_rule,
    instantiate,
    literal,
    pattern_ops,
)
from .verify import SPREADS, close, draw_leaves, kept_from_zero, pattern_shape, verify_rule
from .workers import Workers

LEAVES = ("x", "y", "z", "w")  # the tensor leaves, of which a generation takes the first `Settings.leaves`
VECTORS = ("b", "c")  # rank-1 leaves of the leaves' size (`Settings.vectors`): a conv's bias
# a leaf of the tensors' rank, 1 in every dim but the second (`Settings.channels`): a per-channel scale or shift of an
# NCHW tensor, a row at rank 2
CHANNELS = ("r",)
MAX_BATCH = 64  # candidates checked, verified and kept in one minimization round, at most
VERIFY_TRIALS, VERIFY_CASES = 8, 8  # bindings per combination, and in all, a generated rule is verified on
VERIFY_SEEDS = 2  # ... at each of this many seeds
# the leaves' elements, as TASO draws its fingerprints' inputs: small nonzero integers, so that comparisons tie and
# polynomial ops are exact (a division by zero, a root of a negative leave a term out where it occurs)
LEAF_VALUES = np.array([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0])
# ... where the leaves are positive (`Settings.positive`)
POSITIVE_LEAF_VALUES = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
CONSTANT_TOLERANCE = 1e-12  # relative: a term's value is one number where its elements agree this closely
REFUTE_TOLERANCE = 1e-6  # relative: float64 evaluations of two equal sides agree far closer


@dataclass(frozen=True)
class Settings:
    """What to enumerate: the ops (None: `default_ops`), the leaves and their shapes."""

    max_ops: int = 3
    ops: tuple[str, ...] | None = None
    rank: int = 2
    leaves: int = 3
    sizes: tuple[int, ...] = (2, 3)  # every dim of every leaf, one fingerprint per size
    seed: int = 0
    vectors: int = 0  # rank-1 leaves besides (`VECTORS`), for an op that takes one (a conv's bias)
    channels: int = 0  # leaves besides that broadcast but along their second dim (`CHANNELS`): a per-channel scale
    name: str = ""  # the set's name in its rules' names and its library file (`rule_prefix`); "" names it by its leaves
    constants: tuple[float, ...] = ()  # constant leaves besides (`constant_leaf`): a power's exponent, a scale
    positive: bool = False  # leaves drawn positive: an op defined on positive inputs alone (sqrt, log) is not left out
    # (op, attribute, values) in place of the registry's domain (`OpDef.generated`, else `OpDef.domains`): a slice of
    # sizes 1 and 2, whose two halves concatenate to one slice
    domains: tuple[tuple[str, str, tuple[Any, ...]], ...] = ()

    def __post_init__(self) -> None:
        if self.max_ops < 1:
            raise ValueError(f"max_ops must be at least 1, got {self.max_ops}")
        if not 1 <= self.leaves <= len(LEAVES):
            raise ValueError(f"leaves must be 1 to {len(LEAVES)}, got {self.leaves}")
        if not 1 <= self.rank <= ops.MAX_RANK:
            raise ValueError(f"rank must be 1 to {ops.MAX_RANK}, got {self.rank}")
        if not self.sizes or min(self.sizes) < 1:
            raise ValueError(f"sizes must be positive, got {self.sizes}")
        if not 0 <= self.vectors <= len(VECTORS):
            raise ValueError(f"vectors must be 0 to {len(VECTORS)}, got {self.vectors}")
        if not 0 <= self.channels <= len(CHANNELS) or (self.channels and self.rank < 2):
            raise ValueError(f"channels must be 0 to {len(CHANNELS)}, at rank 2 or more, got {self.channels}")
        if self.name and not re.fullmatch(r"[a-z0-9]+", self.name):
            raise ValueError(f"a set's name is lower-case letters and digits, got {self.name!r}")
        if len(set(self.constants)) != len(self.constants) or not all(np.isfinite(self.constants)):
            raise ValueError(f"constants must be distinct finite numbers, got {self.constants}")
        for op, attr, values in self.domains:
            if op not in ops.registry.REGISTRY or attr not in ops.get(op).attr_names:
                raise ValueError(f"a domain of {op}.{attr}: no such op attribute")
            if not values or len(set(values)) != len(values):
                raise ValueError(f"a domain of {op}.{attr} must be distinct values, got {values}")

    def leaf_shape(self, size: int) -> tuple[int, ...]:
        return (size,) * self.rank

    def leaf_names(self) -> tuple[str, ...]:
        """The leaves' variables: the tensors of rank `rank`, then the vectors, then the per-channel leaves."""
        return LEAVES[: self.leaves] + VECTORS[: self.vectors] + CHANNELS[: self.channels]


FLOAT32_CODE = ops.TYPE_CODES[ops.registry.FLOAT32]


def constant_leaf(value: float, rank: int) -> Term:
    """A constant leaf of the enumeration: `value` as a float32 tensor of shape ones(rank), which broadcasts against
    every leaf, as an exporter writes a scalar operand (`orientations` makes its shape any rank's)."""
    attrs = (("value", literal(float(value))), ("shape", literal((1,) * rank)), ("dtype", literal(FLOAT32_CODE)))
    return Term("fill", (), attrs)


def leaf_rank(name: str, rank: int) -> int:
    """The rank of leaf `name` in an enumeration over tensors of rank `rank`: 1 for a vector (`VECTORS`)."""
    return 1 if name in VECTORS else rank


def leaf_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of leaf `name` where the tensors are of `shape`: a vector's is its first dim; a per-channel leaf's
    is 1 but in its second (`CHANNELS`)."""
    if name in CHANNELS:
        return tuple(d if i == 1 else 1 for i, d in enumerate(shape))
    return shape[:1] if name in VECTORS else shape


def _leaf_kind(name: str) -> str:
    """A leaf's kind: of the tensors' shape, a vector, or per-channel; two leaves of one kind had one shape."""
    return "vector" if name in VECTORS else "channel" if name in CHANNELS else "tensor"


@dataclass(frozen=True)
class OpChoice:
    """An op with its attributes fixed: one constructor of the enumeration."""

    op: str
    attrs: tuple[tuple[str, Any], ...]
    arity: int
    commutative: bool

    def term(self, args: Sequence[Pattern]) -> Term:
        return Term(self.op, tuple(args), tuple((k, literal(v)) for k, v in self.attrs))


def why_not_enumerable(name: str, rank: int, vectors: int = 0) -> str | None:
    """Why op `name` cannot be enumerated over float leaves of rank `rank` (and rank 1, where there are `vectors`),
    or None when it can."""
    d = ops.get(name)
    if d.leaf or d.inputs is None or d.inputs == 0:
        return "it has no tensor inputs"
    if d.evaluate is None:
        return "it has no numpy semantics"
    unsized = sorted(set(d.solved) - set(d.generated))
    if unsized:
        return f"its attributes {', '.join(unsized)} are sized by the shapes"
    if not d.accepts(["float32"] * d.inputs):
        return "it does not take float tensors"
    ranks = (ops.SAME, None, rank, 1) if vectors else (ops.SAME, None, rank)
    if d.ranks is not None and any(r not in ranks for r in d.ranks):
        vector = not vectors and 1 in d.ranks
        return f"it takes tensors of other ranks than {rank}" + (" (and 1: give vectors)" if vector else "")
    if d.min_rank > rank:
        return f"it takes tensors of rank {d.min_rank} or more"
    missing = [a for a in d.attr_names if a not in d.domains and a not in d.generated]
    if missing:
        return f"its attributes {', '.join(missing)} have no domain"
    return None


def enumerable(rank: int, vectors: int = 0) -> list[str]:
    """Every registry op that can be enumerated over float leaves of rank `rank` (and `vectors` of rank 1)."""
    return [name for name in ops.registry.REGISTRY if why_not_enumerable(name, rank, vectors) is None]


def default_ops(rank: int) -> list[str]:
    """The ops a generation enumerates unless told (`--ops`): those of `enumerable` that are ONNX standard ops of at
    most two tensor inputs with a float output, and enumerated by default (`OpDef.enumerated_by_default`: the ops
    read for the coverage of common exports are named with `--ops`; with them a default run of three operators
    enumerated 4 million terms). An onnxruntime kernel or a normalization (three inputs or more) is
    introduced from the ops it computes by the hand-written kernel rules, and its extra inputs multiply the terms of
    a size by the number of classes of the smaller ones; a comparison's boolean output pairs with almost anything on
    a few elements. An op whose attribute is computed from its input's shape (`ops.Sized`: a reshape's target) is
    enumerated where `--ops` names it: it commutes with every element-wise op, and its candidates would take the
    default run past its time."""
    out = []
    for name in enumerable(rank):
        d = ops.get(name)
        attrs = dict(op_choices([name], rank)[0].attrs)
        boolean = ops.dtype_of(name, ["float32"] * (d.inputs or 0), attrs) == "bool"
        standard = d.standard_since is not None and (d.inputs or 0) <= 2
        if standard and d.enumerated_by_default and not boolean and not ops.registry.sized(attrs):
            out.append(name)
    return out


def op_choices(
    names: Sequence[str], rank: int, vectors: int = 0, domains: Sequence[tuple[str, str, tuple[Any, ...]]] = ()
) -> list[OpChoice]:
    """Every op of `names` with every combination of its attribute values at `rank` (those of `domains`, else the
    generator's, `OpDef.generated`, else the verifier's domain); ValueError (one line) for an op that cannot be
    enumerated."""
    given = {(op, attr): list(values) for op, attr, values in domains}
    out = []
    for name in names:
        why = why_not_enumerable(name, rank, vectors)
        if why is not None:
            raise ValueError(f"cannot enumerate {name}: {why}")
        d = ops.get(name)
        values_of = []
        for attr in d.attr_names:
            dom = given.get((name, attr), d.generated[attr] if attr in d.generated else d.domains.get(attr))
            values_of.append(list(dom(rank) if callable(dom) else cast(Sequence[Any], dom)))
        for combo in itertools.product(*values_of):
            attrs = tuple((a, tuple(v) if isinstance(v, list) else v) for a, v in zip(d.attr_names, combo))
            out.append(OpChoice(name, attrs, d.inputs or 0, d.commutative))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Enumeration and fingerprints


@dataclass
class _Class:
    """A class of terms with equal fingerprints: its first (smallest) term and that term's values per size."""

    term: Pattern
    size: int
    index: int  # enumeration order, for the canonical order of a commutative op's operands
    values: tuple[np.ndarray, ...]
    dtype: str = ops.registry.FLOAT32  # the element type tensat gives the term (a comparison's is bool)


def term_size(p: Pattern) -> int:
    """Operators in a pattern; a constant (`fill`, a leaf op) is a leaf, as the enumeration counts it."""
    if isinstance(p, Var) or ops.get(p.op).leaf:
        return 0
    return 1 + sum(term_size(a) for a in p.args)


def _fingerprint(values: Sequence[np.ndarray]) -> bytes | None:
    """The key of a term's values at every size, or None where one is not finite (the term is left out)."""
    h = hashlib.blake2b(digest_size=16)
    for v in values:
        if not np.isfinite(v).all():
            return None
        h.update(f"{v.shape} {v.dtype == bool}".encode())  # a comparison's False is not a float's 0
        h.update((np.asarray(v, dtype=np.float32) + np.float32(0.0)).tobytes())  # -0.0 and 0.0 alike
    return h.digest()


def _compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every tuple of `parts` sizes >= 0 summing to `total`."""
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in _compositions(total - first, parts - 1):
            yield (first, *rest)


@dataclass
class Enumeration:
    """What the enumeration found: candidate pairs (a term, the smaller term of its class) and its counts."""

    candidates: list[tuple[Pattern, Pattern]] = field(default_factory=list)
    terms: list[int] = field(default_factory=list)  # well-typed, finite terms per size (1..max_ops)
    classes: list[int] = field(default_factory=list)  # new classes per size
    constants: int = 0  # terms left out: their value is one number whatever the leaves (x - x)
    seconds: float = 0.0


Progress = Callable[[str], None]


def enumerate_terms(
    settings: Settings, progress: Progress | None = None, workers: Workers | None = None
) -> Enumeration:
    """Enumerate, fingerprint and pair every term of up to `settings.max_ops` ops (see the module docstring). The
    largest terms, most of the work, are evaluated by `workers` where given, each a share of them; they are paired
    in the enumeration's order, so that the candidates do not depend on the workers."""
    start = time.perf_counter()
    names = settings.ops if settings.ops is not None else default_ops(settings.rank)
    choices = op_choices(names, settings.rank, settings.vectors, settings.domains)
    rng = np.random.default_rng(settings.seed)
    leaves = [Var(name) for name in settings.leaf_names()]
    by_key: dict[bytes, _Class] = {}
    by_size: list[list[_Class]] = [[]]
    drawn = POSITIVE_LEAF_VALUES if settings.positive else LEAF_VALUES
    for leaf in leaves:
        values = tuple(rng.choice(drawn, leaf_shape(leaf.name, settings.leaf_shape(n))) for n in settings.sizes)
        cls = _Class(leaf, 0, len(by_key), values)
        by_key[_fingerprint(values) or b""] = cls
        by_size[0].append(cls)
    for value in settings.constants:
        term = constant_leaf(value, settings.rank)
        values = tuple(np.full((1,) * settings.rank, float(value)) for _ in settings.sizes)
        cls = _Class(term, 0, len(by_key), values)
        by_key[_fingerprint(values) or b""] = cls
        by_size[0].append(cls)
    probe = {v.name: rng.standard_normal(leaf_shape(v.name, settings.leaf_shape(settings.sizes[-1]))) for v in leaves}
    found = Enumeration()
    for size in range(1, settings.max_ops + 1):
        last = size == settings.max_ops  # the largest terms build nothing: their values are not kept
        level: list[_Class] = []
        terms = 0
        shares = workers.jobs if workers is not None and last else 1
        task = (choices, by_size, probe, len(settings.sizes), size, shares)
        keyed = workers.map(_level_keys, [(*task, k) for k in range(shares)]) if workers and shares > 1 else None
        for k, (choice, children) in enumerate(_level(choices, by_size, size)):
            if keyed is None:
                key, applied = _keyed(choice, children, len(settings.sizes), probe)
            else:
                key, applied = keyed[k % shares][k // shares], ()
            if key is None:
                continue
            if not key:
                found.constants += 1
                continue
            terms += 1
            term = choice.term([c.term for c in children])
            same = by_key.get(key)
            if same is not None:
                found.candidates.append((term, same.term))
                continue
            dtype = ops.dtype_of(choice.op, [c.dtype for c in children], dict(choice.attrs))
            cls = _Class(term, size, len(by_key), () if last else applied, dtype)
            by_key[key] = cls
            level.append(cls)
        by_size.append(level)
        found.terms.append(terms)
        found.classes.append(len(level))
        if progress is not None:
            progress(f"size {size}: {terms} terms, {len(level)} new classes, {len(found.candidates)} candidates")
    found.seconds = time.perf_counter() - start
    return found


def _level(
    choices: Sequence[OpChoice], by_size: Sequence[Sequence[_Class]], size: int
) -> Iterator[tuple[OpChoice, tuple[_Class, ...]]]:
    """(op, children) of every term of `size` ops, in the enumeration's order: each op over every combination of
    the smaller classes whose sizes add up, one order of a commutative op's operands (commutativity is a size-1
    rule)."""
    for choice in choices:
        for sizes in _compositions(size - 1, choice.arity):
            for children in itertools.product(*(by_size[s] for s in sizes)):
                if not (choice.commutative and size > 1 and children[0].index > children[1].index):
                    yield choice, children


def _keyed(
    choice: OpChoice, children: Sequence[_Class], sizes: int, probe: dict[str, np.ndarray]
) -> tuple[bytes | None, tuple[np.ndarray, ...]]:
    """(fingerprint, values) of `choice` over `children`: None where it does not type-check or a value is not
    finite, b"" where the term is a constant (`_constant`)."""
    with np.errstate(all="ignore"):
        applied = _apply(choice, children, sizes)
        key = None if applied is None else _fingerprint(applied)
        if applied is None or key is None:
            return None, ()
        if _constant(choice.term([c.term for c in children]), applied, probe):
            return b"", ()
    return key, applied


def _level_keys(task: tuple[Any, ...]) -> list[bytes | None]:
    """For a worker: the fingerprints (`_keyed`) of share `k` of `shares` of the terms of one size, every
    `shares`-th from the `k`-th in the enumeration's order."""
    choices, by_size, probe, sizes, size, shares, k = task
    terms = itertools.islice(_level(choices, by_size, size), k, None, shares)
    return [_keyed(choice, children, sizes, probe)[0] for choice, children in terms]


def _one_number(values: Sequence[np.ndarray]) -> bool:
    """Whether every value holds one number, the same at every size (to float64 rounding: a softmax's sum)."""
    first = values[0].flat[0] if values[0].size else None
    if first is None:
        return False
    tol = CONSTANT_TOLERANCE * max(1.0, abs(float(first)))
    for v in values:
        if not v.size:
            return False
        if v.dtype == bool:
            if not np.all(v == first):
                return False
        elif abs(v.flat[-1] - first) > tol or abs(v.max() - first) > tol or abs(v.min() - first) > tol:
            return False
    return True


def _constant(term: Pattern, values: Sequence[np.ndarray], probe: dict[str, np.ndarray]) -> bool:
    """Whether a term's value depends on no leaf: one number at each size, and the same number on `probe`'s float
    leaves at the last size (x - x, x / x, a softmax over one element, a softmax's sum, a mean of a softmax,
    which is 1/n). Without constants among the leaves, its equations (x * (y - y) = z - z) only say how to make a
    constant. A sum of every element is one number at each size too, but not the same on other leaves."""
    if not all(_one_number([v]) for v in values):
        return False
    with np.errstate(all="ignore"):
        value = np.asarray(instantiate(term, probe, {}, {}))
    return _one_number([values[-1], value])


def _apply(choice: OpChoice, children: Sequence[_Class], sizes: int) -> tuple[np.ndarray, ...] | None:
    """`choice` applied to the children's values at every size, or None where it does not type-check (its shapes,
    or element types the op is not modelled on: a relu of a comparison)."""
    if not ops.get(choice.op).accepts([c.dtype for c in children]):
        return None
    attrs = dict(choice.attrs)
    out = []
    for k in range(sizes):
        args = [c.values[k] for c in children]
        try:
            ops.shape_of(choice.op, [a.shape for a in args], attrs)
            value = np.asarray(ops.evaluate(choice.op, args, attrs))
            out.append(value if value.dtype == bool else value.astype(np.float64, copy=False))
        except (ops.ShapeError, ValueError, IndexError, TypeError):
            return None
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------------
# Pruning


def _sorted_operands(p: Pattern) -> Pattern:
    """`p` with a commutative op's two operands in one order (by their text): add(relu(y), x) as add(x, relu(y))."""
    if isinstance(p, Var):
        return p
    args = tuple(_sorted_operands(a) for a in p.args)
    if ops.get(p.op).commutative:
        args = tuple(sorted(args, key=repr))
    return Term(p.op, args, p.attrs)


def equation_key(a: Pattern, b: Pattern) -> tuple[Pattern, Pattern]:
    """The equation a = b up to variable renaming, the order of its sides and of a commutative op's operands."""
    a, b = _sorted_operands(a), _sorted_operands(b)
    keys = []
    for first, second in ((a, b), (b, a)):
        order: dict[str, str] = {}
        for name in itertools.chain(_vars_of(first), _vars_of(second)):
            order.setdefault(name, f"v{len(order)}")
        keys.append((_rename(first, order), _rename(second, order)))
    return min(keys, key=repr)


def _subterms(p: Pattern) -> Iterator[Term]:
    if isinstance(p, Term):
        yield p
        for a in p.args:
            yield from _subterms(a)


def _replaced(p: Pattern, old: Term, new: Var) -> Pattern:
    if p == old:
        return new
    if isinstance(p, Var):
        return p
    return Term(p.op, tuple(_replaced(a, old, new) for a in p.args), p.attrs)


def _vars(p: Pattern) -> set[str]:
    return set(_vars_of(p))


def prune(candidates: Sequence[tuple[Pattern, Pattern]]) -> tuple[list[tuple[Pattern, Pattern]], int, int]:
    """TASO's pruning: (kept, dropped as renamings, dropped as instances of a smaller candidate whose shared
    subterm is a variable). Candidates are kept smallest first."""
    ordered = sorted(candidates, key=_order)
    seen: set[tuple[Pattern, Pattern]] = set()
    unique = []
    for a, b in ordered:
        key = equation_key(a, b)
        if key not in seen:
            seen.add(key)
            unique.append((a, b))
    kept, common = [], 0
    for a, b in unique:
        shared = {t for t in _subterms(a) if t != a and t != b} & {t for t in _subterms(b) if t != a and t != b}
        fresh = Var(next(n for n in ("s", "t", "u", "w") if n not in _vars(a) | _vars(b)))
        if any(equation_key(_replaced(a, t, fresh), _replaced(b, t, fresh)) in seen for t in shared):
            common += 1
            continue
        kept.append((a, b))
    return kept, len(candidates) - len(unique), common


def _order(pair: tuple[Pattern, Pattern]) -> tuple[Any, ...]:
    """Smaller equations first, then those with more variables (more general), then by text (deterministic)."""
    a, b = pair
    return (max(term_size(a), term_size(b)), term_size(a) + term_size(b), -len(_vars(a) | _vars(b)), repr(pair))


# ---------------------------------------------------------------------------------------------------------------
# Refutation


def refuted(pair: tuple[Pattern, Pattern], shape: tuple[int, ...], rng: np.random.Generator) -> bool:
    """Whether the two sides differ on random float leaves of `shape` (a vector of its first dim; one draw at each of
    the verifier's spreads): an integer coincidence of the fingerprints (`sign(x + sigmoid(y)) = sign(x)` holds
    wherever x is a nonzero integer), dropped before the e-graph and the verifier spend time on it. Positions where a
    side is not finite decide nothing, nor do sides not typed at `shape` (three convs of an n x n kernel in a row)."""
    a, b = pair
    positive, nonzero = kept_from_zero((a, b))
    for scale in SPREADS:
        leaves = draw_leaves(
            rng, {v: leaf_shape(v, shape) for v in sorted(_vars(a) | _vars(b))}, scale, positive, nonzero
        )
        try:
            with np.errstate(all="ignore"):
                left = np.asarray(instantiate(a, leaves, {}, {}), dtype=np.float64)
                right = np.asarray(instantiate(b, leaves, {}, {}), dtype=np.float64)
        except ops.ShapeError:
            return False
        if left.shape != right.shape:
            return True
        finite = np.isfinite(left) & np.isfinite(right)
        magnitude = max(1.0, float(np.max(np.abs(left[finite]), initial=0.0)))
        if not np.allclose(left[finite], right[finite], rtol=REFUTE_TOLERANCE, atol=REFUTE_TOLERANCE * magnitude):
            return True
    return False


# ---------------------------------------------------------------------------------------------------------------
# Rules of a candidate, verification and minimization


def orientations(a: Pattern, b: Pattern, name: str, shape: tuple[int, ...] | None = None) -> list[Rule]:
    """The rules of equation a = b: each direction whose left side is an op and binds the right side's variables,
    but not one that only wraps its left side (`(relu ?x)` into `(relu (relu ?x))`: it grows the e-graph without
    end and the other direction proves the same), nor the second of two directions that are one rule up to renaming
    (commutativity). With the leaves' `shape`, a value computed from shapes (`ops.Sized`) is guarded equal to each
    leaf's dim or shape that it equals wherever the enumeration computed it (`_sized_guards`); the verification
    drops those it does not need (`_fewer_sized`)."""
    out: list[Rule] = []
    guards = _sized_guards((a, b), shape) if shape is not None else {}
    a, b = _sized_as_vars((a, b))
    for lhs, rhs, suffix in ((a, b, ""), (b, a, "-rev")):
        if not isinstance(lhs, Term) or not _vars(rhs) <= _vars(lhs) or lhs in set(_subterms(rhs)):
            continue
        sized = tuple(g for found in guards.values() for g in found if cast(Var, g.args[0]).name in _vars(lhs))
        rule = _broadcast_constants(Rule(name + suffix, (lhs,), (rhs,), guards=sized))
        if not any(canonical_form(r) == canonical_form(rule) for r in out):
            out.append(rule)
    return out


def _is_constant_leaf(p: Pattern) -> bool:
    """Whether `p` is a constant leaf as the enumeration builds it (`constant_leaf`): a fill of all-ones shape."""
    if not isinstance(p, Term) or p.op != "fill":
        return False
    shape = dict(p.attrs)["shape"]
    return isinstance(shape, Call) and shape.fn == "vec" and all(a == Lit(1) for a in shape.args)


def _broadcast_constants(rule: Rule) -> Rule:
    """`rule` with its constant leaves (`constant_leaf`) of any rank, as the hand-written rules write a scalar
    operand: on the left, a fill of any element type whose shape is a variable the guard `(= ?s (ones (rank ?x)))`
    ties to the rank of the left side's first tensor; on the right, a float32 fill of shape `(ones (rank ?x))`.
    The enumeration saw them at one rank; the verifier checks the rule at others."""
    if not any(_is_constant_leaf(t) for p in (*rule.lhs, *rule.rhs) for t in _subterms(p)):
        return rule
    first = Var(rule.tensor_vars()[0])
    ones = Call("ones", (Call("rank", (first,)),))
    taken = {v for p in (*rule.lhs, *rule.rhs) for v in _vars(p)}
    guards: list[Call] = []

    def left(leaf: Term) -> Term:
        shape, dtype = _fresh("s", taken), _fresh("t", taken)
        taken.update((shape.name, dtype.name))
        guards.append(Call("=", (shape, ones)))
        return Term(leaf.op, (), tuple((k, {"shape": shape, "dtype": dtype}.get(k, e)) for k, e in leaf.attrs))

    def right(leaf: Term) -> Term:
        return Term(leaf.op, (), tuple((k, ones if k == "shape" else e) for k, e in leaf.attrs))

    lhs = tuple(cast(Term, _constants_replaced(t, left)) for t in rule.lhs)
    rhs = tuple(_constants_replaced(t, right) for t in rule.rhs)
    return replace(rule, lhs=lhs, rhs=rhs, guards=rule.guards + tuple(guards))


def _constants_replaced(p: Pattern, new: Callable[[Term], Term]) -> Pattern:
    """`p` with each of its constant leaves (`_is_constant_leaf`) made `new(leaf)`, in order."""
    if isinstance(p, Var):
        return p
    if _is_constant_leaf(p):
        return new(p)
    return Term(p.op, tuple(_constants_replaced(a, new) for a in p.args), p.attrs)


def _fresh(attr: str, taken: set[str]) -> Var:
    """The variable of attribute `attr` in a rule: named after it (`?axis`, then `?axis1`, ...), not one of `taken`."""
    return Var(next(n for n in itertools.chain([attr], (f"{attr}{i}" for i in itertools.count(1))) if n not in taken))


def _sized(p: Pattern) -> Iterator[tuple[str, Lit]]:
    """(attribute, value) of each attribute of `p`'s ops that is computed from its input shapes (`ops.Sized`)."""
    for _, k, e in _op_attrs(p):
        if isinstance(e, Lit) and isinstance(e.value, ops.Sized):
            yield k, e


def _sized_guards(patterns: Sequence[Pattern], shape: tuple[int, ...]) -> dict[tuple[str, Lit], list[Call]]:
    """For each (attribute, value computed from shapes) of `patterns`, the guards `(= ?v (dim ?x k))` (an integer)
    or `(= ?v (shape ?x))` (a shape) of each leaf's dim or shape it equals at the leaves' `shape` and at one more in
    every dim, where the enumeration computed it first; `?v` is the variable `_sized_as_vars` makes of it. A slice of
    half a concat of two leaves is a slice of one leaf's size."""
    names = _sized_var_names(patterns)
    if not names:  # most candidates: nothing computed from shapes
        return {}
    leaves = sorted({v for p in patterns for v in _vars(p) if v in (*LEAVES, *VECTORS, *CHANNELS)})
    probes = [shape, tuple(d + 1 for d in shape)]
    seen: dict[tuple[str, Lit], list[Any]] = {}
    for probe in probes:
        shapes = {v: leaf_shape(v, probe) for v in leaves}
        found: dict[tuple[str, Lit], Any] = {}
        for t in (t for p in patterns for t in _subterms(p)):
            for k, e in t.attrs:
                if not (isinstance(e, Lit) and isinstance(e.value, ops.Sized)) or (k, e) in found:
                    continue
                try:
                    ins = [pattern_shape(a, shapes, {}, {}) for a in t.args]
                    found[(k, e)] = e.value.of(ins, {kk: attr_value(eval_expr(v, {}, {})) for kk, v in t.attrs})
                except (ops.ShapeError, ValueError, IndexError, KeyError, TypeError):
                    continue
        for key, value in found.items():
            seen.setdefault(key, []).append(value)
    out: dict[tuple[str, Lit], list[Call]] = {}
    for key, values in seen.items():
        if len(values) != len(probes):
            continue
        var = Var(names[key])
        guards = []
        for leaf in leaves:
            at = [leaf_shape(leaf, probe) for probe in probes]
            if all(isinstance(v, tuple) for v in values) and [tuple(v) for v in values] == at:
                guards.append(Call("=", (var, Call("shape", (Var(leaf),)))))
            for axis in range(len(at[0])):
                if [s[axis] for s in at] == values:
                    guards.append(Call("=", (var, Call("dim", (Var(leaf), literal(axis))))))
        out[key] = guards
    return out


def _sized_var_names(patterns: Sequence[Pattern]) -> dict[tuple[str, Lit], str]:
    """The variable `_sized_as_vars` makes of each (attribute, value computed from shapes) of `patterns`."""
    taken = {v for p in patterns for v in _vars(p)}
    names: dict[tuple[str, Lit], str] = {}
    for attr, value in dict.fromkeys(pair for p in patterns for pair in _sized(p)):
        var = _fresh(attr, taken)
        taken.add(var.name)
        names[(attr, value)] = var.name
    return names


def _sized_as_vars(patterns: Sequence[Pattern]) -> list[Pattern]:
    """`patterns` with each attribute value computed from shapes (`ops.Sized`) made a variable, named after its
    attribute, one per value (two reshapes to the flat shape share one): the enumeration computed it wherever its op
    was applied, and the rule claims it for whatever value the variable is bound to, which the verifier checks."""
    out = list(patterns)
    for (attr, value), name in _sized_var_names(patterns).items():
        out = [_lift(p, attr, value, Var(name)) for p in out]
    return out


def _match(pattern: Pattern, term: Pattern, binding: dict[str, Any]) -> bool:
    """Whether `term` is an instance of `pattern` (extending `binding` of the pattern's variables, an attribute
    variable bound to the term's attribute value)."""
    if isinstance(pattern, Var):
        return binding.setdefault(pattern.name, term) == term
    if not (isinstance(term, Term) and (pattern.op, len(pattern.args)) == (term.op, len(term.args))):
        return False
    if [k for k, _ in pattern.attrs] != [k for k, _ in term.attrs]:
        return False
    for (_, want), (_, value) in zip(pattern.attrs, term.attrs):
        if isinstance(want, Var):
            if binding.setdefault(want.name, value) != value:
                return False
        elif want != value:
            return False
    return all(_match(p, t, binding) for p, t in zip(pattern.args, term.args))


def _substituted(p: Pattern, binding: dict[str, Any]) -> Pattern:
    if isinstance(p, Var):
        return binding.get(p.name, p)
    attrs = tuple((k, binding.get(e.name, e) if isinstance(e, Var) else e) for k, e in p.attrs)
    return Term(p.op, tuple(_substituted(a, binding) for a in p.args), attrs)


def instance_of(pair: tuple[Pattern, Pattern], rules: Sequence[Rule]) -> bool:
    """Whether one unguarded rule of `rules`, applied once at the root, rewrites one side of `pair` into the other:
    the pair is then derived without an e-graph (two candidates of one batch, one an instance of the other)."""
    a, b = pair
    roots = {p.op for p in pair if isinstance(p, Term)}
    for rule in rules:
        if rule.guards or rule.multi or rule.lhs[0].op not in roots:
            continue
        for src, dst in ((a, b), (b, a)):
            binding: dict[str, Pattern] = {}
            if _match(rule.lhs[0], src, binding) and _substituted(rule.rhs[0], binding) == dst:
                return True
    return False


def _same_shape_guards(rule: Rule) -> Rule:
    """`rule` guarded by its left side's tensor variables having equal shapes, those of one leaf rank (as the
    enumeration's leaves had)."""
    names = rule.tensor_vars()
    pairs = [(a, b) for a, b in itertools.combinations(names, 2) if _leaf_kind(a) == _leaf_kind(b)]
    guards = tuple(Call("same-shape", (Var(a), Var(b))) for a, b in pairs)
    return replace(rule, guards=rule.guards + guards)


def _refuting(rule: Rule, seed: int, seeds: range = range(VERIFY_SEEDS), library: bool = True) -> dict[str, Any] | None:
    """None if the verifier passes `rule` at each of `seeds` (offsets of `seed`), on VERIFY_TRIALS bindings per
    combination and VERIFY_CASES at least each (a generated rule was found by a coincidence of values, and is checked
    harder than one written by hand); else the binding it failed at ({} where it found none: too few cases, or no
    valid binding). With `library`, it is first checked as `tensat rules --verify` checks the library's file, so that
    every rule written passes it. The full check is every seed with the library's; a screen is the first seed alone
    (`SCREEN_SEEDS`), and the rest of the full check (`CONFIRM_SEEDS`) completes it."""
    if library:
        found = verify_rule(rule)
        if not found.ok:
            return dict(found.counterexample)
    for k in seeds:
        result = verify_rule(rule, trials=VERIFY_TRIALS, seed=seed + 1000 * k)
        if not (result.ok and result.cases >= VERIFY_CASES):
            return dict(result.counterexample)
    return None


SCREEN_SEEDS = range(1)  # the seeds of a variant `verified` may still refine, without the library's check
CONFIRM_SEEDS = range(1, VERIFY_SEEDS)  # ... of one that passed that screen, with it: the rest of the full check


def _probe_shapes(name: str, rank: int) -> list[tuple[int, ...]]:
    """Shapes of leaf `name` a generated rule's shapes are checked at: the enumeration's (every dim 3), one dim 2
    (not square), each dim broadcast (1), all broadcast, and one rank less; for a vector, each of its sizes."""
    if name in VECTORS:
        return [(3,), (2,), (1,)]
    full = (3,) * rank
    if name in CHANNELS:
        return [leaf_shape(name, full), leaf_shape(name, (2,) * rank), (1,) * rank, full]
    probes = [full, (2, *full[1:]), (*full[:-1], 2), (1,) * rank, full[1:]]
    probes += [tuple(1 if i == k else 3 for i in range(rank)) for k in range(rank)]
    return list(dict.fromkeys(p for p in probes if p))


def _op_attrs(p: Pattern) -> Iterator[tuple[str, str, Any]]:
    """(op, attribute, value expression) of every attribute of `p`'s ops, outermost first."""
    if isinstance(p, Term):
        for k, e in p.attrs:
            yield p.op, k, e
        for a in p.args:
            yield from _op_attrs(a)


def _attr_vars(lhs: Sequence[Term]) -> dict[str, tuple[str, str]]:
    """The attribute variables of a left side `lhs`, each with the (op, attribute) it first sets."""
    found: dict[str, tuple[str, str]] = {}
    for op, k, e in (item for t in lhs for item in _op_attrs(t)):
        if isinstance(e, Var):
            found.setdefault(e.name, (op, k))
    return found


SOLVED_PROBES = (0, 1, 2)  # values an attribute solved with shapes takes in `shape_sound` (a slice's start, size)


def _attr_probes(lhs: Sequence[Term], rank: int) -> list[dict[str, Any]]:
    """The bindings of a left side's attribute variables `shape_sound` checks, each from its op's domain at
    `rank`, or from SOLVED_PROBES for one the verifier solves with shapes: every combination of those, each with the
    first value of the attributes whose domain samples cases (`OpDef.sampled`: a conv's strides, pads, dilations,
    group) and with each other value of one of them at a time (their product, times the leaves' shapes, is more
    than a rule's check can afford)."""
    crossed: dict[str, list[Any]] = {}
    sampled: dict[str, list[Any]] = {}
    for name, (op, attr) in _attr_vars(lhs).items():
        d = ops.get(op)
        solved = [(1,) * rank, (1,) * (rank - 1)] if d.leaf and dict(d.attrs)[attr] == "ints" else SOLVED_PROBES
        dom = d.domains.get(attr, solved)
        values = [tuple(v) if isinstance(v, list) else v for v in (dom(rank) if callable(dom) else dom)]
        (sampled if attr in d.sampled else crossed)[name] = values
    base = {name: values[0] for name, values in sampled.items()}
    varied = [base] + [{**base, name: v} for name, values in sampled.items() for v in values[1:]]
    return [{**dict(zip(crossed, combo)), **one} for combo in itertools.product(*crossed.values()) for one in varied]


def shape_sound(rule: Rule, rank: int) -> bool:
    """Whether, wherever its left side is well-typed and its guards hold, `rule`'s right side is well-typed and of
    the left side's shape (each pattern of a multi-pattern rule), with every leaf at each of the probe shapes and
    every attribute variable at each of its probe values (`_attr_probes`). Deterministic, where the verifier samples
    broadcasts: `x / y / x = 1 / y` fails only where y broadcasts against x, and an e-graph that applied it would
    merge terms of different shapes. Where the leaves' shapes differ, both sides are also compared on one draw of
    values: a sum over a broadcast `x + y` is not the sum over `concat(x, y)`, though both have one shape, and the
    verifier samples such a broadcast only now and then."""
    names = rule.tensor_vars()
    rng = np.random.default_rng(int.from_bytes(hashlib.blake2b(rule.name.encode(), digest_size=4).digest(), "big"))
    positive, nonzero = kept_from_zero(rule.lhs)
    for attrs, shapes, left in _left_bindings(rule.lhs, tuple(names), rank):
        try:
            env, lets = bind_lets(rule, attrs, shapes)
            if not all(eval_expr(g, env, shapes) for g in rule.guards):
                continue
        except (ops.ShapeError, ValueError, IndexError, KeyError, TypeError):
            continue
        try:
            if [pattern_shape(t, shapes, env, lets) for t in rule.rhs] != left:
                return False
        except (ops.ShapeError, ValueError, IndexError, KeyError, TypeError):
            return False
        if len({shapes[v] for v in names if v not in VECTORS}) > 1:
            tensors = draw_leaves(rng, {v: shapes[v] for v in names}, 1.0, positive, nonzero)
            with np.errstate(all="ignore"):
                sides = [
                    (instantiate(a, tensors, env, lets), instantiate(b, tensors, env, lets))
                    for a, b in zip(rule.lhs, rule.rhs)
                ]
            if not all(close(a, b, max(1e-9, rule.tolerance)) for a, b in sides):
                return False
    return True


class _Replay:
    """An iterator's items, computed once, as it is first read, and read again from there by every later reader."""

    def __init__(self, items: Iterator[Any]) -> None:
        self._items = items
        self._seen: list[Any] = []

    def __iter__(self) -> Iterator[Any]:
        k = 0
        while True:
            if k == len(self._seen):
                try:
                    self._seen.append(next(self._items))
                except StopIteration:
                    return
            yield self._seen[k]
            k += 1


LEFT_BINDINGS = 64  # left sides whose bindings `shape_sound` keeps: the variants of one candidate check the same one


@functools.lru_cache(maxsize=LEFT_BINDINGS)
def _left_bindings(lhs: tuple[Term, ...], names: tuple[str, ...], rank: int) -> _Replay:
    """Every binding `shape_sound` checks a rule with left side `lhs` (its tensor variables `names`) at: (attributes,
    shapes, the left side's shapes), where the left side is well-typed. They depend on the left side alone, and the
    generator checks many rules with one left side (each guard set and right side of a candidate, `verified` and
    `arithmetic`): they are made once, as first read (a rule that fails stops the reading early)."""

    def made() -> Iterator[tuple[dict[str, Any], dict[str, tuple[int, ...]], list[tuple[int, ...]]]]:
        for attrs in _attr_probes(lhs, rank):
            for shapes in _typed_shapes(lhs, names, rank, attrs):
                try:
                    yield attrs, shapes, [pattern_shape(t, shapes, attrs, {}) for t in lhs]
                except (ops.ShapeError, ValueError, IndexError, KeyError, TypeError):
                    continue

    return _Replay(made())


def _typed_shapes(
    lhs: Sequence[Term], names: Sequence[str], rank: int, attrs: dict[str, Any]
) -> Iterator[dict[str, tuple[int, ...]]]:
    """Every binding of `names` to their probe shapes (`_probe_shapes`) at which every pattern of `lhs` is
    well-typed, with attributes `attrs`: the leaves are bound in order, and a subterm is checked as soon as its
    leaves are, so that a binding it rejects is not extended (a conv's left side of five leaves has thousands of
    bindings, most of them of a weight that does not fit its input)."""
    subterms = list(dict.fromkeys(t for p in lhs for t in _subterms(p)))
    checks: list[list[Term]] = [[] for _ in names]
    for t in subterms:
        used = [names.index(v) for v in _vars(t) if v in names]
        if used:
            checks[max(used)].append(t)
    shapes: dict[str, tuple[int, ...]] = {}

    def bind(k: int) -> Iterator[dict[str, tuple[int, ...]]]:
        if k == len(names):
            yield dict(shapes)
            return
        for shape in _probe_shapes(names[k], rank):
            shapes[names[k]] = shape
            try:
                for t in checks[k]:
                    pattern_shape(t, shapes, attrs, {})
            except (ops.ShapeError, ValueError, IndexError, KeyError, TypeError):
                continue
            yield from bind(k + 1)
        shapes.pop(names[k], None)

    return bind(0)


def _counterexample(rule: Rule, seed: int, rank: int, screen: bool = False) -> dict[str, Any] | None:
    """A generated rule's check: None where its shapes agree (`shape_sound`) and the verifier passes it; else the
    binding the verifier refuted it at (`_refuting`, screened or not; {} for none)."""
    if not shape_sound(rule, rank):
        return {}
    return _refuting(rule, seed, SCREEN_SEEDS, library=False) if screen else _refuting(rule, seed)


def _holds(rule: Rule, seed: int, rank: int, screen: bool = False) -> bool:
    """Whether a generated rule passes its check (`_counterexample`), or its screen."""
    return _counterexample(rule, seed, rank, screen) is None


def _admits(rule: Rule, binding: Mapping[str, Any]) -> bool:
    """Whether `rule`'s guards hold at `binding` (a verifier's counterexample: shapes and attributes), which then
    refutes `rule` too."""
    if not binding:
        return False
    shapes = binding["shapes"]
    try:
        env, _ = bind_lets(rule, dict(binding["attrs"]), shapes)
        return all(eval_expr(g, env, shapes) for g in rule.guards)
    except (ops.ShapeError, ValueError, IndexError, KeyError, TypeError):
        return False


def _refuted_by(rule: Rule, bindings: Sequence[Mapping[str, Any]]) -> bool:
    """Whether one of `bindings` (counterexamples to a rule `rule` refines) satisfies `rule`'s guards, and so refutes
    it too (`_admits`)."""
    return any(_admits(rule, binding) for binding in bindings)


def _rank_guard_calls(rule: Rule, rank: int) -> tuple[Call, ...]:
    """The guards that `rule`'s left side's tensor variables have their leaf's rank (`leaf_rank`), and a per-channel
    leaf its dims of 1 (`CHANNELS`)."""
    names = rule.tensor_vars()
    ranks = tuple(Call("=", (Call("rank", (Var(v),)), literal(leaf_rank(v, rank)))) for v in names)
    ones = tuple(
        Call("=", (Call("dim", (Var(v), literal(k))), literal(1)))
        for v in names
        if v in CHANNELS
        for k in range(rank)
        if k != 1
    )
    return ranks + ones


def _rank_guards(rule: Rule, rank: int) -> Rule:
    """`rule` guarded by its left side's tensor variables having their leaf's rank (`leaf_rank`): an
    attribute value means what it does at that rank (`slice(matmul(x, y), axis 1)` slices y's columns at rank 2)."""
    return replace(rule, guards=rule.guards + _rank_guard_calls(rule, rank))


def verified(rule: Rule, seed: int, rank: int) -> Rule | None:
    """The first of these that holds (`_holds`): `rule`; it with the guards of the enumeration's assumptions, its
    leaves' rank (`_rank_guards`), their equal shapes (`_same_shape_guards`), or both; with the equal shapes it does
    not need left out (`_fewer_same_shapes`), then generalized (`generalized`: an attribute lifted where the guards
    kept make it hold vacuously would be a rule of no use). None if none holds. A guarded one
    whose guards hold at a binding that refuted an earlier one is refuted by it too, and is not sampled (where it
    could pass by luck).

    Each variant on the way is screened (`_holds` at the first seed alone), and the rule returned is checked in full
    (the rest of the check, `CONFIRM_SEEDS`): a kept rule takes up to four variants, and most of a generation's time
    went to checking each in full. Where the refined rule fails the full check, the variant it came from is checked in
    full and refined with full checks, as without the screen."""
    specific = _rank_specific(rule)
    ranked = _rank_guards(rule, rank)
    tries = ([] if specific else [rule]) + [ranked]
    if len(rule.tensor_vars()) > 1:
        tries += ([] if specific else [_same_shape_guards(rule)]) + [_same_shape_guards(ranked)]
    bounds = tuple(g for t in rule.rhs for g in _slice_bounds(t, fixed=True))
    if bounds:
        tries.append(replace(ranked, guards=ranked.guards + bounds))
    refuted: list[dict[str, Any]] = []
    for attempt in tries:
        if _refuted_by(attempt, refuted):
            continue
        found = _counterexample(attempt, seed, rank, screen=True)
        if found is None:
            final = _refined(attempt, seed, rank, refuted, screen=True)
            if _refuting(final, seed, CONFIRM_SEEDS) is None:
                return final
            found = _refuting(attempt, seed, CONFIRM_SEEDS)
            if found is None:
                return _refined(attempt, seed, rank, refuted, screen=False)
        refuted.append(found)
    return None


def _refined(rule: Rule, seed: int, rank: int, refuted: Sequence[Mapping[str, Any]], screen: bool) -> Rule:
    """A rule that holds, without the same-shape guards it does not need (`_fewer_same_shapes`), generalized
    (`generalized`; where that leaves a slice's start or size a value, or one variable for two of them, its axes
    first, then its slices' starts and sizes by `arithmetic`, then what is left) and unranked (`_unranked`), each
    step's variant checked in full or screened."""
    fewer = _fewer_sized(_fewer_same_shapes(rule, seed, rank, refuted, screen), seed, rank, screen)
    fewer = _dim_equalities(fewer, seed, rank, screen)
    general = generalized(fewer, seed, rank, screen)
    if _solved_left(fewer, general):
        general = generalized(fewer, seed, rank, screen, solved=False)
        general = generalized(arithmetic(general, seed, rank, screen), seed, rank, screen)
    return _unranked(general, seed, rank, screen)


def _solved_left(rule: Rule, general: Rule) -> bool:
    """Whether generalizing `rule` into `general` left one of its slices' starts or sizes a value, or made two of them
    one variable (`slice(slice(x, ?start1, ?size), ?start, ?size)`: a rule of equal sizes alone): `arithmetic`
    may relate them instead. Most rules lift them to variables of their own, and are not tried again."""
    before = sum(1 for t in rule.lhs for _ in _solved_values(t))
    if not before:
        return False
    solved = [e for t in general.lhs for op, k, e in _op_attrs(t) if k in ops.get(op).solved]
    names = [e.name for e in solved if isinstance(e, Var)]
    return len(names) < len(solved) or len(set(names)) < len(names)


def _fewer_same_shapes(
    rule: Rule, seed: int, rank: int, refuted: Sequence[Mapping[str, Any]], screen: bool = False
) -> Rule:
    """`rule` without each of its same-shape guards, one at a time, where it still holds (`_holds`; not where a
    binding of `refuted` satisfies the guards left), and each left that it can be made a same-except guard of one
    axis: the enumeration's leaves all had one shape. A conv's weights added need each other's shape, not their
    input's: `conv(x, y, b) + conv(x, z, c) = conv(x, y + z, b + c)` holds with `y` and `z` of one shape, whatever
    `x`'s; two convs merged through a concat of their weights need them of one shape but their output channels
    (`same-except ?y ?z 0`). A rule with one same-shape guard was refuted without it."""

    def holds(candidate: Rule) -> bool:
        return not _refuted_by(candidate, refuted) and _holds(candidate, seed, rank, screen)

    same = [g for g in rule.guards if isinstance(g, Call) and g.fn == "same-shape"]
    if len(same) > 1:
        for guard in same:
            fewer = replace(rule, guards=tuple(g for g in rule.guards if g != guard))
            if holds(fewer):
                rule = fewer
    for guard in [g for g in rule.guards if isinstance(g, Call) and g.fn == "same-shape"]:
        a = cast(Var, guard.args[0])
        for axis in range(leaf_rank(a.name, rank)):
            wider = Call("same-except", (*guard.args, literal(axis)))
            relaxed = replace(rule, guards=tuple(wider if g == guard else g for g in rule.guards))
            if holds(relaxed):
                rule = relaxed
                break
    return rule


DIM_TENSORS = 4  # tensors a rule relates by equal shapes from which `_dim_equalities` looks for the dims it needs
DIM_BLOCKS = 6  # dims `_dim_equalities` partitions, at most (the partitions of more are too many to try)


def _set_partitions(items: Sequence[Any]) -> Iterator[list[list[Any]]]:
    """Every partition of `items` into blocks, each block in `items`' order."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in _set_partitions(rest):
        yield [[first], *partition]
        for k in range(len(partition)):
            yield [*partition[:k], [first, *partition[k]], *partition[k + 1 :]]


def _dim_equalities(rule: Rule, seed: int, rank: int, screen: bool = False) -> Rule:
    """`rule`, over at least DIM_TENSORS tensors, with its equal-shape guards (`same-shape`, `same-except`) made the
    equalities of the dims it needs, where it holds with them (`_holds`): the enumeration's leaves were of one
    shape, and `matmul(concat(x, y, 1), concat(z, w, 0)) = matmul(x, z) + matmul(y, w)` needs only x's columns as
    many as z's rows, not the four of one shape. Every dim of the guarded tensors starts equal to every other; each
    dim is set free where the rule holds without it, and the dims left are split into the most blocks of equal dims
    (no block of one) that the rule holds with."""
    shaped = [g for g in rule.guards if g.fn in ("same-shape", "same-except")]
    if len(rule.tensor_vars()) < DIM_TENSORS or not shaped:
        return rule
    names = list(dict.fromkeys(cast(Var, a).name for g in shaped for a in g.args[:2]))
    rest = tuple(g for g in rule.guards if g not in shaped)

    def dim(d: tuple[str, int]) -> Call:
        return Call("dim", (Var(d[0]), literal(d[1])))

    def with_blocks(blocks: Sequence[Sequence[tuple[str, int]]]) -> Rule:
        equal = tuple(Call("=", (dim(b[0]), dim(d))) for b in blocks for d in b[1:])
        return replace(rule, guards=rest + equal)

    bound = [(n, k) for n in names for k in range(leaf_rank(n, rank))]
    for d in list(bound):
        fewer = [e for e in bound if e != d]
        if _holds(with_blocks([fewer]), seed, rank, screen):
            bound = fewer
    if not bound:
        return with_blocks([])
    if len(bound) > DIM_BLOCKS:
        return with_blocks([bound]) if _holds(with_blocks([bound]), seed, rank, screen) else rule
    partitions = [p for p in _set_partitions(bound) if all(len(b) > 1 for b in p)]
    for partition in sorted(partitions, key=len, reverse=True):
        if _holds(with_blocks(partition), seed, rank, screen):
            return with_blocks(partition)
    return rule


SIZED_TIES = 32  # choices of the guards `_fewer_sized` tries, at most


def _fewer_sized(rule: Rule, seed: int, rank: int, screen: bool = False) -> Rule:
    """`rule` with, of the guards that tie an attribute variable to a leaf's dim or shape (`_sized_guards`), one or
    none per variable, the first choice that holds (`_holds`; the fewest guards first, each variable's in the order
    `_sized_guards` gives them); `rule` where none does. A slice of half of `concat(x, y)` equals every dim of both
    leaves in the enumeration; `slice(concat(x, y), start (dim x 0), size (dim y 0)) = y` holds at leaves of any
    sizes."""
    ties: dict[str, list[Call]] = {}
    for g in rule.guards:
        if (
            g.fn == "="
            and isinstance(g.args[0], Var)
            and isinstance(g.args[1], Call)
            and g.args[1].fn in ("dim", "shape")
        ):
            ties.setdefault(g.args[0].name, []).append(g)
    if not ties:
        return rule
    rest = tuple(g for g in rule.guards if not any(g in found for found in ties.values()))
    options = [[None, *found] for found in ties.values()]
    choices = sorted(itertools.product(*options), key=lambda c: sum(g is not None for g in c))
    for choice in choices[:SIZED_TIES]:
        candidate = replace(rule, guards=rest + tuple(g for g in choice if g is not None))
        if _holds(candidate, seed, rank, screen):
            return candidate
    return rule


def _rank_specific(rule: Rule) -> bool:
    """Whether `rule` fixes an integer attribute (an axis, a perm, pads, reduced axes): at another rank than the
    enumeration's the value means something else, and the rule is only tried guarded to that rank."""
    kinds = {(op, k) for p in (*rule.lhs, *rule.rhs) for op, k, e in _op_attrs(p) if _per_rank(op, k, e)}
    return any(dict(ops.get(op).attrs)[k] in ("int", "ints") for op, k in kinds)


def _per_rank(op: str, attr: str, e: Any) -> bool:
    """Whether attribute `attr` of `op`, written `e`, may mean something else at another rank: not a variable, nor
    a constant's element type or its shape computed from a rank (`(ones (rank ?x))`: `_broadcast_constants`)."""
    if isinstance(e, Var):
        return False
    from_rank = isinstance(e, Call) and e.fn == "ones" and not isinstance(e.args[0], Lit)
    return not (ops.get(op).leaf and (attr == "dtype" or from_rank))


def _unranked(rule: Rule, seed: int, rank: int, screen: bool = False) -> Rule:
    """`rule` without the rank guards `_rank_guards` gave it, where generalization left it no integer attribute
    fixed and it holds at every rank (`relu(concat(x, y, ?axis))`); else `rule`."""
    ranked = set(_rank_guard_calls(rule, rank))
    if _rank_specific(rule) or not ranked & set(rule.guards):
        return rule
    free = replace(rule, guards=tuple(g for g in rule.guards if g not in ranked))
    return free if _holds(free, seed, rank, screen) else rule


def _general(op: str, attr: str) -> bool:
    """Whether the verifier checks attribute `attr` of `op` at every value it takes, or at each case it has: its
    domain is exhaustive (`OpDef.exhaustive`: every axis, every permutation), it is solved with the shapes (a
    slice's start), or its domain samples its cases (`OpDef.sampled`: a conv's strides and pads)."""
    d = ops.get(op)
    return attr in d.exhaustive or attr in d.solved or attr in d.sampled


def _constant_value(op: str, attr: str) -> bool:
    """Whether attribute `attr` of `op` is a constant leaf's value (`constant_leaf`)."""
    return ops.get(op).leaf and attr == "value"


def _scalar(value: Any) -> bool:
    """Whether an attribute's value is a real number: one a constant leaf can hold."""
    return isinstance(value, Lit) and isinstance(value.value, float)


def _lift(p: Pattern, attr: str, value: Any, var: Var) -> Pattern:
    """`p` with every attribute `attr` of value `value` made `var`, where `_general`; a real `value` is lifted with
    every constant leaf's value and every real attribute `_general` of that value, whatever its name: a constant
    that sets a kernel's scale is one variable with it (`mul(matmul(a, b), 0.125)` = `fused_matmul(a, b, alpha
    0.125)` holds at every alpha)."""
    if isinstance(p, Var):
        return p

    def lifted(k: str, e: Any) -> bool:
        if e != value:
            return False
        if k == attr and _general(p.op, k):
            return True
        return _scalar(value) and (_constant_value(p.op, k) or (_general(p.op, k) and _scalar(e)))

    attrs = tuple((k, var if lifted(k, e) else e) for k, e in p.attrs)
    return Term(p.op, tuple(_lift(a, attr, value, var) for a in p.args), attrs)


def _liftable(p: Pattern, solved: bool = True) -> list[tuple[str, Any]]:
    """The (attribute, value) pairs of `p`'s ops, in order, that `_general` says a rule can hold for every value
    of, and the values of its constant leaves (a scale the rule may hold at every value of); without `solved`, not
    those of an attribute the verifier solves with the shapes (a slice's start and size: `arithmetic`'s)."""
    return list(
        dict.fromkeys(
            (k, e)
            for op, k, e in _op_attrs(p)
            if not isinstance(e, Var)
            and (_general(op, k) or (_constant_value(op, k) and _scalar(e)))
            and (solved or not _solved_literal(op, k, e))
        )
    )


def _lifted(rule: Rule, pairs: Sequence[tuple[str, Any]]) -> Rule:
    """`rule` with each (attribute, value) of `pairs` made a variable of its own (named after the attribute), in its
    patterns and its `:let` terms (a multi-pattern rule's merged term), and an axis in its guards' dims too."""
    lhs, rhs = list(rule.lhs), list(rule.rhs)
    lets, guards = list(rule.lets), list(rule.guards)
    for attr, value in pairs:
        terms = (*lhs, *rhs, *(v for _, v in lets if isinstance(v, Term)))
        taken = {v for p in terms for v in _vars(p)} | {n for n, _ in lets}
        var = _fresh(attr, taken)
        lhs = [cast(Term, _lift(t, attr, value, var)) for t in lhs]
        rhs = [_lift(t, attr, value, var) for t in rhs]
        lets = [(n, _lift(v, attr, value, var) if isinstance(v, Term) else v) for n, v in lets]
        if _axis_attr(rule, attr):
            guards = [cast(Call, _axis_lifted(g, value, var)) for g in guards]
    return replace(rule, lhs=tuple(lhs), rhs=tuple(rhs), lets=tuple(lets), guards=tuple(guards))


def _axis_attr(rule: Rule, attr: str) -> bool:
    """Whether `attr` is an axis in `rule`: an integer attribute of one of its ops that the verifier checks at
    every value (`OpDef.exhaustive`)."""
    for p in (*rule.lhs, *rule.rhs):
        for op, k, _ in _op_attrs(p):
            d = ops.get(op)
            if k == attr and k in d.exhaustive and dict(d.attrs)[k] == "int":
                return True
    return False


def _axis_lifted(e: Any, value: Any, var: Var) -> Any:
    """Guard or expression `e` with each dim at axis `value` (`(dim ?x 0)`) made the dim at `var`."""
    if not isinstance(e, Call):
        return e
    if e.fn == "dim" and e.args[1] == value:
        return Call("dim", (e.args[0], var))
    return Call(e.fn, tuple(_axis_lifted(a, value, var) for a in e.args))


def generalized(rule: Rule, seed: int, rank: int, screen: bool = False, solved: bool = True) -> Rule:
    """`rule` with each attribute value its left side fixes made a variable wherever the rule still holds
    (`_holds`): `relu(concat(x, y, axis 0)) = concat(relu(x), relu(y), axis 0)` holds at every axis, and is kept as
    the rule of `?axis`. The enumeration draws attributes from small domains, at one rank; the rule found at one
    value is a rule of all of them, and derives the candidates of the others. Every value is lifted at once where
    that holds (one verification, the common case), else one (attribute, value) at a time. A multi-pattern rule's
    merged term (`:let`) is lifted with its patterns. Without `solved`, a slice's start and size are left to
    `arithmetic`, which relates them where lifting equal values to one variable would not."""
    pairs = list(dict.fromkeys(pair for t in rule.lhs for pair in _liftable(t, solved)))
    if len(pairs) > 1 and _holds(every := _lifted(rule, pairs), seed, rank, screen):
        return every
    for pair in pairs:
        lifted = _lifted(rule, [pair])
        if _holds(lifted, seed, rank, screen):
            rule = lifted
    return rule


# ---------------------------------------------------------------------------------------------------------------
# Attribute arithmetic: a slice's start and size related across the two sides

ARITHMETIC_ASSIGNMENTS = 6  # right-side expressions `arithmetic` tries for the literals it relates, at most


def _solved_literal(op: str, attr: str, e: Any) -> bool:
    """Whether `e`, attribute `attr` of `op`, is an integer literal of an attribute the verifier solves with the
    shapes (a slice's start or size)."""
    return attr in ops.get(op).solved and isinstance(e, Lit) and type(e.value) is int


def _split_solved(p: Pattern, taken: set[str], found: dict[str, tuple[str, int]]) -> Pattern:
    """`p` with each integer literal of a solved attribute (`_solved_literal`) made a variable of its own, named
    after the attribute; `found` maps each to (attribute, the literal's value)."""
    if isinstance(p, Var):
        return p
    attrs = []
    for k, e in p.attrs:
        if _solved_literal(p.op, k, e):
            var = _fresh(k, taken)
            taken.add(var.name)
            found[var.name] = (k, cast(Lit, e).value)
            e = var
        attrs.append((k, e))
    return Term(p.op, tuple(_split_solved(a, taken, found) for a in p.args), tuple(attrs))


def _solved_values(p: Pattern) -> Iterator[tuple[str, int]]:
    """(attribute, value) of each of `p`'s solved integer literals (`_solved_literal`), in the order
    `_with_solved` replaces them."""
    if isinstance(p, Term):
        for k, e in p.attrs:
            if _solved_literal(p.op, k, e):
                yield k, cast(Lit, e).value
        for a in p.args:
            yield from _solved_values(a)


def _with_solved(p: Pattern, exprs: Iterator[Expr]) -> Pattern:
    """`p` with its solved integer literals (`_solved_values`' order) replaced by `exprs`, one each."""
    if isinstance(p, Var):
        return p
    attrs = tuple((k, next(exprs) if _solved_literal(p.op, k, e) else e) for k, e in p.attrs)
    return Term(p.op, tuple(_with_solved(a, exprs) for a in p.args), attrs)


def _sums_of(value: int, attr: str, found: Mapping[str, tuple[str, int]], other: str = "") -> list[Expr]:
    """Expressions of `found`'s variables (not `other`) whose value is `value`: of attribute `attr`'s variables, each
    alone, then the sums of two; then the same of the others."""
    names = [n for n in found if n != other]
    sums = [(a, b) for a, b in itertools.combinations(names, 2) if found[a][1] + found[b][1] == value]
    alone = [n for n in names if found[n][1] == value]

    def kind(*ns: str) -> bool:
        return all(found[n][0] == attr for n in ns)

    return [
        *(Var(n) for n in alone if kind(n)),
        *(Call("+", (Var(a), Var(b))) for a, b in sums if kind(a, b)),
        *(Var(n) for n in alone if not kind(n)),
        *(Call("+", (Var(a), Var(b))) for a, b in sums if not kind(a, b)),
    ]


def _slice_bounds(p: Pattern, fixed: bool = False) -> list[Call]:
    """The guards that each slice of `p` whose input is a variable stays inside that input: `(<= (+ start size)
    (dim ?x axis))`, and `(>= start 0)` for a computed start; where its start and size are both values, only with
    `fixed`."""
    out: list[Call] = []
    for t in (t for t in _subterms(p) if t.op == "slice" and isinstance(t.args[0], Var)):
        at = dict(t.attrs)
        start, size = at["start"], at["size"]
        if isinstance(start, Lit) and isinstance(size, Lit) and not fixed:
            continue
        out.append(Call("<=", (Call("+", (start, size)), Call("dim", (cast(Var, t.args[0]), at["axis"])))))
        if isinstance(start, Call):
            out.append(Call(">=", (start, literal(0))))
    return out


def _fixed(name: str, value: int) -> Call:
    """The guard that fixes attribute variable `name` to `value`."""
    return Call("=", (Var(name), literal(value)))


def _related(
    rule: Rule, found: Mapping[str, tuple[str, int]], holds: Callable[[Rule], bool]
) -> tuple[Rule, tuple[int, int]]:
    """`rule`, whose guards fix each of `found`'s variables to its value (`(= ?v 1)`), with each such guard dropped
    where the rule still holds, else replaced by one relating the variable to others (`(= ?start1 (+ ?start
    ?size))`), the last variables first; then the relations and bounds it still holds without, dropped (its rank
    guards are `_unranked`'s). (the rule, (the variables left fixed, the relations)): the fewer, the more general."""
    for name in reversed(list(found)):
        attr, value = found[name]
        fixing = _fixed(name, value)
        rest = tuple(g for g in rule.guards if g != fixing)
        relations = _sums_of(value, attr, found, other=name)
        relations.sort(key=lambda e: not isinstance(e, Call))  # a sum first: it stays true as the others are freed
        for relation in [None, *relations]:
            guards = rest if relation is None else (*rest, Call("=", (Var(name), relation)))
            candidate = replace(rule, guards=guards)
            if holds(candidate):
                rule = candidate
                break
    for guard in [g for g in rule.guards if g.fn in ("<=", ">=") or g.fn == "=" and _relates(g, found)]:
        fewer = replace(rule, guards=tuple(g for g in rule.guards if g != guard))
        if holds(fewer):
            rule = fewer
    fixed = sum(_fixed(n, v) in rule.guards for n, (_, v) in found.items())
    return rule, (fixed, sum(g.fn == "=" and _relates(g, found) for g in rule.guards))


def _relates(guard: Call, found: Mapping[str, tuple[str, int]]) -> bool:
    """Whether `guard` relates one of `found`'s variables to others (`(= ?start1 (+ ?start ?size))`)."""
    return isinstance(guard.args[0], Var) and guard.args[0].name in found and not isinstance(guard.args[1], Lit)


def _unfixed(rule: Rule, found: Mapping[str, tuple[str, int]]) -> Rule:
    """`rule` with each variable its guards still fix to a value (`_related`) made that value again."""
    values = {n: v for n, (_, v) in found.items() if _fixed(n, v) in rule.guards}
    if not values:
        return rule
    binding = {n: Lit(v) for n, v in values.items()}
    dropped = {_fixed(n, v) for n, v in values.items()}
    return replace(
        rule,
        lhs=tuple(cast(Term, _valued(t, binding)) for t in rule.lhs),
        rhs=tuple(_valued(t, binding) for t in rule.rhs),
        guards=tuple(cast(Call, _valued(g, binding)) for g in rule.guards if g not in dropped),
    )


def _valued(e: Any, binding: Mapping[str, Lit]) -> Any:
    """A pattern, expression or guard with the attribute variables of `binding` made its values."""
    if isinstance(e, Var):
        return binding.get(e.name, e)
    if isinstance(e, Call):
        return _folded(Call(e.fn, tuple(_valued(a, binding) for a in e.args)))
    if isinstance(e, Term):
        return Term(
            e.op, tuple(_valued(a, binding) for a in e.args), tuple((k, _valued(v, binding)) for k, v in e.attrs)
        )
    return e


def _expression_rank(e: Expr, attr: str, found: Mapping[str, tuple[str, int]]) -> int:
    """How unlikely `e` is as the value of a right side's attribute `attr`, the likeliest first: a variable of the
    same attribute, a sum of two, the value itself, a variable of another attribute, a sum of those."""
    if isinstance(e, Lit):
        return 2
    names = list(_vars_of(e))
    same = all(found[n][0] == attr for n in names)
    return (0 if same else 3) + (len(names) > 1)


def _folded(e: Call) -> Expr:
    """`e` with a sum or difference of values computed, and a zero added dropped (`(+ 0 ?start)` is `?start`)."""
    if e.fn not in ("+", "-"):
        return e
    a, b = e.args
    if isinstance(a, Lit) and isinstance(b, Lit):
        return literal(a.value + b.value if e.fn == "+" else a.value - b.value)
    if b == Lit(0):
        return a
    return b if e.fn == "+" and a == Lit(0) else e


def arithmetic(rule: Rule, seed: int, rank: int, screen: bool = False) -> Rule:
    """`rule` with the slice starts and sizes that generalization left fixed related by arithmetic instead, where
    it still holds (`_holds`): the enumeration finds `slice(slice(x, start 1, size 1), start 0, size 1) = slice(x,
    start 1, size 1)`, and the rule of every start is `slice(slice(x, ?start, ?size), ?start1, ?size1) = slice(x,
    (+ ?start ?start1), ?size1)`. Each fixed value of the left side becomes a variable, each of the right side an
    expression of those of the same value (a sum of two, or one), and the guards that fix the variables are dropped
    or made relations (`_related`) where the rule still holds; the guards that keep a computed slice inside its
    input (`_slice_bounds`) are added, and dropped where not needed. Of the right sides tried
    (`ARITHMETIC_ASSIGNMENTS`, the likeliest first), the first that leaves no value fixed is kept, else the one that
    leaves the fewest; `rule` where none frees one."""
    if rule.multi or not any(True for t in rule.lhs for _ in _solved_values(t)):
        return rule
    found: dict[str, tuple[str, int]] = {}
    taken = {v for p in (*rule.lhs, *rule.rhs, *rule.guards) for v in _vars_of(p)}
    lhs = tuple(cast(Term, _split_solved(t, taken, found)) for t in rule.lhs)
    right = [pair for t in rule.rhs for pair in _solved_values(t)]
    options = [_sums_of(value, attr, found) + [literal(value)] for attr, value in right]
    fixing = tuple(_fixed(n, v) for n, (_, v) in found.items())
    best, fewest = rule, (len(found), 0)

    def holds(candidate: Rule) -> bool:
        return _holds(candidate, seed, rank, screen)

    def order(exprs: tuple[Expr, ...]) -> tuple[int, int]:
        ranks = [_expression_rank(e, attr, found) for e, (attr, _) in zip(exprs, right)]
        return max(ranks, default=0), sum(ranks)

    assignments = sorted(itertools.product(*options), key=order)[:ARITHMETIC_ASSIGNMENTS]
    for exprs in assignments:
        rhs = tuple(_with_solved(t, iter(exprs)) for t in rule.rhs)
        bounds = tuple(g for t in rhs for g in _slice_bounds(t))
        candidate, left = _related(replace(rule, lhs=lhs, rhs=rhs, guards=rule.guards + bounds + fixing), found, holds)
        if left < fewest:
            best, fewest = _unfixed(candidate, found), left
            if not left[0]:  # no value left fixed: the likeliest right side that frees them all
                break
    return best


# ---------------------------------------------------------------------------------------------------------------
# Multi-pattern rules


def _dim_of(p: Pattern, axis: int, rank: int, same_shape: bool) -> Call | None:
    """`(dim ?v k)`, a dim of one of `p`'s variables equal to `p`'s dim `axis` at every probe shape of rank `rank`
    where `p` is well-typed (all its variables of one shape, where `same_shape`), or None if there is none."""
    names = sorted(_vars(p))
    probes = {n: [s for s in _probe_shapes(n, rank) if len(s) == leaf_rank(n, rank)] for n in names}
    if same_shape:  # every tensor of one shape, every vector of one
        groups = [g for g in ([n for n in names if n not in VECTORS], [n for n in names if n in VECTORS]) if g]
        combos = [
            {n: shape for group, shape in zip(groups, chosen) for n in group}
            for chosen in itertools.product(*(probes[group[0]] for group in groups))
        ]
    else:
        combos = [dict(zip(names, c)) for c in itertools.product(*(probes[n] for n in names))]
    typed = []
    for shapes in combos:
        try:
            typed.append((shapes, pattern_shape(p, shapes, {}, {})[axis]))
        except (ops.ShapeError, ValueError, IndexError, KeyError, TypeError):
            continue
    for v in names:
        for k in range(leaf_rank(v, rank)):
            if typed and all(shapes[v][k] == dim for shapes, dim in typed):
                return Call("dim", (Var(v), literal(k)))
    return None


def multi_rule(left: Term, right: Term, axis: int, merged: Term, name: str, rank: int, seed: int) -> Rule | None:
    """The multi-pattern rule from `concat(left, right, axis) = merged`: two terms that share an input become the
    two halves of one merged term, as TASO's and Tensat's merges of two matmuls or convs into one. Its attributes
    are for rank `rank` (as every generated rule's), so the variables it reads dims of are guarded to that rank.
    Verified as any generated rule, with its leaves' shapes made equal where it needs them; None if it fails."""
    m = Var("m")
    left, right, merged = cast(tuple[Term, Term, Term], tuple(_sized_as_vars((left, right, merged))))
    for same_shape in (False, True):
        first, second = _dim_of(left, axis, rank, same_shape), _dim_of(right, axis, rank, same_shape)
        if first is None or second is None:
            continue
        at = ("axis", literal(axis))
        halves = (
            Term("slice", (m,), (at, ("start", literal(0)), ("size", first))),
            Term("slice", (m,), (at, ("start", first), ("size", second))),
        )
        ranked = sorted({cast(Var, first.args[0]).name, cast(Var, second.args[0]).name})
        guards = tuple(Call("=", (Call("rank", (Var(v),)), literal(leaf_rank(v, rank)))) for v in ranked)
        rule = Rule(name, (left, right), halves, (("m", merged),), guards)
        if same_shape:
            rule = _same_shape_guards(rule)
        if _holds(rule, seed, rank):
            return generalized(_fewer_same_shapes(rule, seed, rank, []), seed, rank)
    return None


def multi_candidates(pairs: Sequence[tuple[Pattern, Pattern]]) -> list[tuple[Term, Term, int, Term]]:
    """(left, right, axis, merged) for each candidate `concat(left, right, axis) = merged` whose two halves are
    different ops' terms (not leaves, not concats: those are concat's own algebra) that share an input, and whose
    merged term is not a concat. A shared input bounds the matches of the rule's two patterns by its fan-out, where
    two unrelated terms would pair every match of one with every match of the other."""
    out = []
    for a, b in pairs:
        for joined, merged in ((a, b), (b, a)):
            if not (isinstance(joined, Term) and joined.op == "concat" and isinstance(merged, Term)):
                continue
            left, right = joined.args
            if not (isinstance(left, Term) and isinstance(right, Term)) or left == right:
                continue
            if "concat" in (left.op, right.op, merged.op) or not _vars(left) & _vars(right):
                continue
            axis = int(attr_value(eval_expr(dict(joined.attrs)["axis"], {}, {})))
            out.append((left, right, axis, merged))
    return out


def _instance_pair(rule: Rule, left: Pattern, right: Pattern) -> bool:
    """Whether (left, right) is an instance of the multi-pattern `rule`'s two patterns, under one binding."""
    binding: dict[str, Pattern] = {}
    return _match(rule.lhs[0], left, binding) and _match(rule.lhs[1], right, binding)


def multi_rules(
    pairs: Sequence[tuple[Pattern, Pattern]], rank: int, seed: int, prefix: str = "gen"
) -> tuple[list[Rule], int]:
    """The verified multi-pattern rules of `multi_candidates(pairs)`, the most general first, named from `prefix`:
    one whose two patterns are an instance of a kept rule's (`matmul(x, x)`, `matmul(x, y)` of `matmul(x, y)`,
    `matmul(x, z)`) is dropped, since that rule merges them too; (rules, how many candidates)."""
    found = multi_candidates(pairs)
    found.sort(key=lambda c: (-len(_vars(c[0]) | _vars(c[1])), term_size(c[0]) + term_size(c[1]), repr(c)))
    rules: list[Rule] = []
    for left, right, axis, merged in found:
        if any(_instance_pair(r, left, right) for r in rules):
            continue
        rule = multi_rule(left, right, axis, merged, f"{prefix}-multi-{len(rules)}", rank, seed)
        if rule is not None:
            rules.append(rule)
    return rules, len(found)


def rule_prefix(settings: Settings) -> str:
    """The start of the names of the rules a generation makes: `gen-NAME` for a named set, else by its leaves: `gen`
    over the default ones, `gen-r4` over leaves of rank 4, `gen-r4v2` with two vectors besides (`c1` with a
    per-channel leaf), so that the library's sets name their rules apart."""
    if settings.name:
        return f"gen-{settings.name}"
    extra = (f"v{settings.vectors}" if settings.vectors else "") + (
        f"c{settings.channels}" if settings.channels else ""
    )
    return "gen" if (settings.rank, extra) == (Settings.rank, "") else f"gen-r{settings.rank}{extra}"


class Prover(Protocol):
    """Equality saturation for the minimization (`tensat.egraph.derive`): which of `pairs` the `rules` prove equal,
    both sides built on leaves of `shape`."""

    def __call__(
        self,
        rules: Sequence[Rule],
        pairs: Sequence[tuple[Pattern, Pattern]],
        shape: tuple[int, ...],
        shapes: Mapping[str, tuple[int, ...]] | None = None,
    ) -> list[bool]: ...


def proved_by_sound(
    prove: Prover,
    rules: Sequence[Rule],
    pairs: Sequence[tuple[Pattern, Pattern]],
    shape: tuple[int, ...],
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> tuple[list[bool], list[Rule]]:
    """`prove`'s answer for `pairs` (leaves of `shape`, or of their shape in `shapes`), asked again without each rule
    it names unsound (its `UnsoundRules`, raised from the layer above) until it answers: (which pairs `rules`
    prove equal, the rules left)."""
    usable = list(rules)
    while True:
        try:
            return prove(usable, pairs, shape, shapes), usable
        except Exception as exc:  # noqa: BLE001 - the prover's `UnsoundRules` (it lives above this layer)
            wrong = set(getattr(exc, "names", ()))
            if not wrong:
                raise
            usable = [r for r in usable if r.name not in wrong]


@dataclass
class Generated:
    """A generation run: the rules kept and what each step found and took."""

    settings: Settings
    rules: list[Rule]
    terms: list[int]
    classes: list[int]
    candidates: int
    constants: int  # terms left out: their value is one number whatever the leaves
    renamings: int
    common_subterms: int
    refuted: int  # candidates whose sides differ on random float leaves
    derived: int  # candidates the kept rules derive
    not_rewrites: int  # equations with no valid orientation (each side has variables the other lacks)
    rejected: int  # equations the verifier rejected in every orientation, guarded or not
    guarded: int  # rules kept with same-shape guards
    unsound: int  # rules the verifier passed that the e-graph caught merging terms of different shapes
    multi_candidates: int = 0  # candidates concat(a, b) = m whose halves share an input
    multi: int = 0  # multi-pattern rules kept (among `rules`)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def equations(self) -> int:
        """Single-pattern equations kept (an equation is one rule, or two with its reverse)."""
        return len({r.name.removesuffix("-rev") for r in self.rules if not r.multi})


def _verified_orientations(task: tuple[tuple[Rule, ...], int, int]) -> list[Rule]:
    """The rules of one candidate's orientations that pass verification (`verified`), for a worker process."""
    oriented, seed, rank = task
    return [r for r in (verified(r, seed, rank) for r in oriented) if r is not None]


def minimize(
    pairs: Sequence[tuple[Pattern, Pattern]],
    prove: Prover,
    shape: tuple[int, ...],
    seed: int = 0,
    progress: Progress | None = None,
    workers: Workers | None = None,
    prefix: str = "gen",
) -> tuple[list[Rule], dict[str, int]]:
    """Keep, smallest first, the candidates the kept rules do not derive, verified; (rules named from `prefix`,
    counts). The leaves are tensors of `shape` and vectors of its first dim (`leaf_shape`).

    Each round takes the next batch of candidates (in `_by_ops` order): the prover drops those the rules kept so far
    derive, and the others are verified and kept, but for one that a rule kept in the same batch rewrites at the
    root, or that generalization made a rule kept already (`c * (x * y) = x * (y * c)` at c = 0.5 and at c = 2,
    both lifted to any constant in one batch). A rule the prover finds unsound (egglog merged terms of different
    shapes) is dropped, and the batch checked again. Batches double from one at each size of candidate (the larger
    side's ops) up to MAX_BATCH: the smallest candidates of a size are kept one at a time (a rule kept can only
    drop those after it), and the larger ones in batches, each candidate checked once.

    A batch's candidates are verified by `workers` (else in this process), all of them before the sequential check
    of which a rule of the same batch rewrites: a rule is named by its candidate's place in the minimization's order
    (the verifier's random draws follow the name), so that what is kept does not depend on the workers."""
    remaining = list(enumerate(sorted(pairs, key=_by_ops)))
    vectors = {name: leaf_shape(name, shape) for name in (*VECTORS, *CHANNELS)}
    rules: list[Rule] = []
    counts = {"derived": 0, "not_rewrites": 0, "rejected": 0, "guarded": 0, "unsound": 0}
    batch, level = 1, 0
    kept_equations = 0
    forms: set[str] = set()  # the kept rules' canonical forms: two candidates generalized may make one rule
    workers = workers if workers is not None else Workers(1)
    while remaining:
        size = _size(remaining[0][1])
        if size != level:
            batch, level = 1, size
        chosen = [(k, p) for k, p in remaining[:batch] if _size(p) == level]
        remaining = remaining[len(chosen) :]
        if rules:
            proved, sound = proved_by_sound(prove, rules, [p for _, p in chosen], shape, vectors)
            counts["unsound"] += len(rules) - len(sound)
            rules = sound
            counts["derived"] += sum(proved)
            chosen = [c for c, done in zip(chosen, proved) if not done]
        oriented = [orientations(a, b, f"{prefix}-{k}", shape) for k, (a, b) in chosen]
        checked = workers.map(_verified_orientations, [(tuple(o), seed, len(shape)) for o in oriented])
        for (_, pair), candidate, kept in zip(chosen, oriented, checked):
            made = [(canonical_form(r), r) for r in kept]
            new = [r for form, r in made if form not in forms]
            if instance_of(pair, rules) or (kept and not new):  # or generalized into a rule kept already
                counts["derived"] += 1
            elif not candidate:
                counts["not_rewrites"] += 1
            elif not kept:
                counts["rejected"] += 1
            else:
                counts["guarded"] += any(r.guards for r in new)
                forms.update(form for form, _ in made)
                rules += new
                kept_equations += 1
        batch = min(2 * batch, MAX_BATCH)
        if progress is not None:
            progress(f"minimize: {kept_equations} kept, {len(remaining)} to check, {counts['derived']} derived")
    return rules, counts


def _by_ops(pair: tuple[Pattern, Pattern]) -> tuple[Any, ...]:
    """The minimization's order: by size, then candidates over fewer ops first, those over one set of ops together
    (a `Prover` runs the rules over a batch's ops alone), and within a set in `prune`'s order."""
    used = pattern_ops(*pair)
    return (_size(pair), len(used), sorted(used), _order(pair))


def _size(pair: tuple[Pattern, Pattern]) -> int:
    """A candidate's size: its larger side's ops."""
    return max(term_size(pair[0]), term_size(pair[1]))


def generate(settings: Settings, prove: Prover, progress: Progress | None = None, jobs: int = 1) -> Generated:
    """The whole generation (see the module docstring), its largest terms' evaluation and its verification in
    `jobs` processes."""
    with Workers(jobs) as workers:
        return _generate(settings, prove, progress, workers)


def _generate(settings: Settings, prove: Prover, progress: Progress | None, workers: Workers) -> Generated:
    """`generate`'s work, with its worker processes."""
    found = enumerate_terms(settings, progress, workers)
    t = time.perf_counter()
    pairs, renamings, common = prune(found.candidates)
    pruned = time.perf_counter() - t
    if progress is not None:
        progress(f"pruned: {len(pairs)} candidates ({renamings} renamings, {common} with a shared subterm)")
    t = time.perf_counter()
    rng = np.random.default_rng(settings.seed)
    unseen = settings.leaf_shape(max(settings.sizes) + 1)  # a size the fingerprints did not see
    survivors = [p for p in pairs if not refuted(p, unseen, rng)]
    refuting = time.perf_counter() - t
    if progress is not None:
        progress(f"refuted: {len(pairs) - len(survivors)} candidates differ on float leaves")
    t = time.perf_counter()
    shape = settings.leaf_shape(max(settings.sizes))
    rules, counts = minimize(survivors, prove, shape, settings.seed, progress, workers, rule_prefix(settings))
    minimized = time.perf_counter() - t
    t = time.perf_counter()
    multi, multi_found = multi_rules(survivors, settings.rank, settings.seed, rule_prefix(settings))
    if progress is not None:
        progress(f"multi-pattern: {len(multi)} kept of {multi_found} candidates")
    return Generated(
        settings,
        rules + multi,
        found.terms,
        found.classes,
        len(found.candidates),
        found.constants,
        renamings,
        common,
        len(pairs) - len(survivors),
        counts["derived"],
        counts["not_rewrites"],
        counts["rejected"],
        counts["guarded"],
        counts["unsound"],
        multi_found,
        len(multi),
        {
            "enumerate": found.seconds,
            "prune": pruned,
            "refute": refuting,
            "minimize": minimized,
            "multi": time.perf_counter() - t,
        },
    )


def rules_text(result: Generated, command: str, version: str) -> str:
    """The generated rules as a rule file, with a header that says how it was made."""
    s = result.settings
    names = ", ".join(s.ops) if s.ops is not None else f"the default ops ({', '.join(default_ops(s.rank))})"
    header = [
        f"; Generated by `{command}` (tensat {version}); do not edit: run the command again.",
        f"; Terms of up to {s.max_ops} ops over {s.leaves} leaves of rank {s.rank}"
        + (f" and {s.vectors} of rank 1" if s.vectors else "")
        + ", fingerprinted at sizes "
        f"{', '.join(map(str, s.sizes))}, seed {s.seed}.",
        f"; Ops: {names}.",
        f"; {sum(result.terms)} terms ({result.constants} constant ones left out), {result.candidates} candidates; "
        f"{result.renamings} renamings and "
        f"{result.common_subterms} with a shared subterm pruned; {result.refuted} refuted on float leaves; "
        f"{result.derived} derived by the rules kept; "
        f"{result.rejected} rejected by the verifier, {result.unsound} by the e-graph; {result.equations} equations "
        f"kept ({len(result.rules) - result.multi} rules); {result.multi} multi-pattern rules of "
        f"{result.multi_candidates} candidates.",
    ]
    return "\n".join(header) + "\n\n" + "\n\n".join(format_rule(r) for r in result.rules) + "\n"
