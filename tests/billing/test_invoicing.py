"""Closing a month: one immutable invoice per tenant, rounded once per line, late usage as
adjustments on the next invoice, safe to rerun after a crash."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import DatabaseError, transaction

from billing.errors import InvalidInput
from billing.ledger.rollup import rollup_usage
from billing.models import AuditEvent, BillingPeriod, Invoice, InvoiceLine, RateCard, Tenant
from billing.money import to_minor_units
from billing.services.invoicing.close import close_period
from tests import clock
from tests.conftest import A100, SHARED_GPU_WORKLOADS, make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fixed_dates_stay_billable(settings):
    """These tests post usage on fixed past dates; keep them inside the late-usage horizon."""
    settings.VGPU_LATE_USAGE_HORIZON = timedelta(days=36500)

OCT = date(2026, 10, 1)
NOV = date(2026, 11, 1)
AFTER_NOV = datetime(2026, 12, 2, tzinfo=UTC)


@pytest.fixture
def priced(one_usd_per_gpu_second):
    return one_usd_per_gpu_second


def _raw(sql: str, *params: Any) -> None:
    # Below the ORM (whose PROTECT would stop a delete first): the database itself refuses.
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(sql, list(params))


def usage(post_batch, *, at: datetime, seq: int, seconds: int = 10):
    assert post_batch(make_batch(start=at, seq=seq, seconds=seconds, workloads=SHARED_GPU_WORKLOADS)).status_code == 201
    rollup_usage(now=clock.now())


def test_closing_a_month_finalizes_one_invoice_per_tenant_with_lines_rounded_once(post_batch, priced):
    # p = 1 USD per GPU-second: acme 10 % × 10 s = 1.00, globex 20 % × 10 s = 2.00.
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1)
    result = close_period(month=NOV, now=AFTER_NOV)
    assert (result.invoices_finalized, result.already_closed) == (2, False)
    invoices = {i.tenant.slug: i for i in Invoice.objects.select_related("tenant")}
    assert invoices["acme"].total_minor == 100
    assert invoices["globex"].total_minor == 200
    assert all(i.status == Invoice.Status.FINALIZED and i.currency == "USD" for i in invoices.values())
    line = invoices["acme"].lines.get()
    assert (line.kind, line.gpu_model, line.sla_tier, line.amount) == ("usage", A100["model"], "gold", Decimal("1"))
    assert line.gpu_hours == Decimal("0.000278")  # 10 % of a card for 10 s = 1 GPU-second
    assert BillingPeriod.objects.get(month=NOV).status == BillingPeriod.Status.CLOSED
    assert AuditEvent.objects.filter(action="invoice.finalized").count() == 2


def test_finalized_invoices_and_their_lines_are_immutable_in_the_database(post_batch, priced):
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1)
    close_period(month=NOV, now=AFTER_NOV)
    invoice = Invoice.objects.get(tenant__slug="acme")
    for attempt in (
        lambda: Invoice.objects.filter(pk=invoice.pk).update(total_minor=1),
        lambda: _raw("DELETE FROM billing_invoice WHERE id = %s", invoice.pk),
        lambda: _raw("DELETE FROM billing_invoiceline WHERE invoice_id = %s", invoice.pk),
        lambda: InvoiceLine.objects.filter(invoice=invoice).update(amount_minor=1),
        lambda: InvoiceLine.objects.create(invoice=invoice, kind="usage", gpu_model="x", sla_tier="y",
                                           usage_month=NOV, gpu_hours=0, amount=1, amount_minor=1),
    ):
        with pytest.raises(DatabaseError, match="immutable"), transaction.atomic():
            attempt()
    assert Invoice.objects.get(pk=invoice.pk).total_minor == 100


def test_late_usage_for_a_closed_month_becomes_an_adjustment_on_the_next_invoice(post_batch, priced):
    usage(post_batch, at=datetime(2026, 10, 20, 12, tzinfo=UTC), seq=1)
    close_period(month=OCT, now=datetime(2026, 11, 2, tzinfo=UTC))
    # A batch for October arrives late (after the close), then November usage.
    usage(post_batch, at=datetime(2026, 10, 31, 23, 59, 40, tzinfo=UTC), seq=2, seconds=20)
    usage(post_batch, at=datetime(2026, 11, 10, tzinfo=UTC), seq=3)
    close_period(month=NOV, now=AFTER_NOV)
    october = Invoice.objects.get(tenant__slug="acme", period__month=OCT)
    assert october.total_minor == 100  # untouched
    november = Invoice.objects.get(tenant__slug="acme", period__month=NOV)
    kinds = {(line.kind, line.usage_month): line.amount_minor for line in november.lines.all()}
    assert kinds == {("usage", NOV): 100, ("adjustment", OCT): 200}
    assert november.total_minor == 300


def test_closing_again_changes_nothing_and_a_crashed_close_resumes(post_batch, priced):
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1)
    close_period(month=NOV, now=AFTER_NOV)
    again = close_period(month=NOV, now=AFTER_NOV + timedelta(hours=1))
    assert again.already_closed
    assert Invoice.objects.count() == 2
    # Simulate a crash after one tenant: period CLOSING, one invoice gone.
    with transaction.atomic():
        period = BillingPeriod.objects.get(month=NOV)
        BillingPeriod.objects.filter(pk=period.pk).update(status=BillingPeriod.Status.CLOSING, closed_at=None)
    Tenant.objects.create(slug="late-tenant", name="Late")
    resumed = close_period(month=NOV, now=AFTER_NOV)
    assert (resumed.invoices_finalized, resumed.invoices_already_final) == (0, 2)
    assert BillingPeriod.objects.get(month=NOV).status == BillingPeriod.Status.CLOSED


def test_a_month_that_is_not_over_is_refused_and_unpriced_usage_never_holds_the_close(post_batch):
    with pytest.raises(InvalidInput, match="not over yet"):
        close_period(month=NOV, now=datetime(2026, 11, 20, tzinfo=UTC))
    assert not BillingPeriod.objects.exists()
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1)  # no rate card: unpriced
    result = close_period(month=NOV, now=AFTER_NOV)
    assert BillingPeriod.objects.get(month=NOV).status == BillingPeriod.Status.CLOSED
    assert [(u.gpu_model, u.gpu_seconds, u.tenants) for u in result.unpriced] == [
        (A100["model"], Decimal(10), ("acme", "globex"))]
    assert not InvoiceLine.objects.exists()  # nothing priced, nothing invoiced: nothing made up either


def test_proportional_idle_policy_adds_an_explicit_idle_line(post_batch, priced):
    RateCard.objects.filter(pk=priced.pk).update(idle_policy="proportional")
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1)
    close_period(month=NOV, now=AFTER_NOV)
    acme = Invoice.objects.get(tenant__slug="acme")
    amounts = {line.kind: line.amount_minor for line in acme.lines.all()}
    # The card costs 10.00 for the 10 s; 7.00 is idle, spread 1:2 over acme and globex.
    assert amounts == {"usage": 100, "idle": 233}


def test_close_period_command_reports_and_rejects_bad_months(post_batch, priced):
    with pytest.raises(Exception, match="YYYY-MM"):
        call_command("close_period", "--month", "2026/11")
    usage(post_batch, at=datetime(2026, 10, 15, 12, tzinfo=UTC), seq=1)
    out = StringIO()
    call_command("close_period", "--month", "2026-10", stdout=out)
    assert "2 invoice(s) finalized" in out.getvalue()


def test_close_period_task_run_twice_finalizes_once(post_batch, priced):
    from billing import tasks

    usage(post_batch, at=datetime(2026, 10, 15, 12, tzinfo=UTC), seq=1)
    first = tasks.close_period.apply(args=("2026-10",)).get()
    second = tasks.close_period.apply(args=("2026-10",)).get()
    assert (first["finalized"], first["already_closed"]) == (2, False)
    assert (second["finalized"], second["already_closed"]) == (0, True)
    assert Invoice.objects.count() == 2


# --- Unit prices (docs/billing.md, Unit prices) -------------------------------------------------

SPLIT_AT = datetime(2026, 11, 15, 12, 5, tzinfo=UTC)


def _card(price: str, start: datetime, end: datetime | None = None) -> RateCard:
    return RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal(price),
                                   effective_from=start, effective_to=end, source_url="https://example.org")


def _document_of(number: str):
    from billing.scope import Scope
    from billing.services.exports import get_invoice_document

    return get_invoice_document(scope=Scope(tenants=None, is_finance=True, is_admin=True), number=number)


def _document(tenant: str = "acme"):
    from billing.scope import Scope
    from billing.services.exports import get_invoice_document

    number = Invoice.objects.get(tenant__slug=tenant, period__month=NOV).number
    return get_invoice_document(scope=Scope(tenants=None, is_finance=True, is_admin=True), number=number)


def _csv_lines(doc) -> list[dict[str, str]]:
    import csv
    import io

    from billing.services.exports import render_invoice_csv

    rows = list(csv.DictReader(io.StringIO(render_invoice_csv(doc).decode("utf-8-sig"))))
    return [r for r in rows if r["line"] not in {"subtotal", "tax", "total"}]


def test_a_line_priced_at_one_rate_states_that_rate_on_the_page_csv_and_pdf(post_batch, client):
    from billing.services.exports.pdf import invoice_pdf_layout
    from tests.conftest import user_in

    _card("5.12", datetime(2020, 1, 1, tzinfo=UTC))
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1, seconds=50)
    close_period(month=NOV, now=AFTER_NOV)
    line = Invoice.objects.get(tenant__slug="acme").lines.get()
    assert line.unit_price == Decimal("5.12")
    assert [(r["price"], r["commitment"], r["billed_basis"], r["alpha"]) for r in line.rates] == [
        ("5.12", False, "max", "0.5")]
    # Quantity × unit price = amount, to the stored quantity's last place.
    assert abs(line.gpu_hours * line.unit_price - line.amount) <= line.unit_price * Decimal("0.0000005")

    doc = _document()
    (row,) = doc.line_rows
    assert (row.unit_price, row.average, row.rates, row.rule, row.reason) == ("5.12", False, "", "", "")
    assert "max(used, granted) memory and SMs, memory weight α = 0.5" in doc.billing_rule_text
    (csv_line,) = _csv_lines(doc)
    assert (csv_line["quantity"], csv_line["unit"], csv_line["unit_price"], csv_line["unit_price_kind"]) == (
        f"{line.gpu_hours:.6f}", "GPU-hour", "5.120000", "rate")
    assert csv_line["rates"] == "5.12 from 2026-11-01T00:00Z until 2026-12-01T00:00Z"
    assert (csv_line["billed_basis"], csv_line["alpha"], csv_line["no_unit_price_reason"]) == ("max", "0.5", "")
    layout = invoice_pdf_layout(doc)
    assert layout.table[1][5] == "5.12"
    assert "GPU-hours billed by max(used, granted)" in layout.intro[0]

    client.force_login(user_in(tenant="acme"))
    page = client.get(f"/invoices/{doc.number}/").content.decode()
    assert 'data-testid="unit-price">5.12' in page


def test_a_line_priced_at_two_rates_states_the_average_and_the_rates_and_never_changes_later(post_batch):
    from django.utils import translation

    from billing.services.exports.pdf import invoice_pdf_layout, render_invoice_pdf

    _card("3600", datetime(2020, 1, 1, tzinfo=UTC), SPLIT_AT)
    later = _card("7200", SPLIT_AT)
    # 10 s before the new card and 10 s after it, in the same hour; then more at the new price.
    usage(post_batch, at=SPLIT_AT - timedelta(seconds=10), seq=1, seconds=20)
    usage(post_batch, at=datetime(2026, 11, 20, 8, tzinfo=UTC), seq=2, seconds=10)
    close_period(month=NOV, now=AFTER_NOV)
    line = Invoice.objects.get(tenant__slug="acme").lines.get()
    # acme holds 10 % of the card: 1 GPU-second at 1 USD, then 2 at 2 USD per GPU-second.
    assert line.amount == Decimal("5")
    assert [(r["price"], r["end"]) for r in line.rates] == [("3600", SPLIT_AT.isoformat()),
                                                          ("7200", "2026-12-01T00:00:00+00:00")]
    assert line.unit_price == (line.amount / line.gpu_hours).quantize(Decimal("0.000001"))
    assert Decimal("3600") < line.unit_price < Decimal("7200")

    (row,) = _document().line_rows
    assert row.average
    assert row.rates == "3600.00 until 2026-11-15 12:05 UTC, then 7200.00"
    (csv_line,) = _csv_lines(_document())
    assert csv_line["unit_price_kind"] == "average"
    assert csv_line["rates"] == ("3600 from 2026-11-01T00:00Z until 2026-11-15T12:05Z; "
                                 "7200 from 2026-11-15T12:05Z until 2026-12-01T00:00Z")
    pdf = invoice_pdf_layout(_document())
    assert pdf.table[1][5] == f"{row.unit_price} (average)"
    assert any(row.rates in note for note in pdf.notes)
    with translation.override("zh-hans"):
        (zh_row,) = _document().line_rows
        assert zh_row.rates == "2026年11月15日 12:05 UTC 之前为 3600.00, 之后为 7200.00"
        assert render_invoice_pdf(_document()).startswith(b"%PDF")  # every string drawn in its font subset

    # A later change of the cards (the newer one retired and replaced) changes nothing issued.
    before = _document().line_rows
    RateCard.objects.filter(pk=later.pk).update(effective_to=datetime(2026, 12, 10, tzinfo=UTC))
    _card("9000", datetime(2026, 12, 10, tzinfo=UTC))
    assert _document().line_rows == before


def test_a_line_with_one_rate_in_a_month_with_a_card_change_is_not_an_average(post_batch):
    _card("3600", datetime(2020, 1, 1, tzinfo=UTC), SPLIT_AT)
    _card("7200", SPLIT_AT)
    # Usage only after the change, but in the hour that holds it: its minutes settle which card priced it.
    usage(post_batch, at=SPLIT_AT + timedelta(seconds=30), seq=1, seconds=10)
    close_period(month=NOV, now=AFTER_NOV)
    line = Invoice.objects.get(tenant__slug="acme").lines.get()
    assert line.unit_price == Decimal("7200")
    assert [r["price"] for r in line.rates] == ["7200"]


def test_idle_lines_have_no_unit_price_and_say_why(post_batch, priced):
    RateCard.objects.filter(pk=priced.pk).update(idle_policy="proportional")
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1)
    close_period(month=NOV, now=AFTER_NOV)
    rows = {row.line.kind: row for row in _document().line_rows}
    assert rows["usage"].unit_price == "3600.00"
    assert (rows["idle"].unit_price, rows["idle"].rates) == ("", "")
    assert rows["idle"].reason.startswith("no unit price")
    csv_idle = next(r for r in _csv_lines(_document()) if r["kind"] == "idle")
    assert (csv_idle["unit_price"], csv_idle["no_unit_price_reason"]) == ("", "idle")


def test_a_line_partly_on_a_commitment_lists_the_market_and_the_committed_rate(post_batch, priced):
    from billing.models import Commitment, CommitmentKind

    begin = datetime(2026, 11, 15, tzinfo=UTC)
    Commitment.objects.create(
        gpu_model=A100["model"], kind=CommitmentKind.RESERVED, cards=1, currency="USD",
        price_per_gpu_hour=Decimal("1800"), term_start=begin, term_end=begin + timedelta(days=365), term_years=1,
        effective_from=begin, effective_to=begin + timedelta(days=365), note="contract 42", created_at=begin,
        created_by="test")
    usage(post_batch, at=datetime(2026, 11, 10, 12, tzinfo=UTC), seq=1)  # market: 1 GPU-second at 1 USD
    usage(post_batch, at=datetime(2026, 11, 20, 12, tzinfo=UTC), seq=2)  # committed: at 0.50 USD
    close_period(month=NOV, now=AFTER_NOV)
    line = Invoice.objects.get(tenant__slug="acme").lines.get()
    assert line.amount == Decimal("1.5")
    assert [(r["price"], r["commitment"]) for r in line.rates] == [("3600", False), ("1800", True)]
    assert line.unit_price == (line.amount / line.gpu_hours).quantize(Decimal("0.000001"))
    (row,) = _document().line_rows
    assert (row.average, row.rates) == (True, "3600.00; 1800.00 on committed cards")
    (csv_line,) = _csv_lines(_document())
    assert csv_line["rates"].endswith("1800 from 2026-11-20T12:00Z until 2026-11-20T13:00Z committed")


def test_the_upcoming_invoice_states_the_unit_price_the_close_then_finalizes(post_batch):
    from billing.services.invoicing import preview_invoice

    _card("3600", datetime(2020, 1, 1, tzinfo=UTC), SPLIT_AT)
    _card("7200", SPLIT_AT)
    usage(post_batch, at=SPLIT_AT - timedelta(seconds=10), seq=1, seconds=20)
    (upcoming,) = preview_invoice(tenant="acme", month=NOV, now=datetime(2026, 11, 30, tzinfo=UTC)).lines
    assert upcoming.unit_price_is_average
    close_period(month=NOV, now=AFTER_NOV)
    line = Invoice.objects.get(tenant__slug="acme").lines.get()
    assert (upcoming.unit_price, upcoming.gpu_hours, upcoming.amount_minor) == (
        line.unit_price, line.gpu_hours, line.amount_minor)
    assert upcoming.unit_price_text == f"{line.unit_price:.6f}".rstrip("0")


# --- Usage by workload (docs/billing.md, Workload breakdown) --------------------------------------

THREE_PODS = [
    {"gpu": 0, "tenant": "acme", "pod": pod, "namespace": ns, "sla_tier": tier, "mem_used": 8192.0 * k,
     "mem_granted": 8192.0 * k, "sm_used": 10.8 * k, "sm_granted": 10.8 * k}
    for pod, ns, tier, k in (("bert-1", "acme-prod", "gold", 1), ("bert-2", "acme-prod", "gold", 1),
                             ("etl-1", "acme-dev", "silver", 2), ("bert-3", "acme-dev", "gold", 1))
]


MARCH = date(2026, 3, 1)
MARCH_HOUR = datetime(2026, 3, 2, 10, tzinfo=UTC)


def _ledger_hour(node: Any, gpu: str, *, tenant: str, namespace: str, pod: str, charge: str, idle: str = "0",
                 tier: str = "gold") -> None:
    """One priced hour of one pod on its own GPU, written straight to the ledger (hour and day)."""
    from billing.ledger.models import GpuHour, UsageHour
    from tests.conftest import with_day

    with_day(GpuHour.objects.create(gpu_uuid=gpu, node=node, gpu_model="A100", hour=MARCH_HOUR,
                                    metered_seconds=Decimal(3600), card_cost=Decimal(10), charged=Decimal(charge),
                                    idle_cost=Decimal(0), idle_allocated=Decimal(idle), currency="USD", priced=True))
    with_day(UsageHour.objects.create(
        gpu_uuid=gpu, node=node, tenant=tenant, namespace=namespace, pod=pod, container="main", pod_uid=f"uid-{pod}",
        sla_tier=tier, seconds=Decimal(3600), hour=MARCH_HOUR, mem_used_mb_s=Decimal(0), mem_granted_mb_s=Decimal(0),
        mem_billed_mb_s=Decimal(0), sm_used_s=Decimal(0), sm_granted_s=Decimal(0), sm_billed_s=Decimal(0),
        pcie_mb=Decimal(0), share_gpu_s=Decimal(charge) * 3600, charge=Decimal(charge), idle_share=Decimal(idle)))


def _drilldown_controllers(tenant: str) -> list[tuple[str, str, int, Decimal]]:
    """(namespace, controller, cost in cents, GPU-hours) of every controller row the drill-down
    shows for the tenant's March, read as the Explore page reads them."""
    from billing.figures import PAGE_PLACES
    from billing.queries.explore import ExploreFilters, ExplorePath, get_explore
    from billing.scope import Scope

    everyone = Scope(tenants=None, is_finance=True, is_admin=True)
    start, end = datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC)

    def rows(path: ExplorePath) -> list[Any]:
        return get_explore(scope=everyone, path=path, filters=ExploreFilters(), start=start, end=end,
                           places=PAGE_PLACES).rows

    return sorted((ns.name, c.key("controller"), int(c.shown.cost * 100), c.shown.gpu_hours)
                  for ns in rows(ExplorePath(tenant=tenant))
                  for c in rows(ExplorePath(tenant=tenant, namespace=ns.name)))


