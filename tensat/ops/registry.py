"""`OpDef`, the registry of every operator, and the questions the pipeline asks of it.

The families (`leaves`, `elementwise`, `matmul`, `conv`, `pool`, `layout`, `norm`, `transforms`, `opaque`) register
their operators here; the helpers below are what their shape functions and egglog shape rules share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

import numpy as np

Shape = tuple[int, ...]
Attrs = dict[str, Any]
Dims = tuple[Any, ...]  # a tensor's dimensions in the rule verifier: ints, symbols or expressions over them

# Attribute kinds and their egglog sorts.
EGG_SORT = {"int": "i64", "ints": "IVec", "float": "f64", "str": "String"}

SAME = -1  # in `OpDef.ranks`: the rank of the op's output
MAX_RANK = 6  # the highest rank the egglog shape rules cover


class ShapeError(ValueError):
    """An operator applied to inputs whose shapes or attributes it does not accept."""


@dataclass(frozen=True)
class Sized:
    """An attribute value that the rule generator (`rewrites.generate`) computes from the op's input shapes wherever
    the op is applied: a reshape's target, which no one value fits at every size the generator fingerprints at. Two
    are the same value where their names are; a rule the generator keeps has a variable in its place."""

    name: str
    # the value from the op's input shapes and its other attributes (a slice's axis)
    of: Callable[[Sequence[Shape], Mapping[str, Any]], Any] = field(compare=False, repr=False)


def sized(attrs: Mapping[str, Any]) -> bool:
    """Whether one of `attrs` is a `Sized` value (a loop: this runs for every op the generator evaluates)."""
    for v in attrs.values():
        if isinstance(v, Sized):
            return True
    return False


def resolved(attrs: Mapping[str, Any], in_shapes: Sequence[Shape]) -> Attrs:
    """`attrs` with each `Sized` value computed for inputs of `in_shapes`."""
    if not sized(attrs):
        return attrs if isinstance(attrs, dict) else dict(attrs)
    shapes = [tuple(s) for s in in_shapes]
    return {k: v.of(shapes, attrs) if isinstance(v, Sized) else v for k, v in attrs.items()}


class Equations(Protocol):
    """What an op's verifier `equations` may ask of the rule verifier (`rewrites.verify`) for one sample.

    Values are ints, symbols, tuples of them, or expressions built by `add`, `mul`, `prod`, `quotient` and `apply`;
    `eq` records an equation (solving it for a symbol where it can), `reject` discards the sample."""

    def sym(self, lo: int = 1, hi: int = 4, slack: bool = False) -> Any:
        """A fresh integer unknown sampled in [lo, hi] (`slack`: preferred when solving linear equations)."""

    def eq(self, a: Any, b: Any) -> None:
        """Require a == b (element-wise for tuples)."""

    def hint(self, x: Any, lo: int, hi: int) -> None:
        """Narrow the sampling range of a symbol."""

    def broadcast(self, out: Dims, a: Dims, b: Dims, dims: Iterable[int]) -> None:
        """Dims `dims` of operands `a` and `b` broadcast to `out` (sometimes one side is picked to be 1)."""

    def add(self, *xs: Any) -> Any:
        """Sum."""

    def mul(self, a: Any, b: Any) -> Any:
        """Product."""

    def prod(self, xs: Sequence[Any]) -> Any:
        """Product of all of `xs`."""

    def quotient(self, a: Any, b: Any) -> Any:
        """a / b, rejecting the sample where b does not divide a."""

    def apply(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn` of the arguments' values (at once where they are known)."""

    def reject(self, why: str) -> NoReturn:
        """Discard this rank assignment and attribute combination: the op's ranks or attribute values do not fit
        (a slice's axis beyond its rank). Decided by those alone, not by the sample's sizes."""


Domain = Sequence[Any] | Callable[[int], Sequence[Any]]  # values, or values for the op's output rank


