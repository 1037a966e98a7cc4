"""When a schedule's reports fall due, and which period a report covers (pure: no database).

A schedule recurs daily, weekly on a weekday or monthly on a day of the month, at a whole UTC hour.
A monthly day past the month's end (31 in April, 29 to 31 in February) falls on the month's last
day, so a "31st" report comes every month, on 28 February and on 29 February in a leap year."""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

__all__ = ["FREQUENCIES", "PERIODS", "Recurrence", "latest_occurrence", "next_occurrence", "report_period"]

FREQUENCIES = ("daily", "weekly", "monthly")
# The pages' quick periods (billing.web.views.quick_periods), and "fixed": the saved dates.
PERIODS = ("this-month", "last-month", "last-7-days", "fixed")
# Far enough back to meet any monthly occurrence (two months and a day).
_LOOK_BACK_DAYS = 63


@dataclass(frozen=True)
class Recurrence:
    frequency: str
    hour: int
    weekday: int | None = None  # 0 Monday … 6 Sunday, weekly only
    day_of_month: int | None = None  # 1 … 31, monthly only

    def falls_on(self, day: date) -> bool:
        if self.frequency == "daily":
            return True
        if self.frequency == "weekly":
            return day.weekday() == self.weekday
        return day.day == min(self.day_of_month or 1, calendar.monthrange(day.year, day.month)[1])


def _at(day: date, hour: int) -> datetime:
    return datetime(day.year, day.month, day.day, hour, tzinfo=UTC)


def latest_occurrence(rule: Recurrence, now: datetime) -> datetime:
    """The last occurrence at or before `now`."""
    today = now.astimezone(UTC).date()
    for back in range(_LOOK_BACK_DAYS):
        day = today - timedelta(days=back)
        if rule.falls_on(day) and _at(day, rule.hour) <= now:
            return _at(day, rule.hour)
    raise AssertionError(f"no occurrence of {rule} in {_LOOK_BACK_DAYS} days")  # every rule recurs monthly at most


def next_occurrence(rule: Recurrence, now: datetime) -> datetime:
    """The first occurrence after `now` (shown on the view's page)."""
    today = now.astimezone(UTC).date()
    for ahead in range(_LOOK_BACK_DAYS):
        day = today + timedelta(days=ahead)
        if rule.falls_on(day) and _at(day, rule.hour) > now:
            return _at(day, rule.hour)
    raise AssertionError(f"no occurrence of {rule} in {_LOOK_BACK_DAYS} days")


def report_period(period: str, *, on: date, saved: tuple[date, date]) -> tuple[date, date]:
    """The first and last day (both included) a view shows on day `on`: a quick period moves with
    the calendar, exactly as the page's link of that name does on that day; "fixed" keeps the
    saved dates."""
    if period == "this-month":
        return on.replace(day=1), on
    if period == "last-month":
        last = on.replace(day=1) - timedelta(days=1)
        return last.replace(day=1), last
    if period == "last-7-days":
        return on - timedelta(days=6), on
    return saved
