"""Invoice downloads: PDF, CSV and a FOCUS 1.3 cost-and-usage CSV (docs/exports.md).

Reads only. Every entry point takes the caller's `Scope` and filters in the query, so an
invoice outside the scope is indistinguishable from one that does not exist.

Reconciliation (DESIGN §4): an invoice line is rounded once, half-even, to minor units.
The FOCUS rows of a usage or idle line carry ledger amounts (12 decimal places) that add up
to the line's unrounded amount exactly; one "rounding" row per line carries the difference
to the rounded amount. So Σ BilledCost over the file = Σ amount_minor = the invoice total.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Context, Decimal, localcontext
from functools import lru_cache
from typing import Any
from xml.sax.saxutils import escape

from django.conf import settings
from django.db import connection
from django.db.models import QuerySet
from django.utils.translation import gettext as _

from billing.errors import DomainError, InvalidInput
from billing.models import Invoice, InvoiceLine, Tenant
from billing.money import allocate, minor_unit_exponent
from billing.queries.scope import Scope
from billing.services.invoicing import month_bounds, parse_month

__all__ = [
    "ALLOCATED_METHOD_ID",
    "EXPORT_FORMATS",
    "FOCUS_COLUMNS",
    "ExportFile",
    "InvoiceDocument",
    "InvoiceLineView",
    "InvoiceNotFound",
    "InvoiceSummary",
    "build_focus_rows",
    "export_invoice",
    "find_invoice_number",
    "format_major_units",
    "get_invoice_document",
    "list_invoices",
]

EXPORT_FORMATS = ("pdf", "csv", "focus")
# Documented in docs/exports.md; a new method gets a new id, this one never changes meaning.
ALLOCATED_METHOD_ID = "vgpu-ledger-share-v1"
DEFAULT_ISSUER_NAME = "vGPU Ledger"
SERVICE_NAME = "Shared GPU"
# Tag key prefix of the tags this generator defines (FOCUS Tags / AllocatedTags).
TAG_PREFIX = "vgpu-ledger/"

_S_PER_H = Decimal(3600)
# PricingQuantity / ConsumedQuantity precision (GPU-hours); ListCost is the exact product.
_QUANTITY_QUANTUM = Decimal("1e-12")
_RATIO_QUANTUM = Decimal("1e-15")
_CONTEXT = Context(prec=50)

# FOCUS columns first, in alphabetical order, then custom x_ columns (FOCUS ColumnHandling).
FOCUS_COLUMNS: tuple[str, ...] = tuple(sorted([
    "AllocatedMethodDetails", "AllocatedMethodId", "AllocatedResourceId", "AllocatedResourceName",
    "AllocatedTags", "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency",
    "BillingPeriodEnd", "BillingPeriodStart", "ChargeCategory", "ChargeClass", "ChargeDescription",
    "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart", "ConsumedQuantity", "ConsumedUnit",
    "ContractedCost", "ContractedUnitPrice", "EffectiveCost", "HostProviderName", "InvoiceId",
    "InvoiceIssuerName", "ListCost", "ListUnitPrice", "PricingCategory", "PricingQuantity", "PricingUnit",
    "ProviderName", "PublisherName", "ResourceId", "ResourceName", "ResourceType", "ServiceCategory",
    "ServiceName", "ServiceProviderName", "ServiceSubcategory", "SkuId", "SkuPriceId", "SubAccountId",
    "SubAccountName", "Tags",
])) + ("x_GpuModel", "x_InvoiceLineKind", "x_SlaTier")


class InvoiceNotFound(DomainError):
    """No invoice with that number in the caller's scope (a 404 that does not reveal existence)."""


@dataclass(frozen=True)
class InvoiceLineView:
    kind: str
    kind_label: str
    gpu_model: str
    sla_tier: str
    usage_month: date
    gpu_hours: Decimal
    amount: Decimal  # unrounded ledger amount
    amount_minor: int  # rounded once, half-even


