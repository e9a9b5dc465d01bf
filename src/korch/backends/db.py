"""The profile database: every kernel measurement korch has made, in one SQLite file.

A measurement is keyed by (signature, device, backend, backend_version): the
kernel's canonical signature (``orchestrate/signature.py``), the device it ran
on, and the backend that built it at that backend's version, so that a new
compiler re-measures while an old one's rows stay for a later downgrade. A row
records a latency when the kernel built, matched the reference and timed
(status "ok"), or why it did not ("build_failed", "check_failed",
"timing_failed": a failure is remembered too, so it is not retried every run).

The measuring oracle asks in bulk which backends already have rows at their
current versions (``lookup``), measures the rest, and writes a batch at once
(``put``). Several processes may measure into one file: the journal is WAL
(readers never block the writer), every write is one short ``BEGIN IMMEDIATE``
transaction of ``INSERT OR REPLACE``, and a busy connection waits up to
``BUSY_TIMEOUT_S`` for the lock. The connection opens on first use and belongs
to one process: after a fork the child opens its own (SQLite connections must
not cross a fork).

A file at the path that is not a korch profile database (corrupt, another
program's database, a newer schema) is a ``KorchError`` with one line saying
which file and what to do, never a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from korch import config
from korch.errors import KorchError

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0
STATUSES = ("ok", "build_failed", "check_failed", "timing_failed")
FILE_NAME = "profile.sqlite"
# SQLite builds before 3.32 allow 999 bound parameters per statement; lookups go in chunks under that.
_CHUNK = 500

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS korch_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS measurements (
    signature TEXT NOT NULL,
    device TEXT NOT NULL,
    backend TEXT NOT NULL,
    backend_version TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ({", ".join(repr(s) for s in STATUSES)})),
    latency_s REAL,
    message TEXT NOT NULL DEFAULT '',
    launches INTEGER NOT NULL DEFAULT 1,
    variant TEXT,
    max_rel_error REAL,
    created REAL NOT NULL,
    PRIMARY KEY (signature, device, backend, backend_version)
) WITHOUT ROWID;
"""
_COLUMNS = ("signature", "device", "backend", "backend_version", "status", "latency_s", "message",
            "launches", "variant", "max_rel_error", "created")

# Connections a forked child inherited: kept referenced so that they are never
# finalized in the child, where closing would touch the parent's SQLite state.
_inherited: list[sqlite3.Connection] = []
_open_databases: weakref.WeakSet[ProfileDB] = weakref.WeakSet()


def _forget_connections_in_child() -> None:
    """After a fork: the child opens its own connection, and its locks are fresh (a parent thread may hold one)."""
    for db in list(_open_databases):
        db._lock = threading.Lock()
        if db._conn is not None:
            _inherited.append(db._conn)
        db._conn = db._pid = None


os.register_at_fork(after_in_child=_forget_connections_in_child)


def _enter_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL, retrying: the switch answers "locked" at once, not after the busy timeout,
    when processes opening a new file together race to switch it."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def default_path() -> Path:
    return Path(config.cache_dir) / FILE_NAME


@dataclasses.dataclass(frozen=True)
class Record:
    """One measurement: a latency when ``status == "ok"``, else the failure and its one-line reason."""

    signature: str
    device: str
    backend: str
    backend_version: str
    status: str
    latency_s: float | None = None
    message: str = ""
    launches: int = 1
    variant: dict | None = None  # the chosen launch configuration (stored as JSON)
    max_rel_error: float | None = None
    created: float = dataclasses.field(default_factory=time.time)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}: one of {', '.join(STATUSES)}")
        if (self.latency_s is None) == self.ok:
            raise ValueError(f"a {self.status} record {'needs' if self.ok else 'has no'} latency_s")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def _row(self) -> tuple:
        variant = None if self.variant is None else json.dumps(self.variant, sort_keys=True)
        return (self.signature, self.device, self.backend, self.backend_version, self.status, self.latency_s,
                self.message, self.launches, variant, self.max_rel_error, self.created)

    @classmethod
    def _from_row(cls, row: Sequence) -> Record:
        values = dict(zip(_COLUMNS, row))
        values["variant"] = None if values["variant"] is None else json.loads(values["variant"])
        return cls(**values)


def _speed_order(record: Record) -> tuple:
    """Sort key: ok records fastest first, then failures; backend name breaks ties (stable output)."""
    return (not record.ok, record.latency_s if record.ok else 0.0, record.backend, record.backend_version)


