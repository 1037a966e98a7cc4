"""The hour ledger is kept VGPU_HOUR_RETENTION_DAYS, then pruned a UTC day at a time; days and
invoices are kept for good: pruning leaves every day row and invoice as it was, prunes only whole
days past retention whose day rows hold their hours' sums, twice is once, and an unsound setting
prunes nothing. Reads that need hours before the earliest hour kept answer from days where the
period is whole UTC days (the dashboard's chart) or are refused naming that hour (API,
rebuild_days), never summed from what is left. FOCUS files answer pruned days from days, the same
rows; a day whose days could not give them (a price change inside it) keeps its hours for good."""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import override_settings
from django.urls import reverse

from billing import tasks
from billing.checks import check_retention
from billing.ledger import reads, totals
from billing.ledger.exports import list_focus_ledger_rows
from billing.ledger.models import GpuDay, GpuHour, UsageDay, UsageHour
from billing.ledger.partitions import day_bounds
from billing.ledger.retention import HoursPruned, RetentionPolicy, apply_retention, get_retention_state
from billing.ledger.rollup import rebuild_days
from billing.models import Invoice, InvoiceLine, Node, RateCard, Tenant
from billing.models.fleet import Location, LocationRate, NodeLocation
from billing.scope import FINANCE_GROUP, Scope
from billing.services.exports.focus import build_focus_rows
from billing.services.exports.focus_dataset import build_fleet_focus_rows
from billing.services.exports.invoices import get_invoice_document
from billing.services.invoicing.close import close_period
from tests.conftest import user_in

pytestmark = pytest.mark.django_db

D = Decimal
OLD = date(2026, 1, 10)  # past retention at PRUNE_AT
NEW = date(2027, 1, 20)  # inside it
JAN = date(2026, 1, 1)
PRUNE_AT = day_bounds(OLD)[1] + RetentionPolicy.from_settings().hour_retention  # OLD's hours go at this instant
_ZEROS = {f: D(0) for f in ("mem_billed_mb_s", "sm_billed_s", "pcie_mb", "mem_granted_mb_s", "sm_granted_s",
                            "mem_used_mb_s", "sm_used_s")}


def at(day: date, hour: int) -> datetime:
    return datetime(day.year, day.month, day.day, hour, tzinfo=UTC)


def hour_rows(node: Node, hour: datetime, *, charge: str) -> None:
    """One priced card-hour of one pod (card cost 3, the rest idle); no day rows."""
    GpuHour.objects.create(gpu_uuid="GPU-a", node=node, gpu_model="A100", hour=hour, metered_seconds=D(3600),
                           card_cost=D(3), charged=D(charge), idle_cost=D(3) - D(charge), idle_allocated=D(0),
                           currency="USD", priced=True)
    UsageHour.objects.create(gpu_uuid="GPU-a", node=node, tenant="acme", namespace="acme-ns", pod="bert",
                             container="main", pod_uid="uid-bert", sla_tier="gold", seconds=D(3600),
                             share_gpu_s=D(charge) * 1200, charge=D(charge), idle_share=D(0), hour=hour, **_ZEROS)


