"""Trends and comparisons: the previous period of a period, each figure against it (exact Decimals on
a small ledger), the month-over-month bars equal to each month's figure as the dashboard shows that
month, and Explore's sorting, search, comparison column and bars."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from unittest import mock

import pytest
import time_machine
from hypothesis import given
from hypothesis import strategies as st

from billing.ledger.models import GpuHour
from billing.models import Node, RateCard, Tenant
from billing.queries.dashboard import get_finance_dashboard
from billing.queries.trends import Change, get_period_costs, previous_period
from billing.scope import FINANCE_GROUP, get_scope
from billing.web.tables import shown_costs
from billing.web.trends import TOP_BARS, level_bars, month_series
from tests.billing.test_portal import usage
from tests.conftest import A100, user_in, with_day

# A fixed "now": November 2026 to date is the 1st to the 20th, compared with 1–20 October.
NOW = datetime(2026, 11, 20, 12, 30, tzinfo=UTC)


def at(day: date, hour: int = 10) -> datetime:
    return datetime(day.year, day.month, day.day, hour, tzinfo=UTC)


# --- the previous period ---------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "last", "expected"), [
    # A whole month: the whole month before, whatever its length.
    (date(2026, 11, 1), date(2026, 11, 30), (date(2026, 10, 1), date(2026, 10, 31))),
    (date(2026, 3, 1), date(2026, 3, 31), (date(2026, 2, 1), date(2026, 2, 28))),
    # Whole months: as many whole months before.
    (date(2026, 10, 1), date(2026, 11, 30), (date(2026, 8, 1), date(2026, 9, 30))),
    # A month to date: the same days of the month before, cut at its end.
    (date(2026, 11, 1), date(2026, 11, 20), (date(2026, 10, 1), date(2026, 10, 20))),
    (date(2026, 3, 1), date(2026, 3, 30), (date(2026, 2, 1), date(2026, 2, 28))),
    (date(2026, 1, 1), date(2026, 1, 1), (date(2025, 12, 1), date(2025, 12, 1))),
    # Any other period: as many days just before.
    (date(2026, 11, 10), date(2026, 11, 16), (date(2026, 11, 3), date(2026, 11, 9))),
    (date(2026, 11, 2), date(2026, 12, 1), (date(2026, 10, 3), date(2026, 11, 1))),
])
def test_previous_period(first: date, last: date, expected: tuple[date, date]) -> None:
    assert previous_period(first, last) == expected


@given(st.dates(min_value=date(2000, 1, 1), max_value=date(2099, 1, 1)), st.integers(min_value=0, max_value=400))
def test_the_previous_period_lies_before_and_is_as_long(first: date, days: int) -> None:
    last = first + timedelta(days=days)
    lo, hi = previous_period(first, last)
    assert lo <= hi < first
    length, before = (last - first).days + 1, (hi - lo).days + 1
    if first.day != 1:
        assert hi == first - timedelta(days=1)
        assert before == length
    elif (first.year, first.month) == (last.year, last.month):
        # A month to date: the same days of the month before, cut at its end; starting on its 1st.
        assert lo.day == 1
        assert before <= length
    else:
        assert abs(before - length) <= 3 * 13  # whole months against whole months: 28 to 31 days each


def test_change_in_money_and_percent() -> None:
    assert Change(Decimal("12.50"), Decimal("10.00")).delta == Decimal("2.50")
    assert Change(Decimal("12.50"), Decimal("10.00")).pct == Decimal(25)
    assert Change(Decimal("5.00"), Decimal("10.00")).pct == Decimal(-50)
    assert Change(Decimal("5.00"), Decimal(0)).pct is None  # no percentage of nothing
    assert Change(Decimal(0), Decimal(0)).delta == 0


# --- on a small ledger ------------------------------------------------------------------------------


@pytest.fixture
def small_ledger(db) -> None:
    """acme: 1.004 (gold) + 1.004 (bronze) + idle 0.333 on 5 Nov; 2.00 on 5 Oct and 7.00 on 25 Oct
    (after the 20th: in October, not in 1–20 October); 3.00 in August.
    globex: 4.00 on 6 Oct only. initech: 0.50 on 6 Nov only."""
    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3.6"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    Tenant.objects.create(slug="acme", name="Acme Robotics")
    Tenant.objects.create(slug="globex", name="Globex Corp")
    Tenant.objects.create(slug="initech", name="Initech")
    usage(at(date(2026, 11, 5)), charge="1.004", idle="0.333", sla_tier="gold")
    usage(at(date(2026, 11, 5)), charge="1.004", sla_tier="bronze", pod_uid="uid-2", pod="bert-2")
    usage(at(date(2026, 10, 5)), charge="2.00")
    usage(at(date(2026, 10, 25)), charge="7.00")
    usage(at(date(2026, 8, 14)), charge="3.00")
    usage(at(date(2026, 10, 6)), tenant="globex", namespace="globex-prod", pod="llm-1", pod_uid="uid-llm-1",
          charge="4.00")
    usage(at(date(2026, 11, 6)), tenant="initech", namespace="initech", pod="x", pod_uid="uid-x", charge="0.50")


def _bounds(first: date, last: date) -> tuple[datetime, datetime]:
    return at(first, 0), at(last, 0) + timedelta(days=1)


def test_dashboard_compares_the_month_to_date_with_the_same_days_of_last_month(small_ledger) -> None:
    finance = get_scope(user_in(FINANCE_GROUP))
    with time_machine.travel(NOW, tick=False):
        board = get_finance_dashboard(scope=finance, start=at(date(2026, 11, 1), 0), end=at(date(2026, 11, 21), 0))
    c = board.comparison
    assert c is not None
    assert (c.previous_first, c.previous_last) == (date(2026, 10, 1), date(2026, 10, 20))
    changes = {t.tenant: t.change for t in c.tenants}
    # acme's lines rounded once each: 1.00 + 1.00 + idle 0.33 (not 2.341 rounded); October 1–20: 2.00.
    assert changes["acme"] == Change(Decimal("2.33"), Decimal("2.00"))
    assert changes["acme"].delta == Decimal("0.33")
    assert changes["acme"].pct == Decimal("16.5")
    assert changes["initech"] == Change(Decimal("0.50"), Decimal(0))
    assert changes["initech"].pct is None
    # globex spent only in October: still compared, at 0 now.
    assert changes["globex"] == Change(Decimal(0), Decimal("4.00"))
    assert changes["globex"].pct == Decimal(-100)
    assert [t.tenant for t in c.tenants] == ["acme", "initech", "globex"]  # the table's order, then the rest
    assert c.total == Change(Decimal("2.83"), Decimal("6.00"))
    assert c.total.current == board.summary.attributed


def test_a_whole_month_against_the_whole_month_before(small_ledger) -> None:
    finance = get_scope(user_in(FINANCE_GROUP))
    with time_machine.travel(NOW, tick=False):
        board = get_finance_dashboard(scope=finance, start=at(date(2026, 11, 1), 0), end=at(date(2026, 12, 1), 0))
        october = get_finance_dashboard(scope=finance, start=at(date(2026, 10, 1), 0), end=at(date(2026, 11, 1), 0))
    c = board.comparison
    assert c is not None
    assert (c.previous_first, c.previous_last) == (date(2026, 10, 1), date(2026, 10, 31))
    # The previous figures are October's as the dashboard shows October.
    assert c.total.previous == october.summary.attributed == Decimal("13.00")
    assert {t.tenant: t.change.previous for t in c.tenants if t.change.previous} == {
        t.tenant: t.total for t in october.summary.tenants}


def test_finance_also_compares_the_platforms_idle_and_the_whole_gpu_cost(small_ledger) -> None:
    node = Node.objects.get(name="gpu-node-1")
    for day, card, idle in ((date(2026, 11, 5), "10.005", "5.004"), (date(2026, 10, 5), "4.00", "1.50")):
        with_day(GpuHour.objects.create(gpu_uuid="GPU-9", node=node, gpu_model=A100["model"], hour=at(day),
                                        metered_seconds=Decimal(3600), card_cost=Decimal(card),
                                        charged=Decimal(card) - Decimal(idle), idle_cost=Decimal(idle),
                                        idle_allocated=Decimal(0), currency="USD", priced=True))
    finance = get_scope(user_in(FINANCE_GROUP))
    with time_machine.travel(NOW, tick=False):
        board = get_finance_dashboard(scope=finance, start=at(date(2026, 11, 1), 0), end=at(date(2026, 11, 21), 0))
    c = board.comparison
    assert c is not None
    assert c.idle_platform == Change(Decimal("5.00"), Decimal("1.50"))  # 5.004 rounded once, as the tile shows it
    assert c.idle_platform.current == shown_costs(board.summary).idle_platform
    assert c.total_gpu_cost == Change(Decimal("7.83"), Decimal("7.50"))
    assert c.total_gpu_cost.current == shown_costs(board.summary).total_gpu_cost
    # A tenant member sees no platform figure.
    member = get_scope(user_in(tenants=("acme",)))
    with time_machine.travel(NOW, tick=False):
        mine = get_finance_dashboard(scope=member, start=at(date(2026, 11, 1), 0), end=at(date(2026, 11, 21), 0))
    assert mine.comparison is not None
    assert mine.comparison.idle_platform is None
    assert mine.comparison.total_gpu_cost is None


def test_each_months_bar_is_that_months_figure_on_the_dashboard(small_ledger) -> None:
    finance = get_scope(user_in(FINANCE_GROUP))
    with time_machine.travel(NOW, tick=False):
        board = get_finance_dashboard(scope=finance, start=at(date(2026, 11, 1), 0), end=at(date(2026, 11, 21), 0))
        months = board.months
        assert months is not None
        assert [m.month for m in months] == [date(2026, m, 1) for m in range(6, 12)]
        for m in months:
            shown = get_finance_dashboard(scope=finance, start=m.costs.start, end=m.costs.end, trends=False)
            assert m.costs.total == shown.summary.attributed, m.month
            assert m.costs.tenants == {t.tenant: t.total for t in shown.summary.tenants}, m.month
    assert [m.costs.total for m in months] == [0, 0, Decimal("3.00"), 0, Decimal("13.00"), Decimal("2.83")]
    # The chart's stacked values add up to each month's figure.
    series = month_series(months)
    for i, m in enumerate(months):
        assert sum(values[i] for _key, _slug, values in series) == m.costs.total


def test_a_whole_month_shown_is_its_own_bar_and_the_month_before_is_read_once(small_ledger) -> None:
    """A page showing a whole month has that month's figures already: the month's bar is them, not a
    second read, and the previous period (the month before, also a bar) is read once. The bars are
    those of the same months read from the ledger (the month-to-date board above reads November)."""
    finance = get_scope(user_in(FINANCE_GROUP))
    with time_machine.travel(NOW, tick=False):
        with mock.patch("billing.queries.trends.get_period_costs", wraps=get_period_costs) as read:
            whole = get_finance_dashboard(scope=finance, start=at(date(2026, 11, 1), 0), end=at(date(2026, 12, 1), 0))
        to_date = get_finance_dashboard(scope=finance, start=at(date(2026, 11, 1), 0), end=at(date(2026, 11, 21), 0))
    read_months = [date(2026, 10, 1), *(date(2026, m, 1) for m in range(6, 10))]
    assert [p[0].date() for p in read.call_args.kwargs["periods"]] == read_months
    assert whole.months is not None
    assert to_date.months is not None
    assert whole.comparison is not None
    assert whole.months[-1].costs.tenants == {t.tenant: t.total for t in whole.summary.tenants}
    # No usage after November 20: November to date is the whole of November.
    assert [(m.month, m.costs.tenants) for m in whole.months] == [(m.month, m.costs.tenants) for m in to_date.months]
    assert whole.comparison.total.previous == whole.months[-2].costs.total == Decimal("13.00")


def test_a_member_compares_only_their_own_tenant(small_ledger) -> None:
    member = get_scope(user_in(tenants=("acme",)))
    with time_machine.travel(NOW, tick=False):
        board = get_finance_dashboard(scope=member, start=at(date(2026, 11, 1), 0), end=at(date(2026, 11, 21), 0))
    assert board.comparison is not None
    assert board.months is not None
    assert [t.tenant for t in board.comparison.tenants] == ["acme"]
    assert board.comparison.total == Change(Decimal("2.33"), Decimal("2.00"))
    assert all(set(m.costs.tenants) <= {"acme"} for m in board.months)


def test_dashboard_page_labels_the_comparison_with_its_dates(client, small_ledger) -> None:
    client.force_login(user_in(FINANCE_GROUP))
    with time_machine.travel(NOW, tick=False):
        html = client.get("/finance/", {"start": "2026-11-01", "end": "2026-11-20"}).content.decode()
    assert 'data-testid="comparison"' in html
    assert "The previous period: 2026-10-01 to 2026-10-20" in html
    assert "?start=2026-10-01&amp;end=2026-10-20" in html  # opens the previous period
    assert 'data-figure="cost|2026-10-01T00:00:00+00:00|2026-10-21T00:00:00+00:00|tenant=acme"' in html
    assert 'data-testid="comparison-total-change">-3.17<' in html
    assert 'data-testid="comparison-total-change-pct">-52.8 %<' in html
    assert 'data-testid="months-chart"' in html


def test_portal_compares_the_tenants_cost(client, small_ledger) -> None:
    client.force_login(user_in(tenants=("acme",)))
    with time_machine.travel(NOW, tick=False):
        resp = client.get("/tenants/acme/", {"start": "2026-11-01", "end": "2026-11-20"})
    portal = resp.context["portal"]
    assert portal.comparison.total == Change(Decimal("2.33"), Decimal("2.00"))
    assert portal.period_cost == Decimal("2.33")
    assert [m.costs.total for m in portal.months] == [0, 0, Decimal("3.00"), 0, Decimal("9.00"), Decimal("2.33")]
    html = resp.content.decode()
    assert 'data-testid="portal-previous"' in html
    assert "+0.33 USD (+16.5 %)" in html


# --- Explore: sorting, search, the previous period, the bars ---------------------------------------


def _explore(client, **query: str):
    params = {"start": "2026-11-01", "end": "2026-11-20", **query}
    with time_machine.travel(NOW, tick=False):
        return client.get("/explore/", params)


def test_explore_sorts_by_any_column_and_compares_with_the_previous_period(client, small_ledger) -> None:
    client.force_login(user_in(FINANCE_GROUP))
    resp = _explore(client)
    assert resp.status_code == 200
    rows = resp.context["explore"].rows
    assert [r.name for r in rows] == ["acme", "initech"]  # costliest first, as before
    assert [(r.shown.cost, r.previous_cost, r.change) for r in rows] == [
        (Decimal("2.33"), Decimal("2.00"), Decimal("0.33")), (Decimal("0.50"), Decimal(0), Decimal("0.50"))]
    assert rows[1].change_pct is None
    assert [r.name for r in _explore(client, sort="cost").context["explore"].rows] == ["initech", "acme"]
    assert [r.name for r in _explore(client, sort="-change").context["explore"].rows] == ["initech", "acme"]
    assert [r.name for r in _explore(client, sort="-name").context["explore"].rows] == ["initech", "acme"]
    assert [r.name for r in _explore(client, sort="previous_cost").context["explore"].rows] == ["initech", "acme"]
    # The namespace level of acme, sorted by name: the previous period's figure of each namespace.
    ns = _explore(client, tenant="acme", sort="name").context["explore"].rows
    assert [(r.name, r.shown.cost, r.previous_cost) for r in ns] == [("acme-prod", Decimal("2.33"), Decimal("2.00"))]
    html = resp.content.decode()
    assert 'data-testid="sort-cost"' in html
    assert "sort=cost" in html
    assert 'data-figure="cost|2026-10-01T00:00:00+00:00|2026-10-21T00:00:00+00:00|tenant=acme"' in html


@pytest.mark.parametrize("sort", ["price", "-", "--cost", "cost;drop"])
def test_an_unknown_sort_column_is_a_400_with_the_reason(client, small_ledger, sort: str) -> None:
    client.force_login(user_in(FINANCE_GROUP))
    page = _explore(client, sort=sort)
    assert page.status_code == 400
    assert "sort: unknown column" in page.content.decode()
    csv_resp = _explore(client, sort=sort, format="csv")
    assert csv_resp.status_code == 400
    assert csv_resp.content.decode().startswith("sort: unknown column")


def test_explore_search_filters_the_levels_rows_by_name_within_the_scope(client, small_ledger) -> None:
    client.force_login(user_in(FINANCE_GROUP))
    found = _explore(client, q="  ACME ").context
    assert [r.name for r in found["explore"].rows] == ["acme"]
    assert found["cost_total"] == Decimal("2.33")  # the total is the rows shown
    assert found["figures"]["cost"].endswith("|search=ACME")  # a narrowed total has a key of its own
    assert _explore(client, q="robot").context["explore"].rows[0].name == "acme"  # the tenant's name too
    assert _explore(client, q="nothing-like-it").context["explore"].rows == []
    # A member searching for another tenant finds nothing: the rows are scoped first.
    client.force_login(user_in(tenants=("acme",)))
    assert _explore(client, q="initech").context["explore"].rows == []
    assert [r.name for r in _explore(client, q="a").context["explore"].rows] == ["acme"]


def test_the_levels_bars_add_up_to_its_total(client, small_ledger) -> None:
    costs = [Decimal(n) / 100 for n in range(1, 20)]
    bars = level_bars([f"row-{i}" for i in range(len(costs))], costs)
    assert len(bars) == TOP_BARS + 1
    assert sum(b[1] for b in bars) == sum(costs)
    assert level_bars(["a"], [Decimal("1.25")]) == [("a", Decimal("1.25"))]
    client.force_login(user_in(FINANCE_GROUP))
    html = _explore(client).content.decode()
    assert 'data-testid="explore-chart"' in html


def test_explores_csv_has_the_previous_cost_and_change_in_the_pages_order_and_search(client, small_ledger) -> None:
    client.force_login(user_in(FINANCE_GROUP))
    resp = _explore(client, format="csv", sort="name")
    header, *rows = list(csv.reader(io.StringIO(resp.content.decode("utf-8-sig"))))
    records = [dict(zip(header, r, strict=True)) for r in rows]
    assert [(r["name"], r["cost"], r["previous_cost"], r["change"]) for r in records] == [
        ("acme", "2.33", "2.00", "0.33"), ("initech", "0.50", "0.00", "0.50"), ("(total)", "2.83", "2.00", "0.83")]
    found = _explore(client, format="csv", q="init")
    assert [r[0] for r in list(csv.reader(io.StringIO(found.content.decode("utf-8-sig"))))[1:]] == ["initech", "(total)"]
