"""The right-sizing rule (billing.services.fleet.rightsizing): pure, so no database."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from billing.services.fleet.rightsizing import (
    HEADROOM,
    STEP_MB,
    MemoryUse,
    mean_mb,
    peak_hour_mean_mb,
    percent_of,
    suggest_memory_request,
)

GIB = Decimal(1024)


def test_the_issue_example_40_gib_requested_9_used_12_at_the_peak_hour_suggests_16() -> None:
    s = suggest_memory_request(MemoryUse(request_mb=40 * GIB, mean_used_mb=9 * GIB, peak_hour_mean_mb=12 * GIB))
    # 12 GiB × 1.3 = 15.6 GiB, rounded up to whole GiB.
    assert (s.verdict, s.suggested_mb) == ("lower", 16 * GIB)
    assert s.freed_fraction == Decimal("0.6")  # 24 of 40 GiB given back


def test_an_unknown_request_gets_no_suggestion() -> None:
    s = suggest_memory_request(MemoryUse(request_mb=None, mean_used_mb=9 * GIB, peak_hour_mean_mb=12 * GIB))
    assert (s.verdict, s.suggested_mb, s.freed_fraction) == ("unknown", None, Decimal(0))


def test_use_above_the_request_asks_for_more() -> None:
    s = suggest_memory_request(MemoryUse(request_mb=8 * GIB, mean_used_mb=9 * GIB, peak_hour_mean_mb=10 * GIB))
    assert (s.verdict, s.suggested_mb) == ("raise", 13 * GIB)  # 10 × 1.3 = 13


def test_a_request_inside_the_headroom_is_kept() -> None:
    s = suggest_memory_request(MemoryUse(request_mb=16 * GIB, mean_used_mb=10 * GIB, peak_hour_mean_mb=Decimal("12.5") * GIB))
    assert (s.verdict, s.suggested_mb, s.freed_fraction) == ("fits", 16 * GIB, Decimal(0))


def test_nothing_used_still_suggests_one_gib_not_zero() -> None:
    s = suggest_memory_request(MemoryUse(request_mb=40 * GIB, mean_used_mb=Decimal(0), peak_hour_mean_mb=Decimal(0)))
    assert (s.verdict, s.suggested_mb) == ("lower", STEP_MB)


def test_hourly_means_and_ratios() -> None:
    # 3600 s at 2 GiB, then 1800 s at 6 GiB: the peak hour's mean is 6 GiB, not the sum.
    hours = [(2 * GIB * 3600, Decimal(3600)), (6 * GIB * 1800, Decimal(1800)), (Decimal(0), Decimal(0))]
    assert peak_hour_mean_mb(hours) == 6 * GIB
    assert peak_hour_mean_mb([]) == 0
    assert mean_mb(Decimal(10), Decimal(0)) == 0
    assert percent_of(Decimal(1), Decimal(4)) == 25
    assert percent_of(Decimal(1), None) is None
    assert percent_of(Decimal(1), Decimal(0)) is None


def test_bad_settings_are_refused() -> None:
    use = MemoryUse(request_mb=GIB, mean_used_mb=GIB, peak_hour_mean_mb=GIB)
    with pytest.raises(ValueError, match="headroom must not be negative"):
        suggest_memory_request(use, headroom=Decimal(-1))
    with pytest.raises(ValueError, match="the step must be positive"):
        suggest_memory_request(use, step_mb=Decimal(0))


_MB = st.decimals(min_value=0, max_value=200 * 1024, places=3, allow_nan=False, allow_infinity=False)


@given(request=st.none() | _MB.filter(lambda v: v > 0), peak=_MB, mean_share=st.decimals(min_value=0, max_value=1, places=3),
       headroom=st.decimals(min_value=0, max_value=2, places=2), step=st.sampled_from([Decimal(1), Decimal(256), GIB]))
def test_a_suggestion_is_never_below_the_peak_hour_nor_above_the_request_unless_use_exceeded_it(
        request: Decimal | None, peak: Decimal, mean_share: Decimal, headroom: Decimal, step: Decimal) -> None:
    mean = peak * mean_share
    s = suggest_memory_request(MemoryUse(request_mb=request, mean_used_mb=mean, peak_hour_mean_mb=peak),
                               headroom=headroom, step_mb=step)
    if request is None:
        assert s.verdict == "unknown"
        assert s.suggested_mb is None
        return
    assert s.suggested_mb is not None
    assert s.suggested_mb >= peak
    if peak <= request:
        assert s.suggested_mb <= request
    else:
        assert s.verdict == "raise"
        assert s.suggested_mb > request
    assert 0 <= s.freed_fraction < 1
    if s.verdict in ("raise", "lower"):
        assert s.suggested_mb % step == 0
        assert s.suggested_mb >= peak * (1 + headroom)


def test_the_default_headroom_is_what_the_page_states() -> None:
    assert HEADROOM == Decimal("0.30")  # noqa: SIM300 - the constant is what is checked
    assert STEP_MB == GIB
