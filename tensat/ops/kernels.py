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

from tensat.ops.elementwise import softmax, unary
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


def multihead_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray, heads: int, scale: float
) -> np.ndarray:
    """softmax(Q K^T * scale + bias) V over `heads` heads: q (B, S, Dq), k (B, T, Dq), v (B, T, Dv) split into
    heads along their last axis, bias (B or 1, heads or 1, S, T); the heads' results joined again, (B, S, Dv)."""
    b, s, dq = q.shape
    t, dv = k.shape[1], v.shape[2]
    qh = q.reshape(b, s, heads, dq // heads).transpose(0, 2, 1, 3)
    kh = k.reshape(b, t, heads, dq // heads).transpose(0, 2, 3, 1)
    vh = v.reshape(b, t, heads, dv // heads).transpose(0, 2, 1, 3)
    scores = np.matmul(qh, kh) * np.asarray(scale, q.dtype) + bias
    return np.matmul(softmax(scores, 3), vh).transpose(0, 2, 1, 3).reshape(b, s, dv).astype(q.dtype, copy=False)


def _mha_shape(shapes: Sequence[Shape], a: Attrs) -> Shape:
    q, k, v, bias = (tuple(x) for x in shapes)
    h = a["num_heads"]
    check(len(q) == 3 and len(k) == 3 and len(v) == 3 and len(bias) == 4, f"attention of {q}, {k}, {v}, {bias}")
    b, s, dq = q
    check(k[0] == b and v[0] == b and k[2] == dq and v[1] == k[1], f"attention of {q}, {k}, {v}")
    check(h >= 1 and dq % h == 0 and v[2] % h == 0, f"attention of {dq} and {v[2]} features in {h} heads")
    check(bias[0] in (1, b) and bias[1] in (1, h) and bias[2:] == (s, k[1]), f"attention bias {bias} for {q}, {k}")
    return (b, s, v[2])


def _scores_bias_query(b: str, heads: str, s: str, t: str) -> list[str]:
    """The egglog conditions on an attention kernel's scores' bias (input s3): (B or 1, heads or 1, S, T)."""
    return [
        f"(= 0 (* (- {egg_dim('s3', 0)} 1) (- {egg_dim('s3', 0)} {b})))",
        f"(= 0 (* (- {egg_dim('s3', 1)} 1) (- {egg_dim('s3', 1)} {heads})))",
        f"(= {egg_dim('s3', 2)} {s})",
        f"(= {egg_dim('s3', 3)} {t})",
    ]


def _mha_rules(op: OpDef) -> list[str]:
    b, heads = egg_dim("s0", 0), "num_heads"
    query = [
        "(= (vec-length s0) 3)",
        "(= (vec-length s1) 3)",
        "(= (vec-length s2) 3)",
        "(= (vec-length s3) 4)",
        f"(= {egg_dim('s1', 0)} {b})",
        f"(= {egg_dim('s2', 0)} {b})",
        f"(= {egg_dim('s1', 2)} {egg_dim('s0', 2)})",
        f"(= {egg_dim('s2', 1)} {egg_dim('s1', 1)})",
        f"(< 0 {heads})",
        f"(= 0 (% {egg_dim('s0', 2)} {heads}))",
        f"(= 0 (% {egg_dim('s2', 2)} {heads}))",
        *_scores_bias_query(b, heads, egg_dim("s0", 1), egg_dim("s1", 1)),
    ]
    return [egg_rule(op, query, egg_vec([b, egg_dim("s0", 1), egg_dim("s2", 2)]))]


def _mha_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    q, k, v, bias = ins
    heads = at["num_heads"]
    s.eq(out, (q[0], q[1], v[2]))
    s.eq((k[0], k[2], v[0], v[1]), (q[0], q[2], q[0], k[1]))
    s.eq((bias[2], bias[3]), (q[1], k[1]))
    s.quotient(q[2], heads)
    s.quotient(v[2], heads)
    s.broadcast((q[0], heads), (bias[0], bias[1]), (q[0], heads), range(2))


def _mha_flops(shapes: Sequence[Shape], out: Shape, a: Attrs) -> float:
    (b, s, dq), (_, t, _), (_, _, dv) = shapes[:3]
    return 2.0 * b * s * t * (dq + dv) + 5.0 * b * a["num_heads"] * s * t


# onnxruntime's MultiHeadAttention: attention over heads split from the last axis of 3-D queries, keys and values,
# with an additive bias on the scores (a mask, a position bias; zeros where there is none)
MULTIHEAD_ATTENTION = register(
    OpDef(
        "multihead_attention",
        "MultiHeadAttention",
        4,
        (("num_heads", "int"), ("scale", "float")),
        _mha_shape,
        lambda xs, a: multihead_attention(xs[0], xs[1], xs[2], xs[3], a["num_heads"], a["scale"]),
        _mha_rules,
        _mha_flops,
        onnx=f"{CONTRIB}:MultiHeadAttention",
        standard_since=None,
        ranks=(3, 3, 3, 3, 4),
        min_rank=3,
        equations=_mha_equations,
        domains={"num_heads": [1, 2], "scale": [0.125, 1.0]},
        breaks_layout=True,
        # a bias of zeros is left out of the kernel written (`_ex_attention_kernel`), and onnxruntime runs it
        # without the bias: timed with its value
        value_operands=frozenset({3}),
    )
)


def attention(x: np.ndarray, w: np.ndarray, b: np.ndarray, bias: np.ndarray, heads: int, scale: float) -> np.ndarray:
    """Self-attention with its projections: x (B, S, K) times the queries', keys' and values' weights side by side,
    w (K, 3N), plus their biases, b (3N), split into the three and attended as `multihead_attention`, (B, S, N)."""
    q, k, v = np.split(np.matmul(x, w) + b, 3, axis=2)
    return multihead_attention(q, k, v, bias, heads, scale)


def _attention_shape(shapes: Sequence[Shape], a: Attrs) -> Shape:
    x, w, b, bias = (tuple(s) for s in shapes)
    check(len(x) == 3 and len(w) == 2 and len(b) == 1 and len(bias) == 4, f"attention of {x}, {w}, {b}, {bias}")
    check(w[0] == x[2] and b == (w[1],) and w[1] % 3 == 0, f"attention of {x} by weights {w} and bias {b}")
    n = w[1] // 3
    return _mha_shape([(x[0], x[1], n)] * 3 + [bias], a)


def _attention_rules(op: OpDef) -> list[str]:
    b, s, heads = egg_dim("s0", 0), egg_dim("s0", 1), "num_heads"
    n = f"(/ {egg_dim('s1', 1)} 3)"
    query = [
        "(= (vec-length s0) 3)",
        "(= (vec-length s1) 2)",
        "(= (vec-length s2) 1)",
        "(= (vec-length s3) 4)",
        f"(= {egg_dim('s1', 0)} {egg_dim('s0', 2)})",
        f"(= {egg_dim('s2', 0)} {egg_dim('s1', 1)})",
        f"(= 0 (% {egg_dim('s1', 1)} 3))",
        f"(< 0 {heads})",
        f"(= 0 (% {n} {heads}))",
        *_scores_bias_query(b, heads, s, s),
    ]
    return [egg_rule(op, query, egg_vec([b, s, n]))]


def _attention_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    x, w, b, bias = ins
    heads = at["num_heads"]
    s.eq((out[0], out[1]), (x[0], x[1]))
    s.quotient(out[2], heads)
    cols = s.mul(3, out[2])
    s.eq(w, (x[2], cols))
    s.eq(b, (cols,))
    s.eq((bias[2], bias[3]), (x[1], x[1]))
    s.broadcast((x[0], heads), (bias[0], bias[1]), (x[0], heads), range(2))


def _attention_flops(shapes: Sequence[Shape], out: Shape, a: Attrs) -> float:
    (b, s, k), (_, cols) = shapes[0], shapes[1]
    n = cols // 3
    return 2.0 * b * s * k * cols + _mha_flops([(b, s, n)] * 3, out, a)


# onnxruntime's Attention: self-attention with its three projections in one product (the queries', keys' and values'
# weights side by side), then as MultiHeadAttention, with an additive bias on the scores
ATTENTION = register(
    OpDef(
        "attention",
        "Attention",
        4,
        (("num_heads", "int"), ("scale", "float")),
        _attention_shape,
        lambda xs, a: attention(xs[0], xs[1], xs[2], xs[3], a["num_heads"], a["scale"]),
        _attention_rules,
        _attention_flops,
        onnx=f"{CONTRIB}:Attention",
        standard_since=None,
        ranks=(3, 3, 2, 1, 4),
        min_rank=3,
        equations=_attention_equations,
        domains={"num_heads": [1, 2], "scale": [0.125, 1.0]},
        breaks_layout=True,
        # a scores' bias of zeros is left out of the kernel written (`_ex_attention_kernel`): timed with its value
        value_operands=frozenset({3}),
    )
)

KERNELS: dict[str, tuple[str, ...]] = {
    CONTRIB: (
        "SkipLayerNormalization",
        "Gelu",
        "FastGelu",
        "QuickGelu",
        "FusedMatMul",
        "MultiHeadAttention",
        "Attention",
    ),
    "": ("SimplifiedLayerNormalization", "LayerNormalization", "Gelu"),
}
"""The onnxruntime kernels tensat models, by domain: the fused ops its graph optimizer makes that are ops here
(LayerNormalization and Gelu are standard ONNX ops onnxruntime also makes of their written-out forms; its contrib
Gelu and FastGelu are `gelu`, exact and by tanh)."""
