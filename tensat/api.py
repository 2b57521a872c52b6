"""`tensat.optimize`: ONNX in, e-graph, exploration, extraction, verified ONNX out."""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import onnx

import extraction
import rewrites
from tensat.cost import AnalyticCost, CostModel, graph_cost
from tensat.egraph import ExplorationStats, TensorEGraph
from tensat.errors import TensatError
from tensat.ir import Graph

ModelLike = Union[onnx.ModelProto, str, os.PathLike, Graph]

EXTRACTORS = ("ilp", "greedy")
SOLVERS = ("highs", "cbc")
COSTS = ("analytic", "measured")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Options:
    """Every knob of one optimization run (the CLI flags map one to one)."""

    node_limit: int = 50_000
    iter_limit: int = 15
    time_limit: float = 60.0
    k_multi: int = 1
    extractor: str = "ilp"
    solver: str = "highs"
    ilp_time_limit: float = 60.0
    cost: str = "analytic"
    device: str = "auto"
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
        if self.k_multi not in (0, 1, 2):
            raise TensatError(f"k_multi must be 0, 1 or 2, got {self.k_multi}")
        if self.extractor not in EXTRACTORS:
            raise TensatError(f"unknown extractor {self.extractor!r}; choose from {', '.join(EXTRACTORS)}")
        if self.solver not in SOLVERS:
            raise TensatError(f"unknown solver {self.solver!r}; choose from {', '.join(SOLVERS)}")
        if self.cost not in COSTS:
            raise TensatError(f"unknown cost model {self.cost!r}; choose from {', '.join(COSTS)}")
        if self.device not in DEVICES:
            raise TensatError(f"unknown device {self.device!r}; choose from {', '.join(DEVICES)}")


@dataclass
class OptimizeResult:
    """What a run produced and how: the optimized model, costs, e-graph growth and time per phase."""

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

    @property
    def speedup(self) -> float:
        """Cost ratio before/after under the run's cost model."""
        return self.cost_before / self.cost_after if self.cost_after > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary of the run."""
        ex = self.extraction
        return {
            "cost_before": self.cost_before,
            "cost_after": self.cost_after,
            "speedup": self.speedup,
            "ops_before": self.original_graph.op_count(),
            "ops_after": self.graph.op_count(),
            "exploration": self.exploration.to_dict(),
            "extraction": None if ex is None else {
                "method": ex.method, "status": ex.status, "cost": ex.cost, "bound": ex.bound, "seconds": ex.seconds,
            },
            "times": dict(self.times),
            "verification": None if self.verification is None else {
                "ok": self.verification.ok,
                "max_abs_error": self.verification.max_abs_error,
                "max_rel_error": self.verification.max_rel_error,
            },
            "warnings": list(self.warnings),
            "options": {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in self.options.__dict__.items()},
        }


def make_cost_model(name: str, device: str = "auto") -> CostModel:
    """The cost model called `name`: "analytic" (roofline) or "measured" (onnxruntime on `device`)."""
    if name == "analytic":
        return AnalyticCost()
    if name == "measured":
        from tensat.measure import make_measured_cost

        return make_measured_cost(device)
    raise TensatError(f"unknown cost model {name!r}")


def _warn(result_warnings: list[str], message: str) -> None:
    result_warnings.append(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _extract(
    xg: extraction.EGraph, forbidden: frozenset[str], initial: extraction.ExtractionResult, opts: Options,
    notes: list[str],
) -> extraction.ExtractionResult:
    """Greedy or ILP extraction, never worse than the input graph's own selection."""
    try:
        greedy = extraction.greedy_dag(xg, forbidden=forbidden)
    except ValueError as exc:
        _warn(notes, f"greedy extraction failed ({exc}); keeping the input graph")
        return initial
    best = greedy if greedy.cost <= initial.cost else initial
    if opts.extractor == "greedy":
        return best
    try:
        ilp = extraction.ilp_extract(xg, solver=opts.solver, time_limit=opts.ilp_time_limit, forbidden=forbidden,
                                     initial=best)
    except ValueError as exc:
        _warn(notes, f"ILP extraction failed ({exc}); using the best known selection")
        return best
    return ilp if ilp.cost <= best.cost + 1e-12 else best


