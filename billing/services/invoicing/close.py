"""Closing a month: one invoice per tenant, finalized, immutable; late usage becomes adjustments.

`close_period` is safe to crash and rerun: the period is marked CLOSING first, each tenant's
invoice is built and finalized in its own transaction (a finalized one is skipped on rerun,
a draft one is rebuilt), and the period is marked CLOSED last. As it goes it writes
`progress_pct` on the period row (committed at once, so any web process can show it); an
error marks the row FAILED with the message, and closing again resumes.

`request_period_close` is the periods page's entry: it checks the month can be closed, marks
the row CLOSING with who asked, audits, and enqueues the job on commit — once: a second request
while a close runs changes nothing.

An invoice, when finalized, copies its issuer (settings), bill-to name, terms (issue date = the
close's UTC date, due date = issue + the tenant's payment terms), PO number, cost centre and tax
rate (`_issue_terms`); its tax is rounded once on the subtotal (`tax_minor_units`) and its total is
subtotal + tax. A correction of an issued invoice is a credit note (billing.services.invoicing.credit_notes);
late usage still becomes adjustment lines on the next invoice, as below.

Lines (docs/billing.md): per GPU model and SLA tier, the usage charge; under the `proportional`
idle policy an explicit idle line; and, for months closed earlier, an adjustment line per
GPU model and tier for whatever the ledger now says beyond what was invoiced (late
batches, and usage priced after its month closed: a GPU model approved and priced later;
negative amounts are credits). A usage line carries the rates that priced it and its unit price
(billing.services.invoicing.unit_prices), copied onto the stored line so it never changes. Usage no
rate card prices never stops a close: it is left off the invoices and reported (`list_unpriced`,
`CloseResult.unpriced`), so a node reporting a made-up GPU model cannot hold any tenant's invoice. Each line is rounded once to minor units.
`_invoice_lines` decides the lines and `_price_invoice` rounds them, for the close and for
`preview_invoices` / `preview_invoice` alike (the "upcoming invoice": what a close would
finalize with the ledger as it is now; it writes nothing). The close reads every workload-hour of
the month; the preview reads the closed UTC days from the day ledger and the rest from hours
(billing.ledger.spend), the same sums to the ledger unit, so the same lines after the one rounding.

A close shows it is alive by writing `progress_at` (the request, each progress write, a
resume). `close_is_stalled` says when a CLOSING row has gone quiet for longer than
settings.VGPU_PERIOD_CLOSE_STALE_S; `resume_period_close` then enqueues the job again. Two closes
of one month may therefore run at once (a job thought lost may be merely slow); that is safe:
see `_finalize_invoice`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from celery.schedules import crontab
from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone
from django.utils.translation import gettext

from billing.calendar import month_bounds
from billing.errors import InvalidInput
from billing.figures import PAGE_PLACES, FigureTree
from billing.ledger.line_rates import AppliedRate, list_line_rates
from billing.ledger.spend import (
    get_latest_hour,
    list_invoice_totals,
    list_invoice_totals_from_hours,
)
from billing.ledger.unpriced import UnpricedUsage, list_unpriced_usage
from billing.models import BillingPeriod, Invoice, InvoiceLine, InvoiceWorkload, Tenant
from billing.money import from_minor_units, to_minor_units
from billing.services.audit import record_audit_event
from billing.services.invoicing.unit_prices import is_average, line_unit_price, price_text, rates_to_json
from billing.services.invoicing.workloads import read_month_tree, workloads_of

__all__ = [
    "DEFAULT_ISSUER_NAME",
    "CloseRequest",
    "CloseResult",
    "InvoicePreview",
    "Issuer",
    "LineDraft",
    "PricedLine",
    "close_is_stalled",
    "close_period",
    "current_issuer",
    "list_unpriced",
    "preview_invoice",
    "preview_invoices",
    "request_period_close",
    "resume_period_close",
    "scheduled_close_at",
    "tax_minor_units",
]

_S_PER_H = Decimal(3600)
# The issuer a document names when VGPU_ISSUER_NAME is unset (development, the tests).
DEFAULT_ISSUER_NAME = "vGPU Ledger"


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
    # Usage lines: the rates that priced the usage (billing.services.invoicing.unit_prices).
    rates: tuple[AppliedRate, ...] = ()


@dataclass(frozen=True)
class PricedLine:
    """An invoice line as it is (or would be) stored: the unrounded ledger amount and its one
    rounding to minor units."""

    kind: str
    gpu_model: str
    sla_tier: str
    usage_month: date
    gpu_hours: Decimal  # quantized to 6 places, as InvoiceLine stores it
    amount: Decimal  # unrounded, ledger precision
    amount_minor: int  # rounded once, half-even
    currency: str
    # Per GPU-hour, in `currency`: the one rate, or the average of `rates` (None: idle, adjustment).
    unit_price: Decimal | None = None
    rates: tuple[AppliedRate, ...] = ()

    @property
    def unit_price_is_average(self) -> bool:
        return is_average(self.rates)

    @property
    def unit_price_text(self) -> str:
        """The unit price as the invoice will state it; "" where there is none."""
        return price_text(self.unit_price) if self.unit_price is not None else ""

    @property
    def kind_label(self) -> str:
        return str(dict(InvoiceLine.Kind.choices).get(self.kind, self.kind))

    @property
    def rounded_amount(self) -> Decimal:
        """`amount_minor` in major units, exact (no rounding happens here)."""
        return from_minor_units(self.amount_minor, self.currency)


@dataclass(frozen=True)
class _PricedInvoice:
    tenant: str
    currency: str
    lines: tuple[PricedLine, ...]

    @property
    def total_minor(self) -> int:
        return sum(line.amount_minor for line in self.lines)


@dataclass(frozen=True)
class InvoicePreview:
    """The invoice `tenant` would get for `month` if the month were closed with the ledger as it
    is at `as_of`: lines, tax and totals rounded exactly as the close rounds them. Not an invoice."""

    tenant: str
    month: date
    currency: str
    lines: tuple[PricedLine, ...]
    # Σ minor units of the month's own lines (usage, idle); the total is Σ of every line
    # (adjustments included) + tax, as Invoice.total_minor.
    subtotal_minor: int
    total_minor: int
    # Start of the newest hour of the hour ledger in the month (None: no usage metered yet).
    as_of: datetime | None
    # When the scheduled close (celery beat) will finalize the invoice; None if none is scheduled.
    issue_at: datetime | None
    # The tenant's tax rate now and the tax on Σ of every line, rounded once (tax_minor_units).
    tax_rate_pct: Decimal = Decimal(0)
    tax_minor: int = 0

    @property
    def subtotal(self) -> Decimal:
        """Major units, exact (minor units scaled; no rounding happens here)."""
        return from_minor_units(self.subtotal_minor, self.currency)

    @property
    def total(self) -> Decimal:
        return from_minor_units(self.total_minor, self.currency)

    @property
    def tax(self) -> Decimal:
        return from_minor_units(self.tax_minor, self.currency)

    @property
    def adjustments(self) -> Decimal:
        """Σ of the adjustment lines for months closed earlier, major units, exact."""
        return self.total - self.tax - self.subtotal


@dataclass(frozen=True)
class CloseResult:
    month: date
    invoices_finalized: int
    invoices_already_final: int
    already_closed: bool
    # Usage of the month no rate card priced, left off its invoices: the item to resolve (approve the
    # model, price it; it is then billed as a late-usage adjustment on the next invoice).
    unpriced: tuple[UnpricedUsage, ...] = ()


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


def _ledger_totals(
    month: date, tenants: Collection[str] | None = None, *, now: datetime | None = None
) -> dict[tuple[str, str, str, str], tuple[Decimal, Decimal, Decimal]]:
    """(tenant, currency, gpu_model, sla_tier) -> (charge, idle_share, share_gpu_s) of priced usage,
    of every tenant or of `tenants` only. With `now` (the preview): closed days from the day ledger
    plus the rest from hours, equal to the hour-based read to the ledger unit; without (the close):
    every workload-hour of the month."""
    start, end = month_bounds(month)
    totals = (list_invoice_totals_from_hours(start=start, end=end, tenants=tenants) if now is None
              else list_invoice_totals(start=start, end=end, now=now, tenants=tenants))
    return {(t.tenant, t.currency, t.gpu_model, t.sla_tier): (t.charge, t.idle_share, t.share_gpu_s) for t in totals}


def list_unpriced(month: date) -> list[UnpricedUsage]:
    """The month's usage no rate card priced, by GPU model, with the tenants on it (docs/billing.md,
    Unpriced usage). The close leaves it off the invoices and reports it; it never holds the close."""
    start, end = month_bounds(month)
    return list_unpriced_usage(start=start, end=end)


def _month_lines(month: date, tenants: Collection[str] | None, now: datetime | None) -> list[LineDraft]:
    lines = []
    totals = _ledger_totals(month, tenants, now=now)
    start, end = month_bounds(month)
    rates = list_line_rates(start=start, end=end, keys=[(t, m, s) for t, _, m, s in totals])
    for (tenant, currency, model, tier), (charge, idle, share) in totals.items():
        lines.append(LineDraft(tenant, currency, InvoiceLine.Kind.USAGE, model, tier, month, share / _S_PER_H, charge,
                               rates=rates.get((tenant, model, tier), ())))
        if idle:
            lines.append(LineDraft(tenant, currency, InvoiceLine.Kind.IDLE, model, tier, month, Decimal(0), idle))
    return lines


def _adjustment_lines(
    *, month: date, horizon: timedelta, tenants: Collection[str] | None, now: datetime | None
) -> list[LineDraft]:
    """For closed months whose late-usage horizon reaches into `month`: ledger now − invoiced."""
    start, _ = month_bounds(month)
    lines = []
    for period in BillingPeriod.objects.filter(status=BillingPeriod.Status.CLOSED, month__lt=month):
        _, period_end = month_bounds(period.month)
        if period_end + horizon < start:
            continue
        invoiced: dict[tuple[str, str, str], Decimal] = defaultdict(Decimal)
        rows = InvoiceLine.objects.filter(usage_month=period.month, invoice__status=Invoice.Status.FINALIZED)
        if tenants is not None:
            rows = rows.filter(invoice__tenant__slug__in=tenants)
        for r in rows.values("invoice__tenant__slug", "gpu_model", "sla_tier").annotate(total=Sum("amount")):
            invoiced[(r["invoice__tenant__slug"], r["gpu_model"], r["sla_tier"])] += r["total"]
        now_totals: dict[tuple[str, str, str], tuple[str, Decimal, Decimal]] = {}
        for (tenant, currency, model, tier), (charge, idle, share) in _ledger_totals(period.month, tenants, now=now).items():
            now_totals[(tenant, model, tier)] = (currency, charge + idle, share)
        for key in sorted(set(now_totals) | set(invoiced)):
            currency, amount, share = now_totals.get(key, ("", Decimal(0), Decimal(0)))
            delta = amount - invoiced.get(key, Decimal(0))
            if delta != 0:
                tenant, model, tier = key
                lines.append(LineDraft(tenant, currency, InvoiceLine.Kind.ADJUSTMENT, model, tier, period.month,
                                       Decimal(0), delta))
    return lines


def _invoice_lines(
    *, month: date, horizon: timedelta, tenants: Collection[str] | None = None, now: datetime | None = None
) -> dict[str, list[LineDraft]]:
    """The lines of each tenant's invoice for `month` from the ledger as it is now: the month's own
    usage (and idle) lines, then adjustments for months closed earlier. The close and the preview
    both build them here; the close reads hours (`now` None), the preview closed days plus hours at
    `now` (the same sums, tests/billing/test_spend_equivalence.py)."""
    by_tenant: dict[str, list[LineDraft]] = defaultdict(list)
    lines = (_month_lines(month, tenants, now)
             + _adjustment_lines(month=month, horizon=horizon, tenants=tenants, now=now))
    for line in lines:
        by_tenant[line.tenant].append(line)
    return by_tenant


def _price_invoice(slug: str, lines: list[LineDraft]) -> _PricedInvoice:
    """One currency per invoice, each line rounded once to its minor units; the total is the sum of
    the rounded lines."""
    currencies = {line.currency for line in lines if line.currency}
    if len(currencies) > 1:
        raise InvalidInput(f"tenant {slug} has usage priced in several currencies {sorted(currencies)}; "
                           "one invoice carries one currency")
    currency = next(iter(currencies), "USD")
    return _PricedInvoice(slug, currency, tuple(_price_line(line, currency) for line in lines))


def _price_line(line: LineDraft, currency: str) -> PricedLine:
    gpu_hours = line.gpu_hours.quantize(Decimal("0.000001"))
    return PricedLine(kind=line.kind, gpu_model=line.gpu_model, sla_tier=line.sla_tier, usage_month=line.usage_month,
                      gpu_hours=gpu_hours, amount=line.amount, amount_minor=to_minor_units(line.amount, currency),
                      currency=currency, rates=line.rates,
                      unit_price=line_unit_price(kind=line.kind, gpu_hours=gpu_hours, amount=line.amount,
                                                 rates=line.rates))


def _check_closable(*, month: date, now: datetime) -> None:
    """Only a month that is over can be closed. Unpriced usage never stops it: anyone holding a
    node token could otherwise hold every tenant's invoice by reporting a made-up GPU model."""
    if month.day != 1:
        raise InvalidInput("a billing period starts on the first day of a month")
    _, end = month_bounds(month)
    if end > now:
        raise InvalidInput(f"{month:%Y-%m} is not over yet; it can be closed from {end:%Y-%m-%d} 00:00 UTC")


