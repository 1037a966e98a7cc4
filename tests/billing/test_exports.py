"""Invoice downloads: PDF with a shipped Chinese font, CSV, and a FOCUS 1.3 cost-and-usage CSV
that follows the spec's column rules and reconciles to the invoice total; tenants download
only their own invoices, finance any; the export_invoice command validates its arguments."""

from __future__ import annotations

import csv
import io
import json
import re
from codecs import BOM_UTF8
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import translation
from reportlab.pdfbase.pdfmetrics import stringWidth

from billing.ledger.rollup import rollup_usage
from billing.models import Invoice, RateCard, Tenant
from billing.pdf_fonts import pdf_font
from billing.scope import FINANCE_GROUP, Scope
from billing.services.exports import ALLOCATED_METHOD_ID, export_invoice, get_invoice_document
from billing.services.exports.pdf import BODY_SIZE, invoice_pdf_layout, text_width_pt
from billing.services.invoicing.close import close_period
from tests import clock
from tests.conftest import SHARED_GPU_WORKLOADS, make_batch, user_in
from tests.pdf_check import check_pdf

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fixed_dates_stay_billable(settings):
    """These tests post usage on fixed past dates; keep them inside the late-usage horizon."""
    settings.VGPU_LATE_USAGE_HORIZON = timedelta(days=36500)

OCT = date(2026, 10, 1)
NOV = date(2026, 11, 1)
AFTER_NOV = datetime(2026, 12, 2, tzinfo=UTC)
EVERYONE = Scope(tenants=None, is_finance=True, is_admin=True)
CHINESE_NAME = "星河智算科技"


@pytest.fixture
def card(one_usd_per_gpu_second):
    return one_usd_per_gpu_second


@pytest.fixture
def tenants(db):
    Tenant.objects.create(slug="acme", name=CHINESE_NAME)
    Tenant.objects.create(slug="globex", name="Globex")


def usage(post_batch, *, at: datetime, seq: int, seconds: int = 10) -> None:
    assert post_batch(make_batch(start=at, seq=seq, seconds=seconds, workloads=SHARED_GPU_WORKLOADS)).status_code == 201
    rollup_usage(now=clock.now())


@pytest.fixture
def november(post_batch, card, tenants):
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1)
    close_period(month=NOV, now=AFTER_NOV)
    return Invoice.objects.get(tenant__slug="acme", period__month=NOV)


@pytest.fixture
def proportional(card):
    RateCard.objects.filter(pk=card.pk).update(idle_policy="proportional")


def focus(number: str, scope: Scope = EVERYONE) -> tuple[list[str], list[dict[str, str | None]]]:
    content = export_invoice(scope=scope, number=number, fmt="focus").content.decode("utf-8-sig")
    reader = csv.reader(io.StringIO(content))
    header = next(reader)
    rows = [{c: (v if v != "" else None) for c, v in zip(header, values, strict=True)} for values in reader]
    return header, rows


# --- FOCUS 1.3 column rules (specification/datasets/cost_and_usage/columns/*.md) -----------------

MANDATORY = {
    "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency", "BillingPeriodEnd",
    "BillingPeriodStart", "ChargeCategory", "ChargeClass", "ChargeDescription", "ChargePeriodEnd",
    "ChargePeriodStart", "ContractedCost", "EffectiveCost", "HostProviderName", "InvoiceIssuerName", "ListCost",
    "ListUnitPrice", "PricingQuantity", "PricingUnit", "ServiceCategory", "ServiceName", "ServiceProviderName",
    # Deprecated in 1.3 (replaced by ServiceProviderName / HostProviderName) but still required.
    "ProviderName", "PublisherName",
}
# Conditional or recommended columns that apply to this data generator.
APPLICABLE = {
    # Split cost allocation is supported, so all of these must be present (1.3).
    "AllocatedMethodId", "AllocatedMethodDetails", "AllocatedResourceId", "AllocatedResourceName", "AllocatedTags",
    "ResourceId", "ResourceName", "ResourceType", "SkuId", "SkuPriceId", "PricingCategory", "SubAccountId",
    # 1.1+: SkuMeter goes with SkuId, SkuPriceDetails with SkuPriceId (both conditional on them).
    "SkuMeter", "SkuPriceDetails",
    "SubAccountName", "Tags", "ConsumedQuantity", "ConsumedUnit", "InvoiceId", "ChargeFrequency",
    "ServiceSubcategory", "ContractedUnitPrice",
}
NOT_NULL = {
    "BilledCost", "BillingAccountId", "BillingCurrency", "BillingPeriodEnd", "BillingPeriodStart", "ChargeCategory",
    "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart", "ContractedCost", "EffectiveCost", "HostProviderName",
    "InvoiceIssuerName", "ListCost", "ProviderName", "PublisherName", "ServiceCategory", "ServiceName",
    "ServiceProviderName", "ServiceSubcategory", "InvoiceId", "ChargeDescription",
}
DECIMALS = {"BilledCost", "EffectiveCost", "ListCost", "ContractedCost", "ListUnitPrice", "ContractedUnitPrice",
            "PricingQuantity", "ConsumedQuantity"}
