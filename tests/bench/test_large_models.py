"""`python -m bench.large_models`: its slope and its report, on records shaped as the benchmark writes them (the
benchmark itself exports models of several GB, and is run by hand)."""

from __future__ import annotations

import pytest

from bench.large_models import RUNS, SIZES, render, slope
from tests.helpers import TEST_MACHINE


def test_the_slope_is_least_squares() -> None:
    assert slope([(1.0, 3.0), (2.0, 5.0), (3.0, 7.0)]) == pytest.approx(2.0)
    assert slope([(1.0, 1.0)]) is None
    assert slope([(2.0, 1.0), (2.0, 3.0)]) is None


def test_the_report_gives_each_run_its_ratio_outcome_and_check() -> None:
    gib = 2**30
    data = {
        "machine": TEST_MACHINE,
        "models": {
            "large": {
                "params": 477_000_000,
                "weight_bytes": 2 * gib,
                "runs": {
                    "default": {
                        "exit": 0,
                        "seconds": 56.0,
                        "peak_rss_bytes": 5 * gib,
                        "times": {"import": 2.4, "cycle_filter": 0.01},
                        "returned_input": "not measurably faster",
                        "cost_speedup": 1.0,
                        "latency_check": {"threads=1": {"speedup": 0.985, "interval": [0.9, 1.02], "pairs": 5}},
                    },
                    "no-latency-check": {
                        "exit": 0,
                        "seconds": 28.0,
                        "peak_rss_bytes": 3 * gib,
                        "times": {"import": 2.5},
                        "returned_input": None,
                        "cost_speedup": 1.035,
                        "latency_check": None,
                    },
                },
            }
        },
        "slopes": {"default": 1.9, "no-latency-check": 1.1},
    }
    text = render(data)
    assert "Machine: test CPU, 2 cores" in text
    assert "| large | 477M | 2.00 GiB | default | 0 | 56 s | 5.00 GiB | 2.50x | import 2.4 |" in text
    assert "0.985x (0.900-1.020, 5 pairs) | input returned: not measurably faster |" in text
    assert "| 1.035x | not timed | optimized |" in text
    assert "slope (default): 1.90" in text and "slope (no-latency-check): 1.10" in text
    assert set(RUNS) == {"default", "no-latency-check"} and SIZES["large"].hidden == 2048