@dataclass(frozen=True)
class InvoiceDocument:
    number: str
    tenant_slug: str
    tenant_name: str
    month: date
    currency: str
    status: str
    status_label: str
    total_minor: int
    finalized_at: datetime | None
    issuer_name: str
    lines: tuple[InvoiceLineView, ...]

    @property
    def period_bounds(self) -> tuple[datetime, datetime]:
        return month_bounds(self.month)


@dataclass(frozen=True)
class InvoiceSummary:
    number: str
    tenant_slug: str
    tenant_name: str
    month: date
    currency: str
    status: str
    status_label: str
    total_minor: int

    @property
    def total_display(self) -> str:
        return format_major_units(self.total_minor, self.currency)


@dataclass(frozen=True)
class ExportFile:
    filename: str
    content_type: str
    content: bytes


def _issuer_name() -> str:
    return str(getattr(settings, "INVOICE_ISSUER_NAME", DEFAULT_ISSUER_NAME))


def _major_units(minor: int, currency: str) -> Decimal:
    """Integer minor units as an exact Decimal in major units (no rounding happens here)."""
    return Decimal(minor).scaleb(-minor_unit_exponent(currency))


def format_major_units(minor: int, currency: str) -> str:
    """`12345, "USD"` -> `"123.45"`: exact, with the currency's number of decimals."""
    exponent = minor_unit_exponent(currency)
    return f"{_major_units(minor, currency):.{exponent}f}"


def _scoped_invoices(scope: Scope) -> QuerySet[Invoice]:
    invoices = Invoice.objects.select_related("tenant", "period")
    if scope.tenants is not None:
        invoices = invoices.filter(tenant__slug__in=scope.tenants)
    return invoices


def list_invoices(*, scope: Scope) -> list[InvoiceSummary]:
    return [
        InvoiceSummary(
            number=i.number, tenant_slug=i.tenant.slug, tenant_name=i.tenant.name, month=i.period.month,
            currency=i.currency, status=i.status, status_label=str(i.get_status_display()),
            total_minor=i.total_minor,
        )
        for i in _scoped_invoices(scope).order_by("-period__month", "tenant__slug")
    ]


def get_invoice_document(*, scope: Scope, number: str) -> InvoiceDocument:
    invoice = _scoped_invoices(scope).filter(number=number).first()
    if invoice is None:
        raise InvoiceNotFound(f"no invoice {number!r}")
    kind_labels = dict(InvoiceLine.Kind.choices)
    lines = tuple(
        InvoiceLineView(
            kind=line.kind, kind_label=str(kind_labels.get(line.kind, line.kind)), gpu_model=line.gpu_model,
            sla_tier=line.sla_tier, usage_month=line.usage_month, gpu_hours=line.gpu_hours, amount=line.amount,
            amount_minor=line.amount_minor,
        )
        for line in invoice.lines.order_by("usage_month", "kind", "gpu_model", "sla_tier")
    )
    return InvoiceDocument(
        number=invoice.number, tenant_slug=invoice.tenant.slug, tenant_name=invoice.tenant.name,
        month=invoice.period.month, currency=invoice.currency, status=invoice.status,
        status_label=str(invoice.get_status_display()),
        total_minor=invoice.total_minor, finalized_at=invoice.finalized_at, issuer_name=_issuer_name(), lines=lines,
    )


def find_invoice_number(*, tenant_slug: str, month_text: str) -> str:
    """The number of a tenant's invoice for a month, with a precise error when there is none."""
    month = parse_month(month_text)
    tenant = Tenant.objects.filter(slug=tenant_slug).first()
    if tenant is None:
        raise InvalidInput(f"unknown tenant {tenant_slug!r}")
    invoice = Invoice.objects.filter(tenant=tenant, period__month=month).first()
    if invoice is None:
        months = [f"{m:%Y-%m}" for m in tenant.invoices.order_by("period__month").values_list("period__month", flat=True)]
        known = ", ".join(months) if months else "none yet"
        raise InvalidInput(f"tenant {tenant_slug!r} has no invoice for {month:%Y-%m} (invoiced months: {known})")
    return invoice.number


