"""Invoicing: turning a closed month into invoices. The close (preview, request, resume, finalize,
late-usage adjustments), credit notes against finalized invoices, their payment status (sent, paid,
overdue) and balance due, and the tenant's billing details (legal name, tax rate, terms) the close copies onto each
invoice.

The facade: code outside this package imports from here, never from its modules."""

from __future__ import annotations

from billing.services.invoicing.balance import (
    InvoiceBalance,
    add_balances,
    balance_of,
    invoice_balance,
    invoice_balances,
    payment_in_force,
    with_balance_records,
)
from billing.services.invoicing.close import (
    InvoicePreview,
    close_is_stalled,
    close_period,
    current_issuer,
    list_unpriced,
    preview_invoice,
    preview_invoices,
    request_period_close,
    resume_period_close,
)
from billing.services.invoicing.credit_notes import (
    REASON_MAX_CHARS,
    CreditNotePreview,
    get_credit_room,
    issue_credit_note,
    preview_credit_note,
    unprintable_message,
)
from billing.services.invoicing.payments import (
    NOTE_MAX_CHARS,
    PAYMENT_STATES,
    PaymentStatus,
    invoice_issue_date,
    payment_status,
    record_invoice_status,
)
from billing.services.invoicing.tenant_billing import get_tenant_billing, update_tenant_billing
from billing.services.invoicing.unit_prices import (
    AppliedRate,
    billing_rule_text,
    is_average,
    line_rules,
    no_unit_price_reason,
    price_text,
    rates_from_json,
    rates_text,
    shared_rule,
)

__all__ = [
    "NOTE_MAX_CHARS",
    "PAYMENT_STATES",
    "REASON_MAX_CHARS",
    "AppliedRate",
    "CreditNotePreview",
    "InvoiceBalance",
    "InvoicePreview",
    "PaymentStatus",
    "add_balances",
    "balance_of",
    "billing_rule_text",
    "close_is_stalled",
    "close_period",
    "current_issuer",
    "get_credit_room",
    "get_tenant_billing",
    "invoice_balance",
    "invoice_balances",
    "invoice_issue_date",
    "is_average",
    "issue_credit_note",
    "line_rules",
    "list_unpriced",
    "no_unit_price_reason",
    "payment_in_force",
    "payment_status",
    "preview_credit_note",
    "preview_invoice",
    "preview_invoices",
    "price_text",
    "rates_from_json",
    "rates_text",
    "record_invoice_status",
    "request_period_close",
    "resume_period_close",
    "shared_rule",
    "unprintable_message",
    "update_tenant_billing",
    "with_balance_records",
]
