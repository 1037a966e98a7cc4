"""Day partitions of the ledger's time-partitioned tables (range on a timestamptz column, UTC days).

- `billing_raw_sample` on `start` (migration 0002): written by ingest's COPY, read by the rollup.
- `billing_usageminute_store` and `billing_gpuminute_store` on `minute` (migrations 0018, 0043): the
  slim minute store, written by the rollup and read through the views `billing_usageminute` and
  `billing_gpuminute`.
  They also have a DEFAULT partition, so a row written through the ORM for a day whose partition
  does not exist yet (hand-written ledgers in tests, a shell) is stored rather than refused; the
  product's writes create the day first (`ensure_minute_partitions`), and creating a day moves any
  of its rows out of the default partition in the same transaction.

Why UTC days for the minute ledger too, not months: retention then drops exactly the days past
their period (a month partition would keep up to 30 extra days, about 30 x 1.4 GB per 1,000 GPUs);
a day partition is what the rollup writes into all day long, so it is small enough to ANALYZE in
about a second; and raw and minute partitions line up, so a raw day and its minutes are kept or
dropped together. ~100 day partitions per table are well within what the planner prunes cheaply.

Partition DDL is serialised across processes by a transaction-level advisory lock per partitioned
table, taken before any other lock: ingest and the rollup create the days they will write in a transaction of
their own, before the transaction that writes (`ensure_*` outside any transaction is one). Taken
inside a transaction that already holds table locks, the wait deadlocked: a day's CREATE TABLE
needs locks on the partitioned table, its default partition and the tables its foreign keys name,
which a concurrent ingest or rollup held while it waited for the advisory lock (seen as 503s on
backfilled days, when every batch brings a new day).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper

__all__ = [
    "MINUTE_TABLES",
    "RAW_TABLE",
    "DayPartition",
    "day_bounds",
    "days_between",
    "default_partition_name",
    "ensure_minute_partitions",
    "ensure_raw_partitions",
    "forget_partition",
    "list_day_partitions",
    "partition_name",
]

RAW_TABLE = "billing_raw_sample"
MINUTE_TABLES = ("billing_usageminute_store", "billing_gpuminute_store")
# The partition key of each table.
_KEY = {RAW_TABLE: "start", **dict.fromkeys(MINUTE_TABLES, "minute")}
# (table, day) pairs this process knows exist; creating one is idempotent, the cache only saves a
# round trip. Retention forgets the days it drops.
_known: set[tuple[str, date]] = set()
# pg_advisory_xact_lock class serialising partition DDL across processes, one lock per partitioned
# table (the second key: hashtext of its name). One lock for every table let a cycle form across
# tables: ingest, holding the lock while its raw day's CREATE TABLE waited for the raw default
# partition, and a transaction that had read raw samples waiting for the same lock to create a
# minute day (a deadlock, answered 503). Per table, creating a minute day never waits for raw DDL.
_PARTITION_LOCK_KEY = 0x76677075  # "vgpu"


@dataclass(frozen=True)
class DayPartition:
    """One UTC day's partition of `table`, holding [day 00:00, next day 00:00)."""

    table: str
    name: str
    day: date


def partition_name(day: date, table: str = RAW_TABLE) -> str:
    return f"{table}_p{day:%Y%m%d}"


def default_partition_name(table: str) -> str:
    return f"{table}_default"


def day_bounds(day: date) -> tuple[datetime, datetime]:
    lo = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return lo, lo + timedelta(days=1)


def _partitions(cur: CursorWrapper, table: str) -> list[str]:
    """Names of the table's partitions, sorted (day names sort by day; the default sorts last)."""
    cur.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s ORDER BY 1",
        [table],
    )
    return [row[0] for row in cur.fetchall()]


def list_day_partitions(table: str) -> list[DayPartition]:
    """The table's day partitions, oldest first (the default partition is not a day)."""
    prefix = f"{table}_p"
    with connection.cursor() as cur:
        names = _partitions(cur, table)
    return [
        DayPartition(table=table, name=name, day=datetime.strptime(name[len(prefix):], "%Y%m%d").date())  # noqa: DTZ007 - a date, no time
        for name in names
        if name.startswith(prefix) and name[len(prefix):].isdigit()
    ]


def forget_partition(table: str, day: date) -> None:
    """Called by retention after dropping a day: this process must create it again if asked."""
    _known.discard((table, day))


def _ensure(table: str, days: Iterable[date]) -> list[date]:
    wanted = sorted({d for d in days if (table, d) not in _known})
    if not wanted:
        return []
    created = []
    # A transaction of its own when called outside one: the advisory lock lasts until the DDL commits.
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [_PARTITION_LOCK_KEY, table])
        existing = set(_partitions(cur, table))
        default = default_partition_name(table) if default_partition_name(table) in existing else None
        for day in wanted:
            if partition_name(day, table) not in existing:
                _create_day(cur, table, day, default=default)
                created.append(day)
    # Remembered only once the caller commits: a rolled-back creation is re-detected on the next
    # miss by the catalogue query above.
    connection.on_commit(lambda: _known.update((table, d) for d in wanted))
    return created


def _create_day(cur: CursorWrapper, table: str, day: date, *, default: str | None) -> None:
    """Create the day's partition; rows of that day in the default partition move into it (in this
    transaction, so none is ever lost), since Postgres refuses a new partition whose rows the
    default partition holds."""
    lo, hi = day_bounds(day)
    name, key = partition_name(day, table), _KEY[table]
    moving = False
    if default is not None:
        cur.execute(f'SELECT EXISTS (SELECT 1 FROM "{default}" WHERE {key} >= %s AND {key} < %s)',  # noqa: S608 - fixed names
                    [lo, hi])
        moving = bool(cur.fetchone()[0])
    if moving:
        cur.execute("DROP TABLE IF EXISTS partition_moving")
        cur.execute(
            f'CREATE TEMP TABLE partition_moving ON COMMIT DROP AS WITH moved AS (DELETE FROM "{default}" '  # noqa: S608 - fixed names, as above
            f"WHERE {key} >= %s AND {key} < %s RETURNING *) SELECT * FROM moved",
            [lo, hi],
        )
    cur.execute(
        f'CREATE TABLE "{name}" PARTITION OF {table} FOR VALUES FROM (%s) TO (%s)',
        [lo, hi],
    )
    if moving:
        cur.execute(f"INSERT INTO {table} SELECT * FROM partition_moving")  # noqa: S608 - fixed names
        cur.execute("DROP TABLE partition_moving")


def ensure_raw_partitions(days: Iterable[date]) -> list[date]:
    """Create missing raw day partitions (inside the caller's transaction). Returns the days created."""
    return _ensure(RAW_TABLE, days)


def ensure_minute_partitions(days: Iterable[date]) -> list[date]:
    """Create the missing day partitions of both minute tables (inside the caller's transaction),
    before the rollup writes minutes of those days. Returns the days created in either table."""
    days = list(days)
    created: set[date] = set()
    for table in MINUTE_TABLES:
        created.update(_ensure(table, days))
    return sorted(created)


def days_between(lo: datetime, hi: datetime) -> list[date]:
    """The UTC days that [lo, hi) meets."""
    first = lo.astimezone(UTC).date()
    last = (hi.astimezone(UTC) - timedelta(microseconds=1)).date()
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]
