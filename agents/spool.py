"""Durable batch spool in SQLite (WAL, synchronous=FULL).

A closed batch is stored as the exact bytes to send, with its ``batch_seq``
taken from a persisted high-water mark in the same transaction, so a batch is
either fully stored with a fresh sequence number or not at all. States:
``pending`` (to send, oldest first), ``sent`` (acknowledged; only the newest
``keep_sent`` are retained), ``dead`` (undelivered: rejected by the server with
400/409/413/415; kept with the server's answer and never deleted, reported to the
service, resent only when an operator re-drives it).

``batch_seq`` = ``stamp_ms << 20 | spool_id``, below 2^63 (a Postgres bigint) until
the year 2248:
- ``stamp_ms`` is the wall clock in milliseconds, but never below the spool's
  persisted high-water mark + 1, so a clock stepped back cannot repeat a number;
- ``spool_id`` (20 bits) is drawn at random when the spool is created; its top
  bit says whether the spool is a live agent's or a replay's (``--once-seconds``:
  history, backfill), so a node's live and replay spools never share a number, and
  two live spools of one node (a reinstall) share one only if they drew the same
  19 random bits *and* the same millisecond.
Spools created before this scheme counted from the Unix time in seconds (about
2^31); every new number is above 2^60, so they continue above what they used.

The meter's open batch is checkpointed here too (``checkpoint``), so an agent
killed with SIGKILL closes what it had metered into a batch when it restarts.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from agents.clock import to_us

__all__ = ["DEFAULT_SAMPLE_RETENTION", "BatchState", "CheckpointPeriod", "Spool", "SpoolKind", "SpooledBatch", "compose_batch_seq", "spool_node"]

BatchState = Literal["pending", "sent", "dead"]
# How long the per-second samples stay on the node after their batch (``--sample-retention-days``):
# the service keeps integrals only, so these are the evidence an audit of a bill reads (docs/agent.md).
DEFAULT_SAMPLE_RETENTION = timedelta(days=14)
SpoolKind = Literal["live", "replay"]

_ID_BITS = 20
_REPLAY_BIT = 1 << (_ID_BITS - 1)
_STAMP_LIMIT = 1 << (63 - _ID_BITS)  # milliseconds: 2248-01-01 or so

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
CREATE TABLE IF NOT EXISTS samples (
    batch_seq INTEGER PRIMARY KEY,
    window_start TEXT NOT NULL,
    window_end TEXT NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_window_end ON samples (window_end);
CREATE TABLE IF NOT EXISTS open_periods (
    period_start TEXT PRIMARY KEY,
    period_end TEXT NOT NULL,
    gpus BLOB NOT NULL,
    samples BLOB NOT NULL
);
"""
# Columns added after the first release; ``_initialise`` adds them to older spools.
_ADDED_COLUMNS = (
    ("reported_at", "TEXT"),  # when the service acknowledged our report of this undelivered batch
    ("superseded_by", "INTEGER"),  # a re-drive renumbered it: the batch_seq that carries it now
)


def compose_batch_seq(*, stamp_ms: int, spool_id: int) -> int:
    """The wire ``batch_seq`` of a spool's stamp (see the module docstring)."""
    if not 0 <= spool_id < 1 << _ID_BITS:
        raise ValueError(f"spool_id must fit {_ID_BITS} bits, got {spool_id}")
    if not 0 <= stamp_ms < _STAMP_LIMIT:
        raise ValueError(f"stamp {stamp_ms} ms is outside [0, 2^{63 - _ID_BITS})")
    return stamp_ms << _ID_BITS | spool_id


def spool_node(path: str | Path) -> str:
    """The node an existing spool belongs to (read-only; for tools that open someone's spool)."""
    if not Path(path).is_file():
        raise ValueError(f"no spool at {path}")
    db = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'node'").fetchone()
    except sqlite3.DatabaseError as error:
        raise ValueError(f"{path} is not a spool ({error})") from error
    finally:
        db.close()
    if row is None:
        raise ValueError(f"{path} is not a spool (no node recorded)")
    return str(row[0])


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
    reported_at: datetime | None = None
    superseded_by: int | None = None

    def json_bytes(self) -> bytes:
        """The batch document, decompressed if stored gzipped."""
        return gzip.decompress(self.body) if self.content_encoding == "gzip" else self.body

    def content_sha256(self) -> str:
        """What the service keys duplicates on: SHA-256 of the JSON after removing gzip."""
        return hashlib.sha256(self.json_bytes()).hexdigest()


