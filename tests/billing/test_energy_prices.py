"""Energy priced and its emissions (docs/billing.md, Energy): each node-hour's energy × the price
(and CO2e factor) of its node's location in effect on that hour's date, summed, rounded once; "—"
where some energy had no price. Locations and rates are validated (400 with the reason, nothing
written) and audited; a change never re-prices the past."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.calendar import month_of
from billing.ledger.energy import any_energy_rate
from billing.ledger.models import GpuHour, UsageHour
from billing.models import AuditEvent, Location, LocationRate, Node, NodeLocation, RateCard, Tenant
from billing.queries.portal import get_tenant_portal
from billing.scope import ADMIN_GROUP, get_scope
from billing.services.exports.focus_dataset import build_fleet_focus_rows
from billing.services.fleet import FIRST_LOCATION_FROM, add_location, set_location_rate
from tests import clock
from tests.conftest import A100, user_in, with_day

pytestmark = pytest.mark.django_db

J_PER_KWH = Decimal(3_600_000)


def usage(node: str, hour: datetime, *, pod: str, kwh: str, charge: str = "1.00") -> UsageHour:
    """One hour-ledger row of acme's `pod` on `node`'s GPU, with `kwh` of energy attributed to it, and
    its GPU-hour (priced: its card cost is its workloads' charges, no idle)."""
    row = UsageHour.objects.create(
        hour=hour, gpu_uuid=f"GPU-{node}", node=Node.objects.get_or_create(name=node)[0], tenant="acme",
        namespace="acme-prod", pod=pod, container="main", pod_uid=f"uid-{pod}", sla_tier="gold", seconds=3600,
        mem_used_mb_s=0, mem_granted_mb_s=0, mem_billed_mb_s=0, sm_used_s=0, sm_granted_s=0, sm_billed_s=0,
        pcie_mb=0, share_gpu_s=Decimal(1800), charge=Decimal(charge), idle_share=Decimal(0),
        energy_j=Decimal(kwh) * J_PER_KWH,
    )
    gpu, _ = GpuHour.objects.get_or_create(
        node=row.node, gpu_uuid=row.gpu_uuid, hour=hour,
        defaults={"gpu_model": A100["model"], "metered_seconds": 3600, "card_cost": 0, "charged": 0, "idle_cost": 0,
                  "idle_allocated": 0, "currency": "USD", "priced": True})
    gpu.card_cost += row.charge
    gpu.charged += row.charge
    gpu.energy_j += row.energy_j
    gpu.save()
    return with_day(row)


def admin_scope():
    from django.contrib.auth.models import User

    return get_scope(User.objects.filter(username=f"u-{ADMIN_GROUP}-").first() or user_in(ADMIN_GROUP))


def place(node: str, label: str, since: date = FIRST_LOCATION_FROM) -> None:
    """A hand-written node location (the service only lets a change start tomorrow)."""
    location = Location.objects.get_or_create(label=label, defaults={"created_at": clock.now()})[0]
    NodeLocation.objects.create(node=Node.objects.get_or_create(name=node)[0], location=location,
                                effective_from=since, created_at=clock.now())


def rate(label: str, since: date, price: str | None, co2e: str | None) -> None:
    """A hand-written rate from a past date (the service only lets one start tomorrow)."""
    location = Location.objects.get_or_create(label=label, defaults={"created_at": clock.now()})[0]
    LocationRate.objects.create(location=location, effective_from=since, currency="USD" if price else "",
                                price_per_kwh=None if price is None else Decimal(price),
                                co2e_kg_per_kwh=None if co2e is None else Decimal(co2e), created_at=clock.now())


@pytest.fixture
def ledger(db) -> date:
    """Two nodes in two locations over two days; eu-west-dc1's price changes between them. Returns day 0.

    bert-1 on gpu-a (eu-west-dc1): 1 kWh on day 0 at 0.20 USD and 0.30 kg, 2 kWh on day 1 at 0.30 USD
    and 0.25 kg: 0.80 USD and 0.80 kg. llm-1 on gpu-b (us-east-dc2, 0.10 USD, no CO2e factor): 0.5 kWh
    on day 0: 0.05 USD, CO2e unknown."""
    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3.6"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    Tenant.objects.create(slug="acme", name="Acme Robotics")
    day0 = clock.now().date() - timedelta(days=5)
    at = datetime(day0.year, day0.month, day0.day, 10, tzinfo=UTC)
    usage("gpu-a", at, pod="bert-1", kwh="1")
    usage("gpu-a", at + timedelta(days=1), pod="bert-1", kwh="2")
    usage("gpu-b", at, pod="llm-1", kwh="0.5")
    place("gpu-a", "eu-west-dc1")
    place("gpu-b", "us-east-dc2")
    rate("eu-west-dc1", date(2020, 1, 1), "0.20", "0.30")
    rate("eu-west-dc1", day0 + timedelta(days=1), "0.30", "0.25")  # hours before keep the old price
    rate("us-east-dc2", date(2020, 1, 1), "0.10", None)
    return day0


def portal(day0: date):
    start = datetime(day0.year, day0.month, day0.day, tzinfo=UTC)
    return get_tenant_portal(scope=admin_scope(), slug="acme", start=start,
                             end=start + timedelta(days=2), now=clock.now(), reasons=False)


def test_each_hour_is_priced_at_its_locations_rate_of_that_day(ledger):
    page = portal(ledger)
    by_pod = {w.pod: w for w in page.workloads}
    assert (by_pod["bert-1"].energy_kwh, by_pod["bert-1"].energy_cost, by_pod["bert-1"].co2e_kg) == (
        Decimal("3.00"), Decimal("0.80"), Decimal("0.80"))
    assert (by_pod["llm-1"].energy_cost, by_pod["llm-1"].co2e_kg) == (Decimal("0.05"), None)
    assert (page.period_energy_cost, page.period_co2e_kg) == (Decimal("0.85"), None)


def test_the_day_ledger_and_the_hour_ledger_price_alike(ledger):
    """A whole-day period reads the day ledger, a part of a day the hour ledger: the same figures."""
    start = datetime(ledger.year, ledger.month, ledger.day, tzinfo=UTC)
    scope = admin_scope()
    by_hours = get_tenant_portal(scope=scope, slug="acme", start=start + timedelta(hours=1),
                                 end=start + timedelta(days=1, hours=23), now=clock.now(), reasons=False)
    assert (by_hours.period_energy_cost, by_hours.period_co2e_kg) == (Decimal("0.85"), None)
    assert {w.pod: w.energy_cost for w in by_hours.workloads} == {"bert-1": Decimal("0.80"), "llm-1": Decimal("0.05")}


def test_energy_without_a_location_or_a_price_is_unknown_not_zero(ledger):
    NodeLocation.objects.filter(node__name="gpu-b").delete()
    page = portal(ledger)
    by_pod = {w.pod: w for w in page.workloads}
    assert by_pod["llm-1"].energy_cost is None
    assert by_pod["bert-1"].energy_cost == Decimal("0.80")
    assert page.period_energy_cost is None
    # A workload that drew no energy is never unknown: 0 kWh costs 0.
    usage("gpu-c", datetime(ledger.year, ledger.month, ledger.day, 12, tzinfo=UTC), pod="idle-1", kwh="0")
    assert {w.pod: w.energy_cost for w in portal(ledger).workloads}["idle-1"] == Decimal("0.00")


def test_a_fleet_with_no_rate_at_all_reads_energy_cost_as_unknown_and_no_energy_as_zero(client, ledger):
    """No node has a location with a rate: the reads skip the rates' join (billing.ledger.energy) and
    give what the join gives when it finds none."""
    NodeLocation.objects.all().delete()
    assert not any_energy_rate()
    usage("gpu-c", datetime(ledger.year, ledger.month, ledger.day, 12, tzinfo=UTC), pod="idle-1", kwh="0")
    page = portal(ledger)
    assert {w.pod: (w.energy_kwh, w.energy_cost, w.co2e_kg) for w in page.workloads} == {
        "bert-1": (Decimal("3.00"), None, None), "llm-1": (Decimal("0.50"), None, None),
        "idle-1": (Decimal("0.00"), Decimal("0.00"), Decimal("0.000"))}
    assert (page.period_energy_cost, page.period_co2e_kg) == (None, None)
    admin_client(client)
    start = datetime(ledger.year, ledger.month, ledger.day, tzinfo=UTC)
    window = f"{start:%Y-%m-%dT%H:%M:%SZ},{start + timedelta(days=2):%Y-%m-%dT%H:%M:%SZ}"
    pods = client.get(f"/allocation/compute?window={window}&aggregate=pod&accumulate=true").json()["data"][0]
    assert (pods["bert-1"]["gpuEnergyKWh"], pods["bert-1"]["gpuEnergyCost"], pods["bert-1"]["gpuCO2eKg"]) == (
        pytest.approx(3.0), None, None)
    assert (pods["idle-1"]["gpuEnergyCost"], pods["idle-1"]["gpuCO2eKg"]) == (0, 0)


def test_energy_cost_is_never_on_the_invoice(ledger):
    """The GPU cost is what it was without locations: energy cost is information beside it."""
    with_prices = portal(ledger)
    LocationRate.objects.all().delete()
    without = portal(ledger)
    assert with_prices.period_cost == without.period_cost == Decimal("3.00")
    assert without.period_energy_cost is None


def test_the_portal_shows_cost_and_co2e_beside_kwh_and_its_csv_writes_them(client, ledger):
    admin_client(client)
    end = ledger + timedelta(days=1)
    page = client.get(f"/tenants/acme/?start={ledger}&end={end}").content.decode()
    rows = re.findall(r'<tr data-testid="workload-row">.*?</tr>', page, re.S)
    bert = next(r for r in rows if "bert-1" in r)
    llm = next(r for r in rows if "llm-1" in r)
    assert re.search(r'data-testid="workload-energy-cost"[^>]*>0\.80 USD<', bert), bert
    assert re.search(r'data-testid="workload-co2e"[^>]*>0\.80<', bert), bert
    assert re.search(r'data-testid="workload-co2e"[^>]*><span title="[^"]+">—</span>', llm), llm
    assert re.search(r'data-testid="workload-energy-cost-total"[^>]*>0\.85 USD<', page)
    assert 'data-testid="energy-cost-note"' in page
    body = client.get(f"/tenants/acme/?start={ledger}&end={end}&format=csv").content.decode()
    table = list(csv.DictReader(io.StringIO(body.lstrip("\ufeff"))))
    by_pod = {r["pod"] or r["namespace"]: r for r in table}
    assert (by_pod["bert-1"]["energy_kwh"], by_pod["bert-1"]["energy_cost"], by_pod["bert-1"]["co2e_kg"]) == (
        "3.0000", "0.80", "0.8000")
    assert (by_pod["llm-1"]["energy_cost"], by_pod["llm-1"]["co2e_kg"]) == ("0.05", "")
    assert (by_pod["(total)"]["energy_cost"], by_pod["(total)"]["co2e_kg"]) == ("0.85", "")


def test_the_allocation_api_adds_energy_cost_and_co2e_fields(client, ledger):
    admin_client(client)
    start = datetime(ledger.year, ledger.month, ledger.day, tzinfo=UTC)
    window = f"{start:%Y-%m-%dT%H:%M:%SZ},{start + timedelta(days=2):%Y-%m-%dT%H:%M:%SZ}"
    api = client.get(f"/allocation/compute?window={window}&aggregate=pod&accumulate=true").json()
    pods = api["data"][0]
    assert (pods["bert-1"]["gpuEnergyKWh"], pods["bert-1"]["gpuEnergyCost"], pods["bert-1"]["gpuCO2eKg"]) == (
        pytest.approx(3.0), pytest.approx(0.8), pytest.approx(0.8))
    assert (pods["llm-1"]["gpuEnergyCost"], pods["llm-1"]["gpuCO2eKg"]) == (pytest.approx(0.05), None)
    # OpenCost's fields are all still there, unchanged in name.
    assert {"gpuCost", "totalCost", "gpuEnergyKWh", "window", "properties"} <= set(pods["bert-1"])
    # Hour by hour (the hour ledger) the price change falls between the two hours of bert-1.
    hourly = client.get(f"/allocation/compute?window={window}&aggregate=pod&step=1d").json()["data"]
    assert [d["bert-1"]["gpuEnergyCost"] for d in hourly if "bert-1" in d] == [pytest.approx(0.2), pytest.approx(0.6)]


def test_the_focus_dataset_carries_energy_cost_and_co2e(ledger):
    months = {month_of(datetime(d.year, d.month, d.day, tzinfo=UTC)) for d in (ledger, ledger + timedelta(days=1))}
    rows = [r for month in sorted(months) for r in build_fleet_focus_rows(month) if r.get("x_EnergyKWh")]
    by = {(r["AllocatedResourceName"], r["ChargePeriodStart"].date()): r for r in rows}
    day0 = by[("acme-prod/bert-1/main", ledger)]
    day1 = by[("acme-prod/bert-1/main", ledger + timedelta(days=1))]
    assert (day0["x_EnergyCost"], day0["x_CO2eKg"]) == (Decimal("0.2"), Decimal("0.3"))
    assert (day1["x_EnergyCost"], day1["x_CO2eKg"]) == (Decimal("0.6"), Decimal("0.5"))
    llm = by[("acme-prod/llm-1/main", ledger)]
    assert (llm["x_EnergyCost"], llm["x_CO2eKg"]) == (Decimal("0.05"), None)
    assert all(r["BilledCost"] == Decimal("1.00") for r in (day0, day1, llm))  # not added to the bill


# --- Changing locations and rates: validated, audited, never re-pricing the past -------------------

def admin_client(client):
    from django.contrib.auth.models import User

    client.force_login(User.objects.filter(username=f"u-{ADMIN_GROUP}-").first() or user_in(ADMIN_GROUP))
    return client


def test_an_admin_adds_a_location_and_sets_its_rate_from_tomorrow_audited(client, ledger):
    admin = admin_client(client)
    assert admin.post("/locations/", {"label": "ap-south-dc3"}).status_code == 302
    tomorrow = clock.now().date() + timedelta(days=1)
    response = admin.post("/locations/rates/", {"location": "ap-south-dc3", "effective_from": tomorrow.isoformat(),
                                                "price_per_kwh": "0.125", "co2e_kg_per_kwh": "0.7"})
    assert response.status_code == 302, response.content.decode()
    saved = LocationRate.objects.get(location__label="ap-south-dc3")
    assert (saved.price_per_kwh, saved.currency, saved.co2e_kg_per_kwh) == (Decimal("0.125"), "USD", Decimal("0.7"))
    events = list(AuditEvent.objects.filter(object_id="ap-south-dc3").order_by("id").values_list("action", "after"))
    assert [a for a, _ in events] == ["location.created", "location.rate_set"]
    assert events[1][1] == {"location": "ap-south-dc3", "effective_from": tomorrow.isoformat(),
                            "price_per_kwh": "0.125000", "currency": "USD", "co2e_kg_per_kwh": "0.700000"}
    page = admin.get("/locations/").content.decode()
    assert f'data-testid="location-rate-ap-south-dc3-{tomorrow.isoformat()}" data-state="upcoming"' in page


@pytest.mark.parametrize(("form", "reason"), [
    ({"price_per_kwh": "-1"}, "price per kWh must be from 0"),
    ({"price_per_kwh": "abc"}, "is not a number"),
    ({"price_per_kwh": "0.1234567"}, "at most 6 decimal places"),
    ({"price_per_kwh": "NaN"}, "price per kWh must be from 0"),
    ({"co2e_kg_per_kwh": "12"}, "kg CO2e per kWh must be from 0"),
    ({"effective_from": "today"}, "a rate starts on"),
    ({"effective_from": "not-a-date"}, "Enter a valid date"),
    ({"location": "nowhere"}, "no location"),
])
def test_a_bad_rate_is_a_400_with_its_reason_and_changes_nothing(client, ledger, form, reason):
    admin = admin_client(client)
    today = clock.now().date()
    data = {"location": "eu-west-dc1", "effective_from": (today + timedelta(days=1)).isoformat(),
            "price_per_kwh": "0.25", "co2e_kg_per_kwh": "0.2", **form}
    if data["effective_from"] == "today":
        data["effective_from"] = today.isoformat()
    before = list(LocationRate.objects.values_list("id", "price_per_kwh", "co2e_kg_per_kwh", "effective_from"))
    response = admin.post("/locations/rates/", data)
    assert response.status_code == 400
    assert reason in response.content.decode()
    assert list(LocationRate.objects.values_list("id", "price_per_kwh", "co2e_kg_per_kwh", "effective_from")) == before
    assert not AuditEvent.objects.filter(action="location.rate_set").exists()


@pytest.mark.parametrize("label", ["EU-West", "-dc1", "a" * 64, "dc 1", ""])
def test_a_bad_location_label_is_a_400_and_adds_nothing(client, db, label):
    response = admin_client(client).post("/locations/", {"label": label})
    assert response.status_code == 400
    assert not Location.objects.exists()
    assert not AuditEvent.objects.exists()


def test_a_location_twice_is_a_400(client, db):
    admin = admin_client(client)
    assert admin.post("/locations/", {"label": "eu-west-dc1"}).status_code == 302
    response = admin.post("/locations/", {"label": "eu-west-dc1"})
    assert response.status_code == 400
    assert "exists already" in response.content.decode()


def test_a_price_needs_the_fleets_currency(db):
    add_location(label="eu-west-dc1", now=clock.now(), actor_label="t")
    from billing.errors import InvalidInput

    with pytest.raises(InvalidInput, match="no rate card prices the fleet yet"):
        set_location_rate(label="eu-west-dc1", effective_from=clock.now().date() + timedelta(days=1),
                          price_per_kwh="0.2", co2e_kg_per_kwh="", now=clock.now(), actor_label="t")
    # A CO2e factor alone needs no currency.
    saved = set_location_rate(label="eu-west-dc1", effective_from=clock.now().date() + timedelta(days=1),
                              price_per_kwh="", co2e_kg_per_kwh="0.4", now=clock.now(), actor_label="t")
    assert (saved.price_per_kwh, saved.currency, saved.co2e_kg_per_kwh) == (None, "", Decimal("0.4"))


def test_a_nodes_first_location_covers_its_past_and_a_move_starts_tomorrow(client, ledger):
    admin = admin_client(client)
    NodeLocation.objects.filter(node__name="gpu-b").delete()
    assert portal(ledger).period_energy_cost is None
    assert admin.post("/nodes/gpu-b/location/", {"location": "us-east-dc2"}).status_code == 302
    assert portal(ledger).period_energy_cost == Decimal("0.85")  # its past energy had no price: now it has
    # A move never re-prices what is shown: it starts tomorrow.
    assert admin.post("/nodes/gpu-b/location/", {"location": "eu-west-dc1"}).status_code == 302
    assert portal(ledger).period_energy_cost == Decimal("0.85")
    moves = NodeLocation.objects.filter(node__name="gpu-b").order_by("effective_from")
    assert [(m.location.label, m.effective_from) for m in moves] == [
        ("us-east-dc2", FIRST_LOCATION_FROM), ("eu-west-dc1", clock.now().date() + timedelta(days=1))]
    events = list(AuditEvent.objects.filter(action="node.location_set").order_by("id").values_list("before", "after"))
    assert events == [
        (None, {"location": "us-east-dc2", "effective_from": FIRST_LOCATION_FROM.isoformat()}),
        ({"location": "us-east-dc2", "effective_from": FIRST_LOCATION_FROM.isoformat()},
         {"location": "eu-west-dc1", "effective_from": (clock.now().date() + timedelta(days=1)).isoformat()})]
    page = admin.get("/nodes/").content.decode()
    assert re.search(r'data-testid="node-location-gpu-b"><strong>us-east-dc2</strong>', page)


@pytest.mark.parametrize(("node", "location", "reason"), [
    ("gpu-b", "nowhere", "no location"), ("no-such-node", "eu-west-dc1", "no node"),
    ("gpu-a", "eu-west-dc1", "already"), ("gpu-a", "", "This field is required"),
])
def test_a_bad_node_location_is_a_400_and_changes_nothing(client, ledger, node, location, reason):
    before = list(NodeLocation.objects.values_list("id", "node_id", "location_id", "effective_from"))
    response = admin_client(client).post(f"/nodes/{node}/location/", {"location": location})
    assert response.status_code == 400
    assert reason in response.content.decode()
    assert list(NodeLocation.objects.values_list("id", "node_id", "location_id", "effective_from")) == before
    assert not AuditEvent.objects.filter(action="node.location_set").exists()


def test_locations_are_for_platform_admins_only(client, ledger):
    from billing.scope import FINANCE_GROUP

    client.force_login(user_in(FINANCE_GROUP))
    assert client.get("/locations/").status_code == 403
    assert client.post("/locations/", {"label": "x-dc"}).status_code == 403
    assert client.post("/nodes/gpu-a/location/", {"location": "us-east-dc2"}).status_code == 403
    assert not Location.objects.filter(label="x-dc").exists()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kwh=st.lists(st.decimals(min_value=0, max_value=50, places=3), min_size=1, max_size=4),
       price=st.decimals(min_value=0, max_value=2, places=6))
def test_the_tenants_energy_cost_is_the_exact_sum_rounded_once_and_its_rows_add_up(db, kwh, price):
    """Whatever the energies and the price, the workloads shown add up to the tenant's figure, which
    is Σ kWh × price rounded once (half-even) to the cent."""
    UsageHour.objects.all().delete()
    GpuHour.objects.all().delete()
    Tenant.objects.get_or_create(slug="acme", defaults={"name": "Acme"})
    RateCard.objects.get_or_create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3.6"),
                                   effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    LocationRate.objects.all().delete()
    NodeLocation.objects.all().delete()
    day0 = clock.now().date() - timedelta(days=3)
    at = datetime(day0.year, day0.month, day0.day, 9, tzinfo=UTC)
    for i, k in enumerate(kwh):
        usage("gpu-a", at, pod=f"p-{i}", kwh=str(k))
    place("gpu-a", "eu-west-dc1")
    rate("eu-west-dc1", date(2020, 1, 1), str(price), None)
    page = portal(day0)
    exact = sum(kwh, Decimal(0)) * price
    assert page.period_energy_cost == exact.quantize(Decimal("0.01"))
    assert sum(w.energy_cost for w in page.workloads) == page.period_energy_cost
