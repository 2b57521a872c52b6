"""Progress of a long run, reported stage by stage: a callback for the API, a stderr line for the CLI.

`optimize_with_details(..., progress=fn)` calls `fn(stage, detail)` as the run moves on: `stage` is one of
`STAGES`, `detail` says where in it the run is ("iteration 3: 12,345 e-nodes"). `StderrProgress` is the CLI's
reporter: on a terminal it redraws one line in place, with a clock that keeps ticking through stages that report
nothing for a while (an ILP solve, a latency check), so a run never looks hung; elsewhere it writes one line per
report when asked (`tensat optimize --progress`), since logs and pipes want no redraws, and otherwise, once a run
has taken `LOG_AFTER` seconds, one line per stage, so that a long batch job shows where it is.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

ProgressFn = Callable[[str, str], None]
LOG_AFTER = 30.0  # seconds after which a run off a terminal, not asked for its progress, reports its stages

STAGES = ("import", "cost", "explore", "price", "guided", "extract", "export", "verify", "latency")


def report(progress: ProgressFn | None, stage: str, detail: str = "") -> None:
    """Call `progress` if there is one; a failing reporter never breaks the run it reports on."""
    if progress is None:
        return
    try:
        progress(stage, detail)
    except Exception:  # noqa: BLE001 - progress is cosmetic
        pass


def stream_is_tty(stream: TextIO) -> bool:
    """Whether `stream` is an interactive terminal (False for pipes, files and closed streams)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def wanted(quiet: bool, forced: bool, stream: TextIO | None = None) -> bool:
    """The commands' rule for progress on `stream` (stderr): shown on a terminal unless `quiet`; elsewhere only when
    `forced` (--progress), since logs and pipes want no redraws."""
    return not quiet and (forced or stream_is_tty(stream if stream is not None else sys.stderr))


def clock(seconds: float) -> str:
    """Elapsed time as `12.3s` under a minute, `4m05s` above."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s"


class StderrProgress:
    """A progress reporter writing to stderr (or `stream`): `live` redraws one line in place, ticking every
    `tick` seconds; otherwise one line per report, or, with `after`, nothing for `after` seconds, then the stage the
    run is in and one line per stage from then on. Use as a context manager, or call `close()`."""

    def __init__(
        self,
        stream: TextIO | None = None,
        live: bool | None = None,
        tick: float = 0.5,
        prefix: str = "tensat",
        after: float | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.live = stream_is_tty(self.stream) if live is None else live
        self.after = None if self.live else after
        self._written = ""  # the stage of the last line written, with `after`
        self.prefix = prefix
        self.start = time.perf_counter()
        self._stage, self._detail, self._since = "", "", self.start
        self._lock = threading.Lock()
        self._width = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.live:
            self._thread = threading.Thread(target=self._tick, args=(tick,), daemon=True, name="tensat-progress")
            self._thread.start()
        elif self.after is not None:
            self._thread = threading.Thread(target=self._wake, daemon=True, name="tensat-progress")
            self._thread.start()

    def __call__(self, stage: str, detail: str = "") -> None:
        now = time.perf_counter()
        with self._lock:
            if stage != self._stage:
                self._since = now
            self._stage, self._detail = stage, detail
            if self.live:
                self._draw(now)
            elif self.after is None:
                self._line(now)
            elif now - self.start >= self.after and stage != self._written:
                self._line(now)

    def _line(self, now: float) -> None:
        self.stream.write(f"{self.prefix}: [{clock(now - self.start):>6}] {self._text()}\n")
        self.stream.flush()
        self._written = self._stage

    def _wake(self) -> None:
        """With `after`: once that long has passed, the stage the run is in, if no line said it yet."""
        assert self.after is not None
        if self._stop.wait(self.after):
            return
        with self._lock:
            if self._stage and self._stage != self._written:
                self._line(time.perf_counter())

    def _text(self) -> str:
        return f"{self._stage}: {self._detail}" if self._detail else self._stage

    def _draw(self, now: float) -> None:
        stage_time = f" ({clock(now - self._since)})" if now - self._since >= 1.0 else ""
        line = f"{self.prefix}: [{clock(now - self.start):>6}] {self._text()}{stage_time}"[:160]
        pad = max(self._width - len(line), 0)
        self.stream.write("\r" + line + " " * pad)
        self.stream.flush()
        self._width = len(line)

    def _tick(self, every: float) -> None:
        while not self._stop.wait(every):
            with self._lock:
                if self._stage:
                    self._draw(time.perf_counter())

    def close(self) -> None:
        """Stop the clock and leave the terminal on a fresh line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self.live and self._width:
                self.stream.write("\r" + " " * self._width + "\r")
                self.stream.flush()
                self._width = 0

    def __enter__(self) -> StderrProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
