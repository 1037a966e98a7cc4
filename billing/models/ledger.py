"""Minute and hour ledgers: rollups of raw samples, priced (DESIGN §4).

Ledger rows are derived data: the rollup replaces a GPU-minute's rows wholesale from raw
samples, which makes it idempotent and lets late batches land. Amounts are Decimal with
LEDGER_PLACES decimal places (billing.money); customer-facing rounding happens once per
invoice line. Invariant per GPU and window: Σ workload charge + idle_cost = card_cost.
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
