"""The upcoming invoice: what closing a month now would finalize for a tenant, from the close's own
line rules and rounding, written nowhere; on the tenant portal (with a CSV) and, as totals, on the
invoice list. Another tenant's preview answers 404; a closed month has no preview."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils.formats import date_format

from billing.errors import InvalidInput
from billing.ledger.rollup import rollup_usage
from billing.models import AuditEvent, BillingPeriod, Invoice, InvoiceLine, RateCard, Tenant, TenantMembership
from billing.money import to_minor_units
from billing.scope import FINANCE_GROUP
from billing.services.invoicing.close import (
    close_period,
    preview_invoice,
    preview_invoices,
    scheduled_close_at,
)
from tests import clock
from tests.conftest import A100, SHARED_GPU_WORKLOADS, make_batch, new_user

pytestmark = pytest.mark.django_db

OCT = date(2026, 10, 1)
NOV = date(2026, 11, 1)
AFTER_NOV = datetime(2026, 12, 2, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _fixed_dates_stay_billable(settings):
    settings.VGPU_LATE_USAGE_HORIZON = timedelta(days=36500)


def usage(post_batch, *, at: datetime, seq: int, seconds: int = 10, workloads=None) -> None:
    batch = make_batch(start=at, seq=seq, seconds=seconds, workloads=workloads or SHARED_GPU_WORKLOADS)
    assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())


def as_stored(lines) -> list[tuple]:
    return sorted((x.kind, x.gpu_model, x.sla_tier, x.usage_month, x.gpu_hours, x.amount, x.amount_minor)
                  for x in lines)


@pytest.fixture
def november_with_idle_and_a_late_october(post_batch, one_usd_per_gpu_second):
    """Proportional idle (amounts with thirds of a cent to round), October closed, then a late
    October batch (an adjustment line) and November usage on two SLA tiers."""
    RateCard.objects.filter(pk=one_usd_per_gpu_second.pk).update(idle_policy="proportional")
    usage(post_batch, at=datetime(2026, 10, 20, 12, tzinfo=UTC), seq=1)
    close_period(month=OCT, now=datetime(2026, 11, 2, tzinfo=UTC))
    usage(post_batch, at=datetime(2026, 10, 31, 23, 59, 40, tzinfo=UTC), seq=2, seconds=20)
    usage(post_batch, at=datetime(2026, 11, 10, tzinfo=UTC), seq=3, seconds=7)
    usage(post_batch, at=datetime(2026, 11, 11, tzinfo=UTC), seq=4, seconds=13, workloads=[
        {"gpu": 0, "tenant": "acme", "pod": "bert-2", "sla_tier": "bronze", "mem_used": 27306.0,
         "mem_granted": 27306.0, "sm_used": 36.0, "sm_granted": 36.0}])


def test_the_preview_is_exactly_what_the_close_then_finalizes(november_with_idle_and_a_late_october):
    previews = preview_invoices(month=NOV, now=AFTER_NOV)
    assert set(previews) == {"acme", "globex"}
    kinds = {line.kind for p in previews.values() for line in p.lines}
    assert kinds == {"usage", "idle", "adjustment"}  # every rule of the close is exercised
    # Amounts that only round correctly per line: 7 s of a card at 1 USD/s, 70 % idle split 1:2.
    assert any(line.amount != Decimal(line.amount_minor) / 100 for p in previews.values() for line in p.lines)

    close_period(month=NOV, now=AFTER_NOV)
    for slug, preview in previews.items():
        invoice = Invoice.objects.get(tenant__slug=slug, period__month=NOV)
        assert as_stored(preview.lines) == as_stored(invoice.lines.all())
        assert (preview.total_minor, preview.currency) == (invoice.total_minor, invoice.currency)
        assert preview.total == Decimal(invoice.total_minor) / 100  # to the cent
        own = sum(x.amount_minor for x in invoice.lines.all() if x.usage_month == NOV)
        assert preview.subtotal_minor == own
        assert preview.adjustments == Decimal(invoice.total_minor - own) / 100


def test_previewing_writes_nothing(november_with_idle_and_a_late_october):
    models = (Invoice, InvoiceLine, BillingPeriod, AuditEvent, Tenant)
    before = [m.objects.count() for m in models]
    with CaptureQueriesContext(connection) as queries:
        preview = preview_invoice(tenant="acme", month=NOV, now=AFTER_NOV)
        preview_invoices(month=NOV, now=AFTER_NOV)
    assert preview.lines
    assert [m.objects.count() for m in models] == before
    writes = [q["sql"] for q in queries.captured_queries
              if q["sql"].lstrip().split()[0].upper() in {"INSERT", "UPDATE", "DELETE"}]
    assert writes == []


def test_the_preview_carries_the_latest_ledger_hour_and_the_scheduled_issue_date(
        november_with_idle_and_a_late_october):
    preview = preview_invoice(tenant="acme", month=NOV, now=AFTER_NOV)
    assert preview.as_of == datetime(2026, 11, 11, 0, tzinfo=UTC)  # the newest hour metered in November
    # celery beat's close-previous-month runs at 01:00 UTC on the 2nd (config/settings.py).
    assert preview.issue_at == datetime(2026, 12, 2, 1, 0, tzinfo=UTC)
    assert scheduled_close_at(date(2026, 12, 1)) == datetime(2027, 1, 2, 1, 0, tzinfo=UTC)


def test_scheduled_issue_date_is_not_invented_when_no_monthly_close_is_scheduled(settings):
    settings.CELERY_BEAT_SCHEDULE = {k: v for k, v in settings.CELERY_BEAT_SCHEDULE.items()
                                     if k != "close-previous-month"}
    assert scheduled_close_at(NOV) is None


def test_a_closed_month_has_no_preview(november_with_idle_and_a_late_october):
    with pytest.raises(InvalidInput, match="exists: VGL-202610-acme"):
        preview_invoice(tenant="acme", month=OCT, now=AFTER_NOV)
    with pytest.raises(InvalidInput, match="2026-10 is closed"):
        preview_invoices(month=OCT, now=AFTER_NOV)
    assert preview_invoice(tenant="acme", month=NOV, now=AFTER_NOV).lines  # the next month still has one


def test_a_closing_month_previews_only_the_invoices_not_yet_finalized(post_batch, one_usd_per_gpu_second):
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1)

    def stop_after_first_invoice(pct: int) -> None:
        if pct == 50:
            raise RuntimeError("worker lost")

    with pytest.raises(RuntimeError):
        close_period(month=NOV, now=AFTER_NOV, progress=stop_after_first_invoice)
    assert set(preview_invoices(month=NOV, now=AFTER_NOV)) == {"globex"}
    assert preview_invoice(tenant="globex", month=NOV, now=AFTER_NOV).total_minor == 200
    with pytest.raises(InvalidInput, match="exists: VGL-202611-acme"):
        preview_invoice(tenant="acme", month=NOV, now=AFTER_NOV)


def test_a_month_that_has_not_begun_has_no_preview(db):
    with pytest.raises(InvalidInput, match="has not begun"):
        preview_invoice(tenant="acme", month=date(2026, 12, 1), now=datetime(2026, 11, 30, tzinfo=UTC))


# --- On the pages ----------------------------------------------------------------------------

@pytest.fixture
def this_month(mid_month, post_batch, one_usd_per_gpu_second, minute_start) -> datetime:
    """acme 1.00 USD and globex 2.00 USD of usage this month (ten minutes before the clock, held
    mid-month); both tenants have portal rows."""
    Tenant.objects.create(slug="acme", name="Acme Robotics")
    Tenant.objects.create(slug="globex", name="Globex Corp")
    usage(post_batch, at=minute_start, seq=1)
    return minute_start


def member_of(client, slug: str) -> User:
    user = new_user(f"member-{slug}")
    TenantMembership.objects.create(user=user, tenant=Tenant.objects.get(slug=slug))
    client.force_login(user)
    return user


def section(page: str, testid: str) -> str:
    start = page.index(f'data-testid="{testid}"')
    return page[start:page.index("</section>", start)]


def test_the_portal_shows_the_upcoming_invoice_labelled_as_a_preview(client, this_month):
    member_of(client, "acme")
    page = client.get("/tenants/acme/").content.decode()
    card = section(page, "upcoming-invoice")
    month = f"{this_month:%Y-%m}"
    assert f"Upcoming invoice — {month} (so far)" in card
    assert "Preview, not an invoice" in card
    assert "until the month is closed" in card
    expected = scheduled_close_at(this_month.date().replace(day=1))
    assert expected is not None
    assert expected.day == 2
    assert date_format(expected, "DATETIME_FORMAT") in card
    assert card.count('data-testid="upcoming-line"') == 1
    assert "GPU usage · NVIDIA A100-SXM4-80GB · tier gold" in card
    assert '<strong data-testid="upcoming-total">1.00 USD</strong>' in card
    assert "2.00 USD" not in card  # globex's usage is not on acme's preview
    assert 'data-testid="upcoming-csv" href="?format=upcoming-csv"' in card


def test_the_upcoming_lines_fold_their_secondary_columns_on_a_narrow_screen(client, this_month):
    """Quantity and unit price are secondary columns (hidden under 760 px) and are written again in
    the line's description (shown only there), so a phone sees the amount and the totals without
    scrolling the table; every row keeps the same number of columns, the totals' included."""
    member_of(client, "acme")
    card = section(client.get("/tenants/acme/").content.decode(), "upcoming-invoice")
    line = card[card.index('data-testid="upcoming-line"'):card.index("</tr>", card.index('data-testid="upcoming-line"'))]
    hours, price = re.findall(r'<td class="num secondary"[^>]*>([^<]+)</td>', line)
    assert f'<div class="stacked muted" data-testid="upcoming-line-stacked">{hours} GPU-hours × {price}</div>' in line
    footer = card[card.index("<tfoot>"):card.index("</tfoot>")]
    assert footer.count('<td class="secondary" colspan="2"></td>') == footer.count("<tr>")
    css = (Path(__file__).resolve().parents[2] / "templates" / "static" / "css" / "app.css").read_text()
    narrow = css[css.index("@media (max-width: 760px)"):]
    narrow = narrow[:narrow.index("\n}")]
    assert "table.data .secondary { display:none; }" in narrow
    assert "table.data .stacked { display:block;" in narrow
    assert "table.data .stacked { display:none; }" in css[:css.index("@media (max-width: 760px)")]


