"""`tensat.optimize`: ONNX in, e-graph, exploration, extraction, verified ONNX out.

A run is a sequence of named stages over one state object (`_Run`): import, pricing the input, then the search
(lower, explore, price, guided rounds, extract, rebuild) and the checks of its result (export, pricing as written,
verify, latency check). `_perform` runs them: it times each stage into `OptimizeResult.times` and is the one place a
failure degrades the run, to what the failing stage's fallback leaves (at worst the input model, with a warning).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from tensat import extraction, onnx_io, ops, rewrites
from tensat import verify as verify_mod
from tensat.cost import AnalyticCost, Const, CostModel, Shape, runtime_cost
from tensat.egraph import DecodedNode, ExplorationStats, IterationStats, TensorEGraph
from tensat.errors import (
    BUG,
    ModelError,
    OutOfMemory,
    TensatError,
    VerificationError,
    one_line,
    out_of_memory,
    raise_if_out_of_memory,
)
from tensat.extraction import EGraph
from tensat.files import check_writable
from tensat.ir import Graph, Node
from tensat.latency import KEEP_ABOVE, LatencyComparison, compare_latency
from tensat.latency import RESOLUTION as LATENCY_RESOLUTION
from tensat.measure import MeasuredCost, default_clock, make_measured_cost, resolve_device
from tensat.measure.cache import default_cache_dir
from tensat.measure.timing import last_level_cache, level_two_cache
from tensat.onnx.external import content_digest
from tensat.onnx.symbolic import declared, fixed_shapes, generalize, halfway, other_shapes, sizes_to_try, unsized
from tensat.options import Options
from tensat.progress import ProgressFn, report
from tensat.session import ModelSource, Serialized, proto_of
from tensat.verify import VerifyReport

ModelLike = onnx.ModelProto | str | os.PathLike | Graph


@dataclass(repr=False)
class OptimizeResult:
    """What a run produced and how: the optimized model, costs, e-graph growth and time per phase.

    Costs and node counts describe the model returned (and written): `cost_before`/`cost_after` price the input
    and the returned model as onnxruntime runs them (`tensat.cost.runtime_cost`: the fusions it makes on its own
    are priced fused in both), and `nodes_before`/`nodes_after` count their ONNX nodes. `returned_input` says why
    the input model itself was returned, or is None when the optimized one was. `summary()` is a readable report.
    """

    output: Any  # the optimized model, in the form it was given (ModelProto for a path)
    graph: Graph
    original_graph: Graph
    cost_before: float
    cost_after: float
    exploration: ExplorationStats
    extraction: extraction.ExtractionResult | None
    times: dict[str, float] = field(default_factory=dict)
    verification: Any = None
    warnings: list[str] = field(default_factory=list)
    options: Options = field(default_factory=Options)
    latency: LatencyCheck | None = None  # the optimized model timed against the input end to end
    measurement: dict[str, Any] | None = None  # the measured cost model's device, calibration, cache and counters
    nodes_before: int = 0  # ONNX nodes of the input model
    nodes_after: int = 0  # ONNX nodes of the returned model
    nodes_read: int = 0  # ONNX nodes of the model the search started from: the input, or the pre-pass's output
    nodes_opaque: int = 0  # of those, the ONNX nodes tensat does not model (kept verbatim, opaque to the rules)
    pre_passed: bool = False  # whether the search started from the pre-pass's output (`options.pre_pass`)
    returned_input: str | None = None  # why the input model was returned unchanged; None if optimized
    # the rules behind the extracted graph's changes, with how many changes each explains (whether or not it was
    # returned; `tensat.egraph.provenance`)
    rules: dict[str, int] = field(default_factory=dict)
    # the e-graph the graph was extracted from, as the extraction read it (e-nodes priced, those whose shapes do not
    # check left out): None where no search ran
    egraph: EGraph | None = None
    # the input shapes at which the optimized model, written back with the input's symbolic dims, was verified
    shapes_verified: list[dict[str, list[int]]] = field(default_factory=list)
    # the second of those shapes and the timing there against the input (None where not timed)
    latency_other_shape: tuple[dict[str, list[int]], LatencyComparison] | None = None
    # for a model with symbolic input dims: the shapes it was optimized at, and its symbolic dims
    shapes_optimized: dict[str, list[int]] | None = None
    symbolic_dims: dict[str, list[int | str]] | None = None
    # a first candidate that owed part of its change to multi-pattern rules and did not time faster, after which
    # the graph returned was searched for without them (None where no second search ran)
    with_merges: WithMerges | None = None

    @property
    def modelled(self) -> float:
        """The share of the ONNX nodes the search started from that tensat models (the rules can see them)."""
        return 1.0 - self.nodes_opaque / self.nodes_read if self.nodes_read else 1.0

    @property
    def speedup(self) -> float:
        """Cost ratio before/after under the run's cost model."""
        return self.cost_before / self.cost_after if self.cost_after > 0 else 1.0

    def __repr__(self) -> str:
        outcome = "input returned" if self.returned_input else "optimized"
        return (
            f"<OptimizeResult {outcome}: cost {self.cost_before:.4g} -> {self.cost_after:.4g} ms "
            f"({self.speedup:.3f}x, {self.options.cost}), ONNX nodes {self.nodes_before} -> {self.nodes_after}, "
            f"{len(self.warnings)} warning{'' if len(self.warnings) == 1 else 's'}>"
        )

    def summary(self) -> str:
        """A short multi-line report of the run: what the CLI prints."""
        ex = self.exploration
        lines = [
            f"cost      {self.cost_before:.4f} -> {self.cost_after:.4f} ms ({self.speedup:.3f}x under the "
            f"{self.options.cost} cost model, as onnxruntime runs each)",
            f"nodes     {self.nodes_before} -> {self.nodes_after} ONNX nodes"
            + (f" ({self.nodes_read} read after the {self.options.pre_pass} pre-pass)" if self.pre_passed else "")
            + f", {100 * self.modelled:.1f}% of those read modelled",
            f"e-graph   {ex.enodes:,} e-nodes, {ex.eclasses:,} e-classes after {len(ex.iterations)} iterations "
            f"({ex.stop_reason.replace('_', ' ')})",
        ]
        if self.extraction is not None:
            x = self.extraction
            stop = x.info.get("ilp_stop")
            if stop and x.method != "ilp":  # the portfolio's selection: the ILP ran and found none cheaper
                lines.append(f"extract   {x.method}'s selection: the ILP found none cheaper ({stop})")
            else:
                lines.append(f"extract   {x.method} ({stop or x.status})")
        deferred = ((self.measurement or {}).get("stats") or {}).get("deferred", 0)
        if deferred:
            lines.append(
                f"prices    {deferred} unit(s) left unmeasured when the time budget's pricing share ran out, "
                "priced as unlikely alternatives; a later run with this cost cache measures them (and may extract "
                "another graph), or a larger time_budget (--time-budget) measures them now"
            )
        if self.rules:
            lines.append(
                "rules     "
                + _rule_counts(self.rules)
                + ("" if self.returned_input is None else " (in the extracted graph, which was not returned)")
            )
        lines.append("time      " + ", ".join(f"{k} {v:.2f}s" for k, v in self.times.items()))
        if self.verification is not None:
            v = self.verification
            lines.append(f"verified  max abs error {v.max_abs_error:.2e}, max rel error {v.max_rel_error:.2e}")
        if self.shapes_optimized is not None and self.symbolic_dims is not None:
            names = sorted({d for dims in self.symbolic_dims.values() for d in dims if isinstance(d, str)})
            lines.append(
                f"shapes    symbolic dims {', '.join(names)}; optimized at {_shape_text(self.shapes_optimized)}"
            )
        if self.shapes_verified:
            lines.append(
                "shapes    symbolic dims kept; verified at " + "; ".join(_shape_text(s) for s in self.shapes_verified)
            )
        if self.latency_other_shape is not None:
            shapes, lat = self.latency_other_shape
            lines.append(_latency_line(lat, 1, f" at {_shape_text(shapes)}"))
        if self.with_merges is not None:
            first = self.with_merges
            lines.append(
                "merges    a first graph, with rules "
                + _rule_counts(first.rules)
                + f", was not returned ({first.check.figures()}): searched again without multi-pattern rules"
            )
        if self.latency is not None:
            lines += [_latency_line(lat, threads) for threads, lat in self.latency.by_threads.items()]
            if self.latency.reused:
                lines[-1] += "; an earlier run's timing of the same two models on this machine"
        lines.append(
            "result    "
            + (
                "the optimized model"
                if self.returned_input is None
                else f"the input model, unchanged: {self.returned_input}"
            )
        )
        lines += [f"warning   {w}" for w in self.warnings]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary of the run."""
        ex = self.extraction
        return {
            "cost_before": self.cost_before,
            "cost_after": self.cost_after,
            "speedup": self.speedup,
            "onnx_nodes_before": self.nodes_before,
            "onnx_nodes_after": self.nodes_after,
            "onnx_nodes_read": self.nodes_read,
            "onnx_nodes_opaque": self.nodes_opaque,
            "modelled": self.modelled,
            "pre_passed": self.pre_passed,
            "returned_input": self.returned_input,
            "rules": dict(self.rules),
            "exploration": self.exploration.to_dict(),
            "extraction": None
            if ex is None
            else {
                "method": ex.method,
                "status": ex.status,
                "cost": ex.cost,
                "bound": ex.bound,
                "seconds": ex.seconds,
                "ilp_stop": ex.info.get("ilp_stop"),
            },
            "times": dict(self.times),
            "verification": None
            if self.verification is None
            else {
                "ok": self.verification.ok,
                "max_abs_error": self.verification.max_abs_error,
                "max_rel_error": self.verification.max_rel_error,
            },
            "latency_check": None if self.latency is None else self.latency.to_dict(),
            "shapes_optimized": self.shapes_optimized,
            "symbolic_dims": self.symbolic_dims,
            "shapes_verified": [dict(s) for s in self.shapes_verified],
            "latency_other_shape": None
            if self.latency_other_shape is None
            else {"shapes": self.latency_other_shape[0], **self.latency_other_shape[1].to_dict()},
            "measurement": self.measurement,
            "with_merges": None if self.with_merges is None else self.with_merges.to_dict(),
            "warnings": list(self.warnings),
            "options": {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in self.options.__dict__.items()},
        }


def _rule_counts(rules: Mapping[str, int]) -> str:
    """Rules with how many changes each explains, as the summary lists them: `name x2, other x1`."""
    return ", ".join(f"{name} x{n}" for name, n in rules.items())


def make_cost_model(name: str, device: str = "auto", progress: bool | ProgressFn = False) -> CostModel:
    """The cost model called `name`: "analytic" (roofline) or "measured" (onnxruntime on `device`; `progress` as
    in `tensat.measure.MeasuredCost`)."""
    if name == "analytic":
        return AnalyticCost()
    if name == "measured":
        return make_measured_cost(device, progress=progress)
    raise TensatError(f"unknown cost model {name!r}")


_log = logging.getLogger("tensat")


class RunLog:
    """A run's warnings and progress. Warnings are kept for `OptimizeResult.warnings` (the one channel a caller
    reads) and also go to the `tensat` logger, which says nothing unless the application configures logging;
    progress goes to the caller's callback, if any (see `tensat.progress`)."""

    def __init__(self, progress: ProgressFn | None = None) -> None:
        self.warnings: list[str] = []
        self.progress = progress
        self.stage = "import"  # the stage said last (`say`): where a run that fails stopped

    def warn(self, message: str) -> None:
        """Record a warning: it says what happened and what the user can do."""
        self.warnings.append(message)
        _log.warning(message)

    def say(self, stage: str, detail: str = "") -> None:
        """Report progress: the stage the run is in and where in it."""
        self.stage = stage
        report(self.progress, stage, detail)


