"""The right-sizing rule (billing.services.fleet.rightsizing): pure, so no database."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from billing.services.fleet.rightsizing import (
    HEADROOM,
    SM_STEP,
    STEP_MB,
    MemoryUse,
    SmUse,
    mean_mb,
    peak_hour_mean_mb,
    percent_of,
    suggest_memory_request,
    suggest_sm_request,
)

GIB = Decimal(1024)


def test_the_issue_example_40_gib_requested_9_used_12_at_the_peak_hour_suggests_16() -> None:
    s = suggest_memory_request(MemoryUse(request_mb=40 * GIB, mean_used_mb=9 * GIB, peak_hour_mean_mb=12 * GIB))
    # 12 GiB × 1.3 = 15.6 GiB, rounded up to whole GiB.
    assert (s.verdict, s.suggested) == ("lower", 16 * GIB)
    assert s.freed_fraction == Decimal("0.6")  # 24 of 40 GiB given back


def test_an_unknown_request_gets_no_suggestion() -> None:
    s = suggest_memory_request(MemoryUse(request_mb=None, mean_used_mb=9 * GIB, peak_hour_mean_mb=12 * GIB))
    assert (s.verdict, s.suggested, s.freed_fraction) == ("unknown", None, Decimal(0))


def test_use_above_the_request_asks_for_more() -> None:
    s = suggest_memory_request(MemoryUse(request_mb=8 * GIB, mean_used_mb=9 * GIB, peak_hour_mean_mb=10 * GIB))
    assert (s.verdict, s.suggested) == ("raise", 13 * GIB)  # 10 × 1.3 = 13


def test_a_request_inside_the_headroom_is_kept() -> None:
    s = suggest_memory_request(MemoryUse(request_mb=16 * GIB, mean_used_mb=10 * GIB, peak_hour_mean_mb=Decimal("12.5") * GIB))
    assert (s.verdict, s.suggested, s.freed_fraction) == ("fits", 16 * GIB, Decimal(0))


def test_nothing_used_still_suggests_one_gib_not_zero() -> None:
    s = suggest_memory_request(MemoryUse(request_mb=40 * GIB, mean_used_mb=Decimal(0), peak_hour_mean_mb=Decimal(0)))
    assert (s.verdict, s.suggested) == ("lower", STEP_MB)


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


@given(request=st.none() | _MB.filter(lambda v: v > 0), granted=st.none() | _MB, peak=_MB,
       mean_share=st.decimals(min_value=0, max_value=1, places=3),
       headroom=st.decimals(min_value=0, max_value=2, places=2), step=st.sampled_from([Decimal(1), Decimal(256), GIB]))
def test_a_suggestion_is_never_below_the_peak_hour_nor_above_the_request_unless_use_exceeded_it(
        request: Decimal | None, granted: Decimal | None, peak: Decimal, mean_share: Decimal, headroom: Decimal,
        step: Decimal) -> None:
    """The same holds of the grant where no request is known: it stands in for the request."""
    mean = peak * mean_share
    s = suggest_memory_request(MemoryUse(request_mb=request, mean_used_mb=mean, peak_hour_mean_mb=peak,
                                         granted_mb=granted), headroom=headroom, step_mb=step)
    if request is None and not granted:
        assert s.verdict == "unknown"
        assert s.suggested is None
        return
    assert s.basis == ("request" if request is not None else "grant")
    request = request if request is not None else granted
    assert request is not None
    assert s.request == request
    assert s.suggested is not None
    assert s.suggested >= peak
    if peak <= request:
        assert s.suggested <= request
    else:
        assert s.verdict == "raise"
        assert s.suggested > request
    assert 0 <= s.freed_fraction < 1
    if s.verdict in ("raise", "lower"):
        assert s.suggested % step == 0
        assert s.suggested >= peak * (1 + headroom)


def test_the_default_headroom_is_what_the_page_states() -> None:
    assert HEADROOM == Decimal("0.30")  # noqa: SIM300 - the constant is what is checked
    assert STEP_MB == GIB


def _sm_peak(hours: list[tuple[int, int]]) -> Decimal:
    """A hand-made ledger of one container's SMs: (SM·s used, metered seconds) per hour."""
    return peak_hour_mean_mb([(Decimal(used), Decimal(seconds)) for used, seconds in hours])


def test_sms_are_sized_by_the_memory_rule_over_the_same_hours() -> None:
    # 108 SMs requested; hours at 20, then 32 for half an hour, then nothing: the peak hour's mean
    # is 32 SMs, 32 × 1.3 = 41.6, rounded up to whole SMs: 42; 66 of 108 SMs given back.
    peak = _sm_peak([(20 * 3600, 3600), (32 * 1800, 1800), (0, 0)])
    assert peak == 32
    s = suggest_sm_request(SmUse(request_sm=Decimal(108), mean_used_sm=Decimal(24), peak_hour_mean_sm=peak))
    assert (s.verdict, s.request, s.suggested) == ("lower", Decimal(108), Decimal(42))
    assert s.freed_fraction == Decimal(66) / Decimal(108)


