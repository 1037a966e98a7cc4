"""The FOCUS 1.3 cost-and-usage rows of one invoice (docs/exports.md), from the ledger rows behind
its lines (billing.ledger.exports): each usage or idle line is spread over its ledger rows at
ledger precision, plus one rounding row per line and one Tax row, so Σ BilledCost = the invoice
total. A credit note's file has a Credit row (its net) and a Tax row (the tax credited), both
negative Corrections of the invoice's month, so Σ BilledCost = − the credit note's total. The row
builders (usage_row, idle_row, platform_idle_row) and the CSV writer serve the fleet dataset too
(focus_dataset)."""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import Context, Decimal, localcontext
from typing import Any

from billing.calendar import month_bounds
from billing.csv_files import csv_writer, number
from billing.ledger.exports import FocusLedgerRow, PlatformIdleRow, list_focus_ledger_rows, list_origin_costs
from billing.models import InvoiceLine
from billing.money import allocate, format_minor_units, from_minor_units, ledger_amount
from billing.services.exports.invoices import CreditNoteDocument, InvoiceDocument, InvoiceLineView
from billing.services.exports.numbers import compact_json, plain_decimal

__all__ = ["ALLOCATED_METHOD_ID", "FOCUS_COLUMNS", "IDLE_METER", "SERVICE_NAME", "TAG_PREFIX", "USAGE_METER",
           "build_credit_note_focus_rows", "build_focus_rows", "common_columns", "focus_cell", "focus_csv", "idle_row",
           "platform_idle_row", "render_credit_note_focus_csv", "render_focus_csv", "usage_row"]

# Documented in docs/exports.md; a new method gets a new id, this one never changes meaning.
ALLOCATED_METHOD_ID = "vgpu-ledger-share-v1"
SERVICE_NAME = "Shared GPU"
# Tag key prefix of the tags this generator defines (FOCUS Tags / AllocatedTags).
TAG_PREFIX = "vgpu-ledger/"

_S_PER_H = Decimal(3600)
# PricingQuantity / ConsumedQuantity precision (GPU-hours); ListCost is the exact product.
_QUANTITY_QUANTUM = Decimal("1e-12")
_RATIO_QUANTUM = Decimal("1e-15")
_CONTEXT = Context(prec=50)

# FOCUS columns first, in alphabetical order, then custom x_ columns (FOCUS ColumnHandling).
FOCUS_COLUMNS: tuple[str, ...] = (*sorted([
    "AllocatedMethodDetails", "AllocatedMethodId", "AllocatedResourceId", "AllocatedResourceName",
    "AllocatedTags", "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency",
    "BillingPeriodEnd", "BillingPeriodStart", "ChargeCategory", "ChargeClass", "ChargeDescription",
    "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart", "ConsumedQuantity", "ConsumedUnit",
    "ContractedCost", "ContractedUnitPrice", "EffectiveCost", "HostProviderName", "InvoiceId",
    "InvoiceIssuerName", "ListCost", "ListUnitPrice", "PricingCategory", "PricingQuantity", "PricingUnit",
    "ProviderName", "PublisherName", "ResourceId", "ResourceName", "ResourceType", "ServiceCategory",
    "ServiceName", "ServiceProviderName", "ServiceSubcategory", "SkuId", "SkuMeter", "SkuPriceDetails", "SkuPriceId",
    "SubAccountId", "SubAccountName", "Tags",
]), "x_CO2eKg", "x_CorrectsInvoiceId", "x_EnergyCost", "x_EnergyKWh", "x_GpuModel", "x_InvoiceLineKind", "x_SlaTier")
# x_EnergyKWh: the GPU energy of the row (docs/billing.md, Energy): a workload's usage row carries all
# the energy attributed to it (its share, and its part of the idle under `proportional`), the platform's
# idle row the card's energy no workload was attributed; other rows none. Σ over a fleet dataset = the
# energy of every priced GPU-hour.
# x_EnergyCost and x_CO2eKg: what that energy cost and emitted at the price per kWh and CO2e factor of its
# node's location on each hour's date (docs/billing.md, Energy), the cost in BillingCurrency at ledger
# precision like BilledCost; empty where some of the row's energy had no price (no factor) and on rows
# without energy. Information beside the cost: never part of BilledCost.
_J_PER_KWH = Decimal(3_600_000)
_KWH_QUANTUM = Decimal("1e-12")