def test_the_usage_by_workload_is_the_drilldowns_controller_rows_of_the_month(client):
    """a1, a2 (namespace a) and b1 (namespace b) charge 0.333, 0.333 and 0.334 of one 1.00 line.
    Apportioned straight from the line, b1's remainder is largest: 0.33, 0.33, 0.34. The drill-down
    apportions the tenant to namespaces first (a 0.67, b 0.33), then a to its controllers: 0.34,
    0.33, 0.33. The invoice must show the drill-down's figures, cent for cent."""
    from django.utils import translation

    from billing.ledger.models import WorkloadMeta
    from billing.models import Node, SlaTier
    from billing.services.exports.pdf import invoice_pdf_layout
    from tests.conftest import user_in

    SlaTier.objects.create(slug="gold", name="Gold", weight=Decimal(4))
    node = Node.objects.create(name="node-1", cluster="east")
    pods = (("a", "a1-0", "0.333", "deployment", "a1"), ("a", "a2-0", "0.333", "statefulset", "a2"),
            ("b", "b1-0", "0.334", "job", "b1"))
    for i, (namespace, pod, charge, kind, name) in enumerate(pods):
        _ledger_hour(node, f"GPU-{i}", tenant="acme", namespace=namespace, pod=pod, charge=charge)
        WorkloadMeta.objects.create(node=node, namespace=namespace, pod=pod, pod_uid=f"uid-{pod}", controller_kind=kind,
                                    controller_name=name, labels={}, requests={}, first_seen=MARCH_HOUR,
                                    last_seen=MARCH_HOUR)
    # A pod no controller was reported for, on a second line (silver) with idle spread onto it.
    _ledger_hour(node, "GPU-9", tenant="acme", namespace="b", pod="solo", charge="0.125", idle="0.015", tier="silver")
    close_period(month=MARCH, now=datetime(2026, 4, 2, tzinfo=UTC))

    invoice = Invoice.objects.get(tenant__slug="acme")
    stored = sorted((w.namespace, w.workload, w.amount_minor, w.gpu_hours) for w in invoice.workloads.all())
    assert stored == _drilldown_controllers("acme")
    assert [(w, a) for _, w, a, _ in stored] == [
        ("deployment:a1", 34), ("statefulset:a2", 33), ("__unallocated__", 14), ("job:b1", 33)]
    # They add up to the invoice's lines of the month together (usage 1.00 + 0.12 and idle 0.02), not line by line.
    month_lines = invoice.lines.filter(usage_month=MARCH).exclude(kind=InvoiceLine.Kind.ADJUSTMENT)
    assert sum(w[2] for w in stored) == sum(month_lines.values_list("amount_minor", flat=True)) == 114

    client.force_login(user_in(tenant="acme"))
    page = client.get(f"/invoices/{invoice.number}/").content.decode()
    assert page.count('data-testid="invoice-workload"') == 4
    # Lines name the SLA tier as the SLA tiers page does (a seeded name in the reader's language); a
    # tier since removed keeps its slug.
    lines = page.split('data-testid="invoice-lines"', 1)[1].split("</table>", 1)[0]
    assert "<td>Gold</td>" in lines
    assert "<td>silver</td>" in lines
    with translation.override("zh-hans"):
        pdf = invoice_pdf_layout(_document_of(invoice.number))
    assert {r[2] for r in pdf.table[1:-3]} == {"金牌", "silver"}
    assert "(not known)" in page
    assert "<td>__unallocated__</td>" not in page  # only in the keys, as the drill-down writes them
    # Each workload's cost and GPU-hours carry the drill-down's keys for the same controller and month,
    # and the Explore page shows the same figure under each key.
    from billing.scope import FINANCE_GROUP
    from tests.test_page_sums import _figure, _marks

    on_invoice = {m.figure: _figure(m.text) for m in _marks(page) if m.figure.startswith(("cost|", "gpu_hours|"))}
    assert len(on_invoice) == 8
    client.force_login(user_in(FINANCE_GROUP))
    on_explore: dict[str, Decimal] = {}
    for namespace in ("a", "b"):
        html = client.get("/explore/", {"start": "2026-03-01", "end": "2026-03-31", "tenant": "acme",
                                        "namespace": namespace}).content.decode()
        on_explore |= {m.figure: _figure(m.text) for m in _marks(html) if m.figure}
    assert {k: on_explore.get(k) for k in on_invoice} == on_invoice


