"""Balance due and the columns that add up from invoice to period: each invoice's subtotal, tax,
total, credited (its credit notes, tax included) and balance due by one rule (unpaid: total less
credited; paid: 0, less the credit notes issued after the day of payment, owed back; a reversal
makes it unpaid again), on the invoice list, its CSV, the invoice page and, summed per month, the
periods page, to the cent."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.test import Client

from billing.models import Invoice, Tenant
from billing.scope import FINANCE_GROUP, Scope
from billing.services.exports import list_invoices
from billing.services.invoicing import (
    InvoiceBalance,
    add_balances,
    invoice_balance,
    issue_credit_note,
    payment_in_force,
    record_invoice_status,
)
from tests.billing.test_credit_notes import AFTER_NOV, credit, finalized_invoice
from tests.conftest import user_in
from tests.test_page_sums import Walk, _check_cross_pages, _check_csv, _check_page, _figure, _marks

EVERYONE = Scope(tenants=None, is_finance=True, is_admin=True)
ISSUED = AFTER_NOV.date()  # 2026-12-02
DEC_3, DEC_4 = date(2026, 12, 3), date(2026, 12, 4)


def balance(*, total: int = 12_000, credits: tuple[tuple[date, int], ...] = (), paid_on: date | None = None,
            finalized: bool = True) -> int | None:
    return invoice_balance(finalized=finalized, currency="USD", total_minor=total, tax_minor=2_000, credits=credits,
                           paid_on=paid_on).due_minor


# --- The rule (pure) ----------------------------------------------------------------------------

def test_unpaid_the_balance_is_the_total_less_what_is_credited():
    assert balance() == 12_000
    assert balance(credits=((ISSUED, 1_200), (DEC_3, 600))) == 10_200
    assert balance(credits=((ISSUED, 12_000),)) == 0  # credited in full: nothing due


def test_paid_the_balance_is_zero_and_a_later_credit_is_owed_to_the_customer():
    assert balance(paid_on=DEC_3) == 0
    # A credit on or before the day of payment was deducted from what was paid.
    assert balance(credits=((ISSUED, 1_200), (DEC_3, 600)), paid_on=DEC_3) == 0
    # A credit after it is owed back: a negative balance.
    after = invoice_balance(finalized=True, currency="USD", total_minor=12_000, tax_minor=2_000,
                            credits=((ISSUED, 1_200), (DEC_4, 600)), paid_on=DEC_3)
    assert (after.credited_minor, after.due_minor, after.owed_to_customer) == (1_800, -600, True)
    assert after.due_display == "-6.00"


def test_a_reversed_payment_leaves_the_invoice_unpaid_and_a_new_payment_settles_it_again():
    changes = [("paid", DEC_3), ("payment_reversed", DEC_4)]
    assert payment_in_force(changes) is None
    credits = ((DEC_3, 1_200),)
    assert balance(credits=credits, paid_on=payment_in_force(changes)) == 10_800
    assert payment_in_force([*changes, ("paid", date(2026, 12, 5))]) == date(2026, 12, 5)
    assert balance(credits=credits, paid_on=date(2026, 12, 5)) == 0
    assert payment_in_force([("sent", DEC_3)]) is None


def test_a_draft_has_no_balance_and_sums_skip_it():
    assert balance(finalized=False) is None
    issued = invoice_balance(finalized=True, currency="USD", total_minor=100, tax_minor=10, credits=(), paid_on=None)
    draft = invoice_balance(finalized=False, currency="USD", total_minor=50, tax_minor=5, credits=(), paid_on=None)
    assert add_balances("USD", [issued, draft]) == InvoiceBalance(
        currency="USD", subtotal_minor=135, tax_minor=15, total_minor=150, credited_minor=0, due_minor=100)
    assert add_balances("USD", [draft]).due_minor is None
    with pytest.raises(ValueError, match="other currencies"):
        add_balances("EUR", [issued])


# --- Stored invoices, credit notes and payments --------------------------------------------------

def pay(invoice: Invoice, on: date, status: str = "paid") -> None:
    record_invoice_status(invoice_number=invoice.number, status=status, on_date=on, note="",
                          now=datetime(on.year, on.month, on.day, 12, tzinfo=UTC), actor_label="finance-1")


def credit_on(invoice: Invoice, amount: str, on: date) -> None:
    issue_credit_note(invoice_number=invoice.number, amount_text=amount, reason="outage",
                      now=datetime(on.year, on.month, on.day, 15, tzinfo=UTC), actor_label="finance-1")


def listed(number: str) -> InvoiceBalance:
    return next(i.balance for i in list_invoices(scope=EVERYONE, today=date(2026, 12, 10)) if i.number == number)


@pytest.mark.django_db
def test_credit_before_and_after_payment_and_a_reversal_as_the_list_shows_them():
    invoice = finalized_invoice()  # 100.00 + 20 % tax = 120.00 USD
    credit(invoice, "10")  # 2026-12-02: 12.00 with its tax
    assert (listed(invoice.number).credited_minor, listed(invoice.number).due_minor) == (1_200, 10_800)
    pay(invoice, DEC_3)
    assert listed(invoice.number).due_minor == 0
    credit_on(invoice, "5", DEC_4)  # after the payment: 6.00 owed back
    shown = listed(invoice.number)
    assert (shown.subtotal_minor, shown.tax_minor, shown.total_minor) == (10_000, 2_000, 12_000)
    assert (shown.credited_minor, shown.due_minor) == (1_800, -600)
    pay(invoice, DEC_4, "payment_reversed")
    assert listed(invoice.number).due_minor == 12_000 - 1_800


# --- The pages and the CSV ---------------------------------------------------------------------

@pytest.fixture
def november() -> dict[str, Invoice]:
    """Three November invoices at 20 % tax: acme unpaid with a credit, globex paid then credited
    (owed back), initech credited in full."""
    acme = finalized_invoice(slug="acme", subtotal_minor=10_000)  # total 120.00
    globex = finalized_invoice(slug="globex", subtotal_minor=5_000)  # total 60.00
    initech = finalized_invoice(slug="initech", subtotal_minor=3_333)  # tax 6.67 (half-even), total 40.00
    Tenant.objects.filter(slug="initech").update(name="=HYPERLINK(1)")  # a formula in the CSV stays text
    credit(acme, "10")  # 12.00
    pay(globex, DEC_3)
    credit_on(globex, "5", DEC_4)  # 6.00, owed back
    credit(initech, "33.33")  # all of it: 40.00
    return {"acme": acme, "globex": globex, "initech": initech}


def finance_client() -> Client:
    client = Client()
    client.force_login(user_in(FINANCE_GROUP))
    return client


def shown_totals(html: str) -> dict[str, Decimal]:
    return {g: _figure(m.text) for m in _marks(html) for g in m.totals}


@pytest.mark.django_db
def test_the_invoice_list_and_the_periods_page_show_columns_that_add_up(november):
    client = finance_client()
    walk = Walk()
    pages = {url: client.get(url).content.decode() for url in ("/invoices/", "/periods/")}
    for url, html in pages.items():
        walk.pages[url] = _marks(html)
        _check_page(url, walk.pages[url], walk)
    # Every column of the list adds to its month's figure on the periods page, to the cent.
    assert _check_cross_pages(walk) == 5
    # The money columns (the month's GPU-hours split adds up too, but has no invoice column).
    period = {g: v for g, v in shown_totals(pages["/periods/"]).items() if g.startswith("x-")}
    assert period == {
        "x-subtotal-2026-11-USD": Decimal("183.33"), "x-tax-2026-11-USD": Decimal("36.67"),
        "x-invoices-2026-11-USD": Decimal("220.00"), "x-credited-2026-11-USD": Decimal("58.00"),
        # 108.00 due from acme, 6.00 owed to globex, initech settled by its credit note.
        "x-balance-2026-11-USD": Decimal("102.00"),
    }
    # Ignoring the credit notes would say 160.00 (acme 120 + initech 40) is due.
    assert period["x-balance-2026-11-USD"] != Decimal("160.00")
    # One month in one currency: the list has a footer, each row's subtotal + tax = its total.
    listed_totals = shown_totals(pages["/invoices/"])
    assert listed_totals["list-balance"] == Decimal("102.00")
    assert listed_totals["list-credited"] == Decimal("58.00")
    assert {"list-subtotal", "list-tax", "list-total", "list-credited", "list-balance", "row"} <= walk.groups_checked
    assert 'data-testid="balance-definition"' in pages["/invoices/"]
    assert 'data-testid="period-totals-definition"' in pages["/periods/"]
    assert "owed to the customer" in pages["/invoices/"]


@pytest.mark.django_db
def test_a_credit_note_changes_the_periods_balance_and_the_list_row_alike(november):
    client = finance_client()
    before = shown_totals(client.get("/periods/").content.decode())["x-balance-2026-11-USD"]
    credit_on(november["acme"], "1", DEC_4)  # 1.20 more credited on an unpaid invoice
    html = client.get("/periods/").content.decode()
    assert shown_totals(html)["x-balance-2026-11-USD"] == before - Decimal("1.20")
    row = [m for m in _marks(client.get("/invoices/").content.decode()) if "x-balance-2026-11-USD" in m.parts]
    assert sorted(_figure(m.text) for m in row) == [Decimal("-6.00"), Decimal("0.00"), Decimal("106.80")]


@pytest.mark.django_db
def test_the_invoice_page_shows_credited_and_balance_due_under_its_total(november):
    client = finance_client()
    html = client.get("/invoices/VGL-202611-globex/").content.decode()
    assert 'data-testid="invoice-balance"' in html
    credited = html.split('data-testid="invoice-credited">', 1)[1].split("</td>", 1)[0]
    due = html.split('data-testid="invoice-balance-due">', 1)[1].split("</td>", 1)[0]
    assert credited == "6.00 USD"
    assert "-6.00" in due
    assert "owed to the customer" in due
    # The total is stated once, under the lines; the balance table adds only Credited and Balance due.
    total = html.split('data-testid="invoice-total">', 1)[1].split("</strong>", 1)[0]
    assert html.count(f"{total}</strong> USD") + html.count(f"{total} USD") == 1
    balance = html.split('data-testid="invoice-balance"', 1)[1].split("</table>", 1)[0]
    assert balance.count("<tr>") == 2
    walk = Walk()
    _check_page("/invoices/VGL-202611-globex/", _marks(html), walk)
    assert "credited" in walk.groups_checked  # the credit notes add up to "Credited in all"


@pytest.mark.django_db
def test_the_invoice_list_csv_has_the_same_columns_in_exact_minor_units(november):
    resp = finance_client().get("/invoices/", {"format": "csv"})
    assert resp.status_code == 200
    assert resp["Content-Type"].startswith("text/csv")
    name = resp["Content-Disposition"].split('filename="', 1)[1].rstrip('"')
    assert name.startswith("invoices-")
    assert name.endswith(".csv")
    assert resp.content.startswith("\ufeff".encode())
    rows = list(csv.reader(io.StringIO(resp.content.decode("utf-8-sig"))))
    assert _check_csv(name, rows) == "invoice-list"
    header, *body = rows
    records = {r[0]: dict(zip(header, r, strict=True)) for r in body}
    globex = records["VGL-202611-globex"]
    assert (globex["total_minor"], globex["credited_minor"], globex["balance_due_minor"]) == ("6000", "600", "-600")
    assert (globex["balance_due"], globex["payment_status"], globex["payment_status_date"]) == ("-6.00", "paid",
                                                                                                "2026-12-03")
    assert records["VGL-202611-initech"]["tenant_name"] == "'=HYPERLINK(1)"
    total = records["(total)"]
    assert (total["billing_period"], total["total"], total["credited"], total["balance_due"]) == (
        "2026-11", "220.00", "58.00", "102.00")


@pytest.mark.django_db
def test_a_tenant_member_sees_and_downloads_only_their_invoices(november):
    client = Client()
    client.force_login(user_in(tenant="acme"))
    totals = shown_totals(client.get("/invoices/").content.decode())
    assert (totals["list-total"], totals["list-credited"], totals["list-balance"]) == (
        Decimal("120.00"), Decimal("12.00"), Decimal("108.00"))
    body = client.get("/invoices/", {"format": "csv"}).content.decode("utf-8-sig")
    assert "VGL-202611-acme" in body
    assert "globex" not in body


def _cells(html: str, row_marker: str) -> dict[str, str]:
    """The money cells of one table row, by data-column (the list) or in order (the portal), as text."""
    row = html.split(row_marker, 1)[1].split("</tr>", 1)[0]
    cells = [c.split(">", 1)[1] for c in row.split('<td class="num"')[1:]]
    return {str(i): re.sub(r"<[^>]+>", "", c.split("</td>", 1)[0]).strip() for i, c in enumerate(cells)}


@pytest.mark.django_db
@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_the_list_and_the_portal_write_every_amount_grouped_and_with_its_currency(language):
    """Subtotal, tax, total, credited and balance due, on the list, its footer and the tenant's own table,
    as every page writes money (billing.money.money_text): "2,400.00 USD", never a bare "2400.00"."""
    invoice = finalized_invoice(subtotal_minor=200_000)  # 2,000.00 + 20 % tax = 2,400.00
    credit(invoice, "1000")  # 1,200.00 with its tax
    finance = finance_client()
    member = Client()
    member.force_login(user_in(tenant="acme"))
    listing = finance.get("/invoices/", HTTP_ACCEPT_LANGUAGE=language).content.decode()
    row = _cells(listing, f'data-number="{invoice.number}"')
    footer = _cells(listing, 'data-testid="invoices-total"')
    expected = ["2,000.00 USD", "400.00 USD", "2,400.00 USD", "1,200.00 USD", "1,200.00 USD"]
    assert list(row.values()) == expected
    assert list(footer.values()) == expected
    portal = member.get("/tenants/acme/", HTTP_ACCEPT_LANGUAGE=language).content.decode()
    assert list(_cells(portal, f'data-testid="tenant-invoice-row" data-number="{invoice.number}"').values()) == \
        expected[2:]