@dataclass(frozen=True, eq=False)
class OpDef:
    """One operator: everything the pipeline needs to know about it.

    The importer, the IR, the e-graph, the exporter, the rule verifier and the cost models read these fields; none
    of them keeps a table of its own about operators. Element-wise ops are declared by `elementwise.unary` and
    `elementwise.binary`, which derive every field from the numpy function.
    """

    name: str
    egg: str  # egglog constructor name
    inputs: int | None  # number of tensor inputs; None = variadic (opaque only)
    attrs: tuple[tuple[str, str], ...]  # (name, kind) in egglog argument order; kind in EGG_SORT
    shape: Callable[[Sequence[Shape], Attrs], Shape]
    evaluate: Callable[[Sequence[np.ndarray], Attrs], np.ndarray] | None  # numpy reference semantics
    egg_shape_rules: Callable[[OpDef], list[str]]  # builds this op's egglog shape rules
    flops: Callable[[Sequence[Shape], Shape, Attrs], float]  # for the analytic cost model
    leaf: bool = False  # no tensor inputs, shape from attrs: a graph input, or a constant (`constant_leaf`)
    kind: str = "custom"  # shape family: "unary" (the input's shape), "broadcast" (numpy broadcasting), "custom"
    # the output's element type from the inputs' and the attributes (None: the first input's, float32 for none)
    dtype: Callable[[Sequence[str], Attrs], str] | None = None
    # whether the op is modelled on inputs of these element types (else the importer keeps the ONNX node opaque)
    accepts: Callable[[Sequence[str]], bool] = lambda dtypes: all(t == "float32" for t in dtypes)

    # ONNX. `onnx` is the ONNX op type of the same meaning: an op with tensor inputs only (no attributes) is
    # imported from and exported to it by the ONNX layer with no code of its own; for an op with attributes the ONNX
    # layer has a lowering function for that type and an emitter for the op. `onnx_also` names further ONNX op types
    # the importer lowers (mainly) to this op, each through a lowering function of the ONNX layer.
    onnx: str | None = None
    onnx_also: tuple[str, ...] = ()
    # an op of another domain is named "domain:OpType" in `onnx` (onnxruntime's contrib kernels, "com.microsoft:...")
    # the first opset at which the ONNX standard has the op as tensat writes it (None: onnxruntime's own kernel)
    standard_since: int | None = 1

    # Rule verifier (`rewrites.verify`).
    ranks: tuple[int | None, ...] | None = None  # (output, *inputs): a fixed rank, SAME or None (free); None: all free
    min_rank: int = 1  # lowest output rank
    # the shape equations between (s, output dims, input dims, attribute values)
    equations: Callable[[Equations, Dims, Sequence[Dims], Mapping[str, Any]], None] | None = None
    domains: Mapping[str, Domain] = field(default_factory=dict)  # values tried for each enumerated attribute
    solved: Mapping[str, Callable[[Equations, Dims], Any]] = field(default_factory=dict)  # attrs solved with shapes
    # values the rule generator (`rewrites.generate`) enumerates for an attribute, in place of its domain or for one
    # the verifier solves with shapes: valid at every size of leaf it fingerprints (a slice's start 0 or 1, of size
    # 1; a conv's pads that fit its n x n kernel), or computed from the op's input shapes (`Sized`: a reshape's target)
    generated: Mapping[str, Domain] = field(default_factory=dict)
    # values computed from the input shapes that a generation may enumerate besides (`tensat rules generate --domain
    # slice.size=1,half`), by name: a slice of half its input, which a slice of a concat of two leaves relates to them
    sized_values: Mapping[str, tuple[Sized, ...]] = field(default_factory=dict)
    # attributes whose domain holds every value the op takes (every axis, every permutation, every flag): a rule
    # the verifier passes at each value holds with the attribute as a variable (the generator's generalization)
    exhaustive: tuple[str, ...] = ()
    # attributes whose domain samples each case the op's semantics tell apart (a stride of 1 and of 2, no pads,
    # even and uneven ones): a rule the verifier passes at each value is kept with the attribute a variable, held to
    # the standard of a hand-written rule's `?s`, which the verifier checks on the same domain
    sampled: tuple[str, ...] = ()
    # whether the rule generator enumerates the op unless told which ops to enumerate (`rewrites.generate.default_ops`;
    # `--ops` names it otherwise): the ops read for the coverage of common exports (CNN activations, ONNX's other
    # reductions, Resize...) are not, so that a default run of three operators stays minutes, not hours
    enumerated_by_default: bool = True
    positive: tuple[int, ...] = ()  # inputs sampled positive (a variance under a square root, a logarithm)
    nonzero: tuple[int, ...] = ()  # inputs sampled away from zero but of either sign (a divisor)
    int_exact: bool = False  # numpy semantics are exact on integer tensors
    int_exact_if: Mapping[str, frozenset[int]] = field(default_factory=dict)  # ... when these attributes are so

    # Cost model and measurement.
    view: bool = False  # onnxruntime runs it without touching the data: it costs nothing
    commutative: bool = False  # its two inputs can be swapped: one computation, priced once
    breaks_layout: bool = False  # runs in, or forces reorders around, the blocked layout of a measured conv graph
    # (the others, element-wise ops and concat, run on whatever layout their inputs have)
    # its output is timed written to a buffer out of the caches: inside a graph a permutation's strided stores go to a
    # recycled buffer last used long before, and a unit rewriting one hot buffer runs it at a fraction of that time
    cold_output: bool = False
    # the element types of the inputs its unit is timed with, by input, where ONNX fixes one apart from the output's
    # (a Gather's indices, a Where's condition); the others are the output's
    operand_dtypes: Mapping[int, str] = field(default_factory=dict)
    # the inputs whose value, where it is a constant of one repeated value, decides the kernel onnxruntime runs (Pow's
    # exponent: 2 and 3 are computed by multiplication): its unit is timed with that value
    value_operands: frozenset[int] = frozenset()

    # Symbolic dims. The egglog rules of `symbolic_shape` (`sym-shape-of`: a tensor's dims with each symbolic dim at
    # a size no static dim takes, for rule guards to tell a dim that varies from one that happens to match): None
    # for an op whose output dims derive from its inputs' alone (its shape rules, on `sym-shape-of`); an op whose
    # attributes hold sizes (a Reshape's target, a graph input's shape) gives its own, or none, and the importer
    # sets its symbolic dims where the model tells them.
    symbolic_shape: Callable[[OpDef], list[str]] | None = None

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.attrs)

    @property
    def onnx_types(self) -> tuple[str, ...]:
        """Every ONNX op type the importer lowers to this op."""
        return ((self.onnx,) if self.onnx else ()) + self.onnx_also

    def egg_decl(self) -> str:
        """The egglog constructor declaration for this op."""
        attr_sorts = [EGG_SORT[kind] for _, kind in self.attrs]
        sorts = attr_sorts + ["TVec"] if self.inputs is None else ["T"] * self.inputs + attr_sorts
        return f"(constructor {self.egg} ({' '.join(sorts)}) T)"

    def egg_args(self, prefix: str = "x") -> list[str]:
        """Variable names for the constructor's arguments, in order (inputs, then attrs)."""
        if self.inputs is None:
            return [a for a in self.attr_names] + [f"{prefix}s"]
        return [f"{prefix}{i}" for i in range(self.inputs)] + list(self.attr_names)


