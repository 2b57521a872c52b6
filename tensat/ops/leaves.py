"""Leaves: graph inputs and weights. No tensor inputs; the shape is an attribute."""

from __future__ import annotations

from collections.abc import Sequence

from tensat.ops.registry import Attrs, OpDef, Shape, no_flops, register, shape_from_attr


def leaf_shape(_: Sequence[Shape], attrs: Attrs) -> Shape:
    return tuple(attrs["shape"])


def _leaf(name: str, egg: str) -> OpDef:
    return OpDef(
        name,
        egg,
        0,
        (("name", "str"), ("shape", "ints")),
        leaf_shape,
        None,
        shape_from_attr,
        no_flops,
        leaf=True,
        kind="leaf",
    )


INPUT = register(_leaf("input", "Input"))
WEIGHT = register(_leaf("weight", "Weight"))
