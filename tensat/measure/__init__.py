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
- The timed model holds K copies of the unit, each with its own inputs, weights and output: inside a graph no
  kernel reads a tensor the one before it has just read, as a copy would read an input shared with it. K is chosen
  so the copies' weights span the working set of the graph being optimized (`observe_graph`), bounded by a per-round
  time budget, by the bytes of the copies' outputs, by memory, and by the core's level-2 cache: inside a graph an
  op's input was just computed and sits there where it fits, so the copies' inputs and outputs fit in it together.
  Inputs and outputs are buffers bound once, 64-byte aligned as onnxruntime's own buffers are.
- Cache state as inside a graph: between two runs of one op, the graph's other weights and every tensor it computes
  pass through the caches (the working set, `graph_working_set`: its weights alone left MobileNet-V2's classifier
  warm in its unit and cold in the graph; of an embedding table, only the rows looked up; rounded to a quarter of
  an octave), so its weights are cold; its input has just been computed and its output
  goes to a recycled buffer. Where the K copies' weights do not span the working set, the rest is evicted before
  every timed run (a scratch buffer is read), and then the inputs are read and the output buffers written again.
  A unit without weights writes, inside a graph, to a buffer that the tensors computed since its last use have
  pushed out to memory: it is timed with the whole cache evicted and only its inputs read again
  (`MeasuredCost.outputs`, default `DEFAULT_OUTPUTS`).
  The eviction streams no more than half the last-level cache (`weight_evict_cap`): on some CPUs a tensor read
  again after a longer eviction reads slower than one the graph has just computed, by a share that follows the
  load of the machine's other cores, and a convolution with a few KiB of weights over a large feature map was
  priced well above its time in the graph.
- Rounds alternate the unit model with a null model (K one-element Relus, same number of inputs and outputs); a
  round's sample is (t_unit - t_null) / K, plus the per-node dispatch cost of a near-empty node (`node_us`,
  calibrated per device from a chain of 64 tiny nodes), so the session's fixed per-run overhead and the per-output
  binding cost cancel and each copy keeps the dispatch cost it has inside a graph. Inputs and outputs go through
  IO binding; on CUDA both live on the device and every run ends in a synchronization.
- Noise: rounds continue until the median is stable (two successive medians within 2%), with caps on rounds and
  time. Each unit is timed in two windows, separated in time by the other units of its chunk (a third window when
  they disagree by more than 5%; one window for long units, and for units evicting at least `LONG_EVICT` before
  each run, whose rounds are long); the cost is the median of the window medians and the largest (p90 - p10) /
  median is recorded as its spread.
- CPU layout: onnxruntime runs convolutions and pools in a blocked layout (NCHWc) and reorders tensors where they
  enter or leave it. Inside a graph a chain of blocked ops needs no reorders, so a unit onnxruntime runs blocked is
  timed as onnxruntime's own optimized model of it with the reorders at its inputs and outputs cut off
  (`strip_reorders`): it takes and gives blocked tensors. A residual operand of Conv+Add enters through a 1x1 max
  pool so that onnxruntime fuses the Add into the convolution (updating the operand in place), as it does inside a
  graph, and so does the input of a BatchNormalization or a Resize that arrives blocked in the graph: onnxruntime
  runs them as a blocked Conv and a blocked Upsample only then; the pool and a one-pixel pool reading the output
  then form the null model. Conversely an op that cannot run blocked (slice, transpose, reshape, matmul, a grouped
  conv or pool onnxruntime keeps in NCHW) on a 4-D tensor is charged the reorders it causes between blocked
  neighbours: splitting a merged conv's output costs what it costs. An operand counts as blocked where the priced
  graph holds it so (`tensat.cost.Computed`, `Unit.layouts`: a token grid reshaped to an image stays in NCHW
  beside feature maps of its extent); an operand of unknown layout and an output, where the graph being optimized
  holds tensors of its batch, height and width in the blocked layout (`observe_graph`): a transformer's 4-D
  attention tensors stay in NCHW, and no reorder is charged at them. A Transpose between NHWC and a blocked
  tensor is that reorder, reading or writing channels last (onnxruntime folds it so), and costs only the reorder.
