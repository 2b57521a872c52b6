"""End-to-end latency of ONNX models in onnxruntime, measured fairly on a noisy machine.

Several models are timed interleaved (A, B, C, A, B, C, ...) in one process, so load from other processes hits
them alike; the figures reported are medians and ratios, never single runs. With `block` > 1 each turn runs one
model `block` times in a row (the first run of a block is not counted), so every model is timed in its own
steady cache state while noise over time still hits all models alike.

On CUDA, inputs and outputs stay on the device (IO binding) and every run ends with a device synchronization, so
a run's time is the device's time, not a kernel launch's.

`clock="cpu"` times a single-threaded CPU session by the CPU time of the thread running it instead of wall time:
on a shared machine wall time also counts the time the scheduler gave other processes, CPU time is what the run
takes when it has the core (memory and cache contention still show, as they would in any run).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import ModelProto

from tensat.session import ModelSource, Serialized, make_session, proto_of, shared_session
from tensat.verify import timing_inputs


@dataclass
class LatencyStats:
    """Latency of one model over repeated runs, in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    runs: int
    samples_ms: list[float] = field(default_factory=list, repr=False)  # in the order they were taken

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how noisy the runs were."""
        return (self.p90_ms - self.p10_ms) / self.median_ms if self.median_ms > 0 else 0.0


def _stats(samples: list[float]) -> LatencyStats:
    taken = [s * 1e3 for s in samples]
    q = np.percentile(taken, [10, 90])
    return LatencyStats(statistics.median(taken), float(q[0]), float(q[1]), len(taken), taken)


def runner(sess: Any, feeds: Mapping[str, np.ndarray], provider: str = "cpu") -> Callable[[], None]:
    """A no-argument function running `sess` once on `feeds`.

    On "cpu" this is `sess.run` as an application would call it; on "cuda" the inputs are copied to the device
    once, outputs are bound on the device, and each run synchronizes the device before returning.
    """
    if provider != "cuda":

        def run_cpu() -> None:
            sess.run(None, feeds)

        return run_cpu
    import onnxruntime as ort

    io = sess.io_binding()
    names = {i.name for i in sess.get_inputs()}
    device_values = {
        k: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v), "cuda", 0) for k, v in feeds.items() if k in names
    }
    for k, v in device_values.items():
        io.bind_ortvalue_input(k, v)
    for out in sess.get_outputs():
        io.bind_output(out.name, "cuda")

    def run_cuda() -> None:
        io.synchronize_inputs()
        sess.run_with_iobinding(io)
        io.synchronize_outputs()

    run_cuda._keep = (device_values, io)  # type: ignore[attr-defined]
    return run_cuda


CLOCKS = ("wall", "cpu")


def clock_function(clock: str, provider: str = "cpu", threads: int | None = 1) -> Callable[[], float]:
    """The timer for `clock`: wall time, or the calling thread's CPU time (single-threaded CPU sessions only)."""
    if clock == "wall":
        return time.perf_counter
    if clock == "cpu":
        if provider != "cpu" or threads != 1:
            raise ValueError("clock='cpu' needs the CPU provider with threads=1 (other threads' work is not counted)")
        return time.thread_time
    raise ValueError(f"unknown clock {clock!r}; choose from {', '.join(CLOCKS)}")


