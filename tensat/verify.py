"""Numerical verification: run the original and the optimized model in onnxruntime on the same seeded inputs and
compare every output.

An output matches when NaN/inf appear at the same places and, over the finite values,
max |a - b| <= atol + rtol * max |b| (b = original). Scaling by the output's largest magnitude rather than element
by element lets re-associated float32 arithmetic through deep nets pass (its error is relative to the size of the
values summed, not to each small result), while a dropped bias, a swapped slice or a wrong weight, which move
outputs by a sizeable fraction of their scale, do not. Integer and boolean outputs must be equal.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, helper

from tensat.errors import ModelError, VerificationError, one_line, raise_if_out_of_memory
from tensat.session import ModelSource, Serialized, make_session, proto_of, shared_session

RTOL = 1e-4
ATOL = 1e-6
VERIFY_THREADS = 1  # as the end-to-end check first times the two models: with `Serialized` models, one session each


def _structure(model: ModelSource) -> ModelProto:
    """The model's proto; for a path, without loading external data (onnxruntime reads the file itself)."""
    if isinstance(model, (ModelProto, Serialized)):
        return proto_of(model)
    try:
        return onnx.load(os.fspath(model), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - missing file, protobuf errors
        raise ModelError(f"cannot read model '{os.fspath(model)}': {one_line(e)}") from None


def _initializer_names(model: ModelProto) -> set[str]:
    return {t.name for t in model.graph.initializer} | {s.values.name for s in model.graph.sparse_initializer}


def random_inputs(
    model: ModelProto, seed: int = 0, shapes: Mapping[str, Sequence[int]] | None = None, integers: int | None = None
) -> dict[str, np.ndarray]:
    """Seeded feeds for every graph input, of the shapes `shapes` gives or else the declared ones: floats standard
    normal, integers 0 or 1 (all `integers` where given), booleans random.

    Integers of 0 and 1 are valid wherever a model reads an integer input: token ids index any vocabulary, and an
    attention mask takes no other value (OPT computes its positions as the mask's cumulative sum, and a mask of
    larger values indexes past its position table)."""
    rng = np.random.default_rng(seed)
    inits = _initializer_names(model)
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if vi.type.WhichOneof("value") != "tensor_type" or not tt.HasField("shape"):
            raise ModelError(f"input '{vi.name}' has no tensor shape; cannot make random inputs for it")
        if shapes and vi.name in shapes:
            shape = [int(d) for d in shapes[vi.name]]
        elif all(d.HasField("dim_value") and d.dim_value >= 1 for d in tt.shape.dim):
            shape = [int(d.dim_value) for d in tt.shape.dim]
        else:
            raise ModelError(f"input '{vi.name}' has a dynamic dimension; load the model with its input shapes")
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"input '{vi.name}' has element type {tt.elem_type}, which numpy cannot hold") from None
        if dtype.kind == "f":
            feeds[vi.name] = np.asarray(rng.standard_normal(shape)).astype(dtype)
        elif dtype.kind in "iu" and integers is not None:
            feeds[vi.name] = np.full(shape, integers, dtype)
        elif dtype.kind in "iu":
            feeds[vi.name] = np.asarray(rng.integers(0, 2, size=shape)).astype(dtype)
        elif dtype.kind == "b":
            feeds[vi.name] = np.asarray(rng.random(shape) < 0.5)
        else:
            raise ModelError(f"input '{vi.name}' is of type {dtype}; cannot make random inputs for it")
    return feeds


def timing_inputs(
    model: ModelProto, seed: int = 0, shapes: Mapping[str, Sequence[int]] | None = None
) -> dict[str, np.ndarray]:
    """Seeded feeds that time a model as it serves an unpadded batch (`random_inputs` with every integer 1: token ids
    of 1, an attention mask of ones). A mask of random zeros masks half the keys at random, and onnxruntime's CPU
    Softmax, and its attention kernels, run several times slower over rows where half the scores are large
    negatives (their exponentials underflow): timing with it would time a path an unpadded input never takes, and
    one the unit prices, timed on random scores, do not see. Verification keeps the random zeros and ones, which
    test what the mask computes."""
    return random_inputs(model, seed, shapes, integers=1)


