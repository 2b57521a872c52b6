"""The progress of measuring: a one-line bar on a terminal, or reports through `tensat.progress`."""

from __future__ import annotations

import sys
import time

from tensat.progress import ProgressFn, clock, report, stream_is_tty


class Progress:
    """Progress of measuring: a one-line bar on stderr when `enabled` is True and stderr is a terminal, or
    reports to a `tensat.progress` callback (stage "cost") when `enabled` is one; silent otherwise."""

    def __init__(self, total: int, label: str, enabled: bool | ProgressFn = True) -> None:
        self.total = max(int(total), 0)
        self.label = label
        self.done = 0
        self.sink = enabled if callable(enabled) else None
        self.enabled = bool(enabled) and self.total > 0 and (self.sink is not None or stream_is_tty(sys.stderr))
        self.start = time.perf_counter()
        self._last = 0.0
        self._shown = False

    def step(self, note: str = "") -> None:
        self.done += 1
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            self._draw(note)

    def _draw(self, note: str) -> None:
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        if self.sink is not None:
            report(self.sink, "cost", f"{self.label}: {self.done}/{self.total} windows, eta {clock(eta)}")
            return
        width = 28
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(width * frac) + "." * (width - int(width * frac))
        text = f"\r{self.label} [{bar}] {self.done}/{self.total} {clock(elapsed)} eta {clock(eta)} {note[:28]:<28}"
        sys.stderr.write(text)
        sys.stderr.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._shown = False
