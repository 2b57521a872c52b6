"""How fine a gain the end-to-end check can resolve at each thread count: its verdict over windows of pairs.

    python -m bench.check_resolution                        # six corpus models
    python -m bench.check_resolution --only hubert --out-dir DIR

For each model, tensat optimizes it with default settings (and the cost cache as it stands) but no end-to-end check
(`latency_check=0`), so the verified candidate comes back whatever its time. The input and the candidate are then
timed as the check times them (`tensat.latency.Interleaved`: the check's sessions per model, its blocks and its
clock), for `PAIRS` pairs of blocks (at most `SECONDS` per thread count), at one thread and at every core. The pairs
are cut into consecutive windows of the check's `CHECK_PAIRS`, each overlapping the next by half. Each window is
judged as the check judges the pairs it takes: the median of the block ratios, its 95% interval (`median_interval`
with the check's seed), and whether the low end clears `KEEP_ABOVE`. The spread of the windows' medians and the mean
width of their intervals show what gain the check resolves at each thread count on this machine. The share of
windows kept shows how often a candidate of that speed passes a thread count's check.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

import tensat
from bench.machine import header
from bench.real_models import per_model_parser, per_model_report
from tensat.api import CHECK_PAIRS, CHECK_SESSIONS, check_threads
from tensat.latency import KEEP_ABOVE, Interleaved, block_ratios, median_interval
from tensat.measure import default_clock
from tensat.session import Serialized

MODELS = ("hubert", "falcon", "dinov2", "swin2sr", "whisper_encoder", "yolos")
PAIRS = 160  # pairs of blocks timed per model and thread count ...
SECONDS = 40.0  # ... in at most this many seconds


def windows(ratios: Sequence[float], width: int = CHECK_PAIRS, seed: int = 0) -> list[dict[str, Any]]:
    """The block ratios `ratios` (in the order taken) judged in consecutive windows of `width`, each starting half a
    window after the last: each window's first pair, median, 95% interval and whether the check would keep it."""
    out = []
    for start in range(0, len(ratios) - width + 1, max(1, width // 2)):
        part = ratios[start : start + width]
        low, high = median_interval(part, seed)
        out.append(
            {"start": start, "median": statistics.median(part), "low": low, "high": high, "kept": low > KEEP_ABOVE}
        )
    return out


def resolution(ratios: Sequence[float], width: int = CHECK_PAIRS) -> dict[str, Any]:
    """The figures of one timing's block ratios: the median and interval over all of them, and over its windows
    (`windows`) the standard deviation of the medians, the mean width of the intervals and the share kept."""
    judged = windows(ratios, width)
    low, high = median_interval(ratios)
    figures: dict[str, Any] = {"pairs": len(ratios), "median": statistics.median(ratios), "interval": [low, high]}
    if judged:
        medians = [w["median"] for w in judged]
        figures |= {
            "window_sd": statistics.pstdev(medians),
            "window_width": statistics.fmean(w["high"] - w["low"] for w in judged),
            "kept_share": sum(w["kept"] for w in judged) / len(judged),
        }
    return {**figures, "windows": judged}


def _timed(original: Serialized, candidate: Serialized, threads: int) -> dict[str, Any]:
    """Input and candidate timed as the end-to-end check times them at `threads`, for `PAIRS` pairs of blocks or
    `SECONDS`, and the ratios' figures (`resolution`)."""
    timed = Interleaved(
        [original, candidate], threads=threads, clock=default_clock("cpu", threads), copies=CHECK_SESSIONS
    )
    timed.size_blocks()
    start = time.perf_counter()
    while timed.runs < PAIRS * timed.block and time.perf_counter() - start < SECONDS:
        timed.turn()
    base, cand = timed.samples
    return {"block": timed.block, "seconds": timed.seconds, **resolution(block_ratios(base, cand, timed.block))}


def model_record(path: Path) -> dict[str, Any]:
    """One model's record: the candidate tensat found without the end-to-end check, timed at each thread count."""
    result = tensat.optimize_with_details(str(path), latency_check=0)
    record: dict[str, Any] = {"model": path.stem, "cost_before": result.cost_before, "cost_after": result.cost_after}
    if result.returned_input is not None:
        return {**record, "candidate": False, "returned_input": result.returned_input}
    original, candidate = Serialized(onnx.load(path)), Serialized(result.output)
    return {**record, "candidate": True, "threads": {str(t): _timed(original, candidate, t) for t in check_threads()}}


def render(records: Sequence[dict[str, Any]], machine: dict[str, Any]) -> str:
    """The report's markdown."""
    lines = [
        "# The end-to-end check's resolution at each thread count",
        "",
        header(machine),
        "",
        f"Each model's candidate (tensat's default settings without the end-to-end check) timed against its input "
        f"as the check times them, then judged in windows of {CHECK_PAIRS} pairs overlapping by half, as the check "
        f"judges the pairs it takes: `window sd` is the standard deviation of the windows' median speedups, `window "
        f"width` the mean width of their 95% intervals, `kept` the share of windows whose interval starts above "
        f"{KEEP_ABOVE:g}. See `bench/check_resolution.py`.",
        "",
        "| model | threads | block | pairs | speedup | 95% interval | windows | window sd | window width | kept |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for rec in records:
        if not rec.get("candidate"):
            lines.append(f"| {rec['model']} | — | — | — | — | no candidate: {rec.get('returned_input', '')} | | | | |")
            continue
        for threads, t in rec["threads"].items():
            low, high = t["interval"]
            spread = (
                f"{t['window_sd']:.3f} | {t['window_width']:.3f} | {100 * t['kept_share']:.0f}%"
                if t["windows"]
                else "— | — | —"
            )
            lines.append(
                f"| {rec['model']} | {threads} | {t['block']} | {t['pairs']} | {t['median']:.3f} | "
                f"{low:.3f}-{high:.3f} | {len(t['windows'])} | {spread} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = per_model_parser("check_resolution", __doc__, MODELS).parse_args(argv)
    return per_model_report(args, model_record, render)


if __name__ == "__main__":
    sys.exit(main())