def request_period_close(
    *, month: date, now: datetime, actor_label: str, actor_id: int | None, enqueue: Callable[[str], object]
) -> CloseRequest:
    """Record a request to close `month` and call `enqueue("YYYY-MM")` once the request commits.

    Idempotent: the row is locked, and only an OPEN or FAILED period (or none yet) starts a close;
    a CLOSING or CLOSED one is returned unchanged and nothing is enqueued. Refused (InvalidInput,
    nothing written) for a month that is not over."""
    _check_closable(month=month, now=now)
    with transaction.atomic():
        period, _ = BillingPeriod.objects.select_for_update().get_or_create(month=month)
        if period.status in (BillingPeriod.Status.CLOSING, BillingPeriod.Status.CLOSED):
            return CloseRequest(month, period.status, enqueued=False)
        before = {"status": period.status, "error": period.error}
        period.status = BillingPeriod.Status.CLOSING
        period.requested_by_id = actor_id
        period.requested_at = now
        period.progress_pct = 0
        period.progress_at = now
        period.error = ""
        period.save(update_fields=["status", "requested_by", "requested_at", "progress_pct", "progress_at", "error"])
        record_audit_event(
            at=now, actor_id=actor_id, actor_label=actor_label, action="period.close_requested",
            object_type="billing_period", object_id=f"{month:%Y-%m}", before=before, after={"status": period.status},
        )
        key = f"{month:%Y-%m}"
        transaction.on_commit(lambda: enqueue(key))
    return CloseRequest(month, period.status, enqueued=True)


