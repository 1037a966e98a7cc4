"""The rules that decide an alert, pure (docs/alerts.md, How each alert decides).

Spend anomaly: a robust z-score against the same period of previous weeks.

    z = (x - median(B)) / max(1.4826 × MAD(B), 10 % of median(B), floor / threshold)

where x is the period's spend, B the spend of the same hour (or day) 1, 2, ... N weeks earlier, MAD
the median absolute deviation of B (× 1.4826, a normal distribution's standard deviation), and
`floor` the rule's minimum amount. A period is anomalous when z ≥ threshold and x − median(B) ≥
floor. The median and MAD are not moved by one earlier spike the way a mean and standard deviation
are; the 10 % term keeps a perfectly steady series (MAD 0) from calling a few percent a spike; the
floor term and condition keep tiny spends from paging anyone. It needs history: at least
MIN_HISTORY of the baseline periods with spend (a new workload has no baseline to be above).

Idle share: the cards' idle cost ÷ their cost over the window, above the threshold (percent), when
the idle cost is at least the floor. Over-granting: granted ÷ used of a resource over the window,
above the threshold, when the workload's cost is at least the floor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

__all__ = ["MAD_TO_SIGMA", "MIN_HISTORY", "RELATIVE_SPREAD", "AnomalyVerdict", "anomaly_verdict", "idle_share_pct",
           "median", "over_granting_ratio"]

MAD_TO_SIGMA = Decimal("1.4826")
RELATIVE_SPREAD = Decimal("0.1")
MIN_HISTORY = 3


def median(values: Sequence[Decimal]) -> Decimal:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass(frozen=True)
class AnomalyVerdict:
    value: Decimal
    median: Decimal
    scale: Decimal  # the z-score's denominator
    score: Decimal  # (value - median) / scale
    anomalous: bool


def anomaly_verdict(value: Decimal, baseline: Sequence[Decimal], *, threshold: Decimal,
                    floor: Decimal) -> AnomalyVerdict | None:
    """The verdict on one period's spend against its baseline (the module's rule); None when the
    baseline has fewer than MIN_HISTORY periods with spend. `threshold` > 0, `floor` ≥ 0."""
    if sum(1 for b in baseline if b > 0) < MIN_HISTORY:
        return None
    centre = median(baseline)
    mad = median([abs(b - centre) for b in baseline])
    scale = max(MAD_TO_SIGMA * mad, RELATIVE_SPREAD * centre, floor / threshold)
    excess = value - centre
    if scale == 0:  # a zero baseline and no floor: any spend is above it
        return AnomalyVerdict(value, centre, scale, Decimal("Infinity") if excess > 0 else Decimal(0), excess > 0)
    score = excess / scale
    return AnomalyVerdict(value, centre, scale, score, score >= threshold and excess >= floor and excess > 0)


def idle_share_pct(*, idle_cost: Decimal, card_cost: Decimal) -> Decimal | None:
    """Idle cost as a percentage of the cards' cost; None without cost (nothing priced)."""
    return None if card_cost <= 0 else idle_cost / card_cost * 100


def over_granting_ratio(*, granted: Decimal, used: Decimal) -> Decimal | None:
    """Granted ÷ used; None when nothing was granted. Nothing used with something granted is
    infinitely over-granted (Decimal Infinity)."""
    if granted <= 0:
        return None
    return Decimal("Infinity") if used <= 0 else granted / used
