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


class OutOfMemory(TensatError):
    """The machine ran out of memory during a stage of the run: the model is not at fault."""


# how libraries say an allocation failed: C++'s std::bad_alloc (onnxruntime, onnx), onnxruntime's own allocator,
# numpy, the C library (ENOMEM) and CUDA
_OUT_OF_MEMORY = (
    "bad_alloc",
    "failed to allocate memory",
    "unable to allocate",
    "cannot allocate memory",
    "out of memory",
    "memory allocation",
)


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` says the machine ran out of memory, as Python or any library tensat calls says it."""
    if isinstance(error, (MemoryError, OutOfMemory)):
        return True
    text = str(error).lower()
    return any(marker in text for marker in _OUT_OF_MEMORY)


def raise_if_out_of_memory(error: BaseException) -> None:
    """Re-raise `error` where it says memory ran out: a handler that would blame the model or the candidate for it
    (a session that fails to load, an unreadable file) leaves it to the run, which names the stage instead."""
    if out_of_memory(error):
        raise error
