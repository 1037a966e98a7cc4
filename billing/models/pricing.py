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


class CommitmentKind(models.TextChoices):
    RESERVED = "reserved", _("reserved (committed rate)")
    ON_PREM = "on_prem", _("on-prem (amortised)")


class Commitment(models.Model):
    """N cards of one GPU model paid for over a term at one rate, used or not (docs/billing.md,
    Commitments and on-prem cards): a reserved or committed-use rate bought from a provider for 1 or
    3 years, or cards the organisation owns, priced at their amortised cost over their life.

    In each minute the model's metered cards are taken in a fixed order and the first Σ `cards` of
    the commitments in force are priced at their (card-weighted) rate, the rest at the market rate
    card (billing.ledger.pricing). It prices whole hours `[effective_from, effective_to)`: from the
    later of the term's start and the hour after it was recorded, to the term's end or the hour
    after it was retired. The on-prem inputs are kept so the page shows how the rate was derived.
    """

    gpu_model = models.CharField(max_length=128)
    kind = models.CharField(max_length=10, choices=CommitmentKind.choices)
    cards = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    currency = models.CharField(max_length=3)
    price_per_gpu_hour = models.DecimalField(
        max_digits=14, decimal_places=6, validators=[MinValueValidator(Decimal("0"))])
    term_start = models.DateTimeField()
    term_end = models.DateTimeField()
    term_years = models.PositiveSmallIntegerField()
    effective_from = models.DateTimeField()
    effective_to = models.DateTimeField()
    # On-prem only: what the amortised rate is made of (per card).
    purchase_price = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    power_watts = models.PositiveIntegerField(null=True, blank=True)
    energy_price_per_kwh = models.DecimalField(max_digits=10, decimal_places=6, null=True, blank=True)
    facility_cost_per_year = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    note = models.TextField()
    created_at = models.DateTimeField()
    created_by = models.CharField(max_length=150)
    retired_at = models.DateTimeField(null=True, blank=True)
    retired_by = models.CharField(max_length=150, blank=True)
    retire_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["gpu_model", "effective_from", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(cards__gte=1), name="commitment_cards_positive"),
            models.CheckConstraint(condition=Q(price_per_gpu_hour__gte=0), name="commitment_price_nonnegative"),
            models.CheckConstraint(condition=Q(term_end__gt=models.F("term_start")), name="commitment_term_ordered"),
            # A commitment retired before it priced anything ends where it starts.
            models.CheckConstraint(condition=Q(effective_to__gte=models.F("effective_from")),
                                   name="commitment_effective_ordered"),
        ]

    def __str__(self) -> str:
        return f"{self.cards} x {self.gpu_model} {self.kind} {self.price_per_gpu_hour} {self.currency}/GPU-h"
