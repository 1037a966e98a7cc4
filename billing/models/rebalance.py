"""Pool rebalance plans (docs/rebalance.md): proposed as a dry run, executed only once an admin approves."""

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _


class RebalanceStatus(models.TextChoices):
    PROPOSED = "proposed", _("proposed")
    APPROVED = "approved", _("approved")
    REJECTED = "rejected", _("rejected")
    EXECUTING = "executing", _("executing")
    DONE = "done", _("done")
    FAILED = "failed", _("failed")


class RebalancePlan(models.Model):
    """One plan of at most ``max_moves`` moves from ``allocator.rebalance`` and its right-sizing.

    ``moves``: the planner's moves in order, each with the pod's namespace, name and UID.
    ``summary``: freed GPUs / nodes by name, busy counts before and after, pinned workloads.
    ``right_sizing``: GPUs needed at P95 / P99 against the pool's size, or ``{"error": ...}``.
    ``log``: every execution step (cordon, eviction) with its outcome, appended as it happens.
    """

    created_at = models.DateTimeField(db_index=True)
    status = models.CharField(max_length=16, choices=RebalanceStatus.choices, default=RebalanceStatus.PROPOSED)
    max_moves = models.PositiveIntegerField()
    moves = models.JSONField(default=list)
    gpus_freed = models.IntegerField(default=0)
    nodes_freed = models.IntegerField(default=0)
    projected_savings = models.DecimalField(max_digits=20, decimal_places=2, default=0)
    currency = models.CharField(max_length=3, blank=True)
    price_per_gpu_hour = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    pool_gpus = models.PositiveIntegerField(default=0)
    pool_nodes = models.PositiveIntegerField(default=0)
    summary = models.JSONField(default=dict)
    right_sizing = models.JSONField(default=dict)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True,
                                   related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    log = models.JSONField(default=list)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"rebalance plan {self.pk} ({self.status}, {len(self.moves)} moves)"