def optimize_with_details(model: ModelLike, **options: Any) -> OptimizeResult:
    """Optimize `model` and report how: see `optimize` for the options."""
    from tensat import onnx_io, verify as verify_mod

    output_path = options.pop("output", None)
    opts = Options(**options)
    opts.check()
    times: dict[str, float] = {}
    notes: list[str] = []

    t = time.perf_counter()
    if isinstance(model, Graph):
        graph = model
        original_model = onnx_io.export_model(graph) if opts.verify else None
    else:
        original_model = onnx_io.load_model(model, opts.input_shapes)
        graph = onnx_io.import_model(original_model)
    graph = graph.compact()
    times["import"] = time.perf_counter() - t

    cost = make_cost_model(opts.cost, opts.device)
    cost_before = graph_cost(graph, cost)

    t = time.perf_counter()
    te = TensorEGraph(graph)
    times["lower"] = time.perf_counter() - t
    stats = te.explore(node_limit=opts.node_limit, iter_limit=opts.iter_limit, time_limit=opts.time_limit,
                       k_multi=opts.k_multi)
    times["explore"] = stats.seconds
    if stats.stop_reason == "error":
        _warn(notes, f"exploration stopped by an egglog error, using the e-graph before it: {stats.error}")

    t = time.perf_counter()
    xg, decoded, forbidden = te.export(cost)
    original_choices = te.original_selection(decoded)
    times["export"] = time.perf_counter() - t
    t = time.perf_counter()
    blacklist = extraction.filter_cycles(xg, original_choices.values(), forbidden)
    times["cycle_filter"] = time.perf_counter() - t
    stats.blacklisted = len(blacklist)
    frozen_forbidden = frozenset(forbidden | blacklist)
    initial = extraction.ExtractionResult(
        choices=original_choices, cost=extraction.dag_cost(xg, original_choices), bound=None, status="input",
        seconds=0.0, method="input",
    )
    t = time.perf_counter()
    chosen = _extract(xg, frozen_forbidden, initial, opts, notes)
    times["extract"] = time.perf_counter() - t

    optimized = te.rebuild(chosen.choices, decoded).compact()
    cost_after = graph_cost(optimized, cost)
    if cost_after > cost_before * (1 + 1e-9):
        _warn(notes, f"extracted graph costs more than the input ({cost_after:.4g} > {cost_before:.4g}); keeping the input")
        optimized, cost_after = graph, cost_before

    t = time.perf_counter()
    out_model = onnx_io.export_model(optimized)
    times["export_onnx"] = time.perf_counter() - t
    report = None
    if opts.verify:
        t = time.perf_counter()
        report = verify_mod.verify(original_model, out_model, seed=opts.seed)
        times["verify"] = time.perf_counter() - t

    if isinstance(model, Graph):
        output: Any = optimized
    elif output_path is not None:
        onnx_io.save_model(out_model, output_path)
        output = Path(output_path)
    else:
        output = out_model
    return OptimizeResult(output, optimized, graph, cost_before, cost_after, stats, chosen, times, report, notes, opts)


def optimize(model: ModelLike, **options: Any) -> Any:
    """Optimize a model by equality saturation; returns it in the form given.

    `model` is an `onnx.ModelProto`, a path to an .onnx file, or a `tensat.ir.Graph`. A ModelProto or a path gives
    back a ModelProto (or, with `output=PATH`, writes it atomically there and returns the path); a Graph gives a
    Graph. Options: node_limit (50000), iter_limit (15), time_limit (60 s of exploration), k_multi (1: iterations
    in which multi-pattern rules run), extractor ("ilp" or "greedy"), solver ("highs" or "cbc"), ilp_time_limit
    (60 s), cost ("analytic" or "measured"), device ("auto", "cpu" or "cuda": where measured costs are taken), verify (True: compare against the input in onnxruntime and raise
    VerificationError on a mismatch), seed (0), input_shapes ({"x": [1, 3, 224, 224]} for dynamic dims).
    Use `optimize_with_details` for costs, e-graph growth and time per phase.
    """
    return optimize_with_details(model, **options).output


def rule_names() -> list[str]:
    """Names of every rule in the library."""
    return [r.name for r in rewrites.all_rules()]
