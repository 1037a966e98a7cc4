"""The ledger's data lifecycle: how long raw samples, minutes and hours are kept, dropping whole
day partitions (or pruning whole days of hours) past that, and analysing partitions whose
statistics are missing or stale.

Kept for (docs/operations.md, "Retention and disk"):
- raw day partitions: the late-usage horizon (ingest refuses older usage) plus a margin
  (VGPU_RAW_RETENTION_MARGIN): as long as a batch may still arrive or wait to be rolled up. They
  are an inbox: the rollup adds a batch's integral rows into the minutes and deletes them, so a day
  past its period holds only the rows of batches not rolled up (which hold it) and dead rows;
- minutes: VGPU_MINUTE_RETENTION, at least as long as raw days: the minutes are the store of the
  integrals, and a late batch adds into its minutes and prices each GPU-minute again with all its
  workloads, so they must be there for as long as one may arrive (and a rebuild re-prices them);
- batches and their GPU rows: as long as raw days (pruned once their window ends before the raw
  watermark, if rolled up and not quarantined): they give a re-pricing each GPU-minute's metered
  seconds and ingest its exactly-once, and neither can happen again past the late-usage horizon
  (ingest refuses such a window, a re-pricing that old is refused below);
- hours: VGPU_HOUR_RETENTION (13 months by default, at least the minute retention: an hour is
  recomputed from its minutes, so its minutes go first); a day of hours is deleted (the hour
  tables are not partitioned) one UTC day per transaction, and only once its day rows hold what
  its hours sum to, so no figure of the day ledger ever depends on a pruned hour; a day on which a
  rate card began or ended, or a GPU's hours differ in pricing, keeps its hours for good (the FOCUS
  reads could not tell it from its day rows; billing.ledger.exports);
- days: forever (billing history; invoices are stored documents and never read back from hours).

A day past its period is dropped with DROP TABLE of its partition, never a DELETE: no dead
tuples, no vacuum debt, the disk given back at once. A day that still holds samples of a batch
that is pending (not rolled up) or quarantined is kept, whatever its age: dropping it would
drop usage that was never billed. It is logged once (when first held), counted in
vgpu_ledger_retention_held_partitions, and dropped by the first run after its batches are done.

Each drop raises a watermark (`billing_ledger_retention`, migration 0018): the instant before
which raw days, with the batches of that time (or minutes), may be gone. A rebuild or a re-pricing
that starts before the raw or the minute watermark is refused (BatchesPruned), a paired report that reads minutes before the minute
watermark too (MinutesPruned), a read that picks hours before the hour watermark (HoursPruned):
recomputing or summing from what is left would give wrong numbers silently.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

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
    "PRUNED_HOUR_DAYS",
    "BatchesPruned",
    "HeldPartition",
    "HoursPruned",
    "HoursPrunedResult",
    "LedgerDataDropped",
    "MinutesPruned",
    "RetentionPolicy",
    "RetentionResult",
    "RetentionState",
    "apply_retention",
    "get_retention_state",
    "hours_retained_from",
    "is_past_retention",
    "require_hours_retained",
    "require_hours_where_days_cannot_answer",
    "require_minutes_retained",
    "require_repriceable",
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
# Workloads deleted per transaction: each holds the ledger lock (rollups skip a cycle meanwhile), and a
# fleet whose pods churn retires millions a day.
_WORKLOAD_CHUNK = 50_000


@dataclass(frozen=True)
class RetentionPolicy:
    late_usage_horizon: timedelta
    raw_margin: timedelta
    minute_retention: timedelta
    hour_retention: timedelta

    @classmethod
    def from_settings(cls) -> RetentionPolicy:
        return cls(late_usage_horizon=settings.VGPU_LATE_USAGE_HORIZON,
                   raw_margin=settings.VGPU_RAW_RETENTION_MARGIN,
                   minute_retention=settings.VGPU_MINUTE_RETENTION,
                   hour_retention=settings.VGPU_HOUR_RETENTION)

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
                "a late batch adds into the minutes it meets, which must still hold every workload's integrals")
        if self.hour_retention < self.minute_retention:
            problems.append(
                f"VGPU_HOUR_RETENTION_DAYS ({self.hour_retention.days}) must be at least VGPU_MINUTE_RETENTION_DAYS "
                f"({self.minute_retention.days}): an hour recomputed from its minutes needs every hour of its day "
                "for the day's row")
        return problems

    def raw_keep_from(self, now: datetime) -> datetime:
        return now - self.raw_retention

    def minute_keep_from(self, now: datetime) -> datetime:
        return now - self.minute_retention

    def hour_keep_from(self, now: datetime) -> datetime:
        return now - self.hour_retention


class LedgerDataDropped(InvalidInput):
    """The ledger data a command needs was dropped by retention; `retained_from` is the first
    instant it is still complete for."""

    def __init__(self, message: str, *, retained_from: datetime) -> None:
        super().__init__(message)
        self.retained_from = retained_from


class BatchesPruned(LedgerDataDropped):
    """A rebuild / re-pricing over a range whose batches (each GPU-minute's metered seconds) or minutes
    (the stored integrals) retention pruned."""


class MinutesPruned(LedgerDataDropped):
    """A read of the minute ledger over a range that was pruned."""


class HoursPruned(LedgerDataDropped):
    """A read of the hour ledger (hour buckets, or a period not of whole UTC days) over a range that
    was pruned."""


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
    batches_pruned: int = 0  # batches deleted with their GPU rows, their raw days gone
    workloads_pruned: int = 0  # workloads whose minute days are all gone (billing_workload)
    hours: HoursPrunedResult | None = None  # None: no day of hours was past its retention


@dataclass(frozen=True)
class HoursPrunedResult:
    """The UTC days whose hour rows one run deleted, how many rows, the days past retention whose hours
    are kept for good, and the first day past retention held until fixed (its day rows do not hold what
    its hours sum to, or its minutes are still there) with why."""

    days: tuple[date, ...]
    usage_rows: int
    gpu_rows: int
    held_day: date | None = None
    held_reason: str = ""
    # Days past retention whose hours are kept for good, with why (billing.ledger.exports reads them).
    kept_days: tuple[tuple[date, str], ...] = ()


@dataclass(frozen=True)
class RetentionState:
    """For /metrics: what retention holds back, and from when raw samples and minutes are complete."""

    held_partitions: dict[str, int]  # "raw" / "minute" -> partitions past retention kept for their batches
    held_bytes: dict[str, int]
    raw_retained_from: datetime | None  # None: nothing was ever dropped
    minutes_retained_from: datetime | None
    hours_retained_from: datetime | None = None


def is_past_retention(day: date, *, keep_from: datetime) -> bool:
    """A day partition may go once every instant it holds is older than `keep_from`."""
    return day_bounds(day)[1] <= keep_from


def _kind(table: str) -> str:
    return "raw" if table == RAW_TABLE else "minute"


def _watermark(cur: CursorWrapper, kind: str) -> datetime | None:
    cur.execute(f"SELECT dropped_before FROM {_WATERMARKS} WHERE kind = %s", [kind])  # noqa: S608 - fixed name
    row = cur.fetchone()
    return None if row is None else row[0]


def require_repriceable(*, start: datetime) -> None:
    """Refuse a re-pricing of the ledger from `start` on when what it prices is gone: the batches'
    GPU rows (the metered seconds), pruned with the raw days, or the minutes (the integrals). Call it
    holding the rollup's lock, which retention takes to drop."""
    with connection.cursor() as cur:
        marks = [m for m in (_watermark(cur, "raw"), _watermark(cur, "minute")) if m is not None]
    retained_from = max(marks, default=None)
    if retained_from is None or start >= retained_from:
        return
    policy = RetentionPolicy.from_settings()
    raise BatchesPruned(
        _("batches and minutes before %(earliest)s were pruned by retention (kept %(days)s days: the late-usage "
          "horizon plus VGPU_RAW_RETENTION_MARGIN_DAYS), so the ledger cannot be re-priced from %(start)s; the "
          "earliest instant that can be re-priced is %(earliest)s (UTC)")
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


def hours_retained_from() -> datetime | None:
    """The first instant from which the hour ledger is complete (None: no hour was ever pruned)."""
    with connection.cursor() as cur:
        return _watermark(cur, "hour")


def require_hours_retained(*, start: datetime) -> None:
    """Refuse a read of the hour ledger from `start` on when hours before it were pruned; the
    message names the earliest hour still kept. A read of whole UTC days reads the day ledger
    (kept for good) and does not call this."""
    retained_from = hours_retained_from()
    if retained_from is None or start >= retained_from:
        return
    policy = RetentionPolicy.from_settings()
    raise HoursPruned(
        _("the hour ledger before %(earliest)s was pruned (VGPU_HOUR_RETENTION_DAYS = %(days)s), so hourly figures "
          "from %(start)s cannot be shown; the earliest hour kept is %(earliest)s (UTC). Whole UTC days before it "
          "are still answered from the day ledger")
        % {"earliest": retained_from.isoformat(), "days": policy.hour_retention.days, "start": start.isoformat()},
        retained_from=retained_from,
    )


# The UTC days meeting [%(start)s, %(end)s) whose hours retention pruned, as a CTE body: before the hour
# watermark and without hour rows (a day's hours go in one transaction, so a day has all or none). A read
# answers these days from the day ledger and every other day from hours; deciding per day in the read's
# own statement means a prune committing meanwhile cannot make a day be read from neither or both.
PRUNED_HOUR_DAYS = (
    "SELECT d.day FROM generate_series(date_trunc('day', %(start)s::timestamptz, 'UTC'), %(end)s::timestamptz, "  # noqa: S608 - fixed name
    "interval '1 day') AS d(day) WHERE d.day < "
    f"(SELECT dropped_before FROM {_WATERMARKS} WHERE kind = 'hour') "
    "AND NOT EXISTS (SELECT 1 FROM billing_gpuhour h WHERE h.hour >= d.day AND h.hour < d.day + interval '1 day')"
)


def _midnight_utc(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def require_hours_where_days_cannot_answer(*, start: datetime, end: datetime) -> None:
    """Refuse a per-day read of [start, end) (one that answers pruned days from the day ledger) whose
    first or last day is only partly inside it and may have been pruned: a day row cannot be cut."""
    for at in (start, end):
        if at != _midnight_utc(at):
            require_hours_retained(start=_midnight_utc(at))


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
                           batches_pruned=_prune_batches(), workloads_pruned=_prune_workloads(),
                           hours=_prune_hours(policy.hour_keep_from(now)))


def _next_hour_day(cur: CursorWrapper, since: datetime | None) -> date | None:
    """The UTC day of the oldest hour row from `since` on (of either table: both are read, each by its
    hour index)."""
    lo = since or datetime.min.replace(tzinfo=UTC)
    cur.execute("SELECT least((SELECT min(hour) FROM billing_gpuhour WHERE hour >= %(lo)s), "
                "(SELECT min(hour) FROM billing_usagehour WHERE hour >= %(lo)s))", {"lo": lo})
    oldest = cur.fetchone()[0]
    return None if oldest is None else oldest.astimezone(UTC).date()


# A day whose hours could not be rebuilt from its day rows by the per-day reads (FOCUS files, which
# price each hour under the rate card of its hour): a card of a model present that day began or ended
# inside it, or some GPU's hours differ in model, currency or being priced (its day row holds one of
# each). Its hours are kept for good. Energy prices need no such rule: they are set per UTC date
# (LocationRate, NodeLocation), so one applies all day by construction.
_CARD_CHANGED = (
    "SELECT count(*) FROM billing_ratecard r WHERE r.gpu_model IN (SELECT gpu_model FROM billing_gpuhour "
    "WHERE hour >= %(lo)s AND hour < %(hi)s) AND ((r.effective_from > %(lo)s AND r.effective_from < %(hi)s) "
    "OR (r.effective_to > %(lo)s AND r.effective_to < %(hi)s))"
)
_GPU_HOURS_DIFFER = (
    "SELECT count(*) FROM (SELECT 1 FROM billing_gpuhour WHERE hour >= %(lo)s AND hour < %(hi)s "
    "GROUP BY node_id, gpu_uuid HAVING count(DISTINCT gpu_model) > 1 OR count(DISTINCT currency) > 1 "
    "OR bool_and(priced) <> bool_or(priced)) x"
)


def _why_hours_kept(cur: CursorWrapper, lo: datetime, hi: datetime) -> str:
    """Why the day [lo, hi) keeps its hours for good ('' when its day rows can stand for them)."""
    cur.execute(_CARD_CHANGED, {"lo": lo, "hi": hi})
    if cards := int(cur.fetchone()[0]):
        return f"{cards} rate card(s) of its GPU models began or ended inside it"
    cur.execute(_GPU_HOURS_DIFFER, {"lo": lo, "hi": hi})
    if gpus := int(cur.fetchone()[0]):
        return f"{gpus} GPU(s) whose hours differ in model, currency or being priced"
    return ""


@dataclass(frozen=True)
class _Kept:
    """A day not pruned: for good (its hours say what its day rows cannot), or until fixed (stop there)."""

    reason: str
    for_good: bool


# Keys of the (node, GPU, day) and workload-day groups a day row sums, and the figures compared: a
# day row that exists but is stale (hours written in bulk without rebuild_days) holds the day too.
_GPU_DAY_UNMATCHED = (
    "SELECT count(*) FROM (SELECT node_id, gpu_uuid, sum(metered_seconds) AS s, sum(card_cost) AS c "
    "FROM billing_gpuhour WHERE hour >= %(lo)s AND hour < %(hi)s GROUP BY 1, 2) h WHERE NOT EXISTS ("
    "SELECT 1 FROM billing_gpuday d WHERE d.node_id = h.node_id AND d.gpu_uuid = h.gpu_uuid AND d.day = %(lo)s "
    "AND d.metered_seconds = h.s AND d.card_cost = h.c)"
)
_WORKLOAD = ("tenant", "namespace", "pod", "container", "pod_uid", "sla_tier")
_USAGE_DAY_UNMATCHED = (
    f"SELECT count(*) FROM (SELECT node_id, gpu_uuid, {', '.join(_WORKLOAD)}, sum(seconds) AS s, "  # noqa: S608 - constant names
    "sum(charge) AS c, sum(idle_share) AS i FROM billing_usagehour WHERE hour >= %(lo)s AND hour < %(hi)s "
    f"GROUP BY {', '.join(str(i) for i in range(1, 3 + len(_WORKLOAD)))}) h WHERE NOT EXISTS ("
    "SELECT 1 FROM billing_usageday d WHERE d.node_id = h.node_id AND d.gpu_uuid = h.gpu_uuid AND d.day = %(lo)s "
    + "".join(f"AND d.{k} = h.{k} " for k in _WORKLOAD)
    + "AND d.seconds = h.s AND d.charge = h.c AND d.idle_share = h.i)"
)


def _day_rows_missing(cur: CursorWrapper, lo: datetime, hi: datetime) -> int:
    """How many GPU-day and workload-day groups of the day's hours have no day row equal to their sum."""
    missing = 0
    for sql in (_GPU_DAY_UNMATCHED, _USAGE_DAY_UNMATCHED):
        cur.execute(sql, {"lo": lo, "hi": hi})
        missing += int(cur.fetchone()[0])
    return missing


def _prune_hour_day(day: date) -> tuple[int, int] | _Kept:
    """Delete one UTC day of hour rows and raise the hour watermark past it, in one transaction under
    the exclusive ledger lock (so no rebuild_days reads the day meanwhile and every later one sees
    the watermark). Returns (usage rows, GPU rows) deleted, or why the day is kept."""
    lo, hi = day_bounds(day)
    with transaction.atomic(), connection.cursor() as cur:
        lock_ledger()
        if reason := _why_hours_kept(cur, lo, hi):
            return _Kept(reason, for_good=True)
        if missing := _day_rows_missing(cur, lo, hi):
            return _Kept(f"{missing} day rows missing or not equal to the sum of their hours (run rebuild_days)",
                         for_good=False)
        cur.execute("DELETE FROM billing_usagehour WHERE hour >= %s AND hour < %s", [lo, hi])
        usage_rows = int(cur.rowcount)
        cur.execute("DELETE FROM billing_gpuhour WHERE hour >= %s AND hour < %s", [lo, hi])
        gpu_rows = int(cur.rowcount)
        cur.execute(
            f"INSERT INTO {_WATERMARKS} (kind, dropped_before) VALUES ('hour', %s) "  # noqa: S608 - fixed name
            f"ON CONFLICT (kind) DO UPDATE SET dropped_before = greatest({_WATERMARKS}.dropped_before, "
            "EXCLUDED.dropped_before)",
            [hi],
        )
    return usage_rows, gpu_rows


def _prune_hours(keep_from: datetime) -> HoursPrunedResult | None:
    """Delete the hour rows of each UTC day wholly older than `keep_from`, oldest first, a day per
    transaction (at 10,000 GPUs a day is 3.8 M usage rows and 240,000 GPU rows). A day whose hours say
    what its day rows cannot (_why_hours_kept) keeps them for good and the run goes on past it. A day
    whose minute partitions are still there (held with its raw day) may still have hours recomputed, and
    one whose day rows do not hold its hours' sums would lose figures: either stops the run there, so
    every hour after the hour watermark is kept, and before it a day has all its hours or none.
    Idempotent: a second run prunes no day."""
    minute_days = {p.day for table in MINUTE_TABLES for p in list_day_partitions(table)}
    days: list[date] = []
    kept: list[tuple[date, str]] = []
    usage_rows = gpu_rows = 0
    held_day, reason = None, ""
    since: datetime | None = None
    while True:
        with connection.cursor() as cur:
            day = _next_hour_day(cur, since)
        if day is None or not is_past_retention(day, keep_from=keep_from):
            break
        since = day_bounds(day)[1]
        outcome = (_Kept("its minute partitions are still there (held with its raw day)", for_good=False)
                   if day in minute_days else _prune_hour_day(day))
        if isinstance(outcome, _Kept) and outcome.for_good:
            kept.append((day, outcome.reason))
            continue
        if isinstance(outcome, _Kept):
            held_day, reason = day, outcome.reason
            break
        days.append(day)
        usage_rows, gpu_rows = usage_rows + outcome[0], gpu_rows + outcome[1]
    _log_hours(days, kept, held_day, reason, (usage_rows, gpu_rows))
    if not days and not kept and held_day is None:
        return None
    return HoursPrunedResult(days=tuple(days), usage_rows=usage_rows, gpu_rows=gpu_rows, held_day=held_day,
                             held_reason=reason, kept_days=tuple(kept))


def _log_hours(days: list[date], kept: list[tuple[date, str]], held_day: date | None, reason: str,
               rows: tuple[int, int]) -> None:
    for day, why in kept:
        log.info("event=retention_hours_kept day=%s reason=%s", day, why)
    if held_day is not None:
        log.warning("event=retention_hours_held day=%s reason=%s", held_day, reason)
    if days:
        log.info("event=retention_hours_pruned days=%s usage_rows=%d gpu_rows=%d",
                 ",".join(d.isoformat() for d in days), *rows)


def _delete_in_chunks(sql: str, params: list[Any], *, chunk: int, locked: bool) -> int:
    """Run a DELETE whose last parameter is its chunk's size, a transaction per chunk (under the
    ledger lock when `locked`), until a chunk comes back short. Returns the rows deleted."""
    total = 0
    while True:
        with transaction.atomic(), connection.cursor() as cur:
            if locked:
                lock_ledger()
            cur.execute(sql, [*params, chunk])
            deleted: int = cur.rowcount
        total += deleted
        if deleted < chunk:
            return total


def _prune_batches() -> int:
    """Delete the batches whose window ended before the raw watermark, with their GPU rows, a chunk
    per transaction. Only rolled-up ones: a pending or quarantined batch holds its raw day, so its
    rows stay with it. Nothing reads them after: a re-pricing that old is refused (require_repriceable),
    and ingest refuses a window that old (a retry of it included)
    before it looks for a duplicate. Returns how many batches went."""
    with connection.cursor() as cur:
        before = _watermark(cur, "raw")
    if before is None:  # no raw day was ever dropped
        return 0
    # window_start first: the batches' window index finds them; window_end is the rule.
    pruned = _delete_in_chunks(
        "WITH gone AS (SELECT id FROM billing_usagebatch WHERE window_start < %s AND window_end <= %s "
        "AND rolled_up_at IS NOT NULL AND quarantined_at IS NULL ORDER BY id LIMIT %s), "
        "gpus AS (DELETE FROM billing_batchgpu WHERE batch_id IN (SELECT id FROM gone)) "
        "DELETE FROM billing_usagebatch WHERE id IN (SELECT id FROM gone)",
        [before, before], chunk=_PRUNE_CHUNK, locked=False)
    if pruned:
        log.info("event=retention_batches_pruned batches=%d before=%s", pruned, before.isoformat())
    return pruned


def _prune_workloads() -> int:
    """Delete the workloads (billing_workload) whose latest minute lies before the minute watermark:
    every minute day up to their last_day is dropped, so no minute row names them, and the hour, day
    and month ledgers spell the names out. A chunk per transaction, under the ledger lock: a rollup
    in flight may have just found one of them for a late minute and be about to raise its last_day
    (it takes the shared lock, so it has either committed that or not begun). Returns how many went."""
    with connection.cursor() as cur:
        before = _watermark(cur, "minute")
    if before is None:  # no minute day was ever dropped
        return 0
    pruned = _delete_in_chunks(
        "DELETE FROM billing_workload WHERE id IN (SELECT id FROM billing_workload WHERE last_day < %s "
        "ORDER BY last_day LIMIT %s)", [before.astimezone(UTC).date()], chunk=_WORKLOAD_CHUNK, locked=True)
    if pruned:
        log.info("event=retention_workloads_pruned workloads=%d before=%s", pruned, before.isoformat())
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
        raw_from, minute_from, hour_from = _watermark(cur, "raw"), _watermark(cur, "minute"), _watermark(cur, "hour")
    return RetentionState(held_partitions=held, held_bytes=held_bytes, raw_retained_from=raw_from,
                          minutes_retained_from=minute_from, hours_retained_from=hour_from)
