"""The usage batch's JSON Schema (wire protocol v1 and v2, one of them), published in the OpenAPI document.

Built from the same bounds as validation (billing.services.ingest.batch_validation), so the schema a
client generates from and the rules the server checks cannot drift apart. Validation checks
more than a schema can say (capacity × seconds, Σ grants, windows, overlaps); the schema is the
shape and every per-field bound. OpenAPI 3.0 dialect (drf-spectacular's)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from billing.services.ingest import batch_validation as rules

__all__ = ["usage_batch_schema"]


def _name(key: str) -> dict[str, Any]:
    name = {"type": "string", "pattern": rules.NAME_PATTERN, "maxLength": rules.NAME_MAX[key]}
    if key in rules.OPTIONAL_NAMES:
        return {"anyOf": [name, {"type": "string", "maxLength": 0}]}
    return name


_TIMESTAMP = {"type": "string", "format": "date-time", "pattern": "Z$", "example": "2026-11-30T03:00:00Z",
              "description": f"ISO-8601 UTC ending in Z, years {rules.YEARS[0]} to {rules.YEARS[1]}"}
_QUANTITY = {"type": "number", "minimum": 0}


def _grouping_fields() -> dict[str, Any]:
    """The optional per-sample fields grouping reads (docs/protocol.md); old agents omit them."""
    label_key = (f"a Kubernetes label key: an optional DNS-subdomain prefix (at most {rules.LABEL_PREFIX_MAX}) "
                 f"and '/', then a name of 1 to {rules.LABEL_NAME_MAX} letters, digits and - _ . beginning and "
                 "ending with a letter or digit")
    return {
        "controller_kind": {"type": "string", "pattern": rules.CONTROLLER_KIND_PATTERN,
                            "maxLength": rules.CONTROLLER_MAX["controller_kind"], "example": "Deployment",
                            "description": "the kind of the pod's controller; given with controller_name"},
        "controller_name": {"type": "string", "pattern": rules.NAME_PATTERN,
                            "maxLength": rules.CONTROLLER_MAX["controller_name"], "example": "bert",
                            "description": "the name of the pod's controller; one per pod within a batch"},
        "labels": {"type": "object", "maxProperties": rules.MAX_LABELS,
                   "additionalProperties": {"type": "string", "maxLength": rules.LABEL_VALUE_MAX,
                                            "pattern": rules.LABEL_VALUE_PATTERN},
                   "example": {"app": "bert", "team": "search"},
                   "description": f"the pod labels the agent's allow-list names; each key is {label_key}"},
        "mem_requested_mb": {"type": "integer", "minimum": 0, "maximum": rules.CAPACITY_MAX["memory_mb"],
                             "description": "MiB the container requested per GPU, at most the GPU's memory_mb"},
        "sm_requested": {"type": "number", "minimum": 0, "maximum": rules.CAPACITY_MAX["sm_count"],
                         "description": "SMs the container requested per GPU, at most the GPU's sm_count"},
    }


def usage_batch_schema() -> dict[str, Any]:
    gpu = {
        "type": "object",
        "required": ["uuid", "model", "memory_mb", "sm_count"],
        "properties": {
            "uuid": {"type": "string", "pattern": rules.NAME_PATTERN, "maxLength": rules.UUID_MAX},
            "model": {"type": "string", "minLength": 1, "maxLength": rules.MODEL_MAX},
            **{key: {"type": "integer", "minimum": 1, "maximum": top} for key, top in rules.CAPACITY_MAX.items()},
            "energy_j": {"type": "number", "minimum": 0,
                         "description": "optional: joules the GPU drew over the whole window (NVML's energy counter, "
                                        f"or power x time); at most {rules.MAX_GPU_POWER_W} W x the window's seconds"},
        },
    }
    sample = {
        "type": "object",
        "required": ["start", "seconds", "gpu", *rules.NAME_FIELDS, *rules.QUANTITIES],
        "properties": {
            "start": _TIMESTAMP,
            "seconds": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": rules.MAX_SAMPLE_SECONDS},
            "gpu": {"type": "string", "description": "the uuid of one of $.gpus"},
            **{key: _name(key) for key in rules.NAME_FIELDS},
            **dict.fromkeys(rules.QUANTITIES, _QUANTITY),
            **_grouping_fields(),
        },
    }
    window = {
        "type": "object",
        "required": ["minute", "seconds", "gpu", *rules.NAME_FIELDS, *rules.WINDOW_QUANTITIES, *rules.WINDOW_PEAKS],
        "description": "one workload's integrals on one GPU over the seconds of one UTC minute the batch metered; "
                       "*_billed_* is the sum over its seconds of max(used, granted)",
        "properties": {
            "minute": {**_TIMESTAMP, "example": "2026-11-30T03:00:00Z", "description": "a whole UTC minute"},
            "seconds": {"type": "number", "minimum": 0, "exclusiveMinimum": True,
                        "maximum": rules.MINUTE_SECONDS},
            "gpu": {"type": "string", "description": "the uuid of one of $.gpus"},
            **{key: _name(key) for key in rules.NAME_FIELDS},
            **dict.fromkeys((*rules.WINDOW_QUANTITIES, *rules.WINDOW_PEAKS), _QUANTITY),
            **_grouping_fields(),
        },
    }
    return {"oneOf": [_batch(gpu, rules.SCHEMA, "samples", sample), _batch(gpu, rules.SCHEMA_V2, "windows", window)]}


def _batch(gpu: dict[str, Any], schema: str, key: str, item: dict[str, Any]) -> dict[str, Any]:
    """A batch of one protocol version: its header, its GPUs and its list of ``key`` (the items)."""
    return {
        "type": "object",
        "required": ["schema", "node", "batch_seq", "window", "gpus", key],
        "properties": {
            "schema": {"type": "string", "enum": [schema]},
            "node": {"type": "string", "minLength": 1, "maxLength": rules.NODE_MAX},
            "cluster": {"type": "string", "minLength": 1, "maxLength": rules.CLUSTER_MAX,
                        "pattern": rules.CLUSTER_PATTERN, "example": "prod-eu-west-1",
                        "description": "optional: the Kubernetes cluster the node is in"},
            "batch_seq": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
            "window": {"type": "object", "required": ["start", "end"],
                       "properties": {"start": _TIMESTAMP, "end": _TIMESTAMP}},
            "gpus": {"type": "array", "minItems": 1, "items": gpu},
            key: {"type": "array", "maxItems": settings.VGPU_INGEST_MAX_SAMPLES, "items": item},
        },
    }
