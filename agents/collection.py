"""Garbage collection kept out of the allocation tick (docs/allocation.md, Tick latency).

CPython's collector runs when allocations cross a threshold, wherever that happens: inside a tick,
a young-generation pass adds tens of microseconds to that tick's decision, and an occasional full
pass over everything the process imported adds milliseconds. Grants are late by that much. The
agent's loop is idle almost all of each 500 ms tick, so it collects there instead:

- at start, everything loaded so far (modules, the backend, the predictor) is frozen: it lives as
  long as the process, and a full pass then scans only what the agent made since;
- while the loop runs, automatic collection is off; after each tick the young generations are
  collected, and everything once a minute (of the process's own clock, not of the agent's: an agent
  metering history on a fast clock ticks 60 simulated seconds at a time, back to back, and a full
  pass after each of its ticks was half of its CPU). Reference counting frees most garbage at once
  anyway; only cycles wait, for at most one tick (the young ones) or a minute (the old ones);
- on the way out the collector is left as it was found.

Other threads (uploader, policy client, metrics) allocate under the same rule: their cycles are
collected at the next tick's end.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from types import TracebackType

__all__ = ["TickCollector"]

_FULL_EVERY_S = 60.0


class TickCollector:
    """``with TickCollector() as collector:`` around the loop, ``collector.between_ticks()`` after
    each tick's work. ``now`` is the clock the minute between full passes is read on (seconds)."""

    def __init__(self, *, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._last_full = 0.0
        self._was_enabled = gc.isenabled()

    def __enter__(self) -> TickCollector:
        self._was_enabled = gc.isenabled()
        gc.collect()  # what start-up left behind goes now, not frozen for good
        gc.freeze()
        gc.disable()
        self._last_full = self._now()
        return self

    def between_ticks(self) -> None:
        """Collect what the tick left: young generations every tick (a few µs), all once a minute."""
        now = self._now()
        if now - self._last_full >= _FULL_EVERY_S:
            self._last_full = now
            gc.collect(2)
        else:
            gc.collect(1)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        gc.unfreeze()  # a test process runs many agents: what one froze must stay collectable
        if self._was_enabled:
            gc.enable()
