"""`MeasuredCost`, the cost model pricing nodes by their latency in onnxruntime (see `tensat.measure`): how many
copies of a unit one timed model holds, what is evicted before each run, how a unit is planned (blocked layout,
reorders it causes), timed in windows and priced, and the cache lookups around it."""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import onnx
from onnx import ModelProto

from tensat import ops
from tensat.cost import AnalyticCost, Const, Extent, Resolution, blocked_binary, blocked_extents, priced_by_layout
from tensat.errors import TensatError, one_line
from tensat.ir import Graph, Node
from tensat.measure.bar import Progress
from tensat.measure.cache import CostCache, CostEntry
from tensat.measure.device import _silenced, default_clock, device_info, fingerprint, resolve_device
from tensat.measure.timing import Calibration, Runner, Timing, measure_calibration, time_pair
from tensat.measure.units import (
    NCHWC_DOMAIN,
    Shape,
    Unit,
    _is_plausibly_blocked,
    _jsonable,
    _nbytes,
    _with_prologue,
    pricing_unit,
    prologue_model,
    prologue_operands,
    reorder_model,
    replicate,
    sample_outputs,
    streams_weights,
    strip_reorders,
    unit_model,
)
from tensat.progress import ProgressFn
from tensat.session import nchwc_block

MAX_COPIES = 64
ROUND_BUDGET_US = 5_000.0  # aim for at most this much unit time per round
LONG_ROUND_US = 10_000.0  # units slower than this per round, or with more weights than LONG_WEIGHTS, get one window
LONG_WEIGHTS = 64 * 2**20
LONG_EVICT = 32 * 2**20  # units evicting this much before each timed run (two reads of it a round) get one window
MEMORY_CAP = 256 * 2**20  # bytes of weights, inputs and outputs over all copies
OUT_BUDGET = 4 * 2**20  # bytes of outputs over all copies (an end-to-end run reuses warm buffers)
DEFAULT_WORKING_SET = 64 * 2**20
WINDOWS = 2  # timing windows per unit, separated in time by the other units of its chunk
WINDOW_TOL = 0.05  # a unit's first two windows agree if their medians differ by at most this share
WINDOW_ABS_US = 0.05  # plus this many microseconds (else a third window decides)
CHUNK = 24
GRACE_SECONDS = 1.0  # a deadline passing with less than half this left to time (at the pace so far) is extended by it
# once: a unit deferred to a later run makes that run price, and so extract and time end to end, another graph

# where a unit without weights finds its output buffers when it is timed: rewritten just before it (warm), pushed out
# of the core's own caches into the last-level one (llc), or out of every cache (cold)
OUTPUTS = ("warm", "llc", "cold")
# the default place: inside a graph a unit without weights writes to buffers its predecessors' data has pushed to
# memory, and pricing it with its outputs warm under-predicts the graph (bench/results/cold_outputs, real_models)
DEFAULT_OUTPUTS = "cold"


@dataclass
class MeasureStats:
    """What a measured cost model did: units priced now (timed, or a reshape view priced from the calibration),
    found in the cache, priced by the analytic estimate (opaque ops; units onnxruntime could not run), and left
    unmeasured at a deadline and not measured since (`deferred`, their keys: a later run measures them, so its
    prices, and the graph it extracts, can differ from this one's)."""

    measured: int = 0
    cached: int = 0
    analytic: int = 0
    failed: int = 0
    seconds: float = 0.0
    analytic_ops: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    deferred: set[str] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        return {
            "measured": self.measured,
            "cached": self.cached,
            "analytic": self.analytic,
            "failed": self.failed,
            "deferred": len(self.deferred),
            "seconds": round(self.seconds, 3),
            "analytic_ops": dict(self.analytic_ops),
            "errors": list(self.errors[:20]),
        }


def _bucket(nbytes: float) -> int:
    """Working sets rounded to a quarter of an octave in MiB (1 to 256): near the last-level cache's size a weight's
    price moves steeply with the bytes passing between its reads (a power of two rounded CLIP's working set a third
    below the bytes it streams), and units of models of about one size still share their prices."""
    mib = max(nbytes / 2**20, 1.0)
    return int(min(round(2 ** (round(4 * math.log2(mib)) / 4)), 256))


def graph_traffic(graph: Graph) -> tuple[int, int]:
    """Bytes one inference reads as weights (the distinct weights, after weight-only subgraphs are folded; of an
    embedding table, the rows it looks up) and bytes it computes (every tensor)."""
    const = graph.weight_only()
    seen: set[int] = set()
    rows = computed = 0
    for i in graph.live():
        n = graph.nodes[i]
        if n.is_leaf or i in const:
            continue
        for k, j in enumerate(n.inputs):
            if j not in const:
                continue
            if n.op == "gather" and k == 0:  # a lookup reads the rows it gathers, not its table (an embedding's)
                rows += _nbytes(n.shape, n.dtype)
            else:
                seen.add(j)
        computed += _nbytes(n.shape, n.dtype)
    return rows + sum(_nbytes(graph.nodes[j].shape, graph.nodes[j].dtype) for j in seen), computed


