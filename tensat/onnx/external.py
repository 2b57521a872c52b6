"""Models over protobuf's 2 GiB limit: tensor sizes, copies without the large tensors' data, and writing a model
with its large initializers in an external data file."""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
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
    `model` is not modified. External data tensat kept on disk (`external_dir`) is copied into `location` from its
    file, a block at a time: the model written is whole, and the weights never all sit in memory."""
    data_path = os.path.join(os.path.dirname(path), location)
    source = external_dir(model)
    offset = 0
    with open(data_path, "wb") as data:

        def place(tensor: TensorProto, length: int) -> TensorProto:
            nonlocal offset
            pad = -offset % 4096
            data.write(b"\0" * pad)
            offset += pad
            stub = _stub(tensor, location, offset, length)
            offset += length
            return stub

        def replace(tensor: TensorProto) -> TensorProto | None:
            if has_external(tensor):
                if source is None:
                    return None
                where, start, length = external_info(tensor)
                if length is None:
                    length = _tensor_bytes(tensor)
                stub = place(tensor, length)
                _copy_region(os.path.join(source, where), start, length, data)
                return stub
            if _tensor_bytes(tensor) <= _LARGE_TENSOR:
                return None
            raw = tensor.raw_data if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).tobytes()
            stub = place(tensor, len(raw))
            data.write(raw)
            return stub

        light = _copy_with_initializers(model, replace)
        set_external_dir(light, None)
        data.flush()
        os.fsync(data.fileno())
    with open(path, "wb") as f:
        f.write(light.SerializeToString())
        f.flush()
        os.fsync(f.fileno())


def _copy_region(path: str, offset: int, length: int, out: Any, block: int = 1 << 24) -> None:
    """Copy `length` bytes at `offset` of the file `path` to the open file `out`, a block at a time."""
    with open(path, "rb") as src:
        src.seek(offset)
        while length > 0:
            chunk = src.read(min(block, length))
            if not chunk:
                raise OSError(f"{path} ends before the {length} bytes its tensor needs")
            out.write(chunk)
            length -= len(chunk)


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


def weight_bytes(model: ModelProto | str | os.PathLike[str]) -> int | None:
    """The bytes of `model`'s tensors (a proto, or a file read without its external data), from their dims and
    types, external ones included; None where the file cannot be read."""
    if not isinstance(model, ModelProto):
        try:
            model = onnx.load(os.fspath(model), load_external_data=False)
        except Exception:  # noqa: BLE001 - no file, or not a model: no size to report
            return None
    return sum(_tensor_bytes(t) for t in model_tensors(model))


# -- weights kept on disk: a model read from a file with external data keeps it there (`load_model(keep_external=
# True)`); the directory its locations are relative to travels with the proto as a metadata entry, so that every
# proto made from it (the pre-pass's output, the optimized model) can be read, run and saved without its weights
# passing through Python

EXTERNAL_DIR = "tensat.external_dir"  # metadata key: the directory the model's external data locations are under


def external_dir(model: ModelProto) -> str | None:
    """The directory `model`'s external data lies in, where tensat keeps it on disk (None otherwise)."""
    return next((p.value for p in model.metadata_props if p.key == EXTERNAL_DIR), None)


def set_external_dir(model: ModelProto, directory: str | None) -> None:
    """Record (or, with None, drop) the directory `model`'s external data lies in."""
    kept = [p for p in model.metadata_props if p.key != EXTERNAL_DIR]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    if directory is not None:
        model.metadata_props.add(key=EXTERNAL_DIR, value=os.path.abspath(directory))


def external_info(tensor: TensorProto) -> tuple[str, int, int | None]:
    """A tensor's external data: its location, offset and length (None: to the end of what its dims need)."""
    info = {e.key: e.value for e in tensor.external_data}
    length = info.get("length")
    return info.get("location", ""), int(info.get("offset", 0)), int(length) if length is not None else None


def content_digest(model: ModelProto, data: bytes) -> str:
    """A hash of what `model` (serialized as `data`) computes with: its bytes, and the size and modification time of
    each external data file they name (the bytes hold only the files' names), so that a model whose weights on disk
    were rewritten hashes anew."""
    h = hashlib.sha256(data)
    directory = external_dir(model)
    files = sorted({external_info(t)[0] for t in model_tensors(model) if has_external(t)})
    for name in files:
        path = os.path.join(directory, name) if directory is not None else name
        try:
            st = os.stat(path)
        except OSError:
            h.update(f"\0{name}:missing".encode())
        else:
            h.update(f"\0{name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


# the memory maps made so far, by file, offset, dtype and shape: a weight read twice (the model as given and the
# pre-pass's output) is one array, and one mapping of its pages
_MAPPED: weakref.WeakValueDictionary[tuple[str, int, str, tuple[int, ...]], np.ndarray] = weakref.WeakValueDictionary()


def mapped_array(tensor: TensorProto, directory: str) -> np.ndarray | None:
    """`tensor`'s external data as a read-only array mapped from its file (no copy: pages are read when touched),
    or None where its type has no plain numpy layout (bfloat16, strings, ...)."""
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except (KeyError, TypeError, ValueError):
        return None
    if dtype.kind not in "biuf" or tensor.data_type in _PACKED_TYPES:
        return None
    location, offset, length = external_info(tensor)
    shape = tuple(int(d) for d in tensor.dims)
    if length is not None and length != math.prod(shape) * dtype.itemsize:
        return None
    path = os.path.realpath(os.path.join(directory, location))
    key = (path, offset, dtype.str, shape)
    array = _MAPPED.get(key)
    if array is None:
        if math.prod(shape) == 0:
            array = np.empty(shape, dtype)
        else:
            array = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
        _MAPPED[key] = array
    return array


# types numpy reads differently from their bytes on disk (onnx stores bfloat16 and the float8s as uint16/uint8)
_PACKED_TYPES = frozenset(
    t
    for t in (
        getattr(TensorProto, name, None)
        for name in ("BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4", "INT4")
    )
    if t is not None
)


def file_region(array: np.ndarray) -> tuple[str, int, int] | None:
    """Where `array`'s bytes lie in a file tensat mapped (`mapped_array`): its path, offset and length; None for an
    array held in memory, or one whose elements are not contiguous in C order (a transposed view)."""
    if not array.flags.c_contiguous:
        return None
    base = array
    while isinstance(base.base, np.ndarray):
        base = base.base
    if not isinstance(base, np.memmap) or not isinstance(base.base, mmap.mmap) or base.filename is None:
        return None
    start = base.offset + (array.__array_interface__["data"][0] - base.__array_interface__["data"][0])
    return os.fspath(base.filename), start, array.nbytes


def external_tensor(array: np.ndarray, name: str, directory: str) -> TensorProto | None:
    """A tensor named `name` whose data is `array`'s bytes where they lie in a mapped file under `directory`
    (`file_region`), without reading them; None where they do not."""
    region = file_region(array)
    if region is None:
        return None
    path, offset, length = region
    root = os.path.realpath(directory)
    if os.path.commonpath([path, root]) != root:
        return None
    stub = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
    return _stub(stub, os.path.relpath(path, root), offset, length)


def materialize(model: ModelProto) -> ModelProto:
    """`model` with the external data tensat kept on disk read into it: a self-contained proto for a caller."""
    directory = external_dir(model)
    if directory is None:
        return model
    from onnx.external_data_helper import load_external_data_for_model

    load_external_data_for_model(model, directory)
    set_external_dir(model, None)
    return model