def test_the_upcoming_csv_has_the_preview_lines_and_total(client, this_month):
    member_of(client, "acme")
    resp = client.get("/tenants/acme/?format=upcoming-csv")
    assert resp.status_code == 200
    assert resp["Content-Type"] == "text/csv; charset=utf-8"
    month = f"{this_month:%Y-%m}"
    assert resp["Content-Disposition"] == f'attachment; filename="acme-upcoming-{month}.csv"'
    rows = list(csv.DictReader(io.StringIO(resp.content.decode("utf-8-sig"))))
    assert [(r["status"], r["tenant"], r["billing_period"], r["line"], r["kind"], r["sla_tier"], r["amount_minor"],
             r["amount"], r["currency"]) for r in rows] == [
        ("preview", "acme", month, "1", "usage", "gold", "100", "1.00", "USD"),
        ("preview", "acme", month, "total", "", "", "100", "1.00", "USD"),
    ]
    assert Decimal(rows[0]["amount_ledger"]) == Decimal(1)
    assert rows[0]["gpu_model"] == A100["model"]
    # The invoice CSV's quantity, unit, unit price and billing rule columns, filled as on an issued invoice.
    from billing.services.exports import INVOICE_CSV_COLUMNS, UNIT_PRICE_COLUMNS

    assert set(UNIT_PRICE_COLUMNS) <= set(rows[0])
    assert set(UNIT_PRICE_COLUMNS) <= set(INVOICE_CSV_COLUMNS)
    line, total = rows
    assert (line["unit"], line["unit_price_kind"], line["no_unit_price_reason"]) == ("GPU-hour", "rate", "")
    assert all(line[c] for c in ("billed_basis", "alpha", "rates"))
    assert to_minor_units(Decimal(line["quantity"]) * Decimal(line["unit_price"]), "USD") == int(line["amount_minor"])
    assert all(total[c] == "" for c in UNIT_PRICE_COLUMNS)


