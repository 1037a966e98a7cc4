from django.conf import settings
from django.db import models


class AuditEvent(models.Model):
    """Append-only record of every admin change and every enforcement action.

    Written in the same transaction as the change it records.
    """

    at = models.DateTimeField(db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True)
    # Who acted when there is no user: "node:gpu-node-1", "cli", "system".
    actor_label = models.CharField(max_length=200)
    action = models.CharField(max_length=100, db_index=True)
    object_type = models.CharField(max_length=100)
    object_id = models.CharField(max_length=200)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action} {self.object_type}:{self.object_id}"
