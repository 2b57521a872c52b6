"""tensat: tensor-graph superoptimization by equality saturation.

A run's warnings are in `OptimizeResult.warnings`; they also go to the `tensat` logger, which prints nothing unless
the application configures logging (`logging.basicConfig()` shows them as they happen).
"""

import logging

from tensat.api import Options, OptimizeResult, optimize, optimize_with_details
from tensat.errors import ModelError, TensatError, VerificationError
from tensat.ir import Graph

__version__ = "0.1.0"

logging.getLogger("tensat").addHandler(logging.NullHandler())

__all__ = [
    "Graph", "ModelError", "Options", "OptimizeResult", "TensatError", "VerificationError", "optimize",
    "optimize_with_details", "__version__",
]