DATETIMES = {"BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd"}
JSON_OBJECTS = {"Tags", "AllocatedTags", "AllocatedMethodDetails", "SkuPriceDetails"}
ALLOWED: dict[str, set[str | None]] = {
    "ChargeCategory": {"Usage", "Purchase", "Tax", "Credit", "Adjustment"},
    "ChargeClass": {None, "Correction"},
    "ChargeFrequency": {"One-Time", "Recurring", "Usage-Based"},
    "PricingCategory": {None, "Standard", "Dynamic", "Committed", "Other"},
    "ServiceCategory": {"AI and Machine Learning", "Analytics", "Business Applications", "Compute", "Databases",
                        "Developer Tools", "Multicloud", "Identity", "Integration", "Internet of Things",
                        "Management and Governance", "Media", "Migration", "Mobile", "Networking", "Security",
                        "Storage", "Web", "Other"},
}
SUBCATEGORY_PARENT = {"Containers": "Compute", "Virtual Machines": "Compute", "Other (Compute)": "Compute"}
# FOCUS-defined SkuPriceDetails properties (1.2+, "F_" keys) that a GPU-hour price could carry.
FOCUS_SKU_PRICE_PROPERTIES = {"F_CoreCount", "F_GpuCount", "F_InstanceType", "F_MemorySize", "F_Series"}
ALLOCATION = ("AllocatedMethodId", "AllocatedMethodDetails", "AllocatedResourceId", "AllocatedResourceName")
DECIMAL_RE = re.compile(r"^-?\d+(\.\d+)?$")  # NumericFormat: no exponent, '+', commas or units
DATETIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")  # DateTimeFormat: UTC, 'Z'


