"""Element-wise ops. `unary` and `binary` derive everything about one from its numpy function: shape (the input's,
or numpy broadcasting of equal-rank operands), egglog shape rule, cost, rule-verifier ranks and equations, and the
ONNX op it imports from and exports to. Ops that keep their input's shape but read along an axis (Softmax, LRN) are
declared here too, with `unary`.

Broadcast operands have the same rank (the IR builder inserts reshapes to make it so); dimensions broadcast
numpy-style.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tensat.ops.registry import (
    MAX_RANK,
    SAME,
    TYPE_CODES,
    TYPE_NAMES,
    Attrs,
    Dims,
    Equations,
    OpDef,
    Shape,
    ShapeError,
    any_data,
    booleans,
    check,
    egg_broadcast_onto,
    egg_dim,
    egg_rule,
    egg_vec,
    numel,
    register,
)


def broadcast_shape(shapes: Sequence[Shape], _: Attrs) -> Shape:
    """numpy broadcasting of equal-rank shapes."""
    if len({len(s) for s in shapes}) != 1:
        raise ShapeError(f"element-wise operands need equal ranks, got {' and '.join(map(str, shapes))}")
    out = []
    for dims in zip(*shapes):
        top = max(dims)
        if any(d != 1 and d != top for d in dims):
            raise ShapeError(f"shapes {' and '.join(map(str, shapes))} do not broadcast")
        out.append(top)
    return tuple(out)


def _broadcast_rules(op: OpDef) -> list[str]:
    out = []
    n = op.inputs or 2
    for r in range(0, MAX_RANK + 1):
        query = [f"(= (vec-length s{k}) {r})" for k in range(n)]
        dims = []
        for i in range(r):
            a = egg_dim("s0", i)
            for k in range(1, n):
                b = egg_dim(f"s{k}", i)
                query.append(f"(= 0 (* (- (min {a} {b}) 1) (- {a} {b})))")
                a = f"(max {a} {b})"
            dims.append(a)
        out.append(egg_rule(op, query, egg_vec(dims)))
    return out


def _broadcast_equations(s: Equations, out: Dims, ins: Sequence[Dims], _: Mapping[str, Any]) -> None:
    s.broadcast(out, ins[-2], ins[-1], range(len(out)))
    for extra in ins[:-2]:  # a third operand (Where's condition) takes the output's dims
        s.eq(out, extra)


def _same_shape(shapes: Sequence[Shape], _: Attrs) -> Shape:
    return tuple(shapes[0])


def _same_rules(op: OpDef) -> list[str]:
    return [egg_rule(op, [], "s0")]


def _same_equations(s: Equations, out: Dims, ins: Sequence[Dims], _: Mapping[str, Any]) -> None:
    s.eq(out, ins[0])


def elementwise_flops(_: Sequence[Shape], out: Shape, __: Attrs) -> float:
    return float(numel(out))


def _of_first(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[Sequence[np.ndarray], Attrs], np.ndarray]:
    """The evaluator of a one-input op computing `fn`."""
    return lambda xs, a: fn(xs[0])


def unary(name: str, egg: str, fn: Callable[[np.ndarray], np.ndarray] | None, **fields: Any) -> OpDef:
    """An op of one tensor, of its shape, computing `fn` (or `evaluate=`, given attributes); `fields` add the ONNX
    op type (`onnx=`), `int_exact=True` where `fn` is exact on integers, and anything else an OpDef holds
    (`kind="custom"` for one that reads along an axis, which is not element-wise: Softmax)."""
    evaluate = fields.pop("evaluate", None)
    if evaluate is None:
        if fn is None:
            raise TypeError(f"unary op {name!r} needs fn or evaluate=")
        evaluate = _of_first(fn)
    return OpDef(
        name,
        egg,
        1,
        fields.pop("attrs", ()),
        fields.pop("shape", _same_shape),
        evaluate,
        _same_rules,
        elementwise_flops,
        kind=fields.pop("kind", "unary"),
        ranks=(SAME, SAME),
        equations=_same_equations,
        **fields,
    )


def binary(name: str, egg: str, fn: Callable[..., np.ndarray], inputs: int = 2, **fields: Any) -> OpDef:
    """An element-wise op of two (or `inputs`) broadcasting tensors computing `fn`; `fields` as for `unary`."""
    return OpDef(
        name,
        egg,
        inputs,
        (),
        fields.pop("shape", broadcast_shape),
        lambda xs, a: fn(*xs),
        fields.pop("egg_shape_rules", _broadcast_rules),
        elementwise_flops,
        kind="broadcast",
        ranks=(SAME,) * (inputs + 1),
        equations=fields.pop("equations", _broadcast_equations),
        **fields,
    )


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def numeric(dtypes: Sequence[str]) -> bool:
    """`OpDef.accepts` of integer-exact arithmetic: floats, or integers of one type (the positions a decoder computes
    from its attention mask's cumulative sum)."""
    return any_data(dtypes) and dtypes[0] != "bool"


ADD = register(
    binary(
        "add", "Add", operator.add, onnx="Add", onnx_also=("Sub",), int_exact=True, commutative=True, accepts=numeric
    )
)
# ONNX's Sum of two tensors: add's value, in a form onnxruntime does not fuse with a LayerNormalization reading it
# (`skip-layernorm-unfuse` writes one where the extraction chooses the two ops over the fused kernel). The importer
# reads a Sum of two as one, so that a model tensat wrote keeps the form it chose.
SUM = register(binary("sum", "Sum", operator.add, onnx="Sum", int_exact=True, commutative=True))
MUL = register(binary("mul", "Mul", operator.mul, onnx="Mul", int_exact=True, commutative=True, accepts=numeric))
RELU = register(unary("relu", "Relu", relu, onnx="Relu", int_exact=True))
SIGMOID = register(unary("sigmoid", "Sigmoid", sigmoid, onnx="Sigmoid"))
TANH = register(unary("tanh", "Tanh", np.tanh, onnx="Tanh"))
ABS = register(unary("abs", "Abs", np.abs, onnx="Abs", int_exact=True))


# -- arithmetic and transcendental functions of real tensors


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, element-wise (numpy has none; `math.erf` is exact in float64)."""
    x = np.asarray(x)
    return np.vectorize(math.erf, otypes=[x.dtype if x.dtype.kind == "f" else np.float64])(x)


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX Div: true division of reals, truncation toward zero of integers."""
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return np.trunc(a / b).astype(np.result_type(a, b))
    return a / b


SUB = register(binary("sub", "Sub", operator.sub, onnx="Sub", int_exact=True, accepts=numeric))
DIV = register(binary("div", "Div", _divide, onnx="Div", nonzero=(1,)))
POW = register(binary("pow", "Pow", np.power, onnx="Pow", nonzero=(0,), value_operands=frozenset({1})))
SQRT = register(unary("sqrt", "Sqrt", np.sqrt, onnx="Sqrt", positive=(0,)))
RECIPROCAL = register(unary("reciprocal", "Reciprocal", lambda x: 1.0 / x, onnx="Reciprocal", nonzero=(0,)))
EXP = register(unary("exp", "Exp", np.exp, onnx="Exp"))
LOG = register(unary("log", "Log", np.log, onnx="Log", positive=(0,)))
ERF = register(unary("erf", "Erf", erf, onnx="Erf"))
NEG = register(unary("neg", "Neg", operator.neg, onnx="Neg", int_exact=True))
SIGN = register(unary("sign", "Sign", np.sign, onnx="Sign", int_exact=True))
SOFTPLUS = register(unary("softplus", "Softplus", lambda x: np.logaddexp(0.0, x), onnx="Softplus"))
SOFTSIGN = register(
    unary("softsign", "Softsign", lambda x: x / (1.0 + np.abs(x)), onnx="Softsign", enumerated_by_default=False)
)
FLOOR = register(unary("floor", "Floor", np.floor, onnx="Floor", enumerated_by_default=False))
CEIL = register(unary("ceil", "Ceil", np.ceil, onnx="Ceil", enumerated_by_default=False))
# ONNX Round rounds halves to even, as numpy does
ROUND = register(unary("round", "Round", np.round, onnx="Round", standard_since=11, enumerated_by_default=False))
SIN = register(unary("sin", "Sin", np.sin, onnx="Sin", standard_since=7, enumerated_by_default=False))
COS = register(unary("cos", "Cos", np.cos, onnx="Cos", standard_since=7, enumerated_by_default=False))
# an element-wise extreme of two tensors (ONNX's Max and Min of more stay as written)
_EXTREME = dict(int_exact=True, commutative=True, standard_since=8, enumerated_by_default=False)
MAX = register(binary("max", "Max", np.maximum, onnx="Max", **_EXTREME))
MIN = register(binary("min", "Min", np.minimum, onnx="Min", **_EXTREME))


def _onto_first_shape(shapes: Sequence[Shape], a: Attrs) -> Shape:
    """The first operand's shape, which the second broadcasts to (ONNX's unidirectional broadcasting: PRelu's slope)."""
    out = broadcast_shape(shapes, a)
    check(out == tuple(shapes[0]), f"{shapes[1]} does not broadcast to {shapes[0]}")
    return out


def _onto_first_rules(op: OpDef) -> list[str]:
    return egg_broadcast_onto(op, "s1", "s0")


def _onto_first_equations(s: Equations, out: Dims, ins: Sequence[Dims], _: Mapping[str, Any]) -> None:
    s.broadcast(out, ins[0], ins[1], range(len(out)))
    s.eq(out, ins[0])


# PRelu: x where x >= 0, slope * x below; the slope broadcasts to x (one per channel, as a CNN writes it)
PRELU = register(
    binary(
        "prelu",
        "PRelu",
        lambda x, s: np.where(x < 0, s * x, x),
        onnx="PRelu",
        standard_since=9,
        enumerated_by_default=False,
        shape=_onto_first_shape,
        egg_shape_rules=_onto_first_rules,
        equations=_onto_first_equations,
    )
)


def hard_sigmoid(x: np.ndarray, alpha: float = 0.2, beta: float = 0.5) -> np.ndarray:
    """ONNX HardSigmoid: alpha x + beta, clipped to [0, 1]."""
    return np.clip(alpha * x + beta, 0.0, 1.0).astype(x.dtype, copy=False)


def _float_attrs(fn: Callable[..., np.ndarray]) -> Callable[[Sequence[np.ndarray], Attrs], np.ndarray]:
    """The evaluator of a one-input op computing `fn(x, **attributes)`, in the input's element type."""
    return lambda xs, a: np.asarray(fn(xs[0], **dict(a))).astype(xs[0].dtype, copy=False)


# ONNX's default values of the float attributes of the activations that have them, by op (`_activation`)
ACTIVATION_DEFAULTS: dict[str, dict[str, float]] = {}


def _activation(
    name: str,
    egg: str,
    fn: Callable[..., np.ndarray],
    defaults: Mapping[str, float],
    others: Mapping[str, float] | None = None,
    **fields: Any,
) -> OpDef:
    """An activation with float attributes, ONNX op `egg`'s by name (LeakyRelu's alpha), whose ONNX defaults are
    `defaults`; the verifier tries each at its default and at the value `others` gives."""
    ACTIVATION_DEFAULTS[name] = dict(defaults)
    domains = {
        attr: [value, *([others[attr]] if others and attr in others else [])] for attr, value in defaults.items()
    }
    return unary(
        name,
        egg,
        None,
        evaluate=_float_attrs(fn),
        attrs=tuple((attr, "float") for attr in defaults),
        domains=domains,
        onnx=egg,
        enumerated_by_default=False,
        **fields,
    )


def _below_zero(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """x where x > 0, else `fn(x, **attributes)` (evaluated on min(x, 0), where it cannot overflow)."""
    return lambda x, **a: np.where(x > 0, x, fn(np.minimum(x, 0), **a))


HARD_SIGMOID = register(
    _activation("hardsigmoid", "HardSigmoid", hard_sigmoid, {"alpha": 0.2, "beta": 0.5}, {"alpha": 1 / 6, "beta": 0.25})
)
# x * HardSigmoid(x) with alpha 1/6 and beta 1/2 (MobileNetV3, LeViT); onnxruntime runs it as that pair
HARD_SWISH = register(
    unary(
        "hardswish",
        "HardSwish",
        lambda x: x * hard_sigmoid(x, 1 / 6, 0.5),
        onnx="HardSwish",
        standard_since=14,
        enumerated_by_default=False,
    )
)
# x * tanh(softplus(x)) (YOLOv4)
MISH = register(
    unary(
        "mish",
        "Mish",
        lambda x: x * np.tanh(np.logaddexp(0.0, x)),
        onnx="Mish",
        standard_since=18,
        enumerated_by_default=False,
    )
)
LEAKY_RELU = register(
    _activation("leakyrelu", "LeakyRelu", _below_zero(lambda x, alpha: alpha * x), {"alpha": 0.01}, {"alpha": 0.2})
)
ELU = register(
    _activation("elu", "Elu", _below_zero(lambda x, alpha: alpha * np.expm1(x)), {"alpha": 1.0}, {"alpha": 0.5})
)
CELU = register(
    _activation(
        "celu",
        "Celu",
        _below_zero(lambda x, alpha: alpha * np.expm1(x / alpha)),
        {"alpha": 1.0},
        {"alpha": 0.5},
        standard_since=12,
    )
)
SELU = register(
    _activation(
        "selu",
        "Selu",
        lambda x, alpha, gamma: gamma * _below_zero(lambda v: alpha * np.expm1(v))(x),
        {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
    )
)
THRESHOLDED_RELU = register(
    _activation(
        "thresholdedrelu",
        "ThresholdedRelu",
        lambda x, alpha: np.where(x > alpha, x, 0),
        {"alpha": 1.0},
        {"alpha": 0.0},
        standard_since=10,
    )
)


def _clip_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    x = xs[0]
    return np.clip(x, np.asarray(a["min"], x.dtype), np.asarray(a["max"], x.dtype))


# Clip with constant bounds; a bound the model leaves out is infinite
CLIP = register(
    unary(
        "clip",
        "Clip",
        None,
        evaluate=_clip_eval,
        attrs=(("min", "float"), ("max", "float")),
        onnx="Clip",
        domains={"min": [-1.0, 0.0], "max": [1.0, 6.0]},
    )
)

GELU_APPROXIMATIONS = ("none", "tanh")  # the `approximate` attribute of ONNX Gelu, by the op's code


def _gelu_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    x = xs[0]
    if a["approximate"]:
        inner = np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)
        return (0.5 * x * (1.0 + np.tanh(inner))).astype(x.dtype, copy=False)
    return (0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))).astype(x.dtype, copy=False)