def test_sms_above_the_request_ask_for_more_and_an_unknown_request_gets_nothing() -> None:
    raised = suggest_sm_request(SmUse(request_sm=Decimal(10), mean_used_sm=Decimal(11), peak_hour_mean_sm=Decimal(15)))
    assert (raised.verdict, raised.suggested, raised.freed_fraction) == ("raise", Decimal(20), Decimal(0))  # 15 × 1.3 = 19.5 → 20
    unknown = suggest_sm_request(SmUse(request_sm=None, mean_used_sm=Decimal(11), peak_hour_mean_sm=Decimal(15)))
    assert (unknown.verdict, unknown.suggested) == ("unknown", None)
    fits = suggest_sm_request(SmUse(request_sm=Decimal(13), mean_used_sm=Decimal(9), peak_hour_mean_sm=Decimal(10)))
    assert (fits.verdict, fits.suggested) == ("fits", Decimal(13))  # 10 × 1.3 = 13: the request is the target
    idle = suggest_sm_request(SmUse(request_sm=Decimal(14), mean_used_sm=Decimal(0), peak_hour_mean_sm=Decimal(0)))
    assert (idle.verdict, idle.suggested) == ("lower", SM_STEP)  # one SM, never zero


def test_sm_and_memory_share_the_rule_so_the_same_numbers_give_the_same_answer() -> None:
    for request, peak in ((Decimal(40), Decimal(12)), (Decimal(8), Decimal(10)), (Decimal(16), Decimal("12.5"))):
        mem = suggest_memory_request(MemoryUse(request_mb=request, mean_used_mb=peak, peak_hour_mean_mb=peak),
                                     step_mb=Decimal(1))
        sm = suggest_sm_request(SmUse(request_sm=request, mean_used_sm=peak, peak_hour_mean_sm=peak))
        assert mem == sm
    with pytest.raises(ValueError, match="the step must be positive"):
        suggest_sm_request(SmUse(request_sm=Decimal(1), mean_used_sm=Decimal(1), peak_hour_mean_sm=Decimal(1)),
                           step=Decimal(0))


def test_what_a_lowered_request_gives_back_stays_whole_for_whole_figures() -> None:
    # 16 of 108 SMs: 108 SM·h requested give back 92, exactly (a fraction first would leave 92.000…01).
    s = suggest_sm_request(SmUse(request_sm=Decimal(108), mean_used_sm=Decimal(12), peak_hour_mean_sm=Decimal(12)))
    assert s.freed(Decimal(108)) == 92
    assert s.freed(None) is None
    kept = suggest_sm_request(SmUse(request_sm=Decimal(13), mean_used_sm=Decimal(9), peak_hour_mean_sm=Decimal(10)))
    assert kept.freed(Decimal(13)) == 0


def test_without_a_request_the_rule_is_held_against_the_grant_billed_on() -> None:
    # Granted 108 SMs per GPU, the peak hour used 9 on average: 9 × 1.3 = 11.7 → ask for 12, giving
    # back 96 of every 108 SM·h granted.
    sm = suggest_sm_request(SmUse(request_sm=None, mean_used_sm=Decimal("1.6"), peak_hour_mean_sm=Decimal(9),
                                  granted_sm=Decimal(108)))
    assert (sm.verdict, sm.basis, sm.request, sm.suggested) == ("lower", "grant", Decimal(108), Decimal(12))
    assert sm.against_grant
    assert sm.freed(Decimal(1728)) == 1536  # of 1,728 SM·h granted
    # A reported request wins over the grant.
    asked = suggest_sm_request(SmUse(request_sm=Decimal(50), mean_used_sm=Decimal(1), peak_hour_mean_sm=Decimal(9),
                                     granted_sm=Decimal(108)))
    assert (asked.basis, asked.request, asked.suggested) == ("request", Decimal(50), Decimal(12))
    # Memory alike: granted 0.39 GiB, a peak hour at 0.42 GiB → raise against the grant to 1 GiB.
    mem = suggest_memory_request(MemoryUse(request_mb=None, mean_used_mb=Decimal(300), peak_hour_mean_mb=Decimal(430),
                                           granted_mb=Decimal(400)))
    assert (mem.verdict, mem.basis, mem.suggested) == ("raise", "grant", GIB)
    # Neither a request nor a grant (or a grant of nothing): no suggestion, never a guess.
    for granted in (None, Decimal(0)):
        none = suggest_sm_request(SmUse(request_sm=None, mean_used_sm=Decimal(1), peak_hour_mean_sm=Decimal(9),
                                        granted_sm=granted))
        assert (none.verdict, none.basis, none.suggested) == ("unknown", "request", None)
