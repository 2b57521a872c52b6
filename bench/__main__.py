"""`python -m bench`: the same as `tensat bench` (the benchmark report; see bench/report.py)."""

from __future__ import annotations

import sys

from tensat.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
