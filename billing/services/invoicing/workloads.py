"""An invoice's usage by workload (docs/billing.md, Workload breakdown): the amount of each usage
line, as rounded once on the invoice, split over the namespaces and workloads of its GPU model and
SLA tier in proportion to their exact charges by the largest remainder (`billing.money.apportion`,
the rule the drill-downs of `billing.figures` follow), then summed per namespace, workload and GPU
model. So the workloads add up to the invoice's usage lines exactly, to the cent, and each is within
a minor unit of its exact charge. The GPU-hours are split the same way from the lines' stored
GPU-hours (6 places). Pure: the close reads the rows (billing.ledger.invoice_workloads) and stores
the result with the lines."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from billing.ledger.invoice_workloads import InvoiceWorkloadRow
from billing.money import apportion, minor_unit_exponent

__all__ = ["GPU_HOURS_STORED_PLACES", "UsageLineTotal", "WorkloadAmount", "split_by_workload"]

# InvoiceLine.gpu_hours and InvoiceWorkload.gpu_hours keep 6 places.
GPU_HOURS_STORED_PLACES = 6


@dataclass(frozen=True)
class UsageLineTotal:
    """One usage line as the invoice states it."""

    gpu_model: str
    sla_tier: str
    gpu_hours: Decimal
    amount_minor: int


@dataclass(frozen=True)
class WorkloadAmount:
    namespace: str
    workload: str
    gpu_model: str
    gpu_hours: Decimal
    amount_minor: int


def split_by_workload(lines: Sequence[UsageLineTotal], rows: Sequence[InvoiceWorkloadRow],
                      currency: str) -> list[WorkloadAmount]:
    """The usage lines split by workload (module docstring), ordered by GPU model, namespace, workload.
    A line whose usage has no workload rows is refused (ValueError): its amount would be lost."""
    places = minor_unit_exponent(currency)
    by_line: dict[tuple[str, str], list[InvoiceWorkloadRow]] = defaultdict(list)
    for r in rows:
        by_line[(r.gpu_model, r.sla_tier)].append(r)
    hours: dict[tuple[str, str, str], Decimal] = defaultdict(Decimal)
    minor: dict[tuple[str, str, str], int] = defaultdict(int)
    for line in lines:
        parts = by_line.get((line.gpu_model, line.sla_tier), [])
        amounts = apportion(Decimal(line.amount_minor).scaleb(-places), [p.charge for p in parts], places)
        shares = apportion(line.gpu_hours, [p.share_gpu_s for p in parts], GPU_HOURS_STORED_PLACES)
        for part, amount, share in zip(parts, amounts, shares, strict=True):
            key = (part.gpu_model, part.namespace, part.workload)
            minor[key] += int(amount.scaleb(places))
            hours[key] += share
    return [WorkloadAmount(namespace=ns, workload=w, gpu_model=model, gpu_hours=hours[(model, ns, w)],
                           amount_minor=minor[(model, ns, w)]) for model, ns, w in sorted(minor)]