# GELU: x * Phi(x), exactly (erf, approximate 0) or by tanh (approximate 1): ONNX Gelu (opset 20), which onnxruntime
# also runs as its contrib Gelu and FastGelu
GELU = register(
    unary(
        "gelu",
        "Gelu",
        None,
        evaluate=_gelu_eval,
        attrs=(("approximate", "int"),),
        onnx="Gelu",
        domains={"approximate": [0, 1]},
        exhaustive=("approximate",),
        standard_since=20,
    )
)


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _axis_domain(rank: int) -> list[int]:
    return list(range(rank))


def _along_axis_shape(shapes: Sequence[Shape], a: Attrs) -> Shape:
    """The shape of an op along axis `axis` of its input (Softmax): the input's, for an axis the input has."""
    check(0 <= a["axis"] < len(shapes[0]), f"axis {a['axis']} invalid for {shapes[0]}")
    return tuple(shapes[0])


SOFTMAX = register(
    unary(
        "softmax",
        "Softmax",
        None,
        evaluate=lambda xs, a: softmax(xs[0], a["axis"]),
        attrs=(("axis", "int"),),
        kind="custom",
        shape=_along_axis_shape,
        onnx="Softmax",
        domains={"axis": _axis_domain},
        exhaustive=("axis",),
    )
)


