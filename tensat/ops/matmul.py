"""MatMul: equal ranks >= 2 (the IR builder reshapes 1-D operands and pads ranks); batch dims broadcast."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tensat.ops.elementwise import broadcast_shape
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
    egg_vec,
    numel,
    register,
)


def matmul_shape(shapes: Sequence[Shape], _: Attrs) -> Shape:
    """The product's shape: equal ranks >= 2, inner dims equal, batch dims broadcast."""
    a, b = shapes
    check(len(a) == len(b) and len(a) >= 2, f"matmul needs equal ranks >= 2, got {a} and {b}")
    check(a[-1] == b[-2], f"matmul inner dims differ: {a} @ {b}")
    batch = broadcast_shape((a[:-2], b[:-2]), {})
    return (*batch, a[-2], b[-1])


def _matmul_rules(op: OpDef) -> list[str]:
    out = []
    for r in range(2, MAX_RANK + 1):
        query = [
            f"(= (vec-length s0) {r})",
            f"(= (vec-length s1) {r})",
            f"(= {egg_dim('s0', r - 1)} {egg_dim('s1', r - 2)})",
        ]
        dims = []
        for i in range(r - 2):
            a, b = egg_dim("s0", i), egg_dim("s1", i)
            query.append(f"(= 0 (* (- (min {a} {b}) 1) (- {a} {b})))")
            dims.append(f"(max {a} {b})")
        dims += [egg_dim("s0", r - 2), egg_dim("s1", r - 1)]
        out.append(egg_rule(op, query, egg_vec(dims)))
    return out


def _matmul_equations(s: Equations, out: Dims, ins: Sequence[Dims], _: Mapping[str, Any]) -> None:
    a, b = ins
    r = len(out)
    s.broadcast(out, a, b, range(r - 2))
    s.eq(a[r - 1], b[r - 2])
    s.eq(out[r - 2], a[r - 2])
    s.eq(out[r - 1], b[r - 1])


def _matmul_flops(shapes: Sequence[Shape], out: Shape, _: Attrs) -> float:
    return 2.0 * numel(out) * shapes[0][-1]


MATMUL = register(
    OpDef(
        "matmul",
        "MatMul",
        2,
        (),
        matmul_shape,
        lambda xs, a: np.matmul(xs[0], xs[1]),
        _matmul_rules,
        _matmul_flops,
        onnx="MatMul",
        onnx_also=("Gemm",),
        ranks=(SAME, SAME, SAME),
        min_rank=2,
        equations=_matmul_equations,
        int_exact=True,
        breaks_layout=True,
    )
)
