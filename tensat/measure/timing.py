"""Timing units in onnxruntime: sessions and IO-bound runs on one device (`Runner`), cache eviction between runs,
rounds alternating a unit with its null model until the median is stable (`time_rounds`, `time_pair`), and the
per-device calibration constants (per-node dispatch cost, per-run overhead, NCHWc block size)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto

from tensat.latency import clock_function, time_models
from tensat.measure.device import _silenced
from tensat.measure.units import LINE_BYTES, _random_array, _tiny_model, chain_model, null_model
from tensat.session import make_session, nchwc_block, onnxruntime_module

ALIGNMENT = 64  # bytes: bound buffers start at such a boundary, as onnxruntime's own do
EVICT_CAP = 256 * 2**20  # at most this many bytes are streamed through the caches before a timed run
EVICT_FLOOR = 32 * 2**20  # and at least this many, where the evicted working set is larger


def _caches() -> list[tuple[int, int]]:
    """(level, bytes) of each data or unified CPU cache one core reads through (Linux sysfs; none where it does
    not say)."""
    found = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text().strip())
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if kind != "Instruction" and digits.isdigit():
            found.append((level, int(digits) * scale))
    return found


def last_level_cache() -> int | None:
    """Bytes of the largest CPU cache one core reads through (None where the system does not say)."""
    sizes = [size for _, size in _caches()]
    return max(sizes) if sizes else None


def level_two_cache() -> int | None:
    """Bytes of the core's level-2 cache (None where the system does not say): where an op's input, just computed
    by the op before it, still sits inside a graph when it fits."""
    sizes = [size for level, size in _caches() if level == 2]
    return max(sizes) if sizes else None


def evict_cap(cache_bytes: int | None) -> int:
    """Bytes streamed through the caches to push everything else out of them: twice the last-level cache, which
    leaves nothing of what was there before, and no more (streaming more only takes longer), within `EVICT_FLOOR`
    and `EVICT_CAP`; `EVICT_CAP` where the cache size is unknown."""
    if not cache_bytes:
        return EVICT_CAP
    return max(EVICT_FLOOR, min(EVICT_CAP, 2 * cache_bytes))


def weight_evict_cap(cache_bytes: int | None) -> int:
    """Bytes at most streamed to make a unit's weights cold: half the last-level cache (`EVICT_CAP` where its size
    is unknown). A unit's inputs are read and its outputs written again after the eviction, as inside a graph,
    where they were just computed; after a longer eviction they read slower than that by a share that follows the
    load of the machine's other cores (on a shared AVX2 EPYC a 2 MiB tensor read again after streaming twice its
    32 MiB cache took 1.04x its time in a quiet spell and 1.23x in a busy one), while after half the cache the
    graph's time was matched in both. A unit whose copies' weights span less of the working set is dominated by its
    activations, whose reads the eviction would distort more than its weights' coldness changes them."""
    if not cache_bytes:
        return EVICT_CAP
    return min(EVICT_CAP, cache_bytes // 2)


STABLE_TOL = 0.02
LINE_FLOATS = LINE_BYTES // 4  # float32 values in a cache line


def aligned(arr: np.ndarray, alignment: int = ALIGNMENT) -> np.ndarray:
    """A copy of `arr` whose data starts on an `alignment`-byte boundary, as onnxruntime's own buffers do (numpy's
    large arrays start 16 bytes past a page boundary, and vector loads across cache lines are slower)."""
    raw = np.empty(arr.nbytes + alignment, np.uint8)
    offset = (-raw.ctypes.data) % alignment
    out = raw[offset : offset + arr.nbytes].view(arr.dtype).reshape(arr.shape)
    out[...] = arr
    return out


class Runner:
    """Sessions and IO bindings on one device with fixed settings, and the clock units are timed by."""

    def __init__(self, device: str, threads: int, clock: str = "wall") -> None:

        self.device = device
        self.threads = threads
        self.clock = clock_function(clock, device, threads)
        self.ort = onnxruntime_module()
        self._null: dict[int, Callable[[], None]] = {}
        self._scratch: np.ndarray | None = None
        cache = last_level_cache() if device == "cpu" else None
        self.evict_cap = evict_cap(cache)
        self.weight_evict_cap = weight_evict_cap(cache)
        self.near_cache = level_two_cache() if device == "cpu" else None

    def evict(self, nbytes: int) -> None:
        """Read `nbytes` of a scratch buffer (at most `evict_cap`), pushing other data out of the caches, as the
        rest of a graph's weights (read-only too) pass through them between two runs of one of its ops."""
        count = min(int(nbytes), self.evict_cap) // 4
        if count <= 0:
            return
        if self._scratch is None or self._scratch.size < count:
            self._scratch = np.ones(self.evict_cap // 4, np.float32)
        self._scratch[:count:LINE_FLOATS].max()  # one read per cache line loads every line, in less time

    def cold_weights(
        self, run: Callable[[], None], nbytes: int, warm_outputs: bool = True, warm_inputs: bool = True
    ) -> Callable[[], None] | None:
        """What to do before each timed run of a bound model (None: nothing): on CPU, evict `nbytes` from the
        caches, then touch the model's inputs and (with `warm_outputs`) its output buffers again (inside a graph an
        op's input has just been computed and its output goes to a recycled buffer: only the weights are cold).
        Without `warm_outputs` the outputs stay as cold as the rest, as in a graph whose arena buffers were last
        written before the rest of its working set passed; without `warm_inputs` the inputs too, as a graph's own
        input is (`bench.unit_context` times all three)."""
        if self.device != "cpu" or nbytes <= 0:
            return None
        inputs, outputs = run._keep[0], run._keep[3]  # type: ignore[attr-defined]
        warmed = outputs if warm_outputs else []
        read = inputs if warm_inputs else []

        def before() -> None:
            self.evict(nbytes)
            for arr in read:
                arr.sum()
            for arr in warmed:
                np.add(arr, 0.0, out=arr)

        return before

    def session(
        self, model: ModelProto | bytes, optimized_path: str | None = None, profile_prefix: str | None = None
    ) -> Any:
        """A session of `model` as units are timed: quiet, `threads` intra-op threads, all graph optimizations but
        common-subexpression elimination (which would merge the copies of a unit)."""
        data = model if isinstance(model, bytes) else model.SerializeToString()
        return make_session(
            data,
            self.device,
            self.threads,
            log_severity=4,
            optimized_path=optimized_path,
            profile_prefix=profile_prefix,
            disabled_optimizers=["CommonSubexpressionElimination"],
        )

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
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(float16)": "float16",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
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
    fns: Sequence[Callable[[], None]],
    combine: Callable[[Sequence[float]], float],
    copies: int = 1,
    *,
    min_rounds: int = 5,
    max_rounds: int = 400,
    max_seconds: float = 1.5,
    warmup: int = 1,
    check_every: int = 5,
    tol: float = STABLE_TOL,
    clock: Callable[[], float] = time.perf_counter,
    before: Callable[[], None] | None = None,
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
    run: Callable[[], None],
    null: Callable[[], None],
    copies: int,
    **kw: Any,
) -> Timing:
    """Alternate `run` and `null`: the median of (t_run - t_null) / copies, in microseconds (see `time_rounds`)."""
    return time_rounds([run, null], lambda t: (t[0] - t[1]) / copies, copies, **kw)


@dataclass(frozen=True)
class Calibration:
    """Per-device constants, measured once per fingerprint: per-node dispatch cost, per-run session overhead of an
    end-to-end run (sess.run as `tensat.latency` times it) and the NCHWc block size (0 = no blocked layout)."""

    node_us: float
    run_us: float
    block: int

    def to_dict(self) -> dict[str, Any]:
        return {"node_us": self.node_us, "run_us": self.run_us, "block": self.block}

    @staticmethod
    def from_dict(found: dict[str, Any]) -> Calibration | None:
        """The calibration stored as `to_dict` wrote it (None for one stored without every field)."""
        if not {"node_us", "run_us", "block"} <= set(found):
            return None
        return Calibration(float(found["node_us"]), float(found["run_us"]), int(found["block"]))


def measure_calibration(runner: Runner, clock: str) -> Calibration:
    """Measure the per-node dispatch cost, the per-run overhead and the NCHWc block size on `runner`'s device
    (`clock` names the clock end-to-end runs are timed by, see `tensat.latency.time_models`)."""
    with _silenced():
        r = runner
        long, short = r.bound(r.session(chain_model(65))), r.bound(r.session(chain_model(1)))
        per_node = time_pair(long, short, 64, min_rounds=50, max_rounds=2000, max_seconds=2.0, clock=r.clock)
        node_us = max(per_node.median_us, 0.0)
        stats = time_models(
            [_tiny_model()], provider=r.device, threads=r.threads, warmup=20, runs=2000, max_seconds=1.5, clock=clock
        )[0]
        run_us = max(stats.median_ms * 1e3 - node_us, 0.0)
        block = nchwc_block() if r.device == "cpu" else 0
    return Calibration(round(node_us, 4), round(run_us, 3), block)