def _recoverable(exc: BaseException) -> bool:
    """Errors the optimization recovers from: any Exception and a Rust panic inside egglog (pyo3's PanicException
    derives from BaseException), never Ctrl-C or an exit request."""
    return not isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit))


class _FallbackCost:
    """A cost model whose failures (an exception, or a NaN, infinite or negative cost) fall back to the analytic
    estimate, node by node. A node that failed once is always priced analytically, so the input graph and the
    optimized graph are compared on the same footing; `failed` records why, for the run's warning."""

    def __init__(self, inner: CostModel, log: RunLog) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", "cost")
        self.analytic = AnalyticCost()
        self.log = log
        self.failed: dict[tuple[Any, ...], str] = {}
        self.prefetch_failed = False

    def __getattr__(self, attr: str) -> Any:
        """Anything else (a measuring model's statistics or configuration) is the inner model's."""
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def prefetch(
        self, items: Sequence[tuple[Node, Sequence[Shape], Sequence[Const]]], deadline: float | None = None
    ) -> list[int]:
        """Forward to the inner model's prefetch; a failure there only means nodes are priced one by one."""
        prefetch = getattr(self.inner, "prefetch", None)
        if prefetch is None:
            return []
        try:
            return list(prefetch(items, deadline) or ())
        except Exception as exc:  # noqa: BLE001 - a measuring model may fail in any way
            if not self.prefetch_failed:
                self.log.warn(
                    f"the {self.name} cost model could not measure ops in a batch "
                    f"({one_line(exc, typed=True)}); measuring them one by one instead, which is slower"
                )
            self.prefetch_failed = True
            return []

    def __call__(self, node: Node, in_shapes: Sequence[Shape], const: Sequence[Const] = ()) -> float:
        key = (node.op, node.attrs, node.shape, tuple(tuple(s) for s in in_shapes), tuple(const))
        if key not in self.failed:
            try:
                value = float(self.inner(node, in_shapes, const))
            except Exception as exc:  # noqa: BLE001
                self.failed[key] = one_line(exc, typed=True)
            else:
                if math.isfinite(value) and value >= 0:
                    return value
                self.failed[key] = f"cost {value}"
        return self.analytic(node, in_shapes, const)

    def report(self) -> None:
        """Flag the run when any node was priced by the analytic fallback."""
        if self.failed:
            ops_failed = sorted({key[0] for key in self.failed})
            first = next(iter(self.failed.values()))
            self.log.warn(
                f"the {self.name} cost model could not price {len(self.failed)} node(s) "
                f"({', '.join(ops_failed)}; first failure: {first}); used the analytic estimate for them"
            )


def _cost_model(opts: Options, log: RunLog) -> _FallbackCost:
    """The run's cost model, guarded; one that cannot be built falls back to the analytic model (with a warning)."""
    try:
        inner = make_cost_model(opts.cost, opts.device, log.progress or False)
    except TensatError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. the measuring backend is missing or fails to start
        log.warn(
            f"the {opts.cost} cost model is unavailable ({one_line(exc, typed=True)}); used the analytic "
            f"estimate instead (pass cost='analytic' / --cost analytic to choose it)"
        )
        inner = AnalyticCost()
    return _FallbackCost(inner, log)


def _measured(cost: _FallbackCost, opts: Options) -> MeasuredCost | None:
    """The run's cost model if it times ops on a device, or None (analytic costs, or the analytic fallback)."""
    if opts.cost != "measured":
        return None
    return cost.inner if isinstance(cost.inner, MeasuredCost) else None


COMPETITIVE_RATIO = 4.0  # with measured costs, e-nodes estimated above this many times their e-class's cheapest
# are not measured (see TensorEGraph.export): only alternatives far costlier than another, not ones whose order the
# estimate's error could reverse


PRE_PASS_DIR = "pre-pass"  # where in the cache directory the pre-pass's results are kept (`onnx_io.cached_pre_pass`)

PRICE_SECONDS = 8.0  # with measured costs, one export measures new prices for at most about this long (a later
# run measures the next ones: the cache fills over runs, and no run spends more than this on it)

# The time budget's phases, as shares of `time_budget` counted from the start of the search: exploration ends by the
# first, the guided rounds by the second, extraction by the end. Exploration and the guided rounds find the graphs;
# the extraction's local search and ILP choose among them, and need a share of their own to do it on large e-graphs.
EXPLORE_SHARE = 0.4
GUIDED_SHARE = 0.8
MIN_PRICE_SECONDS = 1.0  # an export measures new prices for at least this long, whatever the budget has left
MIN_EXTRACT_SECONDS = 0.5  # the extraction portfolio's least time (greedy and the input's selection need no more)
SAMPLE_SECONDS = 0.2  # the local search of one sample of the extracted cost during exploration
STALE_SHARE = 0.1  # exploration also stops once the sampled cost has not dropped for this share of the time budget


@dataclass(frozen=True)
class Exported:
    """The e-graph as exported for extraction: the extraction e-graph, the decoded e-node behind each of its node
    ids, the e-nodes that must not be chosen (see `TensorEGraph.export`) and the input graph's own selection. E-class
    ids are per export: a selection is read against the export it was made in."""

    egraph: extraction.EGraph
    decoded: dict[str, DecodedNode]
    forbidden: frozenset[str]
    input_choices: dict[str, str]
    shapes: dict[int, tuple[int, ...]]  # the shape of each e-class

    def priced(self, choices: dict[str, str], method: str) -> extraction.ExtractionResult:
        """A selection known to be valid (the input's, or a graph's carried into this export), priced here."""
        return extraction.ExtractionResult(
            choices, extraction.dag_cost(self.egraph, choices), None, method, 0.0, method
        )


def check_threads() -> tuple[int, ...]:
    """The intra-op thread counts the end-to-end check times at: one thread and every core of the machine."""
    return tuple(sorted({1, os.cpu_count() or 1}))


@dataclass
class LatencyCheck:
    """The optimized model timed against the input end to end, at the thread counts of `check_threads()` in order
    until one shows it not measurably faster (which rejects it whatever the others show); `reused` where the
    verdict is an earlier run's, which timed the same two models on this machine (`_verdict_key`)."""

    by_threads: dict[int, LatencyComparison]
    kept: bool  # whether the optimized model was kept
    reused: bool = False

    def to_dict(self) -> dict[str, Any]:
        timed = {f"threads={t}": c.to_dict() for t, c in self.by_threads.items()}
        return {"kept": self.kept, **({"reused": True} if self.reused else {}), **timed}

    @staticmethod
    def from_dict(d: Mapping[str, Any], reused: bool = False) -> LatencyCheck:
        """The check `to_dict` wrote."""
        by_threads = {
            int(k.split("=", 1)[1]): LatencyComparison.from_dict(v) for k, v in d.items() if k.startswith("threads=")
        }
        return LatencyCheck(by_threads, bool(d["kept"]), reused)

    def __repr__(self) -> str:
        return f"<LatencyCheck {'kept' if self.kept else 'not kept'}: {self.figures()}>"

    def figures(self) -> str:
        """The speedup and its interval at each thread count, in words."""
        return ", ".join(_figures(c, t) for t, c in self.by_threads.items())


def _figures(timed: LatencyComparison, threads: int) -> str:
    """A timing's speedup and its interval, in words: `1.012x at 1 thread, 95% interval 1.004-1.020`."""
    return f"{timed.speedup:.3f}x at {_threads(threads)}, 95% interval {timed.interval[0]:.3f}-{timed.interval[1]:.3f}"


