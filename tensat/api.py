"""`tensat.optimize`: ONNX in, e-graph, exploration, extraction, verified ONNX out."""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import onnx

from tensat import extraction
from tensat import onnx_io
from tensat import rewrites
from tensat import verify as verify_mod
from tensat.cost import AnalyticCost, CostModel, Shape, runtime_cost
from tensat.egraph import ExplorationStats, IterationStats, TensorEGraph
from tensat.errors import TensatError, VerificationError
from tensat.files import check_writable
from tensat.ir import Graph, Node
from tensat.latency import LatencyComparison, compare_latency
from tensat.measure import MeasuredCost, default_clock, make_measured_cost, resolve_device
from tensat.progress import ProgressFn, report
from tensat.verify import VerifyReport

ModelLike = Union[onnx.ModelProto, str, os.PathLike, Graph]

EXTRACTORS = ("ilp", "greedy")
SOLVERS = ("highs", "cbc")
COSTS = ("analytic", "measured")
DEVICES = ("auto", "cpu", "cuda")
LATENCY_CHECK_SECONDS = 20.0


@dataclass(frozen=True)
class Options:
    """Every knob of one optimization run (the CLI flags map one to one)."""

    node_limit: int = 50_000
    iter_limit: int = 15
    time_limit: float = 60.0
    k_multi: int = 1
    guided_rounds: int = 4
    extractor: str = "ilp"
    solver: str = "highs"
    ilp_time_limit: float = 60.0
    cost: str = "measured"
    device: str = "auto"
    latency_check: float = LATENCY_CHECK_SECONDS
    verify: bool = True
    seed: int = 0
    input_shapes: Mapping[str, Sequence[int]] | None = None

    def check(self) -> None:
        """Reject out-of-range options with a one-line error."""
        if self.node_limit < 1:
            raise TensatError(f"node_limit must be positive, got {self.node_limit}")
        if self.iter_limit < 0:
            raise TensatError(f"iter_limit must be >= 0, got {self.iter_limit}")
        if self.time_limit <= 0 or self.ilp_time_limit <= 0:
            raise TensatError("time limits must be positive")
        if not self.latency_check >= 0:
            raise TensatError(f"latency_check must be >= 0 seconds, got {self.latency_check}")
        if self.k_multi not in (0, 1, 2):
            raise TensatError(f"k_multi must be 0, 1 or 2, got {self.k_multi}")
        if self.guided_rounds < 0:
            raise TensatError(f"guided_rounds must be >= 0, got {self.guided_rounds}")
        if self.extractor not in EXTRACTORS:
            raise TensatError(f"unknown extractor {self.extractor!r}; choose from {', '.join(EXTRACTORS)}")
        if self.solver not in SOLVERS:
            raise TensatError(f"unknown solver {self.solver!r}; choose from {', '.join(SOLVERS)}")
        if self.cost not in COSTS:
            raise TensatError(f"unknown cost model {self.cost!r}; choose from {', '.join(COSTS)}")
        if self.device not in DEVICES:
            raise TensatError(f"unknown device {self.device!r}; choose from {', '.join(DEVICES)}")


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
    returned_input: str | None = None  # why the input model was returned unchanged; None if optimized

    @property
    def speedup(self) -> float:
        """Cost ratio before/after under the run's cost model."""
        return self.cost_before / self.cost_after if self.cost_after > 0 else 1.0

    def __repr__(self) -> str:
        outcome = "input returned" if self.returned_input else "optimized"
        return (f"<OptimizeResult {outcome}: cost {self.cost_before:.4g} -> {self.cost_after:.4g} ms "
                f"({self.speedup:.3f}x, {self.options.cost}), ONNX nodes {self.nodes_before} -> {self.nodes_after}, "
                f"{len(self.warnings)} warning{'' if len(self.warnings) == 1 else 's'}>")

    def summary(self) -> str:
        """A short multi-line report of the run: what the CLI prints."""
        ex = self.exploration
        lines = [f"cost      {self.cost_before:.4f} -> {self.cost_after:.4f} ms ({self.speedup:.3f}x under the "
                 f"{self.options.cost} cost model, as onnxruntime runs each)",
                 f"nodes     {self.nodes_before} -> {self.nodes_after} ONNX nodes",
                 f"e-graph   {ex.enodes:,} e-nodes, {ex.eclasses:,} e-classes after {len(ex.iterations)} iterations "
                 f"({ex.stop_reason.replace('_', ' ')})"]
        if self.extraction is not None:
            x = self.extraction
            stop = x.info.get("ilp_stop")
            lines.append(f"extract   {x.method}" + (f" ({stop})" if stop else f" ({x.status})"))
        lines.append("time      " + ", ".join(f"{k} {v:.2f}s" for k, v in self.times.items()))
        if self.verification is not None:
            v = self.verification
            lines.append(f"verified  max abs error {v.max_abs_error:.2e}, max rel error {v.max_rel_error:.2e}")
        if self.latency is not None:
            for threads, lat in self.latency.by_threads.items():
                low, high = lat.interval
                lines.append(f"latency   {lat.baseline_ms:.4g} -> {lat.candidate_ms:.4g} ms end to end at {threads} "
                             f"thread{'s' if threads > 1 else ''} ({lat.speedup:.3f}x, 95% interval {low:.3f}-"
                             f"{high:.3f})")
        lines.append("result    " + ("the optimized model" if self.returned_input is None
                                     else f"the input model, unchanged: {self.returned_input}"))
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
            "returned_input": self.returned_input,
            "exploration": self.exploration.to_dict(),
            "extraction": None if ex is None else {
                "method": ex.method, "status": ex.status, "cost": ex.cost, "bound": ex.bound, "seconds": ex.seconds,
                "ilp_stop": ex.info.get("ilp_stop"),
            },
            "times": dict(self.times),
            "verification": None if self.verification is None else {
                "ok": self.verification.ok,
                "max_abs_error": self.verification.max_abs_error,
                "max_rel_error": self.verification.max_rel_error,
            },
            "latency_check": None if self.latency is None else self.latency.to_dict(),
            "measurement": self.measurement,
            "warnings": list(self.warnings),
            "options": {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in self.options.__dict__.items()},
        }


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

    def warn(self, message: str) -> None:
        """Record a warning: it says what happened and what the user can do."""
        self.warnings.append(message)
        _log.warning(message)

    def say(self, stage: str, detail: str = "") -> None:
        """Report progress: the stage the run is in and where in it."""
        report(self.progress, stage, detail)


