"""The operator registry: every tensat operator defined once.

Each `OpDef` carries what every consumer needs: its tensor inputs and typed attributes, a shape function, numpy
reference semantics, the egglog constructor and shape rule, the ONNX export mapping, and FLOP/byte counts for the
analytic cost model. The ONNX importer, the e-graph lowering, the exporter, the rule verifier and the cost models
all read this table; nothing else describes an operator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

Shape = tuple[int, ...]
Attrs = dict[str, Any]

# Fused activation codes (Tensat's numbering).
ACT_NONE, ACT_SIGMOID, ACT_RELU, ACT_TANH = 0, 1, 2, 3
ACT_NAMES = {ACT_NONE: "none", ACT_SIGMOID: "sigmoid", ACT_RELU: "relu", ACT_TANH: "tanh"}
ACT_CODES = {name: code for code, name in ACT_NAMES.items()}

# Attribute kinds and their egglog sorts.
EGG_SORT = {"int": "i64", "ints": "IVec", "float": "f64", "str": "String"}


class ShapeError(ValueError):
    """An operator applied to inputs whose shapes or attributes it does not accept."""


@dataclass(frozen=True)
class OpDef:
    """One operator: everything the pipeline needs to know about it."""

    name: str
    egg: str  # egglog constructor name
    inputs: int | None  # number of tensor inputs; None = variadic (opaque only)
    attrs: tuple[tuple[str, str], ...]  # (name, kind) in egglog argument order; kind in EGG_SORT
    shape: Callable[[Sequence[Shape], Attrs], Shape]
    evaluate: Callable[[Sequence[np.ndarray], Attrs], np.ndarray] | None
    egg_shape_rules: Callable[["OpDef"], list[str]]  # builds this op's egglog shape rules
    flops: Callable[[Sequence[Shape], Shape, Attrs], float]
    leaf: bool = False  # input / weight: no tensor inputs, shape from attrs

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.attrs)

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
    REGISTRY[op.name] = op
    BY_EGG[op.egg] = op
    return op


def get(name: str) -> OpDef:
    """The definition of op `name`."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown tensat op {name!r}") from None


