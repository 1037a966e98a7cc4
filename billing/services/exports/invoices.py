"""The invoices and credit notes a caller may read, as frozen views: the list (each invoice with its
subtotal, tax, total, credited and balance due, and the list's sums when it is one month in one
currency), one invoice's document (its lines in the order every rendering shows them, its terms,
tax and credit notes), one credit note's document, and an invoice number from tenant and month.

Documents show what was copied onto the invoice when it was issued (issuer, bill-to name, terms,
PO number, cost centre, tax rate). An invoice finalized before those fields existed shows its
finalization date as its issue date and the issuer configured now, and no due date."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import ROUND_HALF_EVEN, Decimal

from django.db.models import QuerySet
from django.utils.translation import gettext as _

from billing.calendar import month_bounds, parse_month
from billing.errors import DomainError, InvalidInput
from billing.ledger.allocation import UNALLOCATED
from billing.models import CreditNote, Invoice, InvoiceLine, InvoiceStatusChange, SlaTier, Tenant
from billing.money import format_minor_units
from billing.scope import Scope
from billing.seeded import seeded_text
from billing.services.invoicing import (
    AppliedRate,
    InvoiceBalance,
    PaymentStatus,
    add_balances,
    balance_of,
    billing_rule_text,
    current_issuer,
    invoice_issue_date,
    is_average,
    line_rules,
    no_unit_price_reason,
    payment_status,
    price_text,
    rates_from_json,
    rates_text,
    shared_rule,
    with_balance_records,
)

__all__ = [
    "GPU_HOURS_PLACES",
    "LINE_QUANTITY_PLACES",
    "CreditNoteDocument",
    "CreditNoteNotFound",
    "CreditNoteSummary",
    "InvoiceDocument",
    "InvoiceLineView",
    "InvoiceNotFound",
    "InvoiceSummary",
    "LineRow",
    "StatusChangeView",
    "WorkloadView",
    "find_invoice_number",
    "get_credit_note_document",
    "get_invoice_document",
    "gpu_hours_text",
    "invoice_list_total",
    "line_quantity_text",
    "list_invoices",
]

# GPU-hours on invoice and credit note documents (PDF, invoice CSV): 2 decimal places, half-even,
# stated on each document; the stored quantity keeps 6 and FOCUS keeps 12.
GPU_HOURS_PLACES = 2


# A line's quantity on the documents: the GPU-hours as the line stores them (InvoiceLine.gpu_hours), so
# that quantity × unit price gives the amount to the cent from what is printed.
LINE_QUANTITY_PLACES = 6


def line_quantity_text(value: Decimal) -> str:
    """A line's GPU-hours at LINE_QUANTITY_PLACES, exactly as stored."""
    return f"{value:.{LINE_QUANTITY_PLACES}f}"


def gpu_hours_text(value: Decimal) -> str:
    """GPU-hours as the documents state them: GPU_HOURS_PLACES decimals, half-even."""
    return f"{value.quantize(Decimal(1).scaleb(-GPU_HOURS_PLACES), rounding=ROUND_HALF_EVEN):.{GPU_HOURS_PLACES}f}"


class InvoiceNotFound(DomainError):
    """No invoice with that number in the caller's scope (a 404 that does not reveal existence)."""


class CreditNoteNotFound(DomainError):
    """No credit note with that number in the caller's scope (a 404, as for invoices)."""


@dataclass(frozen=True)
class CreditNoteSummary:
    number: str
    issue_date: date
    currency: str
    amount_minor: int  # net credited, positive
    tax_minor: int
    total_minor: int
    reason: str

    @property
    def total_display(self) -> str:
        return format_minor_units(self.total_minor, self.currency)

    @property
    def amount_display(self) -> str:
        return format_minor_units(self.amount_minor, self.currency)

    @property
    def tax_display(self) -> str:
        return format_minor_units(self.tax_minor, self.currency)


@dataclass(frozen=True)
class StatusChangeView:
    """One recorded payment status change, as the invoice page lists them."""

    status: str
    status_label: str
    on_date: date
    note: str
    recorded_at: datetime
    recorded_by: str


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
    # Per GPU-hour in the invoice currency, as stored at the close (None: idle, adjustment, or a line
    # finalized before unit prices were recorded), and the rates that priced the line.
    unit_price: Decimal | None = None
    rates: tuple[AppliedRate, ...] = ()
    # The SLA tier's name as the SLA tiers page shows it ("" when the tier no longer exists).
    sla_tier_name: str = ""

    @property
    def unit_price_is_average(self) -> bool:
        return is_average(self.rates)

    @property
    def sla_tier_label(self) -> str:
        """The tier's name in the reader's language (a seeded tier's, translated), else its slug."""
        return seeded_text(self.sla_tier_name) if self.sla_tier_name else self.sla_tier


