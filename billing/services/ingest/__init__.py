"""Ingest: what nodes send and what becomes of it. Usage batches (validated against the published
schema, attributed to tenants by the service's own namespace mapping, stored once), the agents' other
reports (enforcement events, undelivered batches), the policy document agents poll, and the rollup as
the service runs it (the ledger's, with every quarantined batch audited and re-drivable).

The facade: code outside this package imports from here, never from its modules."""

from __future__ import annotations

from billing.services.ingest.api_schemas import (
    admission_reply_schema,
    admission_review_schema,
    node_events_schema,
    node_policy_schema,
    undelivered_report_schema,
)
from billing.services.ingest.batch_schema import usage_batch_schema
from billing.services.ingest.batch_validation import label_problem
from billing.services.ingest.batches import decode_body, record_usage_batch
from billing.services.ingest.node_events import record_node_events
from billing.services.ingest.policy import get_node_policy
from billing.services.ingest.rollup import redrive_batches, run_rollup
from billing.services.ingest.tenant_mapping import (
    count_claim_mismatches_by_node,
    set_tenant_namespaces,
    tenant_namespaces,
)
from billing.services.ingest.undelivered import record_undelivered_batches

__all__ = [
    "admission_reply_schema",
    "admission_review_schema",
    "count_claim_mismatches_by_node",
    "decode_body",
    "get_node_policy",
    "label_problem",
    "node_events_schema",
    "node_policy_schema",
    "record_node_events",
    "record_undelivered_batches",
    "record_usage_batch",
    "redrive_batches",
    "run_rollup",
    "set_tenant_namespaces",
    "tenant_namespaces",
    "undelivered_report_schema",
    "usage_batch_schema",
]
