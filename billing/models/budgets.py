"""Budgets: monthly spend limits that act (docs/design.md, Enforcement), on a tenant, one of its
namespaces, or its workloads carrying a label (docs/enforcement.md, Budgets by namespace and label)."""

from decimal import Decimal

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from billing.models.tenancy import Tenant


class BudgetAction(models.TextChoices):
    THROTTLE = "throttle", _("throttle")
    BLOCK = "block", _("block new GPU pods")
    EVICT_BEST_EFFORT = "evict-best-effort", _("evict best-effort pods")
    # Enforced means notified, nothing more: the only action of a label budget.
    NOTIFY = "notify", _("notify only")


class BudgetScope(models.TextChoices):
    TENANT = "tenant", _("tenant")
    NAMESPACE = "namespace", _("namespace")
    LABEL = "label", _("label")


class BudgetState(models.TextChoices):
    OK = "ok", _("ok")
    WARNED = "warned", _("warned")
    ENFORCED = "enforced", _("enforced")


class Budget(models.Model):
    """A monthly budget on a tenant's spend, or on the part of it in one namespace or on workloads
    carrying one label (scope); one budget per scope. Thresholds are percentages of `amount`."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budgets")
    scope = models.CharField(max_length=10, choices=BudgetScope.choices, default=BudgetScope.TENANT)
    namespace = models.CharField(max_length=63, blank=True)  # scope namespace: one of the tenant's
    label_key = models.CharField(max_length=317, blank=True)  # scope label: [prefix/]name, as Kubernetes
    label_value = models.CharField(max_length=63, blank=True)
    amount = models.DecimalField(max_digits=14, decimal_places=2, validators=[MinValueValidator(Decimal("0.01"))])
    currency = models.CharField(max_length=3)
    soft_threshold_pct = models.DecimalField(
        max_digits=5, decimal_places=2, default=Decimal("80"),
        validators=[MinValueValidator(Decimal("1")), MaxValueValidator(Decimal("1000"))],
    )
    hard_threshold_pct = models.DecimalField(
        max_digits=5, decimal_places=2, default=Decimal("100"),
        validators=[MinValueValidator(Decimal("1")), MaxValueValidator(Decimal("1000"))],
    )
    hard_action = models.CharField(max_length=20, choices=BudgetAction.choices, default=BudgetAction.THROTTLE)
    # Under `throttle` the tenant's SLA weight is multiplied by this factor.
    throttle_factor = models.DecimalField(
        max_digits=4, decimal_places=3, default=Decimal("0.5"),
        validators=[MinValueValidator(Decimal("0.001")), MaxValueValidator(Decimal("1"))],
    )
    # Who can raise the budget: named in admission denials and notifications.
    owner = models.CharField(max_length=200)
    notify_emails = models.TextField(blank=True, help_text=_("Comma-separated addresses"))
    webhook_url = models.URLField(max_length=500, blank=True)
    webhook_secret = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant__slug", "scope", "namespace", "label_key", "label_value"]
        constraints = [
            models.UniqueConstraint(fields=["tenant"], condition=Q(scope=BudgetScope.TENANT),
                                    name="budget_one_per_tenant"),
            models.UniqueConstraint(fields=["tenant", "namespace"], condition=Q(scope=BudgetScope.NAMESPACE),
                                    name="budget_one_per_namespace"),
            models.UniqueConstraint(fields=["tenant", "label_key", "label_value"], condition=Q(scope=BudgetScope.LABEL),
                                    name="budget_one_per_label"),
            models.CheckConstraint(
                condition=(Q(scope=BudgetScope.TENANT, namespace="", label_key="", label_value="")
                           | (Q(scope=BudgetScope.NAMESPACE, label_key="", label_value="") & ~Q(namespace=""))
                           | (Q(scope=BudgetScope.LABEL, namespace="") & ~Q(label_key=""))),
                name="budget_scope_fields"),
            # A label does not map to workloads reliably enough to act on them (docs/enforcement.md).
            models.CheckConstraint(condition=~Q(scope=BudgetScope.LABEL) | Q(hard_action=BudgetAction.NOTIFY),
                                   name="budget_label_notifies_only"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="budget_amount_positive"),
            models.CheckConstraint(condition=Q(soft_threshold_pct__lte=F("hard_threshold_pct")),
                                   name="budget_soft_not_above_hard"),
            models.CheckConstraint(condition=Q(throttle_factor__gt=0) & Q(throttle_factor__lte=1),
                                   name="budget_throttle_factor_0_1"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.scope_text}: {self.amount} {self.currency}/month"

    @property
    def scope_text(self) -> str:
        """The scope as one string: "", "namespace acme-prod", "label team=ml"."""
        if self.scope == BudgetScope.NAMESPACE:
            return f"namespace {self.namespace}"
        if self.scope == BudgetScope.LABEL:
            return f"label {self.label_key}={self.label_value}"
        return ""


class BudgetStatus(models.Model):
    """Where a budget stands in one month; a new month starts a new row in state ok.

    `forecast_over_budget` is a warning beside the state, never a state: the forecast exceeded the
    amount while the state was ok or warned. Enforcement (the node policy, admission) reads `state`
    only, so the flag cannot change what a node or the admission webhook does; an enforced budget
    never carries it (its own notification already said more)."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="statuses")
    month = models.DateField()
    state = models.CharField(max_length=10, choices=BudgetState.choices, default=BudgetState.OK)
    spend = models.DecimalField(max_digits=30, decimal_places=12, default=Decimal(0))
    forecast = models.DecimalField(max_digits=30, decimal_places=12, default=Decimal(0))
    forecast_over_budget = models.BooleanField(default=False)
    evaluated_at = models.DateTimeField()
    changed_at = models.DateTimeField()

    class Meta:
        ordering = ["-month"]
        constraints = [
            models.UniqueConstraint(fields=["budget", "month"], name="budget_status_month_unique"),
            models.CheckConstraint(condition=~(Q(forecast_over_budget=True) & Q(state=BudgetState.ENFORCED)),
                                   name="budget_status_forecast_over_not_enforced"),
        ]

    def __str__(self) -> str:
        return f"{self.budget_id} {self.month:%Y-%m} {self.state}"


class AdmittedPod(models.Model):
    """A pod the admission webhook admitted with structured GPU guarantees; the sum per tenant is
    checked against its quota. Rows leave when the webhook sees the pod's DELETE."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="admitted_pods")
    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64, unique=True)
    guaranteed_mem_mb = models.PositiveBigIntegerField()
    guaranteed_sm = models.DecimalField(max_digits=12, decimal_places=3)
    admitted_at = models.DateTimeField()

    class Meta:
        ordering = ["tenant_id", "namespace", "name"]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"
