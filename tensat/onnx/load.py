"""Loading and validation: read a model (path or proto), check it (structure, opsets, external data, onnx's
checker), fix its input shapes, inline local functions and run shape inference (`load_model`)."""

from __future__ import annotations

import heapq
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any

import onnx
import onnx.inliner
from onnx import GraphProto, ModelProto

from tensat.errors import ModelError, one_line, raise_if_out_of_memory
from tensat.onnx.common import MAX_IR_VERSION, free_names, node_label, norm_domain, opset_versions
from tensat.onnx.external import (
    external_dir,
    has_external,
    is_large,
    light_copy,
    model_tensors,
    set_external_dir,
    subgraphs,
    write_external,
)
from tensat.onnx.symbolic import SIZE, input_dims, representative

MIN_OPSET = 7


def _read(source: Any) -> tuple[ModelProto, str | None, str | None]:
    """The model proto (external data not loaded), its directory and its path (None for an in-memory proto)."""
    if isinstance(source, ModelProto):
        model = ModelProto()
        model.CopyFrom(source)
        return model, external_dir(model), None
    if not isinstance(source, (str, os.PathLike)):
        raise ModelError(f"expected a model path or an onnx.ModelProto, got {type(source).__name__}")
    path = os.fspath(source)
    if not os.path.exists(path):
        raise ModelError(f"model file '{path}' not found")
    if os.path.isdir(path):
        raise ModelError(f"'{path}' is a directory, not an ONNX model file")
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise ModelError(f"cannot read model file '{path}': {one_line(e.strerror or e)}") from None
    if size == 0:
        raise ModelError(f"model file '{path}' is empty")
    try:
        model = onnx.load(path, load_external_data=False)
    except OSError as e:
        raise ModelError(f"cannot read model file '{path}': {one_line(e.strerror or e)}") from None
    except Exception as e:  # noqa: BLE001 - protobuf decode errors have no common base class
        raise ModelError(
            f"'{path}' is not an ONNX model or is truncated (protobuf parse failed: {one_line(e)})"
        ) from None
    return model, os.path.dirname(os.path.abspath(path)), path


def _check_basic(model: ModelProto, where: str) -> None:
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        missing = "ir_version" if model.ir_version <= 0 else "graph" if not model.HasField("graph") else "opset_import"
        raise ModelError(f"{where} is not an ONNX model (no {missing}; truncated or not an ONNX file?)")
    if model.ir_version > MAX_IR_VERSION:  # onnxruntime refuses it: found here, not after the search at verification
        raise ModelError(
            f"{where} has IR version {model.ir_version}; onnxruntime reads IR versions up to {MAX_IR_VERSION} "
            f"(lower the model's ir_version, or save it with an older onnx)"
        )


def _known_domains() -> dict[str, set[str] | None]:
    """Operator domains onnxruntime can run: None = every op of the domain is known to onnx itself."""
    domains: dict[str, set[str] | None] = {"": None}
    for schema in onnx.defs.get_all_schemas_with_history():
        domains[schema.domain] = None
    try:
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)
        from onnxruntime.capi import _pybind_state

        for schema in _pybind_state.get_all_operator_schema():
            if schema.domain not in domains or domains[schema.domain] is not None:
                domains.setdefault(schema.domain, set()).add(schema.name)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - without onnxruntime's registry, allow only onnx's domains
        pass
    return domains


_DOMAINS: dict[str, set[str] | None] | None = None


def _check_opsets(model: ModelProto) -> None:
    global _DOMAINS
    if _DOMAINS is None:
        _DOMAINS = _known_domains()
    opsets = opset_versions(model)
    default = opsets.get("")
    if default is None:
        raise ModelError("the model imports no version of the default ONNX opset")
    if default < MIN_OPSET:
        raise ModelError(f"opset {default} is older than {MIN_OPSET}; convert it first with onnx.version_converter")
    local = {fn.domain for fn in model.functions}
    for domain in opsets:
        if domain not in _DOMAINS and domain not in local:
            raise ModelError(f"unknown opset domain '{domain}'")
    for index, node in enumerate(model.graph.node):
        ops_of = _DOMAINS.get(norm_domain(node.domain))
        if norm_domain(node.domain) in local or ops_of is None:
            continue
        if node.op_type not in ops_of:
            raise ModelError(f"{node_label(node, index)}: onnxruntime has no operator {node.domain}.{node.op_type}")


