"""BatchNormalization (inference): inputs x, scale, bias, mean, var, each of the latter (C,)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tensat.ops.registry import SAME, Attrs, Dims, Equations, OpDef, Shape, check, egg_rule, numel, register


def _bn_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x = shapes[0]
    check(len(x) >= 2, f"batchnorm needs rank >= 2, got {x}")
    for s in shapes[1:]:
        check(tuple(s) == (x[1],), f"batchnorm parameter shape {s} != ({x[1]},)")
    return tuple(x)


def _bn_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    x, scale, bias, mean, var = xs
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / np.sqrt(var + a["epsilon"])
    return (x * inv.reshape(shape) + (bias - mean * inv).reshape(shape)).astype(x.dtype, copy=False)


def _bn_rules(op: OpDef) -> list[str]:
    return [egg_rule(op, ["(= s1 (vec-of (vec-get s0 1)))"], "s0")]


def _bn_equations(s: Equations, out: Dims, ins: Sequence[Dims], _: Mapping[str, Any]) -> None:
    s.eq(out, ins[0])
    for p in ins[1:]:
        s.eq(p[0], ins[0][1])


BATCHNORM = register(
    OpDef(
        "batchnorm",
        "BatchNorm",
        5,
        (("epsilon", "float"),),
        _bn_shape,
        _bn_eval,
        _bn_rules,
        lambda s, o, a: 2.0 * numel(o),
        onnx="BatchNormalization",
        ranks=(SAME, SAME, 1, 1, 1, 1),
        min_rank=2,
        equations=_bn_equations,
        domains={"epsilon": [1e-5, 0.25]},
        positive=(4,),
        breaks_layout=True,
    )
)