def close_is_stalled(*, status: str, progress_at: datetime | None, now: datetime) -> bool:
    """A close is stalled when its row is CLOSING and nothing has shown it alive (request, progress
    write, resume) for more than settings.VGPU_PERIOD_CLOSE_STALE_S seconds at `now`.

    The job writes `progress_at` with the database's clock and the request with the web's; they
    differ by the hosts' clock skew, negligible against a threshold of minutes."""
    if status != BillingPeriod.Status.CLOSING:
        return False
    return progress_at is None or now - progress_at > timedelta(seconds=settings.VGPU_PERIOD_CLOSE_STALE_S)


def resume_period_close(
    *, month: date, now: datetime, actor_label: str, actor_id: int | None, enqueue: Callable[[str], object]
) -> CloseRequest:
    """Enqueue the close of a stalled month again (its job was probably lost) and audit it as
    `period.close_resumed`; `enqueue("YYYY-MM")` runs once the resume commits.

    The row is locked and `progress_at` set to `now`, so a second press (or a second web process)
    finds the close no longer stalled: it changes nothing and enqueues nothing, as does a press on a
    close that is moving or already closed. Resuming a close whose job is in fact still running is
    safe: two closes of one month finalize each invoice once (`_finalize_invoice`). Refused
    (InvalidInput) for a month that is not closing at all."""
    with transaction.atomic():
        period = BillingPeriod.objects.select_for_update().filter(month=month).first()
        if period is None or period.status in (BillingPeriod.Status.OPEN, BillingPeriod.Status.FAILED):
            raise InvalidInput(gettext("%(month)s is not being closed: there is nothing to resume.")
                               % {"month": f"{month:%Y-%m}"})
        if not close_is_stalled(status=period.status, progress_at=period.progress_at, now=now):
            return CloseRequest(month, period.status, enqueued=False)
        before = {"status": period.status, "progress_pct": period.progress_pct,
                  "progress_at": period.progress_at.isoformat() if period.progress_at else None}
        period.progress_at = now
        period.save(update_fields=["progress_at"])
        record_audit_event(
            at=now, actor_id=actor_id, actor_label=actor_label, action="period.close_resumed",
            object_type="billing_period", object_id=f"{month:%Y-%m}", before=before,
            after={"status": period.status, "progress_pct": period.progress_pct, "progress_at": now.isoformat()},
        )
        key = f"{month:%Y-%m}"
        transaction.on_commit(lambda: enqueue(key))
    return CloseRequest(month, period.status, enqueued=True)


