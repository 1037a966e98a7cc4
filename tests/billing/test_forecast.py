"""The one forecast and month-to-date definition (billing.services.budgets.spend.get_month_spends): a
forecast that stays put as an hour of steady use goes by, a partial hour never extrapolated as if
it were a whole one, and the same month to date on the portal, the budget card, the budgets page and
the finance page."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.calendar import month_bounds
from billing.ledger.rollup import rollup_usage
from billing.models import RateCard, Tenant
from billing.services.budgets.spend import evaluate_budgets, get_month_spend, set_budget
from tests import clock
from tests.conftest import A100, make_batch, user_in

pytestmark = pytest.mark.django_db

# acme holds 10 % of an A100 priced at 3600 USD per GPU-hour: 0.10 USD a second, 360 USD an hour.
ACME = [{"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 8192.0, "mem_granted": 8192.0,
         "sm_used": 10.8, "sm_granted": 10.8}]
RATE_PER_HOUR = Decimal(360)


@pytest.fixture
def acme(db):
    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3600"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    return Tenant.objects.create(slug="acme", name="Acme Robotics", namespaces=["acme-prod"])


@pytest.fixture
def hour() -> datetime:
    """10:00 UTC on the 15th of this month: the hour the tests go through."""
    today = clock.now()
    return datetime(today.year, today.month, 15, 10, tzinfo=UTC)


class SteadyUse:
    """acme's pod, metered minute by minute up to the clock, as a node agent uploads it."""

    def __init__(self, post_batch, time_machine, first_minute: datetime) -> None:
        self.post_batch, self.time_machine = post_batch, time_machine
        self.next_minute, self.seq = first_minute, 0

    def run_until(self, at: datetime) -> None:
        self.time_machine.move_to(at, tick=False)
        while self.next_minute + timedelta(minutes=1) <= at:
            self.seq += 1
            batch = make_batch(start=self.next_minute, seq=self.seq, seconds=60, workloads=ACME)
            assert self.post_batch(batch).status_code == 201
            self.next_minute += timedelta(minutes=1)
        rollup_usage(now=clock.now())


def hours_left(now: datetime) -> Decimal:
    _, month_end = month_bounds(now.date().replace(day=1))
    return Decimal((month_end - now).total_seconds()) / 3600


def test_the_forecast_stays_put_as_an_hour_of_steady_use_goes_by(acme, post_batch, time_machine, hour):
    # Use began at 08:30: the 08:00 hour is partial and left out; 09:00 is the one complete hour.
    use = SteadyUse(post_batch, time_machine, hour - timedelta(minutes=90))
    forecasts = []
    for minute in (5, 20, 35, 50, 59):
        use.run_until(hour + timedelta(minutes=minute))
        spend = get_month_spend(tenant="acme", now=clock.now())
        assert spend.month_to_date == Decimal("0.1") * 60 * (90 + minute)  # the hour in progress counts
        assert (spend.rate_hours, spend.rate_per_hour) == (1, RATE_PER_HOUR)
        forecasts.append(spend.forecast)
    # Month to date grows as the hours left shrink: one number, to the ledger unit, all hour long
    # (the old forecast, which took 08:00 to 10:xx as observed time, moved by 20 % here).
    assert max(forecasts) - min(forecasts) < Decimal("0.000001")
    expected = Decimal("0.1") * 60 * 90 + RATE_PER_HOUR * hours_left(hour)
    assert abs(forecasts[0] - expected) < Decimal("0.000001")
    # Past the hour, 10:00 is complete too and joins the rate: still the same forecast.
    use.run_until(hour + timedelta(minutes=70))
    later = get_month_spend(tenant="acme", now=clock.now())
    assert later.rate_hours == 2
    assert abs(later.forecast - expected) < Decimal("0.000001")


def test_a_partial_first_hour_is_not_extrapolated_as_a_whole_one(acme, post_batch, time_machine, hour):
    """The old bug: ten minutes of use were taken as an hour's, and the forecast climbed all hour
    (345.57 → 751.99 → 1,028 → 1,334.91 USD in fifteen minutes on the demo)."""
    use = SteadyUse(post_batch, time_machine, hour)
    for minute in (10, 25, 40):
        use.run_until(hour + timedelta(minutes=minute))
        spend = get_month_spend(tenant="acme", now=clock.now())
        assert spend.rate_per_hour is None
        assert spend.rate_hours == 0
        assert spend.forecast == spend.month_to_date == Decimal("0.1") * 60 * minute
    # The first hour began with the use (partial), so it is never the rate; the next whole one is.
    use.run_until(hour + timedelta(hours=2, minutes=5))
    spend = get_month_spend(tenant="acme", now=clock.now())
    assert (spend.rate_hours, spend.rate_per_hour) == (1, RATE_PER_HOUR)
    assert spend.forecast == spend.month_to_date + RATE_PER_HOUR * hours_left(clock.now())


def test_a_tenant_without_use_forecasts_nothing(acme, hour, time_machine):
    time_machine.move_to(hour, tick=False)
    spend = get_month_spend(tenant="acme", now=clock.now())
    assert (spend.month_to_date, spend.forecast, spend.rate_per_hour) == (Decimal(0), Decimal(0), None)


def _number(html: str, testid: str) -> str:
    match = re.search(rf'data-testid="{testid}"[^>]*>\s*([\d,.]+)\s*USD', html)
    assert match, f"no amount in data-testid={testid}"
    return match.group(1)


