"""Paired static-vs-dynamic cost reports (docs/billing.md), computed by a Celery job."""

from datetime import date

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from billing import calendar


class PairedReport(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", _("pending")
        RUNNING = "running", _("running")
        DONE = "done", _("done")
        FAILED = "failed", _("failed")

    created_at = models.DateTimeField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    progress_pct = models.PositiveSmallIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=models.Q(period_end__gt=models.F("period_start")),
                                   name="paired_report_period_ordered"),
        ]

    def __str__(self) -> str:
        return f"paired report {self.pk} {self.period_start:%Y-%m-%d}..{self.last_day:%Y-%m-%d} {self.status}"

    @property
    def last_day(self) -> date:
        """The period's last day, included: the form asks "to 2026-12-01 inclusive" and stores the
        instant after it, 2026-12-02 00:00, as `period_end`."""
        return calendar.last_day(self.period_end)