# SkuMeter: what a SKU meters (FOCUS 1.1+: present with SkuId, null exactly when SkuId is null).
USAGE_METER = "GPU Share"
IDLE_METER = "GPU Idle Capacity"


def _sku_id(gpu_model: str) -> str:
    return f"gpu-share:{gpu_model}"


def _idle_sku_id(gpu_model: str) -> str:
    return f"gpu-idle:{gpu_model}"


def _sku_price_id(sku_id: str, rate_card_id: int | None) -> str:
    """One SkuPriceId per unit price (FOCUS: it MUST define a single unit price): the SKU under one
    rate card, so a price change starts a new SkuPriceId of the same SkuId."""
    return f"{sku_id}:rate-card-{rate_card_id}" if rate_card_id is not None else sku_id


def _sku_price_details(gpu_model: str) -> dict[str, Any]:
    """SkuPriceDetails of a GPU-hour price: properties of one PricingUnit (one GPU-hour) that every
    row of the SkuPriceId shares, so only the model's, never a node's or a GPU's."""
    return {"F_GpuCount": 1, "GpuModel": gpu_model}


def _kwh(joules: Decimal) -> Decimal:
    with localcontext(_CONTEXT):
        return (joules / _J_PER_KWH).quantize(_KWH_QUANTUM)


def _energy_columns(joules: Decimal, cost_jp: Decimal | None, co2e_jkg: Decimal | None) -> dict[str, Any]:
    """x_EnergyKWh, x_EnergyCost and x_CO2eKg of a row's energy (None where unknown)."""
    with localcontext(_CONTEXT):
        return {
            "x_EnergyKWh": _kwh(joules),
            "x_EnergyCost": None if cost_jp is None else ledger_amount(cost_jp / _J_PER_KWH),
            "x_CO2eKg": None if co2e_jkg is None else (co2e_jkg / _J_PER_KWH).quantize(_KWH_QUANTUM),
        }


def _ratio(numerator: Decimal, denominator: Decimal) -> Decimal:
    if denominator == 0:
        return Decimal(0)
    with localcontext(_CONTEXT):
        return (numerator / denominator).quantize(_RATIO_QUANTUM)


def _usage_method_details(row: FocusLedgerRow, origin: tuple[Decimal, Decimal]) -> dict[str, Any]:
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


def _idle_method_details(row: FocusLedgerRow, origin: tuple[Decimal, Decimal]) -> dict[str, Any]:
    card_cost, metered_s = origin
    return {
        "Elements": [{"AllocatedRatio": _ratio(row.idle_share, card_cost)}],
        "x_Component": "IdleCapacity", "x_IdlePolicy": row.idle_policy, "x_OriginCost": card_cost,
        "x_OriginMeteredSeconds": metered_s,
    }


def _common_columns(doc: InvoiceDocument, *, number: str, issuer: str, billing: tuple[datetime, datetime],
                    frequency: str) -> dict[str, Any]:
    return common_columns(account=(doc.tenant_slug, doc.tenant_name), currency=doc.currency, invoice_id=number,
                          issuer=issuer, billing=billing, frequency=frequency)


