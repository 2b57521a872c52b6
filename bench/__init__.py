"""The benchmarks of the repository (not installed with tensat): `python -m bench` and the `bench.*` scripts."""

from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
