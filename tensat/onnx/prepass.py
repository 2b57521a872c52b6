"""A peer's graph canonicalization, run on a model before tensat reads it (`Options.pre_pass`).

onnxslim folds constants, removes dead code and fuses patterns tensat's rules do not write (MatMul+Add on N-D inputs
into Reshape, Gemm, Reshape, which onnxruntime then runs with its bias fused). bench/prepass.py measures it as a
pre-pass on the real-model corpus. Its output is only what tensat reads: the model as given stays the reference
the result is verified and timed against, and is what a run returns when nothing faster is found.
"""

from __future__ import annotations

from onnx import ModelProto

from tensat.errors import ModelError, TensatError


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
    return _same_interface(model, onnxslim.slim(copy), name)


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
