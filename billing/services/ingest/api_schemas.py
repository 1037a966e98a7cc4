"""JSON Schemas of the agent API's other bodies and of the admission webhook's, published in the
OpenAPI document (billing.api.openapi); the usage batch's is billing.services.ingest.batch_schema.

Each is built from the bounds its validator checks (the constants beside record_node_events,
record_undelivered_batches, get_node_policy, review_pod), so the document and the rules cannot
drift apart. The validators check more than a schema says (instants in the future, NUL and lone
surrogates, nesting depth, duplicates); a schema is the shape and the per-field bounds.
OpenAPI 3.0 dialect (drf-spectacular's)."""

from __future__ import annotations

from typing import Any

from billing.models import AdmittedPod, BudgetAction, BudgetState
from billing.services.ingest import node_events, undelivered
from billing.services.ingest.policy import POLICY_SCHEMA
from billing.services.input_limits import max_length

__all__ = [
    "admission_reply_schema",
    "admission_review_schema",
    "node_events_schema",
    "node_policy_schema",
    "undelivered_report_schema",
]

_BIGINT = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
_UTC_INSTANT = {"type": "string", "format": "date-time", "pattern": "Z$", "example": "2026-11-30T03:00:00Z",
                "description": "ISO-8601 UTC ending in Z, as in a batch's window"}


def node_events_schema() -> dict[str, Any]:
    event = {
        "type": "object",
        "required": ["at", "action", "target"],
        "properties": {
            "at": {"type": "string", "format": "date-time", "example": "2026-11-30T03:00:05Z",
                   "description": "ISO-8601 instant of the action; at most 5 minutes ahead of the service's clock"},
            "action": {"type": "string", "enum": sorted(node_events.AGENT_ACTIONS),
                       "description": "an action an agent takes, stored as agent.<action>; any other is a 400",
                       "example": "watchdog.evicted"},
            "target": {"type": "string", "minLength": 1, "maxLength": node_events.TARGET_MAX,
                       "example": "acme-prod/bert-1"},
            "detail": {"type": "object", "description": f"any JSON object, nested at most "
                                                        f"{node_events.DETAIL_MAX_DEPTH} levels"},
        },
    }
    return {"type": "object", "required": ["events"], "properties": {
        "events": {"type": "array", "minItems": 1, "maxItems": node_events.MAX_EVENTS, "items": event}}}


def undelivered_report_schema() -> dict[str, Any]:
    report = {
        "type": "object",
        "required": ["batch_seq", "window", "samples", "size_bytes", "status", "reason", "content_sha256"],
        "properties": {
            "batch_seq": _BIGINT,
            "window": {"type": "object", "required": ["start", "end"],
                       "properties": {"start": _UTC_INSTANT, "end": _UTC_INSTANT},
                       "description": "start before end"},
            "samples": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
            "size_bytes": _BIGINT,
            "status": {"type": "integer", "minimum": 400, "maximum": 499,
                       "description": "the service's answer to the batch"},
            "reason": {"type": "string", "maxLength": undelivered.MAX_REASON_CHARS},
            "content_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$",
                               "description": "SHA-256 of the batch JSON after removing gzip"},
            "superseded_by": {**_BIGINT, "nullable": True,
                              "description": "the batch_seq a re-drive renumbered it to (not batch_seq itself)"},
        },
    }
    return {"type": "object", "required": ["batches"], "properties": {
        "batches": {"type": "array", "minItems": 1, "maxItems": undelivered.MAX_REPORTS, "items": report}}}


def node_policy_schema() -> dict[str, Any]:
    budget = {
        "type": "object",
        "required": ["state"],
        "properties": {
            "state": {"type": "string", "enum": list(BudgetState.values)},
            "action": {"type": "string", "enum": [a for a in BudgetAction.values if a != BudgetAction.NOTIFY],
                       "description": "present when the budget is enforced this month with an action a node "
                                      "applies (a budget that only notifies is listed as ok)"},
            "throttle_factor": {"type": "string", "description": "a decimal, for action throttle"},
        },
    }
    share = {"type": "string", "description": "a decimal in (0, 1): a share of workload-seconds"}
    miss_targets = {
        "type": "object", "required": ["memory", "sm"],
        "description": "the share of the tier's workload-seconds whose use may exceed the grant, per resource: "
                       "memory (an out-of-memory failure) and SMs (a slowdown); an agent calibrates each "
                       "workload's margin toward them. A service that predates them omits this object.",
        "properties": {"memory": {**share, "example": "0.0000010000"}, "sm": {**share, "example": "0.0000100000"}},
    }
    tenant = {"type": "object", "required": ["default_sla_tier", "budget"], "properties": {
        "default_sla_tier": {"type": "string", "nullable": True}, "budget": budget}}
    return {
        "type": "object",
        "required": ["schema", "node", "sla_tiers", "tenants"],
        "properties": {
            "schema": {"type": "string", "enum": [POLICY_SCHEMA]},
            "node": {"type": "string"},
            "sla_tiers": {"type": "object", "description": "by tier slug", "additionalProperties": {
                "type": "object", "required": ["weight"],
                "properties": {"weight": {"type": "string", "description": "a decimal", "example": "4.000"},
                               "miss_targets": miss_targets}}},
            "tenants": {"type": "object", "description": "by tenant slug", "additionalProperties": tenant},
            "namespaces": {"type": "object", "description": "by namespace: only those whose own budget is "
                                                            "enforced this month (every other namespace is ok)",
                           "additionalProperties": {"type": "object", "required": ["budget"],
                                                    "properties": {"budget": budget}}},
        },
    }


def admission_review_schema() -> dict[str, Any]:
    """What the webhook requires of an admission.k8s.io/v1 AdmissionReview. It reads more
    (request.kind, operation, namespace, dryRun, object, oldObject) and tolerates whatever it does
    not use, as the API server may send more than this version knows; so only what it refuses is
    stated as a rule, the rest is described."""
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "request"],
        "properties": {
            "apiVersion": {"type": "string", "enum": ["admission.k8s.io/v1"]},
            "kind": {"type": "string", "enum": ["AdmissionReview"]},
            "request": {
                "type": "object",
                "required": ["uid"],
                "description": "Reviewed: Pods (request.kind.kind) on CREATE (budgets that block, GPU quotas) and "
                               f"DELETE (frees the pod's quota). request.namespace (at most "
                               f"{max_length(AdmittedPod, 'namespace')} characters), object.metadata.name (at most "
                               f"{max_length(AdmittedPod, 'name')}) and .uid (at most {max_length(AdmittedPod, 'uid')}), "
                               "when given, are strings without NUL or lone surrogates, or the review answers 400.",
                "properties": {"uid": {"type": "string", "maxLength": 200}},
            },
        },
    }


def admission_reply_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "response"],
        "properties": {
            "apiVersion": {"type": "string", "enum": ["admission.k8s.io/v1"]},
            "kind": {"type": "string", "enum": ["AdmissionReview"]},
            "response": {
                "type": "object",
                "required": ["uid", "allowed"],
                "properties": {
                    "uid": {"type": "string"},
                    "allowed": {"type": "boolean"},
                    "status": {"type": "object", "properties": {
                        "code": {"type": "integer"}, "reason": {"type": "string"}, "message": {"type": "string"}}},
                    "warnings": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    }
