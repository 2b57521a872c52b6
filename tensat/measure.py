"""The measured cost model: what an operator costs on the target device, timed in onnxruntime.

A *unit* is what gets timed: one IR node (with its fused activation), or a small group of nodes that onnxruntime
runs as one kernel (Conv+Relu, MatMul+Add, Conv+Add+Relu, Transpose+MatMul; see `tensat.cost_report`). Its inputs
that are weights become initializers, the others graph inputs, as in real inference, and the session uses the
settings of an end-to-end run: the chosen execution provider, `threads` intra-op threads (default 1), all graph
optimizations.

How a unit's cost is taken:

- Clock: a single-threaded CPU session is timed by the CPU time of the thread running it (on a shared machine wall
  time also counts the time other processes had the core); other settings (CUDA, several threads) by wall time.
  `tensat.latency.time_models(clock=...)` times end-to-end runs the same way.
- The timed model holds K copies of the unit, sharing the non-weight inputs, each with its own weights. K is chosen
  so the copies' weights span the working set of the graph being optimized (`observe_graph`), bounded by a per-round
  time budget, by the bytes of the copies' outputs and by memory. Inputs and outputs are buffers bound once, 64-byte
  aligned as onnxruntime's own buffers are.
- Cache state as inside a graph: between two runs of one op, the graph's other weights pass through the caches, so
  its weights are cold; its input has just been computed and its output goes to a recycled buffer. Where the K
  copies' weights do not span the working set, the rest is evicted before every timed run (a scratch buffer is
  read), and then the inputs are read and the output buffers written again.
- Rounds alternate the unit model with a null model (K one-element Relus, same number of inputs and outputs); a
  round's sample is (t_unit - t_null) / K, plus the per-node dispatch cost of a near-empty node (`node_us`,
  calibrated per device from a chain of 64 tiny nodes), so the session's fixed per-run overhead and the per-output
  binding cost cancel and each copy keeps the dispatch cost it has inside a graph. Inputs and outputs go through
  IO binding; on CUDA both live on the device and every run ends in a synchronization.
- Noise: rounds continue until the median is stable (two successive medians within 2%), with caps on rounds and
  time. Each unit is timed in two windows, separated in time by the other units of its chunk (a third window when
  they disagree by more than 5%; one window for long units); the cost is the median of the window medians and the
  largest (p90 - p10) / median is recorded as its spread.
- CPU layout: onnxruntime runs convolutions and pools in a blocked layout (NCHWc) and reorders tensors where they
  enter or leave it. Inside a graph a chain of blocked ops needs no reorders, so a unit onnxruntime runs blocked is
  timed as onnxruntime's own optimized model of it with the reorders at its inputs and outputs cut off
  (`strip_reorders`): it takes and gives blocked tensors. A residual operand of Conv+Add enters through a 1x1 max
  pool so that onnxruntime fuses the Add into the convolution (updating the operand in place), as it does inside a
  graph; the pool and a one-pixel pool reading the output then form the null model. Conversely an op that cannot run blocked (slice, transpose, reshape,
  matmul, a grouped conv or pool onnxruntime keeps in NCHW) on a 4-D tensor is charged the reorders it causes
  between blocked neighbours: splitting a merged conv's output costs what it costs.
- Reshape runs as a view inside a graph (onnxruntime aliases its buffer): it costs one node's dispatch, plus the
  reorder out of the blocked layout where that applies.
- Opaque ops (the cost model does not see their definition) and units onnxruntime cannot build fall back to the
  analytic estimate and are counted in `stats`.

Costs are cached persistently (`tensat.costcache`), keyed by the device fingerprint (device name, provider,
onnxruntime version, threads, clock, method) and the unit's signature (plus the working-set bucket for units with
weights). The per-run overhead of a session (`baseline_ms`) is not part of any node's cost; a graph's predicted
end-to-end latency is its summed cost plus that baseline.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from tensat import ops
from tensat.cost import AnalyticCost
from tensat.progress import ProgressFn, clock, report, stream_is_tty
from tensat.costcache import CostCache, CostEntry
from tensat.errors import TensatError
from tensat.ir import Graph, Node
from tensat.latency import clock_function, time_models
from tensat.onnx_io import export_model

Shape = tuple[int, ...]

METHOD = "blocked-evict-v9"
NCHWC_DOMAIN = "com.microsoft.nchwc"
DEVICES = ("auto", "cpu", "cuda")
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}

MAX_COPIES = 64
ROUND_BUDGET_US = 5_000.0  # aim for at most this much unit time per round
LONG_ROUND_US = 10_000.0  # units slower than this per round, or with more weights than LONG_WEIGHTS, get one window
LONG_WEIGHTS = 64 * 2**20
MEMORY_CAP = 256 * 2**20  # bytes of weights + outputs over all copies
OUT_BUDGET = 4 * 2**20  # bytes of outputs over all copies (an end-to-end run reuses warm buffers)
DEFAULT_WORKING_SET = 64 * 2**20
ALIGNMENT = 64  # bytes: bound buffers start at such a boundary, as onnxruntime's own do
EVICT_CAP = 256 * 2**20  # at most this many bytes are streamed through the caches before a timed run
STABLE_TOL = 0.02
WINDOWS = 2  # timing windows per unit, separated in time by the other units of its chunk
WINDOW_TOL = 0.05
CHUNK = 24
# Ops that either run in the blocked layout (the probe says so) or force reorders around them in a blocked graph;
# the others (element-wise ops, concat) run on whatever layout their inputs have.
BREAKING_OPS = {"slice", "transpose", "reshape", "matmul", "conv2d", "opaque", "maxpool", "avgpool", "globalavgpool",
                "batchnorm"}
POOL_1X1 = (("kernel", (1, 1)), ("strides", (1, 1)), ("pads", (0, 0, 0, 0)))


# ---------------------------------------------------------------------------------------------------------------
# onnxruntime, quietly


def _ort() -> Any:
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    return onnxruntime


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """Silence onnxruntime's logger and the process's stderr file descriptor (CUDA loaders print there)."""
    ort = _ort()
    ort.set_default_logger_severity(4)
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        saved = -1
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        if saved >= 0:
            os.dup2(devnull, 2)
        yield
    finally:
        if saved >= 0:
            os.dup2(saved, 2)
            os.close(saved)
        os.close(devnull)
        ort.set_default_logger_severity(3)


def _tiny_model(op: str = "Relu", shape: Sequence[int] = (1, 1)) -> ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "tiny", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


_CUDA_OK: bool | None = None


def cuda_available() -> bool:
    """True when onnxruntime's CUDA provider is present and a session on it actually runs (checked once, quietly)."""
    global _CUDA_OK
    if _CUDA_OK is not None:
        return _CUDA_OK
    ok = False
    try:
        with _silenced():
            ort = _ort()
            if PROVIDERS["cuda"] in ort.get_available_providers():
                options = ort.SessionOptions()
                options.log_severity_level = 4
                sess = ort.InferenceSession(_tiny_model().SerializeToString(), options,
                                            providers=[PROVIDERS["cuda"]])
                if sess.get_providers()[:1] == [PROVIDERS["cuda"]]:
                    out = sess.run(None, {"x": np.ones((1, 1), np.float32)})[0]
                    ok = bool(out.shape == (1, 1))
    except Exception:  # noqa: BLE001 - any failure means "no usable CUDA"
        ok = False
    _CUDA_OK = ok
    return ok


