"""The cold-outputs bench: each pricing's predicted over run, and how many models land within 10%."""

from __future__ import annotations

from bench.cold_outputs import median_ratio, render


def _check(ratio: float, predicted: float) -> dict[str, float]:
    return {"ratio": ratio, "predicted_ms": predicted, "run_ms": predicted / ratio}


def test_the_report_gives_each_pricings_median_and_the_models_within_ten_percent() -> None:
    info = {"cpu": "cpu", "cores": 2, "memory_gib": 1, "gpus": [], "python": "3", "versions": {}, "highs": "1"}
    info["date"] = "today"
    under = {
        "today": [_check(0.88, 8.8), _check(0.86, 8.6)],
        "outputs in LLC": [_check(0.93, 9.3)],
        "cold outputs": [_check(0.97, 9.7), _check(0.99, 9.9)],
    }
    failed = {
        "today": [{"error": "RuntimeError: no"}],
        "outputs in LLC": [{"error": "x"}],
        "cold outputs": [_check(1.2, 12.0)],
    }
    table = render([{"model": "m", "checks": under}, {"model": "n", "checks": failed}], info)
    assert "| model | today | outputs in LLC | cold outputs |\n|---|---|---|---|" in table
    assert "| m | 0.870 (0.880, 0.860); 8.70 ms | 0.930 (0.930); 9.30 ms | 0.980 (0.970, 0.990); 9.80 ms |" in table
    assert "| n | RuntimeError: no | " in table and " | 1.200 (1.200); 12.00 ms |" in table
    assert "Within 10%: today 0 of 2, outputs in LLC 1 of 2, cold outputs 1 of 2." in table
    assert median_ratio([{"error": "x"}]) is None
