"""Helpers the agent's tests share (not fakes: nothing here stands in for an edge)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from agents.spool import Spool


def wait_until(predicate: Callable[[], bool], *, timeout_s: float = 5.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true (for effects of background watches); raise after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached within {timeout_s} s")
        time.sleep(0.01)


def evidence(spool: Spool, batch: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-second samples the spool keeps for a batch (it sends their per-minute integrals)."""
    start, end = (datetime.fromisoformat(batch["window"][k].replace("Z", "+00:00")) for k in ("start", "end"))
    return [s for s in spool.export_samples(start=start, end=end) if s["batch_seq"] == batch["batch_seq"]]
