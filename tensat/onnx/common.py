"""What the loader, the importer and the exporter share: protobuf helpers (names, types, opsets, subgraphs),
the names of opaque nodes' captured tensors, and running one ONNX node in onnxruntime."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, helper, numpy_helper

from tensat.errors import ModelError
from tensat.onnx.external import subgraphs

MAX_IR_VERSION = 13  # the newest IR version onnxruntime 1.31 reads: the most tensat reads and writes
OUTER = "__tensat_outer_"
OUTER_RE = re.compile(r"^__tensat_outer_(\d+)$")
NONDETERMINISTIC = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
}

# ---------------------------------------------------------------------------------------------------------------
# Small helpers


def dtype_name(elem_type: int) -> str:
    """IR dtype string (numpy's name where numpy has one) for an ONNX element type."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        return TensorProto.DataType.Name(elem_type).lower()


_ELEM_TYPES: dict[str, int] = {}
for _code in TensorProto.DataType.values():
    if _code != TensorProto.UNDEFINED:
        _ELEM_TYPES.setdefault(dtype_name(_code), _code)


def elem_type(dtype: str) -> int:
    """ONNX element type for an IR dtype string."""
    try:
        return _ELEM_TYPES[dtype]
    except KeyError:
        raise ModelError(f"tensor type '{dtype}' has no ONNX element type") from None


def node_label(node: NodeProto, index: int) -> str:
    name = f"'{node.name}'" if node.name else f"#{index}"
    domain = f"{node.domain}." if node.domain not in ("", "ai.onnx") else ""
    return f"node {name} ({domain}{node.op_type})"


def norm_domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def opset_versions(model: ModelProto) -> dict[str, int]:
    out: dict[str, int] = {}
    for imp in model.opset_import:
        out[norm_domain(imp.domain)] = int(imp.version)
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


def sparse_to_array(sp: onnx.SparseTensorProto) -> np.ndarray:
    values = numpy_helper.to_array(sp.values)
    indices = numpy_helper.to_array(sp.indices).astype(np.int64)
    dims = tuple(int(d) for d in sp.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense


def free_names(graph: GraphProto) -> list[str]:
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
            for sub in subgraphs(attr):
                for name in free_names(sub):
                    use(name)
        bound.update(node.output)
    for vi in graph.output:
        use(vi.name)
    return free


def rename_free(graph: GraphProto, mapping: Mapping[str, str]) -> None:
    """Rename, in place, references in `graph` to enclosing-scope names per `mapping` (respecting shadowing)."""
    bound = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    bound |= {s.values.name for s in graph.sparse_initializer}
    live = {k: v for k, v in mapping.items() if k not in bound}
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in live:
                node.input[k] = live[name]
        for attr in node.attribute:
            for sub in subgraphs(attr):
                rename_free(sub, live)
        for out in node.output:
            live.pop(out, None)
    for vi in graph.output:
        if vi.name in live:
            vi.name = live[vi.name]


def onnx_schema(op_type: str, domain: str, opset: int) -> Any:
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # noqa: BLE001 - unknown op or domain: no schema
        return None


# ---------------------------------------------------------------------------------------------------------------
# Running single nodes in onnxruntime (constant folding of ops tensat does not model, shapes of custom ops)


def _ort_session(model: ModelProto) -> Any:
    from tensat.session import make_session  # lazy: onnxruntime is imported only when a node must be run

    return make_session(model.SerializeToString(), "cpu", threads=1)


def single_node_model(node: NodeProto, arrays: Sequence[np.ndarray | None], opsets: Mapping[str, int]) -> ModelProto:
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
    model = single_node_model(node, arrays, opsets)
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