def run_model(
    model: ModelSource,
    feeds: Mapping[str, np.ndarray],
    provider: str = "cpu",
    optimizations: bool = True,
    threads: int | None = None,
    keep: bool = True,
) -> dict[str, np.ndarray]:
    """Run `model` on `feeds` (extra feeds ignored), returning every output by name; with `threads` intra-op threads
    (default: onnxruntime's choice), in the session a `Serialized` model keeps (`shared_session`), or, without
    `keep`, in a session of its own released on return (a large model's session holds a copy of its weights)."""
    if keep:
        session = shared_session(model, provider, threads, optimizations=optimizations)
    else:
        session = make_session(model, provider, threads, optimizations=optimizations)
    names = {i.name for i in session.get_inputs()}
    missing = names - set(feeds)
    if missing:
        raise ModelError(f"no value given for input '{sorted(missing)[0]}'")
    outputs = [o.name for o in session.get_outputs()]
    values = session.run(outputs, {k: v for k, v in feeds.items() if k in names})
    return {name: np.asarray(v) for name, v in zip(outputs, values)}


@dataclass
class VerifyReport:
    """The outcome of comparing two models on the same inputs."""

    ok: bool
    max_abs_error: float
    max_rel_error: float
    outputs: list[str]
    seconds: float
    detail: str


def _signature(model: ModelProto) -> tuple[dict[str, tuple[int, tuple[Any, ...] | None]], list[str]]:
    """Graph outputs by name -> (element type, dims) and the output names in order (duplicates dropped)."""
    sig: dict[str, tuple[int, tuple[Any, ...] | None]] = {}
    for vi in model.graph.output:
        tt = vi.type.tensor_type
        dims: tuple[Any, ...] | None = tuple(
            d.dim_value if d.HasField("dim_value") else d.dim_param for d in tt.shape.dim
        )
        if not tt.HasField("shape"):
            dims = None
        sig.setdefault(vi.name, (tt.elem_type, dims))
    return sig, list(sig)


def _compare_one(name: str, a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> tuple[bool, float, float, str]:
    """(ok, abs error, error relative to b's scale, reason) for optimized `a` against original `b`."""
    if a.shape != b.shape:
        return False, float("inf"), float("inf"), f"output '{name}' has shape {a.shape}, expected {b.shape}"
    if a.dtype != b.dtype:
        return False, float("inf"), float("inf"), f"output '{name}' has dtype {a.dtype}, expected {b.dtype}"
    if a.dtype.kind not in "fc":
        bad = int(np.count_nonzero(a != b))
        if bad:
            return False, float("inf"), float("inf"), f"output '{name}' differs in {bad} of {a.size} elements"
        return True, 0.0, 0.0, ""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    if not np.array_equal(nan_a, nan_b):
        return (
            False,
            float("inf"),
            float("inf"),
            (
                f"output '{name}' has NaN in {int(nan_a.sum())} places, "
                f"expected {int(nan_b.sum())} (not the same places)"
            ),
        )
    inf_a, inf_b = np.isinf(a64), np.isinf(b64)
    if not np.array_equal(inf_a, inf_b) or not np.array_equal(a64[inf_a], b64[inf_b]):
        return False, float("inf"), float("inf"), f"output '{name}' has infinities in different places or signs"
    finite = ~(nan_b | inf_b)
    if not finite.any():
        return True, 0.0, 0.0, ""
    err = float(np.max(np.abs(a64[finite] - b64[finite])))
    scale = float(np.max(np.abs(b64[finite])))
    rel = err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))
    if err > atol + rtol * scale:
        where = int(np.argmax(np.where(finite, np.abs(a64 - b64), -1.0)))
        return (
            False,
            err,
            rel,
            (
                f"output '{name}' differs: max abs error {err:.3g} (relative to its scale {scale:.3g}: {rel:.3g}; "
                f"allowed {atol + rtol * scale:.3g}) at flat index {where}"
            ),
        )
    return True, err, rel, ""