@dataclass(frozen=True)
class WorkloadView:
    """One workload of the invoice's usage by workload, as stored at the close: the drill-down's
    controller row of the tenant's month."""

    namespace: str
    workload: str
    gpu_hours: Decimal
    amount_minor: int

    @property
    def namespace_label(self) -> str:
        return _unallocated_label(self.namespace)

    @property
    def workload_label(self) -> str:
        return _unallocated_label(self.workload)


def _unallocated_label(value: str) -> str:
    """A value no Kubernetes metadata named, as the drill-down names it."""
    return _("(not known)") if value == UNALLOCATED else value


@dataclass(frozen=True)
class LineRow:
    """One line as the page and the PDF state it, in the reader's language: GPU-hours, unit price
    ("" where there is none), amount, and the notes that explain the unit price: the rates of an
    average, the line's billing rule when lines differ, or why there is no unit price."""

    line: InvoiceLineView
    hours: str
    unit_price: str
    average: bool
    amount: str
    rates: str
    rule: str
    reason: str

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(n for n in (self.rates, self.rule, self.reason) if n)


# Unit prices were first recorded by migration 0033; a usage line finalized before has none.
def _missing_unit_price_reason() -> str:
    return _("no unit price: this invoice was issued before unit prices were recorded")


@dataclass(frozen=True)
class InvoiceDocument:
    number: str
    tenant_slug: str
    tenant_name: str
    month: date
    currency: str
    status: str
    status_label: str
    total_minor: int  # subtotal + tax
    finalized_at: datetime | None
    issuer_name: str
    lines: tuple[InvoiceLineView, ...]
    issuer_address: str = ""
    issuer_tax_id: str = ""
    issue_date: date | None = None
    due_date: date | None = None
    payment_terms_days: int | None = None
    po_number: str = ""
    cost_centre: str = ""
    tax_rate_pct: Decimal = Decimal(0)
    tax_minor: int = 0
    # The customer as copied at issue (empty on invoices issued before they were kept).
    bill_to_address: str = ""
    bill_to_tax_id: str = ""
    # Why the tax is 0 %, printed under the tax line (copied only when the rate was 0).
    tax_exemption_note: str = ""
    credit_notes: tuple[CreditNoteSummary, ...] = ()
    # On the day asked (get_invoice_document's `today`); None when not asked (the downloads).
    payment: PaymentStatus | None = None
    status_changes: tuple[StatusChangeView, ...] = ()
    # Credited and balance due (billing.services.invoicing.balance); None when not asked (the downloads).
    balance: InvoiceBalance | None = None
    # The tenant's month by workload as the drill-down shows it (empty for invoices closed before it was kept).
    workloads: tuple[WorkloadView, ...] = ()

    @property
    def month_lines_minor(self) -> int:
        """Σ of the lines of the invoice's own month (usage and idle, not adjustments for months
        closed earlier): the tenant's figure of the month, what its workloads add up to."""
        return sum(line.amount_minor for line in self.lines
                   if line.kind != InvoiceLine.Kind.ADJUSTMENT and line.usage_month == self.month)

    @property
    def month_lines_display(self) -> str:
        return format_minor_units(self.month_lines_minor, self.currency)

    @property
    def workload_rows(self) -> tuple[tuple[WorkloadView, str, str], ...]:
        """(workload, its GPU-hours as documents state them, its amount) for the page and the PDF."""
        return tuple((w, gpu_hours_text(w.gpu_hours), format_minor_units(w.amount_minor, self.currency))
                     for w in self.workloads)

    @property
    def period_bounds(self) -> tuple[datetime, datetime]:
        return month_bounds(self.month)

    @property
    def subtotal_minor(self) -> int:
        return self.total_minor - self.tax_minor

    @property
    def credited_minor(self) -> int:
        return sum(n.total_minor for n in self.credit_notes)

    # Major-unit texts for the page (exact, the currency's decimals).
    @property
    def subtotal_display(self) -> str:
        return format_minor_units(self.subtotal_minor, self.currency)

    @property
    def tax_display(self) -> str:
        return format_minor_units(self.tax_minor, self.currency)

    @property
    def total_display(self) -> str:
        return format_minor_units(self.total_minor, self.currency)

    @property
    def credited_display(self) -> str:
        return format_minor_units(self.credited_minor, self.currency)

    @property
    def billing_rule(self) -> tuple[str, Decimal] | None:
        """The (billed basis, α) every usage line was billed by, stated once above the lines; None
        when they differ (each line states its own) or none was recorded."""
        return shared_rule([line.rates for line in self.lines if line.kind == InvoiceLine.Kind.USAGE])

    @property
    def billing_rule_text(self) -> str:
        rule = self.billing_rule
        return billing_rule_text(*rule) if rule else ""

    @property
    def has_average(self) -> bool:
        return any(line.unit_price_is_average for line in self.lines)

    @property
    def line_rows(self) -> tuple[LineRow, ...]:
        """The lines as the page and the PDF state them (LineRow)."""
        shared = self.billing_rule is not None
        _, period_end = self.period_bounds
        return tuple(self._line_row(line, shared=shared, period_end=period_end) for line in self.lines)

    def _line_row(self, line: InvoiceLineView, *, shared: bool, period_end: datetime) -> LineRow:
        usage = line.kind == InvoiceLine.Kind.USAGE
        reason = no_unit_price_reason(line.kind)
        if usage and line.unit_price is None:
            reason = _missing_unit_price_reason()
        rule = "" if shared or not usage else "; ".join(billing_rule_text(*r) for r in line_rules(line.rates))
        return LineRow(
            line=line, hours=line_quantity_text(line.gpu_hours) if usage else "",
            unit_price=price_text(line.unit_price) if line.unit_price is not None else "",
            average=line.unit_price_is_average, amount=format_minor_units(line.amount_minor, self.currency),
            rates=rates_text(line.rates, period_end=period_end) if line.unit_price_is_average else "",
            rule=rule, reason=reason,
        )


