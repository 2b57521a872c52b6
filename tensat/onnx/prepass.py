"""A peer's graph canonicalization, run on a model before tensat reads it (`Options.pre_pass`).

onnxslim folds constants, removes dead code and fuses patterns tensat's rules do not write (MatMul+Add on N-D inputs
into Reshape, Gemm, Reshape, which onnxruntime then runs with its bias fused). bench/prepass.py measures it as a
pre-pass on the real-model corpus. Its output is only what tensat reads: the model as given stays the reference
the result is verified and timed against, and is what a run returns when nothing faster is found.

Weights tensat keeps on disk (a model's external data, see `tensat.onnx.load.load_model`) are shown to the pre-pass
as graph inputs of their type and shape, and put back after it: the pre-pass folds what the small constants compute
(shapes, masks) and never holds the weights in memory, which for a model of several GB would take several times
their size; what it would fold over a weight, onnxruntime folds when it loads the model.
"""

from __future__ import annotations

from onnx import ModelProto, TensorProto, helper

from tensat.errors import ModelError, TensatError
from tensat.onnx.external import external_dir, has_external, set_external_dir


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
