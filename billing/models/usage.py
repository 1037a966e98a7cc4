from django.db import models

from billing.models.fleet import Node


class UsageBatch(models.Model):
    """One accepted agent batch (wire protocol v1). Raw samples live in the partitioned
    table `billing_raw_sample` (see migration 0002), keyed by this id.

    `(node, batch_seq)` is unique: a retry of the same content is answered 200 duplicate,
    different content under the same key 409.
    """

    node = models.ForeignKey(Node, on_delete=models.PROTECT)
    batch_seq = models.BigIntegerField()
    content_sha256 = models.CharField(max_length=64)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    sample_count = models.PositiveIntegerField()
    received_at = models.DateTimeField()
    # Set by the rollup once the batch's minutes and hours are in the ledgers.
    rolled_up_at = models.DateTimeField(null=True, blank=True)
    # Set when the rollup could not roll the batch up: its samples stay out of the ledger, and
    # out of every other batch's way, until an operator re-drives it (billing.services.quarantine).
    quarantined_at = models.DateTimeField(null=True, blank=True)
    quarantine_error = models.TextField(blank=True, default="", db_default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "batch_seq"], name="usage_batch_node_seq_unique")]
        indexes = [
            models.Index(fields=["id"], condition=models.Q(rolled_up_at__isnull=True), name="usage_batch_pending_idx"),
            models.Index(fields=["window_start"], name="usage_batch_window_idx"),
            models.Index(fields=["id"], condition=models.Q(quarantined_at__isnull=False),
                         name="usage_batch_quarantined_idx"),
        ]

    def __str__(self) -> str:
        return f"batch {self.node_id}/{self.batch_seq}"


class BatchGpu(models.Model):
    """A GPU present and metered for a whole batch window, with the capacity the agent declared.

    These rows give each GPU-minute its metered seconds, hence its whole-card cost and its idle.
    """

    batch = models.ForeignKey(UsageBatch, on_delete=models.PROTECT, related_name="gpus")
    gpu_uuid = models.CharField(max_length=128)
    model = models.CharField(max_length=128)
    memory_mb = models.PositiveIntegerField()
    sm_count = models.PositiveIntegerField()
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["batch", "gpu_uuid"], name="batch_gpu_unique"),
        ]
        # A GPU-second is metered once: windows of one GPU never overlap across batches
        # (trigger `batch_gpu_no_overlap`, migration 0003, looks up by this index).
        indexes = [models.Index(fields=["gpu_uuid", "window_end"], name="batch_gpu_uuid_end_idx")]

    def __str__(self) -> str:
        return f"{self.gpu_uuid} in batch {self.batch_id}"