class Interleaved:
    """Models timed in turns on the same seeded inputs: each `turn()` runs every model once, or with `block` > 1 a
    block of `block` counted runs after one uncounted run, in a fixed order. `stats()` gives the latency so far.

    With `copies` > 1, each model runs in that many sessions of its own, one copy of every model per turn (the
    copies take turns two by two, so each runs in both orders): two sessions of one model run at speeds that
    differ with where their memory lies (`RESOLUTION`), and a ratio taken over several sessions of each model
    depends less on that draw."""

    def __init__(
        self,
        models: Sequence[ModelSource],
        *,
        provider: str = "cpu",
        threads: int | None = 1,
        warmup: int = 3,
        seed: int = 0,
        block: int = 1,
        clock: str = "wall",
        copies: int = 1,
        shapes: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        from onnx import load

        self.timer = clock_function(clock, provider, threads)
        protos = [
            proto_of(m) if isinstance(m, (ModelProto, Serialized)) else load(os.fspath(m), load_external_data=False)
            for m in models
        ]
        # Several sessions with more than one thread each: after a run, a session's pool spins on the cores the next
        # session needs (two copies of one model timed this way differed by up to 2x on 2 cores), so idle threads
        # sleep instead, for every model alike.
        spinning = threads == 1
        self.sessions = sessions = [shared_session(m, provider, threads, spinning=spinning) for m in models]
        extra = [[make_session(m, provider, threads, spinning=spinning) for m in models] for _ in range(copies - 1)]
        feeds = timing_inputs(protos[0], seed, shapes)  # at `shapes` where the models' inputs have symbolic dims
        self.feeds = feeds
        self.runs_of = [runner(sess, feeds, provider) for sess in sessions]
        self.copies = [self.runs_of, *[[runner(sess, feeds, provider) for sess in row] for row in extra]]
        for runs in self.copies:
            for run in runs:
                for _ in range(warmup):
                    run()
        self.block = max(1, int(block))
        self._turns = 0
        self.samples: list[list[float]] = [[] for _ in sessions]
        self.seconds = 0.0  # wall time spent in turns

    def size_blocks(self) -> None:
        """Run each model once and set `block` to as many runs as fit in about `BLOCK_SECONDS` (1 to `MAX_BLOCK`):
        small models are then timed in a steady cache state, and large ones still give enough pairs of blocks."""
        t = time.perf_counter()
        for run in self.runs_of:
            run()
        single = (time.perf_counter() - t) / len(self.runs_of)
        self.block = max(1, min(MAX_BLOCK, int(BLOCK_SECONDS / max(single, 1e-9))))

    @property
    def runs(self) -> int:
        """Counted runs per model so far."""
        return len(self.samples[0]) if self.samples else 0

    def turn(self, size: int | None = None) -> None:
        """One turn: `size` (default `block`) counted runs of every model, each block after one uncounted run.
        Turns alternate the models' order (A B C, then C B A), so no model always runs right after the same one:
        two copies of one model timed in a fixed order differed by about 0.5%."""
        size = self.block if size is None else size
        start = time.perf_counter()
        pairs = list(zip(self.copies[(self._turns // 2) % len(self.copies)], self.samples))
        self._turns += 1
        for run, out in pairs if self._turns % 2 else pairs[::-1]:
            if self.block > 1:
                run()
            for _ in range(size):
                t = self.timer()
                run()
                out.append(self.timer() - t)
        self.seconds += time.perf_counter() - start

    def stats(self) -> list[LatencyStats]:
        return [_stats(s) for s in self.samples]


def time_models(
    models: Sequence[ModelSource],
    *,
    provider: str = "cpu",
    threads: int | None = 1,
    warmup: int = 3,
    runs: int = 30,
    max_seconds: float = 60.0,
    seed: int = 0,
    block: int = 1,
    clock: str = "wall",
    copies: int = 1,
) -> list[LatencyStats]:
    """Median latency of each model, timed interleaved on the same seeded inputs (each in `copies` sessions taking
    turns, `Interleaved`).

    `runs` counts timed runs per model; with `block` > 1 they come in blocks of `block` consecutive runs (plus one
    uncounted run at the start of each block). `clock` is "wall" or "cpu" (see the module docstring). Stops early
    (with at least 5 runs per model) once `max_seconds` of wall time have passed, so large models stay affordable.
    """
    timed = Interleaved(
        models, provider=provider, threads=threads, warmup=warmup, seed=seed, block=block, clock=clock, copies=copies
    )
    start = time.perf_counter()
    while timed.runs < runs:
        timed.turn(min(timed.block, runs - timed.runs))
        if timed.runs >= 5 and time.perf_counter() - start > max_seconds:
            break
    return timed.stats()


RESOLUTION = 0.01  # two sessions of one model can differ by about this much (where their memory lies)
KEEP_ABOVE = 1.0 + RESOLUTION  # a speedup a candidate is kept beyond: more than the sessions' difference
FUTILE_HIGH = 1.05  # a candidate whose speedup's interval still reaches this high is timed on (see `_futile`)


def _futile(timed: Interleaved, keep_above: float = KEEP_ABOVE) -> bool:
    """Whether no candidate of `timed` (the models after its first, the baseline) is faster so far than
    `keep_above`, the speedup the caller keeps a candidate beyond: every median block ratio is at most that, and the
    95% interval of none reaches `FUTILE_HIGH`. A burst of load on a shared machine can pull the median of a few
    pairs down for a candidate some percent faster; its interval is then wide, and more pairs decide."""
    return not any(
        statistics.median(r) > keep_above or median_interval(r, draws=400)[1] >= FUTILE_HIGH
        for r in _candidate_ratios(timed)
    )


def _undecided(timed: Interleaved, keep_above: float = KEEP_ABOVE, seed: int = 0) -> bool:
    """Whether some candidate of `timed` looks faster than `keep_above` (its median block ratio above it) while the
    low end of its 95% interval is not yet above it: more pairs would tell. The interval is the verdict's own
    (`median_interval` with the timing's `seed`): one of fewer draws can put the low end above `keep_above` where
    the verdict's is not, and a candidate faster in the median is then neither timed on nor kept."""
    return any(
        statistics.median(r) > keep_above and median_interval(r, seed)[0] <= keep_above
        for r in _candidate_ratios(timed)
    )


def _decided(timed: Interleaved, above: float) -> bool:
    """Whether every candidate of `timed` is faster than `above` beyond doubt so far: the low end of its 95%
    interval is above it."""
    return all(median_interval(r, draws=400)[0] > above for r in _candidate_ratios(timed))


def _candidate_ratios(timed: Interleaved) -> Iterator[list[float]]:
    """The block ratios (baseline over candidate) of each candidate of `timed` so far."""
    base, *cands = timed.samples
    return (block_ratios(base, c, timed.block) for c in cands)


def block_ratios(a: Sequence[float], b: Sequence[float], block: int) -> list[float]:
    """Median of each block of `a` over the median of the matching block of `b` (samples in the order taken)."""
    out = []
    for k in range(0, min(len(a), len(b)) - block + 1, block):
        out.append(statistics.median(a[k : k + block]) / statistics.median(b[k : k + block]))
    return out


def median_interval(values: Sequence[float], seed: int = 0, draws: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of `values`."""
    if len(values) < 2:
        v = values[0] if values else float("nan")
        return v, v
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]


@dataclass
class LatencyComparison:
    """A candidate model's end-to-end latency against a baseline's, timed in interleaved blocks of runs.

    `speedup` is the median over pairs of blocks of (baseline block median / candidate block median): pairing
    blocks taken back to back cancels the load from other processes, which moves both alike."""

    baseline_ms: float
    candidate_ms: float
    speedup: float
    interval: tuple[float, float]  # 95% bootstrap interval of `speedup`
    pairs: int
    block: int
    seconds: float

    @property
    def measurably_slower(self) -> bool:
        """The candidate is slower beyond noise: the whole interval lies below 1."""
        return self.interval[1] < 1.0

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> LatencyComparison:
        """The comparison `to_dict` wrote."""
        low, high = d["interval"]
        return LatencyComparison(
            float(d["baseline_ms"]),
            float(d["candidate_ms"]),
            float(d["speedup"]),
            (float(low), float(high)),
            int(d["pairs"]),
            int(d["block"]),
            float(d["seconds"]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline_ms": self.baseline_ms,
            "candidate_ms": self.candidate_ms,
            "speedup": self.speedup,
            "interval": list(self.interval),
            "pairs": self.pairs,
            "block": self.block,
            "seconds": self.seconds,
        }


BLOCK_SECONDS = 0.02  # a block of runs lasts about this long (at most MAX_BLOCK runs, at least one)
MAX_BLOCK = 10


def compare_latency(
    baseline: ModelSource,
    candidate: ModelSource,
    *,
    provider: str = "cpu",
    threads: int | None = 1,
    clock: str = "wall",
    max_seconds: float = 20.0,
    pairs: int = 40,
    min_pairs: int = 5,
    seed: int = 0,
    futile_after: int | None = None,
    extend_to: int | None = None,
    extend_seconds: float | None = None,
    keep_above: float = KEEP_ABOVE,
    decided_above: float | None = None,
    decided_after: int | None = None,
    copies: int = 1,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> LatencyComparison:
    """Time `candidate` against `baseline` on the same seeded inputs, in alternating blocks of runs, until `pairs`
    pairs of blocks are taken or `max_seconds` have passed (with at least `min_pairs`); see `LatencyComparison`.

    A block holds as many runs as fit in about `BLOCK_SECONDS` (1 to `MAX_BLOCK`), so small models are timed in
    a steady cache state and large ones still give enough pairs within the time limit. With `futile_after`, the
    timing also stops once that many pairs are taken and the candidate shows no gain beyond `keep_above` (`_futile`;
    by default the timing's resolution, `RESOLUTION`): for a caller that keeps a candidate only if the low end of
    its interval is above that, more pairs would not change its answer. With `extend_to`, a candidate still
    undecided after `pairs` pairs (`_undecided`, against `keep_above` too) is timed on to
    `extend_to` pairs: one more look, within `max_seconds`, and with `extend_seconds` only until that many seconds
    have passed since the timing began (the extension is the part of the timing a caller can cut short). With
    `decided_above`, the timing stops once `decided_after` pairs (by default `futile_after`) are taken and the
    candidate is faster than that beyond doubt (`_decided`): a model several times faster needs no 40 pairs to
    tell. `copies` sessions of each model take turns (`Interleaved`); `shapes` gives the inputs' shapes where the
    models' inputs have symbolic dims."""
    return compare_many(
        baseline,
        [candidate],
        provider=provider,
        threads=threads,
        clock=clock,
        max_seconds=max_seconds,
        pairs=pairs,
        min_pairs=min_pairs,
        seed=seed,
        futile_after=futile_after,
        extend_to=extend_to,
        extend_seconds=extend_seconds,
        keep_above=keep_above,
        decided_above=decided_above,
        decided_after=decided_after,
        copies=copies,
        shapes=shapes,
    )[0]


def compare_many(
    baseline: ModelSource,
    candidates: Sequence[ModelSource],
    *,
    provider: str = "cpu",
    threads: int | None = 1,
    clock: str = "wall",
    max_seconds: float = 20.0,
    pairs: int = 40,
    min_pairs: int = 5,
    seed: int = 0,
    futile_after: int | None = None,
    extend_to: int | None = None,
    extend_seconds: float | None = None,
    keep_above: float = KEEP_ABOVE,
    decided_above: float | None = None,
    decided_after: int | None = None,
    copies: int = 1,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> list[LatencyComparison]:
    """`compare_latency` for several candidates at once: the baseline and every candidate take turns, block by
    block, so each candidate's ratio to the baseline comes from blocks taken back to back (`futile_after` stops
    the timing once no candidate is faster than `keep_above`, or, with `decided_above`, once every one is faster
    than that beyond doubt, after `decided_after` pairs; `extend_to` times an undecided one on, for at most
    `extend_seconds` since the start)."""
    start = time.perf_counter()
    models = [baseline, *candidates]
    timed = Interleaved(
        models, provider=provider, threads=threads, seed=seed, clock=clock, copies=copies, shapes=shapes
    )
    timed.size_blocks()
    cap = pairs
    limit = max_seconds
    decided_at = decided_after if decided_after is not None else futile_after
    while timed.runs < cap * timed.block:
        timed.turn()
        if timed.runs >= min_pairs * timed.block and time.perf_counter() - start > limit:
            break
        if futile_after is not None and timed.runs >= futile_after * timed.block and _futile(timed, keep_above):
            break
        if decided_above is not None and decided_at is not None and timed.runs >= decided_at * timed.block:
            if _decided(timed, decided_above):
                break
        at_cap = timed.runs >= cap * timed.block
        if extend_to is not None and cap < extend_to and at_cap and _undecided(timed, keep_above, seed):
            cap = extend_to
            if extend_seconds is not None:
                limit = min(max_seconds, extend_seconds)
    base, *cands = timed.stats()
    seconds = time.perf_counter() - start
    out = []
    for cand in cands:
        ratios = block_ratios(base.samples_ms, cand.samples_ms, timed.block)
        out.append(
            LatencyComparison(
                base.median_ms,
                cand.median_ms,
                statistics.median(ratios),
                median_interval(ratios, seed),
                len(ratios),
                timed.block,
                seconds,
            )
        )
    return out
