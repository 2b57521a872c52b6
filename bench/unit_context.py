"""Unit prices beside the same kernels timed inside the graph: where a summed cost misses end-to-end time.

    python -m bench.unit_context                           # seven models of the corpus
    python -m bench.unit_context --only mobilenet_v2 --out-dir DIR

For each model, on a cold cost cache: every kernel tensat prices (`tensat.cost.runtime_kernels`, measured as a
search measures it), the time onnxruntime's profiler gives that kernel inside the whole graph (one thread, its
median over the runs), and, inside the kernel's own timed model (`MeasuredCost.copies_for` copies, evicted before
each run as when it is priced), the profiler's time of the first copy and the median of the later ones; and the
later copies' median once more with the output buffers left cold: the graph's working set evicted before each run
(the rest of it, beside the copies' weights, for a kernel with weights) and only the inputs read again; and with
nothing read again, the inputs as cold as the outputs. The graph's kernels are matched to tensat's within each op
type both list as many of, by the shape of their second input where both sides have the same ones, else in order
(`ran_as`, `match_kernels`; the NCHWc reorders onnxruntime puts around blocked kernels are counted apart, and
Reshapes, views on both sides, are left out of the match: onnxruntime puts its own around the Gemms it makes of
N-D MatMuls); the ratios are over the kernels matched. Each matched kernel also gets the output buffer
onnxruntime's arena gives it in the graph it runs (`simulate_arena`), and the report prices it with its outputs cold
where that buffer is out of the last-level cache (`cold_buffer`): how much of the gap a model of the arena closes.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import onnx
from onnx import ModelProto

from bench.machine import header
from bench.real_models import per_model_parser, per_model_report
from tensat import ops
from tensat.cost import device_of, runtime_kernels
from tensat.cost_report import load_graph
from tensat.measure import MeasuredCost, Unit, make_measured_cost, pricing_unit
from tensat.measure.cache import CostEntry
from tensat.measure.timing import last_level_cache
from tensat.measure.units import replicate, unit_model
from tensat.session import make_session

MODELS = ("mobilenet_v2", "resnet50", "bert", "clip_vision", "swin", "convnext", "mobilevit")
RUNS = 200  # profiled runs of a graph or a unit's model
WARMUP = 20
REORDERS = ("ReorderInput", "ReorderOutput")
ALIASED = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})  # kernels aliasing input 0
# onnxruntime's CPU kernels that may write their output over input 0 (`KernelDefBuilder::MayInplace(0, 0)`)
IN_PLACE = frozenset(
    {
        "Relu",
        "Sigmoid",
        "Tanh",
        "Elu",
        "Selu",
        "Celu",
        "LeakyRelu",
        "HardSigmoid",
        "Softplus",
        "Softsign",
        "ThresholdedRelu",
        "Cast",
    }
)
GAPS = 5  # the kernels of each model listed by how far their time in the graph exceeds their price


class Ran(NamedTuple):
    """One kernel of an onnxruntime profile: its node, its op type, its median time, the shape of its second
    input (a convolution's weight; None for a kernel of one input, or where the profile does not say), and the
    shapes of its outputs."""

    name: str
    op: str
    us: float
    weight: tuple[int, ...] | None = None
    outputs: tuple[tuple[int, ...], ...] = ()


def _second_input(args: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The shape of a profiled kernel's second input (`input_type_shape`: one {type: dims} per input)."""
    shapes = args.get("input_type_shape") or []
    if len(shapes) < 2 or not isinstance(shapes[1], Mapping):
        return None
    dims = next(iter(shapes[1].values()), None)
    return tuple(int(d) for d in dims) if isinstance(dims, list) else None


def _shapes(entries: Any) -> tuple[tuple[int, ...], ...]:
    """The shapes of a profiled kernel's `input_type_shape` or `output_type_shape` (one {type: dims} each)."""
    shapes = []
    for entry in entries or []:
        dims = next(iter(entry.values()), None) if isinstance(entry, Mapping) else None
        shapes.append(tuple(int(d) for d in dims) if isinstance(dims, list) else ())
    return tuple(shapes)


def kernel_times(events: Sequence[dict[str, Any]], skip: int = WARMUP) -> list[Ran]:
    """Each kernel of an onnxruntime profile (`Ran`), in the order the first run ran them, its median over the runs
    after the first `skip`."""
    first: dict[str, dict[str, Any]] = {}
    times: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        if name not in times:
            first[name] = e["args"]
            times[name] = []
        times[name].append(float(e["dur"]))
    return [
        Ran(
            n,
            args["op_name"],
            statistics.median(times[n][skip:] or times[n]),
            _second_input(args),
            _shapes(args.get("output_type_shape")),
        )
        for n, args in first.items()
    ]


def profiled(
    cost: MeasuredCost,
    model: ModelProto | bytes,
    cold: Callable[[Callable[[], None]], Callable[[], None] | None],
    unit: bool,
    optimized_path: str | None = None,
) -> list[Ran]:
    """The kernels of `model` as onnxruntime's profiler times them, one intra-op thread, each run preceded by what
    `cold` gives for the bound run (nothing where it gives None). A unit's timed model runs in a session as units
    are timed (`Runner.session`: common-subexpression elimination off, which would merge its copies), a whole model
    in one as a user runs it (the graph onnxruntime runs written to `optimized_path`, if given)."""
    r = cost.runner
    with tempfile.TemporaryDirectory(prefix="tensat-profile-") as tmp:
        data = model if isinstance(model, bytes) else model.SerializeToString()
        prefix = os.path.join(tmp, "p")
        if unit:
            sess = r.session(data, profile_prefix=prefix)
        else:
            sess = make_session(
                data, "cpu", threads=1, log_severity=4, profile_prefix=prefix, optimized_path=optimized_path
            )
        run = r.bound(sess)
        before = cold(run)
        for _ in range(WARMUP + RUNS):
            if before is not None:
                before()
            run()
        with open(sess.end_profiling(), encoding="utf-8") as f:
            return kernel_times(json.load(f))


def _tensor_bytes(dims: Sequence[int], data_type: int) -> int:
    """Bytes of an initializer of `dims` and ONNX element type `data_type`."""
    return math.prod(dims) * onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize


def simulate_arena(graph: onnx.GraphProto, ran: Sequence[Ran]) -> dict[str, tuple[str, int | None]]:
    """Where each kernel of `ran` (in the order onnxruntime ran them, with their output shapes) writes its first
    output, as onnxruntime's CPU allocation planner places it: a view of its input (`ALIASED`), its input's buffer
    updated in place (`IN_PLACE` ops, whose input dies there, of the same shape), the buffer of a tensor of the same
    shape freed most recently, or a buffer of its own; and the bytes the graph touched (every tensor and weight a
    kernel reads, and every output it writes) since that buffer was last touched, in the steady state of runs one
    after another: a buffer of its own was last touched in the run before. A graph output is allocated for the
    caller each run (distance None)."""
    nodes = {n.name: n for n in graph.node}
    weights = {t.name: _tensor_bytes(t.dims, t.data_type) for t in graph.initializer}
    kept = {o.name for o in graph.output}
    size: dict[str, int] = {}
    shape: dict[str, tuple[int, ...]] = {}
    uses: dict[str, int] = dict.fromkeys(kept, 1)
    for k in ran:
        for name, dims in zip(nodes[k.name].output if k.name in nodes else (), k.outputs):
            shape[name], size[name] = dims, 4 * math.prod(dims)
    for k in ran:
        for name in nodes[k.name].input if k.name in nodes else ():
            if name in size:
                uses[name] = uses.get(name, 0) + 1
    last: dict[str, int] = {}  # a buffer's byte clock at its last touch, carried from one run to the next
    clock = 0
    out: dict[str, tuple[str, int | None]] = {}
    for _ in range(2):  # the first run leaves the clocks the second, the steady state, starts from
        buffer: dict[str, str] = {}
        count: dict[str, int] = {}
        free: list[str] = []  # the freed buffers, the most recently freed first
        out = {}
        for k in ran:
            node = nodes.get(k.name)
            if node is None:
                continue
            ins = [name for name in node.input if name]
            first = ins[0] if ins else ""
            made: list[str] = []
            for name in node.output:
                if name not in size:
                    continue
                kind, b = "fresh", name
                if node.op_type in ALIASED and first in buffer:
                    kind, b = "alias", buffer[first]
                elif (
                    node.op_type in IN_PLACE
                    and first in buffer
                    and count[buffer[first]] == 1
                    and shape[first] == shape[name]
                ):
                    kind, b = "in place", buffer[first]
                elif name in kept:
                    kind = "graph output"
                else:
                    reused = next((f for f in free if shape.get(f) == shape[name]), None)
                    if reused is not None:
                        free.remove(reused)
                        kind, b = "reused", reused
                if b == name:
                    count[b] = 0
                buffer[name] = b
                count[b] += uses.get(name, 0)
                seen = last.get(b)
                out[k.name] = out.get(k.name) or (
                    kind,
                    None if seen is None or kind == "graph output" else clock - seen,
                )
                made.append(name)
            for name in ins:
                clock += size.get(name, weights.get(name, 0))
                if name in buffer:
                    last[buffer[name]] = clock
            for name in made:
                clock += size[name]
                last[buffer[name]] = clock
            for name in ins:
                if name in buffer:
                    count[buffer[name]] -= 1
            for b in [buffer[name] for name in (*ins, *made) if name in buffer]:
                if count[b] == 0 and b not in free:
                    free.insert(0, b)
    return out


def _copies(cost: MeasuredCost, unit: Unit) -> tuple[float, float, float, float]:
    """The profiler's time of the first copy of `unit` in its timed model and the later copies' median, each run
    prepared as the unit is priced (a Transpose's outputs cold, `_Plan.output_place`), the later copies' median
    with the output buffers left cold, and with the inputs left cold as well (NaN for a unit priced without
    timing, a view or one onnxruntime cannot run alone, and for one it runs as reorders only)."""
    nan = (math.nan, math.nan, math.nan, math.nan)
    plan = cost._plan(unit)
    if isinstance(plan, CostEntry) or unit.ops == ("reshape",):
        return nan
    base = plan.model if plan.model is not None else unit_model(unit)
    model = replicate(base, plan.copies) if plan.copies > 1 else base
    cold = plan.evict_bytes if unit.weighted else cost.working_set or 0
    r = cost.runner
    extra = (*REORDERS, "MaxPool") if plan.null_model is not None else REORDERS  # a prologue's pools and samples
    try:
        warm = profiled(cost, model, lambda run: plan.before_run(r, run), unit=True)
        outs = profiled(cost, model, lambda run: r.cold_weights(run, cold, warm_outputs=False), unit=True)
        every = profiled(
            cost, model, lambda run: r.cold_weights(run, cold, warm_outputs=False, warm_inputs=False), unit=True
        )
    except Exception:  # noqa: BLE001 - onnxruntime raises many types; the unit is priced by its fallback
        return nan
    own = [k.us for k in warm if k.op not in extra]
    own_cold = [k.us for k in outs if k.op not in extra]
    all_cold = [k.us for k in every if k.op not in extra]
    if not own:
        return nan
    later = (statistics.median(ts[1:] or ts) for ts in (own, own_cold, all_cold))
    return (own[0], *later)


GEMM = "matmul+add"  # the one fused label onnxruntime runs as an op of its own, a Gemm


def ran_as(label: str) -> str:
    """The op type onnxruntime's profiler names a kernel of tensat's `label` by: its first op's ONNX op type
    (`OpDef.onnx`, the domain dropped), a MatMul with its bias a Gemm."""
    if label == GEMM:
        return "Gemm"
    first = label.split("+")[0]
    onnx_op = ops.get(first).onnx
    return onnx_op.split(":")[-1] if onnx_op else first


def _weight_of(row: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The shape of the second input of one of tensat's kernels (a convolution's weight), as `Ran.weight` is."""
    shapes = row.get("shapes") or []
    return tuple(shapes[1]) if len(shapes) > 1 else None


def _paired(group: Sequence[dict[str, Any]], kernels: Sequence[Ran]) -> list[tuple[dict[str, Any], Ran]]:
    """tensat's kernels of one op type beside the graph's, as many on each side: by the shape of their second
    input, in order among equal shapes, where both sides have the same shapes (a residual block's shortcut
    convolution, which onnxruntime may run before the block's main one, then keeps its own time); in order
    where they do not (onnxruntime pads a blocked convolution's weight to whole blocks of channels)."""
    if sorted(map(repr, map(_weight_of, group))) != sorted(repr(k.weight) for k in kernels):
        return list(zip(group, kernels))
    waiting: dict[tuple[int, ...] | None, list[Ran]] = {}
    for k in kernels:
        waiting.setdefault(k.weight, []).append(k)
    return [(row, waiting[_weight_of(row)].pop(0)) for row in group]


def match_kernels(rows: Sequence[dict[str, Any]], ran: Sequence[Ran]) -> bool:
    """Give each of tensat's kernels (`rows`) the time and name of the graph's kernel it is (`ran_as`, `in_graph_us`,
    `node`), for every op type both sides list as many of (`_paired`; Reshapes, views, apart: onnxruntime puts its
    own around the Gemms it makes of N-D MatMuls); whether every op type matched."""
    ours: dict[str, list[dict[str, Any]]] = {}
    theirs: dict[str, list[Ran]] = {}
    for row in rows:
        ours.setdefault(ran_as(row["kernel"]), []).append(row)
    for k in ran:
        theirs.setdefault(k.op, []).append(k)
    ours.pop("Reshape", None)
    theirs.pop("Reshape", None)
    for op, group in ours.items():
        if len(group) == len(theirs.get(op, ())):
            for row, k in _paired(group, theirs[op]):
                row["ran_as"], row["in_graph_us"], row["node"] = op, k.us, k.name
    return ours.keys() == theirs.keys() and all(len(ours[op]) == len(theirs[op]) for op in ours)


def model_record(path: Path) -> dict[str, Any]:
    """Every kernel of one model: its price, its time in the graph, and its copies' times in its timed model."""
    with tempfile.TemporaryDirectory(prefix="tensat-cache-") as cache:
        cost = make_measured_cost("cpu", os.path.join(cache, "costs.sqlite3"), progress=False, threads=1)
        graph = load_graph(path)
        cost.observe_graph(graph)
        kernels = [k for k in runtime_kernels(graph, device_of(cost)) if k[1][0].op != "opaque"]
        cost.prefetch([item for _, item in kernels])
        optimized = os.path.join(cache, "optimized.onnx")
        in_graph = profiled(cost, path.read_bytes(), lambda run: None, unit=False, optimized_path=optimized)
        buffers = simulate_arena(onnx.load(optimized, load_external_data=False).graph, in_graph)
        ran = [k for k in in_graph if k.op not in REORDERS]
        rows: list[dict[str, Any]] = []
        units: dict[str, tuple[float, float, float, float]] = {}
        for _, (node, shapes, const) in kernels:
            unit = pricing_unit(node, shapes, const)
            key = unit.signature()
            if key not in units:
                units[key] = _copies(cost, unit)
            first, later, cold, all_cold = units[key]
            rows.append(
                {
                    "kernel": unit.label(),
                    "shapes": [list(s) for s in shapes],
                    "price_us": cost(node, shapes, const) * 1e3,
                    "first_copy_us": first,
                    "later_copies_us": later,
                    "cold_outputs_us": cold,
                    "all_cold_us": all_cold,
                }
            )
        matched = match_kernels(rows, ran)
        for row in rows:
            if row.get("node") in buffers:
                row["buffer"], distance = buffers[row["node"]]
                row["reuse_mib"] = None if distance is None else round(distance / 2**20, 2)
        return {
            "model": path.stem,
            "matched": matched,
            "kernels": rows,
            "working_set_mib": round((cost.working_set or 0) / 2**20, 1),
            "price_ms": sum(r["price_us"] for r in rows) / 1e3,
            "in_graph_ms": sum(k.us for k in ran) / 1e3,
            "reorders_ms": sum(k.us for k in in_graph if k.op in REORDERS) / 1e3,
            "baseline_ms": cost.baseline_ms,
            "last_level_cache_mib": (last_level_cache() or 0) / 2**20,
        }


def _sums(rows: Sequence[dict[str, Any]]) -> tuple[float, ...]:
    """In graph, priced, first copy, later copies, and later copies with cold outputs and with everything cold,
    summed in milliseconds."""
    keys = ("in_graph_us", "price_us", "first_copy_us", "later_copies_us", "cold_outputs_us", "all_cold_us")
    return tuple(sum(k.get(key, math.nan) for k in rows) / 1e3 for key in keys)


def cold_buffer(kernel: Mapping[str, Any], cache_mib: float) -> bool:
    """Whether the arena gives `kernel` (`simulate_arena`'s `buffer` and `reuse_mib`) an output buffer out of the
    caches: one of its own or a graph output, each last touched a run before, or one reused after more bytes than
    the last-level cache holds."""
    distance = kernel.get("reuse_mib")
    return kernel.get("buffer") in ("fresh", "graph output") or (distance is not None and distance > cache_mib)


def _arena_us(kernel: Mapping[str, Any], cache_mib: float) -> float:
    """A kernel's price with its outputs cold where its arena buffer is (`cold_buffer`), else its price."""
    return kernel["cold_outputs_us"] if cold_buffer(kernel, cache_mib) else kernel["price_us"]


def _buffer_class(kernel: Mapping[str, Any], cache_mib: float) -> str:
    """Which kind of arena buffer `kernel` writes, with a reused one split by its distance from the cache's size."""
    kind = kernel.get("buffer", "not placed")
    if kind == "reused":
        return "reused, beyond the cache" if cold_buffer(kernel, cache_mib) else "reused, within the cache"
    return kind


def _ratios(values: Sequence[float], base: float) -> str:
    return " | ".join(f"{v / base:.2f}" if base and not math.isnan(v) else "—" for v in values)


def _widest(kernels: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `GAPS` matched kernels whose time in the graph exceeds their price the most, that far first."""
    matched = [k for k in kernels if "in_graph_us" in k and k["in_graph_us"] > k["price_us"]]
    return sorted(matched, key=lambda k: k["price_us"] - k["in_graph_us"])[:GAPS]


def _us(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.0f}"


def render(records: Sequence[dict[str, Any]], info: dict[str, Any]) -> str:
    """The markdown report: per model, then per op type, over the kernels matched."""
    lines = [
        "# Unit prices and the same kernels inside the graph",
        "",
        header(info),
        "",
        "One intra-op thread, CPU, each model on a cold cost cache. `priced`: the kernels' measured prices summed "
        "(what a search sums); `in graph`: onnxruntime's profiler times of the same kernels in a run of the whole "
        "model (the NCHWc reorders apart); `first copy` and `later copies`: inside each kernel's own timed model, "
        "evicted before each run as when it is priced, the first copy's time and the later copies' median; `cold "
        "outputs`: the later copies' median with the graph's working set evicted before each run and only the "
        "inputs read again, the output buffers left cold; `all cold`: the same with the inputs left cold too, as "
        "a graph's own input is; `arena`: the price with the outputs cold where onnxruntime's arena gives the "
        "kernel a buffer out of the caches (`cold_buffer`), else the price. `priced` and `in graph` sum every "
        "kernel; the ratios, "
        "the kernels matched (within each kind of op both list as many of, by their weights' shapes where both "
        "sides have the same ones, else in order; Reshapes, views, apart); the "
        "profiler adds its own microsecond or two to every kernel, in the graph and in the units alike. "
        "See `bench/unit_context.py`.",
        "",
        "| model | working set (MiB) | kernels | priced (ms) | in graph (ms) | reorders in graph (ms) "
        "| priced / in graph | first copy / in graph | later copies / in graph | cold outputs / in graph "
        "| all cold / in graph | arena / in graph |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_op: dict[str, list[dict[str, Any]]] = {}
    by_buffer: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        rows = [k for k in r["kernels"] if "in_graph_us" in k and not math.isnan(k["first_copy_us"])]
        g, priced, first, later, cold, every = _sums(rows)
        cache = r.get("last_level_cache_mib", 0.0)
        arena = sum(_arena_us(k, cache) for k in rows) / 1e3 if any("buffer" in k for k in rows) else math.nan
        ratios = _ratios((priced, first, later, cold, every, arena), g)
        lines.append(
            f"| {r['model']} | {r.get('working_set_mib', math.nan):.0f} | {len(r['kernels'])}"
            f"{'' if r['matched'] else f' ({len(rows)} matched)'} | {r['price_ms']:.2f} | {r['in_graph_ms']:.2f} | "
            f"{r['reorders_ms']:.2f} | {ratios} |"
        )
        for k in rows:
            by_op.setdefault(k["ran_as"], []).append(k)
            by_buffer.setdefault(_buffer_class(k, cache), []).append(k)
    if by_op:
        lines += [
            "",
            "By the op type onnxruntime ran, over the kernels matched:",
            "",
            "| op | kernels | in graph (ms) | priced / in graph | later copies / in graph | cold outputs / in graph "
            "| all cold / in graph |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for op, rows in sorted(by_op.items(), key=lambda item: -_sums(item[1])[0]):
            g, priced, _, later, cold, every = _sums(rows)
            lines.append(f"| {op} | {len(rows)} | {g:.2f} | {_ratios((priced, later, cold, every), g)} |")
    if any("buffer" in k for rows in by_buffer.values() for k in rows):
        lines += [
            "",
            "By the output buffer onnxruntime's arena gives the kernel (`simulate_arena`: a buffer of its own, last "
            "touched a run before; a freed buffer of the same shape reused, within or beyond the last-level cache's "
            "size of traffic since it was last touched; its input's, in place; a view; a graph output):",
            "",
            "| output buffer | kernels | in graph (ms) | priced / in graph | cold outputs / in graph |",
            "|---|---:|---:|---:|---:|",
        ]
        for kind, rows in sorted(by_buffer.items(), key=lambda item: -_sums(item[1])[0]):
            g, priced, _, _, cold, _ = _sums(rows)
            lines.append(f"| {kind} | {len(rows)} | {g:.2f} | {_ratios((priced, cold), g)} |")
    gaps = [(r["model"], k) for r in records for k in _widest(r["kernels"])]
    if gaps:
        lines += [
            "",
            f"The {GAPS} kernels of each model whose time in the graph exceeds their price the most (microseconds):",
            "",
            "| model | kernel | input, weight | priced | in graph | later copies | cold outputs | all cold |",
            "|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for model, k in gaps:
            shapes = ", ".join("x".join(map(str, s)) for s in k["shapes"][:2])
            times = " | ".join(
                _us(k.get(key, math.nan))
                for key in ("price_us", "in_graph_us", "later_copies_us", "cold_outputs_us", "all_cold_us")
            )
            lines.append(f"| {model} | {k['kernel']} | {shapes} | {times} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    return per_model_report(per_model_parser("unit_context", __doc__, MODELS).parse_args(argv), model_record, render)


if __name__ == "__main__":
    sys.exit(main())
