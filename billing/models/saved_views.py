from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _


class SavedView(models.Model):
    """A page a user saved under a name: its path and query string as validated when saved
    (docs/saved-views.md). `period` says how the report and the "Open" link read the period: one of
    the pages' quick periods, moved with the calendar, or the saved dates ("fixed")."""

    class Period(models.TextChoices):
        THIS_MONTH = "this-month", _("This month")
        LAST_MONTH = "last-month", _("Last month")
        LAST_7_DAYS = "last-7-days", _("Last 7 days")
        FIXED = "fixed", _("The saved dates")

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_views")
    name = models.CharField(max_length=100)
    path = models.CharField(max_length=300)
    query = models.CharField(max_length=4000, blank=True)
    period = models.CharField(max_length=12, choices=Period.choices)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="saved_view_name_per_owner")]

    def __str__(self) -> str:
        return f"{self.name} ({self.path}?{self.query})"


class ReportSchedule(models.Model):
    """When a saved view is mailed as a report: daily, weekly on `weekday` (0 Monday) or monthly on
    `day_of_month` (the month's last day when it is shorter), at `hour` UTC. `active_from` is when
    the schedule was set: an occurrence before it is never sent, so setting a schedule never sends
    one that fell before."""

    class Frequency(models.TextChoices):
        DAILY = "daily", _("Daily")
        WEEKLY = "weekly", _("Weekly")
        MONTHLY = "monthly", _("Monthly")

    class Format(models.TextChoices):
        CSV = "csv", _("CSV")

    view = models.OneToOneField(SavedView, on_delete=models.CASCADE, related_name="schedule")
    frequency = models.CharField(max_length=8, choices=Frequency.choices)
    weekday = models.PositiveSmallIntegerField(null=True, blank=True)
    day_of_month = models.PositiveSmallIntegerField(null=True, blank=True)
    hour = models.PositiveSmallIntegerField()
    format = models.CharField(max_length=8, choices=Format.choices, default=Format.CSV)
    recipients = models.JSONField(default=list)
    active_from = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.view_id} {self.frequency} {self.hour:02d}:00"


class ReportSend(models.Model):
    """One report sent (or refused, or failed) for one occurrence of a schedule. The unique pair
    (schedule, occurrence) is the claim: written in the transaction that sends, so an occurrence is
    sent at most once however many workers look. A "send now" is its own occurrence (the instant
    it was asked for)."""

    class Status(models.TextChoices):
        SENT = "sent", _("sent")
        FAILED = "failed", _("failed")
        REFUSED = "refused", _("refused")

    schedule = models.ForeignKey(ReportSchedule, on_delete=models.CASCADE, related_name="sends")
    occurrence = models.DateTimeField()
    at = models.DateTimeField()
    recipients = models.JSONField(default=list)
    status = models.CharField(max_length=8, choices=Status.choices)
    error = models.TextField(blank=True)
    period_start = models.DateField(null=True)
    period_end = models.DateField(null=True)
    trigger = models.CharField(max_length=150)  # "schedule", or who pressed "Send now"

    class Meta:
        ordering = ["-at", "-id"]
        constraints = [models.UniqueConstraint(fields=["schedule", "occurrence"], name="report_send_once")]

    def __str__(self) -> str:
        return f"{self.schedule_id} {self.occurrence:%Y-%m-%d %H:%M} {self.status}"