def test_month_to_date_is_one_number_on_the_portal_budget_card_budgets_page_and_finance_page(
        acme, post_batch, time_machine, hour, client):
    use = SteadyUse(post_batch, time_machine, hour - timedelta(minutes=30))
    use.run_until(hour + timedelta(minutes=7))
    set_budget(tenant_slug="acme", now=clock.now(), actor_label="test",
               values={"amount": Decimal("10000"), "currency": "USD", "hard_action": "throttle",
                       "owner": "finops@acme.example"})
    evaluate_budgets(now=clock.now())
    # Usage keeps landing after the last evaluation: every page still shows the same month to date.
    use.run_until(hour + timedelta(minutes=12, seconds=30))
    expected = get_month_spend(tenant="acme", now=clock.now())
    assert expected.month_to_date == Decimal("0.1") * 60 * 42

    client.force_login(user_in(tenants=("acme",)))
    portal = client.get("/tenants/acme/").content.decode()
    card = re.search(r'data-testid="budget-status".*?\((?P<spend>[\d,.]+) USD\)', portal, re.S)
    assert card
    assert card["spend"] == _number(portal, "mtd-cost") == "252.00"
    assert _number(portal, "forecast") == f"{expected.forecast:,.2f}"

    client.force_login(user_in(group="finance"))
    budgets = client.get("/budgets/").content.decode()
    row = re.search(r'data-testid="budget-state-acme".*?<td class="num">(?P<spend>[\d,.]+) USD', budgets, re.S)
    assert row
    assert row["spend"] == "252.00"
    day = hour.date()
    finance = client.get(f"/finance/?start={day.replace(day=1)}&end={day}").content.decode()
    tenant_row = re.search(r'title="acme">Acme Robotics</td>.*?<strong[^>]*>(?P<total>[\d,.]+)', finance, re.S)
    assert tenant_row
    assert tenant_row["total"] == "252.00"


def test_the_month_to_date_shown_is_the_sum_of_its_shown_parts_on_every_page(client, time_machine, hour):
    """Charge and idle share of 0.125 each: the finance page's tenant row shows 0.12 + 0.12 = 0.24
    (each amount rounded once, a total the sum of what is shown), and so do the portal's card, its
    budget card, the tenant list and the budgets page, never 0.25 beside it."""
    from tests.billing.test_portal import usage

    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3.6"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    Tenant.objects.create(slug="acme", name="Acme Robotics")
    time_machine.move_to(hour + timedelta(minutes=30), tick=False)
    usage(hour, charge="0.125", idle="0.125")
    set_budget(tenant_slug="acme", now=clock.now(), actor_label="test",
               values={"amount": Decimal("100"), "currency": "USD", "hard_action": "throttle",
                       "owner": "finops@acme.example"})
    spend = get_month_spend(tenant="acme", now=clock.now())
    assert spend.month_to_date == Decimal("0.25")
    assert spend.month_to_date_shown("USD") == Decimal("0.24")

    client.force_login(user_in(group="finance"))
    portal = client.get("/tenants/acme/").content.decode()
    card = re.search(r'data-testid="budget-status".*?\((?P<spend>[\d,.]+) USD\)', portal, re.S)
    assert card
    assert card["spend"] == _number(portal, "mtd-cost") == "0.24"
    listing = client.get("/tenants/").content.decode()
    assert re.search(r"<td class=\"num\">0\.24 USD</td>", listing)
    budgets = client.get("/budgets/").content.decode()
    row = re.search(r'data-testid="budget-state-acme".*?<td class="num">(?P<spend>[\d,.]+) USD', budgets, re.S)
    assert row
    assert row["spend"] == "0.24"


def test_a_tenant_forecast_far_over_its_budget_is_marked_while_its_state_stays_ok(
        acme, post_batch, time_machine, hour, client):
    """The finance reviewer's finding on the demo: a forecast of 13,156 USD against a budget of
    3,000 showed "ok" in green and sent nothing. With 360 USD an hour the forecast to month end is
    far above 3,000 while the month to date is a fifth of it: the state stays ok (month to date),
    and the budget is marked, notified once, forecast over budget."""
    use = SteadyUse(post_batch, time_machine, hour - timedelta(minutes=90))
    use.run_until(hour + timedelta(minutes=5))
    set_budget(tenant_slug="acme", now=clock.now(), actor_label="test",
               values={"amount": Decimal("3000"), "currency": "USD", "hard_action": "block",
                       "owner": "finops@acme.example"})
    events = evaluate_budgets(now=clock.now())
    spend = get_month_spend(tenant="acme", now=clock.now())
    assert spend.month_to_date == Decimal("0.1") * 60 * 95  # 570 USD, 19 %
    assert spend.forecast > 3000
    assert [e.payload()["event"] for e in events] == ["budget.forecast_over_budget"]
    assert events[0].payload()["state"] == "ok"
    use.run_until(hour + timedelta(minutes=20))
    assert evaluate_budgets(now=clock.now()) == []  # still over: nothing more
    client.force_login(user_in(group="finance"))
    budgets = client.get("/budgets/").content.decode()
    assert re.search(r'data-testid="budget-state-acme" data-state="ok" data-shown-state="forecast-over">'
                     r'<strong class="state-forecast-over">forecast over budget</strong></td>', budgets)