def resolve_device(device: str = "auto") -> str:
    """"cpu" or "cuda" for a requested device ("auto" = CUDA where it loads, else CPU)."""
    if device not in DEVICES:
        raise TensatError(f"unknown device {device!r}; choose from {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise TensatError("device cuda requested, but onnxruntime's CUDA execution provider does not run on this "
                          "machine; use --device cpu or auto")
    return device


def cpu_name() -> str:
    """The CPU model name (from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def gpu_name() -> str:
    """The first CUDA GPU's name (via nvidia-smi; a generic name where that is missing)."""
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader", "-i", "0"], capture_output=True,
                                 text=True, timeout=10, check=False)
            name = out.stdout.strip().splitlines()[0].strip() if out.stdout.strip() else ""
            if name:
                return name
        except (OSError, subprocess.SubprocessError):
            pass
    return "CUDA device 0"


def default_clock(device: str, threads: int) -> str:
    """"cpu" (thread CPU time) for single-threaded CPU sessions, else "wall"."""
    return "cpu" if device == "cpu" and int(threads) == 1 else "wall"


def device_info(device: str, threads: int, clock: str | None = None) -> dict[str, Any]:
    """What identifies measurements: device name, provider, onnxruntime version, threads, clock and method."""
    ort = _ort()
    return {
        "device": gpu_name() if device == "cuda" else cpu_name(),
        "provider": PROVIDERS[device],
        "onnxruntime": ort.__version__,
        "threads": int(threads),
        "optimization": "all",
        "clock": clock or default_clock(device, threads),
        "method": METHOD,
    }


def fingerprint(info: Mapping[str, Any]) -> str:
    """A short stable hash of `device_info`."""
    return hashlib.sha256(json.dumps(dict(info), sort_keys=True).encode()).hexdigest()[:24]


# ---------------------------------------------------------------------------------------------------------------
# Units: what is timed


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return value


@dataclass(frozen=True)
class UnitNode:
    """One node of a unit: op, attributes, and inputs as ("x", k) = external k or ("n", i) = unit node i."""

    op: str
    attrs: tuple[tuple[str, Any], ...]
    inputs: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Unit:
    """A small subgraph timed as one: nodes in topological order (the last is the output), external inputs as
    (shape, is_weight, dtype)."""

    nodes: tuple[UnitNode, ...]
    externals: tuple[tuple[Shape, bool, str], ...]

    @staticmethod
    def single(node: Node, in_shapes: Sequence[Sequence[int]], const: Sequence[bool]) -> "Unit":
        """The unit of one node."""
        flags = list(const) + [False] * (len(in_shapes) - len(const))
        ext = tuple((tuple(int(d) for d in s), bool(c), node.dtype) for s, c in zip(in_shapes, flags))
        un = UnitNode(node.op, tuple(node.attrs), tuple(("x", k) for k in range(len(in_shapes))))
        return Unit((un,), ext)

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(n.op for n in self.nodes)

    @property
    def weighted(self) -> bool:
        return any(c for _, c, _ in self.externals)

    def shapes(self) -> list[Shape]:
        """Output shape of every node."""
        out: list[Shape] = []
        for n in self.nodes:
            ins = [self.externals[i][0] if kind == "x" else out[i] for kind, i in n.inputs]
            attrs = dict(n.attrs)
            out.append(tuple(attrs["shape"]) if n.op == "opaque" else ops.shape_of(n.op, ins, attrs))
        return out

    @property
    def out_shape(self) -> Shape:
        return self.shapes()[-1]

    @property
    def dtype(self) -> str:
        return self.externals[0][2] if self.externals else "float32"

    def weight_bytes(self) -> int:
        return sum(_nbytes(s, d) for s, c, d in self.externals if c)

    def signature(self) -> str:
        """Canonical JSON text naming what is timed."""
        nodes = [[n.op, [[k, _jsonable(v)] for k, v in n.attrs], [list(i) for i in n.inputs]] for n in self.nodes]
        ext = [[list(s), int(c), d] for s, c, d in self.externals]
        return json.dumps({"nodes": nodes, "ext": ext}, sort_keys=True, separators=(",", ":"))

    def label(self) -> str:
        return "+".join(self.ops)


