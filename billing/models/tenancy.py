from decimal import Decimal

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from allocator.risk import DEFAULT_MISS_TARGET, DEFAULT_MISS_TARGETS

# A miss target is a share of workload-seconds in (0, 1), stored with this many decimal places
# (1e-10: one second in about 317 years, far below any target a tier would state).
MISS_TARGET_PLACES = 10


def miss_target_decimal(share: float) -> Decimal:
    """A miss target (allocator.risk's float) as the column stores it: its shortest decimal, quantized."""
    return Decimal(repr(share)).quantize(Decimal(1).scaleb(-MISS_TARGET_PLACES))


def default_miss_targets(slug: str) -> dict[str, Decimal]:
    """A tier's starting miss targets, as SlaTier's fields: allocator.risk's own for the tiers it
    names (gold, silver, bronze, best-effort), its DEFAULT_MISS_TARGET for any other."""
    target = DEFAULT_MISS_TARGETS.get(slug, DEFAULT_MISS_TARGET)
    return {"miss_target_memory": miss_target_decimal(target.memory), "miss_target_sm": miss_target_decimal(target.sm)}


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
    # The share of its workloads' seconds whose use may exceed the grant, per resource
    # (allocator.risk.MissTarget): memory, an out-of-memory failure; SMs, a slowdown. Agents get
    # them with the policy and calibrate each workload's margin toward them. A new tier starts at
    # allocator.risk's default; the seeded tiers at its per-tier defaults (migration 0038).
    miss_target_memory = models.DecimalField(max_digits=MISS_TARGET_PLACES + 1, decimal_places=MISS_TARGET_PLACES,
                                             default=miss_target_decimal(DEFAULT_MISS_TARGET.memory))
    miss_target_sm = models.DecimalField(max_digits=MISS_TARGET_PLACES + 1, decimal_places=MISS_TARGET_PLACES,
                                         default=miss_target_decimal(DEFAULT_MISS_TARGET.sm))

    class Meta:
        ordering = ["-weight", "slug"]
        constraints = [
            models.CheckConstraint(condition=models.Q(weight__gt=0), name="sla_tier_weight_positive"),
            models.CheckConstraint(condition=models.Q(miss_target_memory__gt=0, miss_target_memory__lt=1),
                                   name="sla_tier_miss_target_memory_share"),
            models.CheckConstraint(condition=models.Q(miss_target_sm__gt=0, miss_target_sm__lt=1),
                                   name="sla_tier_miss_target_sm_share"),
        ]

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
