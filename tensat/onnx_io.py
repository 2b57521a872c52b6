"""ONNX import (ONNX model -> tensat IR) and export (IR -> ONNX model).

Import (`load_model`, `import_model`) validates a model, fixes its input shapes, runs shape inference, folds every
constant subgraph into weights and lowers each ONNX node through the `IMPORTERS` table; a node tensat does not
model (another op, another domain, non-float32 data, unsupported attributes) becomes `opaque` nodes that keep the
ONNX node verbatim. Export (`export_model`) folds weight-only subgraphs into initializers and emits each IR node
through the `EXPORTERS` table for the source model's opset.

Opaque keys are `"<OpType>_<node index>"`, followed by `"@i,j"` when the ONNX node had empty (omitted optional)
inputs at positions i, j before its last input. A node whose subgraph attributes (If/Loop/Scan bodies) read tensors
of the enclosing graph has those references renamed to `__tensat_outer_<k>` inside the stored attributes and the
captured tensors appended to its IR inputs; the exporter renames them back to whatever the inputs are called then.
"""

from __future__ import annotations

import heapq
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
import onnx.inliner
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, helper, numpy_helper

from tensat import ops
from tensat._version import __version__
from tensat.errors import ModelError, TensatError
from tensat.files import atomic_write_bytes, fsync_dir
from tensat.ir import FLOAT, Graph, OpaqueSpec

MIN_OPSET = 7
MAX_IR_VERSION = 13
PROTO_LIMIT = 2**31 - 2**26  # protobuf's 2 GiB message limit, with headroom for everything but tensors
_LARGE_TENSOR = 1 << 20  # tensors above this many bytes are stripped from the copy used for shape inference
_OUTER = "__tensat_outer_"
_OUTER_RE = re.compile(r"^__tensat_outer_(\d+)$")
_NONDETERMINISTIC = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
}

# ---------------------------------------------------------------------------------------------------------------
# Small helpers


def _one_line(text: object, limit: int = 300) -> str:
    """The first non-empty line of `text`, shortened: error messages stay one line."""
    for line in str(text).splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return type(text).__name__ if isinstance(text, BaseException) else "unknown error"


