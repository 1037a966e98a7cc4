"""Day partitions of the raw sample table `billing_raw_sample` (range on `start`, UTC days)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta

from django.db import connection
from django.db.backends.utils import CursorWrapper

__all__ = ["RAW_TABLE", "ensure_raw_partitions", "partition_name", "drop_raw_partitions_before"]

RAW_TABLE = "billing_raw_sample"
# Partitions this process knows exist; creating one is idempotent, the cache only saves a round trip.
_known: set[date] = set()
# pg_advisory_xact_lock key serialising partition DDL across processes.
_PARTITION_LOCK_KEY = 0x76677075  # "vgpu"


def partition_name(day: date) -> str:
    return f"{RAW_TABLE}_p{day:%Y%m%d}"


def _partitions(cur: CursorWrapper) -> list[str]:
    """Names of the raw table's partitions, sorted (names sort by day)."""
    cur.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s ORDER BY 1",
        [RAW_TABLE],
    )
    return [row[0] for row in cur.fetchall()]


def ensure_raw_partitions(days: Iterable[date]) -> list[date]:
    """Create missing day partitions (inside the caller's transaction). Returns the days created."""
    wanted = sorted(set(days) - _known)
    if not wanted:
        return []
    created = []
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", [_PARTITION_LOCK_KEY])
        existing = set(_partitions(cur))
        for day in wanted:
            name = partition_name(day)
            if name not in existing:
                lo = datetime(day.year, day.month, day.day, tzinfo=UTC)
                hi = lo + timedelta(days=1)
                cur.execute(
                    f'CREATE TABLE "{name}" PARTITION OF {RAW_TABLE} '  # noqa: S608 - name built from a date
                    "FOR VALUES FROM (%s) TO (%s)",
                    [lo, hi],
                )
                created.append(day)
    # Only remember after the caller commits would be stricter; a rolled-back creation is
    # re-detected by the catalogue query on the next miss, since COPY then fails loudly.
    connection.on_commit(lambda: _known.update(wanted))
    return created


def drop_raw_partitions_before(day: date) -> list[str]:
    """Drop whole raw partitions older than `day` (retention). Returns dropped table names."""
    dropped = []
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", [_PARTITION_LOCK_KEY])
        for name in _partitions(cur):
            if name < partition_name(day):
                cur.execute(f'DROP TABLE "{name}"')
                dropped.append(name)
    _known.difference_update({d for d in list(_known) if partition_name(d) in dropped})
    return dropped
