"""Months and billing periods as the service counts them. Pure: no ORM, no settings, no clock.

A billing period is a calendar month in UTC, named by its first day (a `date`) and written
YYYY-MM. Every module that needs a month's bounds, its name or the month before takes them from
here, so an invoice, a budget, a FOCUS dataset and a page agree on where a month begins and ends.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from billing.errors import InvalidInput

__all__ = ["floor_to", "last_day", "month_bounds", "month_of", "parse_month", "previous_month", "utc_midnight"]


def parse_month(text: str) -> date:
    """The month named YYYY-MM, as its first day; anything else is `InvalidInput`."""
    try:
        parsed = datetime.strptime(text, "%Y-%m")  # noqa: DTZ007 - a calendar month, no time of day
    except ValueError as exc:
        raise InvalidInput(f"month {text!r} must look like YYYY-MM") from exc
    return date(parsed.year, parsed.month, 1)


def month_bounds(month: date) -> tuple[datetime, datetime]:
    """[start, end) of `month` in UTC: midnight of its first day to midnight of the next month's."""
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    end = datetime(month.year + (month.month == 12), month.month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def month_of(at: datetime) -> date:
    """The month `at` falls in (its first day), by `at`'s own date: callers pass UTC instants."""
    return at.date().replace(day=1)


def previous_month(month: date) -> date:
    """The month before `month` (both as first days)."""
    return (month - timedelta(days=1)).replace(day=1)


def last_day(end: datetime) -> date:
    """The last UTC day a period [start, `end`) includes: a form's "to 2026-12-01 (inclusive)" is
    stored as the instant after it, 2026-12-02 00:00, and shown and named by 2026-12-01 again."""
    return (end - timedelta(microseconds=1)).astimezone(UTC).date()


def utc_midnight(at: datetime) -> datetime:
    """The start of the UTC day `at` falls in."""
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def floor_to(at: datetime, unit: timedelta) -> datetime:
    """`at` truncated to a multiple of `unit` since the epoch (whole UTC hours, UTC midnights for days)."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + (at - epoch) // unit * unit
