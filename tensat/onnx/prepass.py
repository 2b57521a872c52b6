"""A peer's graph canonicalization, run on a model before tensat reads it (`Options.pre_pass`).

onnxslim folds constants, removes dead code and fuses patterns tensat's rules do not write (MatMul+Add on N-D inputs
into Reshape, Gemm, Reshape, which onnxruntime then runs with its bias fused). bench/prepass.py measures it as a
pre-pass on the real-model corpus. Its output is only what tensat reads: the model as given stays the reference
the result is verified and timed against, and is what a run returns when nothing faster is found.
"""

from __future__ import annotations

from onnx import ModelProto

from tensat.errors import TensatError


def pre_pass(model: ModelProto, name: str) -> ModelProto:
    """`model` as pre-pass `name` ("none" or "onnxslim") rewrites it: a new proto; `model` is left as it was
    (onnxslim edits the proto it is given)."""
    if name == "none":
        return model
    if name != "onnxslim":
        raise TensatError(f"unknown pre-pass {name!r}")
    try:
        import onnxslim  # the 'slim' extra: loaded only by a run that asks for it
    except ImportError:
        raise TensatError("the onnxslim pre-pass needs onnxslim: pip install 'tensat[slim]'") from None
    copy = ModelProto()
    copy.CopyFrom(model)
    return onnxslim.slim(copy)