BUG = "a bug in tensat; please report it with the model"


def _recoverable(exc: BaseException) -> bool:
    """Errors the optimization recovers from: any Exception and a Rust panic inside egglog (pyo3's PanicException
    derives from BaseException), never Ctrl-C or an exit request."""
    return not isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit))


def _first_line(exc: BaseException) -> str:
    """`Type: first line of the message`, for one-line warnings about internal failures."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


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

    def prefetch(self, items: Sequence[tuple[Node, Sequence[Shape], Sequence[bool]]]) -> None:
        """Forward to the inner model's prefetch; a failure there only means nodes are priced one by one."""
        prefetch = getattr(self.inner, "prefetch", None)
        if prefetch is None:
            return
        try:
            prefetch(items)
        except Exception as exc:  # noqa: BLE001 - a measuring model may fail in any way
            if not self.prefetch_failed:
                self.log.warn(f"the {self.name} cost model could not measure ops in a batch ({_first_line(exc)}); "
                              f"measuring them one by one instead, which is slower")
            self.prefetch_failed = True

    def __call__(self, node: Node, in_shapes: Sequence[Shape], const: Sequence[bool] = ()) -> float:
        key = (node.op, node.attrs, node.shape, tuple(tuple(s) for s in in_shapes), tuple(bool(c) for c in const))
        if key not in self.failed:
            try:
                value = float(self.inner(node, in_shapes, const))
            except Exception as exc:  # noqa: BLE001
                self.failed[key] = _first_line(exc)
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
            self.log.warn(f"the {self.name} cost model could not price {len(self.failed)} node(s) "
                              f"({', '.join(ops_failed)}; first failure: {first}); used the analytic estimate for them")


def _cost_model(opts: Options, log: RunLog) -> _FallbackCost:
    """The run's cost model, guarded; one that cannot be built falls back to the analytic model (with a warning)."""
    try:
        inner = make_cost_model(opts.cost, opts.device, log.progress or False)
    except TensatError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. the measuring backend is missing or fails to start
        log.warn(f"the {opts.cost} cost model is unavailable ({_first_line(exc)}); used the analytic estimate "
                 f"instead (pass cost='analytic' / --cost analytic to choose it)")
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


