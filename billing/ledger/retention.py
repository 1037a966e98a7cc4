"""The ledger's data lifecycle: how long raw samples and minutes are kept, dropping whole day
partitions past that, and analysing partitions whose statistics are missing or stale.

Kept for (docs/operations.md, "Retention and disk"):
- raw samples: the late-usage horizon (ingest refuses older usage) plus a margin
  (VGPU_RAW_RETENTION_MARGIN): as long as a batch may still arrive, be rolled up, or be re-priced;
- minutes: VGPU_MINUTE_RETENTION (at least as long as raw samples, so any minute the rollup or a
  rebuild can recompute still has every other minute of its hour);
- batches and their GPU rows: as long as their raw samples (pruned once their window ends before
  the raw watermark, if rolled up and not quarantined): they give the rollup each GPU-minute's
  metered seconds and ingest its exactly-once, and neither can happen again past the late-usage
  horizon (ingest refuses such a window, a recompute that old is refused below);
- hours and days: forever (billing history).

A day past its period is dropped with DROP TABLE of its partition, never a DELETE: no dead
tuples, no vacuum debt, the disk given back at once. A day that still holds samples of a batch
that is pending (not rolled up) or quarantined is kept, whatever its age: dropping it would
drop usage that was never billed. It is logged once (when first held), counted in
vgpu_ledger_retention_held_partitions, and dropped by the first run after its batches are done.

Each drop raises a watermark (`billing_ledger_retention`, migration 0018): the instant before
which raw samples (or minutes) may be gone. A rebuild or a re-pricing that starts before the raw
watermark is refused (RawSamplesDropped), a paired report that reads minutes before the minute
watermark too (MinutesPruned): recomputing from what is left would give wrong numbers silently.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils.translation import gettext as _

from billing.errors import InvalidInput
from billing.ledger.locks import lock_ledger
from billing.ledger.partitions import (
    MINUTE_TABLES,
    RAW_TABLE,
    DayPartition,
    day_bounds,
    forget_partition,
    list_day_partitions,
)

__all__ = [
    "HeldPartition",
    "LedgerDataDropped",
    "MinutesPruned",
    "RawSamplesDropped",
    "RetentionPolicy",
    "RetentionResult",
    "RetentionState",
    "apply_retention",
    "get_retention_state",
    "is_past_retention",
    "require_minutes_retained",
    "require_raw_samples",
]

log = logging.getLogger(__name__)

_WATERMARKS = "billing_ledger_retention"
_HOLDS = "billing_ledger_retention_hold"
# A drop waits at most this long for its table lock (DROP of a partition locks the parent, so a
# waiting drop would queue every ingest COPY behind it); it is tried again on the next run.
_DROP_LOCK_TIMEOUT = "2s"
# Batch ids named in a held partition's log line and hold row.
_BLOCKER_IDS_SHOWN = 20
# Batches pruned per transaction: a day of 10,000 GPUs in nodes of 8 is 1.8 M batches and 14.4 M
# GPU rows, which the hourly run deletes an hour's worth at a time in short transactions.
_PRUNE_CHUNK = 5_000


@dataclass(frozen=True)
class RetentionPolicy:
    late_usage_horizon: timedelta
    raw_margin: timedelta
    minute_retention: timedelta

    @classmethod
    def from_settings(cls) -> RetentionPolicy:
        return cls(late_usage_horizon=settings.VGPU_LATE_USAGE_HORIZON,
                   raw_margin=settings.VGPU_RAW_RETENTION_MARGIN,
                   minute_retention=settings.VGPU_MINUTE_RETENTION)

    @property
    def raw_retention(self) -> timedelta:
        return self.late_usage_horizon + self.raw_margin

    def problems(self) -> list[str]:
        """Why this policy would drop data still needed (empty: it is sound)."""
        problems = []
        if self.late_usage_horizon <= timedelta(0):
            problems.append(f"VGPU_LATE_USAGE_HORIZON_DAYS must be at least 1, got {self.late_usage_horizon.days}")
        if self.raw_margin < timedelta(days=1):
            # A batch accepted at the horizon's edge must still find its day when the rollup
            # (or a re-drive, or a re-pricing) reads it, and the day must not be dropped under it.
            problems.append(f"VGPU_RAW_RETENTION_MARGIN_DAYS must be at least 1, got {self.raw_margin.days}")
        if self.minute_retention < self.raw_retention:
            problems.append(
                f"VGPU_MINUTE_RETENTION_DAYS ({self.minute_retention.days}) must be at least the raw retention, "
                f"VGPU_LATE_USAGE_HORIZON_DAYS + VGPU_RAW_RETENTION_MARGIN_DAYS ({self.raw_retention.days}): "
                "a minute recomputed from raw samples needs the other minutes of its hour")
        return problems

    def raw_keep_from(self, now: datetime) -> datetime:
        return now - self.raw_retention

    def minute_keep_from(self, now: datetime) -> datetime:
        return now - self.minute_retention


class LedgerDataDropped(InvalidInput):
    """The ledger data a command needs was dropped by retention; `retained_from` is the first
    instant it is still complete for."""

    def __init__(self, message: str, *, retained_from: datetime) -> None:
        super().__init__(message)
        self.retained_from = retained_from


class RawSamplesDropped(LedgerDataDropped):
    """A rebuild / re-pricing over a range whose raw samples are gone."""


class MinutesPruned(LedgerDataDropped):
    """A read of the minute ledger over a range that was pruned."""


@dataclass(frozen=True)
class HeldPartition:
    """A day past its retention, kept because batches with samples in it are not rolled up."""

    table: str
    name: str
    day: date
    blocking_batches: int
    batch_ids: tuple[int, ...]


@dataclass(frozen=True)
class RetentionResult:
    dropped: tuple[str, ...]
    held: tuple[HeldPartition, ...]
    # Past retention, no batch in the way, but the table lock was not granted in time: next run.
    lock_busy: tuple[str, ...]
    batches_pruned: int = 0  # batches deleted with their GPU rows, their raw samples gone


@dataclass(frozen=True)
class RetentionState:
    """For /metrics: what retention holds back, and from when raw samples and minutes are complete."""

    held_partitions: dict[str, int]  # "raw" / "minute" -> partitions past retention kept for their batches
    held_bytes: dict[str, int]
    raw_retained_from: datetime | None  # None: nothing was ever dropped
    minutes_retained_from: datetime | None


def is_past_retention(day: date, *, keep_from: datetime) -> bool:
    """A day partition may go once every instant it holds is older than `keep_from`."""
    return day_bounds(day)[1] <= keep_from


def _kind(table: str) -> str:
    return "raw" if table == RAW_TABLE else "minute"


def _watermark(cur: CursorWrapper, kind: str) -> datetime | None:
    cur.execute(f"SELECT dropped_before FROM {_WATERMARKS} WHERE kind = %s", [kind])  # noqa: S608 - fixed name
    row = cur.fetchone()
    return None if row is None else row[0]


def require_raw_samples(*, start: datetime) -> None:
    """Refuse a recompute of the ledger from `start` on when raw samples before the end of a
    dropped day are gone (call it holding the rollup's lock, which retention takes to drop)."""
    with connection.cursor() as cur:
        retained_from = _watermark(cur, "raw")
    if retained_from is None or start >= retained_from:
        return
    policy = RetentionPolicy.from_settings()
    raise RawSamplesDropped(
        _("raw samples before %(earliest)s were dropped by retention (kept %(days)s days: the late-usage horizon "
          "plus VGPU_RAW_RETENTION_MARGIN_DAYS), so the ledger cannot be recomputed from %(start)s; the earliest "
          "instant that can be re-priced is %(earliest)s (UTC)")
        % {"earliest": retained_from.isoformat(), "days": policy.raw_retention.days, "start": start.isoformat()},
        retained_from=retained_from,
    )


def require_minutes_retained(*, start: datetime, lookback: timedelta = timedelta(0)) -> None:
    """Refuse a read of the minute ledger from `start - lookback` on when minutes before it were
    pruned; the message names the earliest `start` such a read may have."""
    with connection.cursor() as cur:
        retained_from = _watermark(cur, "minute")
    if retained_from is None or start - lookback >= retained_from:
        return
    policy = RetentionPolicy.from_settings()
    raise MinutesPruned(
        _("the minute ledger before %(retained)s was pruned (VGPU_MINUTE_RETENTION_DAYS = %(days)s); this reads "
          "minutes from %(lookback)s day(s) before its start, so the earliest start it may have is %(earliest)s "
          "(UTC), not %(start)s")
        % {"retained": retained_from.isoformat(), "days": policy.minute_retention.days, "lookback": lookback.days,
           "earliest": (retained_from + lookback).isoformat(), "start": start.isoformat()},
        retained_from=retained_from,
    )


def _blocking_batches(cur: CursorWrapper, day: date) -> tuple[int, tuple[int, ...]]:
    """Batches not rolled up (pending or quarantined) whose window meets the day. A batch's samples
    lie inside its window (ingest checks it), so this finds every one with samples in the day's
    partition without reading the partition; both conditions are served by partial indexes."""
    lo, hi = day_bounds(day)
    cur.execute(
        "SELECT id FROM billing_usagebatch WHERE (rolled_up_at IS NULL OR quarantined_at IS NOT NULL) "
        "AND window_start < %s AND window_end > %s ORDER BY id",
        [hi, lo],
    )
    ids = [row[0] for row in cur.fetchall()]
    return len(ids), tuple(ids[:_BLOCKER_IDS_SHOWN])


def _hold(cur: CursorWrapper, partition: DayPartition, count: int, ids: tuple[int, ...], now: datetime) -> HeldPartition:
    """Record the hold; log it only the first time (the hold row makes 'once' hold across runs and
    processes), then the metric and the runbook carry it."""
    cur.execute(
        f"INSERT INTO {_HOLDS} (partition_name, table_name, day, first_held_at, batch_ids) "  # noqa: S608 - fixed name
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (partition_name) DO NOTHING",
        [partition.name, partition.table, partition.day, now, list(ids)],
    )
    if cur.rowcount:
        log.warning(
            "event=retention_partition_held partition=%s day=%s blocking_batches=%s batch_ids=%s "
            "reason=batches with samples in it are pending or quarantined; it is dropped once they are rolled "
            "up (docs/operations.md, 'A partition is kept')",
            partition.name, partition.day, count, ",".join(map(str, ids)),
        )
    return HeldPartition(table=partition.table, name=partition.name, day=partition.day, blocking_batches=count,
                         batch_ids=ids)


def _drop(cur: CursorWrapper, partition: DayPartition) -> None:
    """Drop one day partition and raise its table's watermark. Raises OperationalError when the
    table lock is not granted within _DROP_LOCK_TIMEOUT."""
    _, hi = day_bounds(partition.day)
    cur.execute(f"SET LOCAL lock_timeout = '{_DROP_LOCK_TIMEOUT}'")
    cur.execute(f'DROP TABLE "{partition.name}"')
    cur.execute(
        f"INSERT INTO {_WATERMARKS} (kind, dropped_before) VALUES (%s, %s) "  # noqa: S608 - fixed name
        f"ON CONFLICT (kind) DO UPDATE SET dropped_before = greatest({_WATERMARKS}.dropped_before, "
        "EXCLUDED.dropped_before)",
        [_kind(partition.table), hi],
    )
    cur.execute(f"DELETE FROM {_HOLDS} WHERE partition_name = %s", [partition.name])  # noqa: S608 - fixed name
    cur.execute("SET LOCAL lock_timeout = DEFAULT")


def _retire(partition: DayPartition, *, now: datetime) -> HeldPartition | bool:
    """Hold the day (its batches are not rolled up) or drop it, in a transaction of its own: a
    drop locks the parent table until commit, so ingest waits for one drop at most, never for a
    whole run. Under the rollup's lock, so no rollup or rebuild reads the day while it goes and
    every later rebuild sees the raised watermark. False: the lock was busy, try next run."""
    try:
        with transaction.atomic(), connection.cursor() as cur:
            lock_ledger()
            count, ids = _blocking_batches(cur, partition.day)
            if count:
                return _hold(cur, partition, count, ids, now)
            _drop(cur, partition)
    except OperationalError as exc:  # lock_not_available: busy now, the next run tries again
        log.info("event=retention_drop_deferred partition=%s error=%s", partition.name, exc)
        return False
    forget_partition(partition.table, partition.day)
    return True


def apply_retention(*, now: datetime) -> RetentionResult:
    """Drop the raw and minute day partitions past their retention, except those held by batches
    not rolled up (pending or quarantined). Idempotent: a second run finds nothing to drop."""
    policy = RetentionPolicy.from_settings()
    if problems := policy.problems():
        # Celery processes do not run Django's system checks: refuse here too, dropping nothing.
        raise ValueError("retention settings are unsound, nothing dropped: " + "; ".join(problems))
    dropped: list[str] = []
    held: list[HeldPartition] = []
    busy: list[str] = []
    raw_days = {p.day for p in list_day_partitions(RAW_TABLE)}
    for table, keep_from in ((RAW_TABLE, policy.raw_keep_from(now)),
                             *((t, policy.minute_keep_from(now)) for t in MINUTE_TABLES)):
        for partition in list_day_partitions(table):
            if not is_past_retention(partition.day, keep_from=keep_from):
                break  # sorted by day: the rest are younger
            if table != RAW_TABLE and partition.day in raw_days:
                # Its raw day is still here (held, or its drop was deferred), so its minutes may
                # still be recomputed: they go after it.
                continue
            outcome = _retire(partition, now=now)
            if isinstance(outcome, HeldPartition):
                held.append(outcome)
            elif outcome:
                dropped.append(partition.name)
                if table == RAW_TABLE:
                    raw_days.discard(partition.day)
            else:
                busy.append(partition.name)
    if dropped:
        log.info("event=retention_dropped partitions=%s", ",".join(dropped))
    return RetentionResult(dropped=tuple(dropped), held=tuple(held), lock_busy=tuple(busy),
                           batches_pruned=_prune_batches())


def _prune_batches() -> int:
    """Delete the batches whose window ended before the raw watermark, with their GPU rows, a chunk
    per transaction. Only rolled-up ones: a pending or quarantined batch holds its raw day, so its
    rows stay with it. Nothing reads them after: their raw samples are gone, so no rollup or
    rebuild recomputes their minutes, and ingest refuses a window that old (a retry of it included)
    before it looks for a duplicate. Returns how many batches went."""
    with connection.cursor() as cur:
        before = _watermark(cur, "raw")
    if before is None:  # no raw day was ever dropped
        return 0
    pruned = 0
    while True:
        with transaction.atomic(), connection.cursor() as cur:
            # window_start first: the batches' window index finds them; window_end is the rule.
            cur.execute(
                "WITH gone AS (SELECT id FROM billing_usagebatch WHERE window_start < %s AND window_end <= %s "
                "AND rolled_up_at IS NOT NULL AND quarantined_at IS NULL ORDER BY id LIMIT %s), "
                "gpus AS (DELETE FROM billing_batchgpu WHERE batch_id IN (SELECT id FROM gone)) "
                "DELETE FROM billing_usagebatch WHERE id IN (SELECT id FROM gone)",
                [before, before, _PRUNE_CHUNK])
            deleted: int = cur.rowcount
        pruned += deleted
        if deleted < _PRUNE_CHUNK:
            break
    if pruned:
        log.info("event=retention_batches_pruned batches=%d before=%s", pruned, before.isoformat())
    return pruned


def get_retention_state(*, now: datetime) -> RetentionState:
    """Read-only, from the catalogue, the batches' partial indexes and the watermark table: cheap
    enough for every scrape. A partition counts as held when it is past its retention and batches
    in it are not rolled up, as the next run would find it (not merely due: the task runs hourly)."""
    policy = RetentionPolicy.from_settings()
    held: dict[str, int] = {"raw": 0, "minute": 0}
    held_bytes: dict[str, int] = {"raw": 0, "minute": 0}
    with connection.cursor() as cur:
        for table, keep_from in ((RAW_TABLE, policy.raw_keep_from(now)),
                                 *((t, policy.minute_keep_from(now)) for t in MINUTE_TABLES)):
            for partition in list_day_partitions(table):
                if not is_past_retention(partition.day, keep_from=keep_from):
                    break
                if _blocking_batches(cur, partition.day)[0]:
                    held[_kind(table)] += 1
                    cur.execute("SELECT pg_total_relation_size(%s::regclass)", [f'"{partition.name}"'])
                    held_bytes[_kind(table)] += int(cur.fetchone()[0])
        raw_from, minute_from = _watermark(cur, "raw"), _watermark(cur, "minute")
    return RetentionState(held_partitions=held, held_bytes=held_bytes, raw_retained_from=raw_from,
                          minutes_retained_from=minute_from)
