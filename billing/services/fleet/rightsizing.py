"""Right-sizing a workload's GPU memory and SM requests, and the efficiency ratios beside it
(docs/drilldown.md). Pure: no Django, no ORM, no clock; the drill-down's query feeds it what the
ledger knows.

The ledger keeps sums, never samples: per hour, a container's MB·s used and its metered seconds on
each GPU. So the largest thing we can honestly call "peak" is the peak hour's mean — the highest
hourly average of memory in use per GPU. A spike inside an hour is invisible here, which is why the
rule adds headroom on top of that peak and never goes below it:

    target    = peak-hour mean × (1 + HEADROOM), rounded up to whole steps (at least one step)
    unknown   neither the request nor the grant is known: no suggestion (never a guess)
    raise     the peak-hour mean exceeds the request → the target (the workload outgrew it)
    lower     the target is below the request → the target
    fits      otherwise → keep the request

Where the node agent reported no request, the same rule is held against the grant the workload was
billed on instead (its mean per GPU over the metered seconds; `Suggestion.basis` is "grant"): a
workload billed on 108 granted SMs whose peak hour used 9 is told to ask for 12, and the page says
the request was not reported. Billing follows the grant, so that is where the advice is worth most.

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
    "BASES",
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
# What a suggestion is held against: the reported request, or, without one, the grant billed on.
BASES = ("request", "grant")
_ZERO = Decimal(0)


@dataclass(frozen=True)
class MemoryUse:
    """What the ledger says about one container's memory, per GPU: its request (None when no
    agent reported one), its mean over the period's metered seconds, its peak hour's mean and its
    mean grant over the metered seconds (None where not known)."""

    request_mb: Decimal | None
    mean_used_mb: Decimal
    peak_hour_mean_mb: Decimal
    granted_mb: Decimal | None = None


@dataclass(frozen=True)
class SmUse:
    """The same for one container's SMs, per GPU, in SMs: its request (None when no agent reported
    one), its mean over the period's metered seconds and its peak hour's mean."""

    request_sm: Decimal | None
    mean_used_sm: Decimal
    peak_hour_mean_sm: Decimal
    granted_sm: Decimal | None = None


@dataclass(frozen=True)
class Suggestion:
    """The rule's answer, in the unit of what it sizes (MB for memory, SMs for SMs)."""

    verdict: str  # one of VERDICTS
    request: Decimal | None  # what it is held against: the request, or the grant (basis "grant")
    suggested: Decimal | None  # None only when the verdict is unknown
    basis: str = "request"  # one of BASES

    @property
    def freed_fraction(self) -> Decimal:
        """The share of the request a lowered request gives back (0 unless lowered)."""
        if self.verdict != "lower" or not self.request or self.suggested is None:
            return _ZERO
        return (self.request - self.suggested) / self.request

    @property
    def against_grant(self) -> bool:
        return self.basis == "grant"

    def freed(self, requested: Decimal | None) -> Decimal | None:
        """Of `requested` (the request × its seconds: GB·h, SM·h; the grant's for a suggestion held
        against the grant), what a lowered request would have given back; None when it is unknown.
        Multiplied before divided, so whole figures stay whole."""
        if requested is None:
            return None
        if self.verdict != "lower" or not self.request or self.suggested is None:
            return _ZERO
        return requested * (self.request - self.suggested) / self.request


def suggest_memory_request(use: MemoryUse, *, headroom: Decimal = HEADROOM, step_mb: Decimal = STEP_MB) -> Suggestion:
    """The rule of the module docstring, in MB, in whole GiB."""
    return _suggest(use.request_mb, use.granted_mb, use.peak_hour_mean_mb, headroom=headroom, step=step_mb)


def suggest_sm_request(use: SmUse, *, headroom: Decimal = HEADROOM, step: Decimal = SM_STEP) -> Suggestion:
    """The rule of the module docstring, in SMs, in whole SMs."""
    return _suggest(use.request_sm, use.granted_sm, use.peak_hour_mean_sm, headroom=headroom, step=step)


def _suggest(request: Decimal | None, granted: Decimal | None, peak_hour_mean: Decimal, *, headroom: Decimal,
             step: Decimal) -> Suggestion:
    if headroom < 0 or step <= 0:
        raise ValueError("headroom must not be negative and the step must be positive")
    basis = "request"
    if request is None:
        # No request reported: hold the rule against the grant billed on (a grant of 0 says nothing).
        if not granted or granted < 0:
            return Suggestion("unknown", None, None)
        request, basis = granted, "grant"
    peak = max(peak_hour_mean, _ZERO)
    steps = (peak * (1 + headroom) / step).to_integral_value(rounding=ROUND_CEILING)
    target = max(steps, Decimal(1)) * step
    if peak > request:
        return Suggestion("raise", request, target, basis)
    if target < request:
        return Suggestion("lower", request, target, basis)
    return Suggestion("fits", request, request, basis)


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