def _check_structure(graph: GraphProto) -> bool:
    """Dangling inputs and cycles, reported by name (before the checker's less specific messages); nodes out of
    topological order are sorted in place (the checker rejects them, onnxruntime and the zoo's files do not).
    Returns whether it sorted them."""
    available = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    available |= {s.values.name for s in graph.sparse_initializer}
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for out in node.output:
            if out:
                producer.setdefault(out, index)
    for index, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in available and name not in producer:
                raise ModelError(f"{node_label(node, index)} reads tensor '{name}', which nothing produces")
    for out in graph.output:
        if out.name not in available and out.name not in producer:
            raise ModelError(f"graph output '{out.name}' is not produced by any node")
    deps: list[set[int]] = []
    for node in graph.node:
        names = [n for n in node.input if n]
        for attr in node.attribute:
            for sub in subgraphs(attr):
                names += free_names(sub)
        deps.append({producer[n] for n in names if n in producer and n not in available})
    order = _topological_order(deps)
    if len(order) < len(graph.node):
        stuck = _on_cycle(deps, set(range(len(graph.node))) - set(order))
        raise ModelError(f"the graph has a cycle through {node_label(graph.node[stuck], stuck)}")
    if order == sorted(order):
        return False
    nodes = [graph.node[i] for i in order]
    del graph.node[:]
    graph.node.extend(nodes)
    return True


def _constant_initializers(model: ModelProto) -> bool:
    """IR versions before 4 list every initializer as a graph input too. Files that leave some out (onnxslim's
    output of an opset-9 model, say) run in onnxruntime, which treats those as constants, and are rejected by
    onnx.checker; they are read as IR version 4, where an initializer that is no input is a constant. Returns
    whether the model needed it."""
    if model.ir_version >= 4:
        return False
    inputs = {v.name for v in model.graph.input}
    if all(t.name in inputs for t in model.graph.initializer):
        return False
    model.ir_version = 4
    return True


