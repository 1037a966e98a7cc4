"""How much the ledger's columns hold, for validation at the edges: an input either fits the
column it lands in or is refused with a 4xx that names the field (billing.services.input_limits,
batch_validation), never a 500 from the database. Reads model metadata, never queries.

`max_length` and `integer_max` read any model's column; the ledger's own bounds are named below
so no module outside the ledger needs its models.
"""

from __future__ import annotations

from django.db import connection, models

from billing.ledger.models import BatchGpu, Card, UsageMinute, Workload, WorkloadMeta

__all__ = ["gpu_capacity_max", "gpu_model_max_length", "gpu_uuid_max_length", "integer_max", "max_length",
           "workload_meta_max_length", "workload_name_max_length"]


def max_length(model: type[models.Model], field: str) -> int:
    """The length of a character column."""
    length = model._meta.get_field(field).max_length  # type: ignore[union-attr]  # CharField has it
    if not isinstance(length, int):
        raise TypeError(f"{model.__name__}.{field} has no max_length")
    return length


def integer_max(model: type[models.Model], field: str) -> int:
    """The largest value an integer column holds (int4 for PositiveIntegerField, and so on)."""
    internal_type = model._meta.get_field(field).get_internal_type()  # type: ignore[union-attr]  # a Field
    _, upper = connection.ops.integer_field_range(internal_type)
    if upper is None:
        raise TypeError(f"{model.__name__}.{field} is not an integer column")
    return int(upper)


def workload_name_max_length(field: str) -> int:
    """A workload name (tenant, namespace, pod, container, pod_uid, sla_tier) as every ledger
    table and the raw samples store it: they share the minute store's workload table's widths."""
    width = max_length(Workload, field)
    if width != max_length(UsageMinute, field):
        raise TypeError(f"UsageMinute.{field} must have billing_workload's width")
    return width


def gpu_uuid_max_length() -> int:
    return max_length(Card, "gpu_uuid")


def gpu_model_max_length() -> int:
    return max_length(Card, "gpu_model")


def gpu_capacity_max(field: str) -> int:
    """The largest declared capacity a batch GPU row holds ("memory_mb" or "sm_count")."""
    return integer_max(BatchGpu, field)


def workload_meta_max_length(field: str) -> int:
    """A workload's controller as WorkloadMeta stores it ("controller_kind" or "controller_name")."""
    return max_length(WorkloadMeta, field)
