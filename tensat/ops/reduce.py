"""Reductions and normalizations: ReduceMean, ReduceSum, ReduceMax and ONNX's other reductions over a set of axes,
and LayerNormalization.

Axes are held non-negative and sorted (the importer normalizes ONNX's); `keepdims` 1 keeps each reduced axis as a
dim of 1, 0 drops it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tensat.ops.elementwise import numeric
from tensat.ops.registry import (
    MAX_RANK,
    SAME,
    Attrs,
    Dims,
    Equations,
    OpDef,
    Shape,
    check,
    egg_dim,
    egg_rule,
    not_instantiated,
    numel,
    register,
)


def _reduce_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, axes = shapes[0], tuple(attrs["axes"])
    check(
        bool(axes) and list(axes) == sorted(set(axes)) and all(0 <= a < len(x) for a in axes),
        f"reduction axes {axes} invalid for {x}",
    )
    if attrs["keepdims"]:
        return tuple(1 if i in axes else d for i, d in enumerate(x))
    return tuple(d for i, d in enumerate(x) if i not in axes)


def _reduce_rules(op: OpDef) -> list[str]:
    """For each count of axes: the axes in range and increasing; each reduced dim set to 1 (keepdims) or removed,
    the last first so that the earlier indices still hold."""
    out = []
    for k in range(1, MAX_RANK + 1):
        axes = [egg_dim("axes", i) for i in range(k)]
        query = [f"(= (vec-length axes) {k})", f"(< -1 {axes[0]})", f"(< {axes[-1]} (vec-length s0))"]
        query += [f"(< {a} {b})" for a, b in itertools.pairwise(axes)]
        kept, dropped = "s0", "s0"
        for a in axes:
            kept = f"(vec-set {kept} {a} 1)"
        for a in reversed(axes):
            dropped = f"(vec-remove {dropped} {a})"
        out.append(egg_rule(op, [*query, "(= keepdims 1)"], kept))
        out.append(egg_rule(op, [*query, "(= keepdims 0)"], dropped))
    return out


def _reduce_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    axes, keep = at["axes"], at["keepdims"]
    x = ins[0]
    if not isinstance(axes, tuple) or not axes or any(not 0 <= a < len(x) for a in axes):
        s.reject("reduction axes")
    kept = [1 if i in axes else d for i, d in enumerate(x)] if keep else [d for i, d in enumerate(x) if i not in axes]
    if len(kept) != len(out):
        s.reject("reduction rank")
    s.eq(out, tuple(kept))


def _reduce_ranks(rank: int) -> list[tuple[int, ...]]:
    """The axes a reduction over a tensor of `rank` is verified with: each single axis, and all of them."""
    return [(a,) for a in range(rank)] + ([tuple(range(rank))] if rank > 1 else [])


# the reductions over a set of axes, by name (`_reduction`): read and written alike by the ONNX layer
REDUCTIONS: list[str] = []


def _reduction(name: str, egg: str, onnx: str, fn: Any, enumerated_by_default: bool = False) -> OpDef:
    def evaluate(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
        x = xs[0]
        return np.asarray(fn(x, axis=tuple(a["axes"]), keepdims=bool(a["keepdims"]))).astype(x.dtype, copy=False)

    REDUCTIONS.append(name)
    return OpDef(
        name,
        egg,
        1,
        (("axes", "ints"), ("keepdims", "int")),
        _reduce_shape,
        evaluate,
        _reduce_rules,
        lambda s, o, a: float(numel(s[0])),
        onnx=onnx,
        equations=_reduce_equations,
        # the output rank depends on keepdims: the verifier takes the input's rank from the output's for keepdims 1
        domains={"axes": _reduce_ranks, "keepdims": [1]},
        breaks_layout=True,
        enumerated_by_default=enumerated_by_default,
    )


REDUCE_MEAN = register(_reduction("reducemean", "ReduceMean", "ReduceMean", np.mean, enumerated_by_default=True))
REDUCE_SUM = register(_reduction("reducesum", "ReduceSum", "ReduceSum", np.sum, enumerated_by_default=True))
REDUCE_MAX = register(_reduction("reducemax", "ReduceMax", "ReduceMax", np.max))
REDUCE_MIN = register(_reduction("reducemin", "ReduceMin", "ReduceMin", np.min))
REDUCE_PROD = register(_reduction("reduceprod", "ReduceProd", "ReduceProd", np.prod))


def _l1(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.sum(np.abs(x), axis=axis, keepdims=keepdims)


def _l2(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims))


def _sum_square(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.sum(x * x, axis=axis, keepdims=keepdims)


def _log_sum_exp(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    top = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True)) + top
    return out if keepdims else np.squeeze(out, axis=axis)


REDUCE_L1 = register(_reduction("reducel1", "ReduceL1", "ReduceL1", _l1))
REDUCE_L2 = register(_reduction("reducel2", "ReduceL2", "ReduceL2", _l2))
REDUCE_SUM_SQUARE = register(_reduction("reducesumsquare", "ReduceSumSquare", "ReduceSumSquare", _sum_square))
REDUCE_LOG_SUM_EXP = register(_reduction("reducelogsumexp", "ReduceLogSumExp", "ReduceLogSumExp", _log_sum_exp))


def _as_reduction(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """An arg reduction's attributes as those of the reduction over its one axis, whose shape it has."""
    return {"axes": (attrs["axis"],), "keepdims": attrs["keepdims"]}