def _topological_order(deps: Sequence[set[int]]) -> list[int]:
    """Kahn's algorithm, stable: of the nodes whose producers are all placed, the first in file order goes next
    (a sorted graph keeps its order). Nodes on or after a cycle are left out."""
    users: dict[int, list[int]] = {}
    for index, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(index)
    pending = [len(d) for d in deps]
    ready = [i for i, p in enumerate(pending) if p == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    return order


def _on_cycle(deps: Sequence[set[int]], stuck: set[int]) -> int:
    """A node on a cycle among the `stuck` ones (each has a stuck producer: walk producers until one repeats)."""
    seen: set[int] = set()
    i = min(stuck)
    while i not in seen:
        seen.add(i)
        i = min(deps[i] & stuck)
    return i


def _check_external(model: ModelProto, base_dir: str | None) -> bool:
    """Refuse external data outside the model's directory; True when the model has external data."""
    found = False
    for tensor in model_tensors(model):
        if not has_external(tensor):
            continue
        found = True
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        what = f"external data '{location}' of tensor '{tensor.name}'"
        if not location:
            raise ModelError(f"tensor '{tensor.name}' has external data without a location")
        if base_dir is None:
            raise ModelError(f"tensor '{tensor.name}' keeps its data in '{location}'; load the model from its file")
        parts = PurePath(location.replace("\\", "/")).parts
        if os.path.isabs(location) or location.startswith(("/", "\\")) or ".." in parts or ":" in location:
            raise ModelError(f"{what} is outside the model's directory")
        base_real = os.path.realpath(base_dir)
        real = os.path.realpath(os.path.join(base_dir, location))
        if os.path.commonpath([real, base_real]) != base_real:
            raise ModelError(f"{what} is outside the model's directory (a symlink leads out of it)")
        if not os.path.isfile(real):
            raise ModelError(f"{what} not found in the model's directory")
        try:
            offset, length = int(info.get("offset", 0)), int(info.get("length", -1))
        except ValueError:
            raise ModelError(f"{what} has a malformed offset or length") from None
        if offset < 0 or (length >= 0 and offset + length > os.path.getsize(real)):
            raise ModelError(f"{what} lies beyond the end of its file")
    return found


RUNTIME_DOMAIN = "com.microsoft"  # where the checker is shown the runtime's own ops of the default domain


def _runtime_ops(model: ModelProto) -> list[int]:
    """The nodes of the default domain that ONNX does not define at the model's opset but onnxruntime runs, as its own
    optimizer writes them (SimplifiedLayerNormalization, LayerNormalization before opset 17)."""
    from tensat import ops  # the ONNX layer's loader needs the registry only here

    opset = opset_versions(model).get("", 1)
    known = set(ops.KERNELS[""])
    return [
        k
        for k, n in enumerate(model.graph.node)
        if norm_domain(n.domain) == "" and n.op_type in known and not onnx.defs.has(n.op_type, opset, "")
    ]


def _checkable(model: ModelProto, nodes: Sequence[int]) -> ModelProto:
    """A copy of `model` whose nodes `nodes` are in `RUNTIME_DOMAIN`: the checker checks everything else about them,
    and does not reject an op it does not define. It is checked in memory, so its weights with data elsewhere (large
    ones left out of the copy, external ones) are graph inputs of their type and shape in it: the checker checks the
    nodes reading them, where it would look for their data in files."""
    copy = light_copy(model)
    graph = copy.graph
    inputs = {vi.name for vi in graph.input}
    kept = []
    for tensor in graph.initializer:
        if not has_external(tensor):
            kept.append(tensor)
        elif tensor.name not in inputs:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for k in nodes:
        graph.node[k].domain = RUNTIME_DOMAIN
    if RUNTIME_DOMAIN not in opset_versions(copy):
        copy.opset_import.add(domain=RUNTIME_DOMAIN, version=1)
    return copy


def _run_checker(model: ModelProto, path: str | None) -> None:
    runtime = _runtime_ops(model)
    if runtime:
        model, path = _checkable(model, runtime), None
    try:
        if path is not None:  # the checker reads the file itself: no serialization of the proto in Python
            onnx.checker.check_model(path)
        elif is_large(model):
            with tempfile.TemporaryDirectory() as tmp:
                target = os.path.join(tmp, "model.onnx")
                write_external(model, target, "model.data")
                onnx.checker.check_model(target)
        else:
            onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise ModelError(f"onnx.checker rejected the model: {one_line(e)}") from None
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - the checker also raises plain C++ errors
        raise_if_out_of_memory(e)
        raise ModelError(f"onnx.checker rejected the model: {one_line(e)}") from None


def _fix_input_shapes(model: ModelProto, input_shapes: Mapping[str, Sequence[int]] | None) -> None:
    graph = model.graph
    inits = {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
    inputs = [vi for vi in graph.input if vi.name not in inits]
    names = [vi.name for vi in inputs]
    given = dict(input_shapes or {})
    for name in given:
        if name not in names:
            kind = "an initializer" if name in inits else "not a graph input"
            raise ModelError(f"a shape was given for '{name}', which is {kind} (inputs: {', '.join(names) or 'none'})")
    for vi in inputs:
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            raise ModelError(f"input '{vi.name}' is a {kind or 'value of unknown type'}; tensat needs tensor inputs")
        tt = vi.type.tensor_type
        dims = list(tt.shape.dim) if tt.HasField("shape") else None
        if vi.name in given:
            try:
                want = [int(d) for d in given[vi.name]]
            except (TypeError, ValueError):
                raise ModelError(f"the shape given for input '{vi.name}' is not a list of integers") from None
            text = ",".join(map(str, want))
            if any(d < 1 for d in want):
                raise ModelError(f"the shape given for input '{vi.name}' ({text}) has a dimension below 1")
            if dims is not None and len(dims) != len(want):
                raise ModelError(
                    f"input '{vi.name}' has rank {len(dims)}, but the given shape {text} has rank {len(want)}"
                )
            for axis, (dim, value) in enumerate(zip(dims or [], want)):
                if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != value:
                    raise ModelError(
                        f"input '{vi.name}' has size {dim.dim_value} on axis {axis}, "
                        f"but the given shape {text} says {value}"
                    )
            tt.ClearField("shape")
            tt.shape.SetInParent()
            for value in want:
                tt.shape.dim.add().dim_value = value
            continue
        if dims is None:
            raise ModelError(
                f"input '{vi.name}' has an unknown rank; pass its shape, e.g. --input-shape {vi.name}=1,3,224,224"
            )


def _infer(model: ModelProto) -> None:
    """Run shape inference (with data propagation) and store its value_info and output types in `model`."""
    light = light_copy(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:  # noqa: BLE001 - inference raises several C++ error types
        raise_if_out_of_memory(e)
        raise ModelError(f"shape inference failed: {one_line(e)}") from None
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    for out, inf in zip(model.graph.output, inferred.graph.output):
        if inf.type.WhichOneof("value"):
            out.type.CopyFrom(inf.type)


def load_model(
    source: str | os.PathLike[str] | ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    check: bool = True,
    keep_external: bool = False,
    size: int = SIZE,
) -> ModelProto:
    """Read (path or proto), validate, fix input shapes and shape-infer a model; errors are one-line ModelErrors.

    Without `check`, onnx.checker is skipped (a second on a model of 100M weights): for a model tensat has just
    exported itself, whose structure the other checks still cover. External data is read only from the model's own
    directory. The result holds all weights in memory, or with `keep_external` leaves external data on disk, the
    directory it lies in recorded in the proto (`tensat.onnx.external.external_dir`: the importer maps it, sessions
    read it from there, `save_model` copies it), so that a large model's weights do not pass through Python. Every
    graph input has a concrete shape, its nodes are in topological order (sorted before the checker, which
    rejects any other order) and `graph.value_info` holds the inferred types.
    """
    model, base_dir, path = _read(source)
    where = f"'{path}'" if path else "the given proto"
    _check_basic(model, where)
    _check_opsets(model)
    repaired = _check_structure(model.graph) | _constant_initializers(model)
    external = _check_external(model, base_dir)
    if check:  # the file itself is checked, unless the proto read from it has just been repaired
        if repaired and external:  # the repaired proto is checked with its weights in it
            _load_external(model, base_dir)
            external = False
        _run_checker(model, None if repaired else path)
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as e:  # noqa: BLE001
            raise_if_out_of_memory(e)
            raise ModelError(f"cannot inline the model's local functions: {one_line(e)}") from None
        del model.functions[:]
    dims = input_dims(model)
    symbolic = any(isinstance(d, str) for shape in dims.values() for d in shape)
    if symbolic:  # the shapes given; the other symbolic dims at 1 (a batch) or `size` (`representative`)
        input_shapes = representative(model, input_shapes, size)
    _fix_input_shapes(model, input_shapes)
    if symbolic:  # optimized at one shape, written back with these (`tensat.onnx.symbolic.generalize`)
        kept = [p for p in model.metadata_props if p.key != SYMBOLIC_DIMS]
        del model.metadata_props[:]
        model.metadata_props.extend(kept)
        model.metadata_props.add(key=SYMBOLIC_DIMS, value=json.dumps(dims))
    _infer(model)
    if external and keep_external:
        set_external_dir(model, base_dir)
    elif external:
        _load_external(model, base_dir)
        set_external_dir(model, None)
    return model


def given_model(source: str | os.PathLike[str] | ModelProto) -> ModelProto:
    """The model as given, read again and left as it is (no shapes fixed, nothing sorted, inlined or inferred), its
    external data on disk where it has some (`external_dir`): what a run that changes nothing returns."""
    model, base_dir, _ = _read(source)
    if base_dir is not None and any(has_external(t) for t in model_tensors(model)):
        set_external_dir(model, base_dir)
    return model


SYMBOLIC_DIMS = "tensat.symbolic_dims"  # metadata key: the input dims of a model read with symbolic ones, as given


def symbolic_dims(model: ModelProto) -> dict[str, list[int | str]] | None:
    """The input dims `model` was given with, where `load_model` fixed symbolic ones (None where it had none)."""
    text = next((p.value for p in model.metadata_props if p.key == SYMBOLIC_DIMS), None)
    return json.loads(text) if text is not None else None


def _load_external(model: ModelProto, base_dir: str | None) -> None:
    assert base_dir is not None  # _check_external refuses external data of a model not read from a file
    try:
        onnx.external_data_helper.load_external_data_for_model(model, base_dir)
    except Exception as e:  # noqa: BLE001
        raise_if_out_of_memory(e)
        raise ModelError(f"cannot read external data: {one_line(e)}") from None
