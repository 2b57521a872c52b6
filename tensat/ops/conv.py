"""Conv 2-D with bias and fused activation, Conv 1-D with bias, the transposed Conv 2-D (ONNX ConvTranspose), and the
sliding-window helpers pooling shares.

Inputs: x (N,C,H,W), w (M, C/group, KH, KW), b (M,). pads = (top, left, bottom, right) as in ONNX's
(begin..., end...) order for 2-D. `act` is a fused activation code (Tensat's numbering, `ACT_NAMES`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from tensat.ops.elementwise import relu, sigmoid
from tensat.ops.registry import Attrs, Dims, Equations, OpDef, Shape, check, egg_dim, egg_rule, egg_vec, numel, register

# Fused activation codes (Tensat's numbering).
ACT_NONE, ACT_SIGMOID, ACT_RELU, ACT_TANH = 0, 1, 2, 3
ACT_NAMES = {ACT_NONE: "none", ACT_SIGMOID: "sigmoid", ACT_RELU: "relu", ACT_TANH: "tanh"}
ACT_CODES = {name: code for code, name in ACT_NAMES.items()}

ACTIVATIONS: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    ACT_NONE: lambda x: x,
    ACT_SIGMOID: sigmoid,
    ACT_RELU: relu,
    ACT_TANH: np.tanh,
}


def window_out(size: int, k: int, stride: int, pad_begin: int, pad_end: int, dilation: int = 1) -> int:
    """Output size of a sliding window along one axis."""
    return (size + pad_begin + pad_end - (dilation * (k - 1) + 1)) // stride + 1


def check_window(op: str, attrs: Attrs, spatial: int = 2) -> None:
    """Strides and dilations positive, pads non-negative (ONNX's rules; numpy and onnxruntime assume them), each
    given for the `spatial` axes (pads at their beginnings, then their ends)."""
    check(len(attrs["strides"]) == spatial and min(attrs["strides"]) >= 1, f"{op} strides {attrs['strides']} invalid")
    check(len(attrs["pads"]) == 2 * spatial and min(attrs["pads"]) >= 0, f"{op} pads {attrs['pads']} invalid")
    if "dilations" in attrs:
        check(
            len(attrs["dilations"]) == spatial and min(attrs["dilations"]) >= 1,
            f"{op} dilations {attrs['dilations']} invalid",
        )
    if "kernel" in attrs:
        check(len(attrs["kernel"]) == spatial and min(attrs["kernel"]) >= 1, f"{op} kernel {attrs['kernel']} invalid")


def windows(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]) -> np.ndarray:
    """Sliding windows (N, C, *out, *kernel) over an already padded array of `len(kernel)` spatial axes after N and
    C: a read-only view (strides of the array's own, which numpy's `sliding_window_view` computes too, at many
    times the cost on the small tensors the verifier and the rule generator evaluate)."""
    sizes, steps = x.shape[2:], x.strides[2:]
    out = [window_out(n, k, st, 0, 0, d) for n, k, st, d in zip(sizes, kernel, strides, dilations)]
    if min(out) < 1:
        raise ValueError(f"window {tuple(kernel)} dilated by {tuple(dilations)} larger than {x.shape[2:]}")
    shape = (*x.shape[:2], *out, *kernel)
    at = (*x.strides[:2], *(b * st for b, st in zip(steps, strides)), *(b * d for b, d in zip(steps, dilations)))
    return as_strided(x, shape, at, writeable=False)


def _check_channels(name: str, shapes: Sequence[Shape], group: int, rank: int) -> None:
    """A convolution's input, weight and bias ranks and its channel, group and bias sizes, in 1-D and 2-D."""
    x, w, b = shapes
    check(len(x) == rank and len(w) == rank, f"{name} needs {rank}-D input and weight, got {x} and {w}")
    check(group >= 1 and x[1] == w[1] * group, f"{name} channels {x[1]} != {w[1]} x group {group}")
    check(w[0] % group == 0, f"{name} out channels {w[0]} not divisible by group {group}")
    check(tuple(b) == (w[0],), f"{name} bias shape {b} != ({w[0]},)")


def _conv_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, w, b = shapes
    _check_channels("conv2d", shapes, attrs["group"], 4)
    check_window("conv2d", attrs)
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = attrs["strides"], attrs["pads"], attrs["dilations"]
    oh = window_out(x[2], w[2], sh, pt, pb, dh)
    ow = window_out(x[3], w[3], sw, pl, pr, dw)
    check(oh >= 1 and ow >= 1, f"conv2d kernel {w[2:]} larger than padded input {x[2:]}")
    check(attrs["act"] in ACT_NAMES, f"conv2d activation code {attrs['act']} unknown")
    return (x[0], w[0], oh, ow)


def spatial_padded(x: np.ndarray, pads: Sequence[int], value: float = 0.0) -> np.ndarray:
    """Array `x` (N, C, spatial axes...) padded with `value` by ONNX's `pads` (the spatial axes' beginnings, then
    their ends; for 2-D top, left, bottom, right): `np.pad`'s result, without its cost on the small tensors the
    verifier and the rule generator evaluate."""
    k = x.ndim - 2
    begin, end = pads[:k], pads[k:]
    out = np.full((*x.shape[:2], *(n + b + e for n, b, e in zip(x.shape[2:], begin, end))), value, dtype=x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(b, b + n) for n, b in zip(x.shape[2:], begin))] = x
    return out