def cumulative_sum(x: np.ndarray, axis: int, exclusive: int, reverse: int) -> np.ndarray:
    """ONNX CumSum along `axis`: each element the sum of those before it (`exclusive`: strictly before), counted from
    the end with `reverse`."""
    y = np.flip(x, axis) if reverse else x
    out = np.cumsum(y, axis=axis, dtype=x.dtype)
    if exclusive:
        shifted = np.zeros_like(out)
        inner = [slice(None)] * x.ndim
        inner[axis] = slice(1, None)
        outer = [slice(None)] * x.ndim
        outer[axis] = slice(None, -1)
        shifted[tuple(inner)] = out[tuple(outer)]
        out = shifted
    return np.flip(out, axis) if reverse else out


# a running sum along one axis (a decoder's positions, counted from its attention mask)
CUMSUM = register(
    unary(
        "cumsum",
        "CumSum",
        None,
        evaluate=lambda xs, a: cumulative_sum(xs[0], a["axis"], a["exclusive"], a["reverse"]),
        attrs=(("axis", "int"), ("exclusive", "int"), ("reverse", "int")),
        kind="custom",
        shape=_along_axis_shape,
        onnx="CumSum",
        standard_since=11,
        enumerated_by_default=False,
        accepts=numeric,
        int_exact=True,
        domains={"axis": _axis_domain, "exclusive": [0, 1], "reverse": [0, 1]},
        exhaustive=("axis", "exclusive", "reverse"),
    )
)