@dataclass(frozen=True, slots=True)
class CheckpointPeriod:
    """Metered periods ``[start, end)`` of the open batch, in wire form (``gpus``/``samples`` JSON)."""

    start: datetime
    end: datetime
    gpus: list[dict[str, Any]]
    samples: list[dict[str, Any]]


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
        sample_retention: timedelta = DEFAULT_SAMPLE_RETENTION,
        kind: SpoolKind = "live",
        rng: random.Random | None = None,
    ) -> None:
        if keep_sent < 0:
            raise ValueError(f"keep_sent must be >= 0, got {keep_sent}")
        if sample_retention <= timedelta(0):
            raise ValueError(f"sample_retention must be positive, got {sample_retention}")
        self._sample_retention = sample_retention
        self._now = now
        self._compress = compress
        self._keep_sent = keep_sent
        self._lock = threading.Lock()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: transactions are explicit BEGIN IMMEDIATE ... COMMIT below.
        # A re-drive may open the spool while the agent runs: wait for its writes, never fail.
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30.0)
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise RuntimeError(f"spool {path}: SQLite refused WAL journal mode (got {mode!r})")
        self._db.execute("PRAGMA synchronous=FULL")
        # The spool id is drawn once; the OS's randomness, so two spools made at one instant differ.
        self._initialise(node=node, path=Path(path), kind=kind, rng=rng or random.SystemRandom())

    def _initialise(self, *, node: str, path: Path, kind: SpoolKind, rng: random.Random) -> None:
        with self._transaction():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(batches)")}
            for name, sql_type in _ADDED_COLUMNS:
                if name not in columns:
                    self._db.execute(f"ALTER TABLE batches ADD COLUMN {name} {sql_type}")
            stored = self._meta("node")
            if stored is None:
                self._set_meta("node", node)
            elif stored != node:
                raise ValueError(
                    f"spool {path} belongs to node {stored!r}, not {node!r} (batch_seq counters are per node)"
                )
            if self._meta("spool_id") is None:  # a new spool, or one from before per-spool ids
                spool_id = rng.getrandbits(_ID_BITS - 1) | (_REPLAY_BIT if kind == "replay" else 0)
                self._set_meta("spool_id", str(spool_id))
                self._set_meta("stamp_ms", "0")

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

    @property
    def spool_id(self) -> int:
        with self._lock:
            return int(self._meta("spool_id") or "0")

    def store_batch(self, *, window_start: datetime, window_end: datetime, render: Callable[[int], bytes],
                    evidence: Callable[[int], bytes] | None = None) -> int:
        """Assign the next ``batch_seq``, render the batch with it and store it atomically.

        ``evidence``: the batch's per-second samples as a v1 document, kept (gzipped) for the sample
        retention whatever happens to the batch, for an audit (``export_samples``); older ones go.
        Checkpointed periods the batch now covers are dropped in the same transaction.
        """
        if window_end <= window_start:
            raise ValueError(f"empty window [{window_start}, {window_end})")
        with self._transaction():
            last_end = self._meta("last_window_end")
            if last_end is not None and window_start < datetime.fromisoformat(last_end):
                raise ValueError(
                    f"window starting {window_start.isoformat()} overlaps metered history ending {last_end}"
                )
            seq = self._take_seq()
            self._insert(seq=seq, window_start=window_start, window_end=window_end, document=render(seq))
            if evidence is not None:
                self._db.execute("INSERT INTO samples (batch_seq, window_start, window_end, body) VALUES (?, ?, ?, ?)",
                                 (seq, window_start.isoformat(), window_end.isoformat(),
                                  gzip.compress(evidence(seq), mtime=0)))
            self._db.execute("DELETE FROM samples WHERE window_end < ?",
                             ((self._now() - self._sample_retention).isoformat(),))
            self._set_meta("last_window_end", window_end.isoformat())
            self._db.execute("DELETE FROM open_periods WHERE period_start < ?", (window_end.isoformat(),))
        return seq

    def export_samples(self, *, start: datetime, end: datetime) -> Iterator[dict[str, Any]]:
        """The per-second samples kept as evidence that start in ``[start, end)``, in time order, each
        as the v1 wire writes it (docs/protocol.md) plus its ``batch_seq``."""
        if end <= start:
            raise ValueError(f"empty range [{start.isoformat()}, {end.isoformat()})")
        with self._lock:
            rows = self._db.execute(
                "SELECT batch_seq, body FROM samples WHERE window_end > ? AND window_start < ? ORDER BY window_start",
                (start.isoformat(), end.isoformat())).fetchall()
        for batch_seq, body in rows:
            for sample in json.loads(gzip.decompress(body))["samples"]:
                at = datetime.fromisoformat(sample["start"].replace("Z", "+00:00"))
                if start <= at < end:
                    yield {"batch_seq": batch_seq, **sample}

    def _take_seq(self) -> int:
        """Inside a transaction: the next stamp, persisted before the transaction commits."""
        now_ms = to_us(self._now()) // 1000
        stamp = int(self._meta("stamp_ms") or "0") + 1
        if stamp < now_ms < _STAMP_LIMIT:  # a clock beyond the scheme's range is ignored, not trusted
            stamp = now_ms
        self._set_meta("stamp_ms", str(stamp))
        return compose_batch_seq(stamp_ms=stamp, spool_id=int(self._meta("spool_id") or "0"))

    def _insert(self, *, seq: int, window_start: datetime, window_end: datetime, document: bytes) -> None:
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

    def checkpoint(self, period: CheckpointPeriod) -> None:
        """Persist metered periods of the open batch; ``checkpointed`` returns them after a crash."""
        if period.end <= period.start:
            raise ValueError(f"empty checkpoint [{period.start}, {period.end})")
        with self._transaction():
            last_end = self._meta("last_window_end")
            if last_end is not None and period.start < datetime.fromisoformat(last_end):
                raise ValueError(f"checkpoint starting {period.start.isoformat()} overlaps a stored batch")
            self._db.execute(
                "INSERT INTO open_periods (period_start, period_end, gpus, samples) VALUES (?, ?, ?, ?)",
                (
                    period.start.isoformat(),
                    period.end.isoformat(),
                    json.dumps(period.gpus, separators=(",", ":")).encode(),
                    json.dumps(period.samples, separators=(",", ":"), allow_nan=False).encode(),
                ),
            )

    def checkpointed(self) -> list[CheckpointPeriod]:
        """Periods metered after the last stored batch by a run that never closed them, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT period_start, period_end, gpus, samples FROM open_periods ORDER BY period_start"
            ).fetchall()
        return [
            CheckpointPeriod(
                start=datetime.fromisoformat(start),
                end=datetime.fromisoformat(end),
                gpus=json.loads(gpus),
                samples=json.loads(samples),
            )
            for start, end, gpus, samples in rows
        ]

    def oldest_pending(self) -> SpooledBatch | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_COLUMNS} FROM batches WHERE state = 'pending'"  # noqa: S608 - constant column list, no user input
                " ORDER BY batch_seq LIMIT 1"
            ).fetchone()
        return None if row is None else _batch(row)

    def list_batches(self, *, state: BatchState | None = None) -> list[SpooledBatch]:
        query = f"SELECT {_COLUMNS} FROM batches"  # noqa: S608 - constant column list, no user input
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

    def count_undelivered(self, *, unreported: bool = False) -> int:
        """Dead batches no re-drive has replaced; ``unreported``: only those the service does not know of."""
        sql = "SELECT COUNT(*) FROM batches WHERE state = 'dead' AND superseded_by IS NULL"
        if unreported:
            sql += " AND reported_at IS NULL"
        with self._lock:
            return int(self._db.execute(sql).fetchone()[0])

    def unreported(self, *, limit: int) -> list[SpooledBatch]:
        """Dead batches (superseded ones too: the service learns what replaced them) not yet reported."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM batches WHERE state = 'dead' AND reported_at IS NULL"  # noqa: S608 - constant column list
                " ORDER BY batch_seq LIMIT ?",
                (limit,),
            ).fetchall()
        return [_batch(r) for r in rows]

    def mark_reported(self, batches: Sequence[SpooledBatch]) -> None:
        """The service stored our report of ``batches`` as they were read (a later change re-reports)."""
        with self._transaction():
            for b in batches:
                self._db.execute(
                    "UPDATE batches SET reported_at = ? WHERE batch_seq = ? AND state = 'dead'"
                    " AND last_status IS ? AND last_error IS ? AND superseded_by IS ?",
                    (self._now().isoformat(), b.batch_seq, b.last_status, b.last_error, b.superseded_by),
                )

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
        """Undelivered: kept with the answer; a new answer is news for the service (re-reported)."""
        self._update(
            "UPDATE batches SET state = 'dead', attempts = attempts + 1, last_status = ?,"
            " last_error = ?, finished_at = ?, reported_at = NULL WHERE batch_seq = ? AND state = 'pending'",
            (status, answer, self._now().isoformat(), batch_seq),
        )

    def redrive(self, batch_seq: int, *, renumber: bool) -> int:
        """Make an undelivered batch pending again; returns the ``batch_seq`` it is sent under.

        Without ``renumber`` the same bytes are resent (after a fix on the service, for a 400).
        With it the document gets a fresh ``batch_seq`` — its only change, so what was metered is
        untouched — for a 409, whose number the service holds for other content; the old row stays,
        dead and marked superseded, and is reported again so the service can resolve it.
        """
        with self._transaction():
            row = self._db.execute(
                f"SELECT {_COLUMNS} FROM batches WHERE batch_seq = ?",  # noqa: S608 - constant column list
                (batch_seq,),
            ).fetchone()
            batch = None if row is None else _batch(row)
            if batch is None or batch.state != "dead" or batch.superseded_by is not None:
                raise ValueError(f"batch_seq {batch_seq} is not an undelivered batch of this spool")
            if not renumber:
                self._db.execute(
                    "UPDATE batches SET state = 'pending', finished_at = NULL WHERE batch_seq = ?", (batch_seq,)
                )
                return batch_seq
            document = json.loads(batch.json_bytes())
            new_seq = self._take_seq()
            document["batch_seq"] = new_seq
            # The agent's own rendering (agents.batch): compact, key order kept, floats as repr.
            rendered = json.dumps(document, separators=(",", ":"), allow_nan=False).encode("utf-8")
            self._insert(seq=new_seq, window_start=batch.window_start, window_end=batch.window_end, document=rendered)
            self._db.execute(
                "UPDATE batches SET superseded_by = ?, reported_at = NULL WHERE batch_seq = ?", (new_seq, batch_seq)
            )
            return new_seq

    @property
    def next_batch_seq(self) -> int:
        """The ``batch_seq`` a batch stored now would get (nothing is taken)."""
        with self._lock:
            now_ms = to_us(self._now()) // 1000
            stamp = int(self._meta("stamp_ms") or "0") + 1
            stamp = now_ms if stamp < now_ms < _STAMP_LIMIT else stamp
            return compose_batch_seq(stamp_ms=stamp, spool_id=int(self._meta("spool_id") or "0"))

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


_COLUMNS = (
    "batch_seq, window_start, window_end, body, content_encoding, state, attempts, last_status, last_error,"
    " reported_at, superseded_by"
)


def _batch(row: Any) -> SpooledBatch:  # row: a sqlite3 result tuple
    seq, start, end, body, encoding, state, attempts, status, error, reported, superseded = row
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
        reported_at=None if reported is None else datetime.fromisoformat(reported),
        superseded_by=superseded,
    )
