"""Billing periods and invoices (docs/billing.md; docs/exports.md).

An invoice is per tenant per month. Draft invoices may be rebuilt; a finalized invoice and
its lines are immutable — enforced in the database (migration 0005), not only here. When it is
finalized the invoice copies what its document shows (issuer, bill-to name, terms, PO number, cost
centre, tax rate), so a later change of settings or of the tenant never changes an issued invoice.
Corrections are never edits: usage that arrives after a month was finalized becomes an
adjustment line on a later invoice, and a finance user corrects an issued invoice with a credit
note, its own numbered, immutable document. Amounts are integer minor units, rounded once per line;
tax is rounded once on the subtotal.
"""

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from billing.models.tenancy import Tenant


class BillingPeriod(models.Model):
    class Status(models.TextChoices):
        OPEN = "open", _("open")
        CLOSING = "closing", _("closing")
        CLOSED = "closed", _("closed")
        # A close stopped on an error (kept in `error`); closing again resumes it.
        FAILED = "failed", _("failed")

    # First day of the month (UTC).
    month = models.DateField(unique=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    close_started_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    # Written by the closing job as it goes (0-100), so a page in any web process can show it.
    progress_pct = models.PositiveSmallIntegerField(default=0)
    # Who asked for the close from the periods page, and when (empty for the command and beat).
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    requested_at = models.DateTimeField(null=True, blank=True)
    # Why the last close failed; cleared when a close starts again.
    error = models.TextField(blank=True)
    # When a close last showed it is alive: the request, each progress write, a resume. A CLOSING
    # row whose progress_at is older than settings.VGPU_PERIOD_CLOSE_STALE_S is "stalled" (its job
    # was probably lost) and may be resumed from the periods page.
    progress_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-month"]
        constraints = [
            models.CheckConstraint(condition=models.Q(month__day=1), name="billing_period_first_of_month"),
            models.CheckConstraint(condition=models.Q(progress_pct__lte=100), name="billing_period_progress_pct"),
        ]

    def __str__(self) -> str:
        return f"{self.month:%Y-%m} ({self.status})"


class Invoice(models.Model):
    class Status(models.TextChoices):
        DRAFT = "draft", _("draft")
        FINALIZED = "finalized", _("finalized")

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="invoices")
    period = models.ForeignKey(BillingPeriod, on_delete=models.PROTECT, related_name="invoices")
    number = models.CharField(max_length=64, unique=True)
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.DRAFT)
    # Σ line amount_minor + tax_minor (so the subtotal is total_minor - tax_minor).
    total_minor = models.BigIntegerField(default=0)
    created_at = models.DateTimeField()
    finalized_at = models.DateTimeField(null=True, blank=True)
    # Copied when the invoice is finalized (empty / NULL on invoices finalized before they existed).
    issuer_name = models.CharField(max_length=200, blank=True)
    issuer_address = models.TextField(blank=True)
    issuer_tax_id = models.CharField(max_length=64, blank=True)
    bill_to_name = models.CharField(max_length=200, blank=True)
    bill_to_address = models.TextField(blank=True)
    bill_to_tax_id = models.CharField(max_length=64, blank=True)
    # Why the tax is 0 % (exemption, reverse charge), as the tenant's terms said at issue.
    tax_exemption_note = models.CharField(max_length=300, blank=True)
    issue_date = models.DateField(null=True, blank=True)
    due_date = models.DateField(null=True, blank=True)
    payment_terms_days = models.PositiveSmallIntegerField(null=True, blank=True)
    po_number = models.CharField(max_length=64, blank=True)
    cost_centre = models.CharField(max_length=64, blank=True)
    tax_rate_pct = models.DecimalField(max_digits=6, decimal_places=3, default=Decimal(0))
    # Tax on the subtotal, rounded once to minor units (billing.money.to_minor_units).
    tax_minor = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["-period__month", "tenant__slug"]
        constraints = [models.UniqueConstraint(fields=["tenant", "period"], name="invoice_tenant_period_unique")]

    def __str__(self) -> str:
        return f"{self.number} ({self.status})"

    @property
    def subtotal_minor(self) -> int:
        return self.total_minor - self.tax_minor