@dataclass(frozen=True)
class CreditNoteDocument:
    number: str
    invoice: InvoiceDocument  # the invoice it corrects
    issue_date: date
    issued_at: datetime
    currency: str
    amount_minor: int  # net credited, positive
    tax_minor: int
    total_minor: int
    reason: str
    issued_by: str
    issuer_name: str
    issuer_address: str
    issuer_tax_id: str


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
    payment: PaymentStatus
    # Subtotal, tax, total, credited and balance due (billing.services.invoicing.balance).
    balance: InvoiceBalance

    @property
    def total_display(self) -> str:
        return format_minor_units(self.total_minor, self.currency)

    @property
    def period_key(self) -> str:
        """YYYY-MM, as the periods page names the month."""
        return f"{self.month:%Y-%m}"


def _scoped_invoices(scope: Scope) -> QuerySet[Invoice]:
    invoices = Invoice.objects.select_related("tenant", "period")
    if scope.tenants is not None:
        invoices = invoices.filter(tenant__slug__in=scope.tenants)
    return invoices


def _payment(invoice: Invoice, *, balance: InvoiceBalance, today: date) -> PaymentStatus:
    """Its payment status on `today`; the status changes as `with_balance_records` prefetched them."""
    return payment_status(finalized=invoice.status == Invoice.Status.FINALIZED, issue_date=invoice_issue_date(invoice),
                          due_date=invoice.due_date, due_minor=balance.unpaid_minor,
                          changes=[(c.status, c.on_date) for c in invoice.status_changes.all()], today=today)


def list_invoices(*, scope: Scope, today: date) -> list[InvoiceSummary]:
    """The invoices the caller may read, newest month first, each with its balance and its payment
    status on `today` (overdue is computed here, never stored)."""
    invoices = with_balance_records(_scoped_invoices(scope).order_by("-period__month", "tenant__slug"))
    return [_summary(i, today=today) for i in invoices]


def _summary(invoice: Invoice, *, today: date) -> InvoiceSummary:
    balance = balance_of(invoice)
    return InvoiceSummary(
        number=invoice.number, tenant_slug=invoice.tenant.slug, tenant_name=invoice.tenant.name,
        month=invoice.period.month, currency=invoice.currency, status=invoice.status,
        status_label=str(invoice.get_status_display()), total_minor=invoice.total_minor,
        payment=_payment(invoice, balance=balance, today=today), balance=balance,
    )


def invoice_list_total(invoices: Sequence[InvoiceSummary]) -> InvoiceBalance | None:
    """The column sums of a list of invoices of one currency and one billing period (the list's
    footer and its CSV's total row); None for an empty list or one that mixes months or currencies,
    where a single sum would add what no period or currency holds together."""
    if len({(i.month, i.currency) for i in invoices}) != 1:
        return None
    return add_balances(invoices[0].currency, [i.balance for i in invoices])


