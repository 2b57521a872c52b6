"""onnxruntime's fused kernels as ops: each computes what a pattern of plain ops computes, and is priced by timing the
kernel itself. A rule of `rewrites/rules/kernels.rules` introduces each from its pattern, another writes it back
as plain ops in a form onnxruntime does not fuse again, and the extraction chooses between them by measured cost.
The exporter writes a chosen kernel as the onnxruntime op it is (`OpDef.onnx`, in its domain), so the kernel the
extraction chose is the kernel that runs.

`KERNELS` is the catalogue: the onnxruntime op types these ops are, by domain; the importer reads those of an input
model as it reads any op, and `tensat.onnx.fusions` writes each of the fused subgraphs onnxruntime would make of an
input as the op of this catalogue it becomes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tensat.ops.elementwise import unary
from tensat.ops.matmul import matmul_shape
from tensat.ops.reduce import layer_norm
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
    symbolic_of_first,
)

CONTRIB = "com.microsoft"  # onnxruntime's contrib op domain


def _skip_shape(shapes: Sequence[Shape], _: Attrs) -> Shape:
    x, skip, gamma, beta = shapes
    check(len(x) == 3 and tuple(skip) == tuple(x), f"skip layer normalization of {x} and {skip}")
    check(tuple(gamma) == x[-1:] and tuple(beta) == x[-1:], f"skip layer normalization of {x} by {gamma}, {beta}")
    return tuple(x)


def _skip_rules(op: OpDef) -> list[str]:
    query = ["(= (vec-length s0) 3)", "(= s0 s1)", "(= s2 (vec-of (vec-get s0 2)))", "(= s3 s2)"]
    return [egg_rule(op, query, "s0")]


def _skip_equations(s: Equations, out: Dims, ins: Sequence[Dims], _: Mapping[str, Any]) -> None:
    x, skip, gamma, beta = ins
    s.eq(out, x)
    s.eq(skip, x)
    s.eq(gamma, (x[-1],))
    s.eq(beta, (x[-1],))


# onnxruntime's SkipLayerNormalization: LayerNormalization over the last axis of a residual sum x + skip
SKIP_LAYER_NORM = register(
    OpDef(
        "skip_layernorm",
        "SkipLayerNorm",
        4,
        (("epsilon", "float"),),
        _skip_shape,
        lambda xs, a: layer_norm(xs[0] + xs[1], xs[2], xs[3], xs[0].ndim - 1, a["epsilon"]),
        _skip_rules,
        lambda s, o, a: 9.0 * numel(o),
        onnx=f"{CONTRIB}:SkipLayerNormalization",
        standard_since=None,
        ranks=(3, 3, 3, 1, 1),
        min_rank=3,
        equations=_skip_equations,
        domains={"epsilon": [1e-5, 0.25]},
        breaks_layout=True,
        # onnxruntime's kernel also adds a skip of batch 1 to any batch (a BERT's position embeddings), which it
        # was read as at batch 1
        symbolic_shape=symbolic_of_first,
    )
)


def rms_norm(x: np.ndarray, scale: np.ndarray, epsilon: float) -> np.ndarray:
    """x / sqrt(mean(x^2 over the last axis) + epsilon) * scale."""
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(ms + epsilon) * scale).astype(x.dtype, copy=False)


def _rms_shape(shapes: Sequence[Shape], _: Attrs) -> Shape:
    x, scale = shapes
    check(len(x) >= 1 and tuple(scale) == x[-1:], f"RMS normalization of {x} by {scale}")
    return tuple(x)


def _rms_rules(op: OpDef) -> list[str]:
    return [egg_rule(op, ["(< 0 (vec-length s0))", "(= s1 (vec-of (vec-get s0 (- (vec-length s0) 1))))"], "s0")]


def _rms_equations(s: Equations, out: Dims, ins: Sequence[Dims], _: Mapping[str, Any]) -> None:
    x, scale = ins
    s.eq(out, x)
    s.eq(scale, (x[-1],))


# onnxruntime's SimplifiedLayerNormalization (T5's and Llama's RMSNorm) over the last axis, in the ONNX domain
RMS_NORM = register(
    OpDef(
        "rms_norm",
        "RMSNorm",
        2,
        (("epsilon", "float"),),
        _rms_shape,
        lambda xs, a: rms_norm(xs[0], xs[1], a["epsilon"]),
        _rms_rules,
        lambda s, o, a: 5.0 * numel(o),
        onnx="SimplifiedLayerNormalization",
        standard_since=None,
        ranks=(SAME, SAME, 1),
        equations=_rms_equations,
        domains={"epsilon": [1e-5, 0.25]},
        breaks_layout=True,
    )
)


def _quick_gelu(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    x = xs[0]
    return (x * (0.5 * (np.tanh(0.5 * a["alpha"] * x) + 1.0))).astype(x.dtype, copy=False)


# onnxruntime's QuickGelu: x * sigmoid(alpha * x), which it makes of a SiLU (alpha 1)
QUICK_GELU = register(
    unary(
        "quick_gelu",
        "QuickGelu",
        None,
        evaluate=_quick_gelu,
        attrs=(("alpha", "float"),),
        onnx=f"{CONTRIB}:QuickGelu",
        standard_since=None,
        domains={"alpha": [1.0, 1.702]},
    )
)


def _operands(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, Shape]:
    """The operands as multiplied: each with its last two dims swapped where it is transposed."""
    x, y = (tuple(s) for s in shapes)
    if a["trans_a"] and len(x) >= 2:
        x = (*x[:-2], x[-1], x[-2])
    if a["trans_b"] and len(y) >= 2:
        y = (*y[:-2], y[-1], y[-2])
    return x, y


def _fused_matmul_shape(shapes: Sequence[Shape], a: Attrs) -> Shape:
    check(a["trans_a"] in (0, 1) and a["trans_b"] in (0, 1), f"fused matmul transposes {a['trans_a']}, {a['trans_b']}")
    return matmul_shape(_operands(shapes, a), {})


def _fused_matmul_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    x, y = xs
    if a["trans_a"]:
        x = np.swapaxes(x, -1, -2)
    if a["trans_b"]:
        y = np.swapaxes(y, -1, -2)
    out = np.matmul(x, y)
    return (out * np.asarray(a["alpha"], out.dtype)).astype(out.dtype, copy=False)


def _fused_matmul_rules(op: OpDef) -> list[str]:
    out = []
    for r in range(2, MAX_RANK + 1):
        for ta in (0, 1):
            for tb in (0, 1):
                m, k = (r - 1, r - 2) if ta else (r - 2, r - 1)
                k2, n = (r - 1, r - 2) if tb else (r - 2, r - 1)
                query = [
                    f"(= (vec-length s0) {r})",
                    f"(= (vec-length s1) {r})",
                    f"(= trans_a {ta})",
                    f"(= trans_b {tb})",
                    f"(= {egg_dim('s0', k)} {egg_dim('s1', k2)})",
                ]
                dims = []
                for i in range(r - 2):
                    x, y = egg_dim("s0", i), egg_dim("s1", i)
                    query.append(f"(= 0 (* (- (min {x} {y}) 1) (- {x} {y})))")
                    dims.append(f"(max {x} {y})")
                out.append(egg_rule(op, query, egg_vec([*dims, egg_dim("s0", m), egg_dim("s1", n)])))
    return out


def _fused_matmul_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    if at["trans_a"] not in (0, 1) or at["trans_b"] not in (0, 1):
        s.reject("fused matmul transposes")
    a, b = ins
    r = len(out)
    if at["trans_a"]:
        a = (*a[:-2], a[-1], a[-2])
    if at["trans_b"]:
        b = (*b[:-2], b[-1], b[-2])
    s.broadcast(out, a, b, range(r - 2))
    s.eq(a[r - 1], b[r - 2])
    s.eq(out[r - 2], a[r - 2])
    s.eq(out[r - 1], b[r - 1])


# onnxruntime's FusedMatMul: alpha * A @ B, either operand with its last two dims swapped (a Transpose and a scale
# folded into the product, as in attention's scores); equal ranks >= 2, batch dims broadcast, as matmul's
FUSED_MATMUL = register(
    OpDef(
        "fused_matmul",
        "FusedMatMul",
        2,
        (("trans_a", "int"), ("trans_b", "int"), ("alpha", "float")),
        _fused_matmul_shape,
        _fused_matmul_eval,
        _fused_matmul_rules,
        lambda s, o, a: 2.0 * numel(o) * _operands(s, a)[0][-1],
        onnx=f"{CONTRIB}:FusedMatMul",
        standard_since=None,
        ranks=(SAME, SAME, SAME),
        min_rank=2,
        equations=_fused_matmul_equations,
        domains={"trans_a": [0, 1], "trans_b": [0, 1], "alpha": [0.125, 1.0]},
        exhaustive=("trans_a", "trans_b"),
        sampled=("alpha",),
        breaks_layout=True,
    )
)

KERNELS: dict[str, tuple[str, ...]] = {
    CONTRIB: ("SkipLayerNormalization", "Gelu", "FastGelu", "QuickGelu", "FusedMatMul"),
    "": ("SimplifiedLayerNormalization", "LayerNormalization", "Gelu"),
}
"""The onnxruntime kernels tensat models, by domain: the fused ops its graph optimizer makes that are ops here
(LayerNormalization and Gelu are standard ONNX ops onnxruntime also makes of their written-out forms; its contrib
Gelu and FastGelu are `gelu`, exact and by tanh)."""
