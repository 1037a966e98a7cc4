"""Unpriced usage: the metered GPU-hours no rate card priced, by GPU model, with the tenants on
them (docs/billing.md, Unpriced usage). The close bills everything else and reports these as the
month's item to resolve; the periods page lists them.

Counted as the close counts them (billing.ledger.spend.get_unpriced_seconds): whole GPU-hours of
the hour ledger with `priced = false`, so the figures here add up to the period's unpriced total.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection

from billing.ledger.retention import require_hours_retained

__all__ = ["UnpricedUsage", "list_unpriced_usage"]

_S_PER_H = Decimal(3600)


@dataclass(frozen=True)
class UnpricedUsage:
    gpu_model: str
    gpu_seconds: Decimal
    # Slugs of the tenants with workloads on those GPU-hours, in name order.
    tenants: tuple[str, ...]

    @property
    def gpu_hours(self) -> Decimal:
        return self.gpu_seconds / _S_PER_H


def list_unpriced_usage(*, start: datetime, end: datetime) -> list[UnpricedUsage]:
    """Unpriced GPU-hours of [start, end) by GPU model (in name order) with the tenants they touch."""
    require_hours_retained(start=start)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT gpu_model, sum(metered_seconds) FROM billing_gpuhour WHERE hour >= %(start)s "
            "AND hour < %(end)s AND NOT priced GROUP BY gpu_model ORDER BY gpu_model",
            {"start": start, "end": end})
        seconds = {model: Decimal(total) for model, total in cur.fetchall()}
        cur.execute(
            "SELECT DISTINCT g.gpu_model, u.tenant FROM billing_gpuhour g JOIN billing_usagehour u "
            "ON u.node_id = g.node_id AND u.gpu_uuid = g.gpu_uuid AND u.hour = g.hour "
            "WHERE g.hour >= %(start)s AND g.hour < %(end)s AND NOT g.priced "
            "AND u.hour >= %(start)s AND u.hour < %(end)s ORDER BY 1, 2",
            {"start": start, "end": end})
        tenants: dict[str, list[str]] = {}
        for model, tenant in cur.fetchall():
            tenants.setdefault(model, []).append(tenant)
    return [UnpricedUsage(gpu_model=m, gpu_seconds=s, tenants=tuple(tenants.get(m, ()))) for m, s in seconds.items()]
