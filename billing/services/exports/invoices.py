"""The invoices a caller may read, as frozen views: the list, one invoice's document (its lines in
the order every rendering shows them), and an invoice number from tenant and month."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

from django.conf import settings
from django.db.models import QuerySet

from billing.errors import DomainError, InvalidInput
from billing.models import Invoice, InvoiceLine, Tenant
from billing.money import format_minor_units
from billing.scope import Scope
from billing.services.invoicing import month_bounds, parse_month

__all__ = [
    "InvoiceDocument",
    "InvoiceLineView",
    "InvoiceNotFound",
    "InvoiceSummary",
    "find_invoice_number",
    "get_invoice_document",
    "list_invoices",
]

DEFAULT_ISSUER_NAME = "vGPU Ledger"


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
        return format_minor_units(self.total_minor, self.currency)



def _issuer_name() -> str:
    return str(getattr(settings, "INVOICE_ISSUER_NAME", DEFAULT_ISSUER_NAME))



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