def test_the_invoice_breaks_its_usage_down_by_workload_adding_up_exactly_and_never_changing(post_batch, client):
    from billing.models import InvoiceWorkload
    from billing.services.exports.pdf import invoice_pdf_layout
    from tests.conftest import user_in

    _card("5.12", datetime(2020, 1, 1, tzinfo=UTC))
    at = datetime(2026, 11, 15, 12, tzinfo=UTC)
    for seq in range(3):
        assert post_batch(make_batch(start=at + timedelta(minutes=seq), seq=seq + 1, seconds=37,
                                     workloads=THREE_PODS)).status_code == 201
    rollup_usage(now=clock.now())
    close_period(month=NOV, now=AFTER_NOV)
    invoice = Invoice.objects.get(tenant__slug="acme")
    month_minor = sum(invoice.lines.values_list("amount_minor", flat=True))
    parts = list(invoice.workloads.all())
    # No controller reported: each namespace's pods are the drill-down's one `__unallocated__` row.
    assert {(p.namespace, p.workload) for p in parts} == {
        ("acme-prod", "__unallocated__"), ("acme-dev", "__unallocated__")}
    assert sum(p.amount_minor for p in parts) == month_minor > 0
    # acme-dev holds three GPU shares (etl-1 twice, bert-3 once) to acme-prod's two, each within a cent.
    by_namespace = {p.namespace: p.amount_minor for p in parts}
    assert abs(2 * by_namespace["acme-dev"] - 3 * by_namespace["acme-prod"]) <= 5

    doc = _document()
    # A line's quantity is stated to its stored 6 places, so quantity × unit price is its amount to the cent.
    usage_rows = [r for r in doc.line_rows if r.line.kind == "usage"]
    assert usage_rows
    for row in usage_rows:
        assert row.hours == f"{row.line.gpu_hours:.6f}"
        assert to_minor_units(Decimal(row.hours) * Decimal(row.unit_price), "USD") == row.line.amount_minor
    pdf = invoice_pdf_layout(doc)
    assert [r[4] for r in pdf.table[1:-3] if r[4]] == [r.hours for r in usage_rows]
    assert pdf.appendix is not None
    assert pdf.appendix.table[-1][-1] == f"{doc.month_lines_display} USD"
    assert len(pdf.appendix.table) == len(parts) + 2
    client.force_login(user_in(tenant="acme"))
    page = client.get(f"/invoices/{doc.number}/").content.decode()
    assert page.count('data-testid="invoice-workload"') == len(parts)

    # Issued: the database refuses any change to the breakdown, and later usage changes none of it.
    with pytest.raises(DatabaseError), transaction.atomic():
        InvoiceWorkload.objects.filter(invoice=invoice).update(amount_minor=1)
    usage(post_batch, at=datetime(2026, 11, 20, tzinfo=UTC), seq=9)
    assert [(p.workload, p.amount_minor) for p in invoice.workloads.all()] == [(p.workload, p.amount_minor) for p in parts]