REGISTRY: dict[str, OpDef] = {}
BY_EGG: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    """Add `op` to the registry (registration order is egglog's declaration order)."""
    REGISTRY[op.name] = op
    BY_EGG[op.egg] = op
    return op


def get(name: str) -> OpDef:
    """The definition of op `name`."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown tensat op {name!r}") from None


def shape_of(op: str, in_shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    """Output shape of `op` on inputs of `in_shapes`; raises ShapeError if ill-typed."""
    d = get(op)
    if d.inputs is not None and len(in_shapes) != d.inputs:
        raise ShapeError(f"{op} takes {d.inputs} inputs, got {len(in_shapes)}")
    shapes = [tuple(s) for s in in_shapes]
    return tuple(map(int, d.shape(shapes, resolved(attrs, shapes))))


def dtype_of(op: str, in_dtypes: Sequence[str], attrs: Attrs) -> str:
    """Element type of `op`'s output on inputs of `in_dtypes`."""
    d = get(op)
    if d.dtype is not None:
        return d.dtype(list(in_dtypes), attrs)
    return in_dtypes[0] if in_dtypes else FLOAT32


def operand_dtypes(op: str, out_dtype: str, count: int) -> tuple[str, ...]:
    """The element types of `count` inputs of `op` whose output is of `out_dtype`, as its unit is timed: the output's,
    but where the op fixes an input's (`OpDef.operand_dtypes`)."""
    fixed = get(op).operand_dtypes
    return tuple(fixed.get(k, out_dtype) for k in range(count))