def when(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def cell(row: dict[str, str | None], column: str) -> str:
    """A column that must not be null in this row."""
    value = row[column]
    assert value is not None, (column, row)
    return value


def assert_follows_focus_1_3(header: list[str], rows: list[dict[str, str | None]], invoice: Invoice) -> None:
    # Presence, then order: FOCUS columns first (alphabetical), custom x_ columns after.
    assert set(header) >= MANDATORY | APPLICABLE
    focus_columns = [c for c in header if not c.startswith("x_")]
    assert focus_columns == sorted(focus_columns)
    assert header[: len(focus_columns)] == focus_columns
    assert all(re.fullmatch(r"x_[A-Z][A-Za-z0-9]*", c) for c in header[len(focus_columns):])
    assert rows, "an invoice with lines has FOCUS rows"
    for row in rows:
        for column in NOT_NULL:
            assert row[column] is not None, (column, row)
        for column in DECIMALS:
            value = row[column]
            assert value is None or DECIMAL_RE.match(value), (column, value)
        for column in DATETIMES:
            assert DATETIME_RE.match(cell(row, column)), (column, row[column])
        for column in JSON_OBJECTS:
            value = row[column]
            assert value is None or isinstance(json.loads(value), dict), (column, value)
        for column, allowed in ALLOWED.items():
            assert row[column] in allowed, (column, row[column])
        assert SUBCATEGORY_PARENT[cell(row, "ServiceSubcategory")] == row["ServiceCategory"]
        assert row["BillingCurrency"] == invoice.currency
        assert re.fullmatch(r"[A-Z]{3}", row["BillingCurrency"])
        assert row["InvoiceId"] == invoice.number
        assert row["BillingAccountId"] == invoice.tenant.slug

        # Periods: [start, end); the billing period is the invoice's month; a charge lies inside it,
        # except a Correction, which keeps the earlier period its cost was incurred in.
        b_start, b_end = when(cell(row, "BillingPeriodStart")), when(cell(row, "BillingPeriodEnd"))
        c_start, c_end = when(cell(row, "ChargePeriodStart")), when(cell(row, "ChargePeriodEnd"))
        assert b_start == datetime(invoice.period.month.year, invoice.period.month.month, 1, tzinfo=UTC) < b_end
        assert c_start < c_end
        if row["ChargeClass"] == "Correction":
            assert c_end <= b_start
        else:
            assert b_start <= c_start
            assert c_end <= b_end

        # Pricing columns: present for usage that is not a correction, absent with SkuPriceId.
        priced_usage = row["ChargeCategory"] in {"Usage", "Purchase"} and row["ChargeClass"] != "Correction"
        if priced_usage:
            for column in ("SkuId", "SkuPriceId", "ListUnitPrice", "PricingQuantity", "PricingUnit",
                           "PricingCategory", "ConsumedQuantity", "ConsumedUnit"):
                assert row[column] is not None, (column, row)
        if row["SkuPriceId"] is None:
            for column in ("ListUnitPrice", "PricingQuantity", "PricingCategory", "ConsumedQuantity"):
                assert row[column] is None, (column, row)
        assert (row["ListUnitPrice"] is None) == (row["SkuPriceId"] is None)
        # SkuMeter: null when SkuId is, and (SHOULD) set when it is not; SkuPriceDetails likewise with
        # SkuPriceId, its keys PascalCase and F_ only for FOCUS-defined properties.
        assert (row["SkuMeter"] is None) == (row["SkuId"] is None), row
        assert (row["SkuPriceDetails"] is None) == (row["SkuPriceId"] is None), row
        if row["SkuPriceDetails"] is not None:
            details = json.loads(row["SkuPriceDetails"])
            assert all(re.fullmatch(r"(F_)?[A-Z][A-Za-z0-9]*", k) for k in details), details
            assert {k for k in details if k.startswith("F_")} <= FOCUS_SKU_PRICE_PROPERTIES, details
        assert (row["PricingUnit"] is None) == (row["PricingQuantity"] is None)
        assert (row["ConsumedUnit"] is None) == (row["ConsumedQuantity"] is None)
        if row["ChargeCategory"] != "Usage":
            assert row["ConsumedQuantity"] is None
        if row["ListUnitPrice"] is not None:
            assert Decimal(row["ListUnitPrice"]) >= 0
            quantity = Decimal(cell(row, "PricingQuantity"))
            assert Decimal(cell(row, "ListCost")) == Decimal(row["ListUnitPrice"]) * quantity
            assert Decimal(cell(row, "ContractedCost")) == Decimal(cell(row, "ContractedUnitPrice")) * quantity
        else:
            assert row["ListCost"] == row["BilledCost"] == row["ContractedCost"]
        assert row["EffectiveCost"] == row["BilledCost"]  # no commitments: nothing amortised

        # Resources: a type and display name go with an id; the name does not repeat the id.
        assert (row["ResourceType"] is None) == (row["ResourceId"] is None)
        assert row["ResourceId"] is not None or row["ResourceName"] is None
        assert row["ResourceName"] is None or row["ResourceName"] != row["ResourceId"]
        assert (row["SubAccountName"] is None) == (row["SubAccountId"] is None)

        # Split cost allocation: the allocation columns are null together, and only then.
        allocated = row["AllocatedMethodId"] is not None
        assert all((row[c] is not None) == allocated for c in ALLOCATION), row
        if allocated:
            assert row["AllocatedMethodId"] == ALLOCATED_METHOD_ID
            assert row["ResourceId"] is not None
            details = json.loads(cell(row, "AllocatedMethodDetails"))
            assert isinstance(details["Elements"], list)
            assert details["Elements"]
            for element in details["Elements"]:
                assert isinstance(element["AllocatedRatio"], int | float)
                assert 0 <= element["AllocatedRatio"] <= 1
                assert "UsageQuantity" not in element or isinstance(element["UsageUnit"], str)
                assert all(k in {"AllocatedRatio", "UsageUnit", "UsageQuantity"} or k.startswith("x_")
                           for k in element)
            assert all(k == "Elements" or k.startswith("x_") for k in details)
        else:
            assert row["AllocatedTags"] is None

        # Tags: key-value JSON objects, generator-defined keys prefixed; AllocatedTags repeat none of Tags.
        tags = json.loads(row["Tags"]) if row["Tags"] else {}
        allocated_tags = json.loads(row["AllocatedTags"]) if row["AllocatedTags"] else {}
        for key, value in {**tags, **allocated_tags}.items():
            assert key.startswith("vgpu-ledger/")
            assert isinstance(value, str | bool)
        assert not set(tags) & set(allocated_tags)

    # A SkuPriceId defines one unit price, of one SkuId (SkuPriceId's requirements).
    prices: dict[str, set[tuple[str | None, str | None]]] = defaultdict(set)
    for row in rows:
        if row["SkuPriceId"] is not None:
            prices[row["SkuPriceId"]].add((row["SkuId"], row["ListUnitPrice"]))
    assert all(len(p) == 1 for p in prices.values()), prices

    # Σ BilledCost for the InvoiceId is the payable amount on the invoice.
    total = sum((Decimal(cell(r, "BilledCost")) for r in rows), Decimal(0))
    assert total == Decimal(invoice.total_minor).scaleb(-2)


def ratios_by_origin(rows: list[dict[str, str | None]]) -> dict[tuple[str, str], Decimal]:
    """Σ AllocatedRatio per origin charge (GPU, charge period), exact."""
    totals: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for row in rows:
        if row["AllocatedMethodDetails"]:
            details = json.loads(row["AllocatedMethodDetails"], parse_float=Decimal, parse_int=Decimal)
            origin = (cell(row, "ResourceId"), cell(row, "ChargePeriodStart"))
            totals[origin] += sum(e["AllocatedRatio"] for e in details["Elements"])
    return totals


def test_focus_export_follows_the_1_3_column_rules_and_adds_up_to_the_invoice(november):
    header, rows = focus(november.number)
    assert_follows_focus_1_3(header, rows, november)
    (row,) = rows  # one workload, one GPU, one day; 1.00 needs no rounding row
    assert (row["ChargeCategory"], row["BilledCost"], row["ListUnitPrice"], row["PricingUnit"]) == (
        "Usage", "1", "3600", "GPU-Hours")
    assert row["ResourceId"] == "GPU-gpu-node-1-0"
    assert row["AllocatedResourceId"] == "uid-bert-1/server"
    assert (row["ChargePeriodStart"], row["ChargePeriodEnd"]) == ("2026-11-15T00:00:00Z", "2026-11-16T00:00:00Z")
    assert row["BillingAccountName"] == CHINESE_NAME
    assert row["SubAccountId"] == "acme-prod"
    details = json.loads(cell(row, "AllocatedMethodDetails"), parse_float=Decimal)
    # 10 % of the card, half from memory (8192 of 81920 MiB) and half from SMs (10.8 of 108), α = 0.5.
    assert [(e["UsageUnit"], e["AllocatedRatio"]) for e in details["Elements"]] == [
        ("MiB-Seconds", Decimal("0.05")), ("SM-Seconds", Decimal("0.05"))]
    assert details["x_Alpha"] == Decimal("0.5")
    assert details["x_BilledBasis"] == "max"


def test_focus_tax_row_follows_the_1_3_column_rules_and_the_file_adds_up_to_subtotal_plus_tax(
        post_batch, proportional, tenants):
    Tenant.objects.filter(slug="acme").update(tax_rate_pct=Decimal("20"))
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1)
    close_period(month=NOV, now=AFTER_NOV)
    acme = Invoice.objects.get(tenant__slug="acme")
    header, rows = focus(acme.number)
    assert_follows_focus_1_3(header, rows, acme)  # Σ BilledCost = the invoice total, tax included
    (tax,) = [r for r in rows if r["ChargeCategory"] == "Tax"]
    assert (tax["BilledCost"], tax["ChargeClass"], tax["SkuId"]) == ("0.67", None, None)
    assert (tax["ChargePeriodStart"], tax["ChargePeriodEnd"]) == ("2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z")
    assert "20% of the invoice subtotal 3.33 USD" in cell(tax, "ChargeDescription")


