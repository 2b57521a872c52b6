"""``python -m tensat.extraction EGRAPH.json [--extractor ilp|greedy] [--solver highs|cbc] [--time-limit S]``."""

import sys

from .cli import main

sys.exit(main())
