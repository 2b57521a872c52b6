"""The persistent cache of measured operator costs: SQLite in the user's cache directory.

One database file serves every run and every process. Rows are keyed by the device fingerprint (a hash of the
device name, execution provider, onnxruntime version, thread count and measurement method) and by the signature
of the measured unit (op, attributes, input shapes and dtypes, which inputs are weights); the end-to-end check's
verdicts, by the fingerprint and a hash of the two models it timed and how. Values are plain numbers and JSON text,
never pickles.

Concurrency: WAL journal mode and a busy timeout let several processes read and write at once; every write is
one short transaction of `INSERT OR REPLACE`, retried while another writer holds the lock. Damage: a file that is
not a valid database (or turns out malformed later) is moved aside as `<name>.corrupt-<time>` and rebuilt; if even
that fails the cache degrades to memory for the rest of the process. A cache problem never stops an optimization.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
FILE_NAME = "costs.sqlite3"
BUSY_TIMEOUT_MS = 30_000
_LOCK_RETRIES = 60

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS devices (fingerprint TEXT PRIMARY KEY, info TEXT NOT NULL, calibration TEXT, "
    "updated REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS costs (fingerprint TEXT NOT NULL, signature TEXT NOT NULL, op TEXT NOT NULL, "
    "ms REAL NOT NULL, spread REAL NOT NULL, runs INTEGER NOT NULL, detail TEXT NOT NULL, updated REAL NOT NULL, "
    "PRIMARY KEY (fingerprint, signature)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS verdicts (fingerprint TEXT NOT NULL, key TEXT NOT NULL, verdict TEXT NOT NULL, "
    "updated REAL NOT NULL, PRIMARY KEY (fingerprint, key)) WITHOUT ROWID",
)


def default_cache_dir() -> Path:
    """`$TENSAT_CACHE_DIR` if set, else the platform's user cache directory (`~/.cache/tensat` on Linux)."""
    env = os.environ.get("TENSAT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "tensat"
    if os.name == "nt":
        base = os.environ.get("LOCALAPPDATA")
        return (Path(base) if base else home / "AppData" / "Local") / "tensat" / "Cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg and os.path.isabs(xdg) else home / ".cache") / "tensat"


def default_cache_path() -> Path:
    """The cost database file inside `default_cache_dir()`."""
    return default_cache_dir() / FILE_NAME


@dataclass(frozen=True)
class CostEntry:
    """One cached measurement: cost in milliseconds, its relative spread, how many timed rounds, and details."""

    ms: float
    spread: float
    runs: int
    op: str = ""
    detail: Mapping[str, Any] | None = None


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


class CostCache:
    """The cost database at `path` (default: `default_cache_path()`); see the module docstring for the design.

    `path=":memory:"` keeps everything in this process (tests, or a fallback when the directory is unusable).
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = str(path) if path is not None else str(default_cache_path())
        self.memory_only = self.path == ":memory:"
        self.rebuilt: list[str] = []
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._open()

    # -- connection management ----------------------------------------------------------------------------------

    def _open(self) -> None:
        if not self.memory_only:
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                self._degrade(f"cannot create the cache directory ({exc})")
                return
        for attempt in range(2):
            try:
                self._conn = self._connect()
                return
            except sqlite3.DatabaseError as exc:
                if _is_lock_error(exc) or attempt == 1 or self.memory_only:
                    self._degrade(f"cannot open the cost cache {self.path} ({exc})")
                    return
                self._move_aside()
            except OSError as exc:
                self._degrade(f"cannot open the cost cache {self.path} ({exc})")
                return

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            if not self.memory_only:
                self._retry(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone())
                conn.execute("PRAGMA synchronous=NORMAL")

            def init() -> None:
                with conn:
                    conn.execute("BEGIN IMMEDIATE")
                    for stmt in _SCHEMA:
                        conn.execute(stmt)
                    row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
                    if row is None:
                        conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
                    elif row[0] != str(SCHEMA_VERSION):
                        conn.execute("DELETE FROM costs")
                        conn.execute("DELETE FROM devices")
                        conn.execute("DELETE FROM verdicts")
                        conn.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION),))

            self._retry(init)
            conn.execute("SELECT count(*) FROM costs WHERE fingerprint=''").fetchone()
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _retry(fn: Any) -> Any:
        """Run `fn`, retrying while another process holds the write lock beyond the busy timeout."""
        for attempt in range(_LOCK_RETRIES):
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _is_lock_error(exc) or attempt == _LOCK_RETRIES - 1:
                    raise
                time.sleep(0.05 * (1 + attempt % 10))
        return None

    def _move_aside(self) -> None:
        """Rename a damaged database (and its WAL/SHM side files) out of the way."""
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = f"{self.path}.corrupt-{stamp}-{os.getpid()}"
        for suffix in ("", "-wal", "-shm"):
            src = self.path + suffix
            if os.path.exists(src):
                try:
                    os.replace(src, target + suffix)
                except OSError:
                    try:
                        os.unlink(src)
                    except OSError:
                        pass
        self.rebuilt.append(target)
        warnings.warn(
            f"the cost cache {self.path} was damaged; moved it to {target} and started a new one",
            RuntimeWarning,
            stacklevel=3,
        )

    def _degrade(self, why: str) -> None:
        warnings.warn(f"{why}; measured costs are kept in memory for this run only", RuntimeWarning, stacklevel=3)
        self.path = ":memory:"
        self.memory_only = True
        self._conn = self._connect()

    def _run(self, fn: Any) -> Any:
        """Run `fn(conn)`; on a damaged database rebuild it once and retry; on a second failure go to memory."""
        with self._lock:
            for attempt in range(3):
                conn = self._conn
                if conn is None:
                    self._degrade("the cost cache is unavailable")
                    conn = self._conn
                try:
                    return self._retry(lambda: fn(conn))
                except sqlite3.DatabaseError as exc:
                    if _is_lock_error(exc):
                        raise
                    if attempt == 0 and not self.memory_only:
                        self._move_aside()
                        try:
                            self._conn = self._connect()
                        except (sqlite3.DatabaseError, OSError) as exc2:
                            self._degrade(f"cannot rebuild the cost cache ({exc2})")
                    else:
                        self._degrade(f"the cost cache failed ({exc})")
            return fn(self._conn)

    # -- public API ---------------------------------------------------------------------------------------------

    def get_many(self, fingerprint: str, signatures: Iterable[str]) -> dict[str, CostEntry]:
        """Cached entries for those of `signatures` measured on `fingerprint`."""
        sigs = list(dict.fromkeys(signatures))
        out: dict[str, CostEntry] = {}

        def query(conn: sqlite3.Connection) -> None:
            for k in range(0, len(sigs), 500):
                chunk = sigs[k : k + 500]
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    f"SELECT signature, ms, spread, runs, op, detail FROM costs WHERE fingerprint=? "
                    f"AND signature IN ({marks})",
                    [fingerprint, *chunk],
                ).fetchall()
                for sig, ms, spread, runs, op, detail in rows:
                    out[sig] = CostEntry(float(ms), float(spread), int(runs), op, _loads(detail))

        self._run(query)
        return out

    def get(self, fingerprint: str, signature: str) -> CostEntry | None:
        """The cached entry for one signature, or None."""
        return self.get_many(fingerprint, [signature]).get(signature)

    def put_many(self, fingerprint: str, entries: Mapping[str, CostEntry]) -> None:
        """Store (or replace) entries, all in one transaction."""
        if not entries:
            return
        now = time.time()
        rows = [
            (
                fingerprint,
                sig,
                e.op,
                float(e.ms),
                float(e.spread),
                int(e.runs),
                json.dumps(dict(e.detail or {}), sort_keys=True),
                now,
            )
            for sig, e in entries.items()
        ]

        def write(conn: sqlite3.Connection) -> None:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("INSERT OR REPLACE INTO costs VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)

        self._run(write)

    def put(self, fingerprint: str, signature: str, entry: CostEntry) -> None:
        """Store one entry."""
        self.put_many(fingerprint, {signature: entry})

    def device(self, fingerprint: str) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
        """(device info, calibration or None) recorded for `fingerprint`, or None if never seen."""

        def query(conn: sqlite3.Connection) -> Any:
            return conn.execute("SELECT info, calibration FROM devices WHERE fingerprint=?", (fingerprint,)).fetchone()

        row = self._run(query)
        if row is None:
            return None
        return _loads(row[0]), (_loads(row[1]) if row[1] else None)

    def put_device(self, fingerprint: str, info: Mapping[str, Any], calibration: Mapping[str, Any] | None) -> None:
        """Record a device and its calibration constants."""
        data = (
            fingerprint,
            json.dumps(dict(info), sort_keys=True),
            None if calibration is None else json.dumps(dict(calibration), sort_keys=True),
            time.time(),
        )

        def write(conn: sqlite3.Connection) -> None:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT OR REPLACE INTO devices VALUES (?, ?, ?, ?)", data)

        self._run(write)

    def verdict(self, fingerprint: str, key: str) -> dict[str, Any] | None:
        """The end-to-end verdict recorded under `key` on `fingerprint` (`put_verdict`), or None."""

        def query(conn: sqlite3.Connection) -> Any:
            sql = "SELECT verdict FROM verdicts WHERE fingerprint=? AND key=?"
            return conn.execute(sql, (fingerprint, key)).fetchone()

        row = self._run(query)
        return None if row is None else _loads(row[0]) or None

    def put_verdict(self, fingerprint: str, key: str, verdict: Mapping[str, Any]) -> None:
        """Record an end-to-end verdict (plain JSON) under `key`: what timing two given models against each other on
        this device found, so that a later run which times the same two models can read it instead."""
        data = (fingerprint, key, json.dumps(dict(verdict), sort_keys=True), time.time())

        def write(conn: sqlite3.Connection) -> None:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?)", data)

        self._run(write)

    def count(self, fingerprint: str | None = None) -> int:
        """Number of cached costs (for one fingerprint, or all)."""

        def query(conn: sqlite3.Connection) -> int:
            if fingerprint is None:
                return int(conn.execute("SELECT count(*) FROM costs").fetchone()[0])
            return int(conn.execute("SELECT count(*) FROM costs WHERE fingerprint=?", (fingerprint,)).fetchone()[0])

        return int(self._run(query))

    def clear(self, fingerprint: str | None = None) -> None:
        """Forget cached costs (and calibration and end-to-end verdicts) of one fingerprint, or everything."""

        def write(conn: sqlite3.Connection) -> None:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                for table in ("costs", "devices", "verdicts"):
                    if fingerprint is None:
                        conn.execute(f"DELETE FROM {table}")
                    else:
                        conn.execute(f"DELETE FROM {table} WHERE fingerprint=?", (fingerprint,))

        self._run(write)

    def close(self) -> None:
        """Close the connection (the cache object is unusable afterwards)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> CostCache:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _loads(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