def test_focus_rows_reconcile_to_the_invoice_through_one_rounding_row_per_rounded_line(post_batch, proportional,
                                                                                       tenants):
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1)
    close_period(month=NOV, now=AFTER_NOV)
    acme = Invoice.objects.get(tenant__slug="acme")
    header, rows = focus(acme.number)
    assert_follows_focus_1_3(header, rows, acme)
    by_kind = defaultdict(list)
    for row in rows:
        by_kind[(row["x_InvoiceLineKind"], row["ChargeCategory"])].append(row["BilledCost"])
    # Idle 7.00 is spread 1:2: acme's part is 2.333333333333 at ledger precision, invoiced as 2.33.
    assert dict(by_kind) == {
        ("usage", "Usage"): ["1"],
        ("idle", "Usage"): ["2.333333333333"],
        ("idle", "Adjustment"): ["-0.003333333333"],
    }
    assert acme.total_minor == 333


def test_a_price_change_starts_a_new_sku_price_id_of_the_same_sku(post_batch, card, tenants):
    change = datetime(2026, 11, 18, tzinfo=UTC)
    RateCard.objects.filter(pk=card.pk).update(effective_to=change)
    RateCard.objects.create(gpu_model=card.gpu_model, currency="USD", price_per_gpu_hour=Decimal("7200"),
                            effective_from=change, source_url="https://example.org")
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1)
    usage(post_batch, at=datetime(2026, 11, 20, 12, tzinfo=UTC), seq=2)
    close_period(month=NOV, now=AFTER_NOV)
    acme = Invoice.objects.get(tenant__slug="acme")
    header, rows = focus(acme.number)
    assert_follows_focus_1_3(header, rows, acme)  # one unit price per SkuPriceId
    assert {(r["SkuId"], r["ListUnitPrice"]) for r in rows if r["SkuPriceId"]} == {
        ("gpu-share:NVIDIA A100-SXM4-80GB", "3600"), ("gpu-share:NVIDIA A100-SXM4-80GB", "7200")}
    assert len({r["SkuPriceId"] for r in rows if r["SkuPriceId"]}) == 2