PRICE_SECONDS = 8.0  # with measured costs, one export measures new prices for at most about this long (a later
# run measures the next ones: the cache fills over runs, and no run spends more than this on it)


def _export(te: TensorEGraph, cost: CostModel, opts: Options) -> tuple[extraction.EGraph, dict[str, Any], set[str]]:
    """The e-graph exported for extraction; with a cost model that measures (every price takes time), only
    competitive e-nodes are priced, within `PRICE_SECONDS` (see `TensorEGraph.export`)."""
    if isinstance(cost, _FallbackCost) and _measured(cost, opts) is not None:
        return te.export(cost, competitive=COMPETITIVE_RATIO, price_seconds=PRICE_SECONDS)
    return te.export(cost)


def check_threads() -> tuple[int, ...]:
    """The intra-op thread counts the end-to-end check times at: one thread and every core of the machine."""
    return tuple(sorted({1, os.cpu_count() or 1}))


@dataclass
class LatencyCheck:
    """The optimized model timed against the input end to end, at each thread count of `check_threads()`."""

    by_threads: dict[int, LatencyComparison]
    kept: bool  # whether the optimized model was kept

    def to_dict(self) -> dict[str, Any]:
        return {"kept": self.kept, **{f"threads={t}": c.to_dict() for t, c in self.by_threads.items()}}

    def __repr__(self) -> str:
        return f"<LatencyCheck {'kept' if self.kept else 'not kept'}: {self.figures()}>"

    def figures(self) -> str:
        """The speedup and its interval at each thread count, in words."""
        return ", ".join(f"{c.speedup:.3f}x at {t} thread{'s' if t > 1 else ''}, 95% interval "
                         f"{c.interval[0]:.3f}-{c.interval[1]:.3f}" for t, c in self.by_threads.items())


LATENCY_RESOLUTION = 0.01  # two sessions of one model can differ by about this much (where their memory lies)


def _faster(by_threads: Mapping[int, LatencyComparison]) -> bool:
    """Measurably faster (95% interval above 1) at every thread count, and beyond the timing's resolution (above
    1 + `LATENCY_RESOLUTION`) at one at least: a candidate whose gain is within what two sessions of one model
    differ by is not worth a graph that differs from the user's, and may time slower in the user's own session."""
    return (all(c.interval[0] > 1.0 for c in by_threads.values())
            and any(c.interval[0] > 1.0 + LATENCY_RESOLUTION for c in by_threads.values()))


def _end_to_end_check(original: onnx.ModelProto, optimized: onnx.ModelProto, device: str, opts: Options,
                      log: RunLog) -> LatencyCheck | None:
    """Time the optimized model against the input (the user's own model) end to end, interleaved, at one thread
    and at every core (`tensat.latency.compare_latency`, `latency_check` seconds in all); the optimized model is
    kept only if `_faster`. Summed per-op costs miss what only a whole graph shows (fusions onnxruntime makes,
    which weights are still cached), so no cost model alone decides what is returned. None when the check could
    not run (with a warning): the verified optimized model is then kept."""
    threads = check_threads()
    by_threads: dict[int, LatencyComparison] = {}
    try:
        for t in threads:
            by_threads[t] = compare_latency(original, optimized, provider=device, threads=t,
                                            clock=default_clock(device, t),
                                            max_seconds=opts.latency_check / len(threads), seed=opts.seed)
    except Exception as exc:  # noqa: BLE001 - the graph is verified; a failed timing only loses the check
        log.warn(f"the end-to-end latency check could not run ({_first_line(exc)}); returned the verified "
                 f"optimized model untimed (latency_check=0 / --latency-check 0 skips the check)")
        return None
    kept = _faster(by_threads)
    return LatencyCheck(by_threads, kept)


def _greedy(xg: extraction.EGraph, forbidden: set[str], log: RunLog) -> extraction.ExtractionResult | None:
    """The greedy DAG extractor's selection, or None (with a warning) if it fails."""
    try:
        return extraction.greedy_dag(xg, forbidden=forbidden)
    except Exception as exc:  # noqa: BLE001 - any extractor failure keeps the input graph's own selection
        log.warn(f"greedy extraction failed ({_first_line(exc)}); kept the input graph: {BUG}")
        return None