def conv2d_reference(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    group: int,
    act: int = ACT_NONE,
) -> np.ndarray:
    """Numpy 2-D convolution with ONNX semantics (grouped, dilated, padded), bias and fused activation: each group a
    matrix product of its windows by its weights (im2col)."""
    xp = spatial_padded(x, pads)
    win = windows(xp, w.shape[2:], strides, dilations)
    n, c, oh, ow, kh, kw = win.shape
    m, cg = w.shape[0], w.shape[1]
    cols = win.reshape(n, group, cg, oh, ow, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6).reshape(group, n * oh * ow, -1)
    wg = w.reshape(group, m // group, cg * kh * kw)
    out = np.matmul(cols, wg.transpose(0, 2, 1))  # (group, n * oh * ow, m / group)
    out = out.transpose(1, 0, 2).reshape(n, oh, ow, m).transpose(0, 3, 1, 2)
    out = out + b.reshape(1, m, 1, 1)
    return ACTIVATIONS[act](out).astype(np.result_type(x, w), copy=False)


def _conv_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    return conv2d_reference(xs[0], xs[1], xs[2], a["strides"], a["pads"], a["dilations"], a["group"], a["act"])


def _conv_rules(op: OpDef) -> list[str]:
    s0, s1 = "s0", "s1"
    oh = (
        f"(+ (/ (- (+ {egg_dim(s0, 2)} (+ (vec-get pads 0) (vec-get pads 2))) (+ (* (vec-get dilations 0) "
        f"(- {egg_dim(s1, 2)} 1)) 1)) (vec-get strides 0)) 1)"
    )
    ow = (
        f"(+ (/ (- (+ {egg_dim(s0, 3)} (+ (vec-get pads 1) (vec-get pads 3))) (+ (* (vec-get dilations 1) "
        f"(- {egg_dim(s1, 3)} 1)) 1)) (vec-get strides 1)) 1)"
    )
    query = [
        "(= (vec-length s0) 4)",
        "(= (vec-length s1) 4)",
        f"(= {egg_dim(s0, 1)} (* {egg_dim(s1, 1)} group))",
        f"(= 0 (% {egg_dim(s1, 0)} group))",
        f"(= s2 (vec-of {egg_dim(s1, 0)}))",
    ]
    return [egg_rule(op, query, egg_vec([egg_dim(s0, 0), egg_dim(s1, 0), oh, ow]))]


def _channel_equations(s: Equations, out: Dims, ins: Sequence[Dims], group: int) -> None:
    """A convolution's batch, channel, group and bias equations, the same in 1-D and 2-D."""
    x, w, b = ins
    s.eq(out[0], x[0])
    s.eq(out[1], w[0])
    s.eq(b[0], w[0])
    s.eq(x[1], s.mul(w[1], group))
    if group != 1:
        s.eq(w[0], s.mul(s.sym(1, 2), group))


def _conv_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    x, w, b = ins
    _channel_equations(s, out, ins, at["group"])
    for i in (2, 3):
        s.hint(x[i], 3, 9)
        s.hint(w[i], 1, 3)
    s.hint(x[0], 1, 2)
    strides, pads, dil = at["strides"], at["pads"], at["dilations"]
    for i, (lo, hi) in ((2, (0, 2)), (3, (1, 3))):
        j = i - 2
        s.eq(
            out[i],
            s.apply(
                lambda size, k, st, p, d, j=j, lo=lo, hi=hi: window_out(size, k, st[j], p[lo], p[hi], d[j]),
                x[i],
                w[i],
                strides,
                pads,
                dil,
            ),
        )


def _conv_flops(shapes: Sequence[Shape], out: Shape, a: Attrs) -> float:
    w = shapes[1]
    return 2.0 * numel(out) * w[1] * w[2] * w[3]


CONV2D = register(
    OpDef(
        "conv2d",
        "Conv2d",
        3,
        (("strides", "ints"), ("pads", "ints"), ("dilations", "ints"), ("group", "int"), ("act", "int")),
        _conv_shape,
        _conv_eval,
        _conv_rules,
        _conv_flops,
        onnx="Conv",
        ranks=(4, 4, 4, 1),
        equations=_conv_equations,
        domains={
            "strides": [(1, 1), (2, 1)],
            "pads": [(0, 0, 0, 0), (1, 1, 1, 1), (0, 1, 2, 1)],
            "dilations": [(1, 1), (2, 1)],
            "group": [1, 2, 4],
            "act": [ACT_NONE, ACT_SIGMOID, ACT_RELU, ACT_TANH],
        },
        # the generator's leaves have every dim the same size n: an n x n kernel over an n x n image, padded by one
        # so that the output is 3 x 3 (the leaves' shape at size 3)
        generated={"strides": [(1, 1)], "pads": [(1, 1, 1, 1)], "dilations": [(1, 1)], "group": [1]},
        exhaustive=("act",),
        sampled=("strides", "pads", "dilations", "group"),
        int_exact=True,
        int_exact_if={"act": frozenset({ACT_NONE, ACT_RELU})},
        breaks_layout=True,
    )
)


def _conv1d_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, w, b = shapes
    _check_channels("conv1d", shapes, attrs["group"], 3)
    check_window("conv1d", attrs, spatial=1)
    (s,), (begin, end), (d,) = attrs["strides"], attrs["pads"], attrs["dilations"]
    length = window_out(x[2], w[2], s, begin, end, d)
    check(length >= 1, f"conv1d kernel {w[2]} larger than padded input {x[2]}")
    return (x[0], w[0], length)


def _conv1d_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    """The 1-D convolution as the 2-D one over a height of 1 (ONNX's semantics are the same)."""
    x, w, b = xs
    (s,), (begin, end), (d,) = a["strides"], a["pads"], a["dilations"]
    out = conv2d_reference(x[:, :, None, :], w[:, :, None, :], b, (1, s), (0, begin, 0, end), (1, d), a["group"])
    return out[:, :, 0, :]


def _conv1d_rules(op: OpDef) -> list[str]:
    s0, s1 = "s0", "s1"
    length = (
        f"(+ (/ (- (+ {egg_dim(s0, 2)} (+ (vec-get pads 0) (vec-get pads 1))) (+ (* (vec-get dilations 0) "
        f"(- {egg_dim(s1, 2)} 1)) 1)) (vec-get strides 0)) 1)"
    )
    query = [
        "(= (vec-length s0) 3)",
        "(= (vec-length s1) 3)",
        f"(= {egg_dim(s0, 1)} (* {egg_dim(s1, 1)} group))",
        f"(= 0 (% {egg_dim(s1, 0)} group))",
        f"(= s2 (vec-of {egg_dim(s1, 0)}))",
    ]
    return [egg_rule(op, query, egg_vec([egg_dim(s0, 0), egg_dim(s1, 0), length]))]


def _conv1d_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    x, w, b = ins
    _channel_equations(s, out, ins, at["group"])
    s.hint(x[2], 5, 12)
    s.hint(w[2], 1, 4)
    s.hint(x[0], 1, 2)
    s.eq(
        out[2],
        s.apply(
            lambda size, k, st, p, d: window_out(size, k, st[0], p[0], p[1], d[0]),
            x[2],
            w[2],
            at["strides"],
            at["pads"],
            at["dilations"],
        ),
    )


# ONNX Conv of an NCL tensor (speech and audio encoders' feature extractors, their positional convolutions): its
# own op, so that the 1-D kernel onnxruntime runs is priced as written, and the 2-D form over a height of 1 (the
# blocked kernels of `conv2d`) is a rule's (`conv1d-as-conv2d`) that measured costs choose or not
CONV1D = register(
    OpDef(
        "conv1d",
        "Conv1d",
        3,
        (("strides", "ints"), ("pads", "ints"), ("dilations", "ints"), ("group", "int")),
        _conv1d_shape,
        _conv1d_eval,
        _conv1d_rules,
        lambda s, o, a: 2.0 * numel(o) * s[1][1] * s[1][2],
        onnx="Conv",
        ranks=(3, 3, 3, 1),
        equations=_conv1d_equations,
        domains={
            "strides": [(1,), (2,)],
            "pads": [(0, 0), (1, 1), (0, 2)],
            "dilations": [(1,), (2,)],
            "group": [1, 2],
        },
        enumerated_by_default=False,
        sampled=("strides", "pads", "dilations", "group"),
        int_exact=True,
    )
)


def transposed_out(size: int, k: int, stride: int, pad_begin: int, pad_end: int, dilation: int, extra: int) -> int:
    """Output size of a transposed convolution along one axis (ONNX ConvTranspose, `extra` its output padding)."""
    return (size - 1) * stride - pad_begin - pad_end + dilation * (k - 1) + 1 + extra


def _conv_transpose_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, w, b = shapes
    check(len(x) == 4 and len(w) == 4, f"conv_transpose2d needs 4-D input and weight, got {x} and {w}")
    group = attrs["group"]
    check(group >= 1 and x[1] == w[0] and w[0] % group == 0, f"conv_transpose2d channels {x[1]} for weight {w}")
    check(tuple(b) == (w[1] * group,), f"conv_transpose2d bias shape {b} != ({w[1] * group},)")
    check_window("conv_transpose2d", attrs)
    extra = attrs["output_padding"]
    check(len(extra) == 2 and min(extra) >= 0, f"conv_transpose2d output padding {extra} invalid")
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = attrs["strides"], attrs["pads"], attrs["dilations"]
    check(extra[0] < max(sh, dh) and extra[1] < max(sw, dw), f"output padding {extra} not below stride or dilation")
    oh = transposed_out(x[2], w[2], sh, pt, pb, dh, extra[0])
    ow = transposed_out(x[3], w[3], sw, pl, pr, dw, extra[1])
    check(oh >= 1 and ow >= 1, f"conv_transpose2d pads {attrs['pads']} crop everything")
    return (x[0], w[1] * group, oh, ow)


def conv_transpose2d_reference(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    group: int,
    output_padding: Sequence[int],
) -> np.ndarray:
    """Numpy 2-D transposed convolution with ONNX semantics: each input pixel times each kernel tap added into the
    output at stride spacing (the gradient of a convolution), then the pads cropped off and the bias added."""
    n, c, h, wd = x.shape
    cg, mg, kh, kw = c // group, w.shape[1], w.shape[2], w.shape[3]
    (sh, sw), (dh, dw) = strides, dilations
    full_h = (h - 1) * sh + dh * (kh - 1) + 1 + output_padding[0]
    full_w = (wd - 1) * sw + dw * (kw - 1) + 1 + output_padding[1]
    full = np.zeros((n, group * mg, full_h, full_w), dtype=np.result_type(x, w))
    for g in range(group):
        xg, wg = x[:, g * cg : (g + 1) * cg], w[g * cg : (g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                tap = np.einsum("nchw,cm->nmhw", xg, wg[:, :, i, j])
                rows = slice(i * dh, i * dh + (h - 1) * sh + 1, sh)
                cols = slice(j * dw, j * dw + (wd - 1) * sw + 1, sw)
                full[:, g * mg : (g + 1) * mg, rows, cols] += tap
    pt, pl, pb, pr = pads
    out = full[:, :, pt : full_h - pb, pl : full_w - pr] + b.reshape(1, -1, 1, 1)
    return out.astype(np.result_type(x, w), copy=False)


def _conv_transpose_rules(op: OpDef) -> list[str]:
    s0, s1 = "s0", "s1"
    sizes = [
        f"(+ (+ (- (* (- {egg_dim(s0, i)} 1) (vec-get strides {j})) (+ (vec-get pads {j}) (vec-get pads {j + 2}))) "
        f"(+ (* (vec-get dilations {j}) (- {egg_dim(s1, i)} 1)) 1)) (vec-get output_padding {j}))"
        for i, j in ((2, 0), (3, 1))
    ]
    channels = f"(* {egg_dim(s1, 1)} group)"
    query = [
        "(= (vec-length s0) 4)",
        "(= (vec-length s1) 4)",
        f"(= {egg_dim(s0, 1)} {egg_dim(s1, 0)})",
        f"(= 0 (% {egg_dim(s1, 0)} group))",
        f"(= s2 (vec-of {channels}))",
    ]
    return [egg_rule(op, query, egg_vec([egg_dim(s0, 0), channels, *sizes]))]


def _conv_transpose_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    x, w, b = ins
    g = at["group"]
    s.eq(out[0], x[0])
    s.eq(out[1], s.mul(w[1], g))
    s.eq(b[0], out[1])
    s.eq(x[1], w[0])
    if g != 1:
        s.eq(w[0], s.mul(s.sym(1, 2), g))
    for i in (2, 3):
        s.hint(x[i], 2, 5)
        s.hint(w[i], 1, 3)
    s.hint(x[0], 1, 2)
    strides, pads, dil, extra = at["strides"], at["pads"], at["dilations"], at["output_padding"]
    for i, (lo, hi) in ((2, (0, 2)), (3, (1, 3))):
        j = i - 2
        s.eq(
            out[i],
            s.apply(
                lambda size, k, st, p, d, e, j=j, lo=lo, hi=hi: transposed_out(
                    size, k, st[j], p[lo], p[hi], d[j], e[j]
                ),
                x[i],
                w[i],
                strides,
                pads,
                dil,
                extra,
            ),
        )


# ONNX ConvTranspose of an NCHW tensor by a (C, M / group, kh, kw) weight, with bias (U-Nets' and GANs' upsampling)
CONV_TRANSPOSE2D = register(
    OpDef(
        "conv_transpose2d",
        "ConvTranspose2d",
        3,
        (("strides", "ints"), ("pads", "ints"), ("dilations", "ints"), ("group", "int"), ("output_padding", "ints")),
        _conv_transpose_shape,
        lambda xs, a: conv_transpose2d_reference(
            xs[0], xs[1], xs[2], a["strides"], a["pads"], a["dilations"], a["group"], a["output_padding"]
        ),
        _conv_transpose_rules,
        lambda s, o, a: 2.0 * numel(s[0]) * s[1][1] * s[1][2] * s[1][3],
        onnx="ConvTranspose",
        enumerated_by_default=False,
        ranks=(4, 4, 4, 1),
        equations=_conv_transpose_equations,
        domains={
            "strides": [(1, 1), (2, 2)],
            "pads": [(0, 0, 0, 0), (1, 1, 1, 1)],
            "dilations": [(1, 1)],
            "group": [1, 2],
            "output_padding": [(0, 0), (1, 1)],
        },
        int_exact=True,
        breaks_layout=True,
    )
)