def common_columns(*, account: tuple[str, str], currency: str, invoice_id: str | None, issuer: str,
                   billing: tuple[datetime, datetime], frequency: str) -> dict[str, Any]:
    """The columns every row of a file shares: who pays, in what, for which billing period, to whom."""
    common: dict[str, Any] = dict.fromkeys(FOCUS_COLUMNS)
    common.update({
        "BillingAccountId": account[0], "BillingAccountName": account[1],
        "BillingCurrency": currency, "BillingPeriodStart": billing[0], "BillingPeriodEnd": billing[1],
        "ChargeFrequency": frequency, "HostProviderName": issuer, "InvoiceId": invoice_id,
        "InvoiceIssuerName": issuer, "ProviderName": issuer, "PublisherName": issuer,
        "ServiceCategory": "Compute", "ServiceName": SERVICE_NAME, "ServiceProviderName": issuer,
        "ServiceSubcategory": "Containers",
    })
    return common


def build_focus_rows(doc: InvoiceDocument) -> list[dict[str, Any]]:
    """The FOCUS 1.3 rows of one invoice, as typed values (Decimal, datetime, dict, str or None)."""
    billing_start, billing_end = doc.period_bounds
    common = _common_columns(doc, number=doc.number, issuer=doc.issuer_name, billing=doc.period_bounds,
                             frequency="Usage-Based")
    ledger = list_focus_ledger_rows(tenant=doc.tenant_slug, start=billing_start, end=billing_end)
    origins = {o.key: (o.card_cost, o.metered_seconds)
               for o in list_origin_costs(start=billing_start, end=billing_end, gpus={r.gpu_uuid for r in ledger})}
    by_line: dict[tuple[str, str], list[FocusLedgerRow]] = defaultdict(list)
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
                rows.append(idle_row(line_common, r, billed, origin) if is_idle
                            else usage_row(line_common, r, billed, origin))
        elif line.amount:
            rows.append(_unbacked_row(line_common, line))
        rounding = from_minor_units(line.amount_minor, doc.currency) - line.amount
        if rounding:
            rows.append(_rounding_row(line_common, line, rounding))
    if doc.tax_minor:
        tax = from_minor_units(doc.tax_minor, doc.currency)
        rows.append({
            **common, "ChargePeriodStart": billing_start, "ChargePeriodEnd": billing_end,
            "BilledCost": tax, "EffectiveCost": tax, "ListCost": tax, "ContractedCost": tax, "ChargeCategory": "Tax",
            "ChargeDescription": (f"Tax at {plain_decimal(doc.tax_rate_pct)}% of the invoice subtotal "
                                  f"{format_minor_units(doc.subtotal_minor, doc.currency)} {doc.currency}, rounded once"),
        })
    return rows


def build_credit_note_focus_rows(note: CreditNoteDocument) -> list[dict[str, Any]]:
    """The FOCUS 1.3 rows of a credit note: its net as a Credit and the tax credited as Tax, both
    negative, ChargeClass Correction, charged to the corrected invoice's month and billed in the
    month the credit note is issued; x_CorrectsInvoiceId names the invoice."""
    invoice = note.invoice
    issued = month_bounds(note.issue_date.replace(day=1))
    common = _common_columns(invoice, number=note.number, issuer=note.issuer_name, billing=issued,
                             frequency="One-Time")
    start, end = invoice.period_bounds
    common.update({"ChargePeriodStart": start, "ChargePeriodEnd": end, "ChargeClass": "Correction",
                   "x_CorrectsInvoiceId": invoice.number})
    rows = []
    for category, minor, what in (("Credit", note.amount_minor, "Credit"), ("Tax", note.tax_minor, "Tax credited")):
        if not minor:
            continue
        cost = -from_minor_units(minor, note.currency)
        rows.append({**common, "BilledCost": cost, "EffectiveCost": cost, "ListCost": cost, "ContractedCost": cost,
                     "ChargeCategory": category,
                     "ChargeDescription": f"{what} on invoice {invoice.number} ({invoice.month:%Y-%m}): {note.reason}"})
    return rows


