"""The one clock the tests read.

Tests never call `timezone.now()`, `datetime.now()` or `date.today()` themselves (ruff bans them
under tests/, see tests/ruff.toml): they call `now()` here, or pass the product an explicit `now`.
`now()` refuses to answer while pytest is still collecting, because a value taken at import is
stale by the time its test runs: a suite started at 23:59 on the last day of a month collects in
one month and runs in the next. `make test-dates` runs the whole process tree at such instants.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

_collecting = True


def collection_finished() -> None:
    """Called by tests/conftest.py once pytest has collected every test."""
    global _collecting  # noqa: PLW0603 - one flag for the process, set once by tests/conftest.py
    _collecting = False


def now() -> datetime:
    """The wall clock in UTC (the same instant Django's `timezone.now()` gives)."""
    if _collecting:
        raise RuntimeError("read the clock inside a test or a fixture, not at import time: "
                           "a value taken while collecting is stale by the time the test runs")
    return datetime.now(UTC)  # noqa: TID251 - the one place tests read the wall clock


def month_start(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def wait_until_the_month_holds(past: timedelta) -> None:
    """For tests that run real processes on the real clock and need the last `past` to lie in the
    current month (budgets count the month to date): in the first `past` of a month, sleep until
    it does. Waits at most `past`, and only then."""
    wait = (month_start(now()) + past - now()).total_seconds()
    if wait > 0:
        time.sleep(wait)