def _numel(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ShapeError(msg)


# ---------------------------------------------------------------------------------------------------------------
# egglog shape-rule helpers. Every rule is written for the node variable `e` whose constructor arguments are named
# by `OpDef.egg_args()`; shapes of inputs are bound as s0, s1, ...

MAX_RANK = 6


def _match(op: OpDef) -> str:
    args = " ".join(op.egg_args())
    return f"(= e ({op.egg} {args}))" if args else f"(= e ({op.egg}))"


def _rule(op: OpDef, query: Sequence[str], shape_expr: str) -> str:
    binds = [f"(= s{i} (shape-of x{i}))" for i in range(op.inputs or 0)]
    body = " ".join([_match(op), *binds, *query])
    return f"(rule ({body}) ((set (shape-of e) {shape_expr})) :ruleset shapes)"


def _vec(items: Sequence[str]) -> str:
    return f"(vec-of {' '.join(items)})" if items else "(vec-empty)"


def _dim(s: str, i: int | str) -> str:
    return f"(vec-get {s} {i})"


# ---------------------------------------------------------------------------------------------------------------
# Leaves


def _leaf_shape(_: Sequence[Shape], attrs: Attrs) -> Shape:
    return tuple(attrs["shape"])


def _leaf_rules(op: OpDef) -> list[str]:
    return [f"(rule ({_match(op)}) ((set (shape-of e) shape)) :ruleset shapes)"]


def _no_flops(_: Sequence[Shape], __: Shape, ___: Attrs) -> float:
    return 0.0


INPUT = register(
    OpDef("input", "Input", 0, (("name", "str"), ("shape", "ints")), _leaf_shape, None, _leaf_rules, _no_flops, leaf=True)
)
WEIGHT = register(
    OpDef("weight", "Weight", 0, (("name", "str"), ("shape", "ints")), _leaf_shape, None, _leaf_rules, _no_flops, leaf=True)
)


# ---------------------------------------------------------------------------------------------------------------
# Element-wise binary ops. Both operands have the same rank (the IR builder inserts reshapes to make it so);
# dimensions broadcast numpy-style.


def _broadcast_shape(shapes: Sequence[Shape], _: Attrs) -> Shape:
    a, b = shapes
    _check(len(a) == len(b), f"element-wise operands need equal ranks, got {a} and {b}")
    out = []
    for x, y in zip(a, b):
        _check(x == y or x == 1 or y == 1, f"shapes {a} and {b} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


def _broadcast_rules(op: OpDef) -> list[str]:
    out = []
    for r in range(0, MAX_RANK + 1):
        query = [f"(= (vec-length s0) {r})", f"(= (vec-length s1) {r})"]
        dims = []
        for i in range(r):
            a, b = _dim("s0", i), _dim("s1", i)
            query.append(f"(= 0 (* (- (min {a} {b}) 1) (- {a} {b})))")
            dims.append(f"(max {a} {b})")
        out.append(_rule(op, query, _vec(dims)))
    return out


def _elementwise_flops(_: Sequence[Shape], out: Shape, __: Attrs) -> float:
    return float(_numel(out))


ADD = register(OpDef("add", "Add", 2, (), _broadcast_shape, lambda xs, a: xs[0] + xs[1], _broadcast_rules, _elementwise_flops))
MUL = register(OpDef("mul", "Mul", 2, (), _broadcast_shape, lambda xs, a: xs[0] * xs[1], _broadcast_rules, _elementwise_flops))


# ---------------------------------------------------------------------------------------------------------------
# Unary element-wise ops


def _same_shape(shapes: Sequence[Shape], _: Attrs) -> Shape:
    return tuple(shapes[0])


def _same_rules(op: OpDef) -> list[str]:
    return [_rule(op, [], "s0")]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


for _name, _egg, _fn in (("relu", "Relu", _relu), ("sigmoid", "Sigmoid", _sigmoid), ("tanh", "Tanh", np.tanh)):
    register(OpDef(_name, _egg, 1, (), _same_shape, (lambda f: lambda xs, a: f(xs[0]))(_fn), _same_rules, _elementwise_flops))

ACTIVATIONS: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    ACT_NONE: lambda x: x,
    ACT_SIGMOID: _sigmoid,
    ACT_RELU: _relu,
    ACT_TANH: np.tanh,
}


# ---------------------------------------------------------------------------------------------------------------
# MatMul: equal ranks >= 2 (the IR builder reshapes 1-D operands and pads ranks); batch dims broadcast.


def _matmul_shape(shapes: Sequence[Shape], _: Attrs) -> Shape:
    a, b = shapes
    _check(len(a) == len(b) and len(a) >= 2, f"matmul needs equal ranks >= 2, got {a} and {b}")
    _check(a[-1] == b[-2], f"matmul inner dims differ: {a} @ {b}")
    batch = _broadcast_shape((a[:-2], b[:-2]), {})
    return (*batch, a[-2], b[-1])


def _matmul_rules(op: OpDef) -> list[str]:
    out = []
    for r in range(2, MAX_RANK + 1):
        query = [f"(= (vec-length s0) {r})", f"(= (vec-length s1) {r})", f"(= {_dim('s0', r - 1)} {_dim('s1', r - 2)})"]
        dims = []
        for i in range(r - 2):
            a, b = _dim("s0", i), _dim("s1", i)
            query.append(f"(= 0 (* (- (min {a} {b}) 1) (- {a} {b})))")
            dims.append(f"(max {a} {b})")
        dims += [_dim("s0", r - 2), _dim("s1", r - 1)]
        out.append(_rule(op, query, _vec(dims)))
    return out


def _matmul_flops(shapes: Sequence[Shape], out: Shape, _: Attrs) -> float:
    return 2.0 * _numel(out) * shapes[0][-1]


MATMUL = register(OpDef("matmul", "MatMul", 2, (), _matmul_shape, lambda xs, a: np.matmul(xs[0], xs[1]), _matmul_rules, _matmul_flops))


# ---------------------------------------------------------------------------------------------------------------
# Conv 2-D with bias and fused activation. Inputs: x (N,C,H,W), w (M, C/group, KH, KW), b (M,).
# pads = (top, left, bottom, right) as in ONNX's (begin..., end...) order for 2-D.


def _window_out(size: int, k: int, stride: int, pad_begin: int, pad_end: int, dilation: int = 1) -> int:
    return (size + pad_begin + pad_end - (dilation * (k - 1) + 1)) // stride + 1


def _check_window(op: str, attrs: Attrs) -> None:
    """Strides and dilations positive, pads non-negative (ONNX's rules; numpy and onnxruntime assume them)."""
    _check(len(attrs["strides"]) == 2 and min(attrs["strides"]) >= 1, f"{op} strides {attrs['strides']} invalid")
    _check(len(attrs["pads"]) == 4 and min(attrs["pads"]) >= 0, f"{op} pads {attrs['pads']} invalid")
    if "dilations" in attrs:
        _check(len(attrs["dilations"]) == 2 and min(attrs["dilations"]) >= 1,
               f"{op} dilations {attrs['dilations']} invalid")
    if "kernel" in attrs:
        _check(len(attrs["kernel"]) == 2 and min(attrs["kernel"]) >= 1, f"{op} kernel {attrs['kernel']} invalid")


def _conv_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, w, b = shapes
    _check(len(x) == 4 and len(w) == 4, f"conv2d needs 4-D input and weight, got {x} and {w}")
    group = attrs["group"]
    _check(group >= 1 and x[1] == w[1] * group, f"conv2d channels {x[1]} != {w[1]} x group {group}")
    _check(w[0] % group == 0, f"conv2d out channels {w[0]} not divisible by group {group}")
    _check(tuple(b) == (w[0],), f"conv2d bias shape {b} != ({w[0]},)")
    _check_window("conv2d", attrs)
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = attrs["strides"], attrs["pads"], attrs["dilations"]
    oh = _window_out(x[2], w[2], sh, pt, pb, dh)
    ow = _window_out(x[3], w[3], sw, pl, pr, dw)
    _check(oh >= 1 and ow >= 1, f"conv2d kernel {w[2:]} larger than padded input {x[2:]}")
    _check(attrs["act"] in ACT_NAMES, f"conv2d activation code {attrs['act']} unknown")
    return (x[0], w[0], oh, ow)


def _windows(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]) -> np.ndarray:
    """Sliding windows (N, C, OH, OW, KH, KW) over an already padded NCHW array."""
    kh, kw = kernel
    dh, dw = dilations
    eff = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
    win = sliding_window_view(x, eff, axis=(2, 3))
    return win[:, :, :: strides[0], :: strides[1], ::dh, ::dw]