def get_invoice_document(*, scope: Scope, number: str, today: date | None = None) -> InvoiceDocument:
    """One invoice's document; with `today`, also its payment status on that day and the status
    changes recorded (the page shows them; the downloads, documents of issue, do not)."""
    invoice = with_balance_records(_scoped_invoices(scope).filter(number=number)).first()
    if invoice is None:
        raise InvoiceNotFound(f"no invoice {number!r}")
    return _document(invoice, today=today)


def _document(invoice: Invoice, *, today: date | None = None) -> InvoiceDocument:
    kind_labels = dict(InvoiceLine.Kind.choices)
    tier_names = dict(SlaTier.objects.values_list("slug", "name"))
    lines = tuple(
        InvoiceLineView(
            kind=line.kind, kind_label=str(kind_labels.get(line.kind, line.kind)), gpu_model=line.gpu_model,
            sla_tier=line.sla_tier, usage_month=line.usage_month, gpu_hours=line.gpu_hours, amount=line.amount,
            amount_minor=line.amount_minor, unit_price=line.unit_price, rates=rates_from_json(line.rates),
            sla_tier_name=tier_names.get(line.sla_tier, ""),
        )
        for line in invoice.lines.order_by("usage_month", "kind", "gpu_model", "sla_tier")
    )
    # Invoices finalized before the terms were copied onto them: the issuer as configured now, the
    # finalization date as the issue date.
    legacy = current_issuer() if not invoice.issuer_name else None
    issue_date = invoice_issue_date(invoice)
    credit_notes = tuple(
        CreditNoteSummary(number=n.number, issue_date=n.issue_date, currency=n.currency, amount_minor=n.amount_minor,
                          tax_minor=n.tax_minor, total_minor=n.total_minor, reason=n.reason)
        for n in invoice.credit_notes.order_by("issued_at", "number")
    )
    payment: PaymentStatus | None = None
    balance: InvoiceBalance | None = None
    history: tuple[StatusChangeView, ...] = ()
    if today is not None:
        balance = balance_of(invoice)
        payment = _payment(invoice, balance=balance, today=today)
        labels = dict(InvoiceStatusChange.Status.choices)
        history = tuple(StatusChangeView(status=c.status, status_label=str(labels[c.status]), on_date=c.on_date,
                                         note=c.note, recorded_at=c.recorded_at, recorded_by=c.recorded_by)
                        for c in invoice.status_changes.all())
    return InvoiceDocument(
        number=invoice.number, tenant_slug=invoice.tenant.slug,
        tenant_name=invoice.bill_to_name or invoice.tenant.name, month=invoice.period.month,
        currency=invoice.currency, status=invoice.status, status_label=str(invoice.get_status_display()),
        total_minor=invoice.total_minor, finalized_at=invoice.finalized_at,
        issuer_name=legacy.name if legacy else invoice.issuer_name, lines=lines,
        issuer_address=legacy.address if legacy else invoice.issuer_address,
        issuer_tax_id=legacy.tax_id if legacy else invoice.issuer_tax_id,
        issue_date=issue_date, due_date=invoice.due_date, payment_terms_days=invoice.payment_terms_days,
        po_number=invoice.po_number, cost_centre=invoice.cost_centre, tax_rate_pct=invoice.tax_rate_pct,
        tax_minor=invoice.tax_minor, bill_to_address=invoice.bill_to_address, bill_to_tax_id=invoice.bill_to_tax_id,
        tax_exemption_note=invoice.tax_exemption_note, credit_notes=credit_notes, payment=payment, status_changes=history,
        balance=balance,
        workloads=tuple(WorkloadView(namespace=w.namespace, workload=w.workload, gpu_hours=w.gpu_hours,
                                     amount_minor=w.amount_minor)
                        for w in invoice.workloads.order_by("namespace", "workload")),
    )


def get_credit_note_document(*, scope: Scope, number: str) -> CreditNoteDocument:
    """One credit note, for a caller who may read the invoice it corrects."""
    notes = CreditNote.objects.select_related("invoice__tenant", "invoice__period")
    if scope.tenants is not None:
        notes = notes.filter(invoice__tenant__slug__in=scope.tenants)
    note = notes.filter(number=number).first()
    if note is None:
        raise CreditNoteNotFound(f"no credit note {number!r}")
    return CreditNoteDocument(
        number=note.number, invoice=_document(note.invoice), issue_date=note.issue_date, issued_at=note.issued_at,
        currency=note.currency, amount_minor=note.amount_minor, tax_minor=note.tax_minor,
        total_minor=note.total_minor, reason=note.reason, issued_by=note.issued_by_label,
        issuer_name=note.issuer_name, issuer_address=note.issuer_address, issuer_tax_id=note.issuer_tax_id,
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


