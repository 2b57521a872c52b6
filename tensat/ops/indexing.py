"""Selection by index and broadcasting: Gather and GatherND by an index tensor, Expand, a strided slice, and the
scatters that write updates at indices (ScatterND, ScatterElements).

A Gather by one constant index is a slice (see `layout`); these are the ones whose indices are a tensor (token ids
into an embedding table, a mask's positions). A slice whose step is not 1 is `stride`, so that the rules written
for unit-step slices (`layout.slice`) never match one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    any_data,
    check,
    egg_broadcast_onto,
    egg_dim,
    egg_rule,
    egg_vec,
    no_flops,
    not_instantiated,
    numel,
    register,
    shape_from_attr,
    symbolic_on_static_axis,
    symbolic_where_static,
)

INDEX_TYPES = frozenset({"int64", "int32"})


def _gather_accepts(dtypes: Sequence[str]) -> bool:
    return len(dtypes) == 2 and any_data(dtypes[:1]) and dtypes[1] in INDEX_TYPES


def _gather_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    data, index = shapes
    axis = attrs["axis"]
    check(0 <= axis < len(data), f"gather axis {axis} invalid for {data}")
    out = tuple(data[:axis]) + tuple(index) + tuple(data[axis + 1 :])
    check(out == tuple(attrs["shape"]), f"gather of {data} by {index} on axis {axis} is {out}, not {attrs['shape']}")
    return out


def _gather_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    data, index = xs
    return np.take(data, index.astype(np.int64), axis=a["axis"])


def _gather_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    data, index = ins
    axis = at["axis"]
    if not isinstance(axis, int) or not 0 <= axis < len(data) or len(out) != len(data) - 1 + len(index):
        s.reject("gather axis")
    s.eq(out, tuple(data[:axis]) + tuple(index) + tuple(data[axis + 1 :]))
    s.eq(out, at["shape"])


# the output's shape is an attribute too (`shape`, checked against the inputs' by the shape function): one egglog
# shape rule instead of one per rank of data and index, which egglog would spend seconds registering; no rule
# rewrites a gather
GATHER = register(
    OpDef(
        "gather",
        "Gather",
        2,
        (("axis", "int"), ("shape", "ints")),
        _gather_shape,
        _gather_eval,
        shape_from_attr,
        no_flops,
        onnx="Gather",
        accepts=_gather_accepts,
        equations=_gather_equations,
        domains={"axis": lambda rank: [0]},
        solved={"shape": lambda s, out: out},
        int_exact=True,
        breaks_layout=True,
        operand_dtypes={1: "int64"},
        symbolic_shape=symbolic_where_static,
    )
)


def _gather_nd_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    data, index = shapes
    b = attrs["batch_dims"]
    check(len(index) >= 1 and 0 <= b < len(index), f"gather_nd index {index} invalid with batch_dims {b}")
    k = index[-1]
    check(
        tuple(data[:b]) == tuple(index[:b]) and b + k <= len(data),
        f"gather_nd of {data} by {index} with batch_dims {b}",
    )
    out = tuple(index[:-1]) + tuple(data[b + k :])
    check(out == tuple(attrs["shape"]), f"gather_nd of {data} by {index} is {out}, not {attrs['shape']}")
    return out


def _gather_nd_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    data, index = xs[0], xs[1].astype(np.int64)
    b = a["batch_dims"]
    batch = int(np.prod(data.shape[:b], dtype=np.int64))
    flat_data = data.reshape((batch, *data.shape[b:]))
    flat_index = index.reshape((batch, -1, index.shape[-1]))
    rows = [flat_data[n][tuple(flat_index[n].T)] for n in range(batch)]
    return np.stack(rows).reshape(_gather_nd_shape([data.shape, index.shape], a))


# the output's shape is an attribute, as gather's
GATHER_ND = register(
    OpDef(
        "gather_nd",
        "GatherND",
        2,
        (("batch_dims", "int"), ("shape", "ints")),
        _gather_nd_shape,
        _gather_nd_eval,
        shape_from_attr,
        no_flops,
        onnx="GatherND",
        accepts=_gather_accepts,
        equations=not_instantiated,
        domains={"batch_dims": [0]},
        solved={"shape": lambda s, out: out},
        int_exact=True,
        breaks_layout=True,
        operand_dtypes={1: "int64"},
        symbolic_shape=symbolic_where_static,
    )
)


def _expand_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, target = shapes[0], tuple(attrs["shape"])
    check(
        len(x) == len(target) and all(a in (1, b) for a, b in zip(x, target)),
        f"cannot expand {x} to {target}",
    )
    return target


def _expand_rules(op: OpDef) -> list[str]:
    return egg_broadcast_onto(op, "s0", "shape")


def _expand_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    target = at["shape"]
    if not isinstance(target, tuple) or len(target) != len(out):
        s.reject("expand target")
    s.eq(out, target)
    s.broadcast(out, ins[0], tuple(out), range(len(out)))


# x broadcast to `shape`, of x's rank (the importer gives x the target's rank first)
EXPAND = register(
    OpDef(
        "expand",
        "Expand",
        1,
        (("shape", "ints"),),
        _expand_shape,
        lambda xs, a: np.broadcast_to(xs[0], tuple(a["shape"])).copy(),
        _expand_rules,
        lambda s, o, a: float(numel(o)),
        onnx="Expand",
        ranks=(SAME, SAME),
        accepts=any_data,
        equations=_expand_equations,
        solved={"shape": lambda s, out: out},
        int_exact=True,
        breaks_layout=True,
        symbolic_shape=symbolic_where_static,
    )
)


def _tile_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x, repeats = shapes[0], tuple(attrs["repeats"])
    check(len(repeats) == len(x) and all(r >= 1 for r in repeats), f"cannot tile {x} by {repeats}")
    return tuple(d * r for d, r in zip(x, repeats))


def _tile_rules(op: OpDef) -> list[str]:
    out = []
    for r in range(1, MAX_RANK + 1):
        query = [f"(= (vec-length s0) {r})", f"(= (vec-length repeats) {r})"]
        query += [f"(< 0 {egg_dim('repeats', i)})" for i in range(r)]
        out.append(egg_rule(op, query, egg_vec([f"(* {egg_dim('s0', i)} {egg_dim('repeats', i)})" for i in range(r)])))
    return out


def _tile_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    repeats = at["repeats"]
    if not isinstance(repeats, tuple) or len(repeats) != len(out):
        s.reject("tile repeats")
    for i in range(len(out)):
        s.eq(out[i], s.mul(ins[0][i], repeats[i]))


def _tile_repeats(rank: int) -> list[tuple[int, ...]]:
    """The repeats a tile of `rank` is verified with: the first axis twice, the last three times, every axis twice."""
    first = (2,) + (1,) * (rank - 1)
    last = (1,) * (rank - 1) + (3,)
    return list(dict.fromkeys([first, last, (2,) * rank]))


# x repeated `repeats[i]` times along each axis i (ONNX Tile by constant repeats)
TILE = register(
    OpDef(
        "tile",
        "Tile",
        1,
        (("repeats", "ints"),),
        _tile_shape,
        lambda xs, a: np.tile(xs[0], tuple(a["repeats"])),
        _tile_rules,
        lambda s, o, a: float(numel(o)),
        onnx="Tile",
        standard_since=6,
        ranks=(SAME, SAME),
        accepts=any_data,
        equations=_tile_equations,
        domains={"repeats": _tile_repeats},
        int_exact=True,
        breaks_layout=True,
        enumerated_by_default=False,
        symbolic_shape=symbolic_where_static,
    )
)


def _stride_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    x = shapes[0]
    ax, start, step, size = attrs["axis"], attrs["start"], attrs["step"], attrs["size"]
    check(0 <= ax < len(x) and step > 1 and size >= 1, f"strided slice on axis {ax} of {x} by {step}")
    check(0 <= start and start + step * (size - 1) < x[ax], f"strided slice from {start} by {step} outside {x[ax]}")
    return x[:ax] + (size,) + x[ax + 1 :]


def _stride_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    index = [slice(None)] * xs[0].ndim
    index[a["axis"]] = slice(a["start"], a["start"] + a["step"] * (a["size"] - 1) + 1, a["step"])
    return xs[0][tuple(index)]


def _stride_rules(op: OpDef) -> list[str]:
    query = [
        "(< -1 axis)",
        "(< axis (vec-length s0))",
        "(< -1 start)",
        "(< 1 step)",
        "(< 0 size)",
        "(< (+ start (* step (- size 1))) (vec-get s0 axis))",
    ]
    return [egg_rule(op, query, "(vec-set s0 axis size)")]


def _stride_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    ax, start, step, size = at["axis"], at["start"], at["step"], at["size"]
    if not isinstance(ax, int) or not 0 <= ax < len(out):
        s.reject("strided slice axis")
    for i in range(len(out)):
        s.eq(out[i], size if i == ax else ins[0][i])
    s.eq(ins[0][ax], s.add(start, s.mul(step, s.add(size, -1)), 1, s.sym(0, 2, slack=True)))


# every `step`-th element of one axis, `size` of them from `start` (a Slice whose step is above 1)
STRIDE = register(
    OpDef(
        "stride",
        "Stride",
        1,
        (("axis", "int"), ("start", "int"), ("step", "int"), ("size", "int")),
        _stride_shape,
        _stride_eval,
        _stride_rules,
        no_flops,
        ranks=(SAME, SAME),
        accepts=any_data,
        equations=_stride_equations,
        domains={"axis": lambda rank: list(range(rank)), "step": [2, 3]},
        exhaustive=("axis",),
        solved={"start": lambda s, out: s.sym(0, 2), "size": lambda s, out: s.sym(1, 3)},
        int_exact=True,
        breaks_layout=True,
        symbolic_shape=symbolic_on_static_axis,
    )
)


def _gather_elements_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    data, index = shapes
    axis = attrs["axis"]
    check(len(data) == len(index) and 0 <= axis < len(data), f"gather_elements of {index} from {data} on axis {axis}")
    check(all(i <= d for a, (i, d) in enumerate(zip(index, data)) if a != axis), f"{index} larger than {data}")
    return tuple(index)


def _gather_elements_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    data, index = xs
    axis = a["axis"]
    index = np.where(index < 0, index + data.shape[axis], index)
    window = tuple(slice(0, n) if k != axis else slice(None) for k, n in enumerate(index.shape))
    return np.take_along_axis(data[window], index, axis=axis)


def _gather_elements_rules(op: OpDef) -> list[str]:
    query = ["(= (vec-length s0) (vec-length s1))", "(< -1 axis)", "(< axis (vec-length s0))"]
    return [egg_rule(op, query, "s1")]


def _gather_elements_equations(s: Equations, out: Dims, ins: Sequence[Dims], at: Mapping[str, Any]) -> None:
    data, index = ins
    if not isinstance(at["axis"], int) or not 0 <= at["axis"] < len(out):
        s.reject("gather_elements axis")
    s.eq(out, index)
    s.eq(data, index)


# ONNX GatherElements: each element of `indices` picks its element of the data along `axis`, the other coordinates its
# own (a position table's rows, a detector's top boxes)
GATHER_ELEMENTS = register(
    OpDef(
        "gather_elements",
        "GatherElements",
        2,
        (("axis", "int"),),
        _gather_elements_shape,
        _gather_elements_eval,
        _gather_elements_rules,
        no_flops,
        onnx="GatherElements",
        ranks=(SAME, SAME, SAME),
        accepts=_gather_accepts,
        equations=_gather_elements_equations,
        domains={"axis": lambda rank: list(range(rank))},
        int_exact=True,
        breaks_layout=True,
        operand_dtypes={1: "int64"},
        enumerated_by_default=False,
    )
)


def _scatter_accepts(dtypes: Sequence[str]) -> bool:
    return len(dtypes) == 3 and any_data([dtypes[0], dtypes[2]]) and dtypes[1] in INDEX_TYPES


def _scatter_nd_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    data, index, updates = shapes
    check(len(index) >= 1 and index[-1] <= len(data), f"scatter_nd index {index} deeper than the data {data}")
    want = tuple(index[:-1]) + tuple(data[index[-1] :])
    check(tuple(updates) == want, f"scatter_nd updates {updates} into {data} by {index}: not {want}")
    return tuple(data)


def _scatter_nd_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    data, index, updates = xs
    out = data.copy()
    k = index.shape[-1]
    index = index.astype(np.int64).reshape(-1, k)
    index = np.where(index < 0, index + np.asarray(data.shape[:k], np.int64), index)
    out[tuple(index.T)] = updates.reshape((index.shape[0], *data.shape[k:]))
    return out


# ONNX ScatterND without a reduction: the data with each index's slice replaced by its update (a sequence shifted
# into a decoder's input, a cache written at a position); onnxruntime leaves the order of duplicate indices open,
# and so does ONNX, so a model whose indices repeat has no one meaning
SCATTER_ND = register(
    OpDef(
        "scatter_nd",
        "ScatterND",
        3,
        (),
        _scatter_nd_shape,
        _scatter_nd_eval,
        lambda op: [egg_rule(op, [], "s0")],
        no_flops,
        onnx="ScatterND",
        standard_since=11,
        accepts=_scatter_accepts,
        equations=not_instantiated,
        int_exact=True,
        breaks_layout=True,
        operand_dtypes={1: "int64"},
        enumerated_by_default=False,
    )
)


def _scatter_elements_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    data, index, updates = shapes
    axis = attrs["axis"]
    check(len(data) == len(index) and 0 <= axis < len(data), f"scatter_elements by {index} into {data} on {axis}")
    check(tuple(updates) == tuple(index), f"scatter_elements updates {updates} by indices {index}")
    check(all(i <= d for a, (i, d) in enumerate(zip(index, data)) if a != axis), f"{index} larger than {data}")
    return tuple(data)


def _scatter_elements_eval(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
    data, index, updates = xs
    axis = a["axis"]
    out = data.copy()
    where: list[np.ndarray] = list(np.indices(index.shape, sparse=True))
    where[axis] = np.where(index < 0, index + data.shape[axis], index).astype(np.int64)
    out[tuple(where)] = updates
    return out


def _scatter_elements_rules(op: OpDef) -> list[str]:
    query = ["(= (vec-length s0) (vec-length s1))", "(< -1 axis)", "(< axis (vec-length s0))"]
    return [egg_rule(op, query, "s0")]


# ONNX ScatterElements without a reduction: each update written at the data's element its index names along `axis`,
# the other coordinates its own (a token written into a sequence at a position)
SCATTER_ELEMENTS = register(
    OpDef(
        "scatter_elements",
        "ScatterElements",
        3,
        (("axis", "int"),),
        _scatter_elements_shape,
        _scatter_elements_eval,
        _scatter_elements_rules,
        no_flops,
        onnx="ScatterElements",
        standard_since=11,
        ranks=(SAME, SAME, SAME, SAME),
        accepts=_scatter_accepts,
        equations=not_instantiated,
        domains={"axis": lambda rank: list(range(rank))},
        int_exact=True,
        breaks_layout=True,
        operand_dtypes={1: "int64"},
        enumerated_by_default=False,
    )
)
