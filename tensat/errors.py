"""Errors tensat reports to its users: each message is one line naming the problem."""


class TensatError(Exception):
    """A problem with the user's input or request; the CLI prints it as one line and exits non-zero."""


class ModelError(TensatError):
    """The model cannot be read, checked or imported."""


class VerificationError(TensatError):
    """An optimized graph does not compute what the original computes."""


BUG = "a bug in tensat; please report it with the model"  # ends the warnings about failures inside tensat


def one_line(error: object, *, typed: bool = False, limit: int | None = 300) -> str:
    """An error's message on one line, for warnings and error messages: its first non-empty line, whitespace runs
    made single spaces, cut to `limit` characters ("..." marks a cut); the type's name when there is no message.
    `typed` prefixes the type's name (`RuntimeError: ...`), for a failure inside tensat or a library, where the type
    says as much as the message. `error` may also be a message itself (an OSError's strerror)."""
    text = next((" ".join(line.split()) for line in str(error).splitlines() if line.strip()), "")
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    name = type(error).__name__
    if not text:
        return name if isinstance(error, BaseException) else "unknown error"
    return f"{name}: {text}" if typed else text
