"""Element-wise ops. `unary` and `binary` derive everything about one from its numpy function: shape (the input's,
or numpy broadcasting of equal-rank operands), egglog shape rule, cost, rule-verifier ranks and equations, and the
ONNX op it imports from and exports to.

Binary operands have the same rank (the IR builder inserts reshapes to make it so); dimensions broadcast numpy-style.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
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
    check,
    egg_dim,
    egg_rule,
    egg_vec,
    numel,
    register,
)


def broadcast_shape(shapes: Sequence[Shape], _: Attrs) -> Shape:
    a, b = shapes
    check(len(a) == len(b), f"element-wise operands need equal ranks, got {a} and {b}")
    out = []
    for x, y in zip(a, b):
        check(x == y or x == 1 or y == 1, f"shapes {a} and {b} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


def _broadcast_rules(op: OpDef) -> list[str]:
    out = []
    for r in range(0, MAX_RANK + 1):
        query = [f"(= (vec-length s0) {r})", f"(= (vec-length s1) {r})"]
        dims = []
        for i in range(r):
            a, b = egg_dim("s0", i), egg_dim("s1", i)
            query.append(f"(= 0 (* (- (min {a} {b}) 1) (- {a} {b})))")
            dims.append(f"(max {a} {b})")
        out.append(egg_rule(op, query, egg_vec(dims)))
    return out


def _broadcast_equations(s: Equations, out: Dims, ins: Sequence[Dims], _: Mapping[str, Any]) -> None:
    s.broadcast(out, ins[0], ins[1], range(len(out)))


def _same_shape(shapes: Sequence[Shape], _: Attrs) -> Shape:
    return tuple(shapes[0])


def _same_rules(op: OpDef) -> list[str]:
    return [egg_rule(op, [], "s0")]


def _same_equations(s: Equations, out: Dims, ins: Sequence[Dims], _: Mapping[str, Any]) -> None:
    s.eq(out, ins[0])


def elementwise_flops(_: Sequence[Shape], out: Shape, __: Attrs) -> float:
    return float(numel(out))


def _of_first(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[Sequence[np.ndarray], Attrs], np.ndarray]:
    """The evaluator of a one-input op computing `fn`."""
    return lambda xs, a: fn(xs[0])


def unary(name: str, egg: str, fn: Callable[[np.ndarray], np.ndarray] | None, **fields: Any) -> OpDef:
    """An element-wise op of one tensor computing `fn` (or `evaluate=`, given attributes); `fields` add the ONNX
    op type (`onnx=`), `int_exact=True` where `fn` is exact on integers, and anything else an OpDef holds."""
    evaluate = fields.pop("evaluate", None)
    if evaluate is None:
        if fn is None:
            raise TypeError(f"unary op {name!r} needs fn or evaluate=")
        evaluate = _of_first(fn)
    return OpDef(
        name,
        egg,
        1,
        fields.pop("attrs", ()),
        _same_shape,
        evaluate,
        _same_rules,
        elementwise_flops,
        kind="unary",
        ranks=(SAME, SAME),
        equations=_same_equations,
        **fields,
    )


def binary(name: str, egg: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray], **fields: Any) -> OpDef:
    """An element-wise op of two broadcasting tensors computing `fn`; `fields` as for `unary`."""
    return OpDef(
        name,
        egg,
        2,
        (),
        broadcast_shape,
        lambda xs, a: fn(xs[0], xs[1]),
        _broadcast_rules,
        elementwise_flops,
        kind="broadcast",
        ranks=(SAME, SAME, SAME),
        equations=_broadcast_equations,
        **fields,
    )


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


ADD = register(binary("add", "Add", operator.add, onnx="Add", onnx_also=("Sub",), int_exact=True, commutative=True))
# ONNX's Sum of two tensors: add's value, written so that onnxruntime does not fuse it with a LayerNormalization
# reading it where that fusion is measured slower on the device (`tensat.runtime_forms`). No rule rewrites it, and the
# importer lowers an ONNX Sum to adds, so it appears only where that pass puts it.
SUM = register(binary("sum", "Sum", operator.add, onnx="Sum", int_exact=True, commutative=True))
MUL = register(binary("mul", "Mul", operator.mul, onnx="Mul", int_exact=True, commutative=True))
RELU = register(unary("relu", "Relu", relu, onnx="Relu", int_exact=True))
SIGMOID = register(unary("sigmoid", "Sigmoid", sigmoid, onnx="Sigmoid"))
TANH = register(unary("tanh", "Tanh", np.tanh, onnx="Tanh"))
ABS = register(unary("abs", "Abs", np.abs, onnx="Abs", int_exact=True))