def _arg_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    return _reduce_shape(shapes, _as_reduction(attrs))


def _arg_rules(op: OpDef) -> list[str]:
    query = ["(< -1 axis)", "(< axis (vec-length s0))"]
    return [
        egg_rule(op, [*query, "(= keepdims 1)"], "(vec-set s0 axis 1)"),
        egg_rule(op, [*query, "(= keepdims 0)"], "(vec-remove s0 axis)"),
    ]


def _arg_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    if not isinstance(at["axis"], int):
        s.reject("arg reduction axis")
    _reduce_equations(s, out, ins, _as_reduction(at))


def _arg_reduction(name: str, egg: str, onnx: str, fn: Any) -> OpDef:
    """ONNX ArgMax or ArgMin along one axis: the int64 index of the first extreme (the last, with
    `select_last_index`)."""

    def evaluate(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
        x, axis = xs[0], a["axis"]
        if a["select_last_index"]:
            index = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            index = fn(x, axis=axis)
        index = np.asarray(index, dtype=np.int64)
        return np.expand_dims(index, axis) if a["keepdims"] else index

    return OpDef(
        name,
        egg,
        1,
        (("axis", "int"), ("keepdims", "int"), ("select_last_index", "int")),
        _arg_shape,
        evaluate,
        _arg_rules,
        lambda s, o, a: float(numel(s[0])),
        onnx=onnx,
        dtype=lambda dtypes, a: "int64",
        accepts=numeric,
        equations=_arg_equations,
        # the output rank depends on keepdims: the verifier takes the input's rank from the output's for keepdims 1
        domains={"axis": lambda rank: list(range(rank)), "keepdims": [1], "select_last_index": [0, 1]},
        exhaustive=("axis", "select_last_index"),
        int_exact=True,
        breaks_layout=True,
        enumerated_by_default=False,
    )


# the index of a maximum or minimum along an axis (a classifier's label, a greedy decoder's next token)
ARG_MAX = register(_arg_reduction("argmax", "ArgMax", "ArgMax", np.argmax))
ARG_MIN = register(_arg_reduction("argmin", "ArgMin", "ArgMin", np.argmin))


def _topk_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, axis, k = shapes[0], attrs["axis"], attrs["k"]
    check(0 <= axis < len(x) and 0 < k <= x[axis], f"topk of {k} along axis {axis} of {x}")
    check(attrs["output"] in (0, 1) and attrs["largest"] in (0, 1), f"topk output {attrs['output']}")
    return tuple(x[:axis]) + (k,) + tuple(x[axis + 1 :])


def _topk_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    x, axis = xs[0], a["axis"]
    key = x if not a["largest"] else (-x if x.dtype.kind == "f" else ~x)  # ~x reverses integers without overflow
    index = np.take(np.argsort(key, axis=axis, kind="stable"), np.arange(a["k"]), axis=axis)
    return index.astype(np.int64) if a["output"] else np.take_along_axis(x, index, axis=axis)


def _topk_rules(op: OpDef) -> list[str]:
    query = ["(< -1 axis)", "(< axis (vec-length s0))", "(< 0 k)", "(< k (+ (vec-get s0 axis) 1))"]
    return [egg_rule(op, query, "(vec-set s0 axis k)")]


# ONNX TopK, sorted: the k largest (or smallest) elements along an axis, output 0, or their int64 indices, output 1
# (an expert router's choice); ties go to the lower index, as onnxruntime orders them. The two outputs are two ops
# of one kernel: the exporter writes them as one TopK, and the cost model prices that kernel once
# (`tensat.cost.runtime_fusions`)
TOP_K = register(
    OpDef(
        "topk",
        "TopK",
        1,
        (("axis", "int"), ("k", "int"), ("largest", "int"), ("output", "int")),
        _topk_shape,
        _topk_eval,
        _topk_rules,
        lambda s, o, a: float(numel(s[0])),
        onnx="TopK",
        dtype=lambda dtypes, a: "int64" if a["output"] else dtypes[0],
        accepts=numeric,
        equations=not_instantiated,
        domains={"axis": lambda rank: list(range(rank)), "k": [1], "largest": [0, 1], "output": [0, 1]},
        int_exact=True,
        breaks_layout=True,
        enumerated_by_default=False,
    )
)


def topk_kernel(inputs: Sequence[int], attrs: Mapping[str, Any]) -> tuple[int, ...]:
    """What tells one TopK kernel from another, for the `topk` ops of its two outputs: its input, axis, k and
    direction (the exporter writes the ops of one as one node, and the cost model prices it once)."""
    return (inputs[0], attrs["axis"], attrs["k"], attrs["largest"])


def axes_input_since(op: str) -> int:
    """The first opset at which ONNX gives reduction `op` its axes as an input, not an attribute (ReduceSum's
    came before the others')."""
    return 13 if op == "reducesum" else 18


def layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, axis: int, epsilon: float) -> np.ndarray:
    """ONNX LayerNormalization: x normalized over its dims from `axis` on, then scaled and shifted."""
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=axes, keepdims=True)
    return (centred / np.sqrt(var + epsilon) * scale + bias).astype(x.dtype, copy=False)