def _gpu_day_columns(*, day: datetime, gpu_uuid: str, gpu_model: str, node: str, price: Decimal, sku_id: str,
                     rate_card_id: int | None, meter: str, quantity: Decimal) -> dict[str, Any]:
    """The columns of one GPU's priced GPU-hours on one UTC day: resource, SKU, price and quantity."""
    list_cost = price * quantity  # exact: both factors are finite decimals
    return {
        "ChargeCategory": "Usage",
        "ChargePeriodStart": day, "ChargePeriodEnd": day + timedelta(days=1),
        "ConsumedQuantity": quantity, "ConsumedUnit": "GPU-Hours",
        "ContractedCost": list_cost, "ContractedUnitPrice": price,
        "ListCost": list_cost, "ListUnitPrice": price,
        "PricingCategory": "Standard", "PricingQuantity": quantity, "PricingUnit": "GPU-Hours",
        "ResourceId": gpu_uuid, "ResourceName": f"{gpu_model} on {node}", "ResourceType": "GPU",
        "SkuId": sku_id, "SkuMeter": meter, "SkuPriceDetails": _sku_price_details(gpu_model),
        "SkuPriceId": _sku_price_id(sku_id, rate_card_id),
        "Tags": {f"{TAG_PREFIX}node": node, f"{TAG_PREFIX}gpu-model": gpu_model},
    }


def _allocated_columns(r: FocusLedgerRow, *, sku_id: str, meter: str, quantity: Decimal) -> dict[str, Any]:
    workload = f"{r.namespace}/{r.pod}/{r.container}"
    return {
        **_gpu_day_columns(day=r.day, gpu_uuid=r.gpu_uuid, gpu_model=r.gpu_model, node=r.node,
                           price=r.price_per_gpu_hour, sku_id=sku_id, rate_card_id=r.rate_card_id, meter=meter,
                           quantity=quantity),
        "AllocatedMethodId": ALLOCATED_METHOD_ID,
        "AllocatedResourceId": f"{r.pod_uid}/{r.container}",
        "AllocatedResourceName": workload,
        "AllocatedTags": {f"{TAG_PREFIX}namespace": r.namespace, f"{TAG_PREFIX}pod": r.pod,
                          f"{TAG_PREFIX}container": r.container, f"{TAG_PREFIX}sla-tier": r.sla_tier},
        "SubAccountId": r.namespace, "SubAccountName": r.namespace,
    }


def usage_row(base: Mapping[str, Any], r: FocusLedgerRow, billed: Decimal,
              origin: tuple[Decimal, Decimal]) -> dict[str, Any]:
    """A workload's share of one GPU-day at `billed` (its ledger charge, or its part of an invoice line)."""
    with localcontext(_CONTEXT):
        quantity = (r.share_gpu_s / _S_PER_H).quantize(_QUANTITY_QUANTUM)
    return {
        **base, **_allocated_columns(r, sku_id=_sku_id(r.gpu_model), meter=USAGE_METER, quantity=quantity),
        "AllocatedMethodDetails": _usage_method_details(r, origin),
        "BilledCost": billed, "EffectiveCost": billed, **_energy_columns(r.energy_j, r.energy_cost_jp, r.co2e_jkg),
        "ChargeDescription": (f"{r.gpu_model} share for {r.namespace}/{r.pod}/{r.container} ({r.sla_tier}) "
                              f"at {plain_decimal(r.price_per_gpu_hour)} per GPU-hour"),
    }


def _idle_hours(idle: Decimal, price: Decimal) -> Decimal:
    """Idle GPU-hours: the idle amount at the unit price, to PricingQuantity's precision."""
    with localcontext(_CONTEXT):
        hours = idle / price if price else Decimal(0)
        return hours.quantize(_QUANTITY_QUANTUM)


