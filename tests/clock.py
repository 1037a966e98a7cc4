"""The one clock the tests read.

Tests never call `timezone.now()`, `datetime.now()` or `date.today()` themselves (ruff bans them
under tests/, see tests/ruff.toml): they call `now()` here, or pass the product an explicit `now`.
`now()` refuses to answer while pytest is still collecting, because a value taken at import is
stale by the time its test runs: a suite started at 23:59 on the last day of a month collects in
one month and runs in the next. `make test-dates` runs the whole process tree at such instants.
"""

from __future__ import annotations

from datetime import UTC, datetime

_collecting = True


def collection_finished() -> None:
    """Called by tests/conftest.py once pytest has collected every test."""
    global _collecting
    _collecting = False


def now() -> datetime:
    """The wall clock in UTC (the same instant Django's `timezone.now()` gives)."""
    if _collecting:
        raise RuntimeError("read the clock inside a test or a fixture, not at import time: "
                           "a value taken while collecting is stale by the time the test runs")
    return datetime.now(UTC)  # noqa: TID251 - the one place tests read the wall clock
