"""Right-sizing a workload's GPU memory request, and the efficiency ratios beside it (docs/drilldown.md).
Pure: no Django, no ORM, no clock; the drill-down's query feeds it what the ledger knows.

The ledger keeps sums, never samples: per hour, a container's MB·s used and its metered seconds on
each GPU. So the largest thing we can honestly call "peak" is the peak hour's mean — the highest
hourly average of memory in use per GPU. A spike inside an hour is invisible here, which is why the
rule adds headroom on top of that peak and never goes below it:

    target    = peak-hour mean × (1 + HEADROOM), rounded up to whole GiB (at least 1 GiB)
    unknown   the request is not known: no suggestion (never a guess)
    raise     the peak-hour mean exceeds the request → the target (the workload outgrew it)
    lower     the target is below the request → the target
    fits      otherwise → keep the request

so a suggestion is never below the peak-hour mean and never above the request unless use exceeded
the request (tests/billing/test_rightsizing.py proves both with hypothesis). The rule is stated on
the page (templates/billing/explore.html) and in docs/drilldown.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

__all__ = [
    "HEADROOM",
    "STEP_MB",
    "VERDICTS",
    "MemoryUse",
    "Suggestion",
    "gib",
    "mean_mb",
    "peak_hour_mean_mb",
    "percent_of",
    "suggest_memory_request",
]

# 30 % above the peak hour's mean: an hour's mean hides spikes inside the hour, and a too-small
# request costs an out-of-memory kill, which is dearer than the memory.
HEADROOM = Decimal("0.30")
# Requests are suggested in whole GiB, as people write them (16Gi), never to the megabyte.
STEP_MB = Decimal(1024)
VERDICTS = ("unknown", "raise", "lower", "fits")
_ZERO = Decimal(0)


@dataclass(frozen=True)
class MemoryUse:
    """What the ledger says about one container's memory, per GPU: its request (None when no
    agent reported one), its mean over the period's metered seconds and its peak hour's mean."""

    request_mb: Decimal | None
    mean_used_mb: Decimal
    peak_hour_mean_mb: Decimal


@dataclass(frozen=True)
class Suggestion:
    verdict: str  # one of VERDICTS
    request_mb: Decimal | None
    suggested_mb: Decimal | None  # None only when the request is unknown

    @property
    def freed_fraction(self) -> Decimal:
        """The share of the request a lowered request gives back (0 unless lowered)."""
        if self.verdict != "lower" or not self.request_mb or self.suggested_mb is None:
            return _ZERO
        return (self.request_mb - self.suggested_mb) / self.request_mb


def suggest_memory_request(use: MemoryUse, *, headroom: Decimal = HEADROOM, step_mb: Decimal = STEP_MB) -> Suggestion:
    """The rule of the module docstring."""
    if headroom < 0 or step_mb <= 0:
        raise ValueError("headroom must not be negative and the step must be positive")
    if use.request_mb is None:
        return Suggestion("unknown", None, None)
    peak = max(use.peak_hour_mean_mb, _ZERO)
    steps = (peak * (1 + headroom) / step_mb).to_integral_value(rounding=ROUND_CEILING)
    target = max(steps, Decimal(1)) * step_mb
    if peak > use.request_mb:
        return Suggestion("raise", use.request_mb, target)
    if target < use.request_mb:
        return Suggestion("lower", use.request_mb, target)
    return Suggestion("fits", use.request_mb, use.request_mb)


def gib(mb: Decimal | None) -> Decimal | None:
    """MB as GiB (1024 MB: requests are written in Gi), None passing through."""
    return None if mb is None else mb / STEP_MB


def mean_mb(used_mb_s: Decimal, seconds: Decimal) -> Decimal:
    """Mean MB in use over `seconds` metered seconds (0 for no seconds: nothing ran)."""
    return used_mb_s / seconds if seconds > 0 else _ZERO


def peak_hour_mean_mb(hours: Iterable[tuple[Decimal, Decimal]]) -> Decimal:
    """The highest hourly mean of (MB·s used, metered seconds) pairs, one per hour."""
    return max((mean_mb(used, seconds) for used, seconds in hours), default=_ZERO)


def percent_of(used: Decimal, of: Decimal | None) -> Decimal | None:
    """`used` as a percentage of `of`, unrounded (pages and CSVs round it, billing.money); None
    when `of` is unknown or zero — a ratio of nothing is not 0 %."""
    if of is None or of == 0:
        return None
    return used * 100 / of
