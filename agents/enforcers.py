"""Enforcers: how grants take effect on the node (docs/design.md, Enforcement)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agents.interfaces import Grant

__all__ = ["DryRunEnforcer"]

log = logging.getLogger(__name__)


class DryRunEnforcer:
    """Logs grants instead of applying them; one DEBUG line per grant that changed."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[float, float]] = {}

    def apply(self, grants: Sequence[Grant]) -> None:
        current: dict[tuple[str, str], tuple[float, float]] = {}
        for g in grants:
            key = (g.gpu, g.workload.key)
            current[key] = (g.mem_mb, g.sm)
            if self._last.get(key) != current[key]:
                log.debug(
                    "event=grant_dry_run gpu=%s workload=%s mem_mb=%.1f sm=%.2f",
                    g.gpu,
                    g.workload.key,
                    g.mem_mb,
                    g.sm,
                )
        self._last = current
