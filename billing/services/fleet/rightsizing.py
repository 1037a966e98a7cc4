"""Right-sizing a workload's GPU memory and SM requests, and the efficiency ratios beside it
(docs/drilldown.md). Pure: no Django, no ORM, no clock; the drill-down's query feeds it what the
ledger knows.

The ledger keeps sums, never samples: per hour, a container's MB·s used and its metered seconds on
each GPU. So the largest thing we can honestly call "peak" is the peak hour's mean — the highest
hourly average of memory in use per GPU. A spike inside an hour is invisible here, which is why the
rule adds headroom on top of that peak and never goes below it:

    target    = peak-hour mean × (1 + HEADROOM), rounded up to whole steps (at least one step)
    unknown   the request is not known: no suggestion (never a guess)
    raise     the peak-hour mean exceeds the request → the target (the workload outgrew it)
    lower     the target is below the request → the target
    fits      otherwise → keep the request

so a suggestion is never below the peak-hour mean and never above the request unless use exceeded
the request (tests/billing/test_rightsizing.py proves both with hypothesis). The rule is stated on
the page (templates/billing/explore.html) and in docs/drilldown.md.

Memory and SMs follow the one rule, over the same hours, with a step each: whole GiB for memory
(requests are written 16Gi), whole SMs for SMs (the sm-count request is a whole number). The ledger
keeps SM·s used per hour as it keeps MB·s, so the SMs' peak hour is known exactly as memory's is.
Neither states a money saving: the charge follows the billed quantity (max(used, granted) by
default), so a lower request saves money only where the grant follows the request.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

__all__ = [
    "HEADROOM",
    "SM_STEP",
    "STEP_MB",
    "VERDICTS",
    "MemoryUse",
    "SmUse",
    "Suggestion",
    "gib",
    "mean_mb",
    "peak_hour_mean_mb",
    "percent_of",
    "suggest_memory_request",
    "suggest_sm_request",
]

# 30 % above the peak hour's mean: an hour's mean hides spikes inside the hour, and a too-small
# request costs an out-of-memory kill, which is dearer than the memory.
HEADROOM = Decimal("0.30")
# Requests are suggested in whole GiB, as people write them (16Gi), never to the megabyte.
STEP_MB = Decimal(1024)
# SM requests are suggested in whole SMs: the sm-count request is an integer.
SM_STEP = Decimal(1)
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
class SmUse:
    """The same for one container's SMs, per GPU, in SMs: its request (None when no agent reported
    one), its mean over the period's metered seconds and its peak hour's mean."""

    request_sm: Decimal | None
    mean_used_sm: Decimal
    peak_hour_mean_sm: Decimal


@dataclass(frozen=True)
class Suggestion:
    """The rule's answer, in the unit of what it sizes (MB for memory, SMs for SMs)."""

    verdict: str  # one of VERDICTS
    request: Decimal | None
    suggested: Decimal | None  # None only when the request is unknown

    @property
    def freed_fraction(self) -> Decimal:
        """The share of the request a lowered request gives back (0 unless lowered)."""
        if self.verdict != "lower" or not self.request or self.suggested is None:
            return _ZERO
        return (self.request - self.suggested) / self.request

    def freed(self, requested: Decimal | None) -> Decimal | None:
        """Of `requested` (the request × its seconds: GB·h, SM·h), what a lowered request would have
        given back; None when it is unknown. Multiplied before divided, so whole figures stay whole."""
        if requested is None:
            return None
        if self.verdict != "lower" or not self.request or self.suggested is None:
            return _ZERO
        return requested * (self.request - self.suggested) / self.request


def suggest_memory_request(use: MemoryUse, *, headroom: Decimal = HEADROOM, step_mb: Decimal = STEP_MB) -> Suggestion:
    """The rule of the module docstring, in MB, in whole GiB."""
    return _suggest(use.request_mb, use.peak_hour_mean_mb, headroom=headroom, step=step_mb)


def suggest_sm_request(use: SmUse, *, headroom: Decimal = HEADROOM, step: Decimal = SM_STEP) -> Suggestion:
    """The rule of the module docstring, in SMs, in whole SMs."""
    return _suggest(use.request_sm, use.peak_hour_mean_sm, headroom=headroom, step=step)


def _suggest(request: Decimal | None, peak_hour_mean: Decimal, *, headroom: Decimal, step: Decimal) -> Suggestion:
    if headroom < 0 or step <= 0:
        raise ValueError("headroom must not be negative and the step must be positive")
    if request is None:
        return Suggestion("unknown", None, None)
    peak = max(peak_hour_mean, _ZERO)
    steps = (peak * (1 + headroom) / step).to_integral_value(rounding=ROUND_CEILING)
    target = max(steps, Decimal(1)) * step
    if peak > request:
        return Suggestion("raise", request, target)
    if target < request:
        return Suggestion("lower", request, target)
    return Suggestion("fits", request, request)


def gib(mb: Decimal | None) -> Decimal | None:
    """MB as GiB (1024 MB: requests are written in Gi), None passing through."""
    return None if mb is None else mb / STEP_MB


def mean_mb(used_mb_s: Decimal, seconds: Decimal) -> Decimal:
    """Mean MB in use over `seconds` metered seconds (0 for no seconds: nothing ran); the same for
    SM·s, the mean SMs in use."""
    return used_mb_s / seconds if seconds > 0 else _ZERO


def peak_hour_mean_mb(hours: Iterable[tuple[Decimal, Decimal]]) -> Decimal:
    """The highest hourly mean of (MB·s used, metered seconds) pairs, one per hour (of (SM·s used,
    metered seconds), the peak hour's mean SMs)."""
    return max((mean_mb(used, seconds) for used, seconds in hours), default=_ZERO)


def percent_of(used: Decimal, of: Decimal | None) -> Decimal | None:
    """`used` as a percentage of `of`, unrounded (pages and CSVs round it, billing.money); None
    when `of` is unknown or zero — a ratio of nothing is not 0 %."""
    if of is None or of == 0:
        return None
    return used * 100 / of
