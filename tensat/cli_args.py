"""The parser class every command line of tensat shares, with tensat's error style: the `tensat` command
(tensat/cli.py) and `python -m bench` build on it (the flags' argument types are in tensat.options)."""

from __future__ import annotations

import argparse
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """argparse with tensat's error style: a usage error is one line on stderr, `tensat: error: ...`, naming the
    command's --help, and exit status 2 (argparse's own block of usage text is left to --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"tensat: error: {message} (see `{self.prog} --help`)\n")
