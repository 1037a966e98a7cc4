"""Which tenant a sample is billed to: the service's own namespace → tenant mapping, not the node's word.

An agent names a tenant in every sample (its namespace's label vgpu-ledger.io/tenant, else the
namespace name, agents/attribution.py), but a node must not be able to bill one tenant's usage to
another, or invent tenants, by what it writes there. The rule, applied at ingest to every sample:

1. a namespace an admin listed on a tenant (Tenant.namespaces, the tenant's billing page) is that
   tenant's; listed on several, the tenant created first;
2. otherwise, with VGPU_TENANT_UNMAPPED = "namespace", the tenant is the namespace name, as the
   agent's own fallback says: a namespace named like a tenant's slug is that tenant's, and the
   agent's `unattributed` namespace stays the `unattributed` tenant;
   with "claim" (opt-in, for a deployment that has not yet listed its namespaces), the node's claim
   stands for a namespace no tenant lists.

A sample whose claim differs from the tenant it is billed to is counted on its node
(Node.tenant_claim_mismatches; the nodes page and /metrics show it).
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import F

from billing.errors import InvalidInput
from billing.ledger.batches import ValidatedBatch
from billing.models import Node, Tenant
from billing.services.audit import record_audit_event

__all__ = ["TENANT_COLUMN", "UNMAPPED_RULES", "count_claim_mismatches_by_node", "map_batch_tenants",
           "namespace_tenants", "note_claim_mismatches", "set_tenant_namespaces", "tenant_for", "tenant_namespaces"]

UNMAPPED_RULES = ("claim", "namespace")
_NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a Kubernetes namespace: a DNS label
# Positions in a ValidatedBatch row: (gpu_uuid, start, seconds, tenant, namespace, pod, ...).
TENANT_COLUMN, _NAMESPACE_COLUMN = 3, 4


def namespace_tenants() -> dict[str, str]:
    """Every namespace an admin listed on a tenant → that tenant's slug (one small query)."""
    mapping: dict[str, str] = {}
    for slug, namespaces in Tenant.objects.order_by("pk").values_list("slug", "namespaces"):
        for namespace in namespaces:
            mapping.setdefault(namespace, slug)  # the first tenant to list it keeps it
    return mapping


def tenant_namespaces(slug: str) -> list[str]:
    """The namespaces whose usage is billed to tenant `slug` by the rule above: those listed on it
    (and on no tenant created before it), and, under VGPU_TENANT_UNMAPPED = "namespace", the one
    named like its slug when no tenant lists that. Sorted."""
    mapping = namespace_tenants()
    listed = {namespace for namespace, tenant in mapping.items() if tenant == slug}
    if settings.VGPU_TENANT_UNMAPPED == "namespace" and slug not in mapping:
        listed.add(slug)
    return sorted(listed)


def tenant_for(namespace: str, claim: str, mapping: dict[str, str]) -> str:
    mapped = mapping.get(namespace)
    if mapped is not None:
        return mapped
    return namespace if settings.VGPU_TENANT_UNMAPPED == "namespace" else claim


def map_batch_tenants(batch: ValidatedBatch) -> tuple[ValidatedBatch, int]:
    """The batch with each row's tenant set by the mapping, and how many rows claimed another."""
    if not batch.rows:
        return batch, 0
    mapping = namespace_tenants()
    rows, mismatches = [], 0
    decided: dict[tuple[str, str], str] = {}  # (namespace, claim) -> tenant; a batch repeats few pairs
    for row in batch.rows:
        key = (row[_NAMESPACE_COLUMN], row[TENANT_COLUMN])
        tenant = decided.get(key)
        if tenant is None:
            tenant = decided[key] = tenant_for(key[0], key[1], mapping)
        if tenant != key[1]:
            mismatches += 1
            rows.append((*row[:TENANT_COLUMN], tenant, *row[TENANT_COLUMN + 1:]))
        else:
            rows.append(row)
    return (replace(batch, rows=rows) if mismatches else batch), mismatches


def note_claim_mismatches(node: Node, count: int, *, now: datetime) -> None:
    """Count on the node the sample rows whose tenant claim the mapping overrode (one UPDATE)."""
    if count:
        Node.objects.filter(pk=node.pk).update(tenant_claim_mismatches=F("tenant_claim_mismatches") + count,
                                               last_tenant_claim_mismatch_at=now)


def count_claim_mismatches_by_node() -> dict[str, int]:
    """Overridden tenant claims per node name, for /metrics; nodes with none are absent."""
    rows = Node.objects.filter(tenant_claim_mismatches__gt=0).order_by("name")
    return dict(rows.values_list("name", "tenant_claim_mismatches"))


def set_tenant_namespaces(*, slug: str, namespaces: list[str], now: datetime, actor_label: str,
                          actor_id: int | None = None) -> list[str]:
    """Replace the namespaces a tenant owns (admins and `manage.py tenant_namespaces`), audited.

    A namespace belongs to one tenant: listing one another tenant lists is refused, so the mapping
    never depends on which tenant came first."""
    wanted = sorted({n.strip() for n in namespaces if n.strip()})
    bad = [n for n in wanted if not _NAMESPACE_RE.fullmatch(n)]
    if bad:
        raise InvalidInput(f"not Kubernetes namespace names (lower-case DNS labels of at most 63): {', '.join(bad)}")
    with transaction.atomic():
        tenant = Tenant.objects.select_for_update().filter(slug=slug).first()
        if tenant is None:
            raise InvalidInput(f"no tenant {slug!r}")
        taken = sorted({f"{n} ({other})" for other, listed in
                        Tenant.objects.exclude(pk=tenant.pk).values_list("slug", "namespaces")
                        for n in listed if n in wanted})
        if taken:
            raise InvalidInput(f"listed by another tenant already: {', '.join(taken)}")
        before = list(tenant.namespaces)
        if sorted(before) == wanted:
            return wanted
        tenant.namespaces = wanted
        tenant.save(update_fields=["namespaces"])
        record_audit_event(at=now, actor_label=actor_label, actor_id=actor_id, action="tenant.namespaces_changed",
                           object_type="tenant", object_id=slug, before={"namespaces": before},
                           after={"namespaces": wanted})
    return wanted