def idle_row(base: Mapping[str, Any], r: FocusLedgerRow, billed: Decimal,
             origin: tuple[Decimal, Decimal]) -> dict[str, Any]:
    """The idle of one GPU-day spread onto a workload (proportional idle policy) at `billed`."""
    quantity = _idle_hours(r.idle_share, r.price_per_gpu_hour)
    return {
        **base, **_allocated_columns(r, sku_id=_idle_sku_id(r.gpu_model), meter=IDLE_METER, quantity=quantity),
        "AllocatedMethodDetails": _idle_method_details(r, origin),
        "BilledCost": billed, "EffectiveCost": billed,
        "ChargeDescription": (f"Idle capacity of {r.gpu_model} apportioned to {r.namespace}/{r.pod}/{r.container} "
                              f"(proportional idle policy) at {plain_decimal(r.price_per_gpu_hour)} per GPU-hour"),
    }


def _month_columns(line: InvoiceLineView) -> dict[str, Any]:
    start, end = month_bounds(line.usage_month)
    return {"ChargePeriodStart": start, "ChargePeriodEnd": end}


def _correction_row(base: Mapping[str, Any], line: InvoiceLineView, currency: str) -> dict[str, Any]:
    """Late usage for a closed month: a Correction charged to the month it was incurred in,
    billed in this period at the rounded amount the invoice line carries."""
    billed = from_minor_units(line.amount_minor, currency)
    return {
        **base, **_month_columns(line),
        "BilledCost": billed, "EffectiveCost": billed, "ListCost": billed, "ContractedCost": billed,
        "ChargeCategory": "Usage", "ChargeClass": "Correction", "SkuId": _sku_id(line.gpu_model),
        "SkuMeter": USAGE_METER,
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


def platform_idle_row(base: Mapping[str, Any], r: PlatformIdleRow) -> dict[str, Any]:
    """The idle of one GPU-day that no tenant pays (the fleet dataset): the platform's, not allocated."""
    return {
        **base,
        **_gpu_day_columns(day=r.day, gpu_uuid=r.gpu_uuid, gpu_model=r.gpu_model, node=r.node,
                           price=r.price_per_gpu_hour, sku_id=_idle_sku_id(r.gpu_model), rate_card_id=r.rate_card_id,
                           meter=IDLE_METER, quantity=_idle_hours(r.idle, r.price_per_gpu_hour)),
        "BilledCost": r.idle, "EffectiveCost": r.idle, "x_GpuModel": r.gpu_model,
        **_energy_columns(r.idle_energy_j, r.energy_cost_jp, r.co2e_jkg),
        "ChargeDescription": (f"Idle capacity of {r.gpu_model} on {r.node} kept by the platform ({r.idle_policy} "
                              f"idle policy) at {plain_decimal(r.price_per_gpu_hour)} per GPU-hour"),
    }


def render_focus_csv(doc: InvoiceDocument) -> bytes:
    return focus_csv(build_focus_rows(doc))


def render_credit_note_focus_csv(note: CreditNoteDocument) -> bytes:
    return focus_csv(build_credit_note_focus_rows(note))


def focus_csv(rows: list[dict[str, Any]]) -> bytes:
    """FOCUS rows as CSV (UTF-8, a header of FOCUS_COLUMNS, nulls empty)."""
    out = io.StringIO()
    writer = csv_writer(out, lineterminator="\n")
    writer.writerow(FOCUS_COLUMNS)
    for row in rows:
        writer.writerow([_csv_cell(row[c]) for c in FOCUS_COLUMNS])
    return out.getvalue().encode("utf-8")


def _csv_cell(value: Any) -> str:
    """A FOCUS value for the CSV: numbers marked as numbers (a negative cost is not a formula), text
    left to the writer's formula rule; the Parquet keeps the text exact (docs/exports.md)."""
    return number(focus_cell(value)) if isinstance(value, Decimal | int) else focus_cell(value)


def focus_cell(value: Any) -> str:
    """One value as FOCUS writes it in text: UTC ISO 8601 with Z, plain decimals, compact JSON."""
    if value is None:
        return ""  # a null in CSV
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, Decimal):
        return plain_decimal(value)
    if isinstance(value, dict):
        return compact_json(value)
    return str(value)
