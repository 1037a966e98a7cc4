"""The spend anomaly rule on scripted series: a calm series with daily and weekly cycles and noise
stays quiet, known spikes are found and nothing else, an earlier spike in the baseline does not
hide a new one; and the rule's invariants, checked with hypothesis."""

from __future__ import annotations

import math
import random
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from billing.services.alerts import anomaly_verdict, idle_share_pct, over_granting_ratio

THRESHOLD, FLOOR = Decimal("3.5"), Decimal(5)
WEEK = 168


def scripted_series(weeks: int, *, seed: int, noise: float = 0.05) -> list[Decimal]:
    """Hourly spend of a service: busy by day, quiet at night, lighter at weekends, with noise."""
    rng = random.Random(seed)
    series = []
    for hour in range(weeks * WEEK):
        day, hour_of_day = divmod(hour, 24)
        daily = 60 + 40 * math.sin((hour_of_day - 6) / 24 * 2 * math.pi)
        weekly = 0.6 if day % 7 >= 5 else 1.0
        series.append(Decimal(f"{daily * weekly * (1 + rng.gauss(0, noise)):.2f}"))
    return series


def anomalies(series: list[Decimal], weeks: int = 4) -> list[int]:
    """The hours of the last week the rule calls anomalous, each against the same hour of the
    previous `weeks` weeks."""
    found = []
    for hour in range(len(series) - WEEK, len(series)):
        baseline = [series[hour - k * WEEK] for k in range(1, weeks + 1)]
        verdict = anomaly_verdict(series[hour], baseline, threshold=THRESHOLD, floor=FLOOR)
        if verdict is not None and verdict.anomalous:
            found.append(hour)
    return found


def test_calm_series_stay_quiet():
    for seed in range(20):
        assert anomalies(scripted_series(6, seed=seed)) == [], seed


def test_known_spikes_are_found_and_nothing_else():
    for seed in range(10):
        series = scripted_series(6, seed=seed)
        rng = random.Random(1000 + seed)
        spikes = sorted(rng.sample(range(len(series) - WEEK, len(series)), 4))
        for hour in spikes:
            series[hour] = series[hour] * Decimal("2.5") + 20  # a training job left running, say
        assert anomalies(series) == spikes, seed


def test_a_spike_a_week_earlier_does_not_hide_this_weeks():
    series = scripted_series(6, seed=7)
    hour = len(series) - 30
    series[hour - WEEK] *= 4  # last week's spike sits in this hour's baseline
    series[hour] *= 3
    assert anomalies(series) == [hour]


def test_without_enough_history_there_is_no_verdict():
    assert anomaly_verdict(Decimal(500), [Decimal(10), Decimal(0), Decimal(0), Decimal(12)], threshold=THRESHOLD,
                           floor=FLOOR) is None
    assert anomaly_verdict(Decimal(500), [Decimal(10), Decimal(11)], threshold=THRESHOLD, floor=FLOOR) is None


def test_tiny_spends_page_nobody_whatever_their_ratio():
    verdict = anomaly_verdict(Decimal("4.90"), [Decimal("0.01"), Decimal("0.02"), Decimal("0.01")],
                              threshold=THRESHOLD, floor=FLOOR)
    assert verdict is not None
    assert not verdict.anomalous  # 490x the median, but under the 5.00 floor


money = st.decimals(min_value=0, max_value=10_000, places=2)


@given(st.lists(money, min_size=3, max_size=8), money, st.decimals(min_value="0.01", max_value=100, places=2))
def test_the_verdict_rises_with_the_spend_and_never_fires_at_or_below_the_median_or_under_the_floor(
        baseline, value, floor):
    verdict = anomaly_verdict(value, baseline, threshold=THRESHOLD, floor=floor)
    if verdict is None:
        assert sum(1 for b in baseline if b > 0) < 3
        return
    if value <= verdict.median or value - verdict.median < floor:
        assert not verdict.anomalous
    if verdict.anomalous:  # more spend is at least as anomalous
        higher = anomaly_verdict(value + 1, baseline, threshold=THRESHOLD, floor=floor)
        assert higher is not None
        assert higher.anomalous
        assert higher.score >= verdict.score


@given(st.lists(money, min_size=3, max_size=8), money, st.decimals(min_value="0.01", max_value=100, places=2),
       st.sampled_from([Decimal("0.5"), Decimal(2), Decimal(10), Decimal(1000)]))
def test_the_verdict_does_not_depend_on_the_currency_unit(baseline, value, floor, factor):
    """Spend in cents or in dollars, with the floor in the same unit: the same score, the same verdict."""
    one = anomaly_verdict(value, baseline, threshold=THRESHOLD, floor=floor)
    other = anomaly_verdict(value * factor, [b * factor for b in baseline], threshold=THRESHOLD, floor=floor * factor)
    assert (one is None) == (other is None)
    if one is not None and other is not None:
        assert one.anomalous == other.anomalous
        assert abs(one.score - other.score) < Decimal("1e-20")


@given(st.decimals(min_value=0, max_value=10**6, places=3), st.decimals(min_value=0, max_value=10**6, places=3))
def test_idle_share_and_over_granting_are_ratios_of_what_was_metered(a, b):
    pct = idle_share_pct(idle_cost=min(a, b), card_cost=max(a, b))
    if max(a, b) == 0:
        assert pct is None
    else:
        assert pct is not None
        assert Decimal(0) <= pct <= 100
    ratio = over_granting_ratio(granted=a, used=b)
    if a == 0:
        assert ratio is None
    elif b == 0:
        assert ratio == Decimal("Infinity")
    else:
        assert ratio is not None
        assert ratio * b == a or abs(ratio * b - a) < Decimal("1e-18") * a
