"""End-to-end latency of ONNX models in onnxruntime, measured fairly on a noisy machine.

Several models are timed interleaved (A, B, C, A, B, C, ...) in one process, so load from other processes hits
them alike; the figures reported are medians and ratios, never single runs.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from onnx import ModelProto

from tensat.verify import make_session, random_inputs

ModelSource = ModelProto | str | os.PathLike


@dataclass
class LatencyStats:
    """Latency of one model over repeated runs, in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    runs: int

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how noisy the runs were."""
        return (self.p90_ms - self.p10_ms) / self.median_ms if self.median_ms > 0 else 0.0


def _stats(samples: list[float]) -> LatencyStats:
    ms = sorted(s * 1e3 for s in samples)
    q = np.percentile(ms, [10, 90])
    return LatencyStats(statistics.median(ms), float(q[0]), float(q[1]), len(ms))


def time_models(
    models: Sequence[ModelSource], *, provider: str = "cpu", threads: int | None = 1, warmup: int = 3,
    runs: int = 30, max_seconds: float = 60.0, seed: int = 0,
) -> list[LatencyStats]:
    """Median latency of each model, timed interleaved on the same seeded inputs.

    Stops early (with at least 5 rounds) once `max_seconds` have passed, so large models stay affordable.
    """
    from onnx import load

    protos = [m if isinstance(m, ModelProto) else load(os.fspath(m), load_external_data=False) for m in models]
    sessions = [make_session(m, provider, threads) for m in models]
    feeds = random_inputs(protos[0], seed)
    for sess in sessions:
        for _ in range(warmup):
            sess.run(None, feeds)
    samples: list[list[float]] = [[] for _ in sessions]
    start = time.perf_counter()
    for r in range(runs):
        for sess, out in zip(sessions, samples):
            t = time.perf_counter()
            sess.run(None, feeds)
            out.append(time.perf_counter() - t)
        if r + 1 >= 5 and time.perf_counter() - start > max_seconds:
            break
    return [_stats(s) for s in samples]