def _latency_line(timed: LatencyComparison, threads: int, where: str = "") -> str:
    """The summary's line for a timing: the median of the pairs' ratios alone (the two models' medians beside it
    could point the other way), its interval, and how many pairs it rests on."""
    low, high = timed.interval
    return (
        f"latency   {timed.speedup:.3f}x end to end at {_threads(threads)}{where} "
        f"(95% interval {low:.3f}-{high:.3f}, {timed.pairs} pairs of timed blocks)"
    )


FUTILE_PAIRS = 10  # the end-to-end check stops timing a thread count once this many pairs show no gain beyond
# `KEEP_ABOVE`, the speedup it must show beyond doubt (`measurably_faster`; CHECK_PAIRS where the cost model predicts
# a gain beyond it: a gain of a few percent is within the spread of ten pairs on a shared machine),
DECIDED_MARGIN = 0.05  # or a gain beyond this much more than it must show
CHECK_PAIRS = 40  # pairs of blocks the end-to-end check times at each thread count ...
EXTENDED_PAIRS = 100  # ... and up to this many where the first CHECK_PAIRS leave the answer open, ...
EXTEND_SHARE = 0.35  # ... until this share of the thread count's seconds has passed
CHECK_SESSIONS = 2  # sessions of each model the end-to-end check times in turns (see `tensat.latency.Interleaved`)
ONE_SESSION_BYTES = 2**29  # ... one only for a model with more weights than this: each session holds their copy,
COPIES_SHARE = 0.1  # ... or where opening the extra sessions would take more than this share of `latency_check`


def _not_faster(check: LatencyCheck) -> str:
    """Why `_faster` rejected a candidate, in words that match its figures: the thread counts it was not measurably
    faster at, or else those it was faster at by less than the timing's resolution."""
    slow = [t for t, c in check.by_threads.items() if c.interval[0] <= 1.0]
    if slow:
        return f"the optimized graph was not measurably faster end to end at {_counts(slow)} ({check.figures()})"
    short = [t for t, c in check.by_threads.items() if c.interval[0] <= KEEP_ABOVE]
    return (
        f"the optimized graph was faster end to end at {_counts(short)} by less than the "
        f"{100 * LATENCY_RESOLUTION:g}% two sessions of one model can differ by ({check.figures()})"
    )


def _counts(threads: Sequence[int]) -> str:
    """Thread counts in words: `1 thread, 2 threads`."""
    return ", ".join(_threads(t) for t in threads)


def _threads(count: int) -> str:
    """A thread count in words: `1 thread`, `2 threads`."""
    return f"{count} thread{'s' if count > 1 else ''}"


def measurably_faster(lows: Collection[float]) -> bool:
    """The end-to-end check's keep rule, on the lower ends of the speedups' 95% intervals at each thread count:
    above the timing's resolution (1 + `LATENCY_RESOLUTION`) at every one. A gain within what two sessions of one
    model differ by is not worth a graph that differs from the user's, and may time slower in the user's own
    session; at a thread count the user runs, a clear gain at another one does not make up for that (kept on such a
    gain at two threads, models timed measurably slower there minutes later)."""
    return bool(lows) and all(low > KEEP_ABOVE for low in lows)


def _faster(by_threads: Mapping[int, LatencyComparison]) -> bool:
    return measurably_faster([c.interval[0] for c in by_threads.values()])


def check_copies(original: ModelSource, optimized: ModelSource, thread_counts: int, seconds: float) -> int:
    """Sessions of each model the end-to-end check times in turns at each of `thread_counts` thread counts, in
    `seconds` at most: `CHECK_SESSIONS`, or one where each session's copy of the weights is over
    `ONE_SESSION_BYTES`, or where opening the extra sessions, at the time the models' last sessions took to open
    (`Serialized.opened`), would take more than `COPIES_SHARE` of `seconds`."""
    models = (original, optimized)
    weights = max(onnx_io.weight_bytes(m if isinstance(m, (str, os.PathLike)) else proto_of(m)) or 0 for m in models)
    opening = sum(m.opened or 0.0 for m in models if isinstance(m, Serialized))
    extra = opening * (CHECK_SESSIONS - 1) * thread_counts
    return CHECK_SESSIONS if weights <= ONE_SESSION_BYTES and extra <= COPIES_SHARE * seconds else 1


def _check_share(seconds: float, deadline: float, counts: int, counts_left: int) -> float:
    """The seconds of the end-to-end check's next thread count: an equal part of what is left until `deadline`
    among the `counts_left` thread counts still to time, and no less than an equal part of all `seconds` among all
    `counts`. A thread
    count decided early (a large gain beyond doubt stops its timing) leaves its seconds to the next, where a
    shared machine's bursts of load can leave a gain as clear in the median undecided at the equal share."""
    return max(seconds / counts, (deadline - time.perf_counter()) / counts_left)


def _end_to_end_check(
    original: ModelSource, optimized: ModelSource, device: str, opts: Options, log: RunLog, predicted: float = 1.0
) -> LatencyCheck | None:
    """Time the optimized model against the input (the user's own model) end to end, interleaved, at one thread
    and at every core (`tensat.latency.compare_latency`, `latency_check` seconds in all); the optimized model is
    kept only if `_faster`. Summed per-op costs miss what only a whole graph shows (fusions onnxruntime makes,
    which weights are still cached), so no cost model alone decides what is returned. A thread count stops being
    timed once `FUTILE_PAIRS` pairs of blocks show no gain beyond the timing's resolution (`KEEP_ABOVE`, the keep
    rule of `measurably_faster`), and the next is not timed once one rejects the model: stopping early can only
    reject. One whose `CHECK_PAIRS` pairs leave the answer open (faster in the median, not yet measurably) is timed
    on to `EXTENDED_PAIRS`, until `EXTEND_SHARE` of its share of `latency_check` has passed: gains of a few percent
    are otherwise decided by the noise of a shared machine, and the cap keeps a large model's extension from
    doubling the run. Each model runs in `CHECK_SESSIONS` sessions in turns, so a verdict rests less on where one
    session's memory happened to lie (in one, for a model of over `ONE_SESSION_BYTES` of weights, since each session
    holds a copy of them, or one whose sessions, as verification opened them, take so long to open that the copies
    would cost more than `COPIES_SHARE` of the check's seconds).
    Where the cost model predicts a gain (`predicted`, the input's cost over the candidate's) beyond the timing's
    resolution, no thread count stops as futile before `CHECK_PAIRS` pairs: ten pairs on a shared machine span a
    few percent, and a predicted gain of that size was otherwise rejected in one run and kept in the next.
    A thread count also stops once `FUTILE_PAIRS` pairs show a gain beyond what it must show by `DECIDED_MARGIN`
    more at 95% confidence (a model several times faster needs no 40 pairs to tell), and leaves the seconds it did not
    use to the thread counts after it (`_check_share`).
    None when the check could not run (with a warning): the verified optimized model is then kept."""
    threads = check_threads()
    by_threads: dict[int, LatencyComparison] = {}
    copies = check_copies(original, optimized, len(threads), opts.latency_check)
    futile = CHECK_PAIRS if predicted > KEEP_ABOVE else FUTILE_PAIRS
    deadline = time.perf_counter() + opts.latency_check
    try:
        for k, t in enumerate(threads):
            share = _check_share(opts.latency_check, deadline, len(threads), len(threads) - k)
            by_threads[t] = compare_latency(
                original,
                optimized,
                provider=device,
                threads=t,
                clock=default_clock(device, t),
                max_seconds=share,
                seed=opts.seed,
                pairs=CHECK_PAIRS,
                futile_after=futile,
                extend_to=EXTENDED_PAIRS,
                extend_seconds=EXTEND_SHARE * share,
                keep_above=KEEP_ABOVE,
                decided_above=KEEP_ABOVE + DECIDED_MARGIN,
                decided_after=FUTILE_PAIRS,
                copies=copies,
            )
            if by_threads[t].interval[0] <= KEEP_ABOVE:  # rejected whatever the other thread counts show
                break
    except Exception as exc:  # noqa: BLE001 - the graph is verified; a failed timing only loses the check
        raise_if_out_of_memory(exc)
        log.warn(
            f"the end-to-end latency check could not run ({one_line(exc, typed=True)}); returned the "
            f"verified optimized model untimed (latency_check=0 / --latency-check 0 skips the check)"
        )
        return None
    kept = _faster(by_threads)
    return LatencyCheck(by_threads, kept)


# -------------------------------------------------------------------------------------------------------------------
# The run: named stages over one state object


@dataclass(frozen=True)
class WithMerges:
    """A candidate that owed part of its change to multi-pattern rules and that the end-to-end check did not find
    faster, after which the run searched again without those rules (`_search_without_merges`)."""

    rules: dict[str, int]  # the rules behind its changes, as `OptimizeResult.rules`
    check: LatencyCheck  # its end-to-end check
    reason: str  # why it was not returned

    def to_dict(self) -> dict[str, Any]:
        return {"rules": dict(self.rules), "latency_check": self.check.to_dict(), "reason": self.reason}