def graph_working_set(graph: Graph) -> int:
    """Bytes one inference streams through the caches: the weights it reads and every tensor it computes
    (`graph_traffic`). Between two runs of one op all of them pass through the caches, and their sum, not the
    weights' alone, decides whether the op's weights are still there."""
    return sum(graph_traffic(graph))


class MeasuredCost:
    """A `CostModel` pricing nodes by their latency in onnxruntime on one device (see the module docstring).

    `prefetch(items)` measures every missing cost at once behind one progress bar; `__call__` returns cached costs
    (measuring on the spot if something was not prefetched). `unit_cost` prices a fused group of nodes. `windows`
    fixes the number of timing windows of every unit (default: `WINDOWS`, one for long units); `chunk` is how many
    units are planned at once, their windows taken in turn.
    """

    name = "measured"
    resolution = Resolution(WINDOW_TOL, WINDOW_ABS_US * 1e-3)  # a price is the median of windows this close

    def __init__(
        self,
        device: str = "auto",
        cache_path: str | os.PathLike[str] | None = None,
        progress: bool | ProgressFn = True,
        threads: int = 1,
        working_set: int | None = None,
        max_seconds: float = 1.5,
        cache: CostCache | None = None,
        clock: str | None = None,
        windows: int | None = None,
        chunk: int = CHUNK,
        outputs: str = DEFAULT_OUTPUTS,
    ) -> None:
        if int(threads) < 1:
            raise TensatError(f"threads must be positive, got {threads}")
        if windows is not None and int(windows) < 1:
            raise TensatError(f"windows must be positive, got {windows}")
        self.windows = None if windows is None else int(windows)
        if outputs not in OUTPUTS:
            raise TensatError(f"outputs must be one of {', '.join(OUTPUTS)}, got {outputs!r}")
        # where a unit without weights finds its output buffers when it runs (`OUTPUTS`, `bench.cold_outputs`)
        self.outputs = outputs
        self.chunk = max(1, int(chunk))
        self.device = resolve_device(device)
        self.threads = int(threads)
        self.clock = clock or default_clock(self.device, self.threads)
        self.progress = progress
        self.max_seconds = max_seconds
        self.info = device_info(self.device, self.threads, self.clock)
        self.fingerprint = fingerprint(self.info)
        self.cache = cache if cache is not None else CostCache(cache_path)
        self.working_set = working_set
        self.stats = MeasureStats()
        self._memo: dict[str, float] = {}
        self._details: dict[str, Mapping[str, Any]] = {}
        self._runner: Runner | None = None
        self._calibration: Calibration | None = None
        self._analytic = AnalyticCost()
        self._flagged: set[str] = set()
        # the extents of the tensors the observed graph holds in the blocked layout (`observe_graph`); before one is
        # observed, every 4-D tensor whose channels the layout accepts counts as blocked
        self.blocked_extents: frozenset[Extent] | None = None

    # -- configuration ------------------------------------------------------------------------------------------

    def observe_graph(self, graph: Graph) -> None:
        """Take the working set (bytes one inference streams through the caches) from the graph being optimized,
        and the extents of the tensors it holds in the blocked layout (`tensat.cost.blocked_extents`)."""
        self.working_set = graph_working_set(graph)
        self.blocked_extents = blocked_extents(graph, nchwc_block() if self.device == "cpu" else 0)

    def _blocked(self, shape: Sequence[int], dtype: str) -> bool:
        """Whether a computed tensor of `shape` is in the blocked layout inside the graph: a 4-D float tensor whose
        channels the layout accepts, of an extent the observed graph holds blocked."""
        if not _is_plausibly_blocked(shape, dtype):
            return False
        return self.blocked_extents is None or (shape[0], shape[2], shape[3]) in self.blocked_extents

    def _arrives_blocked(self, unit: Unit, k: int) -> bool:
        """Whether the computed external `k` of `unit` arrives in the blocked layout: as the priced graph fixes it
        (`Unit.layouts`), else by its extent (`_blocked`)."""
        shape, _, dtype = unit.externals[k]
        known = dict(unit.layouts).get(k)
        if known is None:
            return self._blocked(shape, dtype)
        return known and _is_plausibly_blocked(shape, dtype)

    def _plain(self, unit: Unit) -> list[int]:
        """The computed tensors of a unit that could be blocked but are not in the graph (its externals by index,
        its output as -1, by `_arrives_blocked` and by extent): of a unit that runs in NCHW, no reorder is charged
        at them; of one whose operands a prologue feeds blocked (`prologue_operands`), none feeds them. The unit's
        key says so."""
        if unit.ops == ("reshape",) or _binary(unit) or any(ops.get(op).breaks_layout for op in unit.ops):
            tensors = [k for k, (_, c, _) in enumerate(unit.externals) if not c]
            output = _is_plausibly_blocked(unit.out_shape, unit.dtype) and not self._blocked(unit.out_shape, unit.dtype)
        else:
            tensors, output = prologue_operands(unit), False
        plain = [k for k in tensors if self._could_be_blocked(unit, k) and not self._arrives_blocked(unit, k)]
        return [*plain, -1] if output else plain

    def _leaves_layout(self, unit: Unit) -> bool:
        """Whether the unit runs out of the blocked layout between blocked neighbours, the reorders that causes
        charged to it (`_boundary_us`): an op that breaks the layout (`OpDef.breaks_layout`), or an element-wise
        binary op of two computed operands onnxruntime does not run blocked (`_binary`, `tensat.cost.blocked_binary`:
        a squeeze-and-excitation's channel scale)."""
        if any(ops.get(op).breaks_layout for op in unit.ops):
            return True
        if not _binary(unit):
            return False
        arriving = [self._arrives_blocked(unit, k) for k in range(len(unit.externals))]
        return any(arriving) and not blocked_binary(unit.ops[0], [e[0] for e in unit.externals], arriving)

    @staticmethod
    def _could_be_blocked(unit: Unit, k: int) -> bool:
        shape, _, dtype = unit.externals[k]
        return _is_plausibly_blocked(shape, dtype)

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            self._runner = Runner(self.device, self.threads, self.clock)
        return self._runner

    @property
    def calibration(self) -> Calibration:
        """The device's calibration constants (measured and stored on first use)."""
        if self._calibration is None:
            found = self.cache.device(self.fingerprint)
            stored = Calibration.from_dict(found[1]) if found and found[1] else None
            if stored is not None:
                self._calibration = stored
            else:
                self._calibration = self.calibrate()
                self.cache.put_device(self.fingerprint, self.info, self._calibration.to_dict())
        return self._calibration

    def calibrate(self) -> Calibration:
        """Measure the per-node dispatch cost, the per-run overhead and the NCHWc block size on this device."""
        return measure_calibration(self.runner, self.clock)

    # -- signatures ---------------------------------------------------------------------------------------------

    def _ws_bucket(self) -> int:
        return _bucket(self.working_set if self.working_set is not None else DEFAULT_WORKING_SET)

    def _key(self, unit: Unit) -> str:
        sig = unit.signature()
        if unit.weighted:
            sig = f"{sig}|ws={self._ws_bucket()}MiB"
        plain = self._plain(unit)
        if plain:
            sig = f"{sig}|nchw={','.join(map(str, plain))}"
        outputs = self._unit_outputs(unit)
        if outputs != "warm":
            sig = f"{sig}|outputs={outputs}"
        return sig

    def _unit_outputs(self, unit: Unit) -> str:
        """Where `unit`'s output buffers are when it is timed (`OUTPUTS`): `outputs` for a unit without weights,
        warm for one with them."""
        return "warm" if unit.weighted else self.outputs

    @staticmethod
    def _reorder_key(kind: str, shape: Sequence[int]) -> str:
        return json.dumps({"reorder": kind, "shape": list(shape)}, separators=(",", ":"))

    # -- pricing ------------------------------------------------------------------------------------------------

    def __call__(self, node: Node, in_shapes: Sequence[Shape], const: Sequence[Const] = ()) -> float:
        if node.is_leaf or (node.op != "opaque" and in_shapes and len(const) == len(in_shapes) and all(const)):
            return 0.0
        if node.op == "opaque":
            return self._opaque(node, in_shapes, const)
        return self.unit_cost(pricing_unit(node, in_shapes, const))

    def _opaque(self, node: Node, in_shapes: Sequence[Shape], const: Sequence[Const]) -> float:
        key = f"opaque|{node.attr.get('key')}|{json.dumps(_jsonable(list(in_shapes)))}"
        if key not in self._flagged:
            self._flagged.add(key)
            self.stats.analytic += 1
            self.stats.analytic_ops["opaque"] = self.stats.analytic_ops.get("opaque", 0) + 1
        return float(self._analytic(node, in_shapes, const))

    def unit_cost(self, unit: Unit) -> float:
        """The cost of `unit` in milliseconds (measured now if it is not cached)."""
        key = self._key(unit)
        if key not in self._memo:
            self.prefetch_units([unit])
        return self._memo[key]

    def detail(self, unit: Unit) -> Mapping[str, Any]:
        """How the cost of a priced unit was made up (raw timing, copies, reorders, fallbacks)."""
        return self._details.get(self._key(unit), {})

    def prefetch(
        self, items: Iterable[tuple[Node, Sequence[Shape], Sequence[Const]]], deadline: float | None = None
    ) -> list[int]:
        """Measure (or load from the cache) the cost of every item not yet known, behind one progress bar, in the
        order given; with `deadline` (a `time.perf_counter()` value) no timing window starts after it. The indices
        of the items left unpriced (none without a deadline)."""
        items = list(items)
        if self.working_set is None:
            self.working_set = self._estimate_working_set(items)
        units: dict[int, Unit] = {}
        for i, (node, shapes, const) in enumerate(items):
            if node.is_leaf or node.op == "opaque" or (shapes and len(const) == len(shapes) and all(const)):
                continue
            units[i] = pricing_unit(node, shapes, const)
        left = self.prefetch_units(list(units.values()), deadline=deadline)
        return [i for i, u in units.items() if self._key(u) in left]

    @staticmethod
    def _estimate_working_set(items: Sequence[tuple[Node, Sequence[Shape], Sequence[Const]]]) -> int:
        """Without `observe_graph`: the bytes of every weight operand priced (shared weights counted per use) and of
        every output."""
        total = 0
        for node, shapes, const in items:
            total += sum(_nbytes(s, node.dtype) for s, c in zip(shapes, const) if c) + _nbytes(node.shape, node.dtype)
        return total or DEFAULT_WORKING_SET

    def prefetch_units(
        self, units: Iterable[Unit], between: Callable[[], None] | None = None, deadline: float | None = None
    ) -> set[str]:
        """Load or measure every unit not yet known; the keys of those left unmeasured at `deadline`.

        Units are measured in chunks; each unit is timed in `WINDOWS` windows separated by the other units of
        its chunk (a third window where the first two disagree by more than `WINDOW_TOL`), and its cost is the
        median of the window medians, so a burst of load from other processes does not stay in the cache. Every
        other window goes through the chunk backwards, so each unit's windows centre on the chunk's middle.
        `between`, if given, is called after every window (the accuracy report times end-to-end runs there).

        Without `deadline` units are measured sorted by label; with one, in the order given (the caller's most
        wanted first), and no window starts after it, unless so little is left that it is timed now
        (`_grace_until`: deferring it would make a later run price, extract and time another graph). A unit
        timed in fewer windows than it wanted is priced for this run and cached as partial, and a unit with no
        window is left out. A later call prices a partial unit from its cached windows and times only the
        windows it still wants, so that runs whose deadline falls at the same place still complete the cache
        between them. The units left, and those deferred by an earlier call and still unpriced, are the stats'
        `deferred`.
        """
        left = self._prefetch_units(units, between, deadline)
        self.stats.deferred = (self.stats.deferred | left).difference(self._memo)
        return left

    def _prefetch_units(
        self, units: Iterable[Unit], between: Callable[[], None] | None, deadline: float | None
    ) -> set[str]:
        """`prefetch_units`, but for the deferred units' count."""
        todo: dict[str, Unit] = {}
        for u in units:
            k = self._key(u)
            if k not in self._memo and k not in todo:
                todo[k] = u
        if not todo:
            return set()
        found = self.cache.get_many(self.fingerprint, todo)
        resume: dict[str, list[Timing]] = {}  # partly timed units: their windows so far, to be completed
        for k, entry in found.items():
            self._memo[k] = entry.ms
            self._details[k] = entry.detail or {}
            if (entry.detail or {}).get("partial"):
                resume[k] = _windows_of(entry)
                continue
            self.stats.cached += 1
            todo.pop(k)
        if not todo:
            return set()
        start = time.perf_counter()
        order = (
            list(todo.items()) if deadline is not None else sorted(todo.items(), key=lambda kv: (kv[1].label(), kv[0]))
        )
        windows = self.windows or WINDOWS
        bar = Progress(len(order) * windows, f"measuring {len(order)} op costs on {self.device}", self.progress)

        limit, graced, windows_timed = deadline, False, 0

        def past() -> bool:
            """Whether the deadline has passed, extended once where what is left is short (`_grace_until`)."""
            nonlocal limit, graced
            if not _past(limit):
                return False
            if not graced and limit is not None:
                graced = True
                left_windows = len(order) * windows - windows_timed
                limit = _grace_until(time.perf_counter() - start, windows_timed, left_windows) or limit
            return _past(limit)

        def timed(plan: _Plan | CostEntry) -> bool:
            """Time one more window of `plan` unless the deadline has passed (then: False)."""
            nonlocal windows_timed
            if past():
                return False
            self._window(plan)
            windows_timed += 1
            if between is not None:
                between()
            return True

        left: set[str] = set()
        try:
            for c in range(0, len(order), self.chunk):
                chunk = order[c : c + self.chunk]
                if past():
                    left.update(k for k, _ in chunk if k not in self._memo)
                    continue
                plans: dict[str, _Plan | CostEntry] = {}  # planned on the way to a unit's first window
                cut = False
                for w in range(windows):
                    for k, unit in chunk if w % 2 == 0 else chunk[::-1]:
                        if k not in plans and not (cut := cut or past()):
                            planned = plans[k] = self._plan(unit)
                            if isinstance(planned, _Plan) and k in resume:
                                planned.windows.extend(resume[k])
                        plan = plans.get(k)
                        done = len(plan.windows) if isinstance(plan, _Plan) else 0
                        if not cut and plan is not None and done <= w < _wanted(plan):
                            cut = not timed(plan)
                        bar.step(unit.label())
                extra = [] if cut else [k for k, _ in chunk if isinstance(p := plans.get(k), _Plan) and p.disagree()]
                bar.total += len(extra)
                undecided: set[str] = set()  # windows disagreed, and the deciding one came after the deadline
                for k in extra:
                    cut = cut or not timed(plans[k])
                    if cut:
                        undecided.add(k)
                    bar.step(todo[k].label())
                entries: dict[str, CostEntry] = {}
                for k, _ in chunk:
                    plan = plans.get(k)
                    timed_now = isinstance(plan, _Plan) and len(plan.windows) > len(resume.get(k, ()))
                    if plan is None or (isinstance(plan, _Plan) and plan.failure is None and not timed_now):
                        if k not in self._memo:  # a partial unit keeps the price its cached windows gave
                            left.add(k)
                        continue
                    entry = self._entry(plan)
                    if k in undecided or not _complete(plan):
                        entry = replace(entry, detail={**(entry.detail or {}), "partial": True})
                    entries[k] = entry
                    self._memo[k] = entry.ms
                    self._details[k] = entry.detail or {}
                self.cache.put_many(self.fingerprint, entries)
        finally:
            bar.close()
            self.stats.seconds += time.perf_counter() - start
        return left

    # -- measuring ----------------------------------------------------------------------------------------------

    def _analytic_us(self, unit: Unit) -> float:
        shapes = unit.shapes()
        total = 0.0
        for n, out in zip(unit.nodes, shapes):
            ins = [unit.externals[i][0] if kind == "x" else shapes[i] for kind, i in n.inputs]
            consts = [unit.externals[i][1] if kind == "x" else False for kind, i in n.inputs]
            node = Node(n.op, (), n.attrs, out, unit.dtype)
            total += self._analytic(node, ins, consts) * 1e3
        return total

    def copies_for(self, unit: Unit) -> int:
        """How many copies of `unit` one timed model holds (working set, time budget, memory)."""
        wbytes = unit.weight_bytes()
        out_bytes = _nbytes(unit.out_shape, unit.dtype)
        est = max(self._analytic_us(unit), 1.0)
        k_time = max(1, int(ROUND_BUDGET_US // est))
        if unit.weighted:
            ws = self.working_set if self.working_set is not None else DEFAULT_WORKING_SET
            k = math.ceil(_bucket(ws) * 2**20 / wbytes)
        else:
            k = 8
        in_bytes = sum(_nbytes(s, d) for s, c, d in unit.externals if not c)
        k_mem = max(1, MEMORY_CAP // max(wbytes + in_bytes + out_bytes, 1))
        k_out = max(1, OUT_BUDGET // max(out_bytes, 1))
        # inside a graph an op's input was just computed and is still in the core's level-2 cache where it fits;
        # the copies' inputs and outputs, touched again before each timed run, stay there only if they fit together
        near = self.runner.near_cache
        k_near = max(1, near // max(in_bytes + out_bytes, 1)) if near else MAX_COPIES
        return int(max(1, min(k, k_time, k_mem, k_out, k_near, MAX_COPIES)))

    def evict_bytes(self, weight_bytes: int, copies: int) -> int:
        """Bytes to evict before a timed run of `copies` copies of a unit with `weight_bytes` of weights: the rest
        of the working set, which inside the graph passes through the caches between two runs of the unit (none
        for a unit without weights, or with one cache line of them: its data is recently computed tensors, and one
        line fetched cold costs less than the eviction's own effects on the unit), and no more than the runner's
        `weight_evict_cap`: beyond it the eviction slows the inputs read again after it, which inside the graph
        were just computed."""
        if not streams_weights(weight_bytes):
            return 0
        return min(max(0, self._ws_bucket() * 2**20 - copies * weight_bytes), self.runner.weight_evict_cap)

    def output_evict_bytes(self, place: str) -> int:
        """Bytes to evict before a timed run so that the unit's outputs are where `place` says (`OUTPUTS`): twice
        the core's level-2 cache for the last-level cache (none where its size is unknown), the runner's
        `evict_cap` for out of every cache."""
        if place == "cold":
            return self.runner.evict_cap
        if place == "llc" and self.runner.near_cache:
            return 2 * self.runner.near_cache
        return 0

    def _fallback(self, unit: Unit, exc: BaseException) -> CostEntry:
        label = unit.label()
        self.stats.failed += 1
        self.stats.analytic_ops[label] = self.stats.analytic_ops.get(label, 0) + 1
        message = f"{label}: {one_line(exc, limit=200)}"
        self.stats.errors.append(message)
        return CostEntry(self._analytic_us(unit) / 1e3, 0.0, 0, label, {"fallback": "analytic", "error": message})

    def _plan(self, unit: Unit) -> _Plan | CostEntry:
        """How `unit` is timed: copies, eviction, and on CPU the blocked-layout model (or the reorders it causes)."""
        cal = self.calibration
        if unit.ops == ("reshape",):
            return self._reshape_entry(unit, cal)
        if unit.ops == ("transpose",) and cal.block:
            folded = self._folded_transpose(unit)
            if folded is not None:
                return folded
        try:
            with _silenced():
                plan = _Plan(unit, self.copies_for(unit), outputs=self._unit_outputs(unit))
                plan.evict_bytes = max(
                    self.evict_bytes(unit.weight_bytes(), plan.copies), self.output_evict_bytes(plan.output_place)
                )
                if self.windows is not None:
                    plan.windows_wanted = self.windows
                elif (
                    self._analytic_us(unit) * plan.copies > LONG_ROUND_US
                    or unit.weight_bytes() > LONG_WEIGHTS
                    or plan.evict_bytes >= LONG_EVICT
                ):
                    plan.windows_wanted = 1
                tensors = [*(e[0] for e in unit.externals), unit.out_shape]
                if self.device == "cpu" and cal.block and any(len(s) == 4 for s in tensors):
                    found = self._blocked_model(unit)
                    if found is not None:
                        plan.model, plan.null_model = found
                    plan.blocked = found is not None
                    # ops that run out of the blocked layout force reorders around them (`_leaves_layout`)
                    if not plan.blocked and self._leaves_layout(unit):
                        plan.add_us = self._boundary_us(unit)
                return plan
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises many types; never stop the optimization
            return self._fallback(unit, exc)

    def _window(self, plan: _Plan | CostEntry) -> None:
        """One timing window of a planned unit (a unit that fails falls back to the analytic estimate)."""
        if not isinstance(plan, _Plan) or plan.failure is not None:
            return
        r = self.runner
        try:
            with _silenced():
                base = plan.model if plan.model is not None else unit_model(plan.unit)
                model = replicate(base, plan.copies) if plan.copies > 1 else base
                run = r.bound(r.session(model))
                del model, base
                if plan.null_model is None:
                    null = r.null(plan.copies)
                else:
                    k = plan.copies
                    null = r.bound(r.session(replicate(plan.null_model, k) if k > 1 else plan.null_model))
                budget = self.max_seconds / plan.windows_wanted
                plan.windows.append(
                    time_pair(
                        run,
                        null,
                        plan.copies,
                        max_seconds=budget,
                        clock=r.clock,
                        before=plan.before_run(r, run),
                    )
                )
        except Exception as exc:  # noqa: BLE001
            plan.failure = self._fallback(plan.unit, exc)

    def _entry(self, plan: _Plan | CostEntry) -> CostEntry:
        """The cost of a timed unit: median of its window medians plus the per-node cost and the reorders it
        causes."""
        if isinstance(plan, CostEntry):
            return plan
        if plan.failure is not None:
            return plan.failure
        cal = self.calibration
        medians = [w.median_us for w in plan.windows]
        raw = statistics.median(medians)
        dispatch = cal.node_us if plan.null_model is None else 0.0  # see _blocked_model
        us = max(raw + dispatch + plan.add_us, cal.node_us)
        self.stats.measured += 1
        detail: dict[str, Any] = {
            "raw_us": round(raw, 4),
            "windows_us": [round(m, 4) for m in medians],
            "copies": plan.copies,
            "rounds": sum(w.rounds for w in plan.windows),
            "node_us": cal.node_us,
            "boundary_us": round(plan.add_us, 4),
            "nchwc": plan.blocked,
            "seconds": round(sum(w.seconds for w in plan.windows), 3),
        }
        if plan.unit.weighted:
            detail["working_set_mib"] = self._ws_bucket()
        if plan.evict_bytes:
            detail["evict_mib"] = round(plan.evict_bytes / 2**20, 1)
        if plan.output_place != "warm":
            detail["outputs"] = plan.output_place
        spread = max(w.spread for w in plan.windows)
        return CostEntry(us / 1e3, spread, detail["rounds"], plan.unit.label(), detail)

    def _measure(self, unit: Unit) -> CostEntry:
        """Plan and time one unit now, in its windows back to back (no progress bar)."""
        plan = self._plan(unit)
        for _ in range(plan.windows_wanted if isinstance(plan, _Plan) else 0):
            self._window(plan)
        if isinstance(plan, _Plan) and plan.disagree():
            self._window(plan)
        return self._entry(plan)

    def _reshape_entry(self, unit: Unit, cal: Calibration) -> CostEntry:
        us = cal.node_us
        boundary = 0.0
        shape, const, _ = unit.externals[0]
        if cal.block and not const and self._arrives_blocked(unit, 0):
            boundary = self._reorder_us("out", shape)
        detail = {"view": True, "node_us": cal.node_us, "boundary_us": boundary}
        self.stats.measured += 1
        return CostEntry((us + boundary) / 1e3, 0.0, 0, "reshape", detail)

    def _folded_transpose(self, unit: Unit) -> CostEntry | None:
        """A Transpose onnxruntime runs as an NCHWc reorder (None for any other): from a blocked tensor to NHWC, as
        the ReorderOutput leaving the blocked layout, written channels last; from NHWC to a blocked tensor, as the
        ReorderInput entering it, read channels last. ConvNeXt's and SegFormer's Transposes beside their
        convolutions run so, and a Transpose and a reorder priced for each cost about twice what runs."""
        shape, const, dtype = unit.externals[0]
        perm = tuple(dict(unit.nodes[0].attrs)["perm"])
        block = self.calibration.block  # a convolution reorders only an input of whole blocks of channels
        if const:
            return None
        if perm == (0, 2, 3, 1) and self._arrives_blocked(unit, 0):
            kind, at = "out_nhwc", shape
        elif perm == (0, 3, 1, 2) and self._blocked(unit.out_shape, unit.dtype) and unit.out_shape[1] % block == 0:
            kind, at = "in_nhwc", unit.out_shape
        else:
            return None
        us = self._reorder_us(kind, at)
        self.stats.measured += 1
        return CostEntry(us / 1e3, 0.0, 0, unit.label(), {"nchwc_reorder": kind, "node_us": self.calibration.node_us})

    def uncached(
        self, windows: int | None = None, max_seconds: float | None = None, chunk: int | None = None
    ) -> MeasuredCost:
        """A model with the same device, settings and calibration whose costs are kept in memory only (so
        everything it prices is measured now), optionally with other `windows`, `max_seconds` and `chunk`."""
        fresh = MeasuredCost(
            self.device,
            progress=self.progress,
            threads=self.threads,
            working_set=self.working_set,
            max_seconds=self.max_seconds if max_seconds is None else max_seconds,
            cache=CostCache(":memory:"),
            clock=self.clock,
            windows=self.windows if windows is None else windows,
            chunk=self.chunk if chunk is None else chunk,
            outputs=self.outputs,
        )
        fresh._calibration = self.calibration
        fresh.blocked_extents = self.blocked_extents
        return fresh

    def _blocked_model(self, unit: Unit) -> tuple[ModelProto, ModelProto | None] | None:
        """onnxruntime's optimized model of `unit` with the reorders at its inputs and outputs cut off (None when
        onnxruntime does not run the unit in the blocked layout): it takes and gives blocked tensors, as the unit
        does between blocked neighbours inside a graph. A residual operand of Conv+Add enters through a 1x1 max pool
        (`_with_prologue`), so that onnxruntime fuses the Add into the convolution and updates that operand in
        place, as it does inside a graph (the output is then sampled, `sample_outputs`, as a graph output cannot
        alias the operand); the pools and the sampling go into the null model (second item), so that their time
        cancels, the unit's dispatch cost included."""
        timed, prologue = _with_prologue(unit, lambda k: self._arrives_blocked(unit, k))
        with tempfile.TemporaryDirectory(prefix="tensat-probe-") as tmp:
            path = os.path.join(tmp, "opt.onnx")
            self.runner.session(unit_model(timed), optimized_path=path)
            opt = onnx.load(path)
        ran_blocked = [
            n for n in opt.graph.node if n.domain == NCHWC_DOMAIN and n.op_type not in ("ReorderInput", "ReorderOutput")
        ]
        if len(ran_blocked) <= len(prologue):  # only the prologue's pools: the unit itself runs in NCHW
            return None
        stripped = strip_reorders(opt, self.calibration.block)
        if not prologue:
            return stripped, None
        return sample_outputs(stripped), prologue_model(stripped, len(prologue))

    def _boundary_us(self, unit: Unit) -> float:
        """Reorders a layout-breaking unit causes between blocked neighbours: out of the blocked layout at each
        4-D input (for a slice, its share of the tensor) and back into it at a 4-D output."""
        total = 0.0
        head = unit.nodes[0]
        for k, (shape, const, _) in enumerate(unit.externals):
            if const or not self._arrives_blocked(unit, k):
                continue
            share = 1.0
            if unit.ops == ("slice",):
                a = dict(head.attrs)
                share = a["size"] / shape[a["axis"]]
            total += share * self._reorder_us("out", shape)
        if self._blocked(unit.out_shape, unit.dtype):
            total += self._reorder_us("in", unit.out_shape)
        return total

    def _reorder_us(self, kind: str, shape: Sequence[int]) -> float:
        """Microseconds of one NCHWc reorder of a tensor of `shape` (cached like any unit)."""
        shape = tuple(int(d) for d in shape)
        key = self._reorder_key(kind, shape)
        if key in self._memo:
            return self._memo[key] * 1e3
        found = self.cache.get(self.fingerprint, key)
        if found is None:
            cal = self.calibration
            r = self.runner
            copies = max(1, min(8, OUT_BUDGET // max(_nbytes(shape), 1)))
            base = reorder_model(kind, shape, cal.block)
            model = replicate(base, copies) if copies > 1 else base
            run = r.bound(r.session(model))
            timing = time_pair(run, r.null(copies), copies, max_seconds=self.max_seconds, clock=r.clock)
            us = max(timing.median_us + cal.node_us, 0.0)
            found = CostEntry(
                us / 1e3,
                timing.spread,
                timing.rounds,
                f"reorder_{kind}",
                {"raw_us": timing.median_us, "copies": copies},
            )
            self.cache.put(self.fingerprint, key, found)
        self._memo[key] = found.ms
        return found.ms * 1e3

    # -- reporting ----------------------------------------------------------------------------------------------

    @property
    def baseline_ms(self) -> float:
        """The fixed cost of one end-to-end run (session overhead beyond its nodes), in milliseconds."""
        return self.calibration.run_us / 1e3

    def describe(self) -> dict[str, Any]:
        """Device, fingerprint, calibration, working set, cache location and counters, JSON-ready."""
        return {
            "device": dict(self.info),
            "fingerprint": self.fingerprint,
            "calibration": self.calibration.to_dict(),
            "working_set_mib": self._ws_bucket(),
            "cache": self.cache.path,
            "stats": self.stats.to_dict(),
        }


@dataclass
class _Plan:
    """A unit being measured: what is timed, in how many copies, the reorders it causes, the windows so far."""

    unit: Unit
    copies: int
    model: ModelProto | None = None  # what is timed, when not the unit's own model
    null_model: ModelProto | None = None  # its null model, when not `null_model(copies)`
    add_us: float = 0.0
    blocked: bool = False
    windows: list[Timing] = field(default_factory=list)
    failure: CostEntry | None = None
    windows_wanted: int = WINDOWS
    evict_bytes: int = 0
    outputs: str = DEFAULT_OUTPUTS  # where its output buffers are whatever its ops (`MeasuredCost.outputs`)

    @property
    def output_place(self) -> str:
        """Where the unit's output buffers are when it is timed (`OUTPUTS`): out of the caches for a unit whose ops
        all write to buffers last used long before (`OpDef.cold_output`), else `outputs`."""
        return "cold" if all(ops.get(op).cold_output for op in self.unit.ops) else self.outputs

    def before_run(self, runner: Runner, run: Callable[[], None]) -> Callable[[], None] | None:
        """What to do before each timed run of `run`, its bound copies: evict `evict_bytes`, then read the inputs
        again and rewrite the outputs where they stay warm (`Runner.cold_weights`)."""
        return runner.cold_weights(run, self.evict_bytes, warm_outputs=self.output_place == "warm")

    def disagree(self) -> bool:
        """The first two windows differ by more than WINDOW_TOL (a third window decides)."""
        if self.failure is not None or len(self.windows) != 2:
            return False
        a, b = (w.median_us for w in self.windows)
        return abs(a - b) > WINDOW_TOL * max(min(a, b), 1e-3) + WINDOW_ABS_US


def _binary(unit: Unit) -> bool:
    """Whether `unit` is one element-wise binary op whose price depends on its operands' layout
    (`tensat.cost.priced_by_layout`)."""
    return len(unit.nodes) == 1 and priced_by_layout(unit.ops[0], [c for _, c, _ in unit.externals])


def _grace_until(elapsed: float, windows_timed: int, windows_left: int) -> float | None:
    """The `time.perf_counter()` value a passed deadline moves to (None: it stays), `GRACE_SECONDS` from now where
    the windows left, at the pace of the `windows_timed` timed in `elapsed` seconds, take at most half of it."""
    if windows_timed <= 0 or windows_left <= 0 or 2 * windows_left * elapsed / windows_timed > GRACE_SECONDS:
        return None
    return time.perf_counter() + GRACE_SECONDS


def _past(deadline: float | None) -> bool:
    """Whether `deadline` (a `time.perf_counter()` value, or None for none) has passed."""
    return deadline is not None and time.perf_counter() >= deadline


def _wanted(plan: _Plan | CostEntry) -> int:
    """How many timing windows `plan` wants (one for a priced entry: the loop's turn that yields it)."""
    return plan.windows_wanted if isinstance(plan, _Plan) else 1


def _windows_of(entry: CostEntry) -> list[Timing]:
    """The windows of a partly timed unit as cached (`windows_us`), to resume timing it where a run left off."""
    detail = entry.detail or {}
    medians = [float(m) for m in detail.get("windows_us", [])]
    rounds = entry.runs // max(len(medians), 1)
    copies = int(detail.get("copies", 1))
    return [Timing(m, entry.spread, rounds, copies, 0.0) for m in medians]


def _complete(plan: _Plan | CostEntry) -> bool:
    """Whether `plan` got every window it wanted (or needed none): only then is its cost cached as final."""
    return not isinstance(plan, _Plan) or plan.failure is not None or len(plan.windows) >= plan.windows_wanted


def make_measured_cost(
    device: str = "auto",
    cache_path: str | os.PathLike[str] | None = None,
    progress: bool | ProgressFn = True,
    *,
    threads: int | None = None,
    working_set: int | None = None,
    outputs: str = DEFAULT_OUTPUTS,
) -> MeasuredCost:
    """The measured cost model on `device` ("auto", "cpu" or "cuda"), caching in `cache_path` (default: the user
    cache directory, or `$TENSAT_CACHE_DIR`). `threads` defaults to `$TENSAT_MEASURE_THREADS` or 1; `outputs`
    is where every unit without weights finds its output buffers (`OUTPUTS`)."""
    if threads is None:
        env = os.environ.get("TENSAT_MEASURE_THREADS", "").strip()
        try:
            threads = int(env) if env else 1
        except ValueError:
            raise TensatError(f"TENSAT_MEASURE_THREADS must be an integer, got {env!r}") from None
    return MeasuredCost(device, cache_path, progress, threads=threads, working_set=working_set, outputs=outputs)
