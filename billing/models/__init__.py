"""ORM models only; rules live in billing.services (writes) and billing.queries (reads)."""

from billing.ledger.models import BatchGpu, GpuDay, GpuHour, GpuMinute, UsageBatch, UsageDay, UsageHour, UsageMinute
from billing.models.accounts import UserPreference
from billing.models.audit import AuditEvent
from billing.models.budgets import AdmittedPod, Budget, BudgetAction, BudgetState, BudgetStatus
from billing.models.fleet import Gpu, Node, NodeToken
from billing.models.invoicing import BillingPeriod, Invoice, InvoiceLine
from billing.models.pricing import BilledBasis, IdlePolicy, RateCard
from billing.models.rebalance import RebalancePlan, RebalanceStatus
from billing.models.reports import PairedReport
from billing.models.tenancy import SlaTier, Tenant, TenantMembership
from billing.models.undelivered import UndeliveredBatch

__all__ = [
    "AdmittedPod",
    "AuditEvent",
    "BatchGpu",
    "BillingPeriod",
    "Budget",
    "BudgetAction",
    "BudgetState",
    "BudgetStatus",
    "BilledBasis",
    "Gpu",
    "GpuDay",
    "GpuHour",
    "GpuMinute",
    "IdlePolicy",
    "Invoice",
    "InvoiceLine",
    "Node",
    "NodeToken",
    "PairedReport",
    "RateCard",
    "RebalancePlan",
    "RebalanceStatus",
    "SlaTier",
    "Tenant",
    "TenantMembership",
    "UndeliveredBatch",
    "UsageBatch",
    "UserPreference",
    "UsageDay",
    "UsageHour",
    "UsageMinute",
]