- Reshape runs as a view inside a graph (onnxruntime aliases its buffer): it costs one node's dispatch, plus the
  reorder out of the blocked layout where that applies.
- Opaque ops (the cost model does not see their definition) and units onnxruntime cannot build fall back to the
  analytic estimate and are counted in `stats`.

Costs are cached persistently (`tensat.measure.cache`), keyed by the device fingerprint (device name, provider,
onnxruntime version, threads, clock, method) and the unit's signature (plus the working-set bucket for units with
weights). The per-run overhead of a session (`baseline_ms`) is not part of any node's cost; a graph's predicted
end-to-end latency is its summed cost plus that baseline.

The package, one concern a module:

- `device`: resolving the device, probing CUDA, naming the CPU or GPU, the fingerprint;
- `units`: what is timed (`Unit`) and the ONNX models built around it;
- `timing`: sessions, IO binding, eviction, timing rounds, the per-device calibration;
- `bar`: the progress of measuring;
- `model`: `MeasuredCost` (copies, plans, windows, prices) and `make_measured_cost`;
- `cache`: the SQLite cost cache.
"""

from tensat.measure.bar import Progress
from tensat.measure.cache import CostCache, CostEntry, default_cache_dir, default_cache_path
from tensat.measure.device import (
    DEVICES,
    METHOD,
    PROVIDERS,
    cpu_name,
    cuda_available,
    default_clock,
    device_info,
    fingerprint,
    gpu_name,
    resolve_device,
)
from tensat.measure.model import (
    CHUNK,
    DEFAULT_OUTPUTS,
    DEFAULT_WORKING_SET,
    LONG_ROUND_US,
    LONG_WEIGHTS,
    MAX_COPIES,
    MEMORY_CAP,
    OUT_BUDGET,
    ROUND_BUDGET_US,
    WINDOW_TOL,
    WINDOWS,
    MeasuredCost,
    MeasureStats,
    graph_traffic,
    graph_working_set,
    make_measured_cost,
)
from tensat.measure.timing import (
    ALIGNMENT,
    EVICT_CAP,
    STABLE_TOL,
    Calibration,
    Runner,
    Timing,
    aligned,
    measure_calibration,
    time_pair,
    time_rounds,
)
from tensat.measure.units import (
    NCHWC_DOMAIN,
    POOL_1X1,
    Shape,
    Unit,
    UnitNode,
    chain_model,
    null_model,
    pricing_unit,
    prologue_model,
    reorder_model,
    replicate,
    sample_outputs,
    strip_reorders,
    unit_model,
)

__all__ = [
    "ALIGNMENT",
    "CHUNK",
    "DEFAULT_OUTPUTS",
    "DEFAULT_WORKING_SET",
    "DEVICES",
    "EVICT_CAP",
    "LONG_ROUND_US",
    "LONG_WEIGHTS",
    "MAX_COPIES",
    "MEMORY_CAP",
    "METHOD",
    "NCHWC_DOMAIN",
    "OUT_BUDGET",
    "POOL_1X1",
    "PROVIDERS",
    "ROUND_BUDGET_US",
    "STABLE_TOL",
    "WINDOWS",
    "WINDOW_TOL",
    "Calibration",
    "CostCache",
    "CostEntry",
    "MeasureStats",
    "MeasuredCost",
    "Progress",
    "Runner",
    "Shape",
    "Timing",
    "Unit",
    "UnitNode",
    "aligned",
    "chain_model",
    "cpu_name",
    "cuda_available",
    "default_cache_dir",
    "default_cache_path",
    "default_clock",
    "device_info",
    "fingerprint",
    "gpu_name",
    "graph_traffic",
    "graph_working_set",
    "make_measured_cost",
    "measure_calibration",
    "null_model",
    "pricing_unit",
    "prologue_model",
    "reorder_model",
    "replicate",
    "resolve_device",
    "sample_outputs",
    "strip_reorders",
    "time_pair",
    "time_rounds",
    "unit_model",
]
