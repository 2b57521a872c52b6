"""Errors tensat reports to its users: each message is one line naming the problem."""


class TensatError(Exception):
    """A problem with the user's input or request; the CLI prints it as one line and exits non-zero."""


class ModelError(TensatError):
    """The model cannot be read, checked or imported."""


class VerificationError(TensatError):
    """An optimized graph does not compute what the original computes."""
