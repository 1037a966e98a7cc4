"""Helpers the agent's tests share (not fakes: nothing here stands in for an edge)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], *, timeout_s: float = 5.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true (for effects of background watches); raise after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached within {timeout_s} s")
        time.sleep(0.01)