def test_allocated_ratios_of_every_tenant_on_a_gpu_day_add_up_to_the_whole_card(post_batch, proportional, tenants):
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1)
    close_period(month=NOV, now=AFTER_NOV)
    rows = [row for invoice in Invoice.objects.all() for row in focus(invoice.number)[1]]
    # Under the proportional idle policy the whole card (usage + idle) is allocated to workloads.
    totals = ratios_by_origin(rows)
    assert list(totals) == [("GPU-gpu-node-1-0", "2026-11-15T00:00:00Z")]
    assert abs(totals[("GPU-gpu-node-1-0", "2026-11-15T00:00:00Z")] - 1) <= Decimal("1e-14")


def test_late_usage_is_a_correction_charged_to_its_month_and_the_old_invoice_still_reconciles(post_batch, card,
                                                                                              tenants):
    usage(post_batch, at=datetime(2026, 10, 20, 12, tzinfo=UTC), seq=1)
    close_period(month=OCT, now=datetime(2026, 11, 2, tzinfo=UTC))
    usage(post_batch, at=datetime(2026, 10, 31, 23, 59, 40, tzinfo=UTC), seq=2, seconds=20)
    usage(post_batch, at=datetime(2026, 11, 10, tzinfo=UTC), seq=3)
    close_period(month=NOV, now=AFTER_NOV)

    october = Invoice.objects.get(tenant__slug="acme", period__month=OCT)
    header, rows = focus(october.number)
    assert_follows_focus_1_3(header, rows, october)
    # The ledger now holds 3.00 for October; the 1.00 invoiced is spread over it pro rata.
    assert [r["BilledCost"] for r in rows] == ["0.333333333333", "0.666666666667"]

    november = Invoice.objects.get(tenant__slug="acme", period__month=NOV)
    header, rows = focus(november.number)
    assert_follows_focus_1_3(header, rows, november)
    (correction,) = [r for r in rows if r["ChargeClass"] == "Correction"]
    assert (correction["ChargeCategory"], correction["BilledCost"]) == ("Usage", "2")
    assert (correction["ChargePeriodStart"], correction["ChargePeriodEnd"]) == (
        "2026-10-01T00:00:00Z", "2026-11-01T00:00:00Z")
    assert correction["BillingPeriodStart"] == "2026-11-01T00:00:00Z"


