"""A ``Clock`` (``agents.clock``) that stands still until slept on: the tests' clock, and the
one ``vgpu-agent run --once-seconds N`` meters its N simulated seconds on (so it ships with
the agent)."""

from __future__ import annotations

from datetime import datetime, timedelta

from agents.clock import from_us, to_us

__all__ = ["FakeClock"]


class FakeClock:
    """A ``Clock`` that stands still until slept on; ``sleep`` advances it exactly.

    Time is kept in integer microseconds so that ticks never drift.
    """

    def __init__(self, *, start: datetime) -> None:
        self._start_us = to_us(start)
        self._elapsed_us = 0

    def now(self) -> datetime:
        return from_us(self._start_us + self._elapsed_us)

    def monotonic(self) -> float:
        return self._elapsed_us / 1_000_000

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot sleep a negative time ({seconds} s)")
        self._elapsed_us += round(seconds * 1_000_000)

    def advance(self, delta: timedelta) -> None:
        """Move time forward without a sleep (e.g. a stalled tick)."""
        self.sleep(delta.total_seconds())