def close_period(
    *, month: date, now: datetime, horizon: timedelta | None = None, progress: Callable[[int], None] | None = None,
) -> CloseResult:
    """Finalize one invoice per tenant for `month` (which must be over). Late usage for months
    closed earlier within `horizon` (default: settings.VGPU_LATE_USAGE_HORIZON) is adjusted.
    Usage no rate card priced is left off the invoices and returned as `unpriced` (and audited
    with the close): each tenant is invoiced for its priced usage, and the rest follows as a
    late-usage adjustment once its model is approved and priced.

    `progress(pct)` is called after the period row's `progress_pct` is written (each tenant's
    invoice, then 100 when CLOSED). An error marks a CLOSING row FAILED with its message and is
    raised again; a month refused up front (not over) changes no row that is not
    already closing."""
    horizon = settings.VGPU_LATE_USAGE_HORIZON if horizon is None else horizon
    try:
        return _close_period(month=month, now=now, horizon=horizon, progress=progress or _no_progress)
    except Exception as exc:
        # Only a close in flight becomes FAILED: a CLOSED row (another run finished) stays closed.
        BillingPeriod.objects.filter(month=month, status=BillingPeriod.Status.CLOSING).update(
            status=BillingPeriod.Status.FAILED, error=str(exc)[:_ERROR_MAX_CHARS] or type(exc).__name__,
            progress_at=timezone.now(),
        )
        raise


