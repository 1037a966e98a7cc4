"""The node policy document agents poll (GET /api/v1/nodes/{node}/policy) with an ETag."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from billing.models import SlaTier, Tenant

__all__ = ["NodePolicy", "POLICY_SCHEMA", "get_node_policy"]

POLICY_SCHEMA = "vgpu-ledger/node-policy/v1"


@dataclass(frozen=True)
class NodePolicy:
    body: dict[str, Any]
    etag: str


def get_node_policy(*, node_name: str) -> NodePolicy:
    body: dict[str, Any] = {
        "schema": POLICY_SCHEMA,
        "node": node_name,
        "sla_tiers": {t.slug: {"weight": str(t.weight)} for t in SlaTier.objects.order_by("slug")},
        "tenants": {
            t.slug: {"default_sla_tier": t.default_sla_tier.slug if t.default_sla_tier else None}
            for t in Tenant.objects.select_related("default_sla_tier").order_by("slug")
        },
    }
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return NodePolicy(body=body, etag=hashlib.sha256(canonical).hexdigest()[:32])