def _ln_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, scale, bias = shapes
    axis = attrs["axis"]
    check(0 <= axis < len(x), f"layer normalization axis {axis} invalid for {x}")
    check(
        tuple(scale) == x[axis:] and tuple(bias) == x[axis:],
        f"layer normalization of {x} from axis {axis} needs scale and bias of {x[axis:]}, got {scale} and {bias}",
    )
    return tuple(x)


def _ln_rules(op: OpDef) -> list[str]:
    query = ["(< -1 axis)", "(< axis (vec-length s0))", "(= (vec-length s1) (- (vec-length s0) axis))", "(= s1 s2)"]
    return [egg_rule(op, query, "s0")]


def _ln_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    x, scale, bias = ins
    axis = at["axis"]
    if not isinstance(axis, int) or not 0 <= axis < len(x) or len(scale) != len(x) - axis:
        s.reject("layer normalization axis")
    s.eq(out, x)
    s.eq(scale, tuple(x[axis:]))
    s.eq(bias, tuple(x[axis:]))


# LayerNormalization's first output (x, scale, bias over the dims from `axis` on; a missing bias is a zero constant)
LAYER_NORM = register(
    OpDef(
        "layernorm",
        "LayerNorm",
        3,
        (("axis", "int"), ("epsilon", "float")),
        _ln_shape,
        lambda xs, a: layer_norm(xs[0], xs[1], xs[2], a["axis"], a["epsilon"]),
        _ln_rules,
        lambda s, o, a: 8.0 * numel(o),
        onnx="LayerNormalization",
        standard_since=17,
        ranks=(SAME, SAME, None, None),
        equations=_ln_equations,
        domains={"axis": lambda rank: [rank - 1, max(rank - 2, 0)], "epsilon": [1e-5, 0.25]},
        breaks_layout=True,
    )
)


def instance_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, epsilon: float) -> np.ndarray:
    """ONNX InstanceNormalization: each (sample, channel) normalized over its spatial dims, then scaled and shifted
    per channel."""
    axes = tuple(range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=axes, keepdims=True)
    per_channel = (1, -1) + (1,) * (x.ndim - 2)
    return (centred / np.sqrt(var + epsilon) * scale.reshape(per_channel) + bias.reshape(per_channel)).astype(
        x.dtype, copy=False
    )


def _in_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, scale, bias = shapes
    check(len(x) >= 3, f"instance normalization needs a rank of 3 or more, got {x}")
    check(tuple(scale) == (x[1],) and tuple(bias) == (x[1],), f"instance normalization of {x} by {scale}, {bias}")
    return tuple(x)


def _in_rules(op: OpDef) -> list[str]:
    query = ["(< 2 (vec-length s0))", "(= s1 (vec-of (vec-get s0 1)))", "(= s2 s1)"]
    return [egg_rule(op, query, "s0")]


def _in_equations(s: Equations, out: Dims, ins: Sequence[Dims], _: Mapping[str, Any]) -> None:
    x, scale, bias = ins
    s.eq(out, x)
    s.eq(scale, (x[1],))
    s.eq(bias, (x[1],))


# InstanceNormalization (as exporters write GroupNorm: the groups reshaped into channels, then scaled per channel)
INSTANCE_NORM = register(
    OpDef(
        "instancenorm",
        "InstanceNorm",
        3,
        (("epsilon", "float"),),
        _in_shape,
        lambda xs, a: instance_norm(xs[0], xs[1], xs[2], a["epsilon"]),
        _in_rules,
        lambda s, o, a: 8.0 * numel(o),
        onnx="InstanceNormalization",
        ranks=(SAME, SAME, 1, 1),
        min_rank=3,
        equations=_in_equations,
        domains={"epsilon": [1e-5, 0.25]},
        breaks_layout=True,
    )
)
