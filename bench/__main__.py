"""`python -m bench`: the benchmark report (see bench/report.py)."""

from __future__ import annotations

import sys

from bench.report import main

if __name__ == "__main__":
    sys.exit(main())
