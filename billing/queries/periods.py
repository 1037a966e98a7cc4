"""Billing periods for the periods page: every month with usage in the hour ledger (or a period
row), its GPU-hours (billing.ledger.totals), its closing state and, once closed, its finalized
invoices: their count and, per currency, the sums of their subtotals, tax, totals, credit notes and
balances due, each the sum of the invoice rows the invoice list shows
(billing.services.invoicing.balance). For the platform, how the metered GPU-hours split: attributed
to tenants (their GPU-hours as the figure tree and their invoices show them) and idle, the rest, with
the idle's cost as the GPU cost page states it (billing.ledger.totals). Scoped: a tenant scope sees only its own usage and invoices;
the page itself is for finance and admins. A close that has written no progress for longer than
settings.VGPU_PERIOD_CLOSE_STALE_S is "stalled" (billing.services.invoicing.close
`close_is_stalled`: the rule lives there, shared with the resume)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, ClassVar

from django.db.models import QuerySet
from django.utils.translation import gettext_lazy as _

from billing.calendar import month_bounds
from billing.ledger.totals import (
    get_gpu_totals,
    get_priced_currency,
    list_monthly_card_seconds,
    list_monthly_line_share_seconds,
    list_monthly_share_seconds,
)
from billing.models import BillingPeriod, Invoice
from billing.money import from_minor_units, round_quantities
from billing.scope import Scope
from billing.services.invoicing import InvoiceBalance, add_balances, close_is_stalled, invoice_balances

if TYPE_CHECKING:
    from django_stubs_ext import StrPromise

__all__ = ["GpuHoursSplit", "PeriodState", "PeriodView", "get_billing_period", "list_billing_periods"]

_S_PER_H = Decimal(3600)
_ZERO = Decimal(0)
# GPU-hours on the page: the finance page's places, so a month's figures read alike on both.
_PLACES = 2


class PeriodState:
    """What the page can do with a month. `ready` = over and not yet closing; `stalled` = closing
    with no progress for too long (its job was probably lost): it may be resumed."""

    OPEN = "open"
    READY = "ready"
    CLOSING = "closing"
    STALLED = "stalled"
    CLOSED = "closed"
    FAILED = "failed"

    LABELS: ClassVar[dict[str, StrPromise]] = {
        OPEN: _("open"),
        READY: _("ready to close"),
        CLOSING: _("closing"),
        STALLED: _("stalled"),
        CLOSED: _("closed"),
        FAILED: _("failed"),
    }


@dataclass(frozen=True)
class CurrencyTotal:
    """A month's finalized invoices in one currency, summed column by column."""

    currency: str
    # Major units, exact (Σ invoice total_minor scaled by the currency's exponent), tax included.
    amount: Decimal
    sums: InvoiceBalance

    @property
    def subtotal(self) -> Decimal:
        return from_minor_units(self.sums.subtotal_minor, self.currency)

    @property
    def tax(self) -> Decimal:
        return from_minor_units(self.sums.tax_minor, self.currency)

    @property
    def credited(self) -> Decimal:
        return from_minor_units(self.sums.credited_minor, self.currency)

    @property
    def balance_due(self) -> Decimal:
        # Every invoice summed is finalized, so each has a balance.
        return from_minor_units(self.sums.due_minor or 0, self.currency)

    def as_json(self) -> dict[str, str]:
        """`amount` is the total, tax included; the other columns as the periods page shows them."""
        return {"currency": self.currency, "amount": str(self.amount), "subtotal": str(self.subtotal),
                "tax": str(self.tax), "credited": str(self.credited), "balance_due": str(self.balance_due)}


@dataclass(frozen=True)
class GpuHoursSplit:
    """A month's metered GPU-hours as shown (_PLACES), split so that the periods page reconciles with
    the invoices: attributed to tenants is the sum of the tenants' GPU-hours as their invoices show
    them (billing.figures, each tenant's lines rounded once); idle is the rest, the card time no
    workload used. Its cost is the platform's idle, the part of the cards' cost no invoice bills
    (the GPU cost page's "Idle (platform)"); under the proportional idle policy, `idle_invoiced` is
    the part spread onto the tenants' invoices as idle share. Money at ledger precision, shown
    through billing.money."""

    metered: Decimal
    attributed: Decimal
    currency: str
    idle_platform: Decimal
    idle_invoiced: Decimal

    @property
    def idle(self) -> Decimal:
        return self.metered - self.attributed

    def as_json(self) -> dict[str, str]:
        return {"metered_gpu_hours": str(self.metered), "attributed_gpu_hours": str(self.attributed),
                "idle_gpu_hours": str(self.idle), "currency": self.currency,
                "idle_platform_cost": str(self.idle_platform), "idle_invoiced_cost": str(self.idle_invoiced)}


