"""The operator registry: every tensat operator defined once, one module per family.

An operator's `OpDef` (see `registry`) holds everything about it: tensor inputs and typed attributes, shape
function, numpy reference semantics, egglog constructor and shape rule, FLOP count, the ONNX op types it imports
from and exports to, how the rule verifier instantiates it (ranks, shape equations, attribute domains, exactness on
integers), and what the cost models need (a view op costs nothing; which ops break a measured conv graph's blocked
layout). The consumers loop over the registry instead of keeping tables of their own: the ONNX importer and
exporter (`tensat.onnx`; ops with attributes have lowering and emitting functions there, named by the ONNX op types
declared here), the IR and the e-graph, the rule language and verifier (`rewrites`), and the cost models.

Adding an element-wise op is one line in `elementwise.py` (see `unary` and `binary`).
"""

from __future__ import annotations

# Registration order is egglog's declaration order: the families are imported in it.
from tensat.ops import (  # noqa: F401
    conv,
    elementwise,
    indexing,
    kernels,
    layout,
    leaves,
    matmul,
    norm,
    opaque,
    pool,
    reduce,
    transforms,
)
from tensat.ops.conv import (
    ACT_CODES,
    ACT_NAMES,
    ACT_NONE,
    ACT_RELU,
    ACT_SIGMOID,
    ACT_TANH,
    ACTIVATIONS,
    conv2d_reference,
)
from tensat.ops.elementwise import ACTIVATION_DEFAULTS, GELU_APPROXIMATIONS
from tensat.ops.kernels import CONTRIB, KERNELS
from tensat.ops.layout import DEPTH_TO_SPACE_MODES, PAD_MODES
from tensat.ops.matmul import einsum_equation, einsum_shape, einsum_subscripts
from tensat.ops.pool import POOL_RANKS, RESIZE_MODES, RESIZE_NEAREST, RESIZE_TRANSFORMS
from tensat.ops.reduce import REDUCTIONS, axes_input_since, topk_kernel
from tensat.ops.registry import (
    BY_EGG,
    EGG_SORT,
    MAX_RANK,
    REGISTRY,
    SAME,
    TYPE_CODES,
    TYPE_NAMES,
    Attrs,
    Equations,
    OpDef,
    Shape,
    ShapeError,
    Sized,
    constant_leaf,
    dtype_of,
    egg_declarations,
    egg_shape_rules,
    egg_symbolic_shape_rules,
    evaluate,
    get,
    operand_dtypes,
    register,
    resolved,
    shape_of,
    standard,
)
from tensat.ops.transforms import merge_mask

__all__ = [
    "ACTIVATION_DEFAULTS",
    "ACT_CODES",
    "ACT_NAMES",
    "ACT_NONE",
    "ACT_RELU",
    "ACT_SIGMOID",
    "ACT_TANH",
    "ACTIVATIONS",
    "BY_EGG",
    "CONTRIB",
    "DEPTH_TO_SPACE_MODES",
    "GELU_APPROXIMATIONS",
    "KERNELS",
    "TYPE_CODES",
    "TYPE_NAMES",
    "EGG_SORT",
    "MAX_RANK",
    "PAD_MODES",
    "REDUCTIONS",
    "POOL_RANKS",
    "RESIZE_MODES",
    "RESIZE_NEAREST",
    "RESIZE_TRANSFORMS",
    "REGISTRY",
    "SAME",
    "Attrs",
    "Equations",
    "OpDef",
    "Shape",
    "ShapeError",
    "Sized",
    "conv2d_reference",
    "constant_leaf",
    "dtype_of",
    "operand_dtypes",
    "egg_declarations",
    "egg_shape_rules",
    "egg_symbolic_shape_rules",
    "evaluate",
    "get",
    "merge_mask",
    "register",
    "resolved",
    "axes_input_since",
    "topk_kernel",
    "einsum_equation",
    "einsum_shape",
    "einsum_subscripts",
    "shape_of",
    "standard",
]
