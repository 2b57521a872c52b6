"""The one place onnxruntime sessions are made: quiet, on a named provider, with the caller's settings.

Verification, latency timing, the ONNX importer's constant folding and the measured cost model all create their
sessions here, so provider names, logging and protobuf's 2 GiB limit are handled once. onnxruntime is imported on
first use: importing tensat does not load it.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from onnx import ModelProto

EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"  # where a model from bytes finds its data
PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
}


def onnxruntime_module() -> Any:
    """onnxruntime, with its default logger limited to errors (it warns about things tensat handles)."""
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    return onnxruntime


class Serialized:
    """A model proto and its bytes, serialized on first use and then kept: verification and each thread count of
    the end-to-end check open sessions of the same two models, and serializing a large model takes a while
    (about 0.4 s for 244 MB of weights); with them, the last session `shared_session` opened, and how long it took
    to open. The proto must not change once it is wrapped."""

    __slots__ = ("_data", "_session", "opened", "proto")

    def __init__(self, proto: ModelProto) -> None:
        self.proto = proto
        self._data: bytes | None = None
        self._session: tuple[tuple[Any, ...], Any] | None = None  # (the settings, the session)
        self.opened: float | None = None  # seconds the last session `shared_session` opened took to open

    @property
    def data(self) -> bytes:
        """The proto's serialized bytes (made once)."""
        if self._data is None:
            self._data = self.proto.SerializeToString()
        return self._data


ModelSource = ModelProto | Serialized | str | os.PathLike  # a model to run: a proto, wrapped or not, or a file


def proto_of(model: ModelProto | Serialized) -> ModelProto:
    """The proto itself, wrapped or not."""
    return model.proto if isinstance(model, Serialized) else model


def make_session(
    model: ModelProto | Serialized | bytes | str | os.PathLike[str],
    provider: str | Sequence[str] = "cpu",
    threads: int | None = None,
    spinning: bool = True,
    optimizations: bool = True,
    *,
    layout: bool = True,
    log_severity: int = 3,
    optimized_path: str | None = None,
    optimized_weights: str | None = None,
    profile_prefix: str | None = None,
    disabled_optimizers: Sequence[str] = (),
    prepacking: bool = True,
) -> Any:
    """An onnxruntime InferenceSession for `model` (a proto, wrapped with its bytes or not, serialized bytes or a
    path) on `provider` ("cpu",
    "cuda" with CPU fallback, or a list of onnxruntime provider names), logging at `log_severity`, with `threads`
    intra-op threads (default: onnxruntime's choice). Models over 2 GiB go through a temporary file with external
    data. Without `spinning`, idle intra-op threads sleep instead of spinning (see `tensat.latency.Interleaved`);
    without `optimizations`, onnxruntime runs the graph as written (no fusions: what the graph itself computes);
    without `layout`, its optimizations stop at the extended level (the fusions, not the CPU's blocked layout).
    `optimized_path` saves onnxruntime's optimized model there (with its initializers over 1 KiB in the file
    `optimized_weights` beside it, if given), `profile_prefix` turns on its profiler, and `disabled_optimizers`
    names graph transformers to leave out. Without `prepacking`, weights are not repacked for the kernels when the
    session loads (a session that only writes its optimized graph needs no second copy of them)."""
    ort = onnxruntime_module()
    if isinstance(provider, str):
        try:
            providers = PROVIDERS[provider]
        except KeyError:
            raise ValueError(f"unknown provider '{provider}' (use one of {', '.join(PROVIDERS)})") from None
    else:
        providers = list(provider)
    options = ort.SessionOptions()
    options.log_severity_level = log_severity
    if threads is not None:
        options.intra_op_num_threads = int(threads)
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not optimizations:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    elif not layout:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    if optimized_path:
        options.optimized_model_filepath = optimized_path
        if optimized_weights:
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", optimized_weights
            )
            options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    if not prepacking:
        options.add_session_config_entry("session.disable_prepacking", "1")
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    extra: dict[str, Any] = {"disabled_optimizers": list(disabled_optimizers)} if disabled_optimizers else {}
    from tensat.onnx.external import external_dir, is_large, write_external  # lazy: tensat.onnx imports this module

    directory = external_dir(proto_of(model)) if isinstance(model, (ModelProto, Serialized)) else None
    if directory is not None:  # weights tensat left on disk are read from there, not passed as bytes
        options.add_session_config_entry(EXTERNAL_FOLDER, directory)
    if isinstance(model, (str, os.PathLike)):
        return ort.InferenceSession(os.fspath(model), options, providers=providers, **extra)
    if isinstance(model, bytes):
        return ort.InferenceSession(model, options, providers=providers, **extra)
    if isinstance(model, Serialized):
        if not is_large(model.proto):
            return ort.InferenceSession(model.data, options, providers=providers, **extra)
        model = model.proto
    if not is_large(model):
        return ort.InferenceSession(model.SerializeToString(), options, providers=providers, **extra)
    with tempfile.TemporaryDirectory(prefix="tensat-") as tmp:
        path = os.path.join(tmp, "model.onnx")
        write_external(model, path, "model.data")
        return ort.InferenceSession(path, options, providers=providers, **extra)


