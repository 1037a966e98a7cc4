from django.db import models
from django.utils.translation import gettext_lazy as _


class ExportDestination(models.Model):
    """An S3-compatible bucket the fleet's FOCUS dataset is delivered to (docs/exports.md, Delivery to
    object storage). The access key is sealed (billing.services.exports.credentials) and never shown
    back beyond `access_key_hint`; empty `credentials` means the worker's own (an IAM role, the
    environment). A retired destination keeps its delivery history and gets nothing more."""

    name = models.CharField(max_length=100, unique=True)
    endpoint_url = models.CharField(max_length=500, blank=True, help_text=_("Empty: Amazon S3"))
    region = models.CharField(max_length=32)
    bucket = models.CharField(max_length=63)
    prefix = models.CharField(max_length=512, blank=True)
    credentials = models.TextField(blank=True)
    access_key_hint = models.CharField(max_length=8, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField()
    created_by = models.CharField(max_length=150)
    updated_at = models.DateTimeField()
    updated_by = models.CharField(max_length=150)
    retired_at = models.DateTimeField(null=True, blank=True)
    retired_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} (s3://{self.bucket}/{self.prefix})"


class ExportDelivery(models.Model):
    """One delivery of one month's dataset to one destination: what was uploaded (object keys with
    their SHA-256), or that nothing had changed, or why it failed."""

    class Status(models.TextChoices):
        DELIVERED = "delivered", _("delivered")
        UNCHANGED = "unchanged", _("unchanged")
        FAILED = "failed", _("failed")

    destination = models.ForeignKey(ExportDestination, on_delete=models.PROTECT, related_name="deliveries")
    month = models.DateField()
    at = models.DateTimeField()
    status = models.CharField(max_length=10, choices=Status.choices)
    objects_written = models.JSONField(default=list)
    rows = models.PositiveIntegerField(default=0)
    final = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    trigger = models.CharField(max_length=150)  # "schedule", or who asked for it

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["destination", "-at"], name="export_delivery_recent_idx")]

    def __str__(self) -> str:
        return f"{self.destination_id} {self.month:%Y-%m} {self.status}"
