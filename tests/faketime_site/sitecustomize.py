"""Loaded by every Python process of a `make test-dates` run (tests/dates.py puts this folder on
PYTHONPATH), and only there.

Debian's libfaketime 0.9.10 shifts the deadline of clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)
by the fake offset even when FAKETIME_DONT_FAKE_MONOTONIC=1 (fixed upstream after 0.9.10), so
CPython's time.sleep fails with EINVAL. A sleep through select() takes a relative timeout, which
libfaketime passes through untouched. Monotonic clocks stay real: with them faked, every
threading wait with a timeout (sem_clockwait, which 0.9.10 does not intercept) would hang.
"""

import os
import select
import time

if os.environ.get("FAKETIME") and os.environ.get("FAKETIME_DONT_FAKE_MONOTONIC") == "1":
    _monotonic = time.monotonic

    def _sleep(seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        deadline = _monotonic() + seconds
        while (left := deadline - _monotonic()) > 0:
            select.select([], [], [], left)

    time.sleep = _sleep