def pricing_unit(node: Node, in_shapes: Sequence[Sequence[int]], const: Sequence[bool]) -> Unit:
    """The unit that prices one node: `Unit.single`, except that a convolution with a fused ReLU is timed as the
    plain convolution. onnxruntime applies the ReLU in the convolution's output loop at no measurable cost, and
    two separate measurements would differ by noise alone, which could make the extractor prefer a plain
    convolution followed by a ReLU that onnxruntime then has to run on its own."""
    unit = Unit.single(node, in_shapes, const)
    if node.op != "conv2d" or node.attr.get("act") != ops.ACT_RELU:
        return unit
    head = unit.nodes[0]
    attrs = tuple((k, ops.ACT_NONE if k == "act" else v) for k, v in head.attrs)
    return Unit((UnitNode(head.op, attrs, head.inputs),), unit.externals)


def _nbytes(shape: Sequence[int], dtype: str = "float32") -> int:
    try:
        size = np.dtype(dtype).itemsize
    except TypeError:
        size = 4
    return int(math.prod(shape)) * size


def _random_array(rng: np.random.Generator, shape: Sequence[int], dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return ((rng.random(tuple(shape), dtype=np.float32) - 0.5) * 0.2).astype(dt, copy=False)
    if dt.kind in "iu":
        return rng.integers(0, 4, size=tuple(shape)).astype(dt)
    if dt.kind == "b":
        return rng.random(tuple(shape)) < 0.5
    raise ValueError(f"cannot make data of type {dtype}")


def unit_model(unit: Unit, seed: int = 0) -> ModelProto:
    """The one-copy ONNX model of `unit`: weights as initializers, other inputs as graph inputs x0, x1, ..."""
    rng = np.random.default_rng(seed)
    g = Graph(opset_imports={"": 17}, name="unit")
    ext_ids = []
    for k, (shape, const, dtype) in enumerate(unit.externals):
        if const:
            ext_ids.append(g.weight(_random_array(rng, shape, dtype), f"w{k}"))
        else:
            ext_ids.append(g.input(f"x{k}", shape, dtype))
    built: list[int] = []
    for n in unit.nodes:
        ins = [ext_ids[i] if kind == "x" else built[i] for kind, i in n.inputs]
        built.append(g.add(n.op, ins, **dict(n.attrs)))
    g.output("y", built[-1])
    return export_model(g)


_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}


def replicate(model: ModelProto, copies: int) -> ModelProto:
    """`copies` copies of a one-output model side by side: graph inputs and integer initializers shared, float
    initializers (the weights) distinct per copy, outputs y__0, y__1, ..."""
    g1 = model.graph
    shared = {i.name for i in g1.input} | {t.name for t in g1.initializer if t.data_type not in _FLOAT_TYPES}
    inits = [t for t in g1.initializer if t.data_type not in _FLOAT_TYPES]
    floats = [(t, numpy_helper.to_array(t)) for t in g1.initializer if t.data_type in _FLOAT_TYPES]
    nodes, outputs = [], []
    for k in range(copies):
        def rn(name: str) -> str:
            return name if not name or name in shared else f"{name}__{k}"

        for t, arr in floats:
            value = arr if k == 0 else (arr * np.asarray(1.0 + k / 1024.0, dtype=arr.dtype)).astype(arr.dtype)
            inits.append(numpy_helper.from_array(value, rn(t.name)))
        for n in g1.node:
            c = onnx.NodeProto()
            c.CopyFrom(n)
            del c.input[:]
            del c.output[:]
            c.input.extend(rn(i) for i in n.input)
            c.output.extend(rn(o) for o in n.output)
            if n.name:
                c.name = f"{n.name}__{k}"
            nodes.append(c)
        for o in g1.output:
            v = onnx.ValueInfoProto()
            v.CopyFrom(o)
            v.name = rn(o.name)
            outputs.append(v)
    graph = helper.make_graph(nodes, g1.name, list(g1.input), outputs, initializer=inits)
    out = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name="tensat-measure")
    out.ir_version = model.ir_version
    return out


def reorder_model(kind: str, shape: Sequence[int], block: int) -> ModelProto:
    """A model of one NCHWc reorder: "in" = NCHW x -> blocked, "out" = blocked (channels padded) -> NCHW y."""
    n, c = shape[0], shape[1]
    padded = [n, -(-c // block) * block, *shape[2:]]
    if kind == "in":
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, padded)
        node = helper.make_node("ReorderInput", ["x"], ["y"], domain=NCHWC_DOMAIN)
    else:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, padded)
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
        node = helper.make_node("ReorderOutput", ["x"], ["y"], domain=NCHWC_DOMAIN, channels=int(c))
    graph = helper.make_graph([node], f"reorder_{kind}", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(NCHWC_DOMAIN, 1)])
    model.ir_version = 8
    return model


def strip_reorders(model: ModelProto, block: int) -> ModelProto:
    """onnxruntime's optimized `model` with its boundary reorders cut off: a ReorderInput of a graph input becomes a
    blocked graph input, a ReorderOutput giving a graph output becomes a blocked graph output (channels padded to
    `block`)."""
    g = model.graph
    dims = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in [*g.input, *g.output]}
    inputs = {vi.name for vi in g.input}
    outputs = {vi.name for vi in g.output}

    def padded(shape: Sequence[int]) -> list[int]:
        return [shape[0], -(-shape[1] // block) * block, *shape[2:]]

    blocked_in: dict[str, list[int]] = {}
    renamed_out: dict[str, str] = {}
    nodes = []
    for n in g.node:
        nchwc = n.domain == NCHWC_DOMAIN
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if nchwc and n.op_type == "ReorderInput" and n.input[0] in inputs and not attrs.get("channels_last", 0):
            blocked_in[n.output[0]] = padded(dims[n.input[0]])
        elif nchwc and n.op_type == "ReorderOutput" and n.output[0] in outputs and not attrs.get("channels_last", 0):
            renamed_out[n.output[0]] = n.input[0]
        else:
            nodes.append(n)
    used = {i for n in nodes for i in n.input}
    kept = [vi for vi in g.input if vi.name in used]
    kept += [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in blocked_in.items()
             if name in used]
    outs = [helper.make_tensor_value_info(renamed_out[vi.name], TensorProto.FLOAT, padded(dims[vi.name]))
            if vi.name in renamed_out else vi for vi in g.output]
    used_inits = [t for t in g.initializer if t.name in used]
    out = helper.make_model(helper.make_graph(nodes, g.name, kept, outs, initializer=used_inits),
                            opset_imports=list(model.opset_import), producer_name="tensat-measure")
    out.ir_version = model.ir_version
    return out


def sample_outputs(model: ModelProto) -> ModelProto:
    """`model` with each 4-D graph output read by a strided 1x1 max pool (blocked) taking one pixel, the pools'
    outputs as the graph outputs: the tensors become buffers onnxruntime allocates and may update in place."""
    g = model.graph
    nodes, outs = list(g.node), []
    for vi in g.output:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        name = f"{vi.name}__sample"
        nodes.append(helper.make_node("MaxPool", [vi.name], [name], domain=NCHWC_DOMAIN, kernel_shape=[1, 1],
                                      strides=dims[2:], pads=[0, 0, 0, 0]))
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [*dims[:2], 1, 1]))
    out = helper.make_model(helper.make_graph(nodes, g.name, list(g.input), outs, initializer=list(g.initializer)),
                            opset_imports=list(model.opset_import), producer_name="tensat-measure")
    out.ir_version = model.ir_version
    return out


