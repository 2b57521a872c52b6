"""What every command line of tensat shares: the parser class with tensat's error style, the argument types of
its flags, and the one-line form of an error. The `tensat` command (tensat/cli.py), its subcommands' modules and
`python -m bench` build on it."""

from __future__ import annotations

import argparse
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """argparse with tensat's error style: a usage error is one line on stderr, `tensat: error: ...`, naming the
    command's --help, and exit status 2 (argparse's own block of usage text is left to --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"tensat: error: {message} (see `{self.prog} --help`)\n")


def parse_input_shape(text: str) -> tuple[str, list[int]]:
    """Parse NAME=d1,d2,... into (name, dims)."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=d1,d2,..., got {text!r}")
    try:
        shape = [int(d) for d in dims.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"dimensions must be integers in {text!r}") from None
    if any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(f"dimensions must be positive in {text!r}")
    return name, shape


def positive_int(text: str) -> int:
    """Parse a positive integer flag value."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _float_flag(text: str, zero_ok: bool) -> float:
    """Parse a number flag value that must be positive (or, with `zero_ok`, may also be 0)."""
    want = "a number >= 0" if zero_ok else "a positive number"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}") from None
    if not (value >= 0 if zero_ok else value > 0):
        raise argparse.ArgumentTypeError(f"must be {want}, got {text}")
    return value


def positive_float(text: str) -> float:
    """Parse a positive number flag value."""
    return _float_flag(text, zero_ok=False)


def non_negative_float(text: str) -> float:
    """Parse a number flag value that may be 0."""
    return _float_flag(text, zero_ok=True)


def one_line(exc: BaseException) -> str:
    """An error's message on one line (whitespace runs, newlines included, become single spaces)."""
    return " ".join(str(exc).split()) or type(exc).__name__
