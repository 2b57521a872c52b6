"""Data movement: concat (binary; an N-ary ONNX Concat becomes a left-nested chain), slice (one axis, explicit
start and size), transpose, reshape, padding (by a constant, or by the tensor's own elements), and the pixel shuffles
DepthToSpace and SpaceToDepth."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tensat.ops.registry import (
    MAX_RANK,
    SAME,
    Attrs,
    Dims,
    Equations,
    OpDef,
    Shape,
    Sized,
    any_data,
    check,
    egg_dim,
    egg_match,
    egg_rule,
    egg_vec,
    no_flops,
    numel,
    register,
    symbolic_on_static_axis,
    symbolic_where_static,
)


def _axes(rank: int) -> list[int]:
    return list(range(rank))


def _concat_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    a, b = shapes
    ax = attrs["axis"]
    check(len(a) == len(b) and 0 <= ax < len(a), f"concat axis {ax} invalid for {a} and {b}")
    check(a[:ax] + a[ax + 1 :] == b[:ax] + b[ax + 1 :], f"concat on axis {ax}: non-axis dims differ, {a} vs {b}")
    return a[:ax] + (a[ax] + b[ax],) + a[ax + 1 :]


def _concat_rules(op: OpDef) -> list[str]:
    query = ["(< -1 axis)", "(< axis (vec-length s0))", "(= (vec-set s0 axis 0) (vec-set s1 axis 0))"]
    return [egg_rule(op, query, "(vec-set s0 axis (+ (vec-get s0 axis) (vec-get s1 axis)))")]


def _concat_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    ax = at["axis"]
    if not isinstance(ax, int) or not 0 <= ax < len(out):
        s.reject("concat axis")
    for i in range(len(out)):
        if i == ax:
            s.eq(out[i], s.add(ins[0][i], ins[1][i]))
        else:
            s.eq(out[i], ins[0][i])
            s.eq(out[i], ins[1][i])


CONCAT = register(
    OpDef(
        "concat",
        "Concat",
        2,
        (("axis", "int"),),
        _concat_shape,
        lambda xs, a: np.concatenate(xs, axis=a["axis"]),
        _concat_rules,
        no_flops,
        onnx="Concat",
        ranks=(SAME, SAME, SAME),
        equations=_concat_equations,
        domains={"axis": _axes},
        exhaustive=("axis",),
        int_exact=True,
        accepts=any_data,
    )
)


def _slice_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x = shapes[0]
    ax, start, size = attrs["axis"], attrs["start"], attrs["size"]
    check(0 <= ax < len(x), f"slice axis {ax} invalid for {x}")
    check(0 <= start and size >= 1 and start + size <= x[ax], f"slice [{start}, {start + size}) outside dim {x[ax]}")
    return x[:ax] + (size,) + x[ax + 1 :]


def _slice_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    index = [slice(None)] * xs[0].ndim
    index[a["axis"]] = slice(a["start"], a["start"] + a["size"])
    return xs[0][tuple(index)]


def _half(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> int:
    """Half the input's dim along the slice's axis (rounded down)."""
    return shapes[0][attrs["axis"]] // 2


def _whole(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> int:
    """The input's dim along the slice's axis."""
    return shapes[0][attrs["axis"]]


HALF, WHOLE = Sized("half", _half), Sized("whole", _whole)


def _slice_rules(op: OpDef) -> list[str]:
    query = [
        "(< -1 axis)",
        "(< axis (vec-length s0))",
        "(< -1 start)",
        "(< 0 size)",
        "(< (+ start size) (+ (vec-get s0 axis) 1))",
    ]
    return [egg_rule(op, query, "(vec-set s0 axis size)")]


def _slice_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    ax, start, size = at["axis"], at["start"], at["size"]
    if not isinstance(ax, int) or not 0 <= ax < len(out):
        s.reject("slice axis")
    for i in range(len(out)):
        s.eq(out[i], size if i == ax else ins[0][i])
    s.eq(ins[0][ax], s.add(start, size, s.sym(0, 3, slack=True)))


SLICE = register(
    OpDef(
        "slice",
        "Slice",
        1,
        (("axis", "int"), ("start", "int"), ("size", "int")),
        _slice_shape,
        _slice_eval,
        _slice_rules,
        no_flops,
        onnx="Slice",
        onnx_also=("Split", "Gather"),
        ranks=(SAME, SAME),
        equations=_slice_equations,
        domains={"axis": _axes},
        exhaustive=("axis",),
        solved={"start": lambda s, out: s.sym(0, 3), "size": lambda s, out: s.sym(1, 4)},
        generated={"start": [0, 1], "size": [1]},
        sized_values={"start": (HALF,), "size": (HALF, WHOLE)},
        int_exact=True,
        accepts=any_data,
        breaks_layout=True,
        symbolic_shape=symbolic_on_static_axis,
    )
)


def _transpose_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, perm = shapes[0], tuple(attrs["perm"])
    check(sorted(perm) == list(range(len(x))), f"transpose perm {perm} invalid for rank {len(x)}")
    return tuple(x[p] for p in perm)


def _transpose_rules(op: OpDef) -> list[str]:
    out = []
    for r in range(1, MAX_RANK + 1):
        dims = [egg_dim("s0", egg_dim("perm", i)) for i in range(r)]
        out.append(egg_rule(op, [f"(= (vec-length s0) {r})", f"(= (vec-length perm) {r})"], egg_vec(dims)))
    return out


def _transpose_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    perm = at["perm"]
    if not isinstance(perm, tuple) or sorted(perm) != list(range(len(out))):
        s.reject("perm")
    for i, p in enumerate(perm):
        s.eq(out[i], ins[0][p])


TRANSPOSE = register(
    OpDef(
        "transpose",
        "Transpose",
        1,
        (("perm", "ints"),),
        _transpose_shape,
        lambda xs, a: np.transpose(xs[0], a["perm"]),
        _transpose_rules,
        no_flops,
        onnx="Transpose",
        ranks=(SAME, SAME),
        equations=_transpose_equations,
        domains={"perm": lambda rank: list(itertools.permutations(range(rank)))},
        exhaustive=("perm",),
        int_exact=True,
        accepts=any_data,
        breaks_layout=True,
        cold_output=True,
    )
)


def _reshape_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, target = shapes[0], tuple(attrs["shape"])
    check(all(d >= 1 for d in target) and numel(target) == numel(x), f"cannot reshape {x} to {target}")
    return target


def _product(vec: str, r: int) -> str:
    expr = "1"
    for i in range(r):
        expr = f"(* {expr} {egg_dim(vec, i)})"
    return expr


def _reshape_rules(op: OpDef) -> list[str]:
    out = []
    for r in range(0, MAX_RANK + 1):
        for q in range(0, MAX_RANK + 1):
            query = [
                f"(= (vec-length s0) {r})",
                f"(= (vec-length shape) {q})",
                f"(= {_product('s0', r)} {_product('shape', q)})",
            ]
            out.append(egg_rule(op, query, "shape"))
    return out


def _reshape_symbolic(op: OpDef) -> list[str]:
    """A Reshape's symbolic dims: static where its input's are; where it only adds or drops leading ones (the rank a
    broadcast operand is brought to), its input's with those ones; where it keeps its input's first dim, of a
    symbolic size, and the others are static, regrouping them (a token grid read as an image), that dim and its
    target's others (as many elements at every size)."""
    rules = symbolic_where_static(op)
    match = f"{egg_match(op)} (= s0 (shape-of x0)) (= y0 (sym-shape-of x0))"
    rules.append(
        f"(rule ({match} (< 0 (vec-length shape)) (< 0 (vec-length s0)) (= (vec-get shape 0) (vec-get s0 0)) "
        "(!= (vec-get y0 0) (vec-get s0 0)) (= (vec-set y0 0 0) (vec-set s0 0 0))) "
        "((set (sym-shape-of e) (vec-set shape 0 (vec-get y0 0)))) :ruleset shapes)"
    )
    for k in range(1, MAX_RANK):
        rules.append(
            f"(rule ({match} (= ones-k (ones {k})) (= shape (vec-append ones-k s0))) "
            f"((set (sym-shape-of e) (vec-append ones-k y0))) :ruleset shapes)"
        )
        rest = "y0"
        for _ in range(k):
            rest = f"(vec-remove {rest} 0)"
        rules.append(
            f"(rule ({match} (= ones-k (ones {k})) (= s0 (vec-append ones-k shape)) (<= {k} (vec-length y0)) "
            f"(= rest {rest}) (= y0 (vec-append ones-k rest))) ((set (sym-shape-of e) rest)) :ruleset shapes)"
        )
    return rules