class InvoiceLine(models.Model):
    class Kind(models.TextChoices):
        USAGE = "usage", _("GPU usage")
        IDLE = "idle", _("idle capacity (proportional)")
        ADJUSTMENT = "adjustment", _("adjustment for late usage")

    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="lines")
    kind = models.CharField(max_length=12, choices=Kind.choices)
    gpu_model = models.CharField(max_length=128)
    sla_tier = models.CharField(max_length=63)
    # The month whose usage this line charges: the invoice's own, or an earlier one for adjustments.
    usage_month = models.DateField()
    # Equivalent whole-GPU hours billed (Σ share_gpu_s / 3600), for the reader.
    gpu_hours = models.DecimalField(max_digits=24, decimal_places=6)
    # Unrounded ledger amount, then the one rounding to minor units (billing.money).
    amount = models.DecimalField(max_digits=30, decimal_places=12)
    amount_minor = models.BigIntegerField()
    # Usage lines: the price per GPU-hour in the invoice currency, as the close stated it (docs/billing.md,
    # Unit prices): the rate when one rate priced the whole line, else amount ÷ GPU-hours, an average.
    # NULL on idle and adjustment lines, and on lines finalized before unit prices were recorded.
    unit_price = models.DecimalField(max_digits=24, decimal_places=6, null=True, blank=True)
    # The rates that priced the line, in time order, copied at the close so that a later rate card or
    # commitment never changes an issued invoice: [{"price", "start", "end", "commitment",
    # "billed_basis", "alpha"}] (decimals and ISO instants as strings). Empty where unit_price is NULL.
    rates = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["usage_month", "kind", "gpu_model", "sla_tier"]

    def __str__(self) -> str:
        return f"{self.invoice_id} {self.kind} {self.gpu_model}/{self.sla_tier} {self.amount_minor}"


class InvoiceWorkload(models.Model):
    """An invoice's usage by workload (docs/billing.md, Workload breakdown): each namespace and
    controller of the tenant's month as the drill-down shows it, read from the same figure tree
    (billing.figures), so the rows add up to the invoice's own-month lines (usage and idle spread
    onto them), not line by line. Written with the lines at the close and immutable like them
    (migration 0034), so the breakdown of an issued invoice never changes."""

    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="workloads")
    namespace = models.CharField(max_length=253)
    # `<kind>:<name>` of the pods' controller, `__unallocated__` for pods none was reported for.
    workload = models.CharField(max_length=600)
    # Equivalent whole-GPU hours as the drill-down shows them (billing.figures.PAGE_PLACES).
    gpu_hours = models.DecimalField(max_digits=24, decimal_places=6)
    amount_minor = models.BigIntegerField()

    class Meta:
        ordering = ["namespace", "workload"]
        constraints = [models.UniqueConstraint(fields=["invoice", "namespace", "workload"],
                                               name="invoice_workload_unique")]

    def __str__(self) -> str:
        return f"{self.invoice_id} {self.namespace}/{self.workload} {self.amount_minor}"


class CreditNote(models.Model):
    """A correction of an issued invoice: its own document, numbered in its own sequence
    (CN-YYYY-NNNN by year of issue), immutable once written (migration trigger: no update, no
    delete). It credits a net amount and the tax on it; the credits of an invoice never exceed the
    invoice (billing.services.invoicing.credit_notes)."""

    number = models.CharField(max_length=32, unique=True)
    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="credit_notes")
    currency = models.CharField(max_length=3)
    # Positive minor units credited: net, tax on it, and their sum.
    amount_minor = models.BigIntegerField()
    tax_minor = models.BigIntegerField()
    total_minor = models.BigIntegerField()
    reason = models.TextField()
    issued_at = models.DateTimeField()
    issue_date = models.DateField()
    issued_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                  related_name="+")
    issued_by_label = models.CharField(max_length=150)
    issuer_name = models.CharField(max_length=200)
    issuer_address = models.TextField(blank=True)
    issuer_tax_id = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["issued_at", "number"]
        constraints = [
            models.CheckConstraint(condition=models.Q(amount_minor__gt=0), name="credit_note_amount_positive"),
            models.CheckConstraint(condition=models.Q(tax_minor__gte=0), name="credit_note_tax_not_negative"),
            models.CheckConstraint(condition=models.Q(total_minor=models.F("amount_minor") + models.F("tax_minor")),
                                   name="credit_note_total_is_amount_plus_tax"),
        ]

    def __str__(self) -> str:
        return f"{self.number} → {self.invoice_id}"


class InvoiceStatusChange(models.Model):
    """A payment status finance records against an issued invoice: sent (to the customer), paid, or
    payment reversed (a payment recorded in error or returned), each on the day it happened.

    Append-only: the database refuses an update or a delete (migration trigger). The invoice row
    itself is immutable once finalized, so its payment status cannot be a field on it; a mistake is
    corrected by recording what happened next (a reversal, a later send), and the list of changes
    is the invoice's payment history. Overdue is never recorded: it is computed from the due date
    and today each time it is shown (billing.services.invoicing.payments)."""

    class Status(models.TextChoices):
        SENT = "sent", _("sent")
        PAID = "paid", _("paid")
        PAYMENT_REVERSED = "payment_reversed", _("payment reversed")

    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="status_changes")
    status = models.CharField(max_length=20, choices=Status.choices)
    # The day it happened, as finance states it (not before the issue date, never after today).
    on_date = models.DateField()
    note = models.CharField(max_length=200, blank=True)
    recorded_at = models.DateTimeField()
    # Who recorded it, by name: a user deleted later leaves the record as it was.
    recorded_by = models.CharField(max_length=150)

    class Meta:
        ordering = ["recorded_at", "id"]

    def __str__(self) -> str:
        return f"{self.invoice_id} {self.status} {self.on_date}"
