"""Durable batch spool in SQLite (WAL, synchronous=FULL).

A closed batch is stored as the exact bytes to send, with its ``batch_seq``
taken from a persisted counter in the same transaction, so a batch is either
fully stored with a fresh sequence number or not at all. States:
``pending`` (to send, oldest first), ``sent`` (acknowledged; only the newest
``keep_sent`` are retained), ``dead`` (rejected by the server with 400/409/413/415;
kept with the server's answer for an operator, never resent).

The counter starts at the Unix time (seconds) of the spool's creation: every
batch covers at least one second, so a node whose spool is wiped and recreated
still continues above every sequence number it used before.
"""

from __future__ import annotations

import gzip
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from agents.clock import to_us

__all__ = ["BatchState", "Spool", "SpooledBatch"]

BatchState = Literal["pending", "sent", "dead"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    batch_seq INTEGER PRIMARY KEY,
    window_start TEXT NOT NULL,
    window_end TEXT NOT NULL,
    body BLOB NOT NULL,
    content_encoding TEXT NOT NULL CHECK (content_encoding IN ('gzip', 'identity')),
    state TEXT NOT NULL CHECK (state IN ('pending', 'sent', 'dead')),
    created_at TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_status INTEGER,
    last_error TEXT,
    finished_at TEXT
);
CREATE INDEX IF NOT EXISTS batches_state_seq ON batches (state, batch_seq);
"""


@dataclass(frozen=True, slots=True)
class SpooledBatch:
    batch_seq: int
    window_start: datetime
    window_end: datetime
    body: bytes  # exactly what goes on the wire
    content_encoding: Literal["gzip", "identity"]
    state: BatchState
    attempts: int
    last_status: int | None
    last_error: str | None

    def json_bytes(self) -> bytes:
        """The batch document, decompressed if stored gzipped."""
        return gzip.decompress(self.body) if self.content_encoding == "gzip" else self.body


class Spool:
    """Thread-safe: the metering loop stores, the uploader thread marks."""

    def __init__(
        self,
        path: str | Path,
        *,
        node: str,
        now: Callable[[], datetime],
        compress: bool = True,
        keep_sent: int = 1000,
    ) -> None:
        if keep_sent < 0:
            raise ValueError(f"keep_sent must be >= 0, got {keep_sent}")
        self._now = now
        self._compress = compress
        self._keep_sent = keep_sent
        self._lock = threading.Lock()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: transactions are explicit BEGIN IMMEDIATE ... COMMIT below.
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise RuntimeError(f"spool {path}: SQLite refused WAL journal mode (got {mode!r})")
        self._db.execute("PRAGMA synchronous=FULL")
        self._initialise(node=node, path=Path(path))

    def _initialise(self, *, node: str, path: Path) -> None:
        with self._transaction():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
            stored = self._meta("node")
            if stored is None:
                self._set_meta("node", node)
                self._set_meta("next_batch_seq", str(max(1, to_us(self._now()) // 1_000_000)))
            elif stored != node:
                raise ValueError(
                    f"spool {path} belongs to node {stored!r}, not {node!r} (batch_seq counters are per node)"
                )

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction; the lock also serialises the uploader thread."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def store_batch(self, *, window_start: datetime, window_end: datetime, render: Callable[[int], bytes]) -> int:
        """Assign the next ``batch_seq``, render the batch with it and store it atomically."""
        if window_end <= window_start:
            raise ValueError(f"empty window [{window_start}, {window_end})")
        with self._transaction():
            last_end = self._meta("last_window_end")
            if last_end is not None and window_start < datetime.fromisoformat(last_end):
                raise ValueError(
                    f"window starting {window_start.isoformat()} overlaps metered history ending {last_end}"
                )
            seq = int(self._meta("next_batch_seq") or "1")
            document = render(seq)
            body = gzip.compress(document, mtime=0) if self._compress else document
            self._db.execute(
                "INSERT INTO batches (batch_seq, window_start, window_end, body,"
                " content_encoding, state, created_at) VALUES (?, ?, ?, ?, ?, 'pending', ?)",
                (
                    seq,
                    window_start.isoformat(),
                    window_end.isoformat(),
                    body,
                    "gzip" if self._compress else "identity",
                    self._now().isoformat(),
                ),
            )
            self._set_meta("next_batch_seq", str(seq + 1))
            self._set_meta("last_window_end", window_end.isoformat())
        return seq

    def oldest_pending(self) -> SpooledBatch | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_COLUMNS} FROM batches WHERE state = 'pending'"  # noqa: S608 -- constant column list, no user input
                " ORDER BY batch_seq LIMIT 1"
            ).fetchone()
        return None if row is None else _batch(row)

    def list_batches(self, *, state: BatchState | None = None) -> list[SpooledBatch]:
        query = f"SELECT {_COLUMNS} FROM batches"  # noqa: S608 -- constant column list, no user input
        with self._lock:
            if state is None:
                rows = self._db.execute(query + " ORDER BY batch_seq").fetchall()
            else:
                rows = self._db.execute(query + " WHERE state = ? ORDER BY batch_seq", (state,)).fetchall()
        return [_batch(r) for r in rows]

    def count(self, *, state: BatchState) -> int:
        with self._lock:
            row = self._db.execute("SELECT COUNT(*) FROM batches WHERE state = ?", (state,)).fetchone()
        return int(row[0])

    def record_attempt(self, batch_seq: int, *, status: int | None, error: str) -> None:
        """A send that neither delivered nor dead-lettered the batch (it stays pending)."""
        self._update(
            "UPDATE batches SET attempts = attempts + 1, last_status = ?, last_error = ?"
            " WHERE batch_seq = ? AND state = 'pending'",
            (status, error, batch_seq),
        )

    def mark_sent(self, batch_seq: int, *, status: int) -> None:
        with self._transaction():
            self._db.execute(
                "UPDATE batches SET state = 'sent', attempts = attempts + 1, last_status = ?,"
                " last_error = NULL, finished_at = ? WHERE batch_seq = ? AND state = 'pending'",
                (status, self._now().isoformat(), batch_seq),
            )
            # Retention: keep only the newest ``keep_sent`` acknowledged batches.
            self._db.execute(
                "DELETE FROM batches WHERE state = 'sent' AND batch_seq NOT IN"
                " (SELECT batch_seq FROM batches WHERE state = 'sent'"
                " ORDER BY batch_seq DESC LIMIT ?)",
                (self._keep_sent,),
            )

    def mark_dead(self, batch_seq: int, *, status: int, answer: str) -> None:
        self._update(
            "UPDATE batches SET state = 'dead', attempts = attempts + 1, last_status = ?,"
            " last_error = ?, finished_at = ? WHERE batch_seq = ? AND state = 'pending'",
            (status, answer, self._now().isoformat(), batch_seq),
        )

    @property
    def next_batch_seq(self) -> int:
        with self._lock:
            return int(self._meta("next_batch_seq") or "1")

    @property
    def last_window_end(self) -> datetime | None:
        """End of the newest stored window; new windows may not start before it."""
        with self._lock:
            value = self._meta("last_window_end")
        return None if value is None else datetime.fromisoformat(value)

    def _update(self, sql: str, params: tuple[object, ...]) -> None:
        with self._lock:
            self._db.execute(sql, params)

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, key: str, value: str) -> None:
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )


_COLUMNS = "batch_seq, window_start, window_end, body, content_encoding, state, attempts, last_status, last_error"


def _batch(row: Any) -> SpooledBatch:  # row: a sqlite3 result tuple
    seq, start, end, body, encoding, state, attempts, status, error = row
    return SpooledBatch(
        batch_seq=seq,
        window_start=datetime.fromisoformat(start),
        window_end=datetime.fromisoformat(end),
        body=bytes(body),
        content_encoding=encoding,
        state=state,
        attempts=attempts,
        last_status=status,
        last_error=error,
    )
