"""Pooling: max and average over 2-D windows (pads as conv2d's), and global average pooling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tensat.ops.conv import check_window, spatial_padded, window_out, windows
from tensat.ops.registry import (
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


def _pool_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x = shapes[0]
    check(len(x) == 4, f"pooling needs a 4-D input, got {x}")
    check_window("pooling", attrs)
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = attrs["kernel"], attrs["strides"], attrs["pads"]
    check(pt < kh and pb < kh and pl < kw and pr < kw, f"pooling pads {attrs['pads']} not smaller than kernel")
    oh, ow = window_out(x[2], kh, sh, pt, pb), window_out(x[3], kw, sw, pl, pr)
    check(oh >= 1 and ow >= 1, f"pooling kernel {attrs['kernel']} larger than padded input {x[2:]}")
    return (x[0], x[1], oh, ow)


def _pool_rules(op: OpDef) -> list[str]:
    oh = (
        f"(+ (/ (- (+ {egg_dim('s0', 2)} (+ (vec-get pads 0) (vec-get pads 2))) (vec-get kernel 0)) "
        f"(vec-get strides 0)) 1)"
    )
    ow = (
        f"(+ (/ (- (+ {egg_dim('s0', 3)} (+ (vec-get pads 1) (vec-get pads 3))) (vec-get kernel 1)) "
        f"(vec-get strides 1)) 1)"
    )
    return [egg_rule(op, ["(= (vec-length s0) 4)"], egg_vec([egg_dim("s0", 0), egg_dim("s0", 1), oh, ow]))]


def _pool_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    (x,) = ins
    s.eq(out[0], x[0])
    s.eq(out[1], x[1])
    s.hint(x[0], 1, 2)
    for i, (lo, hi) in ((2, (0, 2)), (3, (1, 3))):
        j = i - 2
        s.hint(x[i], 3, 8)
        s.eq(
            out[i],
            s.apply(
                lambda size, k, st, p, j=j, lo=lo, hi=hi: window_out(size, k[j], st[j], p[lo], p[hi]),
                x[i],
                at["kernel"],
                at["strides"],
                at["pads"],
            ),
        )


def _pool(x: np.ndarray, attrs: Attrs, kind: str) -> np.ndarray:
    xp = spatial_padded(x, attrs["pads"], -np.inf if kind == "max" else 0.0)
    win = windows(xp, attrs["kernel"], attrs["strides"], (1, 1))
    if kind == "max":
        return win.max(axis=(-2, -1)).astype(x.dtype, copy=False)
    total = win.sum(axis=(-2, -1))
    if attrs["count_include_pad"]:
        count = float(attrs["kernel"][0] * attrs["kernel"][1])
    else:
        ones = spatial_padded(np.ones((1, 1) + x.shape[2:], dtype=x.dtype), attrs["pads"])
        count = windows(ones, attrs["kernel"], attrs["strides"], (1, 1)).sum(axis=(-2, -1))
    return (total / count).astype(x.dtype, copy=False)


def _pool_flops(shapes: Sequence[Shape], out: Shape, a: Attrs) -> float:
    return float(numel(out) * a["kernel"][0] * a["kernel"][1])


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
        ranks=(4, 4),
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
