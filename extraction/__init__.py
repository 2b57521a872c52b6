"""Extraction of a minimum DAG-cost acyclic term from an e-graph (egraph-serialize JSON).

Knows nothing of tensors: any e-graph with per-node costs works. ``greedy_dag`` is fast and always
valid; ``ilp_extract`` is optimal (proven where it says so) within a time limit; ``validate``
checks any selection; ``local_search`` polishes a selection by exact-cost moves; ``extract_best`` runs them all
as a portfolio (greedy, cycle filter, local search, two ILP passes) and returns the cheapest selection found.
"""

from .api import extract
from .cycles import filter_cycles
from .egraph import (
    EGraph,
    ENode,
    ExtractionResult,
    InputError,
    copy_result,
    dag_cost,
    find_cycle,
    load_egraph,
    validate,
)
from .greedy import greedy_dag
from .ilp import GAP_TOLERANCE, ilp_extract
from .local import local_search, tree_costs
from .portfolio import extract_best

__all__ = [
    "EGraph",
    "ENode",
    "ExtractionResult",
    "GAP_TOLERANCE",
    "InputError",
    "copy_result",
    "dag_cost",
    "extract",
    "extract_best",
    "filter_cycles",
    "find_cycle",
    "greedy_dag",
    "ilp_extract",
    "load_egraph",
    "local_search",
    "tree_costs",
    "validate",
]