def _no_progress(pct: int) -> None:
    """The default progress callback: the row is written anyway."""


def _close_period(
    *, month: date, now: datetime, horizon: timedelta, progress: Callable[[int], None]
) -> CloseResult:
    _check_closable(month=month, now=now)
    # `progress_at` is a heartbeat: the clock at each write, not `now`, which is the close's timestamp
    # for closed_at / finalized_at. It is the service's clock, the one the page compares it with.
    with transaction.atomic():
        period, _ = BillingPeriod.objects.select_for_update().get_or_create(month=month)
        if period.status == BillingPeriod.Status.CLOSED:
            return CloseResult(month, 0, period.invoices.count(), already_closed=True,
                               unpriced=tuple(list_unpriced(month)))
        period.status = BillingPeriod.Status.CLOSING
        period.close_started_at = period.close_started_at or now
        period.progress_pct = 0
        period.progress_at = timezone.now()
        period.error = ""
        period.save(update_fields=["status", "close_started_at", "progress_pct", "progress_at", "error"])

    def report(pct: int) -> None:
        BillingPeriod.objects.filter(pk=period.pk, status=BillingPeriod.Status.CLOSING).update(
            progress_pct=pct, progress_at=timezone.now())
        progress(pct)

    by_tenant = _invoice_lines(month=month, horizon=horizon)
    unpriced = tuple(list_unpriced(month))
    start, end = month_bounds(month)
    figures = read_month_tree(start=start, end=end, places=PAGE_PLACES)
    report(_PCT_LINES_READY)
    finalized = skipped = 0
    slugs = sorted(by_tenant)
    for done, slug in enumerate(slugs, start=1):
        if _finalize_invoice(period=period, invoice=_price_invoice(slug, by_tenant[slug]), now=now,
                             figures=figures):
            finalized += 1
        else:
            skipped += 1
        report(_PCT_LINES_READY + (_PCT_INVOICES_DONE - _PCT_LINES_READY) * done // len(slugs))

    with transaction.atomic():
        period = BillingPeriod.objects.select_for_update().get(pk=period.pk)
        if period.status == BillingPeriod.Status.CLOSED:
            # Another run of this close (a resume of a job that was slow, not lost) got here first;
            # every invoice is final either way, and the period is closed and audited once.
            return CloseResult(month, finalized, skipped, already_closed=True, unpriced=unpriced)
        period.status = BillingPeriod.Status.CLOSED
        period.closed_at = now
        period.progress_pct = 100
        period.progress_at = timezone.now()
        period.error = ""
        period.save(update_fields=["status", "closed_at", "progress_pct", "progress_at", "error"])
        record_audit_event(
            at=now, actor_label="system", action="billing_period.closed", object_type="billing_period",
            object_id=f"{month:%Y-%m}", before=None,
            after={"invoices": finalized + skipped,
                   "unpriced": [{"gpu_model": u.gpu_model, "gpu_seconds": str(u.gpu_seconds),
                                 "tenants": list(u.tenants)} for u in unpriced]},
        )
    progress(100)
    return CloseResult(month, finalized, skipped, already_closed=False, unpriced=unpriced)


def _workload_breakdown(tree: FigureTree, tenant: str) -> list[InvoiceWorkload]:
    """The tenant's usage by workload as the drill-down shows it (billing.services.invoicing.workloads), unsaved."""
    return [InvoiceWorkload(namespace=w.namespace, workload=w.workload, gpu_hours=w.gpu_hours,
                            amount_minor=w.amount_minor)
            for w in workloads_of(tree, tenant)]


def _finalize_invoice(*, period: BillingPeriod, invoice: _PricedInvoice, now: datetime,
                      figures: FigureTree) -> bool:
    """Build and finalize one tenant's invoice; False if it was already finalized (a rerun).

    Safe when two closes of the month run at once (a resumed close whose first job was only slow):
    the invoice row is created with get_or_create on the (tenant, period) unique constraint, so the
    second INSERT waits for the first transaction and, once it commits, fails inside a savepoint and
    reads the row that won; the row is then locked (SELECT ... FOR UPDATE), and a run that waited
    for the lock re-reads it, finds it FINALIZED and returns False. So each tenant gets one invoice,
    its lines and total written in one transaction from one run's computation (and the database
    refuses any change to a finalized invoice, migration 0005). A DRAFT row (left by a crash) is
    rebuilt by whichever run locks it first."""
    slug, currency = invoice.tenant, invoice.currency
    with transaction.atomic():
        tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": slug})
        row, _ = Invoice.objects.get_or_create(
            tenant=tenant, period=period,
            defaults={"number": f"VGL-{period.month:%Y%m}-{slug}", "currency": currency, "created_at": now},
        )
        row = Invoice.objects.select_for_update().get(pk=row.pk)
        if row.status == Invoice.Status.FINALIZED:
            return False
        row.lines.all().delete()
        row.workloads.all().delete()
        breakdown = _workload_breakdown(figures, slug)
        for part in breakdown:
            part.invoice = row
        InvoiceWorkload.objects.bulk_create(breakdown)
        InvoiceLine.objects.bulk_create([
            InvoiceLine(
                invoice=row, kind=line.kind, gpu_model=line.gpu_model, sla_tier=line.sla_tier,
                usage_month=line.usage_month, gpu_hours=line.gpu_hours, amount=line.amount,
                amount_minor=line.amount_minor, unit_price=line.unit_price, rates=rates_to_json(line.rates),
            )
            for line in invoice.lines
        ])
        terms = _issue_terms(tenant, subtotal_minor=invoice.total_minor, currency=currency, now=now)
        for field, value in terms.items():
            setattr(row, field, value)
        row.currency = currency
        row.total_minor = invoice.total_minor + row.tax_minor
        row.status = Invoice.Status.FINALIZED
        row.finalized_at = now
        row.save(update_fields=["currency", "total_minor", "status", "finalized_at", *terms])
        record_audit_event(
            at=now, actor_label="system", action="invoice.finalized", object_type="invoice",
            object_id=row.number, before=None,
            after={"total_minor": row.total_minor, "tax_minor": row.tax_minor, "currency": currency,
                   "lines": len(invoice.lines)},
        )
    return True


@dataclass(frozen=True)
class Issuer:
    """Who issues invoices and credit notes (settings VGPU_ISSUER_*), as copied onto each one."""

    name: str
    address: str
    tax_id: str


def current_issuer() -> Issuer:
    """The issuer as configured now; without VGPU_ISSUER_NAME, the product's name (so a document
    always names someone; production warns, billing.checks.check_invoice_issuer)."""
    return Issuer(name=settings.VGPU_ISSUER_NAME or DEFAULT_ISSUER_NAME, address=settings.VGPU_ISSUER_ADDRESS,
                  tax_id=settings.VGPU_ISSUER_TAX_ID)


def tax_minor_units(net_minor: int, rate_pct: Decimal, currency: str) -> int:
    """Tax on a net amount in minor units at `rate_pct` percent, rounded once (half-even) to minor
    units by billing.money: on an invoice's subtotal (never line by line), or on a credit's net."""
    return to_minor_units(from_minor_units(net_minor, currency) * rate_pct / 100, currency)


def _issue_terms(tenant: Tenant, *, subtotal_minor: int, currency: str, now: datetime) -> dict[str, object]:
    """What an invoice copies when it is finalized: issuer, bill-to name, address and tax ID, issue
    and due dates, payment terms, PO number, cost centre, tax rate, the tax on the subtotal and the
    tax exemption / reverse-charge note (kept only when the rate is 0 %, the one case it explains). Issued on the UTC
    date of the close; due `payment_terms_days` later (the tenant's, else the default)."""
    issuer = current_issuer()
    issue_date = now.astimezone(UTC).date()
    terms_days = (tenant.payment_terms_days if tenant.payment_terms_days is not None
                  else settings.VGPU_INVOICE_PAYMENT_TERMS_DAYS)
    return {
        "issuer_name": issuer.name, "issuer_address": issuer.address, "issuer_tax_id": issuer.tax_id,
        "bill_to_name": tenant.name, "bill_to_address": tenant.billing_address, "bill_to_tax_id": tenant.tax_id,
        "tax_exemption_note": tenant.tax_exemption_note if tenant.tax_rate_pct == 0 else "",
        "issue_date": issue_date, "due_date": issue_date + timedelta(days=terms_days),
        "payment_terms_days": terms_days, "po_number": tenant.po_number, "cost_centre": tenant.cost_centre,
        "tax_rate_pct": tenant.tax_rate_pct,
        "tax_minor": tax_minor_units(subtotal_minor, tenant.tax_rate_pct, currency),
    }


# --- The upcoming invoice ---------------------------------------------------------------------

# The beat entry that closes last month (config/settings.py CELERY_BEAT_SCHEDULE).
_CLOSE_BEAT_ENTRY = "close-previous-month"


def scheduled_close_at(month: date) -> datetime | None:
    """When celery beat's `close-previous-month` entry will close `month`: its crontab's day of the
    month, hour and minute, in the month after, in Celery's time zone (UTC: enable_utc is Celery's
    default and CELERY_TIMEZONE is unset). None when there is no such entry or it is not one fixed
    time a month, so a page never states a date nothing will keep."""
    entry = settings.CELERY_BEAT_SCHEDULE.get(_CLOSE_BEAT_ENTRY)
    schedule = entry.get("schedule") if isinstance(entry, dict) else None
    if not isinstance(schedule, crontab):
        return None
    # crontab's parsed fields (sets of ints); celery-types does not declare them.
    fields: dict[str, set[int]] = {f: getattr(schedule, f)
                                   for f in ("day_of_month", "hour", "minute", "month_of_year", "day_of_week")}
    days, hours, minutes = sorted(fields["day_of_month"]), sorted(fields["hour"]), sorted(fields["minute"])
    if len(days) != 1 or len(hours) != 1 or len(minutes) != 1 or len(fields["month_of_year"]) != 12 \
            or len(fields["day_of_week"]) != 7:
        return None
    _, end = month_bounds(month)
    zone = ZoneInfo(getattr(settings, "CELERY_TIMEZONE", None) or "UTC")
    return datetime(end.year, end.month, days[0], hours[0], minutes[0], tzinfo=zone)


def preview_invoices(
    *, month: date, now: datetime, tenants: Collection[str] | None = None
) -> dict[str, InvoicePreview]:
    """The upcoming invoices for `month`: what closing it now would finalize, by tenant slug, with the
    close's own line rules and rounding (`_invoice_lines`, `_price_invoice`). Reads only.

    Every tenant with a line, or exactly `tenants` (with no lines, an empty preview). A tenant whose
    invoice for the month is already finalized (a close in progress) is left out. Refused
    (InvalidInput) for a month that has not begun or is closed (its invoices exist)."""
    start, end = month_bounds(month)
    if month.day != 1:
        raise InvalidInput(gettext("A billing period starts on the first day of a month."))
    if start > now:
        raise InvalidInput(gettext("%(month)s has not begun; there is nothing to invoice yet.") % {"month": f"{month:%Y-%m}"})
    if BillingPeriod.objects.filter(month=month, status=BillingPeriod.Status.CLOSED).exists():
        raise InvalidInput(gettext("%(month)s is closed: its invoices exist, see the invoice list.")
                           % {"month": f"{month:%Y-%m}"})
    final = set(Invoice.objects.filter(period__month=month, status=Invoice.Status.FINALIZED)
                .values_list("tenant__slug", flat=True))
    by_tenant = _invoice_lines(month=month, horizon=settings.VGPU_LATE_USAGE_HORIZON, tenants=tenants, now=now)
    as_of = get_latest_hour(start=start, end=end)
    issue_at = scheduled_close_at(month)
    slugs = sorted((set(by_tenant) | set(tenants or ())) - final)
    rates = dict(Tenant.objects.filter(slug__in=slugs).values_list("slug", "tax_rate_pct"))
    previews = {}
    for slug in slugs:
        priced = _price_invoice(slug, by_tenant.get(slug, []))
        rate = rates.get(slug, Decimal(0))
        tax = tax_minor_units(priced.total_minor, rate, priced.currency)  # as _issue_terms will
        previews[slug] = InvoicePreview(
            tenant=slug, month=month, currency=priced.currency,
            # In the invoice document's order (billing.services.exports.get_invoice_document).
            lines=tuple(sorted(priced.lines, key=lambda x: (x.usage_month, x.kind, x.gpu_model, x.sla_tier))),
            subtotal_minor=sum(line.amount_minor for line in priced.lines if line.usage_month == month),
            total_minor=priced.total_minor + tax, as_of=as_of, issue_at=issue_at, tax_rate_pct=rate, tax_minor=tax,
        )
    return previews


def preview_invoice(*, tenant: str, month: date, now: datetime) -> InvoicePreview:
    """The upcoming invoice of one tenant for `month` (see `preview_invoices`). Refused
    (InvalidInput) when that invoice already exists: the month is closed, or this tenant's invoice
    was finalized by a close in progress."""
    number = (Invoice.objects.filter(tenant__slug=tenant, period__month=month, status=Invoice.Status.FINALIZED)
              .values_list("number", flat=True).first())
    if number is not None:
        raise InvalidInput(gettext("The invoice for %(month)s exists: %(number)s.")
                           % {"month": f"{month:%Y-%m}", "number": number})
    return preview_invoices(month=month, now=now, tenants=(tenant,))[tenant]