@dataclass
class _Run:
    """One optimization run, filled in stage by stage: what every stage reads and writes.

    What the run returns is the input (graph, model and cost) until an optimized graph, the `candidate`, passes
    every check; `returned_input` says why the input is returned, and is None once the candidate is accepted.
    The fields left None are set by the stages in order; a stage asserts that those it reads are set."""

    opts: Options
    log: RunLog
    source: ModelLike  # the model as given
    times: dict[str, float] = field(default_factory=dict)
    # the input and the cost model
    read: Graph | None = None  # the input graph as read from the model as given, compacted: what the input costs
    graph: Graph | None = None  # the graph the search starts from: `read`, or the pre-pass's output, in its forms
    nodes_read: int = 0  # ONNX nodes of the model the search starts from
    pre_passed: bool = False  # whether that is the pre-pass's output (`graph`)
    model: onnx.ModelProto | None = None  # the input model (None for a Graph neither verified nor timed)
    given: onnx.ModelProto | None = None  # the model as given, unfixed, where its symbolic dims need it (`_given`)
    cost: _FallbackCost | None = None
    measured: MeasuredCost | None = None  # the cost model if it times ops on a device
    cost_before: float = 0.0
    # the search
    search_start: float = 0.0  # perf_counter when the search began: the time budget counts from then
    measured_before_search: float = 0.0  # the cost model's seconds of measuring by then (`_start_search_clock`)
    te: TensorEGraph | None = None
    stats: ExplorationStats = field(default_factory=ExplorationStats)
    exported: Exported | None = None
    last_export: tuple[int, Exported] | None = None  # the e-graph's version when exported, and the export
    sampled: tuple[Exported, extraction.ExtractionResult] | None = None  # the last sample's export and selection
    checkpoint: tuple[Exported, extraction.ExtractionResult] | None = None  # `all`: the hand-written rules' graph
    guided: extraction.ExtractionResult | None = None  # the guided rounds' selection, in `exported`
    chosen: extraction.ExtractionResult | None = None
    # the optimized graph while it goes through the checks: as written to ONNX, read back, and priced
    candidate: Graph | None = None
    candidate_rules: dict[str, int] = field(default_factory=dict)  # see `OptimizeResult.rules`
    candidate_model: onnx.ModelProto | None = None
    written: Graph | None = None
    candidate_cost: float = 0.0
    checked: tuple[Serialized, Serialized] | None = None  # the input and the candidate as the checks run them
    shapes_verified: list[dict[str, list[int]]] = field(default_factory=list)  # other shapes of symbolic dims
    timed_other: tuple[dict[str, list[int]], LatencyComparison] | None = None  # timed at one of those
    # the outcome
    report: VerifyReport | None = None
    check: LatencyCheck | None = None
    returned_input: str | None = "no cheaper graph found"
    started: float = field(default_factory=time.perf_counter)  # when the run began, for `RUN_SECONDS`
    with_merges: WithMerges | None = None  # the first candidate, where a search without merges followed its check


def _budget_left(run: _Run, share: float = 1.0) -> float:
    """Seconds left until `share` of the time budget has passed since the search began (0 when it has), the time
    spent measuring prices since then not counted: a run whose prices are cached measures nothing, so without that
    a first run would search, price and extract in what its measurements left, and choose from fewer measured
    e-nodes."""
    measuring = _measuring_seconds(run) - run.measured_before_search
    return max(0.0, run.search_start + share * run.opts.time_budget + measuring - time.perf_counter())


def _measuring_seconds(run: _Run) -> float:
    """Seconds the run's cost model has spent measuring so far (0 for one that does not measure)."""
    return run.measured.stats.seconds if run.measured is not None else 0.0


def _start_search_clock(run: _Run) -> None:
    """Start the time budget now; what the cost model measured before (the input's price) is not taken from it, and
    so is not given back either."""
    run.search_start = time.perf_counter()
    run.measured_before_search = _measuring_seconds(run)


def _always(run: _Run) -> bool:
    return True


@dataclass(frozen=True)
class _Stage:
    """A named step of the run. `work(run)` does it; `key` names the entry of `times` it is timed under (None: it
    records its own times, or none); `when(run)` says whether it runs at all; where it fails, `fallback(run, error)`
    degrades the run (None: the failure propagates)."""

    key: str | None
    work: Callable[[_Run], None]
    fallback: Callable[[_Run, BaseException], None] | None = None
    when: Callable[[_Run], bool] = _always


def _perform(run: _Run, stages: Sequence[_Stage]) -> None:
    """Run the stages in order: the one place a stage is timed and its failure handled.

    A recoverable failure (`_recoverable`) degrades the run to what the stage's fallback leaves; Ctrl-C, an exit
    request and the failures of a stage with no fallback propagate. Running out of memory ends the run with an
    `OutOfMemory` error naming the stage (`_out_of_memory`), whatever the stage: no fallback is taken for it, and
    the model is not blamed. A stage's time excludes what it records under
    other keys itself (the exploring of a guided round is exploration time; the cycle filter runs inside the
    extraction)."""
    for stage in stages:
        if not stage.when(run):
            continue
        t = time.perf_counter()
        recorded = sum(run.times.values())
        try:
            stage.work(run)
        except BaseException as exc:  # noqa: BLE001 - egglog's Rust panics derive from BaseException
            if out_of_memory(exc):
                raise exc if isinstance(exc, OutOfMemory) else _out_of_memory(run) from None
            if stage.fallback is None or not _recoverable(exc):
                raise
            stage.fallback(run, exc)
        if stage.key is not None:
            run.times[stage.key] = time.perf_counter() - t - (sum(run.times.values()) - recorded)


# what the run was doing in each stage it reports (`tensat.progress.STAGES`), for the out-of-memory error
_DOING = {
    "import": "reading the model",
    "cost": "pricing the input's ops",
    "explore": "exploring the e-graph",
    "price": "pricing the e-graph",
    "guided": "exploring the e-graph",
    "extract": "extracting the optimized graph",
    "export": "writing the optimized graph",
    "verify": "verifying the optimized graph in onnxruntime",
    "latency": "timing both models end to end",
}


def _out_of_memory(run: _Run) -> OutOfMemory:
    """The error for a run that ran out of memory: the stage, the size of the model's weights, and what gives the
    run more room. It never says the model is at fault."""
    model = run.model if run.model is not None else run.source
    size = onnx_io.weight_bytes(model) if isinstance(model, (onnx.ModelProto, str, os.PathLike)) else None
    weights = f"; the model has {size / 2**30:.2f} GiB of weights" if size else ""
    return OutOfMemory(
        f"out of memory while {_DOING.get(run.log.stage, run.log.stage)}{weights}: give the run more room with "
        f"--verify off, --latency-check 0 or a smaller --node-limit, or run it on a machine with more memory"
    )


def _reject(run: _Run, reason: str) -> None:
    """The candidate fails a check: the input is returned, for `reason`."""
    run.candidate, run.returned_input = None, reason


def _has_candidate(run: _Run) -> bool:
    return run.candidate is not None


# -- the input


def _import(run: _Run) -> None:
    """Read the model (or take the Graph given) into the input graph, and the graph the search starts from: the
    pre-pass's output where one runs and tensat reads it, else the input graph itself. A model tensat cannot read as
    given is still optimized where it reads the pre-pass's output; that graph is then the input's price too."""
    run.log.say("import", "reading the model")
    if isinstance(run.source, Graph):
        run.read = run.graph = run.source.compact()
        run.model = onnx_io.export_model(run.source) if run.opts.verify or run.opts.latency_check > 0 else None
        return
    run.model = _load_sized(run)
    run.nodes_read = len(run.model.graph.node)
    unread: ModelError | None = None
    try:
        run.read = onnx_io.import_model(run.model, check=False, runtime_fusions=True).compact()  # checked on load
    except ModelError as exc:
        if run.opts.pre_pass == "none":
            raise
        unread = exc
    graph = _read_pre_passed(run) if run.opts.pre_pass != "none" else None
    if graph is None and unread is not None:
        raise unread
    run.graph = graph.compact() if graph is not None else run.read
    run.pre_passed = graph is not None
    if run.read is None:
        run.read = run.graph


def _load_sized(run: _Run) -> onnx.ModelProto:
    """The model with its inputs at the shapes given (`onnx_io.load_model`); a symbolic dim other than a batch that
    they give no size takes the first of `sizes_to_try` the model runs at, tried by running it once in onnxruntime
    (a waveform too short for a conv stack, a sequence longer than its position table). A size at which an output
    dim past the first is 1 where the next larger size makes it longer is passed over: a dim derived from the
    symbolic one (wav2vec2's frames from its samples) that is 1 there cannot be told from the batch when the result
    is written for every size. Raises ModelError where it runs at none."""
    assert not isinstance(run.source, Graph)
    shapes = run.opts.input_shapes
    model = onnx_io.load_model(run.source, shapes, keep_external=True)
    dims = onnx_io.symbolic_dims(model)
    missing = unsized(dims, shapes) if dims is not None else []
    if not missing:
        return model
    failed = ""
    sizes = sizes_to_try(model)
    ones: tuple[int, onnx.ModelProto, set[tuple[str, int]]] | None = None  # ran, with output dims of 1
    for size in sizes:
        if ones is not None and size < ones[0]:
            continue
        if size != sizes[0]:
            model = onnx_io.load_model(run.source, shapes, keep_external=True, size=size)
        run.log.say("import", f"checking that the model runs with {', '.join(missing)} at {size}")
        try:
            outputs = verify_mod.run_model(model, verify_mod.random_inputs(model, run.opts.seed), keep=False)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's refusals have several types
            raise_if_out_of_memory(exc)
            failed = failed or one_line(exc)
            continue
        at = {(name, axis): d for name, value in outputs.items() for axis, d in enumerate(np.shape(value))}
        if ones is not None and all(at.get(key, 1) == 1 for key in ones[2]):
            return ones[1]  # the dims of 1 stay 1 at this larger size: they are not derived from the symbolic dim
        unit = {key for key, d in at.items() if d == 1 and key[1] > 0}
        if not unit:
            return model
        ones = (size, model, unit)
    if ones is not None:
        return ones[1]
    raise ModelError(
        f"the model does not run with its symbolic dim {', '.join(missing)} at any of {', '.join(map(str, sizes))} "
        f"({failed}); pass the shape to optimize it at, e.g. --input-shape NAME=D1,D2,..."
    )