FLOAT32 = "float32"
# element types the data-movement and logical ops are modelled on besides float32 (masks, indices, token ids)
DATA_TYPES = frozenset({"float32", "int64", "int32", "bool"})
# ONNX's element type codes of those, for the attributes that name a type (Cast's `to`, a constant's `dtype`)
TYPE_CODES = {"float32": 1, "int32": 6, "int64": 7, "bool": 9}
TYPE_NAMES = {code: name for name, code in TYPE_CODES.items()}


def any_data(dtypes: Sequence[str]) -> bool:
    """`OpDef.accepts` of an op that moves or selects elements: any of `DATA_TYPES`, the same for all inputs."""
    return bool(dtypes) and dtypes[0] in DATA_TYPES and all(t == dtypes[0] for t in dtypes)


def booleans(dtypes: Sequence[str]) -> bool:
    """`OpDef.accepts` of a logical op."""
    return all(t == "bool" for t in dtypes)


def standard(op: str, opset: int) -> bool:
    """Whether `op` is written with ops of the ONNX standard at `opset` (not as an onnxruntime kernel)."""
    since = get(op).standard_since
    return since is not None and opset >= since


def constant_leaf(op: str) -> bool:
    """Whether `op` is a constant with no tensor inputs (a weight, or a constant its attributes define): it costs
    nothing, and an op over constants alone is folded into one."""
    d = get(op)
    return d.leaf and op != "input"


