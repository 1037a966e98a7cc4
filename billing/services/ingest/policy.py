"""The node policy document agents poll (GET /api/v1/nodes/{node}/policy) with an ETag."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from billing.models import BudgetAction, BudgetScope, BudgetState, BudgetStatus, SlaTier, Tenant

__all__ = ["POLICY_SCHEMA", "NodePolicy", "get_node_policy"]

POLICY_SCHEMA = "vgpu-ledger/node-policy/v1"


@dataclass(frozen=True)
class NodePolicy:
    body: dict[str, Any]
    etag: str


def get_node_policy(*, node_name: str, now: datetime) -> NodePolicy:
    """SLA tiers (weight, and miss targets per resource: the share of a workload's seconds its grant
    may fall short of its use), each tenant's default tier and, for tenants and namespaces whose budget is
    enforced this month with an action a node applies, that action (`throttle`: weight × factor,
    no burst above guarantees; `evict-best-effort`; `block` is enforced at admission and listed for
    completeness). A budget that only notifies, and a label budget (which only notifies), are not
    listed: there is nothing for a node to do."""
    month = now.date().replace(day=1)
    enforced: dict[tuple[str, str], dict[str, str]] = {}
    statuses = (BudgetStatus.objects.filter(month=month, state=BudgetState.ENFORCED,
                                            budget__scope__in=[BudgetScope.TENANT, BudgetScope.NAMESPACE])
                .exclude(budget__hard_action=BudgetAction.NOTIFY).select_related("budget__tenant"))
    for s in statuses:
        key = s.budget.tenant.slug if s.budget.scope == BudgetScope.TENANT else s.budget.namespace
        enforced[(s.budget.scope, key)] = {"state": s.state, "action": s.budget.hard_action,
                                           "throttle_factor": str(s.budget.throttle_factor)}
    body: dict[str, Any] = {
        "schema": POLICY_SCHEMA,
        "node": node_name,
        "sla_tiers": {t.slug: {"weight": str(t.weight),
                               "miss_targets": {"memory": str(t.miss_target_memory), "sm": str(t.miss_target_sm)}}
                      for t in SlaTier.objects.order_by("slug")},
        "tenants": {
            t.slug: {
                "default_sla_tier": t.default_sla_tier.slug if t.default_sla_tier else None,
                "budget": enforced.get((BudgetScope.TENANT, t.slug), {"state": BudgetState.OK}),
            }
            for t in Tenant.objects.select_related("default_sla_tier").order_by("slug")
        },
        # Only namespaces whose budget is enforced: the agent treats every other one as ok.
        "namespaces": {namespace: {"budget": budget}
                       for (scope, namespace), budget in sorted(enforced.items()) if scope == BudgetScope.NAMESPACE},
    }
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return NodePolicy(body=body, etag=hashlib.sha256(canonical).hexdigest()[:32])
