"""Alerts beyond budgets: spend anomalies, idle share, over-granting (docs/alerts.md).

A rule says what to watch and whom to tell; each alert it raised is an AlertEvent (the history,
and what each delivery did). Idle share and over-granting are conditions over a trailing window
and keep one AlertState per rule and scope, so they alert once per crossing above the threshold;
an anomaly is a period, alerted once per run of anomalous periods (the event's unique key)."""

from decimal import Decimal

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from billing.models.tenancy import Tenant


class AlertKind(models.TextChoices):
    SPEND_ANOMALY = "spend_anomaly", _("spend anomaly")
    IDLE_SHARE = "idle_share", _("idle share")
    OVER_GRANTING = "over_granting", _("over-granting")


class AlertGrouping(models.TextChoices):
    TENANT = "tenant", _("per tenant")
    NAMESPACE = "namespace", _("per namespace")
    FLEET = "fleet", _("the whole fleet")
    NODE = "node", _("per node")
    CONTROLLER = "controller", _("per workload (controller)")


class AlertGranularity(models.TextChoices):
    HOUR = "hour", _("hour")
    DAY = "day", _("day")


class AlertResource(models.TextChoices):
    MEMORY = "memory", _("GPU memory")
    SM = "sm", _("SMs")


class AlertRule(models.Model):
    """What to watch and whom to tell. The fields a kind does not use keep their defaults; the
    service checks each kind's (billing.services.alerts.rules)."""

    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=20, choices=AlertKind.choices)
    # Only this tenant's usage (anomaly, over-granting); None: every tenant's.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="alert_rules")
    group_by = models.CharField(max_length=12, choices=AlertGrouping.choices)
    granularity = models.CharField(max_length=4, choices=AlertGranularity.choices, default=AlertGranularity.HOUR)
    baseline_weeks = models.PositiveSmallIntegerField(default=4)  # anomaly: the same period of this many weeks back
    # Anomaly: the robust z-score; idle share: percent of the cards' cost; over-granting: granted ÷ used.
    threshold = models.DecimalField(max_digits=8, decimal_places=3)
    # The floor below which nothing alerts, in `currency`: anomaly, spend above the baseline's median
    # in the period; idle share, idle cost in the window; over-granting, the workload's cost in it.
    min_amount = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal(0))
    currency = models.CharField(max_length=3, default="USD")
    window_hours = models.PositiveIntegerField(default=24)  # idle share, over-granting: the trailing window
    resource = models.CharField(max_length=6, choices=AlertResource.choices, default=AlertResource.MEMORY)
    notify_emails = models.TextField(blank=True)
    webhook_url = models.URLField(max_length=500, blank=True)
    webhook_secret = models.CharField(max_length=200, blank=True)
    # A Slack (or Slack-compatible) incoming webhook: its URL is its credential, never shown back.
    slack_webhook_url = models.URLField(max_length=500, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["name", "pk"]
        constraints = [
            models.CheckConstraint(condition=Q(threshold__gt=0), name="alert_rule_threshold_positive"),
            models.CheckConstraint(condition=Q(min_amount__gte=0), name="alert_rule_min_amount_not_negative"),
            models.CheckConstraint(condition=Q(baseline_weeks__gte=3, baseline_weeks__lte=12),
                                   name="alert_rule_baseline_weeks_3_12"),
            models.CheckConstraint(condition=Q(window_hours__gte=1, window_hours__lte=24 * 31),
                                   name="alert_rule_window_1h_31d"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class AlertState(models.Model):
    """Whether a level condition (idle share, over-granting) holds for one rule and scope now, as
    the last evaluation found it; a crossing above alerts once, a crossing back is audited."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="states")
    key = models.CharField(max_length=600)
    firing = models.BooleanField(default=False)
    value = models.DecimalField(max_digits=30, decimal_places=12, default=Decimal(0))
    evaluated_at = models.DateTimeField()
    changed_at = models.DateTimeField()

    class Meta:
        ordering = ["rule_id", "key"]
        constraints = [models.UniqueConstraint(fields=["rule", "key"], name="alert_state_rule_key_unique")]

    def __str__(self) -> str:
        return f"{self.rule_id} {self.key} {'firing' if self.firing else 'ok'}"


class AlertEvent(models.Model):
    """One alert raised: what was found, where Explore shows it, and when each way of telling
    people was done (a delivery task run twice sends once)."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=20, choices=AlertKind.choices)
    key = models.CharField(max_length=600)  # the scope: acme, acme/acme-prod, fleet, node sim-a100-1, ...
    # The anomalous period, or the trailing window of a level condition.
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    value = models.DecimalField(max_digits=30, decimal_places=12)  # spend, idle %, or granted ÷ used
    baseline = models.DecimalField(max_digits=30, decimal_places=12, null=True)  # anomaly: the baseline's median
    score = models.DecimalField(max_digits=14, decimal_places=3, null=True)  # anomaly: the robust z-score
    currency = models.CharField(max_length=3, blank=True)
    details = models.JSONField(default=dict)  # the figures and the method, as the messages state them
    explore_path = models.CharField(max_length=2000)
    fired_at = models.DateTimeField()
    email_sent_at = models.DateTimeField(null=True, blank=True)
    webhook_sent_at = models.DateTimeField(null=True, blank=True)
    slack_sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-fired_at", "-pk"]
        constraints = [
            # An anomaly is alerted once per run of anomalous periods: the run's first period.
            models.UniqueConstraint(fields=["rule", "key", "period_start"], condition=Q(kind=AlertKind.SPEND_ANOMALY),
                                    name="alert_event_anomaly_once"),
        ]
        indexes = [models.Index(fields=["fired_at"], name="alert_event_fired_idx")]

    def __str__(self) -> str:
        return f"{self.rule_id} {self.kind} {self.key} {self.period_start:%Y-%m-%d %H:%M}"
