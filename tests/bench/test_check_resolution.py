"""The check-resolution bench: block ratios judged in windows as the end-to-end check judges them, and its report."""

from __future__ import annotations

import pytest

from bench.check_resolution import render, resolution, windows
from tests.helpers import TEST_MACHINE


def test_windows_start_half_a_window_apart_and_are_kept_as_the_check_keeps_pairs() -> None:
    faster = [1.05] * 80
    judged = windows(faster, width=40)
    assert [w["start"] for w in judged] == [0, 20, 40]
    assert all(w["kept"] and w["median"] == w["low"] == w["high"] == 1.05 for w in judged)
    within = [0.99, 1.03] * 40  # a median of 1.01: not above the timing's resolution
    assert not any(w["kept"] for w in windows(within, width=40))


def test_a_gain_that_moves_between_windows_shows_in_their_spread() -> None:
    ratios = [1.0] * 40 + [1.06] * 40 + [1.0] * 40
    figures = resolution(ratios, width=40)
    assert figures["pairs"] == 120 and figures["median"] == 1.0
    assert [w["median"] for w in figures["windows"]] == pytest.approx([1.0, 1.03, 1.06, 1.03, 1.0])
    assert figures["window_sd"] == pytest.approx(0.0224, abs=1e-4)
    assert figures["kept_share"] == pytest.approx(0.2)
    assert figures["window_width"] > 0


def test_the_report_gives_each_thread_count_and_says_where_no_window_was_taken() -> None:
    full = {"block": 2, "seconds": 3.0, **resolution([1.05] * 60, width=40)}
    short = {"block": 1, "seconds": 1.0, **resolution([1.02] * 10, width=40)}
    assert "window_sd" not in short and short["windows"] == []
    records = [
        {"model": "m", "candidate": True, "threads": {"1": full, "2": short}},
        {"model": "n", "candidate": False, "returned_input": "no graph found that costs less"},
    ]
    text = render(records, TEST_MACHINE)
    assert "| m | 1 | 2 | 60 | 1.050 | 1.050-1.050 | 2 | 0.000 | 0.000 | 100% |" in text
    assert "| m | 2 | 1 | 10 | 1.020 | 1.020-1.020 | 0 | — | — | — |" in text
    assert "| n | — | — | — | — | no candidate: no graph found that costs less | | | | |" in text
