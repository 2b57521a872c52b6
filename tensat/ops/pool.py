"""Pooling: max and average over 2-D and 3-D windows (pads as ONNX's: the beginnings, then the ends), and global
average pooling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tensat.ops.conv import check_window, spatial_padded, window_out, windows
from tensat.ops.registry import (
    SAME,
    Attrs,
    Dims,
    Domain,
    Equations,
    OpDef,
    Shape,
    check,
    egg_dim,
    egg_rule,
    egg_vec,
    numel,
    register,
)

POOL_RANKS = (4, 5)  # pools over 2 and 3 spatial axes: NCHW, and NCDHW (LRN's window sum as a pool down the channels)


def _pool_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x = shapes[0]
    check(len(x) in POOL_RANKS, f"pooling needs a 4-D or 5-D input, got {x}")
    k = len(x) - 2
    check_window("pooling", attrs, k)
    kernel, strides, pads = attrs["kernel"], attrs["strides"], attrs["pads"]
    check(
        all(pads[i] < kernel[i] and pads[k + i] < kernel[i] for i in range(k)),
        f"pooling pads {pads} not smaller than kernel",
    )
    out = tuple(window_out(x[2 + i], kernel[i], strides[i], pads[i], pads[k + i]) for i in range(k))
    check(min(out) >= 1, f"pooling kernel {kernel} larger than padded input {x[2:]}")
    return (x[0], x[1], *out)


def _pool_rules(op: OpDef) -> list[str]:
    rules = []
    for rank in POOL_RANKS:
        k = rank - 2
        out = [
            f"(+ (/ (- (+ {egg_dim('s0', 2 + i)} (+ (vec-get pads {i}) (vec-get pads {k + i}))) (vec-get kernel {i})) "
            f"(vec-get strides {i})) 1)"
            for i in range(k)
        ]
        shape = egg_vec([egg_dim("s0", 0), egg_dim("s0", 1), *out])
        rules.append(egg_rule(op, [f"(= (vec-length s0) {rank})", f"(= (vec-length kernel) {k})"], shape))
    return rules


def _pool_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    (x,) = ins
    k = len(x) - 2
    s.eq(out[0], x[0])
    s.eq(out[1], x[1])
    s.hint(x[0], 1, 2)
    for j in range(k):
        s.hint(x[2 + j], 3, 8)
        s.eq(
            out[2 + j],
            s.apply(
                lambda size, kernel, st, p, j=j: window_out(size, kernel[j], st[j], p[j], p[k + j]),
                x[2 + j],
                at["kernel"],
                at["strides"],
                at["pads"],
            ),
        )


def _pool(x: np.ndarray, attrs: Attrs, kind: str) -> np.ndarray:
    k = x.ndim - 2
    axes = tuple(range(-k, 0))
    ones = (1,) * k
    xp = spatial_padded(x, attrs["pads"], -np.inf if kind == "max" else 0.0)
    win = windows(xp, attrs["kernel"], attrs["strides"], ones)
    if kind == "max":
        return win.max(axis=axes).astype(x.dtype, copy=False)
    total = win.sum(axis=axes)
    if attrs["count_include_pad"]:
        count = float(np.prod(attrs["kernel"]))
    else:
        padded = spatial_padded(np.ones((1, 1) + x.shape[2:], dtype=x.dtype), attrs["pads"])
        count = windows(padded, attrs["kernel"], attrs["strides"], ones).sum(axis=axes)
    return (total / count).astype(x.dtype, copy=False)


def _pool_flops(shapes: Sequence[Shape], out: Shape, a: Attrs) -> float:
    return float(numel(out) * np.prod(a["kernel"]))


_POOL_ATTRS = (("kernel", "ints"), ("strides", "ints"), ("pads", "ints"))
_POOL_DOMAINS: dict[str, Domain] = {
    "kernel": [(2, 2), (3, 1)],
    "strides": [(1, 1), (2, 2)],
    "pads": [(0, 0, 0, 0), (1, 0, 1, 0)],
}

MAXPOOL = register(
    OpDef(
        "maxpool",
        "MaxPool",
        1,
        _POOL_ATTRS,
        _pool_shape,
        lambda xs, a: _pool(xs[0], a, "max"),
        _pool_rules,
        _pool_flops,
        onnx="MaxPool",
        ranks=(4, 4),
        equations=_pool_equations,
        domains=_POOL_DOMAINS,
        breaks_layout=True,
    )
)
AVGPOOL = register(
    OpDef(
        "avgpool",
        "AvgPool",
        1,
        _POOL_ATTRS + (("count_include_pad", "int"),),
        _pool_shape,
        lambda xs, a: _pool(xs[0], a, "avg"),
        _pool_rules,
        _pool_flops,
        onnx="AveragePool",
        ranks=(None, SAME),
        min_rank=4,
        equations=_pool_equations,
        domains={**_POOL_DOMAINS, "count_include_pad": [0, 1]},
        breaks_layout=True,
    )
)


def _gap_shape(shapes: Sequence[Shape], _: Attrs) -> Shape:
    x = shapes[0]
    check(len(x) >= 3, f"global average pool needs rank >= 3, got {x}")
    return (x[0], x[1]) + (1,) * (len(x) - 2)


def _gap_rules(op: OpDef) -> list[str]:
    return [egg_rule(op, ["(= (vec-length s0) 4)"], egg_vec([egg_dim("s0", 0), egg_dim("s0", 1), "1", "1"]))]


def _gap_equations(s: Equations, out: Dims, ins: Sequence[Dims], _: Mapping[str, Any]) -> None:
    (x,) = ins
    s.eq(out, (x[0], x[1], 1, 1))


GLOBALAVGPOOL = register(
    OpDef(
        "globalavgpool",
        "GlobalAvgPool",
        1,
        (),
        _gap_shape,
        lambda xs, a: xs[0].mean(axis=tuple(range(2, xs[0].ndim)), keepdims=True),
        _gap_rules,
        lambda s, o, a: float(numel(s[0])),
        onnx="GlobalAveragePool",
        ranks=(4, 4),
        equations=_gap_equations,
        breaks_layout=True,
    )
)
