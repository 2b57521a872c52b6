"""Saving: write a model atomically (`save_model`), with its weights in an external data file when it exceeds
protobuf's 2 GiB limit."""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import onnx
from onnx import ModelProto

from tensat.errors import TensatError
from tensat.files import atomic_write_bytes, fsync_dir
from tensat.onnx.external import external_dir, is_large, write_external
from tensat.session import Serialized, proto_of


def save_model(model: ModelProto | Serialized, path: str | os.PathLike[str]) -> None:
    """Write `model` atomically (temp file in the same directory, fsync, os.replace); a `Serialized` model is
    written from the bytes it already holds.

    Models over 2 GiB are written with their weights in `<name>.data` next to the model file; `model` itself is
    left unchanged.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise TensatError(f"cannot write {path}: directory {directory} does not exist")
    proto = proto_of(model)
    if is_large(proto) or external_dir(proto) is not None:  # over 2 GiB, or weights tensat left on disk
        _save_external(proto, path, directory, os.path.basename(path))
        return
    atomic_write_bytes(path, model.data if isinstance(model, Serialized) else proto.SerializeToString())


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
        write_external(model, target, location)
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
    found = {
        entry.value
        for tensor in old.graph.initializer
        for entry in tensor.external_data
        if entry.key == "location" and ours.fullmatch(entry.value)
    }
    return {name for name in found if os.path.isfile(os.path.join(directory, name))}


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