def test_invoice_csv_has_one_row_per_line_then_subtotal_tax_and_total_in_minor_and_major_units(
        post_batch, proportional, tenants):
    Tenant.objects.filter(slug="acme").update(tax_rate_pct=Decimal("20"), po_number="PO-77", cost_centre="CC-9")
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1)
    close_period(month=NOV, now=AFTER_NOV)
    acme = Invoice.objects.get(tenant__slug="acme")
    content = export_invoice(scope=EVERYONE, number=acme.number, fmt="csv").content.decode("utf-8-sig")
    rows = list(csv.DictReader(io.StringIO(content)))
    # 20 % of 3.33 is 0.666, rounded once on the subtotal: 0.67.
    assert [(r["line"], r["kind"], r["amount_minor"], r["amount"], r["currency"]) for r in rows] == [
        ("1", "idle", "233", "2.33", "USD"),
        ("2", "usage", "100", "1.00", "USD"),
        ("subtotal", "", "333", "3.33", "USD"),
        ("tax", "tax 20%", "67", "0.67", "USD"),
        ("total", "", "400", "4.00", "USD"),
    ]
    assert rows[0]["amount_ledger"] == "2.333333333333"
    assert rows[0]["tenant_name"] == CHINESE_NAME
    # GPU-hours to the documents' stated 2 places; the invoice's header fields on every row.
    assert rows[1]["gpu_hours"] == "0.00"
    assert {(r["issue_date"], r["due_date"], r["payment_terms_days"], r["po_number"], r["cost_centre"])
            for r in rows} == {("2026-12-02", "2027-01-01", "30", "PO-77", "CC-9")}


def test_invoice_pdf_names_the_invoice_embeds_every_font_and_draws_no_missing_glyph(november, tmp_path):
    export = export_invoice(scope=EVERYONE, number=november.number, fmt="pdf")
    pdf = export.content
    assert pdf.startswith(b"%PDF")
    assert export.filename == f"{november.number}.pdf"
    assert november.number.encode() in pdf  # in the document title
    facts = check_pdf(pdf, tmp_path)
    # Only the shipped Noto Sans SC, embedded as a TrueType subset (no Helvetica left to the reader).
    assert len(facts.fonts) == 1
    assert re.fullmatch(r"/[A-Z]{6}\+NotoSansSC-[0-9a-f]{12}", facts.fonts[0])
    assert CHINESE_NAME in facts.text
    assert november.number in facts.text
    # The unit price of the one rate (3600 USD per GPU-hour), and the usage by workload on its own page.
    for shown in ("Unit price", "3600.00", "Usage by workload", "acme-prod"):
        assert shown in facts.text, shown