class ProfileDB:
    """The measurements in the SQLite file at ``path`` (default ``config.cache_dir / "profile.sqlite"``)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_path()
        self._conn: sqlite3.Connection | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()  # one connection per process, shared by its threads
        _open_databases.add(self)

    def __getstate__(self) -> dict:
        return {"path": self.path}  # a process given this database opens its own connection

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])

    # -- connection ---------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid != os.getpid():  # belt and braces for the fork hook
            _inherited.append(self._conn)
            self._conn = None
        if self._conn is None:
            self._conn, self._pid = self._open(), os.getpid()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._check_foreign(conn)
            _enter_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: durable across crashes of the process
            self._create_schema(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_foreign(self, conn: sqlite3.Connection) -> None:
        """Refuse a valid SQLite file of another program (tables, but not korch's)."""
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and "korch_meta" not in tables:
            raise KorchError(f"{self.path} is an SQLite database but not korch's profile database "
                             f"(tables: {', '.join(sorted(tables))}); pass another --db path")

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        with self._write(conn):
            # statement by statement: executescript would COMMIT the transaction first
            for statement in filter(str.strip, _SCHEMA.split(";")):
                conn.execute(statement)
            conn.execute("INSERT OR IGNORE INTO korch_meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            (found,) = conn.execute("SELECT value FROM korch_meta WHERE key = 'schema_version'").fetchone()
        if found != str(SCHEMA_VERSION):
            raise KorchError(f"{self.path} is a korch profile database of schema version {found}, this korch "
                             f"reads version {SCHEMA_VERSION}; delete the file (it is a cache) or pass another --db")

    @contextmanager
    def _write(self, conn: sqlite3.Connection) -> Iterator[None]:
        """One short write transaction: the write lock is taken at BEGIN, so no deadlock on upgrade."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @contextmanager
    def _session(self) -> Iterator[sqlite3.Connection]:
        """The process's connection, with every SQLite failure turned into a one-line ``KorchError``."""
        with self._lock:
            try:
                yield self._connection()
            except sqlite3.DatabaseError as exc:
                raise KorchError(f"profile database {self.path}: {exc} "
                                 f"(if the file is damaged, delete it: it is a cache)") from None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = self._pid = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- reading and writing ------------------------------------------------------------------

    def put(self, records: Iterable[Record]) -> int:
        """Insert or replace ``records`` in one transaction; returns how many."""
        rows = [r._row() for r in records]
        if not rows:
            return 0
        placeholders = ", ".join("?" * len(_COLUMNS))
        with self._session() as conn, self._write(conn):
            conn.executemany(f"INSERT OR REPLACE INTO measurements ({', '.join(_COLUMNS)}) "
                             f"VALUES ({placeholders})", rows)
        return len(rows)

    def _select(self, where: str, params: Sequence) -> list[Record]:
        with self._session() as conn:
            rows = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM measurements WHERE {where}", params).fetchall()
        return [Record._from_row(row) for row in rows]

    def lookup(self, signatures: Iterable[str], device: str,
               versions: Mapping[str, str]) -> dict[str, list[Record]]:
        """For each signature, its records on ``device`` from the backends in ``versions`` at those versions.

        Every requested signature is a key (an empty list: nothing measured yet);
        each list is fastest ok record first, then the failures.
        """
        wanted = list(dict.fromkeys(signatures))
        found: dict[str, list[Record]] = {s: [] for s in wanted}
        current = list(versions.items())
        if not current:
            return found
        pairs = " OR ".join("(backend = ? AND backend_version = ?)" for _ in current)
        pair_params = [value for pair in current for value in pair]
        for start in range(0, len(wanted), _CHUNK):
            chunk = wanted[start:start + _CHUNK]
            where = f"device = ? AND signature IN ({', '.join('?' * len(chunk))}) AND ({pairs})"
            for record in self._select(where, [device, *chunk, *pair_params]):
                found[record.signature].append(record)
        for records in found.values():
            records.sort(key=_speed_order)
        return found

    def get(self, signature: str, device: str, versions: Mapping[str, str] | None = None) -> dict[str, Record]:
        """Backend -> its record for ``signature`` on ``device``: at ``versions`` if given, else the newest."""
        if versions is not None:
            return {r.backend: r for r in self.lookup([signature], device, versions)[signature]}
        newest: dict[str, Record] = {}
        for record in self._select("signature = ? AND device = ?", (signature, device)):
            if record.backend not in newest or record.created > newest[record.backend].created:
                newest[record.backend] = record
        return newest

    def best(self, signature: str, device: str, versions: Mapping[str, str]) -> Record | None:
        """The fastest ok record at the current ``versions``; None when every backend failed or none measured."""
        records = self.lookup([signature], device, versions)[signature]
        return records[0] if records and records[0].ok else None

    def stats(self) -> dict:
        """Row counts (all, ok, failed, by status, by device and backend) and the bytes on disk."""
        with self._session() as conn:
            groups = conn.execute(
                "SELECT device, backend, status, COUNT(*) FROM measurements GROUP BY device, backend, status"
                " ORDER BY device, backend").fetchall()
        by_status: dict[str, int] = {}
        by_device_backend: dict[tuple[str, str], dict] = {}
        for device, backend, status, count in groups:
            by_status[status] = by_status.get(status, 0) + count
            entry = by_device_backend.setdefault(
                (device, backend), {"device": device, "backend": backend, "rows": 0, "ok": 0, "failed": 0})
            entry["rows"] += count
            entry["ok" if status == "ok" else "failed"] += count
        rows = sum(by_status.values())
        return {"path": str(self.path), "rows": rows, "ok": by_status.get("ok", 0),
                "failed": rows - by_status.get("ok", 0), "by_status": by_status,
                "by_device_backend": list(by_device_backend.values()), "file_bytes": self.file_bytes()}

    def file_bytes(self) -> int:
        """Bytes of the database file and its write-ahead log."""
        paths = (self.path, self.path.with_name(self.path.name + "-wal"))
        return sum(p.stat().st_size for p in paths if p.exists())

    def clear(self, device: str | None = None) -> int:
        """Delete every record (or those of one device); returns how many were deleted."""
        where, params = ("device = ?", (device,)) if device is not None else ("1", ())
        with self._session() as conn, self._write(conn):
            deleted = conn.execute(f"DELETE FROM measurements WHERE {where}", params).rowcount
        return deleted
