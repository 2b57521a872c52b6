"""Symbolic input dims: the shape a model with them is optimized at, and the optimized model written back with them.

tensat optimizes at one concrete shape (`representative`: the shapes given, else 1 for a batch dim and 128 for
any other). The model it writes for that shape is then given back the input's symbolic dims (`generalize`): its
inputs and outputs declare them, and each Reshape whose target copied a symbolic dim's size is written with 0 (copy
the input's dim) and -1 (the one dim that absorbs the rest), so that it holds at every size. Whether it does is not
assumed: the run verifies the result at other sizes of the symbolic dims (`other_shapes`), and returns the input
where it does not match.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence, Set
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, numpy_helper

from tensat.errors import raise_if_out_of_memory
from tensat.onnx.external import light_copy
from tensat.verify import random_inputs, run_model

Dims = list[int | str]  # a shape whose dims are sizes or the names of symbolic dims
BATCH_NAMES = re.compile(r"(batch|^n$|^b$|^bs$|^N$|^B$)", re.IGNORECASE)  # a symbolic dim read as a batch
BATCH = 1  # the size a batch dim is optimized at, when no shape is given
SIZE = 128  # the size any other symbolic dim (a sequence, an image side) is optimized at, when no shape is given
SIZES = (SIZE, 512, 2048, 16384)  # the sizes tried in turn, where the model does not run at the one before
# The sizes symbolic dims take in the e-graph's rule guards (`ir.Graph.symbolic`): the k-th is SYMBOL_BASE +
# k * SYMBOL_STEP, a size no static dim takes, so that a guard holds there only where it holds at every size (a dim
# equal to 1, or to another dim). Products of three of them stay far inside egglog's i64.
SYMBOL_BASE = 65537
SYMBOL_STEP = 4099


class SymbolSizes:
    """The sizes the symbolic dims of one model take in the e-graph's rule guards: one per named dim, and a fresh
    one for each dim no name or size is known for ("?"), which equals no other."""

    def __init__(self) -> None:
        self._sizes: dict[Any, int] = {}
        self._count = 0

    def _fresh(self) -> int:
        self._count += 1
        return SYMBOL_BASE + (self._count - 1) * SYMBOL_STEP

    def named(self, key: Any) -> int:
        """The size of the symbolic dim `key` names (a dim's name, or what tells it from others)."""
        if key not in self._sizes:
            self._sizes[key] = self._fresh()
        return self._sizes[key]

    def of(self, dims: Sequence[int | str]) -> tuple[int, ...]:
        """`dims` with each symbolic dim at its size."""
        return tuple(d if isinstance(d, int) else self._fresh() if d == "?" else self.named(d) for d in dims)

    def probed(
        self, model: ModelProto, given: Mapping[str, Dims], names: Sequence[str], seed: int = 0
    ) -> dict[str, tuple[int, ...]]:
        """The dims of the tensors `names` computed by `model`'s nodes (`model` read at fixed shapes; `given`: its
        inputs' symbolic dims), told by running the model at those shapes, and once for each named input dim at that
        dim alone larger. A dim that moves with one of them only, as a * size + b for a whole a, is that; one that
        moves otherwise is named by how it moved. Empty where the model does not run so."""
        rep = fixed_shapes(model)
        symbolic = declared(model, given)
        sizes = sizes_of(symbolic, rep)
        larger = {name: _scaled(size, 1, is_batch(name, 1)) for name, size in sizes.items()}
        del symbolic.graph.output[:]
        symbolic.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
        runs: list[dict[str, tuple[int, ...]]] = []
        for name in ["", *sizes]:  # "": at the fixed shapes
            feeds = {
                tensor: [larger[d] if d == name else rep[tensor][axis] for axis, d in enumerate(dims)]
                for tensor, dims in given.items()
            }
            try:
                outputs = run_model(symbolic, random_inputs(symbolic, seed, feeds), keep=False)
            except Exception as exc:  # noqa: BLE001 - a size the model does not run at: nothing is told
                raise_if_out_of_memory(exc)
                return {}
            runs.append({tensor: tuple(np.shape(value)) for tensor, value in outputs.items()})
        at_rep, moved = runs[0], dict(zip(sizes, runs[1:]))
        out: dict[str, tuple[int, ...]] = {}
        for tensor, shape in at_rep.items():
            if any(len(run.get(tensor, ())) != len(shape) for run in moved.values()):
                continue
            out[tensor] = tuple(
                self._fitted(v, {name: run[tensor][axis] for name, run in moved.items()}, sizes, larger)
                for axis, v in enumerate(shape)
            )
        return out

    def _fitted(self, v: int, moved: Mapping[str, int], sizes: Mapping[str, int], larger: Mapping[str, int]) -> int:
        """The size of a dim of size `v` at the fixed shapes that is `moved[name]` where dim `name` alone is larger."""
        changed = {name: u for name, u in moved.items() if u != v}
        if not changed:
            return v
        if len(changed) == 1:
            ((name, u),) = changed.items()
            a, rest = divmod(u - v, larger[name] - sizes[name])
            if rest == 0 and a >= 1:
                return a * self.named(name) + v - a * sizes[name]
        return self.named(("moved", v, tuple(sorted(changed.items()))))


def input_dims(model: ModelProto) -> dict[str, Dims]:
    """Each graph input's dims: sizes, and the names of symbolic dims ("?" for an unnamed one)."""
    weights = {t.name for t in model.graph.initializer}
    found: dict[str, Dims] = {}
    for vi in model.graph.input:
        if vi.name in weights or not vi.type.tensor_type.HasField("shape"):
            continue
        found[vi.name] = [
            d.dim_value if d.dim_value > 0 else (d.dim_param or "?") for d in vi.type.tensor_type.shape.dim
        ]
    return found


def symbolic_inputs(model: ModelProto) -> dict[str, list[str]]:
    """The graph inputs of `model` with dims of no fixed size, each with those dims' names ("?" for an unnamed
    one)."""
    found = {name: [d for d in dims if isinstance(d, str)] for name, dims in input_dims(model).items()}
    return {name: names for name, names in found.items() if names}


def is_batch(name: str, axis: int) -> bool:
    """Whether the symbolic dim `name` (at `axis`) is read as a batch: named like one, or an unnamed first axis."""
    return bool(BATCH_NAMES.search(name)) or (axis == 0 and name == "?")


def fixed_shapes(model: ModelProto) -> dict[str, list[int]]:
    """Each graph input's shape, for a model whose inputs have sizes only (as `load_model` leaves it)."""
    return {name: [d if isinstance(d, int) else 0 for d in dims] for name, dims in input_dims(model).items()}


def representative(
    model: ModelProto, given: Mapping[str, Sequence[int]] | None = None, size: int = SIZE
) -> dict[str, list[int]] | None:
    """The shapes to optimize `model` at: those `given`, and for every other input each symbolic dim at the size a
    given input gives a dim of that name, else 1 for a batch dim (named like one, or an unnamed first axis) and
    `size` for any other. None where `model` has no symbolic input dim."""
    dims = input_dims(model)
    if not any(isinstance(d, str) for shape in dims.values() for d in shape):
        return None
    shapes = {name: list(shape) for name, shape in (given or {}).items()}  # checked by `load_model`
    try:
        known = sizes_of(model, shapes)
    except (TypeError, ValueError):
        known = {}
    for name, shape in dims.items():
        if name in shapes:
            continue
        sizes = []
        for axis, d in enumerate(shape):
            if isinstance(d, int):
                sizes.append(d)
            elif d in known:
                sizes.append(known[d])
            else:
                sizes.append(BATCH if is_batch(d, axis) else size)
        shapes[name] = sizes
    return shapes


def sizes_to_try(model: ModelProto) -> list[int]:
    """The sizes a symbolic dim the shapes given do not size is tried at, in turn: `SIZE`, then the row counts below
    it of the tables the model looks rows up in (a position-embedding table bounds a sequence), longest first, then
    the larger `SIZES`."""
    tables = {t.name: t.dims[0] for t in model.graph.initializer if len(t.dims) == 2}
    rows = {
        tables[node.input[0]]
        for node in model.graph.node
        if node.op_type == "Gather" and node.input and node.input[0] in tables
        and all(a.name != "axis" or a.i == 0 for a in node.attribute)
    }  # fmt: skip
    return [SIZE, *sorted((r for r in rows if 1 < r < SIZE), reverse=True), *SIZES[1:]]


def unsized(dims: Mapping[str, Dims], given: Mapping[str, Sequence[int]] | None) -> list[str]:
    """The symbolic dims among the input `dims`, other than batch dims, that the shapes `given` give no size: those
    taken at a default size."""
    given = given or {}
    sized = {d for name, shape in dims.items() if name in given for d in shape if isinstance(d, str)}
    found: list[str] = []
    for name, shape in dims.items():
        for axis, d in enumerate(shape):
            if isinstance(d, str) and name not in given and not is_batch(d, axis) and d not in sized:
                found += [d] if d not in found else []
    return found


def sizes_of(model: ModelProto, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """The size each named symbolic dim of `model`'s inputs takes in `shapes`."""
    sizes: dict[str, int] = {}
    for name, dims in input_dims(model).items():
        for d, size in zip(dims, shapes.get(name, ())):
            if isinstance(d, str) and d != "?":
                sizes.setdefault(d, int(size))
    return sizes


def other_shapes(model: ModelProto, shapes: Mapping[str, Sequence[int]], count: int = 2) -> list[dict[str, list[int]]]:
    """`count` other instances of `model`'s input shapes: every batch dim 1, 2, ... larger than in `shapes`, every
    other symbolic dim 2, 3, ... times as large (one dim named alike takes one size throughout). A sequence only a
    little longer may leave what a strided stack derives from it unchanged (wav2vec2's frames at 512, 513 and 514
    samples), and a result that fixed that size would pass."""
    sizes = sizes_of(model, shapes)
    out = []
    for k in range(1, count + 1):
        instance = {}
        for name, dims in input_dims(model).items():
            given = list(shapes.get(name, ()))
            instance[name] = [
                d if isinstance(d, int) else _scaled(sizes.get(d, given[axis]), k, is_batch(d, axis))
                for axis, d in enumerate(dims)
            ]
        out.append(instance)
    return out


def halfway(
    model: ModelProto, shapes: Mapping[str, Sequence[int]], instance: Mapping[str, Sequence[int]]
) -> dict[str, list[int]]:
    """`instance` of `model`'s input shapes with each symbolic dim but a batch halfway from its size in `shapes` (one
    larger at least): where the input does not run at `instance` (a sequence past its position table), sizes it may
    run at, still other than `shapes`."""
    dims = input_dims(model)
    out = {}
    for name, sizes in instance.items():
        named = dims.get(name, [])
        out[name] = [
            a + max(1, (b - a) // 2) if b > a and not (k < len(named) and is_batch(str(named[k]), k)) else b
            for k, (a, b) in enumerate(zip(shapes.get(name, sizes), sizes))
        ]
    return out


def _scaled(size: int, k: int, batch: bool) -> int:
    """The `k`-th other size of a symbolic dim of `size`: a batch `k` larger, any other `k + 1` times as large."""
    return size + k if batch else size * (k + 1)


def generalize(candidate: ModelProto, given: ModelProto, shapes: Mapping[str, Sequence[int]]) -> ModelProto | None:
    """`candidate` (written at `shapes`) with `given`'s symbolic dims: its inputs and outputs declared as the given
    model's, its constant Reshape targets that copied a symbolic size written with 0 and -1. None where a Reshape
    cannot be written so (no one dim absorbs the symbolic sizes it does not copy)."""
    sizes = sizes_of(given, shapes)
    out = ModelProto()
    out.CopyFrom(candidate)
    declared = {vi.name: vi for vi in [*given.graph.input, *given.graph.output]}
    for vi in [*out.graph.input, *out.graph.output]:
        if vi.name in declared:
            vi.type.CopyFrom(declared[vi.name].type)
    del out.graph.value_info[:]
    inits = {t.name: t for t in out.graph.initializer}
    inferred: dict[str, Dims] | None = None  # every tensor's dims, inferred again after a target is rewritten
    fixed: dict[str, Dims] | None = None  # every tensor's sizes at `shapes`
    for index, node in enumerate(out.graph.node):
        if node.op_type != "Reshape" or len(node.input) < 2:
            continue
        target = inits.get(node.input[1])
        if target is None:  # computed in the graph (from Shape, as the model as given computes it)
            continue
        if inferred is None:
            inferred = _inferred_dims(out)
        if fixed is None:
            fixed = _inferred_dims(candidate)
        values = numpy_helper.to_array(target).tolist()
        count = math.prod(values) if values and min(values) > 0 else 0
        source, named = _named(inferred.get(node.input[0]), fixed.get(node.input[0]), sizes, count)
        if source is None or not any(isinstance(d, str) for d in source):
            continue
        new = _polymorphic(values, source, named)
        if new is None and any(d in sizes for d in source):
            # the dims named anew taken as fixed: sizes inference lost (GPT-2's heads), not derived from the others
            new = _polymorphic(values, source, sizes)
        if new is None:
            return None
        new = _one_inferred(new)
        name = f"{node.input[1]}__sym{index}"
        out.graph.initializer.append(numpy_helper.from_array(np.asarray(new, np.int64), name))
        node.input[1] = name
        inferred = None
    return out


def _named(
    dims: Dims | None, at: Dims | None, sizes: Mapping[str, int], count: int
) -> tuple[Dims | None, dict[str, int]]:
    """A Reshape source's `dims` as inference names them, where it names a symbolic dim of `sizes`, with `sizes` and
    the dims it names anew. A dim it could not name is the symbolic dim of its size `at` the shapes optimized at;
    of a size no symbolic dim takes (above 1), a dim derived from them, named anew (a conv stack's frames), so that
    the target writes it as -1; one dim of no known size there has the size that makes the source hold `count`
    elements (the target's). A guess the run verifies at other sizes."""
    named = dict(sizes)
    rank = len(dims) if dims is not None else len(at) if at is not None else None
    if rank is None or (at is not None and len(at) != rank):
        return dims, named
    by_size: dict[int, str] = {}
    for name, size in sizes.items():
        by_size.setdefault(size, name)

    def name_of(k: int, size: int) -> int | str:
        if size in by_size or size == 1:
            return by_size.get(size, size)
        named[f"?{k}"] = size
        return f"?{k}"

    out: list[int | str | None] = []
    for k in range(rank):
        d = dims[k] if dims is not None else None
        fixed = at[k] if at is not None else None
        if isinstance(d, int) or (isinstance(d, str) and d in sizes):
            out.append(d)
        elif isinstance(fixed, int):
            out.append(name_of(k, fixed))
        else:
            out.append(None)
    if out.count(None) == 1:
        known = math.prod(named[d] if isinstance(d, str) else d for d in out if d is not None)
        if known and count % known == 0:
            k = out.index(None)
            out[k] = name_of(k, count // known)
    return [d if d is not None else "?" for d in out], named


def declared(model: ModelProto, dims: Mapping[str, Dims]) -> ModelProto:
    """A copy of `model` whose graph inputs named in `dims` declare those dims again: the symbolic ones by name
    ("?": unnamed), the others by size; the types inferred at other sizes (value_info, output shapes) are dropped."""
    out = ModelProto()
    out.CopyFrom(model)
    _declare(out, dims)
    return out


def _declare(model: ModelProto, dims: Mapping[str, Dims]) -> None:
    del model.graph.value_info[:]
    for vi in model.graph.output:
        vi.type.tensor_type.ClearField("shape")
    for vi in model.graph.input:
        if vi.name not in dims:
            continue
        shape = vi.type.tensor_type.shape
        del shape.dim[:]
        for d in dims[vi.name]:
            dim = shape.dim.add()
            if isinstance(d, int):
                dim.dim_value = d
            elif d != "?":
                dim.dim_param = d


def tensor_dims(model: ModelProto, dims: Mapping[str, Dims]) -> dict[str, Dims]:
    """Each tensor's dims in `model` where its graph inputs take `dims`, as ONNX shape inference tells them: a dim
    it cannot tell is "?" (a tensor it cannot tell at all is left out)."""
    return _inferred_dims(model, dims)


CONTRIB = "com.microsoft"
# onnxruntime's kernels whose first output has their first input's shape (ONNX shape inference knows none of them;
# SimplifiedLayerNormalization is onnxruntime's in the default domain)
_SHAPE_OF_FIRST = frozenset(
    {"Gelu", "FastGelu", "BiasGelu", "QuickGelu", "SkipLayerNormalization", "SimplifiedLayerNormalization"}
)


def _shape_twin(model: ModelProto) -> ModelProto:
    """A copy of `model` without its large weights (`light_copy`), the onnxruntime kernels the exporter writes
    replaced by standard ops of the same output shapes (FusedMatMul by an Einsum, an element-wise kernel by
    Identity), for ONNX shape inference to infer through them; the twin is for inference only."""
    twin = light_copy(model)
    weights = {t.name: int(t.dims[-1]) for t in twin.graph.initializer if len(t.dims) == 2}  # columns of 2-D ones
    nodes = []
    for node in twin.graph.node:
        if node.domain not in (CONTRIB, ""):
            nodes.append(node)
        elif node.op_type in _SHAPE_OF_FIRST:
            nodes.append(onnx.helper.make_node("Identity", [node.input[0]], [node.output[0]]))
        elif node.op_type == "FusedMatMul" and node.domain == CONTRIB:
            # a MatMul of the operands, each transposed by a one-operand Einsum where the kernel transposes it: ONNX
            # infers a two-operand Einsum's leading dims from its first operand alone, where MatMul broadcasts them
            # (a constant of batch 1 times a batch of N is N, not 1)
            flags = {a.name: a.i for a in node.attribute}
            operands = []
            for k, flag in enumerate(("transA", "transB")):
                name = node.input[k]
                if flags.get(flag):
                    name = f"{node.output[0]}__twin_{flag}"
                    nodes.append(onnx.helper.make_node("Einsum", [node.input[k]], [name], equation="...ij->...ji"))
                operands.append(name)
            nodes.append(onnx.helper.make_node("MatMul", operands, [node.output[0]]))
        elif node.op_type == "MultiHeadAttention" and node.domain == CONTRIB:  # (B, S, Dq), (B, T, Dv) -> (B, S, Dv)
            nodes.append(
                onnx.helper.make_node(
                    "Einsum", [node.input[0], node.input[2]], [node.output[0]], equation="bsd,bte->bse"
                )
            )
        elif node.op_type == "Attention" and node.domain == CONTRIB and node.input[1] in weights:
            # (B, S, K) by (K, 3N) -> (B, S, N): the product by the queries' third of the weights
            third = f"{node.output[0]}__twin_third"
            ends = onnx.helper.make_tensor(f"{third}_ends", onnx.TensorProto.INT64, [1], [weights[node.input[1]] // 3])
            starts = onnx.helper.make_tensor(f"{third}_starts", onnx.TensorProto.INT64, [1], [0])
            axes = onnx.helper.make_tensor(f"{third}_axes", onnx.TensorProto.INT64, [1], [1])
            twin.graph.initializer.extend([starts, ends, axes])
            nodes.append(onnx.helper.make_node("Slice", [node.input[1], starts.name, ends.name, axes.name], [third]))
            nodes.append(onnx.helper.make_node("MatMul", [node.input[0], third], [node.output[0]]))
        else:
            nodes.append(node)
    del twin.graph.node[:]
    twin.graph.node.extend(nodes)
    return twin


def _inferred_dims(model: ModelProto, dims: Mapping[str, Dims] | None = None) -> dict[str, Dims]:
    """Each tensor's dims in `model` (its graph inputs declaring `dims` where given) by ONNX shape inference from its
    symbolic inputs (those it infers), through the onnxruntime kernels the exporter writes (`_shape_twin`)."""
    twin = _shape_twin(model)
    if dims is not None:
        _declare(twin, dims)
    inferred = onnx.shape_inference.infer_shapes(twin, strict_mode=False, data_prop=True)
    return {
        vi.name: [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in vi.type.tensor_type.shape.dim
        ]
        for vi in [
            *inferred.graph.output,
            *inferred.graph.input,
            *inferred.graph.value_info,
        ]  # one listed twice: its value_info
        if vi.type.tensor_type.HasField("shape")
    }


def _polymorphic(target: list[int], source: Dims, sizes: Mapping[str, int]) -> list[int] | None:
    """A Reshape target equal to `target` where `source`'s symbolic dims take `sizes`, and right at their other sizes:
    0 where the target keeps a symbolic dim in place, -1 at the one dim that absorbs the symbolic sizes it does not
    keep. None where that dim cannot be told. A dim inference could not name is taken as fixed: the result is
    verified at other sizes, which a wrong guess fails."""
    at = [sizes[d] if isinstance(d, str) and d in sizes else d if isinstance(d, int) else 0 for d in source]
    whole = math.prod(at)
    source = [d if isinstance(d, str) and d in sizes else 0 for d in source]
    new = list(target)
    kept = set()
    for k, t in enumerate(target):
        d = source[k] if k < len(source) else None
        if isinstance(d, str) and t == sizes[d]:
            new[k] = 0
            kept.add(k)
    rest = math.prod(sizes[d] for j, d in enumerate(source) if isinstance(d, str) and j not in kept)
    left = [j for j, d in enumerate(source) if isinstance(d, str) and j not in kept]
    if not left:
        return new
    own = {sizes[d] for j, d in enumerate(source) if j in left and isinstance(d, str) and not d.startswith("?")}
    resolved = _written_out(target, whole)
    if resolved is not None and (grouped := _absorbing_dim(at, resolved, left, own, rest)) is not None:
        # the target's own -1, where another dim takes the symbolic sizes, written out
        new = [r if t == -1 else n for t, r, n in zip(target, resolved, new)]
        new[grouped] = -1
        return new
    absorbing = [k for k, t in enumerate(target) if k not in kept and t > 0 and t % rest == 0]
    if -1 not in target and absorbing:
        new[absorbing[0]] = -1
        return new
    return new if -1 in target else None


def _one_inferred(target: list[int]) -> list[int]:
    """A polymorphic Reshape target with its first copied dim (0) written as the one inferred (-1), where it has no -1
    yet: the same at every size, and faster in onnxruntime at sizes other than those optimized at (SegFormer's token
    grids' kernels ran slower with the batch copied; see docs/results.md). Likely: where every dim of a Reshape's
    output is known from its input's, onnxruntime plans the buffers after it ahead, and hands them ones last used
    long before; an inferred dim leaves them to be sized at run time, from those freed last. A target computed from
    Shape nodes, as exporters write these, runs as the -1 does."""
    if -1 in target or 0 not in target:
        return target
    out = list(target)
    out[out.index(0)] = -1
    return out


def _written_out(target: Sequence[int], whole: int) -> list[int] | None:
    """`target` with its -1 written out for a source of `whole` elements; None where it holds a 0 or more than one
    -1, or does not hold `whole` elements."""
    if not whole or target.count(-1) > 1 or any(t == 0 or t < -1 for t in target):
        return None
    known = math.prod(t for t in target if t != -1)
    out = [whole // known if t == -1 else t for t in target]
    return out if math.prod(out) == whole else None


def _absorbing_dim(
    at: Sequence[int], target: Sequence[int], left: Sequence[int], own: Set[int], moved: int
) -> int | None:
    """The target dim that takes the symbolic sizes of the source dims `left` (the source's sizes `at`, the target's
    sizes `target`, of as many elements; `own`: the sizes of those of the dims `left` that are the model's own
    symbolic dims, not derived from them; `moved`: the product of their sizes). A Reshape regroups dims in row-major
    order, so the source and the target split into runs of equal products. In the run of the dims `left`, a target
    dim of their size is those dims moved: where it is one of the model's own dims (a sequence's positions (seq, 4)
    read as (1, seq, 4)), and where the run is not the source's leading one, which the batch would be part of (a
    conv stack's frames (batch, 128, frames) read as (batch, 128, 1, frames)). Else the run's outermost target dim
    takes them, as a batch is the outermost factor of a leading dim derived from it (Swin's windows, MobileViT's
    patches: (batch x 64, 49, 64) read as (batch, 8, 8, 7, 7, 64)). None where the sizes do not regroup so, or the
    dims `left` fall in more than one run."""
    runs: list[tuple[range, range]] = []
    i = j = 0
    while i < len(at) or j < len(target):
        i0, j0, ps, pt = i, j, 1, 1
        if i < len(at):
            ps, i = at[i], i + 1
        if j < len(target):
            pt, j = target[j], j + 1
        while ps != pt:
            if ps < pt and i < len(at):
                ps, i = ps * at[i], i + 1
            elif j < len(target):
                pt, j = pt * target[j], j + 1
            else:
                return None
        runs.append((range(i0, i), range(j0, j)))
    found = {r for r, (src, _) in enumerate(runs) if any(k in src for k in left)}
    if len(found) != 1:
        return None
    src, dims = runs[found.pop()]
    if not len(dims):
        return None
    same = [k for k in dims if target[k] in own or (0 not in src and target[k] == moved)]
    return same[0] if same else dims[0]
