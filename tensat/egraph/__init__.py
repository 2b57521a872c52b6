"""Lowering IR graphs into egglog, exploring with rewrite rules under limits, and getting selections back out.

Shapes live inside egglog (`shape-of`, no merge function, computed by the `shapes` ruleset saturated after every
rewrite step), so rules can be guarded by shapes and a union of two differently shaped tensors fails loudly. On the
way out every e-node's shape is recomputed with the Python shape function of its op; an e-node whose shape does not
check is never offered to the extractor.

`TensorEGraph` is the one object callers use; it is assembled from one class per concern:

- `lower.LoweredGraph`: the graph lowered into egglog (declarations, rules, terms, shapes) and the egglog plumbing
  (commands, snapshots, sizes), in a registered e-graph taken from the pool in `pool`;
- `runner.Exploration`: `explore` under node, iteration and time limits with egg's back-off scheduling, the fill up
  to the node limit, `checkpoint` and `rollback`;
- `export.Export`: `export` with pricing for the extractor, the input's own selection, and `rebuild` of a selection
  into an IR graph.
"""

from tensat.egraph import pool
from tensat.egraph.export import COMPETITIVE_SLACK_MS, UNCHOSEN_MS, CostFn, DecodedNode, Export
from tensat.egraph.lower import GUIDED, LoweredGraph
from tensat.egraph.pool import BLANKS_KEPT
from tensat.egraph.runner import (
    BAN_LENGTH,
    FILL_MIN_SECONDS,
    MATCH_LIMIT,
    Backoff,
    Exploration,
    ExplorationStats,
    IterationStats,
)

__all__ = [
    "BAN_LENGTH",
    "BLANKS_KEPT",
    "COMPETITIVE_SLACK_MS",
    "FILL_MIN_SECONDS",
    "GUIDED",
    "MATCH_LIMIT",
    "UNCHOSEN_MS",
    "Backoff",
    "CostFn",
    "DecodedNode",
    "ExplorationStats",
    "IterationStats",
    "LoweredGraph",
    "TensorEGraph",
    "pool",
]


class TensorEGraph(Exploration, Export):
    """An egglog e-graph holding one IR graph and the rules that rewrite it: `explore` it, `export` it for the
    extractor, `rebuild` the extracted selection (see the package docstring for where each part lives)."""