def _extract(
    xg: extraction.EGraph, forbidden: frozenset[str], blacklist: frozenset[str],
    initial: extraction.ExtractionResult, greedy: extraction.ExtractionResult | None, opts: Options,
    log: RunLog, starts: Sequence[extraction.ExtractionResult] = (),
) -> extraction.ExtractionResult:
    """The cheapest selection found within the ILP time limit; never worse than greedy or the input's own.

    The ILP first solves the cycle-filtered e-graph (`blacklist` removed: no cycle cuts needed, usually fast), then
    the whole e-graph, warm-started from the best selection so far: filtering can remove e-nodes the best graph
    needs, lazy cycle cuts cannot. The second pass gets as long as the first took (at least a second, at most
    what is left of the limit): on the benchmark graphs it rarely improves on the first, and its lazy cuts can
    run for the whole limit without closing the gap.
    """
    if greedy is None:
        return initial
    best = greedy if greedy.cost <= initial.cost else initial
    if opts.extractor == "greedy":
        return best
    deadline = time.perf_counter() + opts.ilp_time_limit
    best = polished = _polish(xg, [initial, greedy, *starts], best, forbidden, opts, log)
    passes = [(forbidden | blacklist, "cycle-filtered"), (forbidden, "whole")] if blacklist else [(forbidden, "whole")]
    proven = False
    first_pass = 0.0
    stop = ""
    for banned, label in passes:
        now = time.perf_counter()
        remaining = deadline - now
        if label == "whole" and blacklist:
            remaining = min(remaining, max(1.0, first_pass))
        if remaining <= 0:
            break
        start = best if not blacklist & set(best.choices.values()) or label == "whole" else initial
        log.say("extract", f"ILP on the {label} e-graph (at most {remaining:.0f} s)")
        try:
            ilp = extraction.ilp_extract(xg, solver=opts.solver, time_limit=remaining, forbidden=frozenset(banned),
                                         initial=start, stall_seconds=ILP_STALL_SECONDS)
        except Exception as exc:  # noqa: BLE001 - a solver crash or a missing solver binary
            log.warn(f"the ILP solver failed on the {label} e-graph ({_first_line(exc)}); used the best graph found "
                     f"without it (try solver='cbc' / --solver cbc)")
            continue
        first_pass = time.perf_counter() - now
        stop = ilp.info.get("stop", "")
        if ilp.status != "fallback" and ilp.cost <= best.cost + 1e-12:
            # a cycle-filtered pass proves nothing about the whole e-graph: its bound is the sub-problem's
            best = ilp if label == "whole" else replace(ilp, bound=None, status="feasible")
        elif ilp.bound is not None and label == "whole":  # the ILP's proven bound holds for the search's result too
            best.bound = max(best.bound or 0.0, min(ilp.bound, best.cost))
        proven = label == "whole" and ilp.status == "optimal"
    if not proven and best.cost < polished.cost - 1e-12:  # the ILP improved on the search: polish its result too
        best = _polish(xg, [best], best, forbidden, opts, log)
    if not proven and stop == "time" and time.perf_counter() >= deadline - 0.05:
        gap = best.gap()
        log.warn(f"extraction reached its ILP time limit ({opts.ilp_time_limit:g} s) before proving its graph optimal"
                 f"{'' if gap is None else f' (within {100 * gap:.2g}% of the bound)'}; a longer ilp_time_limit "
                 f"(--ilp-time-limit) may find a cheaper graph")
    best.info["ilp_stop"] = _ilp_stop(proven, stop)
    return best


ILP_STALL_SECONDS = 2.0  # the ILP stops when its incumbent has not improved for this long (it starts from the
# local search's selection, which the solver seldom improves on: a search that has not paid by then rarely does)


def _ilp_stop(proven: bool, stop: str) -> str:
    """Why the ILP stopped, in the user's words."""
    if proven:
        return "proven optimal"
    return "not proven optimal: " + {
        "gap": "optimal only on the cycle-filtered e-graph",
        "stall": f"no cheaper graph found for {ILP_STALL_SECONDS:g} s",
        "time": "time limit", "no new cuts": "no cycle cut left", "no solution": "the solver found no solution",
    }.get(stop, "the ILP did not run")


