"""Writing files so that a crash or Ctrl-C never leaves a partial output behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tensat.errors import TensatError


class WriteError(TensatError, OSError):
    """An output file could not be written (disk full, permission denied...): a one-line TensatError for the
    command line that is still an OSError for callers that catch those."""


def check_writable(path: str | os.PathLike) -> None:
    """Raise a one-line TensatError now if `path` could not be written later: its directory is missing or not
    writable, or `path` is a directory. A run checks its outputs before it starts, not after its work is done."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise TensatError(f"cannot write {target}: directory {directory} does not exist")
    if target.is_dir():
        raise TensatError(f"cannot write {target}: it is a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise TensatError(f"cannot write {target}: directory {directory} is not writable")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` via a temporary file in the same directory, fsync, then rename over `path`.

    On any failure or interruption the temporary file is removed and `path` is left as it was; an operating-system
    error (disk full, permission denied, `path` is a directory...) becomes a one-line WriteError.
    """
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    check_writable(target)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise WriteError(f"cannot write {target}: {exc.strerror or exc}") from None
    try:
        os.chmod(tmp, _file_mode(target))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise WriteError(f"cannot write {target}: {exc.strerror or exc}") from None
        raise
    fsync_dir(directory)


def _file_mode(target: Path) -> int:
    """The permissions `target` should get: its current ones if it exists, else what a plain open() would give
    (the temporary file from mkstemp is private, 0600)."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def fsync_dir(directory: str | os.PathLike) -> None:
    """Flush a directory entry (after a rename) where the platform allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """`atomic_write_bytes` of UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, data: object) -> None:
    """Write `data` as indented, key-sorted JSON (a report or statistics file), atomically."""
    import json

    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
