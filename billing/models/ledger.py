"""Minute, hour and day ledgers: rollups of raw samples, priced (DESIGN §4).

Ledger rows are derived data: the rollup replaces a GPU-minute's rows wholesale from raw
samples, which makes it idempotent and lets late batches land. Amounts are Decimal with
LEDGER_PLACES decimal places (billing.money); customer-facing rounding happens once per
invoice line. Invariant per GPU and window: Σ workload charge + idle_cost = card_cost.

The day ledger (UsageDay, GpuDay) is derived from the hour ledger exactly like hours from minutes
(billing.services.rollup): sums of exact decimals per UTC day, so Σ days = Σ hours. Reads over whole
UTC days use it (~24x fewer rows); anything that needs hour precision reads hours. The rollup writes
hours and days in one transaction; an hour row saved or deleted through the ORM (hand-written ledgers
in tests) re-derives its GPU-day below. Bulk writes of hours (COPY, bulk_create, QuerySet.update)
must call billing.services.rollup.rebuild_days themselves.
"""


from django.db import models

from billing.models.fleet import Node
from billing.models.pricing import RateCard


def _amount() -> models.DecimalField:
    """Money at ledger precision (billing.money.LEDGER_PLACES)."""
    return models.DecimalField(max_digits=30, decimal_places=12)


def _quantity() -> models.DecimalField:
    # 10 places keep agent integrals exact: agents quantise to multiples of 2^-10 (agents/meter.py).
    return models.DecimalField(max_digits=30, decimal_places=10)


class _WorkloadUsage(models.Model):
    gpu_uuid = models.CharField(max_length=128)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+")
    tenant = models.CharField(max_length=63)
    namespace = models.CharField(max_length=253)
    pod = models.CharField(max_length=253)
    container = models.CharField(max_length=253)
    pod_uid = models.CharField(max_length=64)
    sla_tier = models.CharField(max_length=63)
    seconds = _quantity()
    mem_used_mb_s = _quantity()
    mem_granted_mb_s = _quantity()
    mem_billed_mb_s = _quantity()
    sm_used_s = _quantity()
    sm_granted_s = _quantity()
    sm_billed_s = _quantity()
    pcie_mb = _quantity()
    # The workload's share of the card in GPU-seconds after any pro-rata scaling.
    share_gpu_s = _amount()
    charge = _amount()
    # Idle spread onto this workload under the `proportional` idle policy, else 0.
    idle_share = _amount()

    class Meta:
        abstract = True


class _GpuWindow(models.Model):
    gpu_uuid = models.CharField(max_length=128)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+")
    gpu_model = models.CharField(max_length=128)
    metered_seconds = _quantity()
    card_cost = _amount()
    charged = _amount()
    idle_cost = _amount()
    # Part of idle_cost spread onto tenants (proportional policy); the rest is the platform's.
    idle_allocated = _amount()
    currency = models.CharField(max_length=3, blank=True)
    # False when no rate card covered this window: amounts are 0 and the page says so.
    priced = models.BooleanField()

    class Meta:
        abstract = True


class UsageMinute(_WorkloadUsage):
    minute = models.DateTimeField()
    rate_card = models.ForeignKey(RateCard, on_delete=models.PROTECT, null=True, related_name="+")

    class Meta:
        indexes = [
            models.Index(fields=["gpu_uuid", "minute"], name="usage_minute_gpu_idx"),
            models.Index(fields=["minute", "tenant"], name="usage_minute_tenant_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.gpu_uuid} {self.tenant}/{self.pod}"


class GpuMinute(_GpuWindow):
    minute = models.DateTimeField()
    rate_card = models.ForeignKey(RateCard, on_delete=models.PROTECT, null=True, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gpu_uuid", "minute"], name="gpu_minute_unique")]
        indexes = [models.Index(fields=["minute"], name="gpu_minute_minute_idx")]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.gpu_uuid}"


class UsageHour(_WorkloadUsage):
    hour = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["gpu_uuid", "hour"], name="usage_hour_gpu_idx"),
            models.Index(fields=["hour", "tenant"], name="usage_hour_tenant_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.gpu_uuid} {self.tenant}/{self.pod}"


class GpuHour(_GpuWindow):
    hour = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gpu_uuid", "hour"], name="gpu_hour_unique")]
        indexes = [models.Index(fields=["hour"], name="gpu_hour_hour_idx")]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.gpu_uuid}"


class UsageDay(_WorkloadUsage):
    """A workload's usage on one GPU for one UTC day: the sum of its UsageHour rows of that day."""

    day = models.DateTimeField()  # 00:00 UTC
    # Start of the first and last ledger hour with usage that day, so readers keep hour precision.
    first_hour = models.DateTimeField()
    last_hour = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["gpu_uuid", "day"], name="usage_day_gpu_idx"),
            models.Index(fields=["day", "tenant"], name="usage_day_tenant_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.day:%Y-%m-%d} {self.gpu_uuid} {self.tenant}/{self.pod}"


class GpuDay(_GpuWindow):
    """One GPU for one UTC day: the sum of its GpuHour rows of that day. `priced` is False when any
    hour was not (wholly) priced; `unpriced_seconds` are the metered seconds of those hours, so the
    unpriced figure stays as exact as the hour ledger's."""

    day = models.DateTimeField()  # 00:00 UTC
    unpriced_seconds = _quantity()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gpu_uuid", "day"], name="gpu_day_unique")]
        indexes = [models.Index(fields=["day"], name="gpu_day_day_idx")]

    def __str__(self) -> str:
        return f"{self.day:%Y-%m-%d} {self.gpu_uuid}"
