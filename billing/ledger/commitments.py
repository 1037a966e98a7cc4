"""The ledger's side of commitments: the seconds and cost the commitments of a GPU model covered,
per hour (the hour ledger's sums), which the commitments page splits over the commitments in force
(billing.queries.commitments) to show what each was used for and what went unused."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection

from billing.ledger.reads import fetch_rows
from billing.ledger.retention import require_hours_retained

__all__ = ["CommittedHour", "list_committed_hours"]


@dataclass(frozen=True)
class CommittedHour:
    """What the commitments of one GPU model covered in one hour, over the whole fleet."""

    gpu_model: str
    hour: datetime
    committed_seconds: Decimal
    committed_cost: Decimal


def list_committed_hours(*, gpu_models: Collection[str], start: datetime, end: datetime) -> list[CommittedHour]:
    """Per GPU model and hour in [start, end), the covered card-seconds and their cost (hours with any)."""
    require_hours_retained(start=start)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT gpu_model, hour, sum(committed_seconds) AS committed_seconds, sum(committed_cost) AS committed_cost "
            "FROM billing_gpuhour WHERE hour >= %s AND hour < %s AND gpu_model = ANY(%s) AND committed_seconds > 0 "
            "GROUP BY 1, 2 ORDER BY 1, 2",
            [start, end, sorted(gpu_models)],
        )
        return fetch_rows(cur, CommittedHour)