def test_another_tenants_preview_and_csv_answer_404_like_a_missing_tenant(client, this_month):
    member_of(client, "acme")
    assert client.get("/tenants/globex/").status_code == 404
    assert client.get("/tenants/globex/?format=upcoming-csv").status_code == 404
    assert client.get("/tenants/nobody/?format=upcoming-csv").status_code == 404


def test_the_invoice_list_shows_each_visible_tenants_upcoming_total(client, this_month):
    finance = new_user("finance")
    finance.groups.add(Group.objects.get_or_create(name=FINANCE_GROUP)[0])
    client.force_login(finance)
    upcoming = section(client.get("/invoices/").content.decode(), "upcoming-invoices")
    assert "current month, not final" in upcoming
    assert upcoming.count('data-testid="upcoming-invoice-row"') == 2
    assert 'href="/tenants/acme/"' in upcoming
    assert "1.00 USD" in upcoming
    assert 'href="/tenants/globex/"' in upcoming
    assert "2.00 USD" in upcoming

    member_of(client, "acme")
    upcoming = section(client.get("/invoices/").content.decode(), "upcoming-invoices")
    assert upcoming.count('data-testid="upcoming-invoice-row"') == 1
    assert 'href="/tenants/acme/"' in upcoming
    assert "1.00 USD" in upcoming
    assert "globex" not in upcoming
    assert "2.00 USD" not in upcoming