@dataclass(frozen=True)
class PeriodView:
    month: date
    state: str
    progress_pct: int
    # Metered card-hours (platform scope) or Σ share_gpu_s / 3600 of the tenants' usage.
    gpu_hours: Decimal
    # Metered card-hours without a rate card (platform scopes only; None for a tenant scope).
    unpriced_gpu_hours: Decimal | None
    ends_at: datetime
    requested_by: str
    requested_at: datetime | None
    close_started_at: datetime | None
    closed_at: datetime | None
    # When the close last showed it is alive (request, progress write, resume).
    progress_at: datetime | None
    error: str
    invoices: int
    totals: tuple[CurrencyTotal, ...]
    # The metered GPU-hours split (platform scopes only; None for a tenant scope).
    split: GpuHoursSplit | None = None

    @property
    def key(self) -> str:
        return f"{self.month:%Y-%m}"

    @property
    def starts_at(self) -> datetime:
        return month_bounds(self.month)[0]

    @property
    def state_label(self) -> str:
        return str(PeriodState.LABELS[self.state])

    @property
    def can_close(self) -> bool:
        return self.state in (PeriodState.READY, PeriodState.FAILED)

    @property
    def can_resume(self) -> bool:
        return self.state == PeriodState.STALLED

    def as_json(self) -> dict[str, object]:
        return {
            "month": self.key,
            "state": self.state,
            "state_label": self.state_label,
            "progress_pct": self.progress_pct,
            "error": self.error,
            "invoices": self.invoices,
            "totals": [t.as_json() for t in self.totals],
            "gpu_hours_split": self.split.as_json() if self.split else None,
            "requested_by": self.requested_by,
            "requested_at": self.requested_at.isoformat() if self.requested_at else None,
            "close_started_at": self.close_started_at.isoformat() if self.close_started_at else None,
            "closed_at": self.closed_at.isoformat() if self.closed_at else None,
            "progress_at": self.progress_at.isoformat() if self.progress_at else None,
        }


def list_billing_periods(*, scope: Scope, now: datetime) -> list[PeriodView]:
    """Newest month first."""
    return _periods(scope=scope, now=now, months=None)


def get_billing_period(*, scope: Scope, month: date, now: datetime) -> PeriodView:
    """One month, also when it has no usage and no row yet (then open or ready by the clock)."""
    return _periods(scope=scope, now=now, months=(month, month))[0]


def _periods(*, scope: Scope, now: datetime, months: tuple[date, date] | None) -> list[PeriodView]:
    periods = BillingPeriod.objects.select_related("requested_by")
    invoices = Invoice.objects.filter(status=Invoice.Status.FINALIZED)
    start: datetime | None = None
    end: datetime | None = None
    if months is not None:
        start, _end = month_bounds(months[0])
        _start, end = month_bounds(months[1])
        periods = periods.filter(month__gte=months[0], month__lte=months[1])
        invoices = invoices.filter(period__month__gte=months[0], period__month__lte=months[1])
    if scope.tenants is not None:
        invoices = invoices.filter(tenant__slug__in=scope.tenants)

    # GPU-hours per month: metered card-hours for the platform (the GPU hour ledger has one row
    # per card-hour, far fewer than workload-hours); the tenants' own share otherwise.
    hours_by_month: dict[date, Decimal] = {}
    unpriced_by_month: dict[date, Decimal] = {}
    if scope.sees_platform:
        for card_month in list_monthly_card_seconds(start=start, end=end):
            hours_by_month[card_month.month] = card_month.seconds / _S_PER_H
            unpriced_by_month[card_month.month] = card_month.unpriced_seconds / _S_PER_H
    else:
        for share_month in list_monthly_share_seconds(start=start, end=end, tenants=scope.tenants):
            hours_by_month[share_month.month] = share_month.seconds / _S_PER_H
    rows_by_month = {p.month: p for p in periods}
    counts, totals = _month_totals(invoices)
    attributed_by_month = _attributed_gpu_hours(scope, start, end) if scope.sees_platform else {}

    all_months = set(hours_by_month) | set(rows_by_month) | set(counts)
    if months is not None:
        all_months.add(months[0])
    views = []
    for m in sorted(all_months, reverse=True):
        row = rows_by_month.get(m)
        _, ends_at = month_bounds(m)
        views.append(PeriodView(
            month=m,
            state=_state(row, over=ends_at <= now, now=now),
            progress_pct=row.progress_pct if row else 0,
            gpu_hours=hours_by_month.get(m, _ZERO),
            unpriced_gpu_hours=unpriced_by_month.get(m, _ZERO) if scope.sees_platform else None,
            ends_at=ends_at,
            requested_by=row.requested_by.get_username() if row and row.requested_by else "",
            requested_at=row.requested_at if row else None,
            close_started_at=row.close_started_at if row else None,
            closed_at=row.closed_at if row else None,
            progress_at=row.progress_at if row else None,
            error=row.error if row else "",
            invoices=counts.get(m, 0),
            totals=tuple(totals.get(m, ())),
            split=_gpu_hours_split(m, hours_by_month.get(m, _ZERO), attributed_by_month.get(m, _ZERO))
            if scope.sees_platform else None,
        ))
    return views


