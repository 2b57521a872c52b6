"""`python -m tensat`: the tensat command."""

import sys

from tensat.cli import main

sys.exit(main())
