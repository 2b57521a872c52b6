"""Opaque: any other ONNX op, kept verbatim. `key` names the ONNX node spec in the graph's opaque table; `index` is
which of its outputs this tensor is; `shape` and `dtype` come from ONNX shape inference."""

from __future__ import annotations

from tensat.ops.leaves import leaf_shape
from tensat.ops.registry import OpDef, numel, register, shape_from_attr, symbolic_from_model

OPAQUE = register(
    OpDef(
        "opaque",
        "Opaque",
        None,
        (("key", "str"), ("index", "int"), ("shape", "ints"), ("dtype", "str")),
        leaf_shape,
        None,
        shape_from_attr,
        lambda s, o, a: float(numel(o)),
        breaks_layout=True,
        symbolic_shape=symbolic_from_model,
    )
)
