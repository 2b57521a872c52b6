"""Pooling: max and average over 2-D and 3-D windows (pads as ONNX's: the beginnings, then the ends), global average
and max pooling, and Resize."""

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
    "kernel": [(2, 2), (3, 1), (4, 4)],
    "strides": [(1, 1), (2, 2)],
    "pads": [(0, 0, 0, 0), (1, 0, 1, 0)],
}
# the generator keeps to the kernels under its fingerprint sizes; the verifier's (4, 4) is there for windows that
# cover their input (a pool that is one window over it, its global pool)
_POOL_GENERATED: dict[str, Domain] = {"kernel": [(2, 2), (3, 1)]}

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
        generated=_POOL_GENERATED,
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
        generated=_POOL_GENERATED,
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


def _global_pool(name: str, egg: str, onnx: str, fn: Any, enumerated_by_default: bool = True) -> OpDef:
    """A pool over the whole height and width of an NCHW tensor, computing `fn` (numpy's mean, max) over them."""
    return OpDef(
        name,
        egg,
        1,
        (),
        _gap_shape,
        lambda xs, a: fn(xs[0], axis=tuple(range(2, xs[0].ndim)), keepdims=True),
        _gap_rules,
        lambda s, o, a: float(numel(s[0])),
        onnx=onnx,
        ranks=(4, 4),
        equations=_gap_equations,
        breaks_layout=True,
        enumerated_by_default=enumerated_by_default,
    )


GLOBALAVGPOOL = register(_global_pool("globalavgpool", "GlobalAvgPool", "GlobalAveragePool", np.mean))
GLOBALMAXPOOL = register(
    _global_pool("globalmaxpool", "GlobalMaxPool", "GlobalMaxPool", np.max, enumerated_by_default=False)
)


# ONNX Resize's coordinate transformations and nearest-pixel roundings tensat models, by the op's codes
RESIZE_TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
RESIZE_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
RESIZE_MODES = ("nearest", "linear")


def _source_coordinates(out: int, size: int, transform: str) -> np.ndarray:
    """Where each output pixel of one axis samples the input (ONNX Resize), the scale that of the sizes, out / size."""
    o = np.arange(out, dtype=np.float64)
    scale = out / size
    if transform == "align_corners":
        return o * (size - 1) / (out - 1) if out > 1 else np.zeros(out)
    if transform == "asymmetric":
        return o / scale
    if transform == "pytorch_half_pixel" and out == 1:
        return np.zeros(out)
    return (o + 0.5) / scale - 0.5


def _nearest_index(x: np.ndarray, rounding: str, size: int) -> np.ndarray:
    picked = {
        "round_prefer_floor": np.ceil(x - 0.5),
        "round_prefer_ceil": np.floor(x + 0.5),
        "floor": np.floor(x),
        "ceil": np.ceil(x),
    }[rounding]
    return np.clip(picked, 0, size - 1).astype(np.int64)


def resize_reference(x: np.ndarray, size: Sequence[int], mode: int, transform: int, nearest: int) -> np.ndarray:
    """ONNX Resize of an NCHW tensor to spatial `size`, nearest or (bi)linear, one spatial axis after the other."""
    out = x
    for axis, target in zip((2, 3), size):
        coords = _source_coordinates(target, x.shape[axis], RESIZE_TRANSFORMS[transform])
        if RESIZE_MODES[mode] == "nearest":
            out = np.take(out, _nearest_index(coords, RESIZE_NEAREST[nearest], x.shape[axis]), axis=axis)
            continue
        coords = np.clip(coords, 0, x.shape[axis] - 1)
        low = np.floor(coords).astype(np.int64)
        high = np.minimum(low + 1, x.shape[axis] - 1)
        weight = (coords - low).reshape([-1 if a == axis else 1 for a in range(x.ndim)])
        out = np.take(out, low, axis=axis) * (1 - weight) + np.take(out, high, axis=axis) * weight
    return out.astype(x.dtype, copy=False)


def _resize_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, size = shapes[0], tuple(attrs["size"])
    check(len(x) == 4 and len(size) == 2 and min(size) >= 1, f"resize of {x} to spatial size {size}")
    check(attrs["mode"] in (0, 1) and 0 <= attrs["transform"] < len(RESIZE_TRANSFORMS), "resize mode unknown")
    check(0 <= attrs["nearest"] < len(RESIZE_NEAREST), "resize rounding unknown")
    return (*x[:2], *size)


def _resize_rules(op: OpDef) -> list[str]:
    query = ["(= (vec-length s0) 4)", "(= (vec-length size) 2)"]
    out = egg_vec([egg_dim("s0", 0), egg_dim("s0", 1), egg_dim("size", 0), egg_dim("size", 1)])
    return [egg_rule(op, query, out)]


def _resize_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    size = at["size"]
    if not isinstance(size, tuple) or len(size) != 2:
        s.reject("resize size")
    s.eq(tuple(out[:2]), tuple(ins[0][:2]))
    s.eq(tuple(out[2:]), size)


# ONNX Resize (and Upsample) of an NCHW tensor's height and width to `size`: nearest or linear, with ONNX's coordinate
# transformation (`transform`) and nearest rounding (`nearest`) by their codes; the scales are the sizes' ratios
RESIZE = register(
    OpDef(
        "resize",
        "Resize",
        1,
        (("size", "ints"), ("mode", "int"), ("transform", "int"), ("nearest", "int")),
        _resize_shape,
        lambda xs, a: resize_reference(xs[0], a["size"], a["mode"], a["transform"], a["nearest"]),
        _resize_rules,
        lambda s, o, a: float(numel(o) * (4 if a["mode"] else 1)),
        onnx="Resize",
        enumerated_by_default=False,
        onnx_also=("Upsample",),
        standard_since=11,
        ranks=(4, 4),
        min_rank=4,
        equations=_resize_equations,
        domains={"mode": [0, 1], "transform": list(range(len(RESIZE_TRANSFORMS))), "nearest": [0, 2]},
        solved={"size": lambda s, out: tuple(out[2:])},
        breaks_layout=True,
    )
)
