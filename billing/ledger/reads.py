"""Which ledger table a read uses: the day ledger for a period of whole UTC days, else the hour
ledger (`ledger_for`, the one place that picks). The hour ledger is pruned past
VGPU_HOUR_RETENTION_DAYS, the day ledger never: a read that needs hours from before the earliest
hour kept is refused (HoursPruned, naming it) rather than summing what is left. The read functions of billing.ledger.totals,
.series and .exports take a period and pick through here; callers outside the ledger never see
a table or a model.

Both tables of a granularity have the same columns besides the time column `at` (the start of
the hour or of the UTC day); a day row keeps the first and last hour it saw usage in.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.db.models import F, Q, Sum

from billing.ledger.models import GpuDay, GpuHour, UsageDay, UsageHour
from billing.ledger.retention import require_hours_retained

__all__ = ["DAYS", "HOURS", "Granularity", "Ledger", "bucketed_ledger", "fetch_rows", "hour_ledger", "ledger_for",
           "period_read_cursor"]

Granularity = Literal["hour", "day"]
_Row = TypeVar("_Row")


def fetch_rows(cur: CursorWrapper, row_type: type[_Row]) -> list[_Row]:
    """Each result row as a `row_type`, its fields matched to the statement's column names (never
    read by position): a column the type lacks, or a field the statement lacks, is a TypeError
    at the first row rather than a value in the wrong field."""
    names = [column.name for column in cur.description]
    return [row_type(**dict(zip(names, values, strict=True))) for values in cur.fetchall()]


@dataclass(frozen=True)
class Ledger:
    """One ledger granularity: its two tables and their column names."""

    at: Granularity
    usage: type[UsageHour] | type[UsageDay]
    gpu: type[GpuHour] | type[GpuDay]
    # First/last ledger hour with usage: the hour itself, or the day row's first_hour/last_hour.
    first_hour: str
    last_hour: str

    @property
    def usage_table(self) -> str:
        return self.usage._meta.db_table

    @property
    def gpu_table(self) -> str:
        return self.gpu._meta.db_table

    def usage_rows(self, start: datetime, end: datetime) -> Any:
        """The usage rows of [start, end) (a QuerySet of UsageHour or UsageDay). For the ledger's own
        reads; in flight (the move into billing.ledger): queries/portal.py still aggregates these itself."""
        return self.usage.objects.filter(**{f"{self.at}__gte": start, f"{self.at}__lt": end})

    def gpu_rows(self, start: datetime, end: datetime) -> Any:
        return self.gpu.objects.filter(**{f"{self.at}__gte": start, f"{self.at}__lt": end})

    def unpriced_seconds(self) -> Sum:
        """Metered seconds of the GPU-hours that were not (wholly) priced."""
        if self.gpu is GpuDay:
            return Sum("unpriced_seconds")
        return Sum("metered_seconds", filter=Q(priced=False))

    def priced_rows(self) -> Q:
        """GPU rows with some priced hour (whose currency is the period's)."""
        if self.gpu is GpuDay:
            return Q(metered_seconds__gt=F("unpriced_seconds"))
        return Q(priced=True)


HOURS = Ledger("hour", UsageHour, GpuHour, first_hour="hour", last_hour="hour")
DAYS = Ledger("day", UsageDay, GpuDay, first_hour="first_hour", last_hour="last_hour")


def _midnight(at: datetime) -> bool:
    at = at.astimezone(UTC)
    return (at.hour, at.minute, at.second, at.microsecond) == (0, 0, 0, 0)


def hour_ledger(start: datetime) -> Ledger:
    """The hour ledger for a read from `start` on; HoursPruned when retention pruned hours after it."""
    require_hours_retained(start=start)
    return HOURS


def ledger_for(start: datetime, end: datetime) -> Ledger:
    """The day ledger for a period of whole UTC days (what the period picker gives), else hours."""
    return DAYS if _midnight(start) and _midnight(end) else hour_ledger(start)


def bucketed_ledger(start: datetime, end: datetime, granularity: Granularity) -> Ledger:
    """Hour buckets need the hour ledger; day buckets read days when the period is whole days.
    (Every read of the ledger picks through this module's `ledger_for`, so one patch of it makes
    them all read hours: tests/billing/test_daily_ledger.py proves days equal hours that way.)"""
    return ledger_for(start, end) if granularity == "day" else hour_ledger(start)


# Planner settings for the reads over a period's rows (period_read_cursor), measured at
# 800 GPUs x 31 days (bench/web_pages.py). The planner estimates the join of usage rows to their GPU
# rows on (gpu_uuid, window) as the product of the two columns' selectivities, far too few rows, and
# probes an index once per row in a nested loop: hash joins were 2-5x faster. The sorts of the
# per-workload groups spilled to disk at the default 4 MB. JIT compilation (~0.3 s) cost more than it
# saved on these sub-second reads.
_PERIOD_READ_SETTINGS = {"enable_nestloop": "off", "jit": "off", "work_mem": "32MB"}


@contextmanager
def period_read_cursor(extra: dict[str, str] | None = None) -> Iterator[CursorWrapper]:
    """A cursor under _PERIOD_READ_SETTINGS (and `extra`, a statement's own), for the statements run
    with it only: put back as they were afterwards, for a transaction that was already open
    (set_config(..., true) lasts a transaction)."""
    settings = {**_PERIOD_READ_SETTINGS, **(extra or {})}
    with transaction.atomic(), connection.cursor() as cur:
        names = list(settings)
        cur.execute("SELECT " + ", ".join(f"current_setting('{n}')" for n in names))
        before = cur.fetchone()
        _set_local(cur, settings)
        yield cur
        _set_local(cur, dict(zip(names, before, strict=True)))


def _set_local(cur: Any, values: dict[str, str]) -> None:
    cur.execute("SELECT " + ", ".join(["set_config(%s, %s, true)"] * len(values)),
                [x for item in values.items() for x in item])