# --- The portal's upcoming invoice -------------------------------------------------------------------
# The portal's figure tree of the month holds lines that look like the invoice's, but it left-joins
# GPU rows where the invoice keeps priced ones, and may read another granularity (days against hours):
# whatever the portal reuses, its upcoming invoice must stay the one read on its own.

def _portal_upcoming(*, start: datetime, end: datetime, now: datetime):
    from billing.queries.portal import get_tenant_portal
    from billing.scope import get_scope

    finance, _ = User.objects.get_or_create(username="portal-finance")
    finance.groups.add(Group.objects.get_or_create(name=FINANCE_GROUP)[0])
    return get_tenant_portal(scope=get_scope(finance), slug="acme", start=start, end=end, now=now,
                             workload_limit=100).upcoming


@pytest.mark.parametrize(("now", "end"), [
    (datetime(2026, 11, 30, 12, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)),  # the whole month
    (datetime(2026, 11, 11, 12, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)),  # a day in progress, from hours
    (datetime(2026, 11, 10, 12, tzinfo=UTC), datetime(2026, 11, 11, tzinfo=UTC)),  # usage past the period
])
def test_the_portals_upcoming_invoice_is_the_one_read_on_its_own(november_with_idle_and_a_late_october, now, end):
    upcoming = _portal_upcoming(start=datetime(2026, 11, 1, tzinfo=UTC), end=end, now=now)
    assert upcoming == preview_invoice(tenant="acme", month=NOV, now=now)


def test_the_portals_upcoming_invoice_keeps_to_priced_gpu_rows(november_with_idle_and_a_late_october):
    """Usage on an unpriced GPU-day, or on a day whose GPU-day is missing (its hours are there), is
    no invoice's; the portal's figures still count it."""
    from billing.ledger.models import GpuDay

    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    start, end = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)
    GpuDay.objects.filter(day=datetime(2026, 11, 11, tzinfo=UTC)).update(priced=False)
    assert _portal_upcoming(start=start, end=end, now=now) == preview_invoice(tenant="acme", month=NOV, now=now)
    GpuDay.objects.filter(day=datetime(2026, 11, 10, tzinfo=UTC)).delete()
    assert _portal_upcoming(start=start, end=end, now=now) == preview_invoice(tenant="acme", month=NOV, now=now)