def _reshape_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    target = at["shape"]
    if not isinstance(target, tuple) or len(target) != len(out):
        s.reject("reshape target")
    s.eq(out, target)
    if out:
        s.eq(out[-1], s.quotient(s.prod(ins[0]), s.prod(out[:-1])))


def _flat(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Shape:
    """Every element along the last axis, at the input's rank."""
    x = shapes[0]
    return (*(1,) * (len(x) - 1), numel(x)) if x else ()


def _vector(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Shape:
    """Every element along one axis, at rank 1: a per-channel scale as a conv's bias."""
    return (numel(shapes[0]),)


def _same(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Shape:
    """The input's own shape: a reshape that changes nothing."""
    return tuple(shapes[0])


def _column(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Shape:
    """Every element along the first axis, at the input's rank."""
    x = shapes[0]
    return (numel(x), *(1,) * (len(x) - 1)) if x else ()


RESHAPE = register(
    OpDef(
        "reshape",
        "Reshape",
        1,
        (("shape", "ints"),),
        _reshape_shape,
        lambda xs, a: xs[0].reshape(a["shape"]),
        _reshape_rules,
        no_flops,
        onnx="Reshape",
        onnx_also=("Flatten", "Squeeze", "Unsqueeze"),
        equations=_reshape_equations,
        solved={"shape": lambda s, out: out},
        generated={"shape": [Sized("flat", _flat), Sized("column", _column)]},
        sized_values={"shape": (Sized("same", _same), Sized("vector", _vector))},
        int_exact=True,
        accepts=any_data,
        view=True,
        breaks_layout=True,
        symbolic_shape=_reshape_symbolic,
    )
)


def _pad_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, pads = shapes[0], tuple(attrs["pads"])
    check(len(pads) == 2 * len(x), f"pads {pads} do not fit a tensor of rank {len(x)}")
    check(all(p >= 0 for p in pads), f"negative pads {pads} (a crop) are not modelled")
    r = len(x)
    return tuple(d + pads[i] + pads[i + r] for i, d in enumerate(x))


def _pad_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    x, pads = xs[0], a["pads"]
    r = x.ndim
    return np.pad(x, [(pads[i], pads[i + r]) for i in range(r)], constant_values=np.asarray(a["value"], x.dtype))


def _pad_rules(op: OpDef) -> list[str]:
    out = []
    for r in range(1, MAX_RANK + 1):
        dims = [f"(+ {egg_dim('s0', i)} (+ {egg_dim('pads', i)} {egg_dim('pads', i + r)}))" for i in range(r)]
        query = [f"(= (vec-length s0) {r})", f"(= (vec-length pads) {2 * r})"]
        query += [f"(< -1 {egg_dim('pads', i)})" for i in range(2 * r)]
        out.append(egg_rule(op, query, egg_vec(dims)))
    return out


def _pad_domain(rank: int) -> list[tuple[int, ...]]:
    """The pads the rule verifier tries: none, one at the end of the last axis, and one before the first axis and
    two after the last."""
    none = (0,) * (2 * rank)
    return [none, none[:-1] + (1,), (1,) + none[1:-1] + (2,)]


def _pad_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    pads = at["pads"]
    r = len(out)
    if not isinstance(pads, tuple) or len(pads) != 2 * r:
        s.reject("pads")
    for i in range(r):
        s.eq(out[i], s.add(ins[0][i], pads[i], pads[i + r]))


# constant padding: `pads` the ONNX way (the begins of every axis, then the ends), filled with `value`
PAD = register(
    OpDef(
        "pad",
        "Pad",
        1,
        (("pads", "ints"), ("value", "float")),
        _pad_shape,
        _pad_eval,
        _pad_rules,
        lambda s, o, a: float(numel(o)),
        onnx="Pad",
        ranks=(SAME, SAME),
        accepts=any_data,
        equations=_pad_equations,
        domains={"pads": _pad_domain, "value": [0.0]},
        int_exact=True,
        breaks_layout=True,
    )
)


DEPTH_TO_SPACE_MODES = ("DCR", "CRD")  # the order ONNX DepthToSpace reads the channels in, by its `mode` code


def depth_to_space(x: np.ndarray, blocksize: int, mode: int) -> np.ndarray:
    """ONNX DepthToSpace: blocks of `blocksize` x `blocksize` channels moved into the height and width (a pixel
    shuffle: CRD, as PyTorch's; DCR, ONNX's default, reads the block's position first)."""
    n, c, h, w = x.shape
    b = blocksize
    if DEPTH_TO_SPACE_MODES[mode] == "DCR":
        return x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2).reshape(n, c // (b * b), h * b, w * b)
    return x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, c // (b * b), h * b, w * b)


def space_to_depth(x: np.ndarray, blocksize: int) -> np.ndarray:
    """ONNX SpaceToDepth: each `blocksize` x `blocksize` block of pixels moved into the channels (DepthToSpace's DCR
    inverse; YOLOv5's focus layer)."""
    n, c, h, w = x.shape
    b = blocksize
    return x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4).reshape(n, c * b * b, h // b, w // b)


def _d2s_shape(shapes: Sequence[Shape], a: Attrs) -> Shape:
    x, b = shapes[0], a["blocksize"]
    check(len(x) == 4 and b >= 1 and x[1] % (b * b) == 0, f"depth to space of {x} by {b}")
    check(a["mode"] in (0, 1), f"depth to space mode {a['mode']} unknown")
    return (x[0], x[1] // (b * b), x[2] * b, x[3] * b)


def _s2d_shape(shapes: Sequence[Shape], a: Attrs) -> Shape:
    x, b = shapes[0], a["blocksize"]
    check(len(x) == 4 and b >= 1 and x[2] % b == 0 and x[3] % b == 0, f"space to depth of {x} by {b}")
    return (x[0], x[1] * b * b, x[2] // b, x[3] // b)


def _d2s_rules(op: OpDef) -> list[str]:
    s = "s0"
    area = "(* blocksize blocksize)"
    query = ["(= (vec-length s0) 4)", "(< 0 blocksize)", f"(= 0 (% {egg_dim(s, 1)} {area}))"]
    dims = [
        egg_dim(s, 0),
        f"(/ {egg_dim(s, 1)} {area})",
        f"(* {egg_dim(s, 2)} blocksize)",
        f"(* {egg_dim(s, 3)} blocksize)",
    ]
    return [egg_rule(op, query, egg_vec(dims))]


def _s2d_rules(op: OpDef) -> list[str]:
    s = "s0"
    query = [
        "(= (vec-length s0) 4)",
        "(< 0 blocksize)",
        f"(= 0 (% {egg_dim(s, 2)} blocksize))",
        f"(= 0 (% {egg_dim(s, 3)} blocksize))",
    ]
    dims = [
        egg_dim(s, 0),
        f"(* {egg_dim(s, 1)} (* blocksize blocksize))",
        f"(/ {egg_dim(s, 2)} blocksize)",
        f"(/ {egg_dim(s, 3)} blocksize)",
    ]
    return [egg_rule(op, query, egg_vec(dims))]


def _d2s_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    x, b = ins[0], at["blocksize"]
    s.eq(out[0], x[0])
    s.eq(x[1], s.mul(out[1], b * b))
    s.eq(out[2], s.mul(x[2], b))
    s.eq(out[3], s.mul(x[3], b))


def _s2d_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    x, b = ins[0], at["blocksize"]
    s.eq(out[0], x[0])
    s.eq(out[1], s.mul(x[1], b * b))
    s.eq(x[2], s.mul(out[2], b))
    s.eq(x[3], s.mul(out[3], b))


DEPTH_TO_SPACE = register(
    OpDef(
        "depth_to_space",
        "DepthToSpace",
        1,
        (("blocksize", "int"), ("mode", "int")),
        _d2s_shape,
        lambda xs, a: depth_to_space(xs[0], a["blocksize"], a["mode"]),
        _d2s_rules,
        no_flops,
        onnx="DepthToSpace",
        enumerated_by_default=False,
        ranks=(4, 4),
        min_rank=4,
        equations=_d2s_equations,
        domains={"blocksize": [2], "mode": [0, 1]},
        exhaustive=("mode",),
        int_exact=True,
        accepts=any_data,
        breaks_layout=True,
        cold_output=True,
    )
)
SPACE_TO_DEPTH = register(
    OpDef(
        "space_to_depth",
        "SpaceToDepth",
        1,
        (("blocksize", "int"),),
        _s2d_shape,
        lambda xs, a: space_to_depth(xs[0], a["blocksize"]),
        _s2d_rules,
        no_flops,
        onnx="SpaceToDepth",
        enumerated_by_default=False,
        ranks=(4, 4),
        min_rank=4,
        equations=_s2d_equations,
        domains={"blocksize": [2]},
        int_exact=True,
        accepts=any_data,
        breaks_layout=True,
        cold_output=True,
    )
)


PAD_MODES = ("reflect", "edge", "wrap")  # ONNX Pad's modes that copy the tensor's own elements, by `border_pad`'s code


def _border_pad_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, pads, mode = shapes[0], tuple(attrs["pads"]), attrs["mode"]
    check(0 <= mode < len(PAD_MODES), f"pad mode {mode} unknown")
    out = _pad_shape(shapes, attrs)
    name, r = PAD_MODES[mode], len(x)
    for i, d in enumerate(x):
        widest = max(pads[i], pads[i + r])
        # a mirror leaves its border out, a wrap repeats at most the whole axis, an edge needs one element
        fits = widest <= d - 1 if name == "reflect" else widest <= d if name == "wrap" else d >= 1 or widest == 0
        check(fits, f"{name} pads {pads} on {x}")
    return out


def _border_pad_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    x, pads = xs[0], a["pads"]
    r = x.ndim
    mode: Any = PAD_MODES[a["mode"]]  # one of numpy's names for the same modes
    return np.pad(x, [(pads[i], pads[i + r]) for i in range(r)], mode=mode)


def _border_pad_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    _pad_equations(s, out, ins, at)
    for d in ins[0]:
        s.hint(d, 2, 4)


def _border_pad_domain(rank: int) -> list[tuple[int, ...]]:
    """The pads the rule verifier tries: none, and one at each end of the last axis (within any dim of 2 or more)."""
    none = (0,) * (2 * rank)
    return [none, none[: rank - 1] + (1,) + none[rank:-1] + (1,)]


# padding by the tensor's own elements: mirrored without the border (reflect: PyTorch's ReflectionPad), the border
# repeated (edge: ReplicationPad), or the other end's (wrap); `pads` as `pad`'s
BORDER_PAD = register(
    OpDef(
        "border_pad",
        "BorderPad",
        1,
        (("pads", "ints"), ("mode", "int")),
        _border_pad_shape,
        _border_pad_eval,
        _pad_rules,
        lambda s, o, a: float(numel(o)),
        onnx="Pad",
        ranks=(SAME, SAME),
        accepts=any_data,
        equations=_border_pad_equations,
        domains={"pads": _border_pad_domain, "mode": [0, 1, 2]},
        exhaustive=("mode",),
        int_exact=True,
        breaks_layout=True,
        enumerated_by_default=False,
    )
)