LOCAL_SEARCH_SHARE = 0.2  # of the ILP time limit, for each start of the local search
LOCAL_SEARCH_MIN_SECONDS = 3.0  # it stops by itself when no move improves: only searches that pay take this long


def _local_search_seconds(opts: Options) -> float:
    """The local search's time limit for one start: a share of the ILP's, but at least enough for a few passes
    over a NasRNN-size e-graph on a loaded machine (a tighter limit makes the result depend on the load)."""
    return max(LOCAL_SEARCH_MIN_SECONDS, LOCAL_SEARCH_SHARE * opts.ilp_time_limit)


def _selection(xg: extraction.EGraph, choices: dict[str, str], method: str) -> extraction.ExtractionResult:
    """A selection known to be valid (the input's, or a graph's carried into a new export), priced on `xg`."""
    return extraction.ExtractionResult(choices, extraction.dag_cost(xg, choices), None, method, 0.0, method)


def _polish(xg: extraction.EGraph, starts: Sequence[extraction.ExtractionResult], best: extraction.ExtractionResult,
            forbidden: frozenset[str], opts: Options, log: RunLog) -> extraction.ExtractionResult:
    """The cheapest of `best`, the starts and the local search's improvements of each start (see
    `extraction.local_search`).

    The input's selection is a start as well as greedy's: greedy settles each class alone and so picks small local
    gains (a gate's two matmuls merged) that block larger ones (one weight read for all time steps) which the
    search finds from the input."""
    for start in starts:
        log.say("extract", f"local search from the {start.method} graph")
        try:
            found = extraction.local_search(xg, start, forbidden=forbidden, time_limit=_local_search_seconds(opts))
        except Exception as exc:  # noqa: BLE001 - a failed polish keeps the selection it started from
            log.warn(f"the local search over the extraction failed ({_first_line(exc)}): {BUG}")
            found = start
        if found.cost < best.cost - 1e-12:
            best = found
    return best


GUIDED_ITERATIONS = 2  # per guided round: the guided multi-pattern iteration, then one of single-pattern rules


def _guided_rounds(
    te: TensorEGraph, cost: CostModel, opts: Options, xg: extraction.EGraph, decoded: dict[str, Any],
    forbidden: set[str], original_choices: dict[str, str], stats: ExplorationStats, log: RunLog,
) -> tuple[extraction.EGraph, dict[str, Any], set[str], extraction.ExtractionResult | None]:
    """Extend the merges the extracted graph uses, round by round; returns the last export and the best selection
    found in it (None if no round improved on the input).

    A multi-pattern iteration merges pairs; a chain (the products of five time steps sharing one weight, merged
    into one) needs one more iteration per link, and a second unrestricted iteration already multiplies the
    e-graph (pairs of pairs of every product). A round instead marks the graph the local search extracts, runs the
    multi-pattern rules only on pairs of its e-classes (the pair merged in the last round and the next product),
    and searches again; rounds stop when one does not lower the cost (that round's e-nodes are rolled back, so the
    ILP does not pay for a larger e-graph that gained nothing), at the time limit or at the node limit.
    """
    t0 = time.perf_counter()
    initial = _selection(xg, original_choices, "input")
    try:
        best = extraction.local_search(xg, initial, forbidden=frozenset(forbidden), major_only=True,
                                       time_limit=_local_search_seconds(opts))
    except Exception as exc:  # noqa: BLE001 - the rounds are an improvement; the plain pipeline goes on without them
        log.warn(f"guided rounds skipped: the local search failed ({_first_line(exc)}): {BUG}")
        return xg, decoded, forbidden, None
    if best is initial:
        return xg, decoded, forbidden, None
    inputs_own = set(original_choices.values())
    if not any(decoded[n].op == "slice" for n in best.choices.values() if n not in inputs_own):
        best.seconds = time.perf_counter() - t0  # no merge to extend: every merge is read through slices
        return xg, decoded, forbidden, best
    for k in range(opts.guided_rounds):
        remaining = opts.time_limit - stats.seconds
        if remaining <= 0:
            break
        log.say("guided", f"round {k + 1}: extending the extracted graph's merges")
        graph = te.rebuild(best.choices, decoded).compact()
        base = te.guide(graph)
        before = te.enode_count()
        te.checkpoint()
        round_stats = te.explore(node_limit=opts.node_limit, iter_limit=GUIDED_ITERATIONS, time_limit=remaining,
                                 guided=True)
        stats.seconds += round_stats.seconds
        found = start = None
        if round_stats.stop_reason != "error" and te.enode_count() != before:
            new_xg, new_decoded, new_forbidden = _export(te, cost, opts)
            start = _selection(new_xg, te.chosen_selection(new_decoded, graph, base), "guided")
            found = extraction.local_search(new_xg, start, forbidden=frozenset(new_forbidden), major_only=True,
                                            time_limit=_local_search_seconds(opts))
        if found is None or found is start:  # nothing gained: drop what the round added, keep the previous graph
            te.rollback()
            xg, decoded, forbidden = _export(te, cost, opts)  # re-read: e-class ids are per export
            best = _selection(xg, te.chosen_selection(decoded, graph, base), "guided")
            break
        offset = len(stats.iterations)
        for it in round_stats.iterations:
            it.iteration += offset
        stats.iterations += round_stats.iterations
        stats.guided_rounds += 1
        xg, decoded, forbidden, best = new_xg, new_decoded, new_forbidden, found
        if round_stats.stop_reason == "node_limit":
            break
    best.seconds = time.perf_counter() - t0
    best.method = "guided+local"
    return xg, decoded, forbidden, best


