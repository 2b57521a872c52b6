"""Leaves: graph inputs, weights, and constants their attributes define. No tensor inputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tensat.ops.registry import (
    TYPE_CODES,
    TYPE_NAMES,
    Attrs,
    Dims,
    Equations,
    OpDef,
    Shape,
    check,
    egg_match,
    no_flops,
    register,
    shape_from_attr,
    symbolic_from_model,
)


def leaf_shape(_: Sequence[Shape], attrs: Attrs) -> Shape:
    return tuple(attrs["shape"])


def _leaf(name: str, egg: str, **symbolic: Any) -> OpDef:
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
        **symbolic,
    )


INPUT = register(_leaf("input", "Input", symbolic_shape=symbolic_from_model))
WEIGHT = register(_leaf("weight", "Weight"))


# -- constants their attributes define: a rule can match one by value and build one (see `registry.constant_leaf`)


def _fill_eval(_: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    """The constant, real ones in float64: the value exactly, which the IR casts to the node's type (`Graph.constant`)
    and the rule verifier compares in float64."""
    dtype = np.dtype(TYPE_NAMES[a["dtype"]])
    return np.full(tuple(a["shape"]), a["value"], dtype=np.float64 if dtype.kind == "f" else dtype)


def _fill_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    s.eq(out, at["shape"])


# a tensor of `shape` whose elements all equal `value`, of element type `dtype` (an ONNX type code): the importer
# reads every constant whose elements are all equal as one (an epsilon, an exponent, a zero bias)
FILL = register(
    OpDef(
        "fill",
        "Fill",
        0,
        (("value", "float"), ("shape", "ints"), ("dtype", "int")),
        leaf_shape,
        _fill_eval,
        shape_from_attr,
        no_flops,
        leaf=True,
        kind="leaf",
        dtype=lambda _, a: TYPE_NAMES[a["dtype"]],
        equations=_fill_equations,
        domains={"value": [2.0, 0.5], "dtype": [TYPE_CODES["float32"]]},
        solved={"shape": lambda s, out: out},
    )
)


def band(channels: int, size: int, alpha: float) -> np.ndarray:
    """The (C, C, 1, 1) weight of a 1x1 Conv summing each channel's LRN window times alpha / size: output channel c
    reads channels c - floor((size - 1) / 2) to c + ceil((size - 1) / 2), as ONNX's LRN defines the window. In
    float64, as `fill`'s real constants."""
    below = (size - 1) // 2
    c = np.arange(channels)
    offset = c[None, :] - c[:, None]
    inside = (offset >= -below) & (offset <= size - 1 - below)
    return (inside * (alpha / size)).reshape(channels, channels, 1, 1)


def _band_shape(_: Sequence[Shape], a: Attrs) -> Shape:
    check(a["channels"] > 0 and a["size"] > 0, f"band of {a['channels']} channels and size {a['size']}")
    return (a["channels"], a["channels"], 1, 1)


def _band_rules(op: OpDef) -> list[str]:
    return [
        f"(rule ({egg_match(op)} (< 0 channels) (< 0 size)) ((set (shape-of e) (vec-of channels channels 1 1))) "
        ":ruleset shapes)"
    ]


def _band_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    s.eq(out, (at["channels"], at["channels"], 1, 1))


# the weight of LRN's window sum as a 1x1 Conv (`band`), for the rule writing an LRN as its definition
BAND = register(
    OpDef(
        "band",
        "Band",
        0,
        (("channels", "int"), ("size", "int"), ("alpha", "float")),
        _band_shape,
        lambda _, a: band(a["channels"], a["size"], a["alpha"]),
        _band_rules,
        no_flops,
        leaf=True,
        kind="leaf",
        ranks=(4,),
        min_rank=4,
        equations=_band_equations,
        domains={"size": [1, 2, 3, 5], "alpha": [1e-4, 0.5]},
        solved={"channels": lambda s, out: out[0]},
    )
)
