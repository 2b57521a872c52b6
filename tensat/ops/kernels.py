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

from tensat.ops.reduce import layer_norm
from tensat.ops.registry import (
    SAME,
    Attrs,
    Dims,
    Equations,
    OpDef,
    Shape,
    check,
    egg_rule,
    numel,
    register,
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
        ranks=(3, 3, 3, 1, 1),
        min_rank=3,
        equations=_skip_equations,
        domains={"epsilon": [1e-5, 0.25]},
        breaks_layout=True,
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
        ranks=(SAME, SAME, 1),
        equations=_rms_equations,
        domains={"epsilon": [1e-5, 0.25]},
        breaks_layout=True,
    )
)

KERNELS: dict[str, tuple[str, ...]] = {
    CONTRIB: ("SkipLayerNormalization",),
    "": ("SimplifiedLayerNormalization", "LayerNormalization", "Gelu"),
}
"""The onnxruntime kernels tensat models, by domain: the fused ops its graph optimizer makes that are ops here
(LayerNormalization and Gelu are standard ONNX ops onnxruntime also makes of their written-out forms)."""
