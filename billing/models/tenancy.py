from decimal import Decimal

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

slug_validator = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
    _("Use lower-case letters, digits and '-', at most 63 characters (a DNS label)."),
)


class SlaTier(models.Model):
    """A service tier; its weight drives weighted fair sharing on every GPU (docs/design.md, Weighted fair sharing)."""

    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=100)
    weight = models.DecimalField(
        max_digits=8, decimal_places=3, validators=[MinValueValidator(Decimal("0.001"))]
    )
    description = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # A retired tier is no longer offered (no edits, no new default tenants); it stays in the node
    # policy so agents keep weighting pods that still carry its label.
    retired_at = models.DateTimeField(null=True, blank=True)
    retired_by = models.CharField(max_length=150, blank=True)
    retire_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-weight", "slug"]
        constraints = [models.CheckConstraint(condition=models.Q(weight__gt=0), name="sla_tier_weight_positive")]

    def __str__(self) -> str:
        return self.slug


class Tenant(models.Model):
    """A chargeback unit. Samples name tenants by slug; unknown slugs are still metered and billed."""

    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    default_sla_tier = models.ForeignKey(SlaTier, on_delete=models.PROTECT, null=True, blank=True)
    # Kubernetes namespaces that belong to this tenant besides the one named like its slug
    # (agents read the namespace label vgpu-ledger.io/tenant; the admission webhook sees only
    # the namespace name, so the mapping lives here too).
    namespaces = ArrayField(models.CharField(max_length=63), default=list, blank=True)
    # Optional caps on what the tenant's admitted pods may be *guaranteed* across the fleet,
    # checked by the admission webhook (NULL = no cap).
    quota_guaranteed_mem_mb = models.PositiveBigIntegerField(null=True, blank=True)
    quota_guaranteed_sm = models.DecimalField(max_digits=12, decimal_places=3, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Invoice terms (edited by admins on the tenant's billing page, copied onto each invoice when it
    # is issued, so a later edit never changes an issued invoice). Tax: percent of the invoice
    # subtotal, 0 allowed (e.g. reverse charge); payment terms: days from issue to due, NULL = the
    # default (settings.VGPU_INVOICE_PAYMENT_TERMS_DAYS).
    tax_rate_pct = models.DecimalField(max_digits=6, decimal_places=3, default=Decimal(0),
                                       validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(100))])
    payment_terms_days = models.PositiveSmallIntegerField(null=True, blank=True,
                                                          validators=[MaxValueValidator(365)])
    po_number = models.CharField(max_length=64, blank=True)
    cost_centre = models.CharField(max_length=64, blank=True)
    # The customer as its finance team needs it on an invoice: postal billing address, tax
    # (VAT/GST) ID, and why a 0 % tax rate is charged (exemption or reverse charge), printed under
    # the tax line when the rate is 0.
    billing_address = models.TextField(blank=True)
    tax_id = models.CharField(max_length=64, blank=True)
    tax_exemption_note = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(condition=models.Q(tax_rate_pct__gte=0, tax_rate_pct__lte=100),
                                   name="tenant_tax_rate_pct_range"),
        ]

    def __str__(self) -> str:
        return self.slug


class TenantMembership(models.Model):
    """A user who belongs to a tenant sees that tenant's data and nothing else."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tenant_memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="tenant_membership_unique")]

    def __str__(self) -> str:
        return f"{self.user_id} → {self.tenant_id}"