LIMITS = ("node_limit", "iter_limit", "time_limit")


@dataclass
class _Search:
    """How far the e-graph search got: filled in phase by phase, so a failure keeps what was done."""

    graph: Graph
    stats: ExplorationStats = field(default_factory=ExplorationStats)
    chosen: extraction.ExtractionResult | None = None


def _search(graph: Graph, cost: CostModel, opts: Options, times: dict[str, float], log: RunLog,
            state: _Search) -> None:
    """Lower, explore, extract and rebuild; the optimized graph is left in `state.graph`."""
    t = time.perf_counter()
    log.say("explore", f"lowering {graph.op_count()} ops into egglog")
    te = TensorEGraph(graph)
    times["lower"] = time.perf_counter() - t

    def iteration(it: IterationStats) -> None:
        log.say("explore", f"iteration {it.iteration}: {it.enodes:,} e-nodes, {it.eclasses:,} e-classes")

    state.stats = te.explore(node_limit=opts.node_limit, iter_limit=opts.iter_limit, time_limit=opts.time_limit,
                             k_multi=opts.k_multi, on_iteration=iteration)
    stats = state.stats
    times["explore"] = stats.seconds
    if stats.stop_reason == "error":
        log.warn(f"exploration stopped by an egglog error ({stats.error}); extracted from the e-graph before it: "
                 f"{BUG}")
    elif stats.stop_reason in LIMITS:
        reason = stats.stop_reason
        log.warn(f"exploration stopped at its {reason.replace('_', ' ')} ({getattr(opts, reason):g}) before "
                     f"saturation ({stats.enodes} e-nodes); raising {reason} (--{reason.replace('_', '-')}) may "
                     f"find a better graph")

    t = time.perf_counter()
    log.say("price", f"pricing {stats.enodes:,} e-nodes")
    xg, decoded, forbidden = _export(te, cost, opts)
    original_choices = te.original_selection(decoded)
    times["price"] = time.perf_counter() - t
    guided = None
    if opts.k_multi > 0 and opts.guided_rounds > 0 and stats.stop_reason not in ("node_limit", "time_limit", "error"):
        t = time.perf_counter()
        explored = stats.seconds
        try:
            xg, decoded, forbidden, guided = _guided_rounds(te, cost, opts, xg, decoded, forbidden, original_choices,
                                                            stats, log)
        except Exception as exc:  # noqa: BLE001 - the rounds are an improvement; extraction goes on without them
            log.warn(f"guided rounds failed ({_first_line(exc)}); extracted from the explored e-graph: {BUG}")
            xg, decoded, forbidden = _export(te, cost, opts)  # re-read: e-class ids are per export
            guided = None
        original_choices = te.original_selection(decoded)
        times["explore"] = stats.seconds
        times["guided"] = time.perf_counter() - t - (stats.seconds - explored)
    t = time.perf_counter()
    log.say("extract", "greedy")
    greedy = _greedy(xg, forbidden, log)
    greedy_seconds = time.perf_counter() - t
    t = time.perf_counter()
    # The greedy selection is acyclic too: sparing its e-nodes keeps a good graph in the filtered e-graph.
    blacklist = extraction.filter_cycles(xg, original_choices.values(), forbidden,
                                         preferred=greedy.choices.values() if greedy else ())
    times["cycle_filter"] = time.perf_counter() - t
    stats.blacklisted = len(blacklist)
    initial = _selection(xg, original_choices, "input")
    t = time.perf_counter()
    state.chosen = _extract(xg, frozenset(forbidden), frozenset(blacklist), initial, greedy, opts, log,
                            [guided] if guided is not None else [])
    times["extract"] = greedy_seconds + time.perf_counter() - t
    state.graph = te.rebuild(state.chosen.choices, decoded).compact()


