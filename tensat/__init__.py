"""tensat: tensor-graph superoptimization by equality saturation."""

from tensat.api import Options, OptimizeResult, optimize, optimize_with_details
from tensat.errors import ModelError, TensatError, VerificationError
from tensat.ir import Graph

__version__ = "0.1.0"

__all__ = [
    "Graph", "ModelError", "Options", "OptimizeResult", "TensatError", "VerificationError", "optimize",
    "optimize_with_details", "__version__",
]