@pytest.fixture
def ledger(db) -> Node:
    """Two hours on OLD (its January closed into an invoice) and one on NEW, with their day rows."""
    RateCard.objects.create(gpu_model="A100", currency="USD", price_per_gpu_hour=D("3"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    Tenant.objects.create(slug="acme", name="acme")
    node = Node.objects.create(name="node-1", cluster="east")
    hour_rows(node, at(OLD, 10), charge="1.25")
    hour_rows(node, at(OLD, 11), charge="0.5")
    hour_rows(node, at(NEW, 3), charge="2")
    rebuild_days(start=at(OLD, 0), end=at(NEW + timedelta(days=1), 0))
    close_period(month=JAN, now=datetime(2026, 2, 2, tzinfo=UTC))
    return node


def day_rows() -> tuple[list[Any], list[Any]]:
    return (list(UsageDay.objects.order_by("id").values()), list(GpuDay.objects.order_by("id").values()))


def invoices() -> list[tuple[Any, ...]]:
    return sorted(Invoice.objects.values_list("tenant__slug", "total_minor", "currency")) + sorted(
        InvoiceLine.objects.values_list("kind", "amount", "gpu_hours"))


def hour_days() -> set[date]:
    return {h.astimezone(UTC).date() for h in GpuHour.objects.values_list("hour", flat=True)} | {
        h.astimezone(UTC).date() for h in UsageHour.objects.values_list("hour", flat=True)}


def test_pruning_keeps_every_day_row_the_invoice_and_whole_day_reads_identical(ledger: Node) -> None:
    days_before, invoices_before = day_rows(), invoices()
    assert invoices_before[0] == ("acme", 175, "USD")  # 1.25 + 0.5 from two hours
    jan = (at(JAN, 0), at(date(2026, 2, 1), 0))
    gpu_before = totals.get_gpu_totals(start=jan[0], end=jan[1])
    months_before = totals.list_monthly_card_seconds(start=jan[0], end=jan[1])

    result = apply_retention(now=PRUNE_AT)

    assert result.hours is not None
    assert (result.hours.days, result.hours.usage_rows, result.hours.gpu_rows) == ((OLD,), 2, 2)
    assert hour_days() == {NEW}
    assert day_rows() == days_before
    assert invoices() == invoices_before
    assert totals.get_gpu_totals(start=jan[0], end=jan[1]) == gpu_before  # whole days: the day ledger
    assert totals.list_monthly_card_seconds(start=jan[0], end=jan[1]) == months_before == [
        totals.MonthSeconds(month=JAN, seconds=D(7200), unpriced_seconds=D(0))]


def test_only_whole_days_past_retention_are_pruned_and_twice_is_once(ledger: Node, time_machine: Any) -> None:
    assert apply_retention(now=PRUNE_AT - timedelta(microseconds=1)).hours is None
    assert hour_days() == {OLD, NEW}
    assert get_retention_state(now=PRUNE_AT).hours_retained_from is None

    time_machine.move_to(day_bounds(NEW)[1] + RetentionPolicy.from_settings().hour_retention, tick=False)
    first = tasks.apply_retention.apply().get()
    assert (first["hour_days_pruned"], first["hour_rows_pruned"], first["hour_day_held"]) == (
        [OLD.isoformat(), NEW.isoformat()], 6, None)
    second = tasks.apply_retention.apply().get()
    assert (second["hour_days_pruned"], second["hour_rows_pruned"], second["hour_day_held"]) == ([], 0, None)
    assert get_retention_state(now=PRUNE_AT).hours_retained_from == day_bounds(NEW)[1]


def test_a_day_whose_day_rows_do_not_hold_its_hours_is_kept_until_they_do(ledger: Node) -> None:
    # An hour written in bulk (no day re-derived): the day row no longer equals the day's hours.
    hour_rows(ledger, at(OLD, 12), charge="1")
    days_before = day_rows()

    result = apply_retention(now=PRUNE_AT)

    assert result.hours is not None
    assert (result.hours.days, result.hours.held_day) == ((), OLD)
    assert "2 day rows missing or not equal" in result.hours.held_reason
    assert hour_days() == {OLD, NEW}
    assert day_rows() == days_before
    rebuild_days(start=at(OLD, 0), end=at(OLD + timedelta(days=1), 0))
    assert apply_retention(now=PRUNE_AT).hours.days == (OLD,)  # type: ignore[union-attr]
    assert GpuDay.objects.get(day=at(OLD, 0)).charged == D("2.75")


@override_settings(VGPU_HOUR_RETENTION=timedelta(days=99))
def test_an_hour_retention_shorter_than_the_minutes_is_refused_and_prunes_nothing(ledger: Node) -> None:
    expected = "VGPU_HOUR_RETENTION_DAYS (99) must be at least VGPU_MINUTE_RETENTION_DAYS (100)"
    [error] = check_retention()
    assert error.id == "billing.E004"
    assert expected in error.msg
    with pytest.raises(ValueError, match=r"VGPU_HOUR_RETENTION_DAYS \(99\)"):
        apply_retention(now=PRUNE_AT + timedelta(days=400))
    assert hour_days() == {OLD, NEW}


# --- readers ------------------------------------------------------------------------------------

EARLIEST = "2026-01-11T00:00:00+00:00"  # the first hour kept once OLD is pruned


def test_ledger_reads_of_pruned_hours_are_refused_naming_the_earliest_hour_kept(ledger: Node) -> None:
    apply_retention(now=PRUNE_AT)
    with pytest.raises(HoursPruned, match=re.escape(f"the earliest hour kept is {EARLIEST}")) as refused:
        reads.ledger_for(at(OLD, 6), at(OLD, 18))
    assert refused.value.retained_from == day_bounds(OLD)[1]
    with pytest.raises(HoursPruned):
        reads.bucketed_ledger(at(OLD, 0), at(OLD + timedelta(days=1), 0), "hour")
    with pytest.raises(HoursPruned):  # a day row cannot be cut
        list_focus_ledger_rows(tenant="acme", start=at(OLD, 6), end=at(OLD + timedelta(days=1), 0))
    with pytest.raises(HoursPruned):  # days recomputed from what is left would lose the pruned hours
        rebuild_days(start=at(OLD, 0), end=at(OLD + timedelta(days=1), 0))
    assert reads.ledger_for(at(OLD, 0), at(OLD + timedelta(days=1), 0)) is reads.DAYS
    assert reads.bucketed_ledger(at(NEW, 0), at(NEW, 6), "hour") is reads.HOURS  # kept hours still read


def finance_client() -> Client:
    client = Client()
    client.force_login(User.objects.filter(username=f"u-{FINANCE_GROUP}-").first() or user_in(FINANCE_GROUP))
    return client


def allocation(**params: str) -> tuple[int, Any]:
    response = finance_client().get("/api/v1/allocation", {"aggregate": "tenant", **params})
    return response.status_code, json.loads(response.content)


def test_the_allocation_api_answers_whole_days_from_days_and_refuses_pruned_hours_with_a_400(ledger: Node) -> None:
    whole_day = "2026-01-10T00:00:00Z,2026-01-11T00:00:00Z"
    code, before = allocation(window=whole_day)
    assert code == 200
    apply_retention(now=PRUNE_AT)

    code, after = allocation(window=whole_day)
    assert code == 200
    assert after == before
    assert after["data"][0]["acme"]["totalCost"] == pytest.approx(1.75)
    for params in ({"window": "2026-01-10T09:00:00Z,2026-01-10T12:00:00Z"}, {"window": whole_day, "step": "1h"}):
        code, body = allocation(**params)
        assert code == 400, params
        assert f"the earliest hour kept is {EARLIEST}" in body["errors"][0]["message"]


def test_the_dashboard_of_a_pruned_day_charts_it_by_day_from_the_day_ledger(ledger: Node) -> None:
    period = {"start": OLD.isoformat(), "end": OLD.isoformat()}
    before = finance_client().get(reverse("finance-overview"), period)
    assert before.context["dashboard"].timeline.granularity == "hour"
    apply_retention(now=PRUNE_AT)

    after = finance_client().get(reverse("finance-overview"), period)

    assert after.status_code == 200
    timeline = after.context["dashboard"].timeline
    assert (timeline.granularity, timeline.buckets) == ("day", [at(OLD, 0)])
    assert [sum(s.values) for s in timeline.series if s.key == "acme"] == [D("1.75")]
    assert after.context["summary"].total_gpu_cost == before.context["summary"].total_gpu_cost == D(6)


# --- FOCUS files of invoices whose hours were pruned ---------------------------------------------

CARD_CHANGE = datetime(2026, 1, 15, 12, tzinfo=UTC)  # a new A100 price from noon: the 15th keeps its hours


def month_hours(node: Node) -> None:
    """January 2026 of one GPU, four hours a day shared by two tenants (one spreads idle onto its
    workload, one drew energy), the price changing at noon on the 15th; then its day rows."""
    gpus, usage = [], []
    for day in range(1, 32):
        for hour in (3, 9, 13, 20):
            at_ = datetime(2026, 1, day, hour, tzinfo=UTC)
            gpus.append(GpuHour(gpu_uuid="GPU-a", node=node, gpu_model="A100", hour=at_, metered_seconds=D(3600),
                                card_cost=D(3), charged=D("2.5"), idle_cost=D("0.5"), idle_allocated=D("0.25"),
                                currency="USD", priced=True, energy_j=D(900), idle_energy_j=D(100)))
            for tenant, charge in (("acme", "1.5"), ("beta", "1")):
                usage.append(UsageHour(gpu_uuid="GPU-a", node=node, tenant=tenant, namespace=f"{tenant}-ns",
                                       pod="bert", container="main", pod_uid=f"uid-{tenant}", sla_tier="gold",
                                       seconds=D(3600), share_gpu_s=D(charge) * 1200, charge=D(charge),
                                       idle_share=D("0.25") if tenant == "acme" else D(0),
                                       energy_j=D(hour * 10 + day), hour=at_, **_ZEROS))
    GpuHour.objects.bulk_create(gpus)
    UsageHour.objects.bulk_create(usage)
    rebuild_days(start=at(JAN, 0), end=at(date(2026, 2, 1), 0))


@pytest.fixture
def january(db) -> None:
    RateCard.objects.create(gpu_model="A100", currency="USD", price_per_gpu_hour=D("3"), source_url="https://example.org",
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), effective_to=CARD_CHANGE)
    RateCard.objects.create(gpu_model="A100", currency="USD", price_per_gpu_hour=D("4"), source_url="https://example.org",
                            effective_from=CARD_CHANGE, idle_policy="proportional")
    for slug in ("acme", "beta"):
        Tenant.objects.create(slug=slug, name=slug)
    node = Node.objects.create(name="node-1", cluster="east")
    created = datetime(2025, 1, 1, tzinfo=UTC)
    place = Location.objects.create(label="dc-1", created_at=created)
    NodeLocation.objects.create(node=node, location=place, effective_from=date(2025, 1, 1), created_at=created)
    for effective_from, price in ((date(2025, 1, 1), "0.1"), (date(2026, 1, 20), "0.2")):  # energy: by UTC date
        LocationRate.objects.create(location=place, effective_from=effective_from, price_per_kwh=D(price),
                                    currency="USD", co2e_kg_per_kwh=D("0.4"), created_at=created)
    month_hours(node)
    close_period(month=JAN, now=datetime(2026, 2, 2, tzinfo=UTC))


def focus_files() -> list[list[dict[str, Any]]]:
    everyone = Scope(tenants=None, is_finance=True, is_admin=True)
    return [build_focus_rows(get_invoice_document(scope=everyone, number=number))
            for number in Invoice.objects.order_by("number").values_list("number", flat=True)]


def test_invoices_focus_files_and_the_fleet_dataset_are_the_same_after_their_hours_are_pruned(january: None) -> None:
    invoices_before, fleet_before = focus_files(), build_fleet_focus_rows(JAN)
    assert len(invoices_before) == 2
    # Per day: two workloads, acme's idle and the platform's idle, each twice on the 15th (one per card).
    assert len(fleet_before) == 4 * 31 + 4

    result = apply_retention(now=day_bounds(date(2026, 1, 31))[1] + RetentionPolicy.from_settings().hour_retention)

    assert result.hours is not None
    assert len(result.hours.days) == 30
    assert result.hours.kept_days == ((date(2026, 1, 15), "2 rate card(s) of its GPU models began or ended inside it"),)
    assert hour_days() == {date(2026, 1, 15)}
    assert focus_files() == invoices_before
    assert build_fleet_focus_rows(JAN) == fleet_before


def test_a_day_whose_gpu_hours_differ_in_being_priced_keeps_them_and_later_days_still_go(ledger: Node) -> None:
    GpuHour.objects.filter(hour=at(OLD, 11)).update(priced=False)
    rebuild_days(start=at(OLD, 0), end=at(OLD + timedelta(days=1), 0))
    hour_rows(ledger, at(OLD + timedelta(days=1), 5), charge="1")  # the day after: pruned past it
    rebuild_days(start=at(OLD, 0), end=at(OLD + timedelta(days=2), 0))
    day = (at(OLD, 0), at(OLD + timedelta(days=2), 0))
    rows_before = list_focus_ledger_rows(tenant="acme", start=day[0], end=day[1])

    result = apply_retention(now=PRUNE_AT + timedelta(days=1))

    assert result.hours is not None
    assert result.hours.days == (OLD + timedelta(days=1),)
    assert result.hours.kept_days == ((OLD, "1 GPU(s) whose hours differ in model, currency or being priced"),)
    assert hour_days() == {OLD, NEW}
    assert list_focus_ledger_rows(tenant="acme", start=day[0], end=day[1]) == rows_before
    assert [r.charge for r in rows_before] == [D("1.25"), D(1)]  # the unpriced hour is in neither