def optimize_with_details(model: ModelLike, *, progress: ProgressFn | None = None, **options: Any) -> OptimizeResult:
    """Optimize `model` and report how: see `optimize` for the options. `progress(stage, detail)`, if given, is
    called as the run moves from stage to stage (see `tensat.progress`)."""
    output_path = options.pop("output", None)
    opts = Options(**options)
    opts.check()
    if output_path is not None:  # before any work: a run must not fail at its very end on a missing directory
        check_writable(output_path)
    times: dict[str, float] = {}
    log = RunLog(progress)

    t = time.perf_counter()
    log.say("import", "reading the model")
    if isinstance(model, Graph):
        graph = model
        original_model = onnx_io.export_model(graph) if opts.verify or opts.latency_check > 0 else None
    else:
        original_model = onnx_io.load_model(model, opts.input_shapes)
        graph = onnx_io.import_model(original_model)
    graph = graph.compact()
    times["import"] = time.perf_counter() - t

    cost = _cost_model(opts, log)
    measured = _measured(cost, opts)
    if measured is not None:  # it sizes its cache state by the weights one inference reads
        measured.observe_graph(graph)
    log.say("cost", f"pricing the input's {graph.op_count()} ops")
    cost_before = runtime_cost(graph, cost)

    state = _Search(graph)
    try:
        _search(graph, cost, opts, times, log, state)
    except BaseException as exc:  # the search is best effort: the input graph is always a valid answer
        if not _recoverable(exc):
            raise
        log.warn(f"optimization failed ({_first_line(exc)}); returned the input model: {BUG}")
        if not state.stats.stop_reason:
            state.stats.stop_reason, state.stats.error = "error", _first_line(exc)
        state.graph, state.chosen = graph, None
    optimized, stats, chosen = state.graph, state.stats, state.chosen
    run = _Outcome(graph, original_model, cost_before)
    if optimized is not graph:
        _finish(run, optimized, cost, opts, times, log, measured)
    cost.report()

    out_model = run.model if run.model is not None else onnx_io.export_model(graph)
    if run.returned_input is not None and opts.verify and run.report is None:
        run.report = VerifyReport(True, 0.0, 0.0, [o.name for o in out_model.graph.output], 0.0,
                                  "the input model is returned")
    if isinstance(model, Graph):
        output: Any = run.graph
    elif output_path is not None:
        onnx_io.save_model(out_model, output_path)
        output = Path(output_path)
    else:
        output = out_model
    return OptimizeResult(output, run.graph, graph, cost_before, run.cost, stats, chosen, times, run.report,
                          log.warnings, opts, run.check, measured.describe() if measured is not None else None,
                          nodes_before=len((original_model or out_model).graph.node),
                          nodes_after=len(out_model.graph.node), returned_input=run.returned_input)


@dataclass
class _Outcome:
    """What the run returns: the input (graph, model and cost) until an optimized graph passes every check."""

    graph: Graph
    model: onnx.ModelProto | None
    cost: float
    report: VerifyReport | None = None
    check: LatencyCheck | None = None
    returned_input: str | None = "no cheaper graph found"