def _dtype_name(elem_type: int) -> str:
    """IR dtype string (numpy's name where numpy has one) for an ONNX element type."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        return TensorProto.DataType.Name(elem_type).lower()


_ELEM_TYPES: dict[str, int] = {}
for _code in TensorProto.DataType.values():
    if _code != TensorProto.UNDEFINED:
        _ELEM_TYPES.setdefault(_dtype_name(_code), _code)


def _elem_type(dtype: str) -> int:
    """ONNX element type for an IR dtype string."""
    try:
        return _ELEM_TYPES[dtype]
    except KeyError:
        raise ModelError(f"tensor type '{dtype}' has no ONNX element type") from None


def _label(node: NodeProto, index: int) -> str:
    name = f"'{node.name}'" if node.name else f"#{index}"
    domain = f"{node.domain}." if node.domain not in ("", "ai.onnx") else ""
    return f"node {name} ({domain}{node.op_type})"


def _norm_domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def _opsets(model: ModelProto) -> dict[str, int]:
    out: dict[str, int] = {}
    for imp in model.opset_import:
        out[_norm_domain(imp.domain)] = int(imp.version)
    return out


def ir_version_for(opsets: Mapping[str, int], dtypes: Sequence[str] = ()) -> int:
    """The IR version matching `opsets` (onnx's VERSION_TABLE), raised for newer tensor types, capped at 13.

    At least 4: opsets 7-8 shipped with IR 3, which requires every initializer to be listed as a graph input."""
    ids = [helper.make_opsetid(d, v) for d, v in sorted(opsets.items())]
    version = helper.find_min_ir_version_for(ids, ignore_unknown=True)
    for dtype in dtypes:
        if dtype.startswith("float8"):
            version = max(version, 9)
        elif dtype in ("int4", "uint4"):
            version = max(version, 10)
        elif dtype.startswith("float4"):
            version = max(version, 11)
    return min(max(version, 4), MAX_IR_VERSION)


def _subgraphs(attr: AttributeProto) -> list[GraphProto]:
    if attr.type == AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def _all_tensors(graph: GraphProto) -> list[TensorProto]:
    """Every TensorProto in `graph`: initializers, sparse parts, node attributes, recursively into subgraphs."""
    out = list(graph.initializer)
    for sp in graph.sparse_initializer:
        out += [sp.values, sp.indices]
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                out.append(attr.t)
            out += list(attr.tensors)
            if attr.HasField("sparse_tensor"):
                out += [attr.sparse_tensor.values, attr.sparse_tensor.indices]
            for sub in _subgraphs(attr):
                out += _all_tensors(sub)
    return out


def _model_tensors(model: ModelProto) -> list[TensorProto]:
    out = _all_tensors(model.graph)
    for fn in model.functions:
        for node in fn.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    out.append(attr.t)
                out += list(attr.tensors)
                for sub in _subgraphs(attr):
                    out += _all_tensors(sub)
    return out


def _has_external(tensor: TensorProto) -> bool:
    return tensor.HasField("data_location") and tensor.data_location == TensorProto.EXTERNAL


def _sparse_to_array(sp: onnx.SparseTensorProto) -> np.ndarray:
    values = numpy_helper.to_array(sp.values)
    indices = numpy_helper.to_array(sp.indices).astype(np.int64)
    dims = tuple(int(d) for d in sp.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense


def _free_names(graph: GraphProto) -> list[str]:
    """Names a (sub)graph reads from enclosing scopes, in order of first use."""
    bound = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    bound |= {s.values.name for s in graph.sparse_initializer}
    free: list[str] = []

    def use(name: str) -> None:
        if name and name not in bound and name not in free:
            free.append(name)

    for node in graph.node:
        for name in node.input:
            use(name)
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                for name in _free_names(sub):
                    use(name)
        bound.update(node.output)
    for vi in graph.output:
        use(vi.name)
    return free


def _rename_free(graph: GraphProto, mapping: Mapping[str, str]) -> None:
    """Rename, in place, references in `graph` to enclosing-scope names per `mapping` (respecting shadowing)."""
    bound = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    bound |= {s.values.name for s in graph.sparse_initializer}
    live = {k: v for k, v in mapping.items() if k not in bound}
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in live:
                node.input[k] = live[name]
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                _rename_free(sub, live)
        for out in node.output:
            live.pop(out, None)
    for vi in graph.output:
        if vi.name in live:
            vi.name = live[vi.name]


def _onnx_schema(op_type: str, domain: str, opset: int) -> Any:
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # noqa: BLE001 - unknown op or domain: no schema
        return None


# ---------------------------------------------------------------------------------------------------------------
# Running single nodes in onnxruntime (constant folding of ops tensat does not model, shapes of custom ops)


def _ort_session(model: ModelProto) -> Any:
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _single_node_model(node: NodeProto, arrays: Sequence[np.ndarray | None], opsets: Mapping[str, int]) -> ModelProto:
    """A model holding only `node`, its non-empty inputs as graph inputs `i<k>` and its outputs as `o<k>`."""
    copy = NodeProto()
    copy.CopyFrom(node)
    inputs = []
    for k, array in enumerate(arrays):
        if array is None:
            copy.input[k] = ""
            continue
        copy.input[k] = f"i{k}"
        inputs.append(helper.make_tensor_value_info(f"i{k}", helper.np_dtype_to_tensor_dtype(array.dtype), array.shape))
    outputs = []
    for k, name in enumerate(node.output):
        if name:
            copy.output[k] = f"o{k}"
            vi = onnx.ValueInfoProto()
            vi.name = f"o{k}"
            outputs.append(vi)
    graph = helper.make_graph([copy], "single", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(opsets.items())])
    model.ir_version = ir_version_for(opsets)
    return model


def run_node(
    node: NodeProto, arrays: Sequence[np.ndarray | None], opsets: Mapping[str, int]
) -> list[np.ndarray | None]:
    """Run one ONNX node in onnxruntime on concrete inputs (None = omitted input); None for omitted outputs.

    Raises TypeError when an output is not a tensor (a sequence or map cannot become a weight)."""
    model = _single_node_model(node, arrays, opsets)
    feeds = {f"i{k}": a for k, a in enumerate(arrays) if a is not None}
    results = iter(_ort_session(model).run(None, feeds))
    out: list[np.ndarray | None] = []
    for name in node.output:
        if not name:
            out.append(None)
            continue
        value = next(results)
        if not isinstance(value, np.ndarray):
            raise TypeError(f"output '{name}' is a {type(value).__name__}, not a tensor")
        out.append(value)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Loading and validation


def _read(source: Any) -> tuple[ModelProto, str | None, str | None]:
    """The model proto (external data not loaded), its directory and its path (None for an in-memory proto)."""
    if isinstance(source, ModelProto):
        model = ModelProto()
        model.CopyFrom(source)
        return model, None, None
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
        raise ModelError(f"cannot read model file '{path}': {_one_line(e.strerror or e)}") from None
    if size == 0:
        raise ModelError(f"model file '{path}' is empty")
    try:
        model = onnx.load(path, load_external_data=False)
    except OSError as e:
        raise ModelError(f"cannot read model file '{path}': {_one_line(e.strerror or e)}") from None
    except Exception as e:  # noqa: BLE001 - protobuf decode errors have no common base class
        raise ModelError(
            f"'{path}' is not an ONNX model or is truncated (protobuf parse failed: {_one_line(e)})"
        ) from None
    return model, os.path.dirname(os.path.abspath(path)), path


def _check_basic(model: ModelProto, where: str) -> None:
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        missing = "ir_version" if model.ir_version <= 0 else "graph" if not model.HasField("graph") else "opset_import"
        raise ModelError(f"{where} is not an ONNX model (no {missing}; truncated or not an ONNX file?)")


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
    opsets = _opsets(model)
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
        ops_of = _DOMAINS.get(_norm_domain(node.domain))
        if _norm_domain(node.domain) in local or ops_of is None:
            continue
        if node.op_type not in ops_of:
            raise ModelError(f"{_label(node, index)}: onnxruntime has no operator {node.domain}.{node.op_type}")


def _check_structure(graph: GraphProto) -> None:
    """Dangling inputs and cycles, reported by name (before the checker's less specific messages); nodes out of
    topological order are sorted in place (the checker rejects them, onnxruntime and the zoo's files do not)."""
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
                raise ModelError(f"{_label(node, index)} reads tensor '{name}', which nothing produces")
    for out in graph.output:
        if out.name not in available and out.name not in producer:
            raise ModelError(f"graph output '{out.name}' is not produced by any node")
    deps: list[set[int]] = []
    for node in graph.node:
        names = [n for n in node.input if n]
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                names += _free_names(sub)
        deps.append({producer[n] for n in names if n in producer and n not in available})
    order = _topological_order(deps)
    if len(order) < len(graph.node):
        stuck = _on_cycle(deps, set(range(len(graph.node))) - set(order))
        raise ModelError(f"the graph has a cycle through {_label(graph.node[stuck], stuck)}")
    if order != sorted(order):
        nodes = [graph.node[i] for i in order]
        del graph.node[:]
        graph.node.extend(nodes)


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
    for tensor in _model_tensors(model):
        if not _has_external(tensor):
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


def _copy_with_initializers(model: ModelProto, replace: Callable[[TensorProto], TensorProto | None]) -> ModelProto:
    """A copy of `model` whose initializers are `replace(t)` (None keeps a copy of `t`); big data is not copied
    twice, so this works for models over 2 GiB."""
    out = ModelProto()
    _copy_fields(model, out, skip="graph")
    _copy_fields(model.graph, out.graph, skip="initializer")
    for tensor in model.graph.initializer:
        new = replace(tensor)
        out.graph.initializer.append(new if new is not None else tensor)
    return out


def _copy_fields(src: Any, dst: Any, skip: str) -> None:
    """Copy every set field of protobuf message `src` into `dst` except `skip`."""
    dst.SetInParent()
    for desc, value in src.ListFields():
        if desc.name == skip:
            continue
        if desc.is_repeated:
            getattr(dst, desc.name).extend(value)
        elif desc.message_type is not None:
            getattr(dst, desc.name).CopyFrom(value)
        else:
            setattr(dst, desc.name, value)


def _stub(tensor: TensorProto, location: str, offset: int = 0, length: int | None = None) -> TensorProto:
    """`tensor`'s name, type and dims with its data declared external at `location`."""
    stub = TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims, doc_string=tensor.doc_string)
    stub.data_location = TensorProto.EXTERNAL
    stub.external_data.add(key="location", value=location)
    if length is not None:
        stub.external_data.add(key="offset", value=str(offset))
        stub.external_data.add(key="length", value=str(length))
    return stub


def _light_copy(model: ModelProto) -> ModelProto:
    """A copy without the data of large initializers (shape inference needs dims and small constants only)."""
    return _copy_with_initializers(
        model, lambda t: _stub(t, "__stripped__") if not _has_external(t) and _tensor_bytes(t) > _LARGE_TENSOR else None
    )


def _write_external(model: ModelProto, path: str, location: str) -> None:
    """Write `model` to `path` with its large initializers' data in `location` (same directory), fsynced;
    `model` is not modified."""
    data_path = os.path.join(os.path.dirname(path), location)
    offset = 0
    with open(data_path, "wb") as data:

        def replace(tensor: TensorProto) -> TensorProto | None:
            nonlocal offset
            if _has_external(tensor) or _tensor_bytes(tensor) <= _LARGE_TENSOR:
                return None
            raw = tensor.raw_data if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).tobytes()
            pad = -offset % 4096
            data.write(b"\0" * pad)
            offset += pad
            data.write(raw)
            stub = _stub(tensor, location, offset, len(raw))
            offset += len(raw)
            return stub

        light = _copy_with_initializers(model, replace)
        data.flush()
        os.fsync(data.fileno())
    with open(path, "wb") as f:
        f.write(light.SerializeToString())
        f.flush()
        os.fsync(f.fileno())


def _tensor_bytes(tensor: TensorProto) -> int:
    """Size of a tensor's data from its dims and type (cheap: protobuf's ByteSize serializes the data)."""
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 8
    return math.prod(tensor.dims) * itemsize


def _is_large(model: ModelProto) -> bool:
    """Whether `model` may exceed protobuf's 2 GiB limit (estimated from its tensors' sizes)."""
    return sum(_tensor_bytes(t) for t in _model_tensors(model) if not _has_external(t)) > PROTO_LIMIT


def _run_checker(model: ModelProto, path: str | None, external: bool) -> None:
    try:
        if path is not None and external:
            onnx.checker.check_model(path)
        elif _is_large(model):
            with tempfile.TemporaryDirectory() as tmp:
                target = os.path.join(tmp, "model.onnx")
                _write_external(model, target, "model.data")
                onnx.checker.check_model(target)
        else:
            onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise ModelError(f"onnx.checker rejected the model: {_one_line(e)}") from None
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - the checker also raises plain C++ errors
        raise ModelError(f"onnx.checker rejected the model: {_one_line(e)}") from None


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
        dynamic = [d for d in dims if not (d.HasField("dim_value") and d.dim_value > 0)]
        if dynamic:
            first = dynamic[0]
            what = first.dim_param if first.HasField("dim_param") and first.dim_param else "unknown size"
            if first.HasField("dim_value") and first.dim_value == 0:
                what = "size 0"
            example = ",".join(str(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else "1" for d in dims)
            raise ModelError(
                f"input '{vi.name}' has a dynamic dimension ({what}); "
                f"pass its shape, e.g. --input-shape {vi.name}={example}"
            )


def _infer(model: ModelProto) -> None:
    """Run shape inference (with data propagation) and store its value_info and output types in `model`."""
    light = _light_copy(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:  # noqa: BLE001 - inference raises several C++ error types
        raise ModelError(f"shape inference failed: {_one_line(e)}") from None
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    for out, inf in zip(model.graph.output, inferred.graph.output):
        if inf.type.WhichOneof("value"):
            out.type.CopyFrom(inf.type)


def load_model(
    source: str | os.PathLike[str] | ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> ModelProto:
    """Read (path or proto), validate, fix input shapes and shape-infer a model; errors are one-line ModelErrors.

    External data is read only from the model's own directory. The result holds all weights in memory, every
    graph input has a concrete shape, its nodes are in topological order (sorted before the checker, which
    rejects any other order) and `graph.value_info` holds the inferred types.
    """
    model, base_dir, path = _read(source)
    where = f"'{path}'" if path else "the given proto"
    _check_basic(model, where)
    _check_opsets(model)
    _check_structure(model.graph)
    external = _check_external(model, base_dir)
    _run_checker(model, path, external)
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as e:  # noqa: BLE001
            raise ModelError(f"cannot inline the model's local functions: {_one_line(e)}") from None
        del model.functions[:]
    _fix_input_shapes(model, input_shapes)
    _infer(model)
    if external:
        try:
            onnx.external_data_helper.load_external_data_for_model(model, base_dir)
        except Exception as e:  # noqa: BLE001
            raise ModelError(f"cannot read external data: {_one_line(e)}") from None
    return model


# ---------------------------------------------------------------------------------------------------------------
# Import: ONNX -> IR


class _Unsupported(Exception):
    """This node cannot be lowered to IR ops; it becomes opaque."""


@dataclass
class _Importer:
    """Lowers one loaded model to a Graph; handlers in IMPORTERS call back into it."""

    model: ModelProto
    graph: Graph = field(init=False)
    types: dict[str, tuple[str, tuple[int, ...] | None]] = field(default_factory=dict)
    env: dict[str, int] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    opsets: dict[str, int] = field(default_factory=dict)
    node: NodeProto = field(default_factory=NodeProto)
    index: int = 0
    folding: bool = False
    release: bool = False
    attrs: dict[str, Any] = field(default_factory=dict)
    _temp: int = 0

    def __post_init__(self) -> None:
        self.opsets = _opsets(self.model)
        self.opset = self.opsets[""]
        self.graph = Graph(opset_imports=dict(self.opsets), name=self.model.graph.name or "tensat")
        g = self.model.graph
        for vi in list(g.value_info) + list(g.output) + list(g.input):
            self.types[vi.name] = _value_type(vi)

    # -- values -------------------------------------------------------------------------------------------------

    def run(self) -> Graph:
        g = self.model.graph
        for tensor in g.initializer:
            self.consts[tensor.name] = numpy_helper.to_array(tensor).copy()
            if self.release:
                tensor.ClearField("raw_data")  # this proto is private: free its copy of the data early
        for sp in g.sparse_initializer:
            self.consts[sp.values.name] = _sparse_to_array(sp)
        for vi in g.input:
            if vi.name not in self.consts:
                dtype, shape = self.types[vi.name]
                self.env[vi.name] = self.graph.input(vi.name, shape or (), dtype)
        for index, node in enumerate(g.node):
            self._lower(index, node)
        for vi in g.output:
            if vi.type.WhichOneof("value") not in (None, "tensor_type"):
                raise ModelError(f"graph output '{vi.name}' is a {vi.type.WhichOneof('value')}; tensat needs tensors")
            self.graph.output(vi.name, self.value_of(vi.name))
        return self.graph.compact()

    def value_of(self, name: str) -> int:
        """IR id of tensor `name` (a weight node for a constant)."""
        if name not in self.env:
            if name not in self.consts:
                raise ModelError(f"tensor '{name}' is read but never produced")
            self.env[name] = self.graph.weight(self.consts[name], name)
        return self.env[name]

    def present(self, k: int) -> bool:
        return k < len(self.node.input) and bool(self.node.input[k])

    def value(self, k: int) -> int:
        return self.value_of(self.node.input[k])

    def data(self, k: int, any_dtype: bool = False) -> int:
        """IR id of data input `k`; only float32 is modelled (any dtype while constant folding `any_dtype` ops)."""
        if not self.present(k):
            raise _Unsupported(f"input {k} missing")
        v = self.value(k)
        if self.graph.nodes[v].dtype != FLOAT and not (self.folding and any_dtype):
            raise _Unsupported(f"input {k} is {self.graph.nodes[v].dtype}")
        return v

    def param(self, k: int) -> np.ndarray:
        """Constant input `k` (shape, axes, split sizes...); a computed one makes the node opaque."""
        if not self.present(k) or self.node.input[k] not in self.consts:
            raise _Unsupported(f"input {k} is not a constant")
        return self.consts[self.node.input[k]]

    def shape(self, v: int) -> tuple[int, ...]:
        return self.graph.nodes[v].shape

    def weight(self, array: np.ndarray) -> int:
        self._temp += 1
        base = self.node.output[0] if self.node.output and self.node.output[0] else f"node{self.index}"
        return self.graph.weight(np.asarray(array), f"{base}__{self._temp}")

    def op(self, name: str, inputs: Sequence[int], **attrs: Any) -> int:
        """Add IR op `name`; evaluated at once into a weight when every input is a weight."""
        nodes = self.graph.nodes
        if all(nodes[i].op == "weight" for i in inputs):
            arrays = [self.graph.weights[nodes[i].attr["name"]] for i in inputs]
            if name not in ("add", "mul", "matmul"):
                ops.shape_of(name, [a.shape for a in arrays], attrs)
            try:
                value = ops.evaluate(name, arrays, attrs)
            except ValueError as e:
                raise ops.ShapeError(str(e)) from None
            return self.weight(value)
        if name in ("add", "mul"):
            rank = max(len(nodes[i].shape) for i in inputs)
            fixed = []
            for i in inputs:
                n = nodes[i]
                if n.op == "weight" and len(n.shape) < rank:
                    array = self.graph.weights[n.attr["name"]]
                    i = self.weight(array.reshape((1,) * (rank - array.ndim) + array.shape))
                fixed.append(i)
            inputs = fixed
        return self.graph.add(name, inputs, **attrs)

    def reshape(self, v: int, shape: Sequence[int]) -> int:
        shape = tuple(int(d) for d in shape)
        if self.shape(v) == shape:
            return v
        return self.op("reshape", [v], shape=shape)

    def slice(self, v: int, axis: int, start: int, size: int) -> int:
        if start == 0 and size == self.shape(v)[axis]:
            return v
        return self.op("slice", [v], axis=axis, start=start, size=size)

    # -- nodes --------------------------------------------------------------------------------------------------

    def _lower(self, index: int, node: NodeProto) -> None:
        self.node, self.index = node, index
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        domain = _norm_domain(node.domain)
        has_graph = any(_subgraphs(a) for a in node.attribute)
        handler = IMPORTERS.get(node.op_type) if domain == "" else None
        inputs = [n for n in node.input if n]
        if not has_graph and node.op_type not in _NONDETERMINISTIC and all(n in self.consts for n in inputs):
            arrays = self._fold(handler)
            if arrays is not None:
                for name, array in zip(node.output, arrays):
                    if name and array is not None:
                        self.consts[name] = array
                return
        outs: list[Any] | None = None
        if handler is not None:
            try:
                outs = handler(self, node)
                self._check_shapes(outs)
            except (_Unsupported, ops.ShapeError, KeyError, ValueError):
                outs = None
        if outs is None:
            outs = self._opaque(has_graph)
        for name, v in zip(node.output, outs):
            if not name or v is None:
                continue
            if isinstance(v, np.ndarray):
                self.consts[name] = v
            else:
                self.env[name] = v

    def _fold(self, handler: Callable[..., list[Any]] | None) -> list[np.ndarray | None] | None:
        """Values of a node whose inputs are all constant: numpy through the IR ops, else onnxruntime."""
        node = self.node
        if node.op_type == "Constant" and _norm_domain(node.domain) == "" and len(node.attribute) == 1:
            attr = node.attribute[0]
            simple = {
                "value_float": np.float32,
                "value_floats": np.float32,
                "value_int": np.int64,
                "value_ints": np.int64,
            }
            if attr.name == "value":
                return [numpy_helper.to_array(attr.t)]
            if attr.name in simple:
                return [np.asarray(self.attrs[attr.name], dtype=simple[attr.name])]
        if handler is not None:
            self.folding = True
            try:
                outs = handler(self, node)
                arrays = []
                for v in outs:
                    if v is None or isinstance(v, np.ndarray):
                        arrays.append(v)
                    elif self.graph.nodes[v].op == "weight":
                        arrays.append(self.graph.weights[self.graph.nodes[v].attr["name"]])
                    else:
                        raise _Unsupported("not folded")
                return arrays
            except (_Unsupported, ops.ShapeError, ValueError, TypeError):
                pass
            finally:
                self.folding = False
        arrays_in = [self.consts[n] if n else None for n in node.input]
        try:
            return run_node(node, arrays_in, self.opsets)
        except Exception:  # noqa: BLE001 - whatever onnxruntime refuses stays a node
            return None

    def _check_shapes(self, outs: list[Any]) -> None:
        """A lowered node must agree with shape inference; disagreement means keep the ONNX node as is."""
        for name, v in zip(self.node.output, outs):
            if not name or v is None:
                continue
            shape = v.shape if isinstance(v, np.ndarray) else self.shape(v)
            known = self.types.get(name, ("", None))[1]
            if known is not None and tuple(shape) != known:
                raise _Unsupported(f"shape {shape} != inferred {known}")

    def _opaque(self, has_graph: bool) -> list[int | None]:
        node = self.node
        empty = [k for k, n in enumerate(node.input) if not n]
        last = max((k for k, n in enumerate(node.input) if n), default=-1)
        empty = [k for k in empty if k < last]
        inputs = [self.value_of(n) for n in node.input if n]
        attributes = list(node.attribute)
        if has_graph:
            free: list[str] = []
            for attr in attributes:
                for sub in _subgraphs(attr):
                    free += [n for n in _free_names(sub) if n not in free]
            if free:
                mapping = {n: f"{_OUTER}{k}" for k, n in enumerate(free)}
                attributes = [AttributeProto.FromString(a.SerializeToString()) for a in attributes]
                for attr in attributes:
                    for sub in _subgraphs(attr):
                        _rename_free(sub, mapping)
                for name in free:
                    if name not in self.env and name not in self.consts:
                        raise ModelError(
                            f"{_label(node, self.index)} reads tensor '{name}' in a subgraph, which nothing produces"
                        )
                    inputs.append(self.value_of(name))
        key = f"{node.op_type}_{self.index}" + (f"@{','.join(map(str, empty))}" if empty else "")
        self.graph.opaque[key] = OpaqueSpec(
            node.op_type,
            _norm_domain(node.domain),
            tuple(a.SerializeToString() for a in attributes),
            len(node.output),
            node.name,
        )
        outs: list[int | None] = []
        unknown = [k for k, n in enumerate(node.output) if n and not _concrete(self.types.get(n))]
        local = self._local_types() if unknown else {}
        for k, name in enumerate(node.output):
            if not name:
                outs.append(None)
                continue
            dtype, shape = self.types.get(name) or ("", None)
            if not _concrete((dtype, shape)):
                dtype, shape = local.get(k, (dtype, shape))
            if not _concrete((dtype, shape)):
                raise ModelError(
                    f"{_label(node, self.index)}: the shape of its output '{name}' is unknown after shape inference "
                    "(it depends on data); tensat needs static shapes"
                )
            outs.append(self.graph.add("opaque", inputs, key=key, index=k, shape=shape, dtype=dtype))
        return outs

    def _local_types(self) -> dict[int, tuple[str, tuple[int, ...] | None]]:
        """Output types of the current node from inference on a one-node model with known inputs and constants."""
        node = self.node
        arrays: list[np.ndarray | None] = []
        for name in node.input:
            if not name:
                arrays.append(None)
            elif name in self.consts:
                arrays.append(self.consts[name])
            else:
                n = self.graph.nodes[self.value_of(name)]
                try:
                    arrays.append(np.zeros(n.shape, dtype=np.dtype(n.dtype)))
                except TypeError:
                    return {}
        model = _single_node_model(node, arrays, self.opsets)
        consts = {f"i{k}" for k, name in enumerate(node.input) if name in self.consts}
        for vi in list(model.graph.input):
            if vi.name in consts:
                model.graph.initializer.append(numpy_helper.from_array(arrays[int(vi.name[1:])], vi.name))
        out: dict[int, tuple[str, tuple[int, ...] | None]] = {}
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
            for vi in inferred.graph.output:
                out[int(vi.name[1:])] = _value_type(vi)
        except Exception:  # noqa: BLE001
            pass
        if not all(_concrete(t) for t in out.values()) or not out:
            domain = _norm_domain(node.domain)
            if domain != "":  # other domains: onnx often cannot infer, onnxruntime can run them
                try:
                    for k, a in enumerate(run_node(node, arrays, self.opsets)):
                        if a is not None:
                            out[k] = (str(a.dtype), tuple(int(d) for d in a.shape))
                except Exception:  # noqa: BLE001
                    pass
        return out


def _value_type(vi: onnx.ValueInfoProto) -> tuple[str, tuple[int, ...] | None]:
    """(dtype, shape) of a value: shape None when unknown or symbolic; non-tensors get shape ()."""
    kind = vi.type.WhichOneof("value")
    if kind != "tensor_type":
        return (kind or "", () if kind else None)
    tt = vi.type.tensor_type
    dtype = _dtype_name(tt.elem_type) if tt.elem_type else ""
    if not tt.HasField("shape"):
        return dtype, None
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 1:
            return dtype, None
        dims.append(int(d.dim_value))
    return dtype, tuple(dims)


def _concrete(t: tuple[str, tuple[int, ...] | None] | None) -> bool:
    return t is not None and bool(t[0]) and t[1] is not None


# -- handlers: ONNX op type -> IR ----------------------------------------------------------------------------------


def _ints(values: Any) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise _Unsupported(f"axis {axis} out of range")
    return axis + rank if axis < 0 else axis


def _binary(op: str) -> Callable[[_Importer, NodeProto], list[Any]]:
    def lower(c: _Importer, node: NodeProto) -> list[Any]:
        return [c.op(op, [c.data(0, True), c.data(1, True)])]

    return lower


def _unary(op: str) -> Callable[[_Importer, NodeProto], list[Any]]:
    def lower(c: _Importer, node: NodeProto) -> list[Any]:
        return [c.op(op, [c.data(0)])]

    return lower


def _sub(c: _Importer, node: NodeProto) -> list[Any]:
    b = c.param(1)
    if b.dtype != np.float32 and not c.folding:
        raise _Unsupported("non-float Sub")
    if b.dtype.kind not in "fi":
        raise _Unsupported("Sub of unsigned or other types")
    return [c.op("add", [c.data(0, True), c.weight(-b)])]


def _sum(c: _Importer, node: NodeProto) -> list[Any]:
    acc = c.data(0)
    for k in range(1, len(node.input)):
        acc = c.op("add", [acc, c.data(k)])
    return [acc]


def _gemm(c: _Importer, node: NodeProto) -> list[Any]:
    a, b = c.data(0), c.data(1)
    if len(c.shape(a)) != 2 or len(c.shape(b)) != 2:
        raise _Unsupported("Gemm needs 2-D operands")
    if c.attrs.get("transA", 0):
        a = c.op("transpose", [a], perm=(1, 0))
    if c.attrs.get("transB", 0):
        b = c.op("transpose", [b], perm=(1, 0))
    y = c.op("matmul", [a, b])
    alpha, beta = float(c.attrs.get("alpha", 1.0)), float(c.attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = c.op("mul", [y, c.weight(np.full((1, 1), alpha, dtype=np.float32))])
    if c.present(2) and beta != 0.0:
        if node.input[2] in c.consts:
            bias = c.param(2)
            if bias.dtype != np.float32:
                raise _Unsupported("non-float Gemm bias")
            cv = c.weight((bias * np.float32(beta)).astype(np.float32) if beta != 1.0 else bias)
        else:
            cv = c.data(2)
            if beta != 1.0:
                cv = c.op("mul", [cv, c.weight(np.full((1,) * len(c.shape(cv)), beta, dtype=np.float32))])
        y = c.op("add", [y, cv])
    return [y]


def _spatial_pads(
    c: _Importer, x: tuple[int, ...], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]
) -> tuple[int, int, int, int]:
    """Explicit (top, left, bottom, right) pads, resolving auto_pad."""
    auto = c.attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto == "NOTSET":
        pads = [int(p) for p in c.attrs.get("pads", [0, 0, 0, 0])]
        if len(pads) != 4:
            raise _Unsupported("pads rank")
        return pads[0], pads[1], pads[2], pads[3]
    if auto == "VALID":
        return 0, 0, 0, 0
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise _Unsupported(f"auto_pad {auto}")
    begin, end = [], []
    for size, k, s, d in zip(x[2:], kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return begin[0], begin[1], end[0], end[1]


def _conv(c: _Importer, node: NodeProto) -> list[Any]:
    x, w = c.data(0), c.data(1)
    sx, sw = c.shape(x), c.shape(w)
    if len(sx) != 4 or len(sw) != 4:
        raise _Unsupported("non-2-D conv")
    kernel = [int(k) for k in c.attrs.get("kernel_shape", sw[2:])]
    if tuple(kernel) != sw[2:]:
        raise _Unsupported("kernel_shape disagrees with weight")
    strides = [int(s) for s in c.attrs.get("strides", [1, 1])]
    dilations = [int(d) for d in c.attrs.get("dilations", [1, 1])]
    group = int(c.attrs.get("group", 1))
    pads = _spatial_pads(c, sx, kernel, strides, dilations)
    b = c.data(2) if c.present(2) else c.graph.weight(np.zeros(sw[0], dtype=np.float32), "zero_bias")
    return [c.op("conv2d", [x, w, b], strides=strides, pads=pads, dilations=dilations, group=group, act=ops.ACT_NONE)]


def _pool(kind: str) -> Callable[[_Importer, NodeProto], list[Any]]:
    def lower(c: _Importer, node: NodeProto) -> list[Any]:
        if len(node.output) > 1 and node.output[1]:
            raise _Unsupported("MaxPool indices")
        if c.attrs.get("ceil_mode", 0) or c.attrs.get("storage_order", 0):
            raise _Unsupported("ceil_mode / storage_order")
        if any(int(d) != 1 for d in c.attrs.get("dilations", [1, 1])):
            raise _Unsupported("dilated pooling")
        x = c.data(0)
        sx = c.shape(x)
        kernel = [int(k) for k in c.attrs["kernel_shape"]]
        if len(sx) != 4 or len(kernel) != 2:
            raise _Unsupported("non-2-D pooling")
        strides = [int(s) for s in c.attrs.get("strides", [1, 1])]
        pads = _spatial_pads(c, sx, kernel, strides, [1, 1])
        if kind == "maxpool":
            return [c.op("maxpool", [x], kernel=kernel, strides=strides, pads=pads)]
        cip = int(c.attrs.get("count_include_pad", 0))
        return [c.op("avgpool", [x], kernel=kernel, strides=strides, pads=pads, count_include_pad=cip)]

    return lower


def _global_avg(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0)
    if len(c.shape(x)) != 4:
        raise _Unsupported("GlobalAveragePool on non-4-D")
    return [c.op("globalavgpool", [x])]


def _concat(c: _Importer, node: NodeProto) -> list[Any]:
    parts = [c.data(k, True) for k in range(len(node.input))]
    axis = _axis(int(c.attrs["axis"]), len(c.shape(parts[0])))
    acc = parts[0]
    for p in parts[1:]:
        acc = c.op("concat", [acc, p], axis=axis)
    return [acc]


def _split(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0, True)
    shape = c.shape(x)
    axis = _axis(int(c.attrs.get("axis", 0)), len(shape))
    dim, n = shape[axis], len(node.output)
    if c.opset < 13:
        sizes = _ints(c.attrs["split"]) if "split" in c.attrs else None
    else:
        sizes = _ints(c.param(1)) if c.present(1) else None
    if sizes is None:
        if "num_outputs" in c.attrs:
            n = int(c.attrs["num_outputs"])
            chunk = -(-dim // n)
            sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
        else:
            if dim % n:
                raise _Unsupported("uneven split")
            sizes = [dim // n] * n
    if len(sizes) != len(node.output) or sum(sizes) != dim:
        raise _Unsupported("split sizes")
    outs, start = [], 0
    for size in sizes:
        outs.append(c.slice(x, axis, start, size))
        start += size
    return outs


def _slice(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0, True)
    shape = c.shape(x)
    if c.opset < 10:
        starts, ends = _ints(c.attrs["starts"]), _ints(c.attrs["ends"])
        axes = _ints(c.attrs["axes"]) if "axes" in c.attrs else list(range(len(starts)))
        steps = [1] * len(starts)
    else:
        starts, ends = _ints(c.param(1)), _ints(c.param(2))
        axes = _ints(c.param(3)) if c.present(3) else list(range(len(starts)))
        steps = _ints(c.param(4)) if c.present(4) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps) or any(s != 1 for s in steps):
        raise _Unsupported("strided slice")
    y = x
    for axis, start, end in zip(axes, starts, ends):
        axis = _axis(axis, len(shape))
        dim = shape[axis]
        start = min(max(start + dim if start < 0 else start, 0), dim)
        end = min(max(end + dim if end < 0 else end, 0), dim)
        if end <= start:
            raise _Unsupported("empty slice")
        y = c.slice(y, axis, start, end - start)
    return [y]


def _transpose(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0, True)
    rank = len(c.shape(x))
    perm = [int(p) for p in c.attrs.get("perm", list(range(rank))[::-1])]
    if perm == list(range(rank)):
        return [x]
    return [c.op("transpose", [x], perm=perm)]


def _reshape(c: _Importer, node: NodeProto) -> list[Any]:
    if not c.present(0):
        raise _Unsupported("input 0 missing")
    x = c.value(0)
    shape = c.shape(x)
    target = _ints(c.param(1))
    allowzero = int(c.attrs.get("allowzero", 0))
    if allowzero and 0 in target:
        raise _Unsupported("zero-size reshape")
    out = [shape[i] if d == 0 and i < len(shape) else d for i, d in enumerate(target)]
    if out.count(-1) > 1:
        raise _Unsupported("several -1")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or math.prod(shape) % known:
            raise _Unsupported("bad -1")
        out[out.index(-1)] = math.prod(shape) // known
    if tuple(out) == shape:  # a no-op on a tensor of any type (an exporter's view of an index tensor)
        return [x]
    return [c.reshape(c.data(0, True), out)]


def _flatten(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0, True)
    shape = c.shape(x)
    axis = int(c.attrs.get("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        raise _Unsupported("flatten axis")
    return [c.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])))]


def _squeeze(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0, True)
    shape = c.shape(x)
    if c.opset < 13:
        axes = _ints(c.attrs["axes"]) if "axes" in c.attrs else None
    else:
        axes = _ints(c.param(1)) if c.present(1) else None
    if axes is None:
        axes = [i for i, d in enumerate(shape) if d == 1]
    axes = {_axis(a, len(shape)) for a in axes}
    if any(shape[a] != 1 for a in axes):
        raise _Unsupported("squeeze of a non-1 dim")
    return [c.reshape(x, [d for i, d in enumerate(shape) if i not in axes])]


def _unsqueeze(c: _Importer, node: NodeProto) -> list[Any]:
    x = c.data(0, True)
    shape = c.shape(x)
    axes = _ints(c.attrs["axes"]) if c.opset < 13 else _ints(c.param(1))
    rank = len(shape) + len(axes)
    axes_set = {_axis(a, rank) for a in axes}
    if len(axes_set) != len(axes):
        raise _Unsupported("repeated axes")
    dims = iter(shape)
    return [c.reshape(x, [1 if i in axes_set else next(dims) for i in range(rank)])]


def _batchnorm(c: _Importer, node: NodeProto) -> list[Any]:
    if any(node.output[1:]) or int(c.attrs.get("training_mode", 0)):
        raise _Unsupported("training batchnorm")
    x = c.data(0)
    epsilon = float(c.attrs.get("epsilon", 1e-5))
    if not int(c.attrs.get("spatial", 1)):
        return [_batchnorm_per_activation(c, x, epsilon)]
    params = [c.data(k) for k in range(1, 5)]
    return [c.op("batchnorm", [x, *params], epsilon=epsilon)]


def _batchnorm_per_activation(c: _Importer, x: int, epsilon: float) -> int:
    """Opset 7-8 BatchNormalization with `spatial=0`: parameters shaped like one sample (C, D1, ...) normalize
    each activation; with constant parameters that is x * a + b (a, b folded here), which stays optimizable."""
    scale, shift, mean, var = (np.asarray(c.param(k), dtype=np.float64) for k in range(1, 5))
    sample = c.shape(x)[1:]
    if any(p.shape != sample for p in (scale, shift, mean, var)):
        raise _Unsupported("per-activation batchnorm parameters do not have the shape of one sample")
    a = scale / np.sqrt(var + epsilon)
    b = shift - mean * a
    y = c.op("mul", [x, c.weight(a.astype(np.float32).reshape((1, *sample)))])
    return c.op("add", [y, c.weight(b.astype(np.float32).reshape((1, *sample)))])


def _identity(c: _Importer, node: NodeProto) -> list[Any]:
    return [c.value(0)]


def _dropout(c: _Importer, node: NodeProto) -> list[Any]:
    """Inference Dropout: the data passes through; a mask that is read becomes a constant of the data's shape.

    From opset 12 the spec defines the inference mask as all true. Before, it leaves it open and onnxruntime (the
    runtime tensat verifies against) writes zeros (float zeros at opsets 7-9, where the mask has the data's type;
    false at 10-11), so that is the constant; an unread mask is dropped."""
    if c.present(2) and bool(np.asarray(c.param(2)).reshape(-1)[0]):
        raise _Unsupported("training dropout")
    x = c.value(0)
    if len(node.output) < 2 or not node.output[1]:
        return [x]
    dtype = np.dtype(np.bool_) if c.opset >= 10 else np.dtype(c.graph.nodes[x].dtype)
    fill = np.ones if c.opset >= 12 else np.zeros
    return [x, fill(c.shape(x), dtype=dtype)]


def _gather(c: _Importer, node: NodeProto) -> list[Any]:
    """Gather of one constant index: a slice of size 1, reshaped without the axis for a scalar index (taking one
    channel or row); any other index stays opaque."""
    x = c.data(0, True)
    index = c.param(1)
    if index.dtype.kind not in "iu" or index.size != 1 or index.ndim > 1:
        raise _Unsupported("Gather of several or non-integer indices")
    shape = c.shape(x)
    axis = _axis(int(c.attrs.get("axis", 0)), len(shape))
    k = int(index.reshape(-1)[0])
    if not -shape[axis] <= k < shape[axis]:
        raise _Unsupported("Gather index out of range")
    y = c.slice(x, axis, k % shape[axis], 1)
    if index.ndim == 0:
        y = c.reshape(y, shape[:axis] + shape[axis + 1 :])
    return [y]


def _shape(c: _Importer, node: NodeProto) -> list[Any]:
    shape = c.shape(c.value(0))
    rank = len(shape)
    start = int(c.attrs.get("start", 0))
    end = int(c.attrs.get("end", rank))
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return [np.asarray(shape[start:end], dtype=np.int64)]


def _size(c: _Importer, node: NodeProto) -> list[Any]:
    return [np.asarray(math.prod(c.shape(c.value(0))), dtype=np.int64)]


IMPORTERS: dict[str, Callable[[_Importer, NodeProto], list[Any]]] = {
    "Add": _binary("add"),
    "Mul": _binary("mul"),
    "Sub": _sub,
    "Sum": _sum,
    "MatMul": _binary("matmul"),
    "Gemm": _gemm,
    "Conv": _conv,
    "Relu": _unary("relu"),
    "Sigmoid": _unary("sigmoid"),
    "Tanh": _unary("tanh"),
    "MaxPool": _pool("maxpool"),
    "AveragePool": _pool("avgpool"),
    "GlobalAveragePool": _global_avg,
    "Concat": _concat,
    "Split": _split,
    "Slice": _slice,
    "Transpose": _transpose,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "BatchNormalization": _batchnorm,
    "Identity": _identity,
    "Dropout": _dropout,
    "Gather": _gather,
    "Shape": _shape,
    "Size": _size,
}
"""ONNX op type (default domain) -> lowering to IR. A handler returns one value (IR id or constant array) per
ONNX output, or raises _Unsupported / ops.ShapeError to keep the node as an opaque op."""


def import_model(
    source: str | os.PathLike[str] | ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Graph:
    """Load `source` (path or proto) and lower it to a tensat Graph (see `load_model` for validation)."""
    model = load_model(source, input_shapes)
    return _Importer(model, release=True).run()


# ---------------------------------------------------------------------------------------------------------------
# Export: IR -> ONNX


class _Namer:
    """Unique, deterministic tensor and node names."""

    def __init__(self, reserved: Sequence[str] = ()) -> None:
        self.used: set[str] = set(reserved)

    def __call__(self, base: str) -> str:
        base = base or "t"
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name


@dataclass
class _Exporter:
    """Builds the ONNX graph for one IR graph; exporters in EXPORTERS append nodes through it."""

    graph: Graph
    opset: int = 17
    nodes: list[NodeProto] = field(default_factory=list)
    initializers: list[TensorProto] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    consts: dict[int, np.ndarray] = field(default_factory=dict)
    domains: set[str] = field(default_factory=set)
    _int_consts: dict[tuple[int, ...], str] = field(default_factory=dict)
    _opaque_values: dict[tuple[str, tuple[int, ...]], list[np.ndarray | None] | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.opset = int(self.graph.opset_imports.get("", 17))
        g = self.graph
        self.live = g.live()
        reserved = [g.input_name(i) for i in g.input_ids] + [name for name, _ in g.outputs]
        self.namer = _Namer(reserved)
        self.node_namer = _Namer()

    # -- helpers used by exporters -------------------------------------------------------------------------------

    def tensor(self, i: int) -> str:
        """ONNX name of IR node `i`'s tensor."""
        return self.names[i]

    def emit(
        self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], base: str, domain: str = "", **attrs: Any
    ) -> NodeProto:
        node = helper.make_node(
            op_type, list(inputs), list(outputs), name=self.node_namer(base), domain=domain or None, **attrs
        )
        self.nodes.append(node)
        return node

    def int64(self, values: Sequence[int], base: str) -> str:
        """An int64 1-D initializer (shared between identical uses)."""
        key = tuple(int(v) for v in values)
        if key not in self._int_consts:
            name = self.namer(base)
            self.initializers.append(numpy_helper.from_array(np.asarray(key, dtype=np.int64), name))
            self._int_consts[key] = name
        return self._int_consts[key]

    # -- driver -------------------------------------------------------------------------------------------------

    def run(self) -> ModelProto:
        g = self.graph
        self._fold()
        self._name_outputs()
        uses: dict[int, int] = {}
        emitted = [i for i in self.live if not g.nodes[i].is_leaf and i not in self.consts]
        for i in emitted:
            for j in g.nodes[i].inputs:
                uses[j] = uses.get(j, 0) + 1
        self.uses = uses
        self.output_ids = {n for _, n in g.outputs}
        self.readers = self._consumers(emitted)
        self.gemms = self._find_gemms(emitted)
        self.squeezed = self._find_squeezable(emitted)
        for i in self.live:
            n = g.nodes[i]
            if n.op == "input":
                self.names[i] = n.attr["name"]
        self._materialize(emitted)
        for i in emitted:
            if i not in self.names:
                self.names[i] = self.namer(f"{g.nodes[i].op}_{i}")
        self.splits = self._find_splits(emitted)
        self.absorbed = self._find_concat_chains(emitted)
        self.opaque_done: set[tuple[str, tuple[int, ...]]] = set()
        self.opaque_groups: dict[tuple[str, tuple[int, ...]], dict[int, int]] = {}
        for i in emitted:
            n = g.nodes[i]
            if n.op == "opaque":
                self.opaque_groups.setdefault((n.attr["key"], n.inputs), {})[n.attr["index"]] = i
        fused = set(self.gemms.values())
        for i in emitted:
            n = g.nodes[i]
            if i in self.absorbed or i in fused or (n.op == "slice" and i in self.splits and self.splits[i] is None):
                continue
            if i in self.gemms:
                _ex_gemm(self, i)
                continue
            EXPORTERS[n.op](self, i)
        self._emit_output_aliases()
        return self._model()

    def _fold(self) -> None:
        """Evaluate every weight-only node (numpy; opaque ones in onnxruntime when possible)."""
        g = self.graph
        for i in self.live:
            n = g.nodes[i]
            if n.op == "weight":
                self.consts[i] = g.weights[n.attr["name"]]
            elif n.op == "input" or not n.inputs or not all(j in self.consts for j in n.inputs):
                continue
            elif n.op == "opaque":
                value = self._fold_opaque(i)
                if value is not None:
                    self.consts[i] = value
            else:
                value = ops.evaluate(n.op, [self.consts[j] for j in n.inputs], n.attr)
                try:
                    value = value.astype(np.dtype(n.dtype), copy=False)
                except TypeError:
                    pass
                self.consts[i] = value

    def _fold_opaque(self, i: int) -> np.ndarray | None:
        g = self.graph
        n = g.nodes[i]
        key = n.attr["key"]
        spec = g.opaque[key]
        if spec.op_type in _NONDETERMINISTIC or any(_subgraphs(AttributeProto.FromString(b)) for b in spec.attributes):
            return None
        group = (key, n.inputs)
        if group not in self._opaque_values:
            outputs = _output_names(g, spec, {k: f"y{k}" for k in range(spec.num_outputs)}, lambda k: f"y{k}")
            node, _ = _opaque_node(g, key, [f"x{k}" for k in range(len(n.inputs))], outputs)
            values = iter(self.consts[j] for j in n.inputs)
            arrays = [next(values) if name else None for name in node.input]
            try:
                self._opaque_values[group] = run_node(node, arrays, g.opset_imports)
            except Exception:  # noqa: BLE001 - leave it to run at inference
                self._opaque_values[group] = None
        results = self._opaque_values[group]
        return None if results is None or n.attr["index"] >= len(results) else results[n.attr["index"]]

    def _name_outputs(self) -> None:
        """Graph outputs name the tensors that compute them (first claim wins; others get Identity nodes)."""
        g = self.graph
        self.aliases: list[tuple[str, int]] = []
        claimed: dict[str, int] = {}
        for name, i in g.outputs:
            if name in claimed:
                if claimed[name] != i:
                    raise ModelError(f"graph output '{name}' names two different tensors")
                continue
            claimed[name] = i
            n = g.nodes[i]
            if n.op == "input":
                if n.attr["name"] != name:
                    self.aliases.append((name, i))
            elif i in self.names:
                self.aliases.append((name, i))
            else:
                self.names[i] = name

    def _materialize(self, emitted: Sequence[int]) -> None:
        """Initializers for constants read by computed nodes or named as outputs (zero conv biases dropped)."""
        g = self.graph
        needed: list[int] = []
        for i in emitted:
            n = g.nodes[i]
            ins = n.inputs[:2] if n.op == "conv2d" and self._zero_bias(i) else n.inputs
            needed += [j for j in ins if j in self.consts]
        needed += [i for _, i in g.outputs if i in self.consts]
        needed += [i for _, i in self.aliases if i in self.consts]
        for i in sorted(set(needed)):
            n = g.nodes[i]
            if i not in self.names:
                base = n.attr["name"] if n.op == "weight" else f"{n.op}_{i}_folded"
                self.names[i] = self.namer(base)
            array = self.consts[i]
            if i in self.squeezed:
                keep = 2 if any(g.nodes[k].op == "matmul" for k in self.readers.get(i, ())) else 1
                array = array.reshape(_without_leading_ones(array.shape, keep))
            self.initializers.append(numpy_helper.from_array(_contiguous(array), self.names[i]))

    def _consumers(self, emitted: Sequence[int]) -> dict[int, list[int]]:
        """Emitted nodes reading each node, in order."""
        readers: dict[int, list[int]] = {}
        for i in emitted:
            for j in self.graph.nodes[i].inputs:
                readers.setdefault(j, []).append(i)
        return readers

    def _find_squeezable(self, emitted: Sequence[int]) -> set[int]:
        """Constants that are a vector behind leading 1s read only as broadcast operands of Add/Mul, or a matrix
        behind leading 1s read only as the right operand of MatMuls, whose other operand has the output's rank.

        The importer gives a low-rank constant operand (a bias of shape (N,), a (K, N) weight of a batched product)
        the rank of the other operand, so the e-graph's shape rules stay simple; broadcasting makes the leading
        ones redundant, and onnxruntime's kernels and fusions (a 2-D packed weight, MatMul+Add into Gemm, bias
        fusions) look for the constant in its usual shape. Exported without them, the constant is what the
        exporter of the input model wrote. (Other constants keep their shape: a (1, T, C) position embedding
        stays as the input had it.)"""
        g = self.graph
        readers = self.readers
        out = set()
        for j, users in readers.items():
            if j not in self.consts or j in self.output_ids or not users:
                continue
            shape = self.consts[j].shape
            keep = 2 if any(g.nodes[i].op == "matmul" for i in users) else 1
            stripped = _without_leading_ones(shape, keep)
            if len(stripped) == len(shape) or len(stripped) != keep:
                continue
            ok = True
            for i in users:
                n = g.nodes[i]
                others = [k for k in n.inputs if k != j]
                if (
                    n.op not in ("add", "mul", "matmul")
                    or (n.op == "matmul" and n.inputs[0] == j)
                    or not others
                    or any(len(g.nodes[k].shape) != len(n.shape) for k in others)
                ):
                    ok = False
                    break
            if ok:
                out.add(j)
        return out

    def _find_gemms(self, emitted: Sequence[int]) -> dict[int, int]:
        """Add nodes that export with the MatMul they read as one Gemm: add id -> matmul id.

        A 2-D MatMul of a computed operand by a constant, read only by an Add of a constant bias that broadcasts
        to the product's shape: the importer lowers a Gemm to exactly this, and the Gemm is what onnxruntime runs
        fastest (it fuses MatMul+Add into Gemm itself where it can; exporting the Gemm keeps that fusion whatever
        shape the bias took in the e-graph)."""
        g = self.graph
        out: dict[int, int] = {}
        for i in emitted:
            n = g.nodes[i]
            if n.op != "add" or len(n.shape) != 2 or n.dtype != FLOAT:
                continue
            for m, bias in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
                mm = g.nodes[m]
                if (
                    mm.op == "matmul"
                    and m not in self.consts
                    and bias in self.consts
                    and self.uses.get(m) == 1
                    and m not in self.output_ids
                    and len(g.nodes[mm.inputs[0]].shape) == 2
                    and mm.inputs[0] not in self.consts
                    and mm.inputs[1] in self.consts
                    and len(self.consts[mm.inputs[1]].shape) == 2
                    and _broadcasts_to(self.consts[bias].shape, n.shape)
                ):
                    out[i] = m
                    break
        return out

    def _zero_bias(self, i: int) -> bool:
        b = self.graph.nodes[i].inputs[2]
        return b in self.consts and not np.any(self.consts[b])

    def _find_splits(self, emitted: Sequence[int]) -> dict[int, tuple[int, ...] | None]:
        """Slices partitioning one tensor along one axis: first slice id -> group, other members -> None."""
        g = self.graph
        groups: dict[tuple[int, int], list[int]] = {}
        for i in emitted:
            n = g.nodes[i]
            if n.op == "slice":
                groups.setdefault((n.inputs[0], n.attr["axis"]), []).append(i)
        out: dict[int, tuple[int, ...] | None] = {}
        for (src, axis), members in groups.items():
            if len(members) < 2:
                continue
            members.sort(key=lambda i: g.nodes[i].attr["start"])
            pos = 0
            for i in members:
                if g.nodes[i].attr["start"] != pos:
                    break
                pos += g.nodes[i].attr["size"]
            else:
                if pos == g.nodes[src].shape[axis]:
                    first = min(members)
                    out.update({i: None for i in members})
                    out[first] = tuple(members)
        return out

    def _find_concat_chains(self, emitted: Sequence[int]) -> set[int]:
        """Inner concats of a same-axis chain used only by the next concat (merged into one N-ary Concat)."""
        g = self.graph
        absorbed = set()
        for i in emitted:
            n = g.nodes[i]
            if n.op != "concat":
                continue
            for j in n.inputs:
                m = g.nodes[j]
                if (
                    m.op == "concat"
                    and j not in self.consts
                    and m.attr["axis"] == n.attr["axis"]
                    and self.uses.get(j) == 1
                    and j not in self.output_ids
                ):
                    absorbed.add(j)
        return absorbed

    def concat_operands(self, i: int) -> list[int]:
        out = []
        for j in self.graph.nodes[i].inputs:
            out += self.concat_operands(j) if j in self.absorbed else [j]
        return out

    def _emit_output_aliases(self) -> None:
        for name, i in self.aliases:
            self.emit("Identity", [self.tensor(i)], [name], f"output_{name}")

    def _model(self) -> ModelProto:
        g = self.graph
        inputs = [
            helper.make_tensor_value_info(g.input_name(i), _elem_type(g.nodes[i].dtype), list(g.nodes[i].shape))
            for i in g.input_ids
        ]
        outputs = [
            helper.make_tensor_value_info(name, _elem_type(g.nodes[i].dtype), list(g.nodes[i].shape))
            for name, i in g.outputs
        ]
        graph = helper.make_graph(self.nodes, g.name or "tensat", inputs, outputs, initializer=self.initializers)
        opsets = {"": self.opset}
        for domain in sorted(self.domains - {""}):
            opsets[domain] = int(g.opset_imports.get(domain, 1))
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
            producer_name="tensat",
            producer_version=__version__,
        )
        dtypes = sorted({n.dtype for n in g.nodes})
        model.ir_version = ir_version_for(opsets, dtypes)
        return model


def _opaque_node(graph: Graph, key: str, inputs: Sequence[str], outputs: Sequence[str]) -> tuple[NodeProto, int]:
    """Rebuild the ONNX node of opaque `key` reading `inputs` (explicit then captured); returns (node, #captured)."""
    spec = graph.opaque[key]
    attributes = [AttributeProto.FromString(b) for b in spec.attributes]
    captured = 0
    for attr in attributes:
        for sub in _subgraphs(attr):
            for name in _free_names(sub):
                m = _OUTER_RE.match(name)
                if m:
                    captured = max(captured, int(m.group(1)) + 1)
    explicit = list(inputs[: len(inputs) - captured])
    if captured:
        mapping = {f"{_OUTER}{k}": name for k, name in enumerate(inputs[len(inputs) - captured :])}
        for attr in attributes:
            for sub in _subgraphs(attr):
                _rename_free(sub, mapping)
    if "@" in key:
        for pos in sorted(int(p) for p in key.rsplit("@", 1)[1].split(",")):
            explicit.insert(pos, "")
    node = NodeProto()
    node.op_type = spec.op_type
    if spec.domain:
        node.domain = spec.domain
    node.input.extend(explicit)
    node.output.extend(outputs)
    node.attribute.extend(attributes)
    return node, captured


def _output_names(
    graph: Graph, spec: OpaqueSpec, present: Mapping[int, str], unused: Callable[[int], str]
) -> list[str]:
    """Output list of an opaque node: present outputs by name, absent optional ones empty, others `unused(k)`."""
    schema = _onnx_schema(spec.op_type, spec.domain, int(graph.opset_imports.get(spec.domain, 1)))
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    outputs = []
    for k in range(spec.num_outputs):
        if k in present:
            outputs.append(present[k])
        elif schema is not None and k < len(schema.outputs) and schema.outputs[k].option == optional:
            outputs.append("")
        else:
            outputs.append(unused(k))
    while outputs and not outputs[-1]:
        outputs.pop()
    return outputs


# -- exporters: IR op -> ONNX nodes ---------------------------------------------------------------------------------


def _ex_leaf(e: _Exporter, i: int) -> None:
    """Inputs and weights need no node."""


def _ex_simple(op_type: str) -> Callable[[_Exporter, int], None]:
    def export(e: _Exporter, i: int) -> None:
        n = e.graph.nodes[i]
        e.emit(op_type, [e.tensor(j) for j in n.inputs], [e.tensor(i)], f"{n.op}_{i}")

    return export


def _ex_conv(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    a = n.attr
    ins = [e.tensor(j) for j in (n.inputs[:2] if e._zero_bias(i) else n.inputs)]
    act = a["act"]
    out = e.tensor(i) if act == ops.ACT_NONE else e.namer(f"conv2d_{i}_linear")
    e.emit(
        "Conv",
        ins,
        [out],
        f"conv2d_{i}",
        kernel_shape=list(e.graph.nodes[n.inputs[1]].shape[2:]),
        strides=list(a["strides"]),
        pads=list(a["pads"]),
        dilations=list(a["dilations"]),
        group=a["group"],
    )
    if act != ops.ACT_NONE:
        op_type = {ops.ACT_RELU: "Relu", ops.ACT_SIGMOID: "Sigmoid", ops.ACT_TANH: "Tanh"}[act]
        e.emit(op_type, [out], [e.tensor(i)], f"conv2d_{i}_{op_type.lower()}")


def _ex_pool(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    a = n.attr
    attrs: dict[str, Any] = {"kernel_shape": list(a["kernel"]), "strides": list(a["strides"]), "pads": list(a["pads"])}
    if n.op == "avgpool":
        attrs["count_include_pad"] = a["count_include_pad"]
    op_type = "MaxPool" if n.op == "maxpool" else "AveragePool"
    e.emit(op_type, [e.tensor(n.inputs[0])], [e.tensor(i)], f"{n.op}_{i}", **attrs)


def _ex_concat(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    e.emit("Concat", [e.tensor(j) for j in e.concat_operands(i)], [e.tensor(i)], f"concat_{i}", axis=n.attr["axis"])


def _ex_slice(e: _Exporter, i: int) -> None:
    g = e.graph
    n = g.nodes[i]
    group = e.splits.get(i)
    src = e.tensor(n.inputs[0])
    axis = n.attr["axis"]
    if group:
        sizes = [g.nodes[j].attr["size"] for j in group]
        outs = [e.tensor(j) for j in group]
        if e.opset < 13:
            e.emit("Split", [src], outs, f"split_{i}", axis=axis, split=sizes)
        else:
            e.emit("Split", [src, e.int64(sizes, f"split_{i}_sizes")], outs, f"split_{i}", axis=axis)
        return
    start, end = n.attr["start"], n.attr["start"] + n.attr["size"]
    if e.opset < 10:
        e.emit("Slice", [src], [e.tensor(i)], f"slice_{i}", starts=[start], ends=[end], axes=[axis])
    else:
        ins = [
            src,
            e.int64([start], f"slice_{i}_starts"),
            e.int64([end], f"slice_{i}_ends"),
            e.int64([axis], f"slice_{i}_axes"),
        ]
        e.emit("Slice", ins, [e.tensor(i)], f"slice_{i}")


def _ex_transpose(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    e.emit("Transpose", [e.tensor(n.inputs[0])], [e.tensor(i)], f"transpose_{i}", perm=list(n.attr["perm"]))


def _ex_reshape(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    shape = e.int64(n.attr["shape"], f"reshape_{i}_shape")
    e.emit("Reshape", [e.tensor(n.inputs[0]), shape], [e.tensor(i)], f"reshape_{i}")


def _ex_batchnorm(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    e.emit(
        "BatchNormalization",
        [e.tensor(j) for j in n.inputs],
        [e.tensor(i)],
        f"batchnorm_{i}",
        epsilon=float(n.attr["epsilon"]),
    )


def _ex_opaque(e: _Exporter, i: int) -> None:
    g = e.graph
    n = g.nodes[i]
    key = n.attr["key"]
    group = (key, n.inputs)
    if group in e.opaque_done:
        return
    e.opaque_done.add(group)
    spec = g.opaque[key]
    members = e.opaque_groups[group]
    outputs = _output_names(
        g, spec, {k: e.tensor(j) for k, j in members.items()}, lambda k: e.namer(f"{key.split('@')[0]}_unused{k}")
    )
    node, _ = _opaque_node(g, key, [e.tensor(j) for j in n.inputs], outputs)
    node.name = e.node_namer(spec.name or key.split("@")[0])
    e.nodes.append(node)
    e.domains.add(spec.domain)


def _contiguous(array: np.ndarray) -> np.ndarray:
    """`array` in C order with its own shape (np.ascontiguousarray turns a scalar into shape (1,), and
    onnxruntime's fusions look for scalars: a GELU's exponent, a LayerNorm's epsilon)."""
    return np.require(array, requirements="C")


def _without_leading_ones(shape: Sequence[int], keep: int = 1) -> tuple[int, ...]:
    """`shape` without its leading 1s (at least `keep` dimensions kept)."""
    k = 0
    while k < len(shape) - keep and shape[k] == 1:
        k += 1
    return tuple(shape[k:])


def _broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    """Whether a tensor of `shape` broadcasts (unidirectionally, as Gemm's C) to `target`."""
    if len(shape) > len(target):
        return False
    return all(d in (1, t) for d, t in zip(reversed(shape), reversed(target)))


def _ex_gemm(e: _Exporter, i: int) -> None:
    """A MatMul by a constant and the Add of a constant bias (see `_Exporter._find_gemms`) as one Gemm."""
    g = e.graph
    n = g.nodes[i]
    m = e.gemms[i]
    bias = n.inputs[1] if n.inputs[0] == m else n.inputs[0]
    a, b = g.nodes[m].inputs
    e.emit("Gemm", [e.tensor(a), e.tensor(b), e.tensor(bias)], [e.tensor(i)], f"gemm_{i}")


def _ex_const(e: _Exporter, array: np.ndarray, base: str) -> str:
    """A float initializer for a weight transform's constant operand."""
    name = e.namer(base)
    e.initializers.append(numpy_helper.from_array(_contiguous(array), name))
    return name


def _ex_rsqrt(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    dtype = np.dtype(n.dtype)
    eps = _ex_const(e, np.asarray(n.attr["epsilon"], dtype=dtype), f"rsqrt_{i}_epsilon")
    shifted, root = e.namer(f"rsqrt_{i}_shifted"), e.namer(f"rsqrt_{i}_sqrt")
    e.emit("Add", [e.tensor(n.inputs[0]), eps], [shifted], f"rsqrt_{i}_add")
    e.emit("Sqrt", [shifted], [root], f"rsqrt_{i}_sqrt")
    e.emit("Reciprocal", [root], [e.tensor(i)], f"rsqrt_{i}")


def _ex_enlarge(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    w = e.graph.nodes[n.inputs[0]].shape
    ph, pw = (n.attr["kernel"][0] - w[2]) // 2, (n.attr["kernel"][1] - w[3]) // 2
    pads = [0, 0, ph, pw, 0, 0, ph, pw]
    if e.opset < 11:
        e.emit("Pad", [e.tensor(n.inputs[0])], [e.tensor(i)], f"enlarge_{i}", pads=pads)
    else:
        e.emit("Pad", [e.tensor(n.inputs[0]), e.int64(pads, f"enlarge_{i}_pads")], [e.tensor(i)], f"enlarge_{i}")


def _ex_merge(e: _Exporter, i: int) -> None:
    n = e.graph.nodes[i]
    count = n.attr["count"]
    mask = ops.merge_mask(n.shape, n.attr["group"], count).astype(np.dtype(n.dtype))
    tiled = e.namer(f"merge_{i}_tiled")
    e.emit("Tile", [e.tensor(n.inputs[0]), e.int64([1, count, 1, 1], f"merge_{i}_repeats")], [tiled], f"merge_{i}_tile")
    e.emit("Mul", [tiled, _ex_const(e, mask, f"merge_{i}_mask")], [e.tensor(i)], f"merge_{i}")


EXPORTERS: dict[str, Callable[[_Exporter, int], None]] = {
    "input": _ex_leaf,
    "weight": _ex_leaf,
    "add": _ex_simple("Add"),
    "mul": _ex_simple("Mul"),
    "matmul": _ex_simple("MatMul"),
    "relu": _ex_simple("Relu"),
    "sigmoid": _ex_simple("Sigmoid"),
    "tanh": _ex_simple("Tanh"),
    "globalavgpool": _ex_simple("GlobalAveragePool"),
    "conv2d": _ex_conv,
    "maxpool": _ex_pool,
    "avgpool": _ex_pool,
    "concat": _ex_concat,
    "slice": _ex_slice,
    "transpose": _ex_transpose,
    "reshape": _ex_reshape,
    "batchnorm": _ex_batchnorm,
    "rsqrt": _ex_rsqrt,
    "enlarge": _ex_enlarge,
    "merge": _ex_merge,
    "opaque": _ex_opaque,
}
"""IR op name -> ONNX emission (every op in tensat.ops.REGISTRY has one)."""


def export_model(graph: Graph) -> ModelProto:
    """Export `graph` as an ONNX model for its source opset: weight-only subgraphs folded into initializers,
    slices partitioning a tensor as one Split, names deterministic (the same graph exports byte-identically)."""
    return _Exporter(graph).run()


# ---------------------------------------------------------------------------------------------------------------
# Saving


def save_model(model: ModelProto, path: str | os.PathLike[str]) -> None:
    """Write `model` atomically (temp file in the same directory, fsync, os.replace).

    Models over 2 GiB are written with their weights in `<name>.data` next to the model file; `model` itself is
    left unchanged.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise TensatError(f"cannot write {path}: directory {directory} does not exist")
    if _is_large(model):
        _save_external(model, path, directory, os.path.basename(path))
        return
    atomic_write_bytes(path, model.SerializeToString())


def _save_external(model: ModelProto, path: str, directory: str, base: str) -> None:
    """Save with external data under a fresh data-file name, so that the model file and its data change together.

    The data goes to `<base>.data`, or to `<base>.<token>.data` where that file exists already (a new name, so the
    old file is never overwritten), then the model is renamed over `path`; only then is the data file of the model
    it replaced removed. Interrupted anywhere, `path` is the old model with its old
    data or the new model with its new data, never one with the other's weights.
    """
    previous = _external_locations(path, directory)
    location = f"{base}.data"
    if os.path.lexists(os.path.join(directory, location)):
        location = f"{base}.{os.urandom(6).hex()}.data"
    tmpdir = tempfile.mkdtemp(prefix=f".{base}.", suffix=".tmp", dir=directory)
    try:
        target = os.path.join(tmpdir, base)
        _write_external(model, target, location)
        os.replace(os.path.join(tmpdir, location), os.path.join(directory, location))
        try:
            os.replace(target, path)
        except BaseException:
            _remove_quietly(os.path.join(directory, location))
            raise
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    fsync_dir(directory)
    for old in previous - {location}:
        _remove_quietly(os.path.join(directory, old))


def _external_locations(path: str, directory: str) -> set[str]:
    """Data files that an earlier save of ours to `path` wrote and its model reads (never anyone else's files)."""
    try:
        old = onnx.load(path, load_external_data=False)
    except Exception:  # no file, or not a model: nothing of ours to clean up
        return set()
    ours = re.compile(re.escape(os.path.basename(path)) + r"(\.[0-9a-f]{12})?\.data")
    found = {entry.value for tensor in old.graph.initializer for entry in tensor.external_data
             if entry.key == "location" and ours.fullmatch(entry.value)}
    return {name for name in found if os.path.isfile(os.path.join(directory, name))}


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
