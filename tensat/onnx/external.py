"""Models over protobuf's 2 GiB limit: tensor sizes, copies without the large tensors' data, and writing a model
with its large initializers in an external data file."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto, helper, numpy_helper

PROTO_LIMIT = 2**31 - 2**26  # protobuf's 2 GiB message limit, with headroom for everything but tensors
_LARGE_TENSOR = 1 << 20  # tensors above this many bytes are stripped from the copy used for shape inference


def subgraphs(attr: AttributeProto) -> list[GraphProto]:
    """The graphs an attribute holds (If/Loop/Scan bodies), if any."""
    if attr.type == AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def all_tensors(graph: GraphProto) -> list[TensorProto]:
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
            for sub in subgraphs(attr):
                out += all_tensors(sub)
    return out


def model_tensors(model: ModelProto) -> list[TensorProto]:
    """Every TensorProto of `model`: its graph's (`all_tensors`) and its local functions'."""
    out = all_tensors(model.graph)
    for fn in model.functions:
        for node in fn.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    out.append(attr.t)
                out += list(attr.tensors)
                for sub in subgraphs(attr):
                    out += all_tensors(sub)
    return out


def has_external(tensor: TensorProto) -> bool:
    """Whether `tensor` keeps its data in an external file."""
    return tensor.HasField("data_location") and tensor.data_location == TensorProto.EXTERNAL


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


def light_copy(model: ModelProto) -> ModelProto:
    """A copy without the data of large initializers (shape inference needs dims and small constants only)."""
    return _copy_with_initializers(
        model, lambda t: _stub(t, "__stripped__") if not has_external(t) and _tensor_bytes(t) > _LARGE_TENSOR else None
    )


def write_external(model: ModelProto, path: str, location: str) -> None:
    """Write `model` to `path` with its large initializers' data in `location` (same directory), fsynced;
    `model` is not modified."""
    data_path = os.path.join(os.path.dirname(path), location)
    offset = 0
    with open(data_path, "wb") as data:

        def replace(tensor: TensorProto) -> TensorProto | None:
            nonlocal offset
            if has_external(tensor) or _tensor_bytes(tensor) <= _LARGE_TENSOR:
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


def is_large(model: ModelProto) -> bool:
    """Whether `model` may exceed protobuf's 2 GiB limit (estimated from its tensors' sizes)."""
    return sum(_tensor_bytes(t) for t in model_tensors(model) if not has_external(t)) > PROTO_LIMIT
