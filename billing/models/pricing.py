from decimal import Decimal

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _


class BilledBasis(models.TextChoices):
    MAX = "max", _("max(used, granted)")
    GRANTED = "granted", _("granted")
    USED = "used", _("used")


class IdlePolicy(models.TextChoices):
    PLATFORM = "platform", _("charged to the platform account")
    PROPORTIONAL = "proportional", _("spread over the tenants on the GPU")


class RateCard(models.Model):
    """Price per GPU-hour of one GPU model over an effective period (docs/billing.md, Rate cards).

    `effective_to` is exclusive; NULL means open-ended. Periods of one model never overlap
    (trigger `rate_card_no_overlap`, migration 0003), so every GPU-second has at most one price.
    A retired card (`retired_at` set) stopped applying at its `effective_to`; one retired before
    it started has `effective_to == effective_from` and prices nothing. It stays on the invoices
    and ledger rows it priced.
    """

    gpu_model = models.CharField(max_length=128, help_text=_("Exactly as NVML names it"))
    currency = models.CharField(max_length=3)
    price_per_gpu_hour = models.DecimalField(
        max_digits=14, decimal_places=6, validators=[MinValueValidator(Decimal("0"))]
    )
    effective_from = models.DateTimeField()
    effective_to = models.DateTimeField(null=True, blank=True)
    alpha = models.DecimalField(
        max_digits=4,
        decimal_places=3,
        default=Decimal("0.5"),
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("1"))],
        help_text=_("Weight of memory against SM share in a workload's share of the card"),
    )
    billed_basis = models.CharField(max_length=10, choices=BilledBasis.choices, default=BilledBasis.MAX)
    idle_policy = models.CharField(max_length=16, choices=IdlePolicy.choices, default=IdlePolicy.PLATFORM)
    source_url = models.URLField(max_length=500)
    source_note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    retired_at = models.DateTimeField(null=True, blank=True)
    retired_by = models.CharField(max_length=150, blank=True)
    retire_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["gpu_model", "-effective_from"]
        constraints = [
            models.CheckConstraint(condition=Q(price_per_gpu_hour__gte=0), name="rate_card_price_nonnegative"),
            models.CheckConstraint(condition=Q(alpha__gte=0) & Q(alpha__lte=1), name="rate_card_alpha_0_1"),
            models.CheckConstraint(
                condition=Q(effective_to__isnull=True) | Q(effective_to__gt=models.F("effective_from"))
                | Q(retired_at__isnull=False, effective_to=models.F("effective_from")),
                name="rate_card_period_ordered",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_model} {self.price_per_gpu_hour} {self.currency}/GPU-h from {self.effective_from:%Y-%m-%d}"


class GpuModel(models.Model):
    """A GPU model name the service knows (docs/billing.md, Approved GPU models): an admin approved
    it, so a rate card may price it. A name a node reports that is not approved (or is retired) is
    stored and metered all the same, but its GPUs are flagged and its usage stays unpriced until an
    admin approves the name and prices it; the close bills everything else meanwhile.

    `name` is exactly as NVML reports it (billing.services.pricing.gpu_models.check_nvml_name). Retiring
    keeps the row (and its audit trail); approving the name again clears `retired_at`."""

    name = models.CharField(max_length=96, unique=True)
    approved_at = models.DateTimeField()
    approved_by = models.CharField(max_length=150)
    note = models.CharField(max_length=500, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)
    retired_by = models.CharField(max_length=150, blank=True)
    retire_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
