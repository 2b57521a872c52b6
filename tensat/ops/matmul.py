"""MatMul: equal ranks >= 2 (the IR builder reshapes 1-D operands and pads ranks); batch dims broadcast."""

from __future__ import annotations

import string
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
    shape_from_attr,
    symbolic_where_static,
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


def einsum_subscripts(equation: str) -> tuple[int, ...]:
    """An Einsum equation of two operands as the `einsum` op holds it: each letter numbered by its first appearance,
    the two operands' and the output's (the implicit one, the letters used once in alphabetical order, written out)
    apart by -1 (`ij,jk->ik` and `bij,bjk->bik`... alike: 0 1 -1 1 2 -1 0 2). So one equation is one value, and
    a rule names it as a vector. ShapeError for an ellipsis, other than two operands, or an output letter no operand
    has."""
    eq = equation.replace(" ", "")
    check("." not in eq, f"an Einsum with an ellipsis: {equation!r}")
    lhs, arrow, out = eq.partition("->")
    operands = lhs.split(",")
    check(
        len(operands) == 2 and all(t.isalpha() for t in operands), f"an Einsum of other than two operands: {equation!r}"
    )
    letters = "".join(operands)
    if not arrow:
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    check(all(c.isalpha() for c in out), f"an Einsum output of other than letters: {equation!r}")
    check(len(set(out)) == len(out) and set(out) <= set(letters), f"an Einsum output not of its operands: {equation!r}")
    number = {c: k for k, c in enumerate(dict.fromkeys(letters))}
    return (*[number[c] for c in operands[0]], -1, *[number[c] for c in operands[1]], -1, *[number[c] for c in out])


def einsum_terms(subscripts: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """The two operands' and the output's subscripts of an `einsum` op's `equation`."""
    terms: list[list[int]] = [[]]
    for k in subscripts:
        if k == -1:
            terms.append([])
        else:
            terms[-1].append(int(k))
    check(len(terms) == 3 and all(k >= 0 for t in terms for k in t), f"einsum subscripts {tuple(subscripts)}")
    return tuple(tuple(t) for t in terms)


def einsum_equation(subscripts: Sequence[int]) -> str:
    """ONNX's Einsum equation of an `einsum` op's subscripts (each number a letter: a to z, then A to Z)."""
    a, b, out = ("".join(string.ascii_letters[k] for k in t) for t in einsum_terms(subscripts))
    return f"{a},{b}->{out}"


def _einsum_sizes(subscripts: Sequence[int], shapes: Sequence[Shape]) -> dict[int, int]:
    """Each subscript's size in operands of `shapes`; ShapeError where a rank or two sizes of one disagree."""
    sizes: dict[int, int] = {}
    for term, shape in zip(einsum_terms(subscripts)[:2], shapes):
        check(len(term) == len(shape), f"einsum {einsum_equation(subscripts)} of an operand of shape {shape}")
        for k, d in zip(term, shape):
            check(sizes.setdefault(k, d) == d, f"einsum {einsum_equation(subscripts)}: sizes {sizes[k]} and {d}")
    return sizes


def einsum_shape(subscripts: Sequence[int], shapes: Sequence[Shape]) -> Shape:
    """The output shape of an Einsum of `subscripts` on operands of `shapes`; ShapeError where they disagree."""
    sizes = _einsum_sizes(subscripts, shapes)
    return tuple(sizes[k] for k in einsum_terms(subscripts)[2])


def _einsum_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    subscripts = attrs["equation"]
    out = einsum_shape(subscripts, shapes)
    check(out == tuple(attrs["shape"]), f"einsum {einsum_equation(subscripts)} of {list(shapes)} is {out}")
    return out


def _einsum_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    x, y = xs
    return np.einsum(einsum_equation(a["equation"]), x, y).astype(x.dtype, copy=False)


def _einsum_flops(shapes: Sequence[Shape], out: Shape, attrs: Attrs) -> float:
    return 2.0 * float(np.prod(list(_einsum_sizes(attrs["equation"], shapes).values())))


def _einsum_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    terms = einsum_terms(at["equation"])
    if [len(t) for t in terms] != [len(d) for d in (*ins, out)]:
        s.reject("einsum ranks")
    sizes: dict[int, Any] = {}
    for term, dims in zip(terms, (*ins, out)):
        for k, d in zip(term, dims):
            if k in sizes:
                s.eq(d, sizes[k])
            else:
                sizes[k] = d


# ONNX Einsum of two operands, by its subscripts (`einsum_subscripts`); `shape` is its output's (egglog does not
# compute an equation's shape). A contraction an exporter wrote as einsum: attention's scores, a bilinear head
EINSUM = register(
    OpDef(
        "einsum",
        "Einsum",
        2,
        (("equation", "ints"), ("shape", "ints")),
        _einsum_shape,
        _einsum_eval,
        shape_from_attr,
        _einsum_flops,
        onnx="Einsum",
        standard_since=12,
        equations=_einsum_equations,
        domains={
            "equation": [
                einsum_subscripts(e)
                for e in (
                    "ij,jk->ik",
                    "bij,bjk->bik",
                    "bhij,bhjk->bhik",
                    "ij,kj->ik",
                    "bij,bkj->bik",
                    "bhid,bhjd->bhij",
                    "i,j->ij",
                    "ij,ij->i",
                    "bij,jk->bki",
                    "bsd,df->bsf",
                    "bhsd,df->bhsf",
                    "bsd,fd->bsf",
                    "bhsd,fd->bhsf",
                )
            ]
        },
        solved={"shape": lambda s, out: out},
        breaks_layout=True,
        enumerated_by_default=False,
        symbolic_shape=symbolic_where_static,
    )
)
