"""tensat: tensor-graph superoptimization by equality saturation.

A run's warnings are in `OptimizeResult.warnings`; they also go to the `tensat` logger, which prints nothing unless
the application configures logging (`logging.basicConfig()` shows them as they happen).

The pipeline's names (`optimize`, `Options`, ...) load on first use (PEP 562), so that importing a part of the
package, such as `tensat.rewrites` or `tensat.extraction`, does not import the whole pipeline.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tensat._version import __version__
from tensat.errors import ModelError, TensatError, VerificationError

if TYPE_CHECKING:
    from tensat.api import OptimizeResult, Options, optimize, optimize_with_details
    from tensat.ir import Graph

logging.getLogger("tensat").addHandler(logging.NullHandler())

_API_NAMES = ("Options", "OptimizeResult", "optimize", "optimize_with_details")

__all__ = [
    "Graph",
    "ModelError",
    "Options",
    "OptimizeResult",
    "TensatError",
    "VerificationError",
    "optimize",
    "optimize_with_details",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """The pipeline's public names, imported on first access and kept."""
    if name in _API_NAMES:
        from tensat import api  # lazy: the whole pipeline, which importing a part of the package must not load

        value = getattr(api, name)
    elif name == "Graph":
        from tensat.ir import Graph as value  # lazy: numpy and the operators, not needed for the error types
    else:
        raise AttributeError(f"module 'tensat' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the ones not yet loaded included."""
    return sorted(set(globals()) | set(__all__))