def triangle(x: np.ndarray, upper: int, k: int) -> np.ndarray:
    """ONNX Trilu: each matrix of the last two axes kept on and above (`upper`) or on and below diagonal `k`, zero
    elsewhere."""
    return np.triu(x, k) if upper else np.tril(x, k)


def _matrices_shape(shapes: Sequence[Shape], _: Attrs) -> Shape:
    check(len(shapes[0]) >= 2, f"a triangle of matrices needs rank >= 2, got {shapes[0]}")
    return tuple(shapes[0])


# the upper or lower triangle of each matrix (a causal mask, where its size is not a constant)
TRILU = register(
    unary(
        "trilu",
        "Trilu",
        None,
        evaluate=lambda xs, a: triangle(xs[0], a["upper"], a["k"]),
        attrs=(("upper", "int"), ("k", "int")),
        kind="custom",
        shape=_matrices_shape,
        onnx="Trilu",
        standard_since=14,
        enumerated_by_default=False,
        accepts=any_data,
        int_exact=True,
        min_rank=2,
        domains={"upper": [0, 1], "k": [-1, 0, 2]},
        exhaustive=("upper",),
    )
)
LOG_SOFTMAX = register(
    unary(
        "log_softmax",
        "LogSoftmax",
        None,
        evaluate=lambda xs, a: _log_softmax(xs[0], a["axis"]),
        attrs=(("axis", "int"),),
        kind="custom",
        shape=_along_axis_shape,
        onnx="LogSoftmax",
        domains={"axis": _axis_domain},
        exhaustive=("axis",),
    )
)