def _read_pre_passed(run: _Run) -> Graph | None:
    """The input as tensat reads it after the pre-pass (`onnx_io.pre_pass`), timed as `pre_pass`; None, with a
    warning, where the pre-pass fails or tensat cannot import its output: the model as given is read instead. The
    model as given (`run.model`) stays the reference of every check."""
    assert run.model is not None
    name = run.opts.pre_pass
    run.log.say("import", f"running the {name} pre-pass")
    t = time.perf_counter()
    try:
        dims = onnx_io.symbolic_dims(run.model)
        kept = default_cache_dir() / PRE_PASS_DIR  # a warm run reads the result instead of running the pre-pass
        if dims is None:
            model = onnx_io.cached_pre_pass(run.model, name, kept)
            shapes = None
        else:  # at the symbolic dims, so that what it folds holds at every size of them
            model = onnx_io.cached_pre_pass(declared(run.model, dims), name, kept)
            shapes = fixed_shapes(run.model)
        graph = onnx_io.import_model(model, shapes, check=False, runtime_fusions=True)  # loads it: sorted, inferred
    except TensatError as exc:
        if isinstance(exc, ModelError):  # its output is not a model tensat reads; the input is
            run.log.warn(f"tensat cannot read the {name} pre-pass's output ({exc}); read the model as given")
            return None
        raise  # the pre-pass is not installed
    except Exception as exc:  # noqa: BLE001 - a peer's failure on this model: the model as given is still read
        raise_if_out_of_memory(exc)
        run.log.warn(f"the {name} pre-pass failed ({one_line(exc, typed=True)}); read the model as given")
        return None
    finally:
        run.times["pre_pass"] = time.perf_counter() - t
    run.nodes_read = len(model.graph.node)
    return graph


def _price_input(run: _Run) -> None:
    """Build the cost model and price the input as onnxruntime runs it. Where the pre-pass's graph prices above it,
    the search starts from the input as read instead: a peer's canonical form is not always the cheaper one (onnxslim
    writes a 3-D MatMul and its bias as Reshape, Gemm, Reshape), and the search does not undo it."""
    assert run.graph is not None
    run.cost = _cost_model(run.opts, run.log)
    run.measured = _measured(run.cost, run.opts)
    if run.measured is not None:  # it sizes its cache state by the weights one inference reads
        run.measured.observe_graph(run.graph)
    assert run.read is not None
    run.log.say("cost", f"pricing the input's {run.read.op_count()} ops")
    run.cost_before = runtime_cost(run.read, run.cost)
    if run.pre_passed and run.graph is not run.read and run.model is not None:
        start = runtime_cost(run.graph, run.cost)
        if start > run.cost_before * (1 + extraction.GAP_TOLERANCE):
            run.log.say(
                "cost",
                f"the {run.opts.pre_pass} pre-pass's graph prices above the model as given ({start:.4g} against "
                f"{run.cost_before:.4g} ms): searching from the model as given",
            )
            run.graph, run.nodes_read, run.pre_passed = run.read, len(run.model.graph.node), False


# -- the search: lower, explore, price, guided rounds, extract, rebuild


LIMITS = ("node_limit", "iter_limit", "time_limit", "time_budget")


def _lower(run: _Run) -> None:
    assert run.graph is not None
    run.log.say("explore", f"lowering {run.graph.op_count()} ops into egglog")
    present = {run.graph.nodes[i].op for i in run.graph.live()}
    if run.opts.rules == "generated":
        first = rewrites.matchable(present, rewrites.rule_set("generated"))
    else:  # `all` registers the generated set later (`_explore`)
        first = rewrites.select_rules(present, rewrites.rule_set("hand"))
    run.te = TensorEGraph(run.graph, first)


def _explore(run: _Run) -> None:
    """Apply the rules to saturation or a limit; timed by egglog's own clock (guided rounds add to it)."""
    opts, log = run.opts, run.log

    def iteration(it: IterationStats) -> None:
        number = it.iteration + (len(stats.iterations) if stats is not None else 0)
        log.say("explore", f"iteration {number}: {it.enodes:,} e-nodes, {it.eclasses:,} e-classes")

    assert run.te is not None
    share = _budget_left(run, EXPLORE_SHARE)
    stats: ExplorationStats | None = None
    # `all` explores with the hand-written rules first, as `hand` does, then goes on with every rule within what is
    # left of the limits: its e-graph holds what `hand` finds, however much the generated set grows it, and the graph
    # `hand` would extract is a start of the extraction (`_hand_checkpoint`). With a
    # generated set, each later stage registers the rules that the e-graph the last stage reached can match
    # (`rewrites.matchable`), until none is left
    while True:
        done = (len(stats.iterations), stats.seconds) if stats is not None else (0, 0.0)
        left = min(opts.time_limit, share) - done[1]
        if stats is not None and (
            stats.stop_reason in ("error", "node_limit") or done[0] >= opts.iter_limit or left <= 0
        ):
            break
        t = time.perf_counter()
        if stats is not None:
            if opts.rules == "hand":
                break
            registered = {r.name for r in run.te.rules}
            fresh = rewrites.matchable(run.te.ops_present(), rewrites.rule_set(opts.rules), registered)
            if not fresh:
                break
            if opts.rules == "all" and run.checkpoint is None:
                _hand_checkpoint(run)
            run.te.add_rules(fresh)
        registering = time.perf_counter() - t
        stage = run.te.explore(
            node_limit=opts.node_limit,
            iter_limit=opts.iter_limit - done[0],
            time_limit=left - registering,
            k_multi=max(0, opts.k_multi - done[0]),  # the first iterations of the whole exploration, not the stage's
            on_iteration=iteration,
            converged=_Sampler(run) if opts.patience > 0 else None,
        )
        stage.seconds += registering
        stats = stage if stats is None else stats.followed_by(stage)
    assert stats is not None
    run.stats = stats
    if stats.stop_reason == "time_limit" and share < opts.time_limit:
        stats.stop_reason = "time_budget"
    run.times["explore"] = stats.seconds
    if stats.stop_reason == "error":
        log.warn(f"exploration stopped by an egglog error ({stats.error}); extracted from the e-graph before it: {BUG}")
    elif stats.stop_reason in LIMITS:
        reason = stats.stop_reason
        value = f"{getattr(opts, reason):g}{' s' if reason in ('time_limit', 'time_budget') else ''}"
        where = (
            f"the {EXPLORE_SHARE:.0%} share of its time budget ({value})"
            if reason == "time_budget"
            else f"its {reason.replace('_', ' ')} ({value})"
        )
        log.warn(
            f"exploration stopped at {where} before saturation ({stats.enodes} e-nodes); raising {reason} "
            f"(--{reason.replace('_', '-')}) may find a better graph"
        )


def _hand_checkpoint(run: _Run) -> None:
    """`all`, once the hand-written rules have run: their e-graph priced as `hand` prices it, and a graph extracted
    from it by a local search (`run.checkpoint`), carried into the final export as a start of the extraction. The
    generated set can grow the e-graph tenfold; without this, a measured cost model spends its pricing window on
    the new e-nodes, leaves the ones a `hand` run chose priced by estimate, and extracts a costlier graph than
    `hand` from an e-graph that holds `hand`'s. The prices measured here are cached, so the final export has them."""
    x = _export(run)
    start = extraction.greedy_dag(x.egraph, forbidden=x.forbidden)
    initial = x.priced(x.input_choices, "input")
    found = extraction.local_search(
        x.egraph,
        initial if initial.cost <= start.cost else start,
        forbidden=x.forbidden,
        time_limit=min(extraction.portfolio.local_search_seconds(run.opts.ilp_time_limit), _budget_left(run)),
    )
    run.checkpoint = (x, found)
    run.log.say("explore", f"the hand-written rules' graph: cost {found.cost:.6g} ms; going on with every rule")