def compare_models(
    original: ModelSource,
    optimized: ModelSource,
    *,
    seed: int = 0,
    rtol: float = RTOL,
    atol: float = ATOL,
    provider: str = "cpu",
    optimizations: bool = True,
    keep_sessions: bool = True,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> VerifyReport:
    """Run both models on the same seeded random inputs and compare outputs by name (see module docstring);
    `optimizations` False runs both as written, without onnxruntime's graph optimizations. Without
    `keep_sessions`, one model's session is released before the other's is made (see `run_model`): the
    comparison then needs room for one model's weights at a time. `shapes` gives the inputs' shapes where the
    models declare symbolic dims.

    Interface mismatches (output names, shapes, dtypes, inputs) and a failure of the optimized model in
    onnxruntime give a failed report; a failure of the original raises ModelError."""
    start = time.perf_counter()
    meta_a, meta_b = _structure(original), _structure(optimized)
    sig_a, names = _signature(meta_a)
    sig_b, names_b = _signature(meta_b)

    def fail(detail: str, err: float = float("inf"), rel: float = float("inf")) -> VerifyReport:
        return VerifyReport(False, err, rel, names, time.perf_counter() - start, detail)

    if set(names) != set(names_b):
        missing = sorted(set(names) - set(names_b))
        extra = sorted(set(names_b) - set(names))
        what = f"lacks output '{missing[0]}'" if missing else f"has an extra output '{extra[0]}'"
        return fail(f"the optimized model {what}")
    for name in names:
        if not _compatible(sig_a[name], sig_b[name]):
            return fail(f"output '{name}' is declared as {_describe(sig_b[name])}, expected {_describe(sig_a[name])}")
    feeds = random_inputs(meta_a, seed, shapes)
    inputs_b = {vi.name for vi in meta_b.graph.input} - _initializer_names(meta_b)
    unknown = sorted(inputs_b - set(feeds))
    if unknown:
        return fail(f"the optimized model has an input '{unknown[0]}' the original does not have")
    try:
        expected = run_model(original, feeds, provider, optimizations, VERIFY_THREADS, keep_sessions)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several exception types
        raise_if_out_of_memory(e)
        raise ModelError(f"the original model fails in onnxruntime: {one_line(e)}") from None
    try:
        actual = run_model(optimized, feeds, provider, optimizations, VERIFY_THREADS, keep_sessions)
    except Exception as e:  # noqa: BLE001
        raise_if_out_of_memory(e)
        return fail(f"the optimized model fails in onnxruntime: {one_line(e)}")
    worst_abs = worst_rel = 0.0
    for name in names:
        ok, err, rel, why = _compare_one(name, actual[name], expected[name], rtol, atol)
        worst_abs, worst_rel = max(worst_abs, err), max(worst_rel, rel)
        if not ok:
            return fail(why, worst_abs, worst_rel)
    detail = f"{len(names)} output(s) match: max abs error {worst_abs:.3g}, max relative error {worst_rel:.3g}"
    return VerifyReport(True, worst_abs, worst_rel, names, time.perf_counter() - start, detail)


def _compatible(a: tuple[int, tuple[Any, ...] | None], b: tuple[int, tuple[Any, ...] | None]) -> bool:
    """Same element type and rank, and equal sizes wherever both declare a number (symbolic sizes match any)."""
    if a[0] != b[0]:
        return False
    if a[1] is None or b[1] is None:
        return True
    if len(a[1]) != len(b[1]):
        return False
    return all(x == y for x, y in zip(a[1], b[1]) if isinstance(x, int) and isinstance(y, int) and x and y)


def _describe(sig: tuple[int, tuple[Any, ...] | None]) -> str:
    elem, dims = sig
    name = onnx.TensorProto.DataType.Name(elem).lower() if elem else "untyped"
    return f"{name}[{','.join(str(d) for d in dims)}]" if dims is not None else f"{name}[?]"


def verify(original: ModelSource, optimized: ModelSource, **kw: Any) -> VerifyReport:
    """`compare_models`, raising VerificationError (one line: which output, the error) on a mismatch."""
    report = compare_models(original, optimized, **kw)
    if not report.ok:
        raise VerificationError(report.detail)
    return report