def _finish(run: _Outcome, optimized: Graph, cost: CostModel, opts: Options, times: dict[str, float], log: RunLog,
            measured: MeasuredCost | None) -> None:
    """Export the optimized graph, price it as written, verify it and time it against the input; `run` takes it
    only if it passes each step, and says why not otherwise."""
    t = time.perf_counter()
    log.say("export", "writing the optimized graph as ONNX")
    try:
        out_model = onnx_io.export_model(optimized)
        written = onnx_io.import_model(out_model).compact()  # priced as written: the file is what the user runs
    except Exception as exc:  # noqa: BLE001 - an optimized graph that cannot be exported is dropped, not shipped
        log.warn(f"the optimized graph could not be exported ({_first_line(exc)}); returned the input model: {BUG}")
        run.returned_input = "the optimized graph could not be exported"
        return
    finally:
        times["export"] = time.perf_counter() - t
    cost_after = runtime_cost(written, cost)
    if cost_after >= run.cost * (1 - extraction.GAP_TOLERANCE):  # a gain within the ILP's own tolerance is none
        run.returned_input = (f"no graph found that costs less than the input as onnxruntime runs it "
                              f"({cost_after:.4g} against {run.cost:.4g} ms under the {opts.cost} cost model)")
        return
    report = None
    if opts.verify:
        t = time.perf_counter()
        log.say("verify", "running both models in onnxruntime")
        report = run.report = _verified(run.model, out_model, opts, log)
        times["verify"] = time.perf_counter() - t
        if report is None:
            run.returned_input = "the optimized graph rounds differently under onnxruntime's fused kernels"
            return
    check = None
    if opts.latency_check > 0 and run.model is not None:
        t = time.perf_counter()
        log.say("latency", f"timing both models end to end (at most {opts.latency_check:g} s)")
        device = measured.device if measured is not None else _check_device(opts)
        check = _end_to_end_check(run.model, out_model, device, opts, log)
        times["latency_check"] = time.perf_counter() - t
        run.check = check
        if check is not None and not check.kept:
            run.returned_input = f"the optimized graph was not measurably faster end to end ({check.figures()})"
            return
    run.graph, run.model, run.cost, run.report, run.returned_input = optimized, out_model, cost_after, report, None


def _verified(original: onnx.ModelProto, optimized: onnx.ModelProto, opts: Options,
              log: RunLog) -> VerifyReport | None:
    """The optimized model's verification report, or None where the input must be returned instead.

    Both models run in onnxruntime as a user runs them, graph optimizations on. Where their outputs differ, both run
    again as written (no fusions): a difference there means the optimized graph computes something else, and
    VerificationError is raised. Where they agree as written, the graphs compute the same function and the
    difference is in how onnxruntime's fused kernels round for one of them (a merged projection fused where the
    input's three were not); the input model is then returned, with a warning, since it is what runs as the user
    expects."""
    report = verify_mod.compare_models(original, optimized, seed=opts.seed)
    if report.ok:
        return report
    exact = verify_mod.compare_models(original, optimized, seed=opts.seed, optimizations=False)
    if not exact.ok:
        raise VerificationError(report.detail)
    log.warn(f"the optimized graph computes the input's function ({exact.detail} with onnxruntime's graph "
                 f"optimizations off), but with them on its {report.detail[0].lower()}{report.detail[1:]}; "
                 f"keeping the input model")
    return None


def _check_device(opts: Options) -> str:
    """The device the end-to-end check times on when no measuring cost model chose it."""
    return resolve_device(opts.device)


def optimize(model: ModelLike, **options: Any) -> Any:
    """Optimize a model by equality saturation; returns it in the form given.

    `model` is an `onnx.ModelProto`, a path to an .onnx file, or a `tensat.ir.Graph`. A ModelProto or a path gives
    back a ModelProto (or, with `output=PATH`, writes it atomically there and returns the path); a Graph gives a
    Graph. Options: node_limit (50000), iter_limit (15), time_limit (60 s of exploration), k_multi (1: iterations
    in which multi-pattern rules run), guided_rounds (4: rounds extending the extracted graph's merges), extractor
    ("ilp" or "greedy"), solver ("highs" or "cbc"), ilp_time_limit (60 s), cost ("measured": per-op latency on the
    target device, cached; or "analytic"), device ("auto", "cpu" or "cuda": where costs are measured and the result
    timed), latency_check (20 s: time the optimized model against the input end to end at one thread and at every
    core, and return the input model unless the optimized one is faster; 0 skips it), verify (True: compare
    against the input in onnxruntime and raise VerificationError on a mismatch), seed (0), input_shapes ({"x": [1, 3, 224, 224]} for dynamic dims).
    Use `optimize_with_details` for costs, e-graph growth and time per phase.
    """
    return optimize_with_details(model, **options).output


def rule_names() -> list[str]:
    """Names of every rule in the library."""
    return [r.name for r in rewrites.all_rules()]
