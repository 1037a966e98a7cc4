"""ORM models only; rules live in billing.services (writes) and billing.queries (reads).

The ledger's models (billing.ledger.models) are imported here for Django's registration only and
are not part of this package's API: every read and write of them goes through billing.ledger
(pyproject.toml's import-linter contracts, tests/test_layering.py).
"""

# Registration only (Django finds a model when its module is imported).
from billing.ledger import models as _ledger_models  # noqa: F401 - imported to register the ledger's models with Django
from billing.models.accounts import ApiToken, UserPreference
from billing.models.alerts import (
    AlertEvent,
    AlertGranularity,
    AlertGrouping,
    AlertKind,
    AlertResource,
    AlertRule,
    AlertState,
)
from billing.models.audit import AuditEvent
from billing.models.budgets import AdmittedPod, Budget, BudgetAction, BudgetScope, BudgetState, BudgetStatus
from billing.models.exports import ExportDelivery, ExportDestination
from billing.models.fleet import Gpu, Location, LocationRate, Node, NodeLocation, NodeToken
from billing.models.invoicing import (
    BillingPeriod,
    CreditNote,
    Invoice,
    InvoiceLine,
    InvoiceStatusChange,
    InvoiceWorkload,
)
from billing.models.pricing import BilledBasis, Commitment, CommitmentKind, GpuModel, IdlePolicy, RateCard
from billing.models.rebalance import RebalancePlan, RebalanceStatus
from billing.models.reports import PairedReport
from billing.models.saved_views import ReportSchedule, ReportSend, SavedView
from billing.models.tenancy import SlaTier, Tenant, TenantMembership
from billing.models.undelivered import UndeliveredBatch

__all__ = [
    "AdmittedPod",
    "AlertEvent",
    "AlertGranularity",
    "AlertGrouping",
    "AlertKind",
    "AlertResource",
    "AlertRule",
    "AlertState",
    "ApiToken",
    "AuditEvent",
    "BilledBasis",
    "BillingPeriod",
    "Budget",
    "BudgetAction",
    "BudgetScope",
    "BudgetState",
    "BudgetStatus",
    "Commitment",
    "CommitmentKind",
    "CreditNote",
    "ExportDelivery",
    "ExportDestination",
    "Gpu",
    "GpuModel",
    "IdlePolicy",
    "Invoice",
    "InvoiceLine",
    "InvoiceStatusChange",
    "InvoiceWorkload",
    "Location",
    "LocationRate",
    "Node",
    "NodeLocation",
    "NodeToken",
    "PairedReport",
    "RateCard",
    "RebalancePlan",
    "RebalanceStatus",
    "ReportSchedule",
    "ReportSend",
    "SavedView",
    "SlaTier",
    "Tenant",
    "TenantMembership",
    "UndeliveredBatch",
    "UserPreference",
]