def prologue_model(stripped: ModelProto, count: int) -> ModelProto:
    """The null model of a unit with a prologue: the first `count` nodes of its stripped model (the pools
    `_with_prologue` put first), their outputs sampled (`sample_outputs`) as the unit's output is."""
    g = stripped.graph
    pools = list(g.node)[:count]
    inputs = {vi.name: vi for vi in g.input}
    outs = [helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT,
                                          [d.dim_value for d in inputs[n.input[0]].type.tensor_type.shape.dim])
            for n in pools]
    out = helper.make_model(helper.make_graph(pools, "prologue", [inputs[n.input[0]] for n in pools], outs),
                            opset_imports=list(stripped.opset_import), producer_name="tensat-measure")
    out.ir_version = stripped.ir_version
    return sample_outputs(out)


def chain_model(length: int) -> ModelProto:
    """`length` one-element Relus in a chain (to measure the per-node dispatch cost)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])
    names = ["x"] + [f"t{k}" for k in range(length - 1)] + ["y"]
    nodes = [helper.make_node("Relu", [names[k]], [names[k + 1]]) for k in range(length)]
    model = helper.make_model(helper.make_graph(nodes, "chain", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def null_model(copies: int) -> ModelProto:
    """`copies` one-element Relus side by side on one input: the interface cost of a K-copy unit model."""
    return replicate(_tiny_model(), copies)


# ---------------------------------------------------------------------------------------------------------------
# Running and timing


def aligned(arr: np.ndarray, alignment: int = ALIGNMENT) -> np.ndarray:
    """A copy of `arr` whose data starts on an `alignment`-byte boundary, as onnxruntime's own buffers do (numpy's
    large arrays start 16 bytes past a page boundary, and vector loads across cache lines are slower)."""
    raw = np.empty(arr.nbytes + alignment, np.uint8)
    offset = (-raw.ctypes.data) % alignment
    out = raw[offset:offset + arr.nbytes].view(arr.dtype).reshape(arr.shape)
    out[...] = arr
    return out


def _is_plausibly_blocked(shape: Sequence[int], dtype: str = "float32") -> bool:
    """A 4-D float tensor whose channels the NCHWc layout accepts (a multiple of 4)."""
    return len(shape) == 4 and np.dtype(dtype).kind == "f" and shape[1] % 4 == 0 and shape[1] > 0


class Runner:
    """Sessions and IO bindings on one device with fixed settings, and the clock units are timed by."""

    def __init__(self, device: str, threads: int, clock: str = "wall") -> None:
        self.device = device
        self.threads = threads
        self.clock = clock_function(clock, device, threads)
        self.ort = _ort()
        self._null: dict[int, Callable[[], None]] = {}
        self._scratch: np.ndarray | None = None

    def evict(self, nbytes: int) -> None:
        """Read `nbytes` of a scratch buffer, pushing other data out of the caches, as the rest of a graph's
        weights (read-only too) pass through them between two runs of one of its ops."""
        count = min(int(nbytes), EVICT_CAP) // 4
        if count <= 0:
            return
        if self._scratch is None or self._scratch.size < count:
            self._scratch = np.ones(EVICT_CAP // 4, np.float32)
        self._scratch[:count].sum()

    def cold_weights(self, run: Callable[[], None], nbytes: int) -> Callable[[], None] | None:
        """What to do before each timed run of a bound model (None: nothing): on CPU, evict `nbytes` from the
        caches, then touch the model's inputs and output buffers again (inside a graph an op's input has just been
        computed and its output goes to a recycled buffer: only the weights are cold)."""
        if self.device != "cpu" or nbytes <= 0:
            return None
        inputs, outputs = run._keep[0], run._keep[3]  # type: ignore[attr-defined]

        def before() -> None:
            self.evict(nbytes)
            for arr in inputs:
                arr.sum()
            for arr in outputs:
                np.add(arr, 0.0, out=arr)

        return before

    def session(self, model: ModelProto | bytes, optimized_path: str | None = None,
                profile_prefix: str | None = None) -> Any:
        ort = self.ort
        options = ort.SessionOptions()
        options.log_severity_level = 4
        options.intra_op_num_threads = int(self.threads)
        if optimized_path:
            options.optimized_model_filepath = optimized_path
        if profile_prefix:
            options.enable_profiling = True
            options.profile_file_prefix = profile_prefix
        data = model if isinstance(model, bytes) else model.SerializeToString()
        providers = [PROVIDERS["cuda"], PROVIDERS["cpu"]] if self.device == "cuda" else [PROVIDERS["cpu"]]
        return ort.InferenceSession(data, options, providers=providers,
                                    disabled_optimizers=["CommonSubexpressionElimination"])

    def bound(self, sess: Any, seed: int = 0) -> Callable[[], None]:
        """A no-argument function running `sess` once on seeded inputs via IO binding (synchronized on CUDA)."""
        rng = np.random.default_rng(seed)
        io = sess.io_binding()
        keep: list[Any] = []
        for inp in sess.get_inputs():
            shape = [int(d) if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
            dtype = _ORT_TYPES.get(inp.type, "float32")
            arr = aligned(_random_array(rng, shape, dtype))
            if self.device == "cuda":
                value = self.ort.OrtValue.ortvalue_from_numpy(arr, "cuda", 0)
                io.bind_ortvalue_input(inp.name, value)
                keep.append(value)
            else:
                io.bind_cpu_input(inp.name, arr)
                keep.append(arr)
        outputs: list[np.ndarray] = []
        for out in sess.get_outputs():
            dtype = _ORT_TYPES.get(out.type, "float32")
            static = all(isinstance(d, int) and d > 0 for d in out.shape)
            if self.device == "cuda" or not static or np.dtype(dtype).kind != "f":
                io.bind_output(out.name, "cuda" if self.device == "cuda" else "cpu")
                continue
            arr = aligned(np.zeros([int(d) for d in out.shape], dtype))
            io.bind_output(out.name, "cpu", 0, np.dtype(dtype), list(arr.shape), arr.ctypes.data)
            outputs.append(arr)
        cuda = self.device == "cuda"

        def run() -> None:
            if cuda:
                io.synchronize_inputs()
            sess.run_with_iobinding(io)
            if cuda:
                io.synchronize_outputs()

        run._keep = (keep, io, sess, outputs)  # type: ignore[attr-defined]
        return run

    def null(self, copies: int) -> Callable[[], None]:
        if copies not in self._null:
            self._null[copies] = self.bound(self.session(null_model(copies)))
        return self._null[copies]


_ORT_TYPES = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}


@dataclass
class Timing:
    """Samples of one unit, in microseconds per copy."""

    median_us: float
    spread: float
    rounds: int
    copies: int
    seconds: float


def time_rounds(
    fns: Sequence[Callable[[], None]], combine: Callable[[Sequence[float]], float], copies: int = 1, *,
    min_rounds: int = 5, max_rounds: int = 400, max_seconds: float = 1.5, warmup: int = 1, check_every: int = 5,
    tol: float = STABLE_TOL, clock: Callable[[], float] = time.perf_counter, before: Callable[[], None] | None = None,
) -> Timing:
    """Run every function of `fns` once per round (alternating the order between rounds) until the median of
    `combine(seconds of each function)` (in microseconds) is stable or a cap is hit (`max_seconds` of wall time).
    `before`, if given, runs (untimed) before every timed call."""
    wall = time.perf_counter
    for _ in range(warmup):
        for f in fns:
            f()
    samples: list[float] = []
    start = wall()
    last_median: float | None = None
    order = list(range(len(fns)))
    while True:
        times = [0.0] * len(fns)
        for k in order if len(samples) % 2 == 0 else order[::-1]:
            if before is not None:
                before()
            t0 = clock()
            fns[k]()
            times[k] = clock() - t0
        samples.append(combine(times) * 1e6)
        n = len(samples)
        if n >= max_rounds or (n >= min_rounds and wall() - start > max_seconds):
            break
        if n >= min_rounds and n % check_every == 0:
            med = statistics.median(samples)
            if last_median is not None and abs(med - last_median) <= tol * abs(med) + 0.02:
                break
            last_median = med
    med = statistics.median(samples)
    p10, p90 = np.percentile(samples, [10, 90])
    spread = float((p90 - p10) / med) if med > 0 else 0.0
    return Timing(float(med), spread, len(samples), copies, wall() - start)


def time_pair(
    run: Callable[[], None], null: Callable[[], None], copies: int, **kw: Any,
) -> Timing:
    """Alternate `run` and `null`: the median of (t_run - t_null) / copies, in microseconds (see `time_rounds`)."""
    return time_rounds([run, null], lambda t: (t[0] - t[1]) / copies, copies, **kw)


# ---------------------------------------------------------------------------------------------------------------
# Progress


class Progress:
    """Progress of measuring: a one-line bar on stderr when `enabled` is True and stderr is a terminal, or
    reports to a `tensat.progress` callback (stage "cost") when `enabled` is one; silent otherwise."""

    def __init__(self, total: int, label: str, enabled: bool | ProgressFn = True) -> None:
        self.total = max(int(total), 0)
        self.label = label
        self.done = 0
        self.sink = enabled if callable(enabled) else None
        self.enabled = bool(enabled) and self.total > 0 and (self.sink is not None or stream_is_tty(sys.stderr))
        self.start = time.perf_counter()
        self._last = 0.0
        self._shown = False

    def step(self, note: str = "") -> None:
        self.done += 1
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            self._draw(note)

    def _draw(self, note: str) -> None:
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        if self.sink is not None:
            report(self.sink, "cost", f"{self.label}: {self.done}/{self.total} windows, eta {clock(eta)}")
            return
        width = 28
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(width * frac) + "." * (width - int(width * frac))
        text = f"\r{self.label} [{bar}] {self.done}/{self.total} {clock(elapsed)} eta {clock(eta)} {note[:28]:<28}"
        sys.stderr.write(text)
        sys.stderr.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._shown = False


# ---------------------------------------------------------------------------------------------------------------
# The cost model


@dataclass
class MeasureStats:
    """What a measured cost model did: units priced now (timed, or a reshape view priced from the calibration),
    found in the cache, priced by the analytic estimate (opaque ops; units onnxruntime could not run)."""

    measured: int = 0
    cached: int = 0
    analytic: int = 0
    failed: int = 0
    seconds: float = 0.0
    analytic_ops: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"measured": self.measured, "cached": self.cached, "analytic": self.analytic, "failed": self.failed,
                "seconds": round(self.seconds, 3), "analytic_ops": dict(self.analytic_ops),
                "errors": list(self.errors[:20])}


@dataclass(frozen=True)
class Calibration:
    """Per-device constants, measured once per fingerprint: per-node dispatch cost, per-run session overhead of an
    end-to-end run (sess.run as `tensat.latency` times it), and the NCHWc block size (0 = no blocked layout)."""

    node_us: float
    run_us: float
    block: int

    def to_dict(self) -> dict[str, Any]:
        return {"node_us": self.node_us, "run_us": self.run_us, "block": self.block}


def _bucket(nbytes: float) -> int:
    """Working sets rounded to a power of two MiB (1 to 256)."""
    mib = max(nbytes / 2**20, 1.0)
    return int(min(2 ** round(math.log2(mib)), 256))


def graph_working_set(graph: Graph) -> int:
    """Bytes of the distinct weights the graph's inference reads (after weight-only subgraphs are folded)."""
    const = graph.weight_only()
    seen: set[int] = set()
    for i in graph.live():
        n = graph.nodes[i]
        if n.is_leaf or i in const:
            continue
        seen.update(j for j in n.inputs if j in const)
    return sum(_nbytes(graph.nodes[j].shape, graph.nodes[j].dtype) for j in seen)


