"""The node policy document agents poll (GET /api/v1/nodes/{node}/policy) with an ETag."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from billing.models import BudgetState, BudgetStatus, SlaTier, Tenant

__all__ = ["POLICY_SCHEMA", "NodePolicy", "get_node_policy"]

POLICY_SCHEMA = "vgpu-ledger/node-policy/v1"


@dataclass(frozen=True)
class NodePolicy:
    body: dict[str, Any]
    etag: str


def get_node_policy(*, node_name: str, now: datetime) -> NodePolicy:
    """SLA tiers, each tenant's default tier and, for tenants whose budget is enforced this
    month, the action agents apply (`throttle`: weight × factor, no burst above guarantees;
    `evict-best-effort`; `block` is enforced at admission and listed for completeness)."""
    month = now.date().replace(day=1)
    enforced = {
        s.budget.tenant.slug: {
            "state": s.state,
            "action": s.budget.hard_action,
            "throttle_factor": str(s.budget.throttle_factor),
        }
        for s in BudgetStatus.objects.filter(month=month, state=BudgetState.ENFORCED).select_related("budget__tenant")
    }
    body: dict[str, Any] = {
        "schema": POLICY_SCHEMA,
        "node": node_name,
        "sla_tiers": {t.slug: {"weight": str(t.weight)} for t in SlaTier.objects.order_by("slug")},
        "tenants": {
            t.slug: {
                "default_sla_tier": t.default_sla_tier.slug if t.default_sla_tier else None,
                "budget": enforced.get(t.slug, {"state": BudgetState.OK}),
            }
            for t in Tenant.objects.select_related("default_sla_tier").order_by("slug")
        },
    }
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return NodePolicy(body=body, etag=hashlib.sha256(canonical).hexdigest()[:32])