class _Sampler:
    """Whether exploration has converged: the cost of a graph extracted quickly (greedy, then a short local search
    from its selection, which sees the merges greedy cannot) has not dropped for `patience` iterations in a row.
    The multi-pattern iterations are not sampled: their merges pay only once the single-pattern rules that follow
    have rewritten what they read. An iteration run after the back-off lifted its bans (nothing else was left to
    match) starts the count again: the banned rules' matches were deferred, not dropped, and can still pay. Iterations
    past the sampled optimum grow the e-graph, and with it the time of pricing and extraction, for nothing.

    The local search starts from the previous sample's selection carried into the new export where that is cheaper
    than greedy's by more than the gap tolerance (the search has already done most of its moves there), and the
    last sample's selection is a start of the extraction too (`_extract`).

    With a cost model that measures, samples are priced by the analytic estimate: measuring each iteration's new
    e-nodes spent the exploration's share of the time budget on pricing (ConvNeXt stopped after two iterations,
    one short of folding its layer scales). The extraction's export measures what is competitive at the end."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.best = math.inf
        self.stale = 0
        self.since = time.perf_counter()  # when the sampled cost last dropped

    def __call__(self, it: IterationStats) -> bool:
        run = self.run
        if it.iteration <= run.opts.k_multi:
            return False
        if it.unbanned:  # the deferred matches ran: what they may lower is counted from here
            self.stale = 0
        x = _export(run, analytic=True)
        start = extraction.greedy_dag(x.egraph, forbidden=x.forbidden)
        carried = _carried(run, run.sampled, x)
        if carried is not None and carried.cost < start.cost * (1 - extraction.GAP_TOLERANCE):
            start = carried  # else greedy's: the extraction's search from greedy's repeats it (memoized) at the end
        found = extraction.local_search(x.egraph, start, forbidden=x.forbidden, time_limit=SAMPLE_SECONDS)
        run.sampled = (x, found)
        cost = found.cost
        unit = " ms (analytic estimate)" if run.measured is not None else " ms"  # the summary's are measured
        run.log.say("explore", f"iteration {it.iteration}: sampled cost {cost:.6g}{unit}")
        now = time.perf_counter()
        if cost < self.best * (1 - extraction.GAP_TOLERANCE):
            self.best, self.stale, self.since = cost, 0, now
        else:
            self.stale += 1
        stalled = self.stale > 0 and now - self.since >= STALE_SHARE * run.opts.time_budget
        return self.stale >= run.opts.patience or stalled


def _carried(
    run: _Run, sampled: tuple[Exported, extraction.ExtractionResult] | None, x: Exported
) -> extraction.ExtractionResult | None:
    """The selection `sampled` made in an earlier export, read in export `x` and priced there (None where it cannot
    be: an e-node not found, or forbidden in `x`)."""
    if sampled is None:
        return None
    old, result = sampled
    if old is x:
        return extraction.copy_result(result)
    assert run.te is not None
    choices = run.te.carried_selection(result.choices, old.decoded, old.egraph.roots, x.decoded)
    if choices is None or not x.forbidden.isdisjoint(choices.values()):
        return None
    try:
        extraction.validate(x.egraph, choices, x.forbidden)
    except ValueError:
        return None
    return replace(x.priced(choices, "sample"), status="feasible")


ANALYTIC = AnalyticCost()


def _export(run: _Run, analytic: bool = False) -> Exported:
    """The e-graph exported for extraction; with a cost model that measures (every price takes time), only
    competitive e-nodes are priced, within `PRICE_SECONDS` or half the time budget left, whichever is less (see
    `TensorEGraph.export`). An analytic export (the run's cost model is analytic, or `analytic` asks for one) is
    reused while the e-graph's version stays the same, and with it what the extractors memoized on it (the
    sample's greedy and local search, when extraction starts)."""
    te = run.te
    assert te is not None and run.cost is not None
    avoided = _avoided(run)
    if run.measured is not None and not analytic:  # depends on the time left to price, so it is not reused
        seconds = min(PRICE_SECONDS, max(MIN_PRICE_SECONDS, _budget_left(run) / 2))
        xg, decoded, forbidden = te.export(
            run.cost, competitive=COMPETITIVE_RATIO, price_seconds=seconds, avoided=avoided
        )
        return Exported(xg, decoded, frozenset(forbidden), te.original_selection(decoded), te.class_shapes(decoded))
    if run.last_export is None or run.last_export[0] != te.version:  # else unchanged since (the last sample's)
        xg, decoded, forbidden = te.export(run.cost if run.measured is None else ANALYTIC, avoided=avoided)
        x = Exported(xg, decoded, frozenset(forbidden), te.original_selection(decoded), te.class_shapes(decoded))
        run.last_export = (te.version, x)
    return run.last_export[1]


def _avoided(run: _Run) -> frozenset[str]:
    """The ops the extraction avoids: with `standard_onnx`, those not of the ONNX standard at the model's opset
    (onnxruntime's kernels, which the rules write back as the ops they compute)."""
    if not run.opts.standard_onnx or run.graph is None:
        return frozenset()
    opset = int(run.graph.opset_imports.get("", 17))
    return frozenset(name for name in ops.REGISTRY if not ops.standard(name, opset))


def _price(run: _Run) -> None:
    run.log.say("price", f"pricing {run.stats.enodes:,} e-nodes")
    run.exported = _export(run)


def _guided_apply(run: _Run) -> bool:
    """Guided rounds run after an exploration with multi-pattern rules that stopped short of every limit."""
    return (
        run.opts.k_multi > 0
        and run.opts.guided_rounds > 0
        and run.stats.stop_reason not in ("node_limit", "time_limit", "time_budget", "error")
    )


GUIDED_ITERATIONS = 2  # per guided round: the guided multi-pattern iteration, then one of single-pattern rules


def _guided_rounds(run: _Run) -> None:
    """Extend the merges the extracted graph uses, round by round; leaves the last export and the best selection
    found in it (`run.guided`, None if the search found nothing better than the input).

    A multi-pattern iteration merges pairs; a chain (the products of five time steps sharing one weight, merged
    into one) needs one more iteration per link, and a second unrestricted iteration already multiplies the
    e-graph (pairs of pairs of every product). A round instead marks the graph the local search extracts, runs the
    multi-pattern rules only on pairs of its e-classes (the pair merged in the last round and the next product),
    and searches again; rounds stop when one does not lower the cost (that round's e-nodes are rolled back, so the
    ILP does not pay for a larger e-graph that gained nothing), at the time limit, at the end of the time budget's
    guided share (`GUIDED_SHARE`) or at the node limit.
    """
    te, opts, stats, log = run.te, run.opts, run.stats, run.log
    t0 = time.perf_counter()
    exported = run.exported
    assert te is not None and exported is not None
    initial = exported.priced(exported.input_choices, "input")
    seconds = extraction.portfolio.local_search_seconds(opts.ilp_time_limit)
    if _budget_left(run, GUIDED_SHARE) <= 0:
        return
    try:
        best = extraction.local_search(
            exported.egraph,
            initial,
            forbidden=exported.forbidden,
            major_only=True,
            time_limit=min(seconds, _budget_left(run, GUIDED_SHARE)),
        )
    except Exception as exc:  # noqa: BLE001 - the rounds are an improvement; the plain pipeline goes on without them
        log.warn(f"guided rounds skipped: the local search failed ({one_line(exc, typed=True)}): {BUG}")
        return
    if best is initial:
        return
    inputs_own = set(exported.input_choices.values())
    if not any(exported.decoded[n].op == "slice" for n in best.choices.values() if n not in inputs_own):
        best.seconds = time.perf_counter() - t0  # no merge to extend: every merge is read through slices
        run.guided = best
        return
    for k in range(opts.guided_rounds):
        remaining = min(opts.time_limit - stats.seconds, _budget_left(run, GUIDED_SHARE))
        if remaining <= 0:
            break
        log.say("guided", f"round {k + 1}: extending the extracted graph's merges")
        graph = te.rebuild(best.choices, exported.decoded).compact()
        base = te.guide(graph)
        before = te.enode_count()
        te.checkpoint()
        round_stats = te.explore(
            node_limit=opts.node_limit, iter_limit=GUIDED_ITERATIONS, time_limit=remaining, guided=True
        )
        stats.seconds += round_stats.seconds
        run.times["explore"] = stats.seconds
        found = start = None
        if round_stats.stop_reason != "error" and te.enode_count() != before:
            new = _export(run)
            start = new.priced(te.chosen_selection(new.decoded, graph, base), "guided")
            found = extraction.local_search(  # the round's e-nodes are paid for: it may use the extraction's share
                new.egraph,
                start,
                forbidden=new.forbidden,
                major_only=True,
                time_limit=min(seconds, max(0.0, _budget_left(run) - MIN_EXTRACT_SECONDS)),
            )
        if found is None or found is start:  # nothing gained: drop what the round added, keep the previous graph
            te.rollback()  # back to the e-graph `exported` was read from (plus this round's marks, which it ignores)
            break
        offset = len(stats.iterations)
        for it in round_stats.iterations:
            it.iteration += offset
        stats.iterations += round_stats.iterations
        stats.guided_rounds += 1
        exported, best = new, found
        if round_stats.stop_reason == "node_limit":
            break
    best.seconds = time.perf_counter() - t0
    best.method = "guided+local"
    run.exported, run.guided = exported, best


def _without_guided(run: _Run, exc: BaseException) -> None:
    """The rounds are an improvement: extraction goes on from the explored e-graph without them."""
    run.log.warn(f"guided rounds failed ({one_line(exc, typed=True)}); extracted from the explored e-graph: {BUG}")
    run.exported = _export(run)  # re-read: e-class ids are per export
    run.guided = None


def _extract(run: _Run) -> None:
    """The extraction portfolio (`extraction.extract_best`) from the input's selection and the guided rounds'."""
    x, opts = run.exported, run.opts
    assert x is not None
    starts = [run.guided] if run.guided is not None else []
    for earlier in (run.sampled, run.checkpoint):  # the sample: often the best start there is, a local optimum
        carried = _carried(run, earlier, x)
        if carried is not None:
            starts.append(carried)
    run.chosen = extraction.extract_best(
        x.egraph,
        x.priced(x.input_choices, "input"),
        starts,
        forbidden=x.forbidden,
        method=opts.extractor,
        solver=opts.solver,
        time_limit=min(opts.ilp_time_limit, max(MIN_EXTRACT_SECONDS, _budget_left(run))),
        warn=run.log.warn,
        say=lambda detail: run.log.say("extract", detail),
    )
    filtered = run.chosen.info["cycle_filter"]
    run.stats.blacklisted = filtered["blacklisted"]
    run.times["cycle_filter"] = filtered["seconds"]


def _rebuild(run: _Run) -> None:
    assert run.te is not None and run.chosen is not None and run.exported is not None
    x = run.exported
    run.candidate = run.te.rebuild(run.chosen.choices, x.decoded).compact()
    run.candidate_rules = run.te.rules_behind(run.chosen.choices, x.decoded, x.egraph.roots, x.shapes)
    left = sorted({run.candidate.nodes[i].op for i in run.candidate.live()} & _avoided(run))
    if left:  # no rule wrote these as standard ops where the graph needs them: the input, standard, is returned
        run.log.warn(
            f"no graph of ONNX standard ops was found: {', '.join(left)} could not be written as the ops they "
            "compute; returned the input model (standard_onnx / --standard-onnx)"
        )
        _reject(run, "no graph of ONNX standard ops was found")


def _search_failed(run: _Run, exc: BaseException) -> None:
    """The search is best effort: the input graph is always a valid answer."""
    run.log.warn(f"optimization failed ({one_line(exc, typed=True)}); returned the input model: {BUG}")
    if not run.stats.stop_reason:
        run.stats.stop_reason, run.stats.error = "error", one_line(exc, typed=True)
    run.candidate = run.chosen = None
    run.candidate_rules = {}


_SEARCH = (
    _Stage("lower", _lower),
    _Stage(None, _explore),
    _Stage("price", _price),
    _Stage("guided", _guided_rounds, fallback=_without_guided, when=_guided_apply),
    _Stage("extract", _extract),
    _Stage(None, _rebuild),
)


def _read_rules(run: _Run) -> None:
    """Read the rule set the search registers (parsed once per process, thousands of rules for `generated` and
    `all`): reading the library is not searching, and the time budget counts from after it."""
    rewrites.rule_set(run.opts.rules)


def _search(run: _Run) -> None:
    _perform(run, (_Stage("rules", _read_rules),))
    _start_search_clock(run)
    _perform(run, _SEARCH)


# -- the checks: the candidate is returned only if it passes each


def _written(graph: Graph, standard_onnx: bool) -> tuple[onnx.ModelProto, Graph]:
    """`graph` written as ONNX, and read back: a candidate is priced as written (the file is what runs); tensat's
    own export needs no onnx.checker pass. Unless kept to standard ops, a MatMul onnxruntime runs as a FusedMatMul
    is written as one: the model names the kernels that run."""
    model = onnx_io.export_model(graph, keep_external=True, fuse_matmuls=not standard_onnx)
    return model, onnx_io.import_model(model, check=False).compact()


def _export_candidate(run: _Run) -> None:
    assert run.candidate is not None
    run.log.say("export", "writing the optimized graph as ONNX")
    run.candidate_model, run.written = _written(run.candidate, run.opts.standard_onnx)


def _unexportable(run: _Run, exc: BaseException) -> None:
    """An optimized graph that cannot be exported is dropped, not shipped."""
    run.log.warn(
        f"the optimized graph could not be exported ({one_line(exc, typed=True)}); returned the input model: {BUG}"
    )
    _reject(run, "the optimized graph could not be exported")


def _price_candidate(run: _Run) -> None:
    """Price the candidate as written. One that costs no less than the input (beyond the ILP's own tolerance) is
    rejected, and not timed end to end: the cost model predicts no gain, and timing such candidates over the
    real-model corpus cost seconds each for gains within the timing's noise."""
    assert run.written is not None and run.cost is not None
    run.candidate_cost = runtime_cost(run.written, run.cost)
    if run.candidate_cost >= run.cost_before * (1 - extraction.GAP_TOLERANCE):
        _reject(
            run,
            f"no graph found that costs less than the input as onnxruntime runs it "
            f"({run.candidate_cost:.4g} against {run.cost_before:.4g} ms under the {run.opts.cost} cost "
            f"model; not timed end to end)",
        )


def _checked(run: _Run) -> tuple[Serialized, Serialized]:
    """The input and the candidate as verification and the end-to-end check run them: each serialized once for all
    the sessions they open."""
    assert run.model is not None and run.candidate_model is not None
    if run.checked is None or run.checked[1].proto is not run.candidate_model:
        run.checked = (Serialized(run.model), Serialized(run.candidate_model))
    return run.checked


def _verify(run: _Run) -> None:
    run.log.say("verify", "running both models in onnxruntime")
    run.report = _verified(*_checked(run), run.opts, run.log, keep_sessions=_will_time(run))
    if run.report is None:
        _reject(run, "the optimized graph rounds differently under onnxruntime's fused kernels")


VERDICT_VERSION = 1  # raised when the end-to-end check's rule or timing changes: earlier verdicts then go unread


def _verdict_key(original: Serialized, optimized: Serialized, opts: Options) -> str:
    """What an end-to-end verdict holds for: the two models' contents, the thread counts, seconds and seed they were
    timed with, the keep rule, and the machine's core count and cache sizes (the device fingerprint names a CPU by
    its model name alone, which covers parts of other caches)."""
    parts = {
        "version": VERDICT_VERSION,
        "models": [content_digest(m.proto, m.data) for m in (original, optimized)],
        "threads": list(check_threads()),
        "seconds": opts.latency_check,
        "seed": opts.seed,
        "keep_above": KEEP_ABOVE,
        "machine": [os.cpu_count(), last_level_cache(), level_two_cache()],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _latency_check(run: _Run) -> None:
    """Time the candidate against the input end to end (`_end_to_end_check`), or read the verdict of an earlier run
    that timed the same two models on this machine, which the measured cost model's cache keeps by its device
    fingerprint (`_verdict_key`): a second run on a model returns what the first returned, where a verdict near its
    threshold could otherwise fall the other way, and takes no second timing."""
    opts = run.opts
    models = _checked(run)
    measured = run.measured
    key = _verdict_key(*models, opts) if measured is not None else ""
    found = measured.cache.verdict(measured.fingerprint, key) if measured is not None else None
    if found is not None:
        run.check = LatencyCheck.from_dict(found, reused=True)
        run.log.say("latency", f"an earlier run timed these two models: {run.check.figures()}")
    else:
        run.log.say("latency", f"timing both models end to end (at most {opts.latency_check:g} s)")
        device = measured.device if measured is not None else _check_device(opts)
        predicted = run.cost_before / run.candidate_cost if run.candidate_cost > 0 else 1.0
        run.check = _end_to_end_check(*models, device, opts, run.log, predicted)
        if run.check is not None and measured is not None:
            measured.cache.put_verdict(measured.fingerprint, key, run.check.to_dict())
    if run.check is not None and not run.check.kept:
        _reject(run, _not_faster(run.check))


def _symbolic(run: _Run) -> bool:
    """Whether the model was given with symbolic input dims, which the search fixed (`load_model`)."""
    return run.model is not None and onnx_io.symbolic_dims(run.model) is not None and not isinstance(run.source, Graph)


def _generalize(run: _Run) -> None:
    """The candidate, optimized at one shape of the model's symbolic dims, written back with them
    (`tensat.onnx.symbolic.generalize`) and verified against the model as given at that shape and at two others;
    where it cannot be written so or does not match, the input is returned: a model fixed to one shape is no use
    where the sizes vary."""
    assert run.model is not None and run.candidate_model is not None
    given = _given(run)
    shapes = fixed_shapes(run.model)
    written = generalize(run.candidate_model, given, shapes)
    if written is None:
        _reject(
            run,
            "the optimized graph holds at the input shapes it was optimized at only: a Reshape in it "
            "could not be written for every size of the model's symbolic dims",
        )
        return
    for wanted in [shapes, *other_shapes(given, shapes)]:
        instance, report = wanted, None
        while report is None:
            run.log.say("verify", f"at {_shape_text(instance)}")
            try:
                report = verify_mod.compare_models(
                    given, written, seed=run.opts.seed, keep_sessions=False, shapes=instance
                )
            except ModelError as exc:  # the model as given does not run at these sizes: nor at any nearer?
                nearer = halfway(given, shapes, instance)
                if nearer == instance:
                    _reject(
                        run, f"the input does not run at {_shape_text(wanted)} to verify the optimized graph at ({exc})"
                    )
                    return
                instance = nearer
        if not report.ok:
            _reject(
                run,
                f"the optimized graph, written for every size of the symbolic dims, does not match the "
                f"input at {_shape_text(instance)} ({report.detail})",
            )
            return
        run.shapes_verified.append({k: list(v) for k, v in instance.items()})
    if _will_time(run):
        _time_other_shape(run, given, written, run.shapes_verified[1])
        if not _has_candidate(run):
            return
    run.candidate_model = written


def _given(run: _Run) -> onnx.ModelProto:
    """The model as given (`onnx_io.given_model`), read once: the reference of the checks at other shapes, and what a
    run that returns the input writes."""
    if run.given is None:
        assert not isinstance(run.source, Graph)
        run.given = onnx_io.given_model(run.source)
    return run.given


def _time_other_shape(
    run: _Run, given: onnx.ModelProto, written: onnx.ModelProto, shapes: dict[str, list[int]]
) -> None:
    """Time the model written back with its symbolic dims against the model as given at `shapes`, another size of
    them than the one the end-to-end check timed, at one thread, in a quarter of `latency_check`: the input is
    returned where the result is measurably slower there (a gain at one size may be a loss at another)."""
    device = run.measured.device if run.measured is not None else _check_device(run.opts)
    run.log.say("latency", f"timing both models at {_shape_text(shapes)}")
    try:
        timed = compare_latency(
            given,
            written,
            provider=device,
            threads=1,
            clock=default_clock(device, 1),
            max_seconds=run.opts.latency_check / 4,
            seed=run.opts.seed,
            pairs=CHECK_PAIRS,
            futile_after=None,
            shapes=shapes,
        )
    except Exception as exc:  # noqa: BLE001 - the graph is verified at this shape; only its timing is lost
        raise_if_out_of_memory(exc)
        run.log.warn(f"the optimized model could not be timed at {_shape_text(shapes)} ({one_line(exc, typed=True)})")
        return
    run.timed_other = (shapes, timed)
    if timed.interval[1] < 1.0:
        _reject(
            run,
            f"the optimized graph was measurably slower end to end at {_shape_text(shapes)} ({_figures(timed, 1)})",
        )


def _shape_text(shapes: Mapping[str, Sequence[int]]) -> str:
    """Input shapes in words: `x=1,3,224,224 y=1,8`."""
    return " ".join(f"{name}={','.join(str(d) for d in dims)}" for name, dims in shapes.items())


# the fields of `_Run` the search and the checks fill in, from `te` to `returned_input`
_SEARCH_STATE = frozenset(
    ("te", "stats", "exported", "last_export", "sampled", "checkpoint", "guided", "chosen", "candidate")
    + ("candidate_rules", "candidate_model", "written", "candidate_cost", "report", "check", "returned_input")
)
RUN_SECONDS = 60.0  # the whole run's time that a second search without merges, and its checks, must fit in


def _merges_rejected(run: _Run) -> bool:
    """Whether to search again without multi-pattern rules: the end-to-end check did not find a candidate faster
    that owes part of its change to them, and a second search with its checks fits in `RUN_SECONDS`.

    A merge's gain depends on the thread count, and units are priced at one thread: two products of one input made
    one (BERT's query, key and value projections) ran faster at one thread and slower at two, and the check then
    returned the input, losing the gain of every change the candidate did not owe to the merge."""
    if run.check is None or run.check.kept or run.with_merges is not None or run.opts.k_multi == 0:
        return False
    if not _merges(run):
        return False
    needed = run.opts.time_budget + run.opts.latency_check + run.times.get("export", 0.0) + run.times.get("verify", 0.0)
    return time.perf_counter() - run.started + needed <= RUN_SECONDS


def _merges(run: _Run) -> list[str]:
    """The multi-pattern rules behind the candidate's changes."""
    multi = {r.name for r in rewrites.rule_set(run.opts.rules) if r.multi}
    return sorted(name for name in run.candidate_rules if name in multi)


def _search_without_merges(run: _Run) -> None:
    """Search again from the graph the first search started from, without multi-pattern rules (`k_multi=0`), and
    put what it finds through the same checks; the first candidate is kept in `run.with_merges`. The run's options
    and times go on as the first search's: the result reports the options asked for, and each stage's time is the
    sum of its two runs."""
    assert run.check is not None and run.returned_input is not None
    run.with_merges = WithMerges(dict(run.candidate_rules), run.check, run.returned_input)
    run.log.say(
        "explore", f"searching again without multi-pattern rules ({', '.join(_merges(run))} did not time faster)"
    )
    first_opts, first_times = run.opts, run.times
    run.opts, run.times = replace(run.opts, k_multi=0), {}
    for f in fields(_Run):  # the search's and the checks' state back to where a run starts it
        if f.name in _SEARCH_STATE:
            setattr(run, f.name, f.default_factory() if f.default_factory is not MISSING else f.default)
    try:
        _perform(run, _SEARCH_AND_CHECKS)
    finally:
        run.opts = first_opts
        run.times = {k: first_times.get(k, 0.0) + run.times.get(k, 0.0) for k in {**first_times, **run.times}}
    if run.returned_input is not None:
        run.returned_input = (
            f"{run.with_merges.reason}; searched again without multi-pattern rules: {run.returned_input}"
        )


def _will_time(run: _Run) -> bool:
    """Whether the run times a candidate against the input end to end."""
    return run.opts.latency_check > 0 and run.model is not None


def _accept(run: _Run) -> None:
    run.returned_input = None
    if _symbolic(run) and not run.opts.verify:
        run.log.warn(
            "the optimized model is fixed to the input shapes it was optimized at: with verification off, the "
            "model's symbolic dims are not written back (they are checked at other sizes only when verifying)"
        )


def _report_costs(run: _Run) -> None:
    assert run.cost is not None
    run.cost.report()


_CHECKS = (
    _Stage("export", _export_candidate, fallback=_unexportable, when=_has_candidate),
    _Stage(None, _price_candidate, when=_has_candidate),
    _Stage("verify", _verify, when=lambda run: _has_candidate(run) and run.opts.verify),
    _Stage("latency_check", _latency_check, when=lambda run: _has_candidate(run) and _will_time(run)),
)
_SEARCH_AND_CHECKS = (_Stage(None, _search, fallback=_search_failed), *_CHECKS)

_PIPELINE = (
    _Stage("import", _import),
    _Stage(None, _price_input),
    *_SEARCH_AND_CHECKS,
    _Stage(None, _search_without_merges, when=_merges_rejected),
    _Stage("verify_shapes", _generalize, when=lambda run: _has_candidate(run) and run.opts.verify and _symbolic(run)),
    _Stage(None, _accept, when=_has_candidate),
    _Stage(None, _report_costs),
)


def optimize_with_details(model: ModelLike, *, progress: ProgressFn | None = None, **options: Any) -> OptimizeResult:
    """Optimize `model` and report how: see `optimize` for the options. `progress(stage, detail)`, if given, is
    called as the run moves from stage to stage (see `tensat.progress`)."""
    output_path = options.pop("output", None)
    opts = Options(**options)
    opts.check()
    if output_path is not None:  # before any work: a run must not fail at its very end on a missing directory
        check_writable(output_path)
    run = _Run(opts, RunLog(progress), model)
    _perform(run, _PIPELINE)
    return _result(run, output_path)


def _result(run: _Run, output_path: str | os.PathLike[str] | None) -> OptimizeResult:
    """The run's result: the accepted candidate, or the input; written to `output_path` if given."""
    read = run.read
    assert read is not None
    optimized = run.returned_input is None
    graph = run.candidate if optimized else read
    symbolic = onnx_io.symbolic_dims(run.model) if _symbolic(run) and run.model is not None else None
    if optimized:
        out_model = run.candidate_model
    elif run.model is None:
        out_model = onnx_io.export_model(read)
    elif symbolic is not None:  # as given: its symbolic dims were fixed only to read it
        out_model = _given(run)
    else:
        out_model = run.model
    assert graph is not None and out_model is not None
    report = run.report
    if not optimized and run.opts.verify and report is None:
        report = VerifyReport(
            True, 0.0, 0.0, [o.name for o in out_model.graph.output], 0.0, "the input model is returned"
        )
    if isinstance(run.source, Graph):
        output: Any = graph
    elif output_path is not None:  # from the bytes the checks serialized, where they ran it
        onnx_io.save_model(next((m for m in run.checked or () if m.proto is out_model), out_model), output_path)
        output = Path(output_path)
    else:  # a proto of its own for the caller, its weights in it (`load_model` left external data on disk)
        output = onnx_io.materialize(out_model)
    return OptimizeResult(
        output,
        graph,
        read,
        run.cost_before,
        run.candidate_cost if optimized else run.cost_before,
        run.stats,
        run.chosen,
        run.times,
        report,
        run.log.warnings,
        run.opts,
        run.check,
        run.measured.describe() if run.measured is not None else None,
        nodes_before=len((run.model or out_model).graph.node),
        nodes_after=len(out_model.graph.node),
        nodes_read=run.nodes_read or len((run.model or out_model).graph.node),
        nodes_opaque=(run.graph or read).opaque_count(),
        pre_passed=run.pre_passed,
        returned_input=run.returned_input,
        shapes_optimized=fixed_shapes(run.model) if symbolic is not None and run.model is not None else None,
        symbolic_dims=symbolic,
        rules=dict(run.candidate_rules),
        egraph=run.exported.egraph.without(run.exported.forbidden) if run.exported is not None else None,
        shapes_verified=run.shapes_verified if optimized else [],
        latency_other_shape=run.timed_other,
        with_merges=run.with_merges,
    )


def _verified(
    original: ModelSource, optimized: ModelSource, opts: Options, log: RunLog, *, keep_sessions: bool = True
) -> VerifyReport | None:
    """The optimized model's verification report, or None where the input must be returned instead. The sessions
    are kept for the end-to-end check where `keep_sessions` (it times its first thread count in them), else each is
    released before the next is made.

    Both models run in onnxruntime as a user runs them, graph optimizations on. Where their outputs differ, both run
    again as written (no fusions): a difference there means the optimized graph computes something else, and
    VerificationError is raised. Where they agree as written, the graphs compute the same function and the
    difference is in how onnxruntime's fused kernels round for one of them (a merged projection fused where the
    input's three were not); the input model is then returned, with a warning, since it is what runs as the user
    expects."""
    report = verify_mod.compare_models(original, optimized, seed=opts.seed, keep_sessions=keep_sessions)
    if report.ok:
        return report
    exact = verify_mod.compare_models(original, optimized, seed=opts.seed, optimizations=False, keep_sessions=False)
    if not exact.ok:
        raise VerificationError(report.detail)
    log.warn(
        f"the optimized graph computes the input's function ({exact.detail} with onnxruntime's graph "
        f"optimizations off), but with them on its {report.detail[0].lower()}{report.detail[1:]}; "
        f"keeping the input model"
    )
    return None


def _check_device(opts: Options) -> str:
    """The device the end-to-end check times on when no measuring cost model chose it."""
    return resolve_device(opts.device)


def optimize(model: ModelLike, **options: Any) -> Any:
    """Optimize a model by equality saturation; returns it in the form given.

    `model` is an `onnx.ModelProto`, a path to an .onnx file, or a `tensat.ir.Graph`. A ModelProto or a path gives
    back a ModelProto (or, with `output=PATH`, writes it atomically there and returns the path); a Graph gives a
    Graph. The options are the fields of `Options` (each one's default and meaning is in its `metadata["help"]`, as
    `tensat optimize --help` shows it): node_limit, iter_limit and time_limit (of exploration), k_multi (iterations
    in which multi-pattern rules run), guided_rounds (rounds extending the extracted graph's merges), extractor
    ("ilp" or "greedy"), solver ("highs" or "cbc"), ilp_time_limit, cost ("measured": per-op latency on the target
    device, cached; or "analytic"), device ("auto", "cpu" or "cuda": where costs are measured and the result timed),
    latency_check (seconds timing the optimized model against the input end to end at one thread and at every core;
    the input model is returned unless the optimized one is faster; 0 skips it), verify (compare against the input
    in onnxruntime and raise VerificationError on a mismatch), seed, input_shapes ({"x": [1, 3, 224, 224]}: the
    shape to optimize an input with symbolic dims at; by default 1 for a batch dim and 128 for any other).
    Use `optimize_with_details` for costs, e-graph growth and time per phase.
    """
    return optimize_with_details(model, **options).output


def rule_names() -> list[str]:
    """Names of every rule in the library."""
    return [r.name for r in rewrites.all_rules()]