class MeasuredCost:
    """A `CostModel` pricing nodes by their latency in onnxruntime on one device (see the module docstring).

    `prefetch(items)` measures every missing cost at once behind one progress bar; `__call__` returns cached costs
    (measuring on the spot if something was not prefetched). `unit_cost` prices a fused group of nodes. `windows`
    fixes the number of timing windows of every unit (default: `WINDOWS`, one for long units); `chunk` is how many
    units are planned at once, their windows taken in turn.
    """

    name = "measured"

    def __init__(
        self, device: str = "auto", cache_path: str | os.PathLike[str] | None = None,
        progress: bool | ProgressFn = True, threads: int = 1, working_set: int | None = None, max_seconds: float = 1.5,
        cache: CostCache | None = None, clock: str | None = None, windows: int | None = None,
        chunk: int = CHUNK,
    ) -> None:
        if int(threads) < 1:
            raise TensatError(f"threads must be positive, got {threads}")
        if windows is not None and int(windows) < 1:
            raise TensatError(f"windows must be positive, got {windows}")
        self.windows = None if windows is None else int(windows)
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

    # -- configuration ------------------------------------------------------------------------------------------

    def observe_graph(self, graph: Graph) -> None:
        """Take the working set (bytes of weights one inference reads) from the graph being optimized."""
        self.working_set = graph_working_set(graph)

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
            cal = found[1] if found else None
            if cal and {"node_us", "run_us", "block"} <= set(cal):
                self._calibration = Calibration(float(cal["node_us"]), float(cal["run_us"]), int(cal["block"]))
            else:
                self._calibration = self.calibrate()
                self.cache.put_device(self.fingerprint, self.info, self._calibration.to_dict())
        return self._calibration

    def calibrate(self) -> Calibration:
        """Measure the per-node dispatch cost, the per-run overhead and the NCHWc block size on this device."""
        with _silenced():
            r = self.runner
            long, short = r.bound(r.session(chain_model(65))), r.bound(r.session(chain_model(1)))
            per_node = time_pair(long, short, 64, min_rounds=50, max_rounds=2000, max_seconds=2.0, clock=r.clock)
            node_us = max(per_node.median_us, 0.0)
            stats = time_models([_tiny_model()], provider=self.device, threads=self.threads, warmup=20, runs=2000,
                                max_seconds=1.5, clock=self.clock)[0]
            run_us = max(stats.median_ms * 1e3 - node_us, 0.0)
            block = self._block_size() if self.device == "cpu" else 0
        return Calibration(round(node_us, 4), round(run_us, 3), block)

    def _block_size(self) -> int:
        try:
            sess = self.runner.session(reorder_model("in", (1, 4, 1, 1), 4))
            out = sess.run(None, {"x": np.ones((1, 4, 1, 1), np.float32)})[0]
            return int(out.shape[1])
        except Exception:  # noqa: BLE001 - no NCHWc kernels on this build or CPU
            return 0

    # -- signatures ---------------------------------------------------------------------------------------------

    def _ws_bucket(self) -> int:
        return _bucket(self.working_set if self.working_set is not None else DEFAULT_WORKING_SET)

    def _key(self, unit: Unit) -> str:
        sig = unit.signature()
        if unit.weighted:
            sig = f"{sig}|ws={self._ws_bucket()}MiB"
        return sig

    @staticmethod
    def _reorder_key(kind: str, shape: Sequence[int]) -> str:
        return json.dumps({"reorder": kind, "shape": list(shape)}, separators=(",", ":"))

    # -- pricing ------------------------------------------------------------------------------------------------

    def __call__(self, node: Node, in_shapes: Sequence[Shape], const: Sequence[bool] = ()) -> float:
        if node.is_leaf or (node.op != "opaque" and in_shapes and len(const) == len(in_shapes) and all(const)):
            return 0.0
        if node.op == "opaque":
            return self._opaque(node, in_shapes, const)
        return self.unit_cost(pricing_unit(node, in_shapes, const))

    def _opaque(self, node: Node, in_shapes: Sequence[Shape], const: Sequence[bool]) -> float:
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

    def prefetch(self, items: Iterable[tuple[Node, Sequence[Shape], Sequence[bool]]]) -> None:
        """Measure (or load from the cache) the cost of every item not yet known, behind one progress bar."""
        items = list(items)
        if self.working_set is None:
            self.working_set = self._estimate_working_set(items)
        units = []
        for node, shapes, const in items:
            if node.is_leaf or node.op == "opaque" or (shapes and len(const) == len(shapes) and all(const)):
                continue
            units.append(pricing_unit(node, shapes, const))
        self.prefetch_units(units)

    @staticmethod
    def _estimate_working_set(items: Sequence[tuple[Node, Sequence[Shape], Sequence[bool]]]) -> int:
        """Without `observe_graph`: the bytes of every weight operand priced (shared weights counted per use)."""
        total = 0
        for node, shapes, const in items:
            total += sum(_nbytes(s, node.dtype) for s, c in zip(shapes, const) if c)
        return total or DEFAULT_WORKING_SET

    def prefetch_units(self, units: Iterable[Unit], between: Callable[[], None] | None = None) -> None:
        """Load or measure every unit not yet known.

        Units are measured in chunks; each unit is timed in `WINDOWS` windows separated by the other units of its
        chunk (a third window where the first two disagree by more than `WINDOW_TOL`), and its cost is the median
        of the window medians, so a burst of load from other processes does not stay in the cache. Every other
        window goes through the chunk backwards, so each unit's windows centre on the chunk's middle. `between`, if
        given, is called after every window (the accuracy report times end-to-end runs there).
        """
        todo: dict[str, Unit] = {}
        for u in units:
            k = self._key(u)
            if k not in self._memo and k not in todo:
                todo[k] = u
        if not todo:
            return
        found = self.cache.get_many(self.fingerprint, todo)
        for k, entry in found.items():
            self._memo[k] = entry.ms
            self._details[k] = entry.detail or {}
            self.stats.cached += 1
            todo.pop(k)
        if not todo:
            return
        start = time.perf_counter()
        order = sorted(todo.items(), key=lambda kv: (kv[1].label(), kv[0]))
        windows = self.windows or WINDOWS
        bar = Progress(len(order) * windows, f"measuring {len(order)} op costs on {self.device}", self.progress)
        try:
            for c in range(0, len(order), self.chunk):
                chunk = order[c:c + self.chunk]
                plans: dict[str, _Plan | CostEntry] = {}
                for k, unit in chunk:
                    plans[k] = self._plan(unit)
                for w in range(windows):
                    for k, unit in chunk if w % 2 == 0 else chunk[::-1]:
                        plan = plans[k]
                        if w < (plan.windows_wanted if isinstance(plan, _Plan) else 1):
                            self._window(plan)
                            if between is not None:
                                between()
                        bar.step(unit.label())
                extra = [k for k, _ in chunk if isinstance(plans[k], _Plan) and plans[k].disagree()]
                bar.total += len(extra)
                for k in extra:
                    self._window(plans[k])
                    if between is not None:
                        between()
                    bar.step(todo[k].label())
                entries = {k: self._entry(plans[k]) for k, _ in chunk}
                for k, entry in entries.items():
                    self._memo[k] = entry.ms
                    self._details[k] = entry.detail or {}
                self.cache.put_many(self.fingerprint, entries)
        finally:
            bar.close()
            self.stats.seconds += time.perf_counter() - start

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
        if wbytes > 0:
            ws = self.working_set if self.working_set is not None else DEFAULT_WORKING_SET
            k = math.ceil(_bucket(ws) * 2**20 / wbytes)
        else:
            k = 8
        k_mem = max(1, MEMORY_CAP // max(wbytes + out_bytes, 1))
        k_out = max(1, OUT_BUDGET // max(out_bytes, 1))
        return int(max(1, min(k, k_time, k_mem, k_out, MAX_COPIES)))

    def evict_bytes(self, weight_bytes: int, copies: int) -> int:
        """Bytes to evict before a timed run of `copies` copies of a unit with `weight_bytes` of weights: the rest
        of the working set, which inside the graph passes through the caches between two runs of the unit (none
        for a unit without weights: its data is all recently computed tensors)."""
        if weight_bytes <= 0:
            return 0
        return max(0, self._ws_bucket() * 2**20 - copies * weight_bytes)

    def _fallback(self, unit: Unit, exc: BaseException) -> CostEntry:
        label = unit.label()
        self.stats.failed += 1
        self.stats.analytic_ops[label] = self.stats.analytic_ops.get(label, 0) + 1
        message = f"{label}: {_first_line(exc)}"
        self.stats.errors.append(message)
        return CostEntry(self._analytic_us(unit) / 1e3, 0.0, 0, label, {"fallback": "analytic", "error": message})

    def _plan(self, unit: Unit) -> "_Plan | CostEntry":
        """How `unit` is timed: copies, eviction, and on CPU the blocked-layout model (or the reorders it causes)."""
        cal = self.calibration
        if unit.ops == ("reshape",):
            return self._reshape_entry(unit, cal)
        try:
            with _silenced():
                plan = _Plan(unit, self.copies_for(unit))
                plan.evict_bytes = self.evict_bytes(unit.weight_bytes(), plan.copies)
                if self.windows is not None:
                    plan.windows_wanted = self.windows
                elif self._analytic_us(unit) * plan.copies > LONG_ROUND_US or unit.weight_bytes() > LONG_WEIGHTS:
                    plan.windows_wanted = 1
                tensors = [*(e[0] for e in unit.externals), unit.out_shape]
                if self.device == "cpu" and cal.block and any(len(s) == 4 for s in tensors):
                    found = self._blocked_model(unit)
                    if found is not None:
                        plan.model, plan.null_model = found
                    plan.blocked = found is not None
                    if not plan.blocked and any(op in BREAKING_OPS for op in unit.ops):
                        plan.add_us = self._boundary_us(unit)
                return plan
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises many types; never stop the optimization
            return self._fallback(unit, exc)

    def _window(self, plan: "_Plan | CostEntry") -> None:
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
                plan.windows.append(time_pair(run, null, plan.copies, max_seconds=budget, clock=r.clock,
                                              before=r.cold_weights(run, plan.evict_bytes)))
        except Exception as exc:  # noqa: BLE001
            plan.failure = self._fallback(plan.unit, exc)

    def _entry(self, plan: "_Plan | CostEntry") -> CostEntry:
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
            "raw_us": round(raw, 4), "windows_us": [round(m, 4) for m in medians], "copies": plan.copies,
            "rounds": sum(w.rounds for w in plan.windows), "node_us": cal.node_us,
            "boundary_us": round(plan.add_us, 4), "nchwc": plan.blocked,
            "seconds": round(sum(w.seconds for w in plan.windows), 3),
        }
        if plan.unit.weighted:
            detail["working_set_mib"] = self._ws_bucket()
            detail["evict_mib"] = round(plan.evict_bytes / 2**20, 1)
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
        shape, const, dtype = unit.externals[0]
        if cal.block and not const and _is_plausibly_blocked(shape, dtype):
            boundary = self._reorder_us("out", shape)
        detail = {"view": True, "node_us": cal.node_us, "boundary_us": boundary}
        self.stats.measured += 1
        return CostEntry((us + boundary) / 1e3, 0.0, 0, "reshape", detail)

    def uncached(self, windows: int | None = None, max_seconds: float | None = None,
                 chunk: int | None = None) -> "MeasuredCost":
        """A model with the same device, settings and calibration whose costs are kept in memory only (so
        everything it prices is measured now), optionally with other `windows`, `max_seconds` and `chunk`."""
        fresh = MeasuredCost(self.device, progress=self.progress, threads=self.threads, working_set=self.working_set,
                             max_seconds=self.max_seconds if max_seconds is None else max_seconds,
                             cache=CostCache(":memory:"), clock=self.clock,
                             windows=self.windows if windows is None else windows,
                             chunk=self.chunk if chunk is None else chunk)
        fresh._calibration = self.calibration
        return fresh

    def _blocked_model(self, unit: Unit) -> tuple[ModelProto, ModelProto | None] | None:
        """onnxruntime's optimized model of `unit` with the reorders at its inputs and outputs cut off (None when
        onnxruntime does not run the unit in the blocked layout): it takes and gives blocked tensors, as the unit
        does between blocked neighbours inside a graph. A residual operand of Conv+Add enters through a 1x1 max pool
        (`_with_prologue`), so that onnxruntime fuses the Add into the convolution and updates that operand in
        place, as it does inside a graph (the output is then sampled, `sample_outputs`, as a graph output cannot
        alias the operand); the pools and the sampling go into the null model (second item), so that their time
        cancels, the unit's dispatch cost included."""
        timed, prologue = _with_prologue(unit)
        with tempfile.TemporaryDirectory(prefix="tensat-probe-") as tmp:
            path = os.path.join(tmp, "opt.onnx")
            self.runner.session(unit_model(timed), optimized_path=path)
            opt = onnx.load(path)
        if not any(n.domain == NCHWC_DOMAIN and n.op_type not in ("ReorderInput", "ReorderOutput")
                   for n in opt.graph.node):
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
        for k, (shape, const, dtype) in enumerate(unit.externals):
            if const or not _is_plausibly_blocked(shape, dtype):
                continue
            share = 1.0
            if unit.ops == ("slice",):
                a = dict(head.attrs)
                share = a["size"] / shape[a["axis"]]
            total += share * self._reorder_us("out", shape)
        if _is_plausibly_blocked(unit.out_shape, unit.dtype):
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
            found = CostEntry(us / 1e3, timing.spread, timing.rounds, f"reorder_{kind}",
                              {"raw_us": timing.median_us, "copies": copies})
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
            "device": dict(self.info), "fingerprint": self.fingerprint, "calibration": self.calibration.to_dict(),
            "working_set_mib": self._ws_bucket(), "cache": self.cache.path, "stats": self.stats.to_dict(),
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

    def disagree(self) -> bool:
        """The first two windows differ by more than WINDOW_TOL (a third window decides)."""
        if self.failure is not None or len(self.windows) != 2:
            return False
        a, b = (w.median_us for w in self.windows)
        return abs(a - b) > WINDOW_TOL * max(min(a, b), 1e-3) + 0.05


def _with_prologue(unit: Unit) -> tuple[Unit, list[Unit]]:
    """Inside a graph, the residual operand of a Conv+Add arrives in the blocked layout and onnxruntime fuses the
    Add into the convolution; a graph input would not. So feed such operands through a 1x1 max pool (which runs
    blocked), returning the unit to optimize and the prologue pools (one unit each)."""
    if "conv2d" not in unit.ops:
        return unit, []
    targets: list[int] = []
    for n in unit.nodes:
        if n.op != "add":
            continue
        for kind, i in n.inputs:
            shape, const, dtype = unit.externals[i] if kind == "x" else ((), True, "")
            if kind == "x" and not const and _is_plausibly_blocked(shape, dtype) and i not in targets:
                targets.append(i)
    if not targets:
        return unit, []
    where = {i: k for k, i in enumerate(targets)}
    head = [UnitNode("maxpool", POOL_1X1, (("x", i),)) for i in targets]
    body = []
    for n in unit.nodes:
        refs = []
        for kind, i in n.inputs:
            if kind == "n":
                refs.append(("n", i + len(head)))
            elif n.op == "add" and i in where:
                refs.append(("n", where[i]))
            else:
                refs.append((kind, i))
        body.append(UnitNode(n.op, n.attrs, tuple(refs)))
    prologue = [Unit((UnitNode("maxpool", POOL_1X1, (("x", 0),)),), (unit.externals[i],)) for i in targets]
    return Unit(tuple(head + body), unit.externals), prologue


def _first_line(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()[:200]
    return type(exc).__name__


def make_measured_cost(
    device: str = "auto", cache_path: str | os.PathLike[str] | None = None, progress: bool | ProgressFn = True, *,
    threads: int | None = None, working_set: int | None = None,
) -> MeasuredCost:
    """The measured cost model on `device` ("auto", "cpu" or "cuda"), caching in `cache_path` (default: the user
    cache directory, or `$TENSAT_CACHE_DIR`). `threads` defaults to `$TENSAT_MEASURE_THREADS` or 1."""
    if threads is None:
        env = os.environ.get("TENSAT_MEASURE_THREADS", "").strip()
        try:
            threads = int(env) if env else 1
        except ValueError:
            raise TensatError(f"TENSAT_MEASURE_THREADS must be an integer, got {env!r}") from None
    return MeasuredCost(device, cache_path, progress, threads=threads, working_set=working_set)
