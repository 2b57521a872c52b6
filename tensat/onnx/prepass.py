"""A peer's graph canonicalization, run on a model before tensat reads it (`Options.pre_pass`).

onnxslim folds constants, removes dead code and fuses patterns tensat's rules do not write (MatMul+Add on N-D inputs
into Reshape, Gemm, Reshape, which onnxruntime then runs with its bias fused). bench/prepass.py measures it as a
pre-pass on the real-model corpus. Its output is only what tensat reads: the model as given stays the reference
the result is verified and timed against, and is what a run returns when nothing faster is found.

Weights tensat keeps on disk (a model's external data, see `tensat.onnx.load.load_model`) are shown to the pre-pass
as graph inputs of their type and shape, and put back after it: the pre-pass folds what the small constants compute
(shapes, masks) and never holds the weights in memory, which for a model of several GB would take several times
their size; what it would fold over a weight, onnxruntime folds when it loads the model.

`cached_pre_pass` keeps each result in a directory, under a digest of the model and the pre-pass's version: a second
run on one model reads it instead of running the pre-pass again. Only what the pre-pass made is stored; the weights
it left as they were are taken from the model again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from importlib import metadata
from pathlib import Path

import onnx
from onnx import ModelProto, TensorProto, helper

from tensat.errors import ModelError, TensatError
from tensat.files import atomic_write_bytes
from tensat.onnx.external import external_dir, has_external, set_external_dir, weight_bytes


def pre_pass(model: ModelProto, name: str) -> ModelProto:
    """`model` as pre-pass `name` ("none" or "onnxslim") rewrites it: a new proto; `model` is left as it was
    (onnxslim edits the proto it is given)."""
    if name == "none":
        return model
    if name != "onnxslim":
        raise TensatError(f"unknown pre-pass {name!r}")
    try:
        import onnxslim  # a dependency; loaded only by a run that uses it (it imports sympy)
    except ImportError:
        raise TensatError("the onnxslim pre-pass needs onnxslim: pip install onnxslim") from None
    copy = ModelProto()
    copy.CopyFrom(model)
    held = _hold_external(copy)
    out = onnxslim.slim(copy)
    _put_back(out, held)
    set_external_dir(out, external_dir(model))
    return _same_interface(model, out, name)


def _hold_external(model: ModelProto) -> dict[str, TensorProto]:
    """Take the initializers whose data is kept on disk out of `model`, each declared as a graph input of its type
    and shape instead; they are returned by name."""
    if external_dir(model) is None:
        return {}
    held = {t.name: t for t in model.graph.initializer if has_external(t)}
    if not held:
        return {}
    kept = [t for t in model.graph.initializer if t.name not in held]
    listed = {vi.name for vi in model.graph.input}
    inputs = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in held.values()]
    model.graph.input.extend(vi for vi in inputs if vi.name not in listed)
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return held


def _put_back(model: ModelProto, held: dict[str, TensorProto]) -> None:
    """The initializers `_hold_external` took out, back in place of the graph inputs that stood for them (those the
    pre-pass left read)."""
    if not held:
        return
    read = [vi.name for vi in model.graph.input if vi.name in held]
    inputs = [vi for vi in model.graph.input if vi.name not in held]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    model.graph.initializer.extend(held[name] for name in read)


def _same_interface(model: ModelProto, out: ModelProto, name: str) -> ModelProto:
    """`out` with `model`'s graph inputs, in their order and as declared: onnxslim drops an input nothing reads, and
    the result must run with the feeds the model as given takes. Raises ModelError where the pre-pass changed the
    outputs, or added an input."""
    weights = {t.name for t in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in weights]
    known = {vi.name for vi in inputs}
    extra = [vi.name for vi in out.graph.input if vi.name not in known and vi.name not in weights]
    if extra:
        raise ModelError(f"the {name} pre-pass added graph input '{extra[0]}'")
    if [o.name for o in out.graph.output] != [o.name for o in model.graph.output]:
        raise ModelError(f"the {name} pre-pass changed the graph outputs")
    own = {t.name for t in out.graph.initializer}  # listed as inputs too below IR version 4
    listed = [vi for vi in out.graph.input if vi.name in own]
    del out.graph.input[:]
    out.graph.input.extend([*inputs, *listed])
    return out


CACHE_ENTRIES = 16  # pre-pass results kept (the least recently used go first) ...
CACHE_BYTES = 2**30  # ... and bytes of them
CACHE_MAX_WEIGHT_BYTES = 2**29  # models with more weights than this are not cached (their copy would cost memory)
CACHE_FORMAT = "1"
_ORDER_KEY = "tensat.pre_pass.initializers"  # the stored result's initializers in order, those taken from the model


def cached_pre_pass(model: ModelProto, name: str, directory: Path | None) -> ModelProto:
    """`pre_pass(model, name)`, kept in `directory` (None: not kept) under a digest of `model`, the pre-pass and its
    version, and read from there when a run meets the same model again. A model with weights on disk, or more than
    `CACHE_MAX_WEIGHT_BYTES` of them, is pre-passed every time. A stored result that cannot be read is made again."""
    if name == "none" or directory is None or external_dir(model) is not None:
        return pre_pass(model, name)
    if (weight_bytes(model) or 0) > CACHE_MAX_WEIGHT_BYTES:
        return pre_pass(model, name)
    path = directory / f"{_digest(model, name)}.onnx"
    cached = _read_cached(path, model)
    if cached is not None:
        return cached
    out = pre_pass(model, name)
    with contextlib.suppress(OSError, TensatError):  # a cache that cannot be written costs the next run the pre-pass
        _write_cached(path, out, model)
    return out


def _digest(model: ModelProto, name: str) -> str:
    """A digest of the model's bytes, the pre-pass and its version, and this cache's format."""
    version = metadata.version(name) if name == "onnxslim" else ""
    h = hashlib.sha256(f"{name} {version} {CACHE_FORMAT}\n".encode())
    h.update(model.SerializeToString(deterministic=True))
    return h.hexdigest()[:32]


def _write_cached(path: Path, out: ModelProto, model: ModelProto) -> None:
    """`out` stored at `path` without the initializers it shares with `model` (same name, same bytes), which
    `_read_cached` takes from the model again; the least recently used entries past `CACHE_ENTRIES`, or past
    `CACHE_BYTES` in all, are removed."""
    given = {t.name: t for t in model.graph.initializer}
    order = []
    stored = ModelProto()
    stored.CopyFrom(out)
    kept = []
    for t in out.graph.initializer:
        same = t.name in given and given[t.name] == t
        order.append([t.name, same])
        if not same:
            kept.append(t)
    del stored.graph.initializer[:]
    stored.graph.initializer.extend(kept)
    stored.metadata_props.add(key=_ORDER_KEY, value=json.dumps(order))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, stored.SerializeToString())
    entries = sorted(path.parent.glob("*.onnx"), key=lambda p: p.stat().st_mtime, reverse=True)
    total = 0
    for k, entry in enumerate(entries):
        total += entry.stat().st_size
        if k >= CACHE_ENTRIES or (total > CACHE_BYTES and entry != path):
            entry.unlink(missing_ok=True)


def _read_cached(path: Path, model: ModelProto) -> ModelProto | None:
    """The result stored at `path` with its shared initializers taken from `model` again; None where there is none
    or it cannot be read."""
    try:
        stored = onnx.load_model_from_string(path.read_bytes())
        props = {p.key: p.value for p in stored.metadata_props}
        order = json.loads(props[_ORDER_KEY])
        own = {t.name: t for t in stored.graph.initializer}
        given = {t.name: t for t in model.graph.initializer}
        tensors = [given[n] if shared else own[n] for n, shared in order]
    except Exception:  # noqa: BLE001 - none stored, or damaged (protobuf's DecodeError, a missing key): made again
        return None
    del stored.graph.initializer[:]
    stored.graph.initializer.extend(tensors)
    props_kept = [p for p in stored.metadata_props if p.key != _ORDER_KEY]
    del stored.metadata_props[:]
    stored.metadata_props.extend(props_kept)
    os.utime(path)
    return stored
