"""Dispatch to an extractor by name."""

from __future__ import annotations

from typing import Any

from .egraph import EGraph, ExtractionResult
from .greedy import greedy_dag
from .ilp import ilp_extract

_ILP_ONLY = ("solver", "time_limit", "initial")


def extract(eg: EGraph, method: str = "ilp", **kw: Any) -> ExtractionResult:
    """Extract with ``method`` "ilp" (keywords of :func:`ilp_extract`) or "greedy" (``forbidden`` only;
    the ILP-only keywords solver/time_limit/initial are accepted and ignored, so callers can pass one
    option set to either)."""
    if method == "ilp":
        return ilp_extract(eg, **kw)
    if method == "greedy":
        unknown = set(kw) - {"forbidden", *_ILP_ONLY}
        if unknown:
            raise TypeError(f"greedy extraction got unexpected keyword(s): {', '.join(sorted(unknown))}")
        return greedy_dag(eg, kw.get("forbidden", frozenset()))
    raise ValueError(f"unknown extraction method {method!r} (use 'ilp' or 'greedy')")