def evaluate(op: str, arrays: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    """Numpy reference semantics of `op`."""
    d = get(op)
    if d.evaluate is None:
        raise ValueError(f"{op} has no numpy semantics")
    if sized(attrs):
        attrs = resolved(attrs, [np.shape(a) for a in arrays])
    return np.asarray(d.evaluate(arrays, attrs))


def egg_declarations() -> str:
    """egglog declarations of the tensor sort, shapes and every constructor."""
    lines = ["(sort IVec (Vec i64))", "(sort T)", "(sort TVec (Vec T))"]
    lines += [op.egg_decl() for op in REGISTRY.values()]
    lines += ["(function shape-of (T) IVec :no-merge)", "(ruleset shapes)"]
    # a tensor's dims as functions of the symbolic dims (`OpDef.symbolic_shape`); two e-nodes of one e-class may
    # name a dim two ways (a size read from the model, and the same derived by the rules): either is kept
    lines.append("(function sym-shape-of (T) IVec :merge old)")
    # (ones r): the shape of r ones, for rules whose constants broadcast (`rewrites.dsl`'s `ones`)
    lines.append("(function ones (i64) IVec :no-merge)")
    lines += [f"(set (ones {r}) {egg_vec(['1'] * r)})" for r in range(MAX_RANK + 1)]
    return "\n".join(lines)


def egg_shape_rules(names: Iterable[str] | None = None) -> list[str]:
    """The egglog shape rules of the ops called `names` (default: every op)."""
    wanted = None if names is None else set(names)
    return [
        rule for name, op in REGISTRY.items() if wanted is None or name in wanted for rule in op.egg_shape_rules(op)
    ]


def egg_symbolic_shape_rules(names: Iterable[str] | None = None) -> list[str]:
    """The egglog rules of `sym-shape-of` for the ops called `names` (default: every op), in the `shapes` ruleset."""
    wanted = None if names is None else set(names)
    out = []
    for name, op in REGISTRY.items():
        if wanted is not None and name not in wanted:
            continue
        if op.symbolic_shape is not None:
            out += op.symbolic_shape(op)
        else:
            out += [rule.replace("(shape-of ", "(sym-shape-of ") for rule in op.egg_shape_rules(op)]
    return out


def symbolic_from_model(_: OpDef) -> list[str]:
    """`OpDef.symbolic_shape` of an op whose symbolic dims only the model tells (a graph input, an opaque node)."""
    return []


def symbolic_of_first(op: OpDef) -> list[str]:
    """`OpDef.symbolic_shape` of an op whose output has its first input's dims, whatever the others' (a kernel
    whose second input broadcasts)."""
    return [f"(rule ({egg_match(op)} (= y0 (sym-shape-of x0))) ((set (sym-shape-of e) y0)) :ruleset shapes)"]


def symbolic_where_static(op: OpDef) -> list[str]:
    """`OpDef.symbolic_shape` of an op whose attributes hold sizes: its dims are static where its inputs' are."""
    n = op.inputs or 0
    binds = [f"(= s{i} (shape-of x{i})) (= (sym-shape-of x{i}) s{i})" for i in range(n)]
    body = " ".join([egg_match(op), *binds, "(= out (shape-of e))"])
    return [f"(rule ({body}) ((set (sym-shape-of e) out)) :ruleset shapes)"]


def symbolic_on_static_axis(op: OpDef) -> list[str]:
    """`OpDef.symbolic_shape` of an op that sizes one axis (`axis`) by its attributes and keeps the others (a
    Slice): where that axis of its input is static, the input's symbolic dims with that axis as it sizes it."""
    body = " ".join(
        [egg_match(op), "(= s0 (shape-of x0)) (= y0 (sym-shape-of x0))", "(= (vec-get s0 axis) (vec-get y0 axis))"]
    )
    return [
        f"(rule ({body} (= out (shape-of e))) ((set (sym-shape-of e) (vec-set y0 axis (vec-get out axis)))) "
        ":ruleset shapes)"
    ]


# ---------------------------------------------------------------------------------------------------------------
# Helpers of the families' shape functions


def numel(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


def check(cond: bool, msg: str) -> None:
    """Raise ShapeError(msg) unless `cond`."""
    if not cond:
        raise ShapeError(msg)


def no_flops(_: Sequence[Shape], __: Shape, ___: Attrs) -> float:
    return 0.0


# ---------------------------------------------------------------------------------------------------------------
# egglog shape-rule helpers. Every rule is written for the node variable `e` whose constructor arguments are named
# by `OpDef.egg_args()`; shapes of inputs are bound as s0, s1, ...


def egg_match(op: OpDef) -> str:
    """The query atom binding `e` to an application of `op`."""
    args = " ".join(op.egg_args())
    return f"(= e ({op.egg} {args}))" if args else f"(= e ({op.egg}))"


def egg_rule(op: OpDef, query: Sequence[str], shape_expr: str) -> str:
    """A shape rule: where `query` holds (input shapes bound as s0, s1...), `e` has shape `shape_expr`."""
    binds = [f"(= s{i} (shape-of x{i}))" for i in range(op.inputs or 0)]
    body = " ".join([egg_match(op), *binds, *query])
    return f"(rule ({body}) ((set (shape-of e) {shape_expr})) :ruleset shapes)"


def egg_broadcast_onto(op: OpDef, source: str, target: str) -> list[str]:
    """Shape rules for every rank: where each dim of `source` is 1 or the dim of `target`, `e` has shape `target`
    (ONNX's unidirectional broadcasting: an Expand to its target, PRelu's slope onto its input)."""
    out = []
    for r in range(0, MAX_RANK + 1):
        query = [f"(= (vec-length {source}) {r})", f"(= (vec-length {target}) {r})"]
        for i in range(r):
            a, b = egg_dim(source, i), egg_dim(target, i)
            query.append(f"(= 0 (* (- {a} 1) (- {a} {b})))")
        out.append(egg_rule(op, query, target))
    return out


def egg_vec(items: Sequence[str]) -> str:
    return f"(vec-of {' '.join(items)})" if items else "(vec-empty)"


def egg_dim(s: str, i: int | str) -> str:
    return f"(vec-get {s} {i})"


def not_instantiated(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    """`OpDef.equations` of an op no rule rewrites, whose shapes the rule verifier does not solve for (a gather or
    scatter by an index tensor, a TopK): a rule naming it is refused by the verifier, not checked wrongly."""
    s.reject("an op the rule verifier does not instantiate")


def shape_from_attr(op: OpDef) -> list[str]:
    """The shape rule of an op whose shape is its `shape` attribute (leaves, opaque)."""
    return [f"(rule ({egg_match(op)}) ((set (shape-of e) shape)) :ruleset shapes)"]
