"""The real clock and UTC time helpers shared by the meter, spool and uploader."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

__all__ = ["SystemClock", "ceil_to_seconds", "from_us", "to_us", "utc_now"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US_PER_S = 1_000_000


def utc_now() -> datetime:
    return datetime.now(UTC)


def to_us(moment: datetime) -> int:
    """Microseconds since the Unix epoch; ``moment`` must be timezone-aware."""
    if moment.tzinfo is None:
        raise ValueError(f"naive datetime {moment.isoformat()} (aware UTC required)")
    return (moment - _EPOCH) // timedelta(microseconds=1)


def from_us(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def ceil_to_seconds(moment: datetime, *, seconds: int = 1) -> datetime:
    """The first instant >= ``moment`` that is a whole multiple of ``seconds`` UTC."""
    step = seconds * _US_PER_S
    return from_us(-(-to_us(moment) // step) * step)


class SystemClock:
    """``Clock`` backed by the operating system."""

    def now(self) -> datetime:
        return utc_now()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)
