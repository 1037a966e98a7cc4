from django.db import models

from billing.models.fleet import Node


class UndeliveredBatch(models.Model):
    """A batch this service refused (400/409/413/415), as its agent reported it.

    The agent keeps the batch; this row is the service's record that the usage in it is not
    billed, until a re-drive delivers it. A report is resolved (read-time, billing.queries.undelivered)
    when a stored batch of the node has the same `batch_seq` and content, or carries `superseded_by`
    (the number a re-drive renumbered it to). `(node, batch_seq)` is unique: a report sent again
    replaces the earlier one.
    """

    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="undelivered_batches")
    batch_seq = models.BigIntegerField()
    # SHA-256 of the batch's JSON after removing gzip: what UsageBatch.content_sha256 holds.
    content_sha256 = models.CharField(max_length=64)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    sample_count = models.PositiveIntegerField()
    size_bytes = models.PositiveBigIntegerField()  # the body as the agent sent it
    status_code = models.PositiveSmallIntegerField()
    reason = models.TextField()
    superseded_by = models.BigIntegerField(null=True, blank=True)
    first_reported_at = models.DateTimeField()
    last_reported_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "batch_seq"], name="undelivered_batch_node_seq_unique")]
        ordering = ["node", "batch_seq"]

    def __str__(self) -> str:
        return f"undelivered {self.node_id}/{self.batch_seq} ({self.status_code})"
