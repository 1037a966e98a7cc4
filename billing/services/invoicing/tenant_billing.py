"""A tenant's invoice terms: tax rate, payment terms, PO number, cost centre, and the customer's
billing address, tax ID and tax exemption / reverse-charge note (admins edit them; each invoice
copies them when it is issued, so an edit applies to invoices issued after it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.utils.translation import gettext

from billing.errors import InvalidInput
from billing.models import Tenant
from billing.services.audit import record_audit_event

__all__ = ["TenantBilling", "get_tenant_billing", "update_tenant_billing"]

_MAX_TERMS_DAYS = 365
_MAX_REFERENCE_CHARS = 64
_MAX_ADDRESS_CHARS = 500
_MAX_ADDRESS_LINES = 6  # what the invoice's Bill to holds without pushing the lines off the page
_MAX_NOTE_CHARS = 300


@dataclass(frozen=True)
class TenantBilling:
    slug: str
    name: str
    tax_rate_pct: Decimal
    payment_terms_days: int | None  # None: the default terms
    po_number: str
    cost_centre: str
    billing_address: str = ""
    tax_id: str = ""
    tax_exemption_note: str = ""


def _view(tenant: Tenant) -> TenantBilling:
    return TenantBilling(slug=tenant.slug, name=tenant.name, tax_rate_pct=tenant.tax_rate_pct,
                         payment_terms_days=tenant.payment_terms_days, po_number=tenant.po_number,
                         cost_centre=tenant.cost_centre, billing_address=tenant.billing_address,
                         tax_id=tenant.tax_id, tax_exemption_note=tenant.tax_exemption_note)


def get_tenant_billing(*, slug: str) -> TenantBilling | None:
    tenant = Tenant.objects.filter(slug=slug).first()
    return None if tenant is None else _view(tenant)


def _audit_form(view: TenantBilling) -> dict[str, object]:
    values = asdict(view)
    values["tax_rate_pct"] = f"{view.tax_rate_pct:.3f}"
    return {k: v for k, v in values.items() if k not in ("slug", "name")}


def _bill_to(billing_address: str, tax_id: str, tax_exemption_note: str) -> tuple[str, str, str]:
    """The customer's details, trimmed (an address keeps its lines, without blank ones), or
    InvalidInput naming what is too long."""
    lines = [line.strip() for line in billing_address.replace("\r\n", "\n").split("\n")]
    address = "\n".join(line for line in lines if line)
    if len(address) > _MAX_ADDRESS_CHARS or address.count("\n") >= _MAX_ADDRESS_LINES:
        raise InvalidInput(gettext("A billing address has at most %(lines)s lines and %(chars)s characters.")
                           % {"lines": _MAX_ADDRESS_LINES, "chars": _MAX_ADDRESS_CHARS})
    tax_id, note = tax_id.strip(), " ".join(tax_exemption_note.split())
    if len(tax_id) > _MAX_REFERENCE_CHARS:
        raise InvalidInput(gettext("A tax ID has at most %(max)s characters.") % {"max": _MAX_REFERENCE_CHARS})
    if len(note) > _MAX_NOTE_CHARS:
        raise InvalidInput(gettext("A tax exemption note has at most %(max)s characters.") % {"max": _MAX_NOTE_CHARS})
    return address, tax_id, note


def update_tenant_billing(
    *, slug: str, tax_rate_pct: Decimal, payment_terms_days: int | None, po_number: str, cost_centre: str,
    now: datetime, actor_label: str, actor_id: int | None = None, billing_address: str = "", tax_id: str = "",
    tax_exemption_note: str = "",
) -> TenantBilling:
    """Set a tenant's invoice terms, audited (`tenant.billing_updated`, before and after) in the same
    transaction. Refused (InvalidInput, nothing changed) for an unknown tenant, a tax rate outside
    0-100 %, terms outside 0-365 days, a reference or tax ID longer than 64 characters, an address of
    more than 6 lines or 500 characters, or a tax exemption note longer than 300."""
    if not Decimal(0) <= tax_rate_pct <= Decimal(100) or tax_rate_pct != tax_rate_pct.quantize(Decimal("0.001")):
        raise InvalidInput(gettext("The tax rate must be a percentage from 0 to 100 with at most 3 decimals."))
    if payment_terms_days is not None and not 0 <= payment_terms_days <= _MAX_TERMS_DAYS:
        raise InvalidInput(gettext("Payment terms must be from 0 to %(max)s days.") % {"max": _MAX_TERMS_DAYS})
    po_number, cost_centre = po_number.strip(), cost_centre.strip()
    if len(po_number) > _MAX_REFERENCE_CHARS or len(cost_centre) > _MAX_REFERENCE_CHARS:
        raise InvalidInput(gettext("A PO number or cost centre has at most %(max)s characters.")
                           % {"max": _MAX_REFERENCE_CHARS})
    billing_address, tax_id, tax_exemption_note = _bill_to(billing_address, tax_id, tax_exemption_note)
    with transaction.atomic():
        tenant = Tenant.objects.select_for_update().filter(slug=slug).first()
        if tenant is None:
            raise InvalidInput(gettext("There is no tenant %(slug)s.") % {"slug": slug})
        before = _audit_form(_view(tenant))
        tenant.tax_rate_pct = tax_rate_pct
        tenant.payment_terms_days = payment_terms_days
        tenant.po_number = po_number
        tenant.cost_centre = cost_centre
        tenant.billing_address, tenant.tax_id, tenant.tax_exemption_note = billing_address, tax_id, tax_exemption_note
        tenant.save(update_fields=["tax_rate_pct", "payment_terms_days", "po_number", "cost_centre",
                                   "billing_address", "tax_id", "tax_exemption_note"])
        after = _view(tenant)
        record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label, action="tenant.billing_updated",
                           object_type="tenant", object_id=slug, before=before, after=_audit_form(after))
    return after
