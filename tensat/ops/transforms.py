"""Weight transforms the rewrite rules build (weight-only in practice, so the exporter folds them into constants).

rsqrt(x; epsilon) = 1 / sqrt(x + epsilon): the batchnorm scale, for folding batchnorm into a conv.
enlarge(w; kernel): zero-pad a conv kernel (M, C, kh, kw) spatially, centred, to `kernel`; a conv whose pads grow
  by half the added size (times the dilation) computes the same output.
merge(w; group, count): the weight of a grouped conv with `group` groups, rewritten for group / count groups: each
  output channel's kernel moves to its group's slot in a count-times wider input-channel axis, zeros elsewhere.

None has an ONNX op of its own: the ONNX layer emits each as a few nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tensat.ops.elementwise import unary
from tensat.ops.registry import (
    Attrs,
    Dims,
    Equations,
    OpDef,
    Shape,
    check,
    egg_dim,
    egg_rule,
    egg_vec,
    no_flops,
    register,
)


def _rsqrt_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    return 1.0 / np.sqrt(xs[0] + a["epsilon"])


RSQRT = register(
    unary(
        "rsqrt",
        "RSqrt",
        None,
        evaluate=_rsqrt_eval,
        attrs=(("epsilon", "float"),),
        domains={"epsilon": [1e-5, 0.25]},
        positive=(0,),
    )
)


def _enlarge_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    w, kernel = shapes[0], tuple(attrs["kernel"])
    check(len(w) == 4 and len(kernel) == 2, f"enlarge needs a 4-D kernel and a 2-D size, got {w} and {kernel}")
    for have, want in zip(w[2:], kernel):
        check(have <= want and (want - have) % 2 == 0, f"cannot enlarge kernel {w[2:]} to {kernel} centred")
    return (w[0], w[1], kernel[0], kernel[1])


def _enlarge_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    w = xs[0]
    ph, pw = (a["kernel"][0] - w.shape[2]) // 2, (a["kernel"][1] - w.shape[3]) // 2
    return np.pad(w, ((0, 0), (0, 0), (ph, ph), (pw, pw)))


def _enlarge_rules(op: OpDef) -> list[str]:
    query = ["(= (vec-length s0) 4)", "(= (vec-length kernel) 2)"]
    for i in (0, 1):
        have, want = egg_dim("s0", i + 2), egg_dim("kernel", i)
        query += [f"(<= {have} {want})", f"(= 0 (% (- {want} {have}) 2))"]
    return [
        egg_rule(op, query, egg_vec([egg_dim("s0", 0), egg_dim("s0", 1), egg_dim("kernel", 0), egg_dim("kernel", 1)]))
    ]


def _enlarge_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    (w,) = ins
    k = at["kernel"]
    s.eq(out, (w[0], w[1], k[0], k[1]))
    s.eq(k[0], s.add(w[2], s.mul(2, s.sym(0, 2, slack=True))))
    s.eq(k[1], s.add(w[3], s.mul(2, s.sym(0, 2, slack=True))))


ENLARGE = register(
    OpDef(
        "enlarge",
        "Enlarge",
        1,
        (("kernel", "ints"),),
        _enlarge_shape,
        _enlarge_eval,
        _enlarge_rules,
        no_flops,
        ranks=(4, 4),
        equations=_enlarge_equations,
        solved={"kernel": lambda s, out: (s.sym(1, 5), s.sym(1, 5))},
        int_exact=True,
    )
)


def _merge_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    w, group, count = shapes[0], attrs["group"], attrs["count"]
    check(len(w) == 4, f"merge needs a 4-D conv weight, got {w}")
    check(group >= 1 and count >= 1 and group % count == 0, f"merge count {count} does not divide group {group}")
    check(w[0] % group == 0, f"merge: {w[0]} output channels not divisible by group {group}")
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
    query = [
        "(= (vec-length s0) 4)",
        "(< 0 count)",
        "(< 0 group)",
        "(= 0 (% group count))",
        f"(= 0 (% {egg_dim('s0', 0)} group))",
    ]
    return [
        egg_rule(
            op, query, egg_vec([egg_dim("s0", 0), f"(* {egg_dim('s0', 1)} count)", egg_dim("s0", 2), egg_dim("s0", 3)])
        )
    ]


def _merge_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    (w,) = ins
    s.eq(out, (w[0], s.mul(w[1], at["count"]), w[2], w[3]))
    s.eq(w[0], s.mul(s.sym(1, 2), at["group"]))


MERGE = register(
    OpDef(
        "merge",
        "Merge",
        1,
        (("group", "int"), ("count", "int")),
        _merge_shape,
        _merge_eval,
        _merge_rules,
        no_flops,
        ranks=(4, 4),
        equations=_merge_equations,
        domains={"group": [1, 2, 4], "count": [1, 2]},
        int_exact=True,
    )
)