def conv2d_reference(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, strides: Sequence[int], pads: Sequence[int],
    dilations: Sequence[int], group: int, act: int = ACT_NONE,
) -> np.ndarray:
    """Numpy 2-D convolution with ONNX semantics (grouped, dilated, padded), bias and fused activation."""
    pt, pl, pb, pr = pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    win = _windows(xp, w.shape[2:], strides, dilations)
    n, c, oh, ow, kh, kw = win.shape
    m, cg = w.shape[0], w.shape[1]
    win = win.reshape(n, group, cg, oh, ow, kh, kw)
    wg = w.reshape(group, m // group, cg, kh, kw)
    out = np.einsum("ngchwij,gmcij->ngmhw", win, wg, optimize=True).reshape(n, m, oh, ow)
    out = out + b.reshape(1, m, 1, 1)
    return ACTIVATIONS[act](out).astype(np.result_type(x, w), copy=False)


def _conv_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    return conv2d_reference(xs[0], xs[1], xs[2], a["strides"], a["pads"], a["dilations"], a["group"], a["act"])


def _conv_rules(op: OpDef) -> list[str]:
    s0, s1 = "s0", "s1"
    oh = (f"(+ (/ (- (+ {_dim(s0, 2)} (+ (vec-get pads 0) (vec-get pads 2))) (+ (* (vec-get dilations 0) "
          f"(- {_dim(s1, 2)} 1)) 1)) (vec-get strides 0)) 1)")
    ow = (f"(+ (/ (- (+ {_dim(s0, 3)} (+ (vec-get pads 1) (vec-get pads 3))) (+ (* (vec-get dilations 1) "
          f"(- {_dim(s1, 3)} 1)) 1)) (vec-get strides 1)) 1)")
    query = [
        "(= (vec-length s0) 4)", "(= (vec-length s1) 4)",
        f"(= {_dim(s0, 1)} (* {_dim(s1, 1)} group))",
        f"(= 0 (% {_dim(s1, 0)} group))",
        f"(= s2 (vec-of {_dim(s1, 0)}))",
    ]
    return [_rule(op, query, _vec([_dim(s0, 0), _dim(s1, 0), oh, ow]))]


def _conv_flops(shapes: Sequence[Shape], out: Shape, a: Attrs) -> float:
    w = shapes[1]
    return 2.0 * _numel(out) * w[1] * w[2] * w[3]


CONV2D = register(
    OpDef(
        "conv2d", "Conv2d", 3,
        (("strides", "ints"), ("pads", "ints"), ("dilations", "ints"), ("group", "int"), ("act", "int")),
        _conv_shape, _conv_eval, _conv_rules, _conv_flops,
    )
)


# ---------------------------------------------------------------------------------------------------------------
# Pooling


def _pool_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x = shapes[0]
    _check(len(x) == 4, f"pooling needs a 4-D input, got {x}")
    _check_window("pooling", attrs)
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = attrs["kernel"], attrs["strides"], attrs["pads"]
    _check(pt < kh and pb < kh and pl < kw and pr < kw, f"pooling pads {attrs['pads']} not smaller than kernel")
    oh, ow = _window_out(x[2], kh, sh, pt, pb), _window_out(x[3], kw, sw, pl, pr)
    _check(oh >= 1 and ow >= 1, f"pooling kernel {attrs['kernel']} larger than padded input {x[2:]}")
    return (x[0], x[1], oh, ow)


def _pool_rules(op: OpDef) -> list[str]:
    oh = (f"(+ (/ (- (+ {_dim('s0', 2)} (+ (vec-get pads 0) (vec-get pads 2))) (vec-get kernel 0)) "
          f"(vec-get strides 0)) 1)")
    ow = (f"(+ (/ (- (+ {_dim('s0', 3)} (+ (vec-get pads 1) (vec-get pads 3))) (vec-get kernel 1)) "
          f"(vec-get strides 1)) 1)")
    return [_rule(op, ["(= (vec-length s0) 4)"], _vec([_dim("s0", 0), _dim("s0", 1), oh, ow]))]


def _pool(x: np.ndarray, attrs: Attrs, kind: str) -> np.ndarray:
    pt, pl, pb, pr = attrs["pads"]
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
    win = _windows(xp, attrs["kernel"], attrs["strides"], (1, 1))
    if kind == "max":
        return win.max(axis=(-2, -1)).astype(x.dtype, copy=False)
    total = win.sum(axis=(-2, -1))
    if attrs["count_include_pad"]:
        count = float(attrs["kernel"][0] * attrs["kernel"][1])
    else:
        ones = np.pad(np.ones((1, 1) + x.shape[2:], dtype=x.dtype), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
        count = _windows(ones, attrs["kernel"], attrs["strides"], (1, 1)).sum(axis=(-2, -1))
    return (total / count).astype(x.dtype, copy=False)


def _pool_flops(shapes: Sequence[Shape], out: Shape, a: Attrs) -> float:
    return float(_numel(out) * a["kernel"][0] * a["kernel"][1])


_POOL_ATTRS = (("kernel", "ints"), ("strides", "ints"), ("pads", "ints"))
MAXPOOL = register(OpDef("maxpool", "MaxPool", 1, _POOL_ATTRS, _pool_shape, lambda xs, a: _pool(xs[0], a, "max"), _pool_rules, _pool_flops))
AVGPOOL = register(
    OpDef("avgpool", "AvgPool", 1, _POOL_ATTRS + (("count_include_pad", "int"),), _pool_shape,
          lambda xs, a: _pool(xs[0], a, "avg"), _pool_rules, _pool_flops)
)


def _gap_shape(shapes: Sequence[Shape], _: Attrs) -> Shape:
    x = shapes[0]
    _check(len(x) >= 3, f"global average pool needs rank >= 3, got {x}")
    return (x[0], x[1]) + (1,) * (len(x) - 2)


def _gap_rules(op: OpDef) -> list[str]:
    return [_rule(op, ["(= (vec-length s0) 4)"], _vec([_dim("s0", 0), _dim("s0", 1), "1", "1"]))]


GLOBALAVGPOOL = register(
    OpDef("globalavgpool", "GlobalAvgPool", 1, (), _gap_shape,
          lambda xs, a: xs[0].mean(axis=tuple(range(2, xs[0].ndim)), keepdims=True), _gap_rules,
          lambda s, o, a: float(_numel(s[0])))
)


# ---------------------------------------------------------------------------------------------------------------
# Concat (binary; N-ary ONNX Concat becomes a left-nested chain) and Slice (one axis, explicit start and size).


def _concat_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    a, b = shapes
    ax = attrs["axis"]
    _check(len(a) == len(b) and 0 <= ax < len(a), f"concat axis {ax} invalid for {a} and {b}")
    _check(a[:ax] + a[ax + 1:] == b[:ax] + b[ax + 1:], f"concat on axis {ax}: non-axis dims differ, {a} vs {b}")
    return a[:ax] + (a[ax] + b[ax],) + a[ax + 1:]


def _concat_rules(op: OpDef) -> list[str]:
    query = ["(< -1 axis)", "(< axis (vec-length s0))", "(= (vec-set s0 axis 0) (vec-set s1 axis 0))"]
    return [_rule(op, query, "(vec-set s0 axis (+ (vec-get s0 axis) (vec-get s1 axis)))")]


CONCAT = register(
    OpDef("concat", "Concat", 2, (("axis", "int"),), _concat_shape,
          lambda xs, a: np.concatenate(xs, axis=a["axis"]), _concat_rules, lambda s, o, a: 0.0)
)


def _slice_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x = shapes[0]
    ax, start, size = attrs["axis"], attrs["start"], attrs["size"]
    _check(0 <= ax < len(x), f"slice axis {ax} invalid for {x}")
    _check(0 <= start and size >= 1 and start + size <= x[ax], f"slice [{start}, {start + size}) outside dim {x[ax]}")
    return x[:ax] + (size,) + x[ax + 1:]


def _slice_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    index = [slice(None)] * xs[0].ndim
    index[a["axis"]] = slice(a["start"], a["start"] + a["size"])
    return xs[0][tuple(index)]


def _slice_rules(op: OpDef) -> list[str]:
    query = ["(< -1 axis)", "(< axis (vec-length s0))", "(< -1 start)", "(< 0 size)",
             "(< (+ start size) (+ (vec-get s0 axis) 1))"]
    return [_rule(op, query, "(vec-set s0 axis size)")]


SLICE = register(
    OpDef("slice", "Slice", 1, (("axis", "int"), ("start", "int"), ("size", "int")), _slice_shape, _slice_eval,
          _slice_rules, lambda s, o, a: 0.0)
)


# ---------------------------------------------------------------------------------------------------------------
# Transpose and Reshape


def _transpose_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, perm = shapes[0], tuple(attrs["perm"])
    _check(sorted(perm) == list(range(len(x))), f"transpose perm {perm} invalid for rank {len(x)}")
    return tuple(x[p] for p in perm)


def _transpose_rules(op: OpDef) -> list[str]:
    out = []
    for r in range(1, MAX_RANK + 1):
        dims = [_dim("s0", _dim("perm", i)) for i in range(r)]
        out.append(_rule(op, [f"(= (vec-length s0) {r})", f"(= (vec-length perm) {r})"], _vec(dims)))
    return out


TRANSPOSE = register(
    OpDef("transpose", "Transpose", 1, (("perm", "ints"),), _transpose_shape,
          lambda xs, a: np.transpose(xs[0], a["perm"]), _transpose_rules, lambda s, o, a: 0.0)
)


def _reshape_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, target = shapes[0], tuple(attrs["shape"])
    _check(all(d >= 1 for d in target) and _numel(target) == _numel(x), f"cannot reshape {x} to {target}")
    return target


def _product(vec: str, r: int) -> str:
    expr = "1"
    for i in range(r):
        expr = f"(* {expr} {_dim(vec, i)})"
    return expr


def _reshape_rules(op: OpDef) -> list[str]:
    out = []
    for r in range(0, MAX_RANK + 1):
        for q in range(0, MAX_RANK + 1):
            query = [f"(= (vec-length s0) {r})", f"(= (vec-length shape) {q})", f"(= {_product('s0', r)} {_product('shape', q)})"]
            out.append(_rule(op, query, "shape"))
    return out


RESHAPE = register(
    OpDef("reshape", "Reshape", 1, (("shape", "ints"),), _reshape_shape,
          lambda xs, a: xs[0].reshape(a["shape"]), _reshape_rules, lambda s, o, a: 0.0)
)


# ---------------------------------------------------------------------------------------------------------------
# BatchNormalization (inference): inputs x, scale, bias, mean, var, each of the latter (C,).


def _bn_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x = shapes[0]
    _check(len(x) >= 2, f"batchnorm needs rank >= 2, got {x}")
    for s in shapes[1:]:
        _check(tuple(s) == (x[1],), f"batchnorm parameter shape {s} != ({x[1]},)")
    return tuple(x)


def _bn_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    x, scale, bias, mean, var = xs
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / np.sqrt(var + a["epsilon"])
    return (x * inv.reshape(shape) + (bias - mean * inv).reshape(shape)).astype(x.dtype, copy=False)


def _bn_rules(op: OpDef) -> list[str]:
    return [_rule(op, ["(= s1 (vec-of (vec-get s0 1)))"], "s0")]


BATCHNORM = register(
    OpDef("batchnorm", "BatchNorm", 5, (("epsilon", "float"),), _bn_shape, _bn_eval, _bn_rules,
          lambda s, o, a: 2.0 * _numel(o))
)


# ---------------------------------------------------------------------------------------------------------------
# Weight transforms the rewrite rules build (weight-only in practice, so the exporter folds them into constants).
#
# rsqrt(x; epsilon) = 1 / sqrt(x + epsilon): the batchnorm scale, for folding batchnorm into a conv.
# enlarge(w; kernel): zero-pad a conv kernel (M, C, kh, kw) spatially, centred, to `kernel`; a conv whose pads grow
#   by half the added size (times the dilation) computes the same output.
# merge(w; group, count): the weight of a grouped conv with `group` groups, rewritten for group / count groups: each
#   output channel's kernel moves to its group's slot in a count-times wider input-channel axis, zeros elsewhere.


def _rsqrt_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    return 1.0 / np.sqrt(xs[0] + a["epsilon"])


RSQRT = register(
    OpDef("rsqrt", "RSqrt", 1, (("epsilon", "float"),), _same_shape, _rsqrt_eval, _same_rules, _elementwise_flops)
)


def _enlarge_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    w, kernel = shapes[0], tuple(attrs["kernel"])
    _check(len(w) == 4 and len(kernel) == 2, f"enlarge needs a 4-D kernel and a 2-D size, got {w} and {kernel}")
    for have, want in zip(w[2:], kernel):
        _check(have <= want and (want - have) % 2 == 0, f"cannot enlarge kernel {w[2:]} to {kernel} centred")
    return (w[0], w[1], kernel[0], kernel[1])


def _enlarge_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    w = xs[0]
    ph, pw = (a["kernel"][0] - w.shape[2]) // 2, (a["kernel"][1] - w.shape[3]) // 2
    return np.pad(w, ((0, 0), (0, 0), (ph, ph), (pw, pw)))


def _enlarge_rules(op: OpDef) -> list[str]:
    query = ["(= (vec-length s0) 4)", "(= (vec-length kernel) 2)"]
    for i in (0, 1):
        have, want = _dim("s0", i + 2), _dim("kernel", i)
        query += [f"(<= {have} {want})", f"(= 0 (% (- {want} {have}) 2))"]
    return [_rule(op, query, _vec([_dim("s0", 0), _dim("s0", 1), _dim("kernel", 0), _dim("kernel", 1)]))]


ENLARGE = register(
    OpDef("enlarge", "Enlarge", 1, (("kernel", "ints"),), _enlarge_shape, _enlarge_eval, _enlarge_rules,
          lambda s, o, a: 0.0)
)


def _merge_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    w, group, count = shapes[0], attrs["group"], attrs["count"]
    _check(len(w) == 4, f"merge needs a 4-D conv weight, got {w}")
    _check(group >= 1 and count >= 1 and group % count == 0, f"merge count {count} does not divide group {group}")
    _check(w[0] % group == 0, f"merge: {w[0]} output channels not divisible by group {group}")
    return (w[0], w[1] * count, w[2], w[3])


def merge_mask(shape: Shape, group: int, count: int) -> np.ndarray:
    """Which entries of merge's output (M, C*count, 1, 1) hold the kernel rather than zero."""
    m, c = shape[0], shape[1] // count
    slot = (np.arange(m) // (m // group)) % count
    mask = (np.arange(shape[1])[None, :] // c) == slot[:, None]
    return mask.reshape(m, shape[1], 1, 1)


def _merge_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    w = xs[0]
    tiled = np.tile(w, (1, a["count"], 1, 1))
    return np.where(merge_mask(tiled.shape, a["group"], a["count"]), tiled, np.zeros((), dtype=w.dtype))


def _merge_rules(op: OpDef) -> list[str]:
    query = ["(= (vec-length s0) 4)", "(< 0 count)", "(< 0 group)", "(= 0 (% group count))",
             f"(= 0 (% {_dim('s0', 0)} group))"]
    return [_rule(op, query, _vec([_dim("s0", 0), f"(* {_dim('s0', 1)} count)", _dim("s0", 2), _dim("s0", 3)]))]


MERGE = register(
    OpDef("merge", "Merge", 1, (("group", "int"), ("count", "int")), _merge_shape, _merge_eval, _merge_rules,
          lambda s, o, a: 0.0)
)


# ---------------------------------------------------------------------------------------------------------------
# Opaque: any other ONNX op, kept verbatim. `key` names the ONNX node spec in the graph's opaque table; `index` is
# which of its outputs this tensor is; `shape` and `dtype` come from ONNX shape inference.


def _opaque_rules(op: OpDef) -> list[str]:
    return [f"(rule ({_match(op)}) ((set (shape-of e) shape)) :ruleset shapes)"]


OPAQUE = register(
    OpDef("opaque", "Opaque", None, (("key", "str"), ("index", "int"), ("shape", "ints"), ("dtype", "str")),
          _leaf_shape, None, _opaque_rules, lambda s, o, a: float(_numel(o)))
)


def shape_of(op: str, in_shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    """Output shape of `op` on inputs of `in_shapes`; raises ShapeError if ill-typed."""
    d = get(op)
    if d.inputs is not None:
        _check(len(in_shapes) == d.inputs, f"{op} takes {d.inputs} inputs, got {len(in_shapes)}")
    return tuple(int(v) for v in d.shape([tuple(s) for s in in_shapes], attrs))


def evaluate(op: str, arrays: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    """Numpy reference semantics of `op`."""
    d = get(op)
    if d.evaluate is None:
        raise ValueError(f"{op} has no numpy semantics")
    return np.asarray(d.evaluate(arrays, attrs))


def egg_declarations() -> str:
    """egglog declarations of the tensor sort, shapes and every constructor."""
    lines = ["(sort IVec (Vec i64))", "(sort T)", "(sort TVec (Vec T))"]
    lines += [op.egg_decl() for op in REGISTRY.values()]
    lines += ["(function shape-of (T) IVec :no-merge)", "(ruleset shapes)"]
    return "\n".join(lines)


def egg_shape_rules(names: Iterable[str] | None = None) -> list[str]:
    """The egglog shape rules of the ops called `names` (default: every op)."""
    wanted = None if names is None else set(names)
    return [rule for name, op in REGISTRY.items() if wanted is None or name in wanted for rule in op.egg_shape_rules(op)]