def shared_session(
    model: ModelProto | Serialized | bytes | str | os.PathLike[str],
    provider: str | Sequence[str] = "cpu",
    threads: int | None = None,
    spinning: bool = True,
    optimizations: bool = True,
) -> Any:
    """`make_session(model, provider, threads, spinning, optimizations)`; for a `Serialized` model, the session it
    last opened with the same settings, if any: verification and the end-to-end check's first thread count run the
    same two models with the same settings, and opening a session of a large model takes as long as several of its
    runs. One session is kept per model, so the last one opened replaces it."""
    if not isinstance(model, Serialized):
        return make_session(model, provider, threads, spinning, optimizations)
    key = (provider if isinstance(provider, str) else tuple(provider), threads, spinning, optimizations)
    if model._session is None or model._session[0] != key:
        model._session = None  # the one it replaces goes before the new one is opened
        start = time.perf_counter()
        model._session = (key, make_session(model, provider, threads, spinning, optimizations))
        model.opened = time.perf_counter() - start
    return model._session[1]


def runtime_graph(model: ModelProto | Serialized | bytes | str | os.PathLike[str], provider: str = "cpu") -> ModelProto:
    """`model` as onnxruntime runs it on `provider` at the extended level (its fusions, not the CPU's blocked
    layout): the optimized model it writes, read back without its weights (their names and shapes only). The
    weights are neither repacked nor, where the system allows, written anywhere (their file is the null device):
    for a model of several GB that would take seconds and as much memory again."""
    import onnx

    with tempfile.TemporaryDirectory(prefix="tensat-") as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        try:
            os.symlink(os.devnull, os.path.join(tmp, "weights.bin"))
        except OSError:  # no symlinks here: the weights are written to the temporary directory
            pass
        make_session(
            model, provider, layout=False, optimized_path=path, optimized_weights="weights.bin", prepacking=False
        )
        return onnx.load(path, load_external_data=False)


NCHWC_DOMAIN = "com.microsoft.nchwc"  # the domain of onnxruntime's blocked-layout CPU kernels


@functools.cache
def nchwc_block() -> int:
    """The channel block of onnxruntime's blocked (NCHWc) layout on this CPU, asked of onnxruntime once per process
    by running one ReorderInput (0: its CPU kernels have none here)."""
    import numpy as np
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("ReorderInput", ["x"], ["y"], domain=NCHWC_DOMAIN)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(NCHWC_DOMAIN, 1)]
    model = helper.make_model(helper.make_graph([node], "block", [x], [y]), opset_imports=opsets, ir_version=8)
    try:
        out = make_session(model, "cpu", threads=1).run(None, {"x": np.ones((1, 4, 1, 1), np.float32)})[0]
        return int(out.shape[1])
    except Exception:  # noqa: BLE001 - no NCHWc kernels on this build or CPU
        return 0
