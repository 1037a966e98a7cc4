"""Closing a month: one invoice per tenant, finalized, immutable; late usage becomes adjustments.

`close_period` is safe to crash and rerun: the period is marked CLOSING first, each tenant's
invoice is built and finalized in its own transaction (a finalized one is skipped on rerun,
a draft one is rebuilt), and the period is marked CLOSED last. As it goes it writes
`progress_pct` on the period row (committed at once, so any web process can show it); an
error marks the row FAILED with the message, and closing again resumes.

`request_period_close` is the periods page's entry: it checks the month can be closed, marks
the row CLOSING with who asked, audits, and enqueues the job on commit — once: a second request
while a close runs changes nothing.

Lines (DESIGN §4): per GPU model and SLA tier, the usage charge; under the `proportional`
idle policy an explicit idle line; and, for months closed earlier, an adjustment line per
GPU model and tier for whatever the ledger now says beyond what was invoiced (late
batches; negative amounts are credits). Each line is rounded once to minor units.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Sum

from billing.errors import InvalidInput
from billing.models import BillingPeriod, Invoice, InvoiceLine, Tenant
from billing.money import to_minor_units
from billing.services.audit import record_audit_event

__all__ = [
    "CloseRequest",
    "CloseResult",
    "LineDraft",
    "close_period",
    "month_bounds",
    "parse_month",
    "request_period_close",
]

_S_PER_H = Decimal(3600)


@dataclass(frozen=True)
class LineDraft:
    tenant: str
    currency: str
    kind: str
    gpu_model: str
    sla_tier: str
    usage_month: date
    gpu_hours: Decimal
    amount: Decimal


@dataclass(frozen=True)
class CloseResult:
    month: date
    invoices_finalized: int
    invoices_already_final: int
    already_closed: bool


@dataclass(frozen=True)
class CloseRequest:
    month: date
    status: str
    # False when a close was already running (or done): nothing changed, nothing enqueued.
    enqueued: bool


# Progress while invoices are built runs from _PCT_LINES_READY to _PCT_INVOICES_DONE; 100 is CLOSED.
_PCT_LINES_READY = 5
_PCT_INVOICES_DONE = 95
_ERROR_MAX_CHARS = 2000


def parse_month(text: str) -> date:
    try:
        parsed = datetime.strptime(text, "%Y-%m")  # noqa: DTZ007 - a calendar month, no time of day
    except ValueError as exc:
        raise InvalidInput(f"month {text!r} must look like YYYY-MM") from exc
    return date(parsed.year, parsed.month, 1)


def month_bounds(month: date) -> tuple[datetime, datetime]:
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    end = datetime(month.year + (month.month == 12), month.month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def _ledger_totals(month: date) -> dict[tuple[str, str, str, str], tuple[Decimal, Decimal, Decimal]]:
    """(tenant, currency, gpu_model, sla_tier) -> (charge, idle_share, share_gpu_s) of priced usage."""
    start, end = month_bounds(month)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT u.tenant, g.currency, g.gpu_model, u.sla_tier, sum(u.charge), sum(u.idle_share), "
            "sum(u.share_gpu_s) FROM billing_usagehour u JOIN billing_gpuhour g "
            "ON g.gpu_uuid = u.gpu_uuid AND g.hour = u.hour "
            "WHERE u.hour >= %s AND u.hour < %s AND g.priced GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4",
            [start, end],
        )
        return {(r[0], r[1], r[2], r[3]): (r[4], r[5], r[6]) for r in cur.fetchall()}


def _unpriced_gpu_hours(month: date) -> Decimal:
    start, end = month_bounds(month)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT coalesce(sum(metered_seconds), 0) FROM billing_gpuhour WHERE hour >= %s AND hour < %s "
            "AND NOT priced",
            [start, end],
        )
        return Decimal(cur.fetchone()[0]) / _S_PER_H


def _month_lines(month: date) -> list[LineDraft]:
    lines = []
    for (tenant, currency, model, tier), (charge, idle, share) in _ledger_totals(month).items():
        lines.append(LineDraft(tenant, currency, InvoiceLine.Kind.USAGE, model, tier, month, share / _S_PER_H, charge))
        if idle:
            lines.append(LineDraft(tenant, currency, InvoiceLine.Kind.IDLE, model, tier, month, Decimal(0), idle))
    return lines


def _adjustment_lines(*, month: date, horizon: timedelta) -> list[LineDraft]:
    """For closed months whose late-usage horizon reaches into `month`: ledger now − invoiced."""
    start, _ = month_bounds(month)
    lines = []
    for period in BillingPeriod.objects.filter(status=BillingPeriod.Status.CLOSED, month__lt=month):
        _, period_end = month_bounds(period.month)
        if period_end + horizon < start:
            continue
        invoiced: dict[tuple[str, str, str], Decimal] = defaultdict(Decimal)
        rows = (
            InvoiceLine.objects.filter(usage_month=period.month, invoice__status=Invoice.Status.FINALIZED)
            .values("invoice__tenant__slug", "gpu_model", "sla_tier")
            .annotate(total=Sum("amount"))
        )
        for r in rows:
            invoiced[(r["invoice__tenant__slug"], r["gpu_model"], r["sla_tier"])] += r["total"]
        now_totals: dict[tuple[str, str, str], tuple[str, Decimal, Decimal]] = {}
        for (tenant, currency, model, tier), (charge, idle, share) in _ledger_totals(period.month).items():
            now_totals[(tenant, model, tier)] = (currency, charge + idle, share)
        for key in sorted(set(now_totals) | set(invoiced)):
            currency, amount, share = now_totals.get(key, ("", Decimal(0), Decimal(0)))
            delta = amount - invoiced.get(key, Decimal(0))
            if delta != 0:
                tenant, model, tier = key
                lines.append(LineDraft(tenant, currency, InvoiceLine.Kind.ADJUSTMENT, model, tier, period.month,
                                       Decimal(0), delta))
    return lines


def _check_closable(*, month: date, now: datetime, allow_unpriced: bool) -> None:
    if month.day != 1:
        raise InvalidInput("a billing period starts on the first day of a month")
    _, end = month_bounds(month)
    if end > now:
        raise InvalidInput(f"{month:%Y-%m} is not over yet; it can be closed from {end:%Y-%m-%d} 00:00 UTC")
    unpriced = _unpriced_gpu_hours(month)
    if unpriced and not allow_unpriced:
        raise InvalidInput(
            f"{month:%Y-%m} has {unpriced:.2f} GPU-hours without a rate card; add the card and run "
            "rebuild_ledger for the month, or close with --allow-unpriced to leave them off the invoices"
        )


def request_period_close(
    *, month: date, now: datetime, actor_label: str, actor_id: int | None, enqueue: Callable[[str], object]
) -> CloseRequest:
    """Record a request to close `month` and call `enqueue("YYYY-MM")` once the request commits.

    Idempotent: the row is locked, and only an OPEN or FAILED period (or none yet) starts a close;
    a CLOSING or CLOSED one is returned unchanged and nothing is enqueued. Refused (InvalidInput,
    nothing written) for a month that is not over or has unpriced usage."""
    _check_closable(month=month, now=now, allow_unpriced=False)
    with transaction.atomic():
        period, _ = BillingPeriod.objects.select_for_update().get_or_create(month=month)
        if period.status in (BillingPeriod.Status.CLOSING, BillingPeriod.Status.CLOSED):
            return CloseRequest(month, period.status, enqueued=False)
        before = {"status": period.status, "error": period.error}
        period.status = BillingPeriod.Status.CLOSING
        period.requested_by_id = actor_id
        period.requested_at = now
        period.progress_pct = 0
        period.error = ""
        period.save(update_fields=["status", "requested_by", "requested_at", "progress_pct", "error"])
        record_audit_event(
            at=now, actor_id=actor_id, actor_label=actor_label, action="period.close_requested",
            object_type="billing_period", object_id=f"{month:%Y-%m}", before=before, after={"status": period.status},
        )
        key = f"{month:%Y-%m}"
        transaction.on_commit(lambda: enqueue(key))
    return CloseRequest(month, period.status, enqueued=True)


def close_period(
    *, month: date, now: datetime, horizon: timedelta | None = None, allow_unpriced: bool = False,
    progress: Callable[[int], None] | None = None,
) -> CloseResult:
    """Finalize one invoice per tenant for `month` (which must be over). Late usage for months
    closed earlier within `horizon` (default: settings.VGPU_LATE_USAGE_HORIZON) is adjusted.

    `progress(pct)` is called after the period row's `progress_pct` is written (each tenant's
    invoice, then 100 when CLOSED). An error marks a CLOSING row FAILED with its message and is
    raised again; a month refused up front (not over, unpriced) changes no row that is not
    already closing."""
    horizon = settings.VGPU_LATE_USAGE_HORIZON if horizon is None else horizon
    try:
        return _close_period(month=month, now=now, horizon=horizon, allow_unpriced=allow_unpriced,
                             progress=progress or _no_progress)
    except Exception as exc:
        # Only a close in flight becomes FAILED: a CLOSED row (another run finished) stays closed.
        BillingPeriod.objects.filter(month=month, status=BillingPeriod.Status.CLOSING).update(
            status=BillingPeriod.Status.FAILED, error=str(exc)[:_ERROR_MAX_CHARS] or type(exc).__name__,
        )
        raise


def _no_progress(pct: int) -> None:
    """The default progress callback: the row is written anyway."""


def _close_period(
    *, month: date, now: datetime, horizon: timedelta, allow_unpriced: bool, progress: Callable[[int], None]
) -> CloseResult:
    _check_closable(month=month, now=now, allow_unpriced=allow_unpriced)
    with transaction.atomic():
        period, _ = BillingPeriod.objects.select_for_update().get_or_create(month=month)
        if period.status == BillingPeriod.Status.CLOSED:
            return CloseResult(month, 0, period.invoices.count(), already_closed=True)
        period.status = BillingPeriod.Status.CLOSING
        period.close_started_at = period.close_started_at or now
        period.progress_pct = 0
        period.error = ""
        period.save(update_fields=["status", "close_started_at", "progress_pct", "error"])

    def report(pct: int) -> None:
        BillingPeriod.objects.filter(pk=period.pk, status=BillingPeriod.Status.CLOSING).update(progress_pct=pct)
        progress(pct)

    by_tenant: dict[str, list[LineDraft]] = defaultdict(list)
    for line in _month_lines(month) + _adjustment_lines(month=month, horizon=horizon):
        by_tenant[line.tenant].append(line)
    report(_PCT_LINES_READY)
    finalized = skipped = 0
    slugs = sorted(by_tenant)
    for done, slug in enumerate(slugs, start=1):
        if _finalize_invoice(period=period, slug=slug, lines=by_tenant[slug], now=now):
            finalized += 1
        else:
            skipped += 1
        report(_PCT_LINES_READY + (_PCT_INVOICES_DONE - _PCT_LINES_READY) * done // len(slugs))

    with transaction.atomic():
        period = BillingPeriod.objects.select_for_update().get(pk=period.pk)
        period.status = BillingPeriod.Status.CLOSED
        period.closed_at = now
        period.progress_pct = 100
        period.error = ""
        period.save(update_fields=["status", "closed_at", "progress_pct", "error"])
        record_audit_event(
            at=now, actor_label="system", action="billing_period.closed", object_type="billing_period",
            object_id=f"{month:%Y-%m}", before=None, after={"invoices": finalized + skipped},
        )
    progress(100)
    return CloseResult(month, finalized, skipped, already_closed=False)


def _finalize_invoice(*, period: BillingPeriod, slug: str, lines: list[LineDraft], now: datetime) -> bool:
    """Build and finalize one tenant's invoice; False if it was already finalized (a rerun)."""
    currencies = {line.currency for line in lines if line.currency}
    if len(currencies) > 1:
        raise InvalidInput(f"tenant {slug} has usage priced in several currencies {sorted(currencies)}; "
                           "one invoice carries one currency")
    with transaction.atomic():
        tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": slug})
        invoice = Invoice.objects.select_for_update().filter(tenant=tenant, period=period).first()
        if invoice is not None and invoice.status == Invoice.Status.FINALIZED:
            return False
        currency = next(iter(currencies), "USD")
        if invoice is None:
            invoice = Invoice.objects.create(
                tenant=tenant, period=period, number=f"VGL-{period.month:%Y%m}-{slug}", currency=currency,
                created_at=now,
            )
        else:
            invoice.lines.all().delete()
        rows = [
            InvoiceLine(
                invoice=invoice, kind=line.kind, gpu_model=line.gpu_model, sla_tier=line.sla_tier,
                usage_month=line.usage_month, gpu_hours=line.gpu_hours.quantize(Decimal("0.000001")),
                amount=line.amount, amount_minor=to_minor_units(line.amount, currency),
            )
            for line in lines
        ]
        InvoiceLine.objects.bulk_create(rows)
        invoice.currency = currency
        invoice.total_minor = sum(r.amount_minor for r in rows)
        invoice.status = Invoice.Status.FINALIZED
        invoice.finalized_at = now
        invoice.save(update_fields=["currency", "total_minor", "status", "finalized_at"])
        record_audit_event(
            at=now, actor_label="system", action="invoice.finalized", object_type="invoice",
            object_id=invoice.number, before=None,
            after={"total_minor": invoice.total_minor, "currency": currency, "lines": len(rows)},
        )
    return True