def _gpu_hours(language: str) -> str:
    with translation.override(language):
        return translation.gettext("GPU-hours")


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_invoice_pdf_line_table_header_fits_each_column_on_one_line(november, language):
    """Each header label is narrower than its column's text width, so none wraps ("GPU-hour / s"), and a
    total of nine digits before the decimal point with its currency fits the amount column unbroken."""
    doc = get_invoice_document(scope=EVERYONE, number=november.number)
    with translation.override(language):
        layout = invoice_pdf_layout(doc)
    header, *_, total_row = layout.table
    big_total = "123,456,789.01 USD"
    font = pdf_font([*header, big_total])
    for column, label in enumerate(header):
        assert label, f"column {column} has no header"
        width = stringWidth(label, font.name, BODY_SIZE)
        assert width <= layout.text_width_pt(column), f"{language}: {label!r} ({width:.1f} pt) wraps"
    assert total_row[-1].endswith(" USD")
    assert stringWidth(big_total, font.name, BODY_SIZE) <= layout.text_width_pt(len(header) - 1)
    # A line's quantity at its stored 6 places, up to 99,999 GPU-hours, stays on one line too.
    assert stringWidth("12345.678901", font.name, BODY_SIZE) <= layout.text_width_pt(header.index(_gpu_hours(language)))
    if language == "zh-hans":
        assert "GPU·小时" in header
    # The usage-by-workload page's table likewise.
    assert layout.appendix is not None
    extra_header = layout.appendix.table[0]
    font = pdf_font([*extra_header, big_total])
    for column, label in enumerate(extra_header):
        width = stringWidth(label, font.name, BODY_SIZE)
        assert width <= text_width_pt(layout.appendix.col_widths_mm, column), f"{language}: {label!r} wraps"
    assert stringWidth(big_total, font.name, BODY_SIZE) <= text_width_pt(layout.appendix.col_widths_mm, -1)


def test_tenant_member_lists_and_downloads_only_own_invoices_and_others_are_404(client, november):
    client.force_login(user_in(tenant="acme"))
    resp = client.get("/invoices/")
    assert resp.status_code == 200
    assert [i.number for i in resp.context["invoices"]] == [november.number]
    assert CHINESE_NAME in resp.content.decode()
    own = client.get(f"/invoices/{november.number}.csv")
    assert own.status_code == 200
    assert own["Content-Disposition"] == f'attachment; filename="{november.number}.csv"'
    globex = Invoice.objects.get(tenant__slug="globex")
    for fmt in ("pdf", "csv", "focus"):
        assert client.get(f"/invoices/{globex.number}.{fmt}").status_code == 404
    # Exactly what a number that does not exist gets: existence is not revealed.
    assert client.get("/invoices/VGL-209901-nobody.csv").status_code == 404
    assert client.get(f"/invoices/{november.number}.xlsx").status_code == 404


def test_finance_lists_and_downloads_every_tenants_invoice(client, november):
    client.force_login(user_in(group=FINANCE_GROUP))
    resp = client.get("/invoices/")
    numbers = {i.number for i in resp.context["invoices"]}
    assert numbers == set(Invoice.objects.values_list("number", flat=True))
    assert len(numbers) == 2
    for number in numbers:
        resp = client.get(f"/invoices/{number}.focus")
        assert resp.status_code == 200
        assert resp["Content-Type"].startswith("text/csv")
        assert resp["Content-Disposition"] == f'attachment; filename="{number}-focus-1.3.csv"'


def test_invoice_pages_require_login(client, november):
    for url in ("/invoices/", f"/invoices/{november.number}.pdf"):
        resp = client.get(url)
        assert resp.status_code == 302
        assert "/accounts/login/" in resp["Location"]


def test_export_invoice_command_writes_each_format(november, tmp_path):
    for fmt, magic in (("pdf", b"%PDF"), ("csv", BOM_UTF8 + b"invoice_number,"),
                       ("focus", BOM_UTF8 + b"AllocatedMethodDetails,")):
        out = StringIO()
        target = tmp_path / f"acme.{fmt}"
        call_command("export_invoice", "--tenant", "acme", "--month", "2026-11", "--format", fmt,
                     "--output", str(target), stdout=out)
        assert target.read_bytes().startswith(magic)
        assert november.number in out.getvalue()


@pytest.mark.parametrize(("args", "message"), [
    (["--tenant", "nobody", "--month", "2026-11", "--format", "csv"], "unknown tenant 'nobody'"),
    (["--tenant", "acme", "--month", "2026-09", "--format", "csv"],
     "tenant 'acme' has no invoice for 2026-09 (invoiced months: 2026-11)"),
    (["--tenant", "acme", "--month", "2026/11", "--format", "csv"], "must look like YYYY-MM"),
    (["--tenant", "acme", "--month", "2026-11", "--format", "xlsx"], "invalid choice: 'xlsx'"),
])
def test_export_invoice_command_rejects_bad_arguments_with_the_reason(november, tmp_path, args, message):
    target = tmp_path / "out"
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("export_invoice", *args, "--output", str(target))
    assert not target.exists()
