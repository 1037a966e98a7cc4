"""The hour ledger is kept VGPU_HOUR_RETENTION_DAYS, then pruned a UTC day at a time; days and
invoices are kept for good: pruning leaves every day row and invoice as it was, prunes only whole
days past retention whose day rows hold their hours' sums, twice is once, and an unsound setting
prunes nothing. Reads that need hours before the earliest hour kept answer from days where the
period is whole UTC days (the dashboard's chart) or are refused naming that hour (API, exports,
rebuild_days), never summed from what is left."""

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
from billing.scope import FINANCE_GROUP
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
    with pytest.raises(HoursPruned):
        list_focus_ledger_rows(tenant="acme", start=at(OLD, 0), end=at(OLD + timedelta(days=1), 0))
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