def lrn_reference(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """ONNX LRN across channels of an (N, C, ...) tensor: x / (bias + alpha / size * window sum of x^2)^beta, the
    window of channel c from c - floor((size - 1) / 2) to c + ceil((size - 1) / 2)."""
    squares = x * x
    channels = x.shape[1]
    below, above = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = np.pad(squares, [(0, 0), (below, above)] + [(0, 0)] * (x.ndim - 2))
    window = sum(padded[:, k : k + channels] for k in range(size))
    return (x / (bias + alpha / size * window) ** beta).astype(x.dtype, copy=False)


def _lrn_shape(shapes: Sequence[Shape], a: Attrs) -> Shape:
    check(len(shapes[0]) == 4 and a["size"] > 0, f"LRN needs a 4-D tensor and a positive size, got {shapes[0]}")
    return tuple(shapes[0])


def _lrn_rules(op: OpDef) -> list[str]:
    return [egg_rule(op, ["(= (vec-length s0) 4)", "(< 0 size)"], "s0")]


def _lrn_equations(s: Equations, out: Dims, ins: Sequence[Dims], _: Mapping[str, Any]) -> None:
    s.eq(out, ins[0])


# local response normalization across the channels of a 4-D tensor (AlexNet, CaffeNet, GoogLeNet)
LRN = register(
    OpDef(
        "lrn",
        "LRN",
        1,
        (("size", "int"), ("alpha", "float"), ("beta", "float"), ("bias", "float")),
        _lrn_shape,
        lambda xs, a: lrn_reference(xs[0], a["size"], a["alpha"], a["beta"], a["bias"]),
        _lrn_rules,
        lambda s, o, a: float(numel(o) * (a["size"] + 3)),
        onnx="LRN",
        ranks=(4, 4),
        min_rank=4,
        equations=_lrn_equations,
        domains={"size": [1, 2, 3, 5], "alpha": [1e-4, 0.5], "beta": [0.75, 0.5, 0.3], "bias": [1.0, 2.0]},
        positive=(0,),
        breaks_layout=True,
    )
)


# -- element types: casts, masks and selections


def _cast_dtype(_: Sequence[str], a: Attrs) -> str:
    return TYPE_NAMES[a["to"]]


CAST = register(
    unary(
        "cast",
        "Cast",
        None,
        evaluate=lambda xs, a: xs[0].astype(TYPE_NAMES[a["to"]]),
        attrs=(("to", "int"),),
        onnx="Cast",
        dtype=_cast_dtype,
        accepts=lambda dtypes: dtypes[0] in TYPE_CODES,
        domains={"to": [TYPE_CODES["float32"]]},
    )
)


def _to_bool(_: Sequence[str], __: Attrs) -> str:
    return "bool"


AND = register(binary("and", "And", np.logical_and, onnx="And", accepts=booleans, int_exact=True, commutative=True))
OR = register(binary("or", "Or", np.logical_or, onnx="Or", accepts=booleans, int_exact=True, commutative=True))
NOT = register(unary("not", "Not", np.logical_not, onnx="Not", accepts=booleans, int_exact=True))
EQUAL = register(binary("equal", "Equal", np.equal, onnx="Equal", dtype=_to_bool, accepts=any_data, int_exact=True))
# A comparison's operands are timed as float32 (the item priced carries no operand types, and a boolean Less is no
# ONNX op); IsNaN reads float32, as its `accepts` says. Greater and GreaterOrEqual are read as Less and LessOrEqual
# of the operands swapped, which they are even at a NaN (false both ways).
LESS = register(
    binary(
        "less",
        "Less",
        np.less,
        onnx="Less",
        onnx_also=("Greater",),
        dtype=_to_bool,
        accepts=numeric,
        int_exact=True,
        operand_dtypes={0: "float32", 1: "float32"},
    )
)


def _mod(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    x, y = xs
    return np.fmod(x, y) if a["fmod"] else np.mod(x, y)


# ONNX Mod: the remainder with the divisor's sign (numpy's and Python's), or with `fmod` the dividend's (C's fmod,
# which ONNX requires of floats); a divisor of zero has no meaning, as in onnxruntime
MOD = register(
    OpDef(
        "mod",
        "Mod",
        2,
        (("fmod", "int"),),
        broadcast_shape,
        _mod,
        _broadcast_rules,
        elementwise_flops,
        kind="broadcast",
        onnx="Mod",
        standard_since=10,
        ranks=(SAME, SAME, SAME),
        equations=_broadcast_equations,
        accepts=numeric,
        domains={"fmod": [0, 1]},
        nonzero=(1,),
        int_exact=True,
        enumerated_by_default=False,
    )
)
LESS_OR_EQUAL = register(
    binary(
        "less_or_equal",
        "LessOrEqual",
        np.less_equal,
        onnx="LessOrEqual",
        onnx_also=("GreaterOrEqual",),
        standard_since=12,
        dtype=_to_bool,
        accepts=numeric,
        int_exact=True,
        operand_dtypes={0: "float32", 1: "float32"},
        enumerated_by_default=False,
    )
)
ISNAN = register(unary("isnan", "IsNaN", np.isnan, onnx="IsNaN", dtype=_to_bool, operand_dtypes={0: "float32"}))


def _isinf(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    x = xs[0]
    return np.isinf(x) & (((x > 0) & bool(a["detect_positive"])) | ((x < 0) & bool(a["detect_negative"])))


# an infinity, of either sign or of one (a mask's -inf found before a Softmax)
ISINF = register(
    unary(
        "isinf",
        "IsInf",
        None,
        evaluate=_isinf,
        attrs=(("detect_negative", "int"), ("detect_positive", "int")),
        onnx="IsInf",
        standard_since=10,
        dtype=_to_bool,
        operand_dtypes={0: "float32"},
        domains={"detect_negative": [0, 1], "detect_positive": [0, 1]},
        enumerated_by_default=False,
    )
)


def _where_accepts(dtypes: Sequence[str]) -> bool:
    return len(dtypes) == 3 and dtypes[0] == "bool" and any_data(dtypes[1:])


def _where(c: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.asarray(np.where(c.astype(bool), x, y))


# numpy's where of a boolean condition (broadcast like the values)
WHERE = register(
    binary(
        "where",
        "Where",
        _where,
        inputs=3,
        onnx="Where",
        dtype=lambda dtypes, _: dtypes[1],
        accepts=_where_accepts,
        operand_dtypes={0: "bool"},
    )
)