def export_invoice(*, scope: Scope, number: str, fmt: str) -> ExportFile:
    """Render one invoice in `fmt` (pdf, csv or focus) for a caller with `scope`."""
    if fmt not in EXPORT_FORMATS:
        raise InvalidInput(f"format {fmt!r} must be one of {', '.join(EXPORT_FORMATS)}")
    doc = get_invoice_document(scope=scope, number=number)
    if fmt == "pdf":
        return ExportFile(f"{doc.number}.pdf", "application/pdf", render_invoice_pdf(doc))
    if fmt == "csv":
        return ExportFile(f"{doc.number}.csv", "text/csv; charset=utf-8", render_invoice_csv(doc))
    return ExportFile(f"{doc.number}-focus-1.3.csv", "text/csv; charset=utf-8", render_focus_csv(doc))


# --- Invoice CSV -------------------------------------------------------------------------

INVOICE_CSV_COLUMNS = (
    "invoice_number", "tenant", "tenant_name", "billing_period", "line", "kind", "gpu_model", "sla_tier",
    "usage_month", "gpu_hours", "amount_ledger", "amount_minor", "amount", "currency",
)


def render_invoice_csv(doc: InvoiceDocument) -> bytes:
    """One row per invoice line, then a total row; amounts in minor units and formatted major units."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(INVOICE_CSV_COLUMNS)
    head = [doc.number, doc.tenant_slug, doc.tenant_name, f"{doc.month:%Y-%m}"]
    for i, line in enumerate(doc.lines, start=1):
        writer.writerow(head + [
            i, line.kind, line.gpu_model, line.sla_tier, f"{line.usage_month:%Y-%m}", _plain(line.gpu_hours),
            _plain(line.amount), line.amount_minor, format_major_units(line.amount_minor, doc.currency), doc.currency,
        ])
    writer.writerow(head + ["total", "", "", "", "", "", "", doc.total_minor,
                            format_major_units(doc.total_minor, doc.currency), doc.currency])
    return out.getvalue().encode("utf-8")


# --- FOCUS 1.3 -----------------------------------------------------------------------------

@dataclass(frozen=True)
class _LedgerRow:
    """One workload on one GPU for one UTC day under one rate card (hour ledger sums)."""

    day: datetime
    gpu_uuid: str
    gpu_model: str
    node: str
    namespace: str
    pod: str
    container: str
    pod_uid: str
    sla_tier: str
    rate_card_id: int | None
    price_per_gpu_hour: Decimal
    alpha: Decimal
    billed_basis: str
    idle_policy: str
    memory_mb: int | None
    sm_count: int | None
    mem_billed_mb_s: Decimal
    sm_billed_s: Decimal
    share_gpu_s: Decimal
    charge: Decimal
    idle_share: Decimal

    @property
    def origin_key(self) -> tuple[datetime, str, int | None]:
        return (self.day, self.gpu_uuid, self.rate_card_id)


# The rate card of an hour is the latest one that overlaps it (an hour that straddles a price
# change is shown at the new unit price; its ledger amounts are exact either way).
_CARD_OF_HOUR = (
    "LEFT JOIN LATERAL (SELECT r.id, r.price_per_gpu_hour, r.alpha, r.billed_basis, r.idle_policy "
    "FROM billing_ratecard r WHERE r.gpu_model = g.gpu_model AND r.effective_from < g.hour + interval '1 hour' "
    "AND (r.effective_to IS NULL OR r.effective_to > g.hour) ORDER BY r.effective_from DESC LIMIT 1) rc ON true "
)


def _ledger_rows(*, tenant: str, month: date) -> list[_LedgerRow]:
    start, end = month_bounds(month)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT date_trunc('day', u.hour), u.gpu_uuid, g.gpu_model, n.name, u.namespace, u.pod, u.container, "
            "u.pod_uid, u.sla_tier, rc.id, rc.price_per_gpu_hour, rc.alpha, rc.billed_basis, rc.idle_policy, "
            "gpu.memory_mb, gpu.sm_count, sum(u.mem_billed_mb_s), sum(u.sm_billed_s), sum(u.share_gpu_s), "
            "sum(u.charge), sum(u.idle_share) "
            "FROM billing_usagehour u JOIN billing_gpuhour g ON g.gpu_uuid = u.gpu_uuid AND g.hour = u.hour "
            "JOIN billing_node n ON n.id = u.node_id LEFT JOIN billing_gpu gpu ON gpu.uuid = u.gpu_uuid "
            + _CARD_OF_HOUR
            + "WHERE u.tenant = %s AND u.hour >= %s AND u.hour < %s AND g.priced "
            "GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 ORDER BY 1, 2, 5, 6, 7, 8, 9, 10",
            [tenant, start, end],
        )
        rows = cur.fetchall()
    return [
        _LedgerRow(
            day=r[0].astimezone(UTC), gpu_uuid=r[1], gpu_model=r[2], node=r[3], namespace=r[4], pod=r[5],
            container=r[6], pod_uid=r[7], sla_tier=r[8], rate_card_id=r[9],
            price_per_gpu_hour=r[10] if r[10] is not None else Decimal(0),
            alpha=r[11] if r[11] is not None else Decimal("0.5"), billed_basis=r[12] or "max",
            idle_policy=r[13] or "platform", memory_mb=r[14], sm_count=r[15], mem_billed_mb_s=r[16],
            sm_billed_s=r[17], share_gpu_s=r[18], charge=r[19], idle_share=r[20],
        )
        for r in rows
    ]


def _origin_costs(*, month: date, gpus: Iterable[str]) -> dict[tuple[datetime, str, int | None], tuple[Decimal, Decimal]]:
    """(day, gpu, card) -> (card cost, metered seconds): the origin charge that split allocation divides."""
    start, end = month_bounds(month)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT date_trunc('day', g.hour), g.gpu_uuid, rc.id, sum(g.card_cost), sum(g.metered_seconds) "
            "FROM billing_gpuhour g " + _CARD_OF_HOUR
            + "WHERE g.hour >= %s AND g.hour < %s AND g.priced AND g.gpu_uuid = ANY(%s) GROUP BY 1, 2, 3",
            [start, end, sorted(set(gpus))],
        )
        return {(r[0].astimezone(UTC), r[1], r[2]): (r[3], r[4]) for r in cur.fetchall()}


def _sku_id(gpu_model: str) -> str:
    return f"gpu-share:{gpu_model}"


def _idle_sku_id(gpu_model: str) -> str:
    return f"gpu-idle:{gpu_model}"


def _ratio(numerator: Decimal, denominator: Decimal) -> Decimal:
    if denominator == 0:
        return Decimal(0)
    with localcontext(_CONTEXT):
        return (numerator / denominator).quantize(_RATIO_QUANTUM)


def _usage_method_details(row: _LedgerRow, origin: tuple[Decimal, Decimal]) -> dict[str, Any]:
    """AllocatedMethodDetails of a usage row: the workload's share of the GPU split into its memory
    and SM parts (α · M / memory_mb and (1 − α) · S / sm_count), as fractions of the origin charge."""
    card_cost, metered_s = origin
    ratio = _ratio(row.charge, card_cost) if card_cost else _ratio(row.share_gpu_s, metered_s)
    with localcontext(_CONTEXT):
        mem_w = row.alpha * row.mem_billed_mb_s / row.memory_mb if row.memory_mb else Decimal(0)
        sm_w = (1 - row.alpha) * row.sm_billed_s / row.sm_count if row.sm_count else Decimal(0)
        if mem_w + sm_w > 0:
            mem_ratio = (ratio * mem_w / (mem_w + sm_w)).quantize(_RATIO_QUANTUM)
            elements = [
                {"AllocatedRatio": mem_ratio, "UsageUnit": "MiB-Seconds", "UsageQuantity": row.mem_billed_mb_s},
                {"AllocatedRatio": ratio - mem_ratio, "UsageUnit": "SM-Seconds", "UsageQuantity": row.sm_billed_s},
            ]
        else:  # the GPU's size is unknown: one element in GPU-seconds
            elements = [{"AllocatedRatio": ratio, "UsageUnit": "GPU-Seconds", "UsageQuantity": row.share_gpu_s}]
    return {
        "Elements": elements, "x_Component": "Usage", "x_Alpha": row.alpha, "x_BilledBasis": row.billed_basis,
        "x_ShareGpuSeconds": row.share_gpu_s, "x_OriginCost": card_cost, "x_OriginMeteredSeconds": metered_s,
    }


def _idle_method_details(row: _LedgerRow, origin: tuple[Decimal, Decimal]) -> dict[str, Any]:
    card_cost, metered_s = origin
    return {
        "Elements": [{"AllocatedRatio": _ratio(row.idle_share, card_cost)}],
        "x_Component": "IdleCapacity", "x_IdlePolicy": row.idle_policy, "x_OriginCost": card_cost,
        "x_OriginMeteredSeconds": metered_s,
    }


def build_focus_rows(doc: InvoiceDocument) -> list[dict[str, Any]]:
    """The FOCUS 1.3 rows of one invoice, as typed values (Decimal, datetime, dict, str or None)."""
    billing_start, billing_end = doc.period_bounds
    common: dict[str, Any] = dict.fromkeys(FOCUS_COLUMNS)
    common.update({
        "BillingAccountId": doc.tenant_slug, "BillingAccountName": doc.tenant_name,
        "BillingCurrency": doc.currency, "BillingPeriodStart": billing_start, "BillingPeriodEnd": billing_end,
        "ChargeFrequency": "Usage-Based", "HostProviderName": doc.issuer_name, "InvoiceId": doc.number,
        "InvoiceIssuerName": doc.issuer_name, "ProviderName": doc.issuer_name, "PublisherName": doc.issuer_name,
        "ServiceCategory": "Compute", "ServiceName": SERVICE_NAME, "ServiceProviderName": doc.issuer_name,
        "ServiceSubcategory": "Containers",
    })
    ledger = _ledger_rows(tenant=doc.tenant_slug, month=doc.month)
    origins = _origin_costs(month=doc.month, gpus=(r.gpu_uuid for r in ledger))
    by_line: dict[tuple[str, str], list[_LedgerRow]] = defaultdict(list)
    for r in ledger:
        by_line[(r.gpu_model, r.sla_tier)].append(r)

    rows: list[dict[str, Any]] = []
    for line in doc.lines:
        line_common = {**common, "x_GpuModel": line.gpu_model, "x_InvoiceLineKind": line.kind,
                       "x_SlaTier": line.sla_tier}
        if line.kind == InvoiceLine.Kind.ADJUSTMENT:
            rows.append(_correction_row(line_common, line, doc.currency))
            continue
        is_idle = line.kind == InvoiceLine.Kind.IDLE
        parts = [r for r in by_line.get((line.gpu_model, line.sla_tier), []) if (r.idle_share if is_idle else True)]
        weights = [r.idle_share if is_idle else r.charge for r in parts]
        if parts and line.amount >= 0:
            # Equal to the ledger amounts unless usage arrived after the invoice was finalized; then the
            # invoiced amount is spread pro rata over today's ledger (the late part is on a later invoice).
            for r, billed in zip(parts, allocate(line.amount, weights), strict=True):
                origin = origins.get(r.origin_key, (Decimal(0), Decimal(0)))
                rows.append(_idle_row(line_common, r, billed, origin) if is_idle
                            else _usage_row(line_common, r, billed, origin))
        elif line.amount:
            rows.append(_unbacked_row(line_common, line))
        rounding = _major_units(line.amount_minor, doc.currency) - line.amount
        if rounding:
            rows.append(_rounding_row(line_common, line, rounding))
    return rows


def _allocated_columns(r: _LedgerRow, *, sku_id: str, quantity: Decimal) -> dict[str, Any]:
    workload = f"{r.namespace}/{r.pod}/{r.container}"
    list_cost = r.price_per_gpu_hour * quantity  # exact: both factors are finite decimals
    return {
        "AllocatedMethodId": ALLOCATED_METHOD_ID,
        "AllocatedResourceId": f"{r.pod_uid}/{r.container}",
        "AllocatedResourceName": workload,
        "AllocatedTags": {f"{TAG_PREFIX}namespace": r.namespace, f"{TAG_PREFIX}pod": r.pod,
                          f"{TAG_PREFIX}container": r.container, f"{TAG_PREFIX}sla-tier": r.sla_tier},
        "ChargeCategory": "Usage",
        "ChargePeriodStart": r.day, "ChargePeriodEnd": r.day + timedelta(days=1),
        "ConsumedQuantity": quantity, "ConsumedUnit": "GPU-Hours",
        "ContractedCost": list_cost, "ContractedUnitPrice": r.price_per_gpu_hour,
        "ListCost": list_cost, "ListUnitPrice": r.price_per_gpu_hour,
        "PricingCategory": "Standard", "PricingQuantity": quantity, "PricingUnit": "GPU-Hours",
        "ResourceId": r.gpu_uuid, "ResourceName": f"{r.gpu_model} on {r.node}", "ResourceType": "GPU",
        "SkuId": sku_id, "SkuPriceId": sku_id,
        "SubAccountId": r.namespace, "SubAccountName": r.namespace,
        "Tags": {f"{TAG_PREFIX}node": r.node, f"{TAG_PREFIX}gpu-model": r.gpu_model},
    }


def _usage_row(base: Mapping[str, Any], r: _LedgerRow, billed: Decimal,
               origin: tuple[Decimal, Decimal]) -> dict[str, Any]:
    with localcontext(_CONTEXT):
        quantity = (r.share_gpu_s / _S_PER_H).quantize(_QUANTITY_QUANTUM)
    return {
        **base, **_allocated_columns(r, sku_id=_sku_id(r.gpu_model), quantity=quantity),
        "AllocatedMethodDetails": _usage_method_details(r, origin),
        "BilledCost": billed, "EffectiveCost": billed,
        "ChargeDescription": (f"{r.gpu_model} share for {r.namespace}/{r.pod}/{r.container} ({r.sla_tier}) "
                              f"at {_plain(r.price_per_gpu_hour)} per GPU-hour"),
    }


def _idle_row(base: Mapping[str, Any], r: _LedgerRow, billed: Decimal,
              origin: tuple[Decimal, Decimal]) -> dict[str, Any]:
    with localcontext(_CONTEXT):
        hours = r.idle_share / r.price_per_gpu_hour if r.price_per_gpu_hour else Decimal(0)
        quantity = hours.quantize(_QUANTITY_QUANTUM)
    return {
        **base, **_allocated_columns(r, sku_id=_idle_sku_id(r.gpu_model), quantity=quantity),
        "AllocatedMethodDetails": _idle_method_details(r, origin),
        "BilledCost": billed, "EffectiveCost": billed,
        "ChargeDescription": (f"Idle capacity of {r.gpu_model} apportioned to {r.namespace}/{r.pod}/{r.container} "
                              f"(proportional idle policy) at {_plain(r.price_per_gpu_hour)} per GPU-hour"),
    }


def _month_columns(line: InvoiceLineView) -> dict[str, Any]:
    start, end = month_bounds(line.usage_month)
    return {"ChargePeriodStart": start, "ChargePeriodEnd": end}


def _correction_row(base: Mapping[str, Any], line: InvoiceLineView, currency: str) -> dict[str, Any]:
    """Late usage for a closed month: a Correction charged to the month it was incurred in,
    billed in this period at the rounded amount the invoice line carries."""
    billed = _major_units(line.amount_minor, currency)
    return {
        **base, **_month_columns(line),
        "BilledCost": billed, "EffectiveCost": billed, "ListCost": billed, "ContractedCost": billed,
        "ChargeCategory": "Usage", "ChargeClass": "Correction", "SkuId": _sku_id(line.gpu_model),
        "ChargeDescription": (f"Correction for {line.gpu_model} usage ({line.sla_tier}) in {line.usage_month:%Y-%m} "
                              "that arrived after that month was invoiced"),
    }


def _rounding_row(base: Mapping[str, Any], line: InvoiceLineView, rounding: Decimal) -> dict[str, Any]:
    return {
        **base, **_month_columns(line),
        "BilledCost": rounding, "EffectiveCost": rounding, "ListCost": rounding, "ContractedCost": rounding,
        "ChargeCategory": "Adjustment",
        "ChargeDescription": (f"Rounding of the invoice line '{line.kind} {line.gpu_model} {line.sla_tier}' to minor "
                              "units (half-even, once per line)"),
    }


def _unbacked_row(base: Mapping[str, Any], line: InvoiceLineView) -> dict[str, Any]:
    """An invoiced amount the hour ledger no longer holds (e.g. rebuilt as unpriced): shown, not hidden."""
    return {
        **base, **_month_columns(line),
        "BilledCost": line.amount, "EffectiveCost": line.amount, "ListCost": line.amount,
        "ContractedCost": line.amount, "ChargeCategory": "Adjustment",
        "ChargeDescription": (f"Invoiced {line.kind} of {line.gpu_model} ({line.sla_tier}) that the hour ledger "
                              "no longer holds"),
    }


def render_focus_csv(doc: InvoiceDocument) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FOCUS_COLUMNS)
    for row in build_focus_rows(doc):
        writer.writerow([_focus_cell(row[c]) for c in FOCUS_COLUMNS])
    return out.getvalue().encode("utf-8")


def _focus_cell(value: Any) -> str:
    if value is None:
        return ""  # a null in CSV
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, Decimal):
        return _plain(value)
    if isinstance(value, dict):
        return _json(value)
    return str(value)


def _plain(value: Decimal) -> str:
    """A decimal as FOCUS NumericFormat wants it: no exponent, no '+', no trailing zeros."""
    if value == 0:
        return "0"
    return format(value.normalize(), "f")


def _json(value: Any) -> str:
    """Compact JSON with Decimals as exact JSON numbers (json.dumps would need floats)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_json(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return _plain(value)
    return json.dumps(value, ensure_ascii=False)


# --- PDF ----------------------------------------------------------------------------------

def render_invoice_pdf(doc: InvoiceDocument) -> bytes:
    from reportlab.lib import colors
    from reportlab.lib.enums import TA_RIGHT
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import ParagraphStyle
    from reportlab.lib.units import mm
    from reportlab.platypus import Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle

    start, end = doc.period_bounds
    header = [
        (_("Issuer"), doc.issuer_name),
        (_("Tenant"), f"{doc.tenant_name} ({doc.tenant_slug})"),
        (_("Invoice number"), doc.number),
        (_("Billing period"), f"{start:%Y-%m-%d} – {end - timedelta(days=1):%Y-%m-%d} (UTC)"),
        (_("Currency"), doc.currency),
        (_("Status"), doc.status_label + (f" {doc.finalized_at:%Y-%m-%d %H:%M} UTC" if doc.finalized_at else "")),
    ]
    table = [[_("Line"), _("GPU model"), _("SLA tier"), _("Usage month"), _("GPU-hours"), _("Amount")]]
    for line in doc.lines:
        table.append([line.kind_label, line.gpu_model, line.sla_tier, f"{line.usage_month:%Y-%m}",
                      _plain(line.gpu_hours) if line.kind == InvoiceLine.Kind.USAGE else "",
                      format_major_units(line.amount_minor, doc.currency)])
    total = format_major_units(doc.total_minor, doc.currency)
    table.append([_("Total"), "", "", "", "", f"{total} {doc.currency}"])
    title = _("Invoice")
    note = _("Amounts are rounded once per invoice line to the currency's minor unit (round half to even); "
             "the total is the sum of the rounded lines. Late usage for a month already invoiced appears as an "
             "adjustment on a later invoice.")
    strings = [title, note, *(s for pair in header for s in pair), *(c for row in table for c in row)]
    font = cjk_font_name("".join(strings))

    body = ParagraphStyle("body", fontName=font, fontSize=9, leading=12)
    number_style = ParagraphStyle("number", parent=body, alignment=TA_RIGHT)
    heading = ParagraphStyle("heading", fontName=font, fontSize=18, leading=22, spaceAfter=8)
    buf = io.BytesIO()
    pdf = SimpleDocTemplate(buf, pagesize=A4, title=f"{title} {doc.number}", author=doc.issuer_name,
                            subject=f"{doc.number} {doc.tenant_slug} {doc.month:%Y-%m}",
                            leftMargin=18 * mm, rightMargin=18 * mm, topMargin=18 * mm, bottomMargin=18 * mm)
    head_table = Table([[Paragraph(escape(k), body), Paragraph(escape(v), body)] for k, v in header],
                       colWidths=[40 * mm, 130 * mm])
    head_table.setStyle(TableStyle([("VALIGN", (0, 0), (-1, -1), "TOP"), ("TEXTCOLOR", (0, 0), (0, -1), colors.grey)]))
    lines_table = Table([[Paragraph(escape(c), number_style if i >= 4 else body) for i, c in enumerate(row)]
                         for row in table],
                        colWidths=[36 * mm, 46 * mm, 20 * mm, 20 * mm, 22 * mm, 30 * mm], repeatRows=1)
    lines_table.setStyle(TableStyle([
        ("LINEBELOW", (0, 0), (-1, 0), 0.6, colors.black),
        ("LINEABOVE", (0, -1), (-1, -1), 0.6, colors.black),
        ("VALIGN", (0, 0), (-1, -1), "TOP"),
    ]))
    story = [Paragraph(escape(title), heading), head_table, Spacer(1, 8 * mm), lines_table, Spacer(1, 6 * mm),
             Paragraph(escape(note), body)]
    pdf.build(story)
    return buf.getvalue()


def cjk_font_name(text: str) -> str:
    """Register (once per character set) a TrueType subset of Noto Sans SC covering `text`."""
    return _register_subset("".join(sorted(set(text))))


@lru_cache(maxsize=128)
def _register_subset(chars: str) -> str:
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont

    name = "NotoSansSC-" + hashlib.sha256(chars.encode()).hexdigest()[:12]
    pdfmetrics.registerFont(TTFont(name, io.BytesIO(_truetype_subset(chars))))
    return name


def _truetype_subset(chars: str) -> bytes:
    """Noto Sans SC (SIL OFL 1.1, shipped by the pylopdf-fonts-zh-cn wheel) cut down to `chars`
    and converted from CFF to TrueType outlines, which is what reportlab embeds. Subsetting first
    keeps this to about a second for an invoice; the whole font has ~30 000 glyphs."""
    import pylopdf_fonts_zh_cn
    from fontTools import subset
    from fontTools.pens.cu2quPen import Cu2QuPen
    from fontTools.pens.ttGlyphPen import TTGlyphPen
    from fontTools.ttLib import TTFont as FontFile
    from fontTools.ttLib import newTable

    font = FontFile(pylopdf_fonts_zh_cn.sans_path(), lazy=True)
    options = subset.Options()
    options.name_IDs = ["*"]
    options.notdef_outline = True
    options.layout_features = []
    options.hinting = False
    subsetter = subset.Subsetter(options)
    subsetter.populate(text=chars)
    subsetter.subset(font)

    glyph_set = font.getGlyphSet()
    order = font.getGlyphOrder()
    glyphs = {}
    for glyph_name in order:
        pen = TTGlyphPen(None)
        # Cubic to quadratic within 1 font unit (of 1000 per em): invisible at any print size.
        glyph_set[glyph_name].draw(Cu2QuPen(pen, 1.0, reverse_direction=True))
        glyphs[glyph_name] = pen.glyph()
    glyf = newTable("glyf")
    glyf.glyphOrder = order
    glyf.glyphs = glyphs
    font["glyf"] = glyf
    font["loca"] = newTable("loca")
    for table in ("CFF ", "VORG"):
        if table in font:
            del font[table]
    maxp = newTable("maxp")
    maxp.tableVersion = 0x00010000
    for field in ("maxZones", "maxTwilightPoints", "maxStorage", "maxFunctionDefs", "maxInstructionDefs",
                  "maxStackElements", "maxSizeOfInstructions", "maxComponentElements"):
        setattr(maxp, field, 0)
    maxp.maxZones = 1
    font["maxp"] = maxp
    font["head"].indexToLocFormat = 0
    font["head"].glyphDataFormat = 0
    font["post"].formatType = 3.0
    font.sfntVersion = "\x00\x01\x00\x00"
    out = io.BytesIO()
    font.save(out)
    return out.getvalue()