def _attributed_gpu_hours(scope: Scope, start: datetime | None, end: datetime | None) -> dict[date, Decimal]:
    """Per month, the tenants' GPU-hours as the figure tree of the month shows them (billing.figures:
    a tenant's figure is the sum of its invoice lines, each rounded once at _PLACES), from the lines'
    sums alone: one grouped read of the day ledger for every month, where building each month's tree
    cost about 0.25 s a month at 200 GPUs (docs/benchmarks.md). tests/billing/test_page_reads_equivalence.py
    holds it equal to the tree's."""
    hours: dict[date, dict[str, list[Decimal]]] = {}
    for line in list_monthly_line_share_seconds(start=start, end=end, tenants=scope.tenants):
        hours.setdefault(line.month, {}).setdefault(line.tenant, []).append(line.share_gpu_s / _S_PER_H)
    return {month: sum((round_quantities(lines, _PLACES)[1] for lines in by_tenant.values()), _ZERO)
            for month, by_tenant in hours.items()}


def _gpu_hours_split(month: date, metered_hours: Decimal, attributed: Decimal) -> GpuHoursSplit:
    """The month's metered GPU-hours (the page's column) split by the figures the GPU cost page
    shows for the same month: the tenants' GPU-hours as their figure tree shows them
    (`_attributed_gpu_hours`), the idle's cost from the GPU ledger."""
    start, end = month_bounds(month)
    gpu = get_gpu_totals(start=start, end=end)
    return GpuHoursSplit(metered=round_quantities([metered_hours], _PLACES)[1], attributed=attributed,
                         currency=get_priced_currency(start=start, end=end), idle_platform=gpu.idle_platform,
                         idle_invoiced=gpu.idle_allocated)


def _month_totals(invoices: QuerySet[Invoice]) -> tuple[dict[date, int], dict[date, list[CurrencyTotal]]]:
    """Per month, how many invoices and their sums per currency: each invoice's figures as the
    invoice list shows them (its balance by the one rule), added up, so the month's row is the sum
    of its invoice rows to the cent."""
    groups: dict[date, dict[str, list[InvoiceBalance]]] = {}
    for invoice, balance in invoice_balances(invoices.select_related("period")):
        groups.setdefault(invoice.period.month, {}).setdefault(invoice.currency, []).append(balance)
    counts = {m: sum(len(b) for b in by_currency.values()) for m, by_currency in groups.items()}
    totals: dict[date, list[CurrencyTotal]] = {}
    for m, by_currency in groups.items():
        for currency in sorted(by_currency):
            sums = add_balances(currency, by_currency[currency])
            totals.setdefault(m, []).append(CurrencyTotal(currency, from_minor_units(sums.total_minor, currency), sums))
    return counts, totals


def _state(row: BillingPeriod | None, *, over: bool, now: datetime) -> str:
    if row is not None and row.status == BillingPeriod.Status.CLOSED:
        return PeriodState.CLOSED
    if not over:
        return PeriodState.OPEN
    if row is None or row.status == BillingPeriod.Status.OPEN:
        return PeriodState.READY
    if row.status == BillingPeriod.Status.CLOSING:
        stalled = close_is_stalled(status=row.status, progress_at=row.progress_at, now=now)
        return PeriodState.STALLED if stalled else PeriodState.CLOSING
    return PeriodState.FAILED
