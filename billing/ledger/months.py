"""The month ledger (UsageMonth): the day ledger summed per UTC month with the same grouping (GPU +
workload identity), derived from days exactly as days are from hours, in the same transaction
(billing.ledger.rollup calls `recompute_months` from its day step and `rebuild_months` from
`rebuild_days`), so Σ month rows = Σ day rows to the last digit.

A month row also carries what a read of days joins per day row, each exactly as that read computes
it: the GPU-day's model, and the per-day card-seconds (the day's MB·s ÷ the GPU's memory, SM·s ÷ its
SMs; a quotient is rounded to its own scale, so the sum of the days' quotients is not the quotient
of the month's sum) with the memory and SM count they were divided by. billing.ledger.reads decides
when a month row may stand in for its days.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.backends.utils import CursorWrapper

from billing.ledger.reads import period_read_cursor

__all__ = ["rebuild_months", "recompute_months"]

_KEYS = ("tenant", "namespace", "pod", "container", "pod_uid", "sla_tier")
_SUMS = ("seconds", "mem_used_mb_s", "mem_granted_mb_s", "mem_billed_mb_s", "sm_used_s", "sm_granted_s",
         "sm_billed_s", "pcie_mb", "share_gpu_s", "charge", "idle_share", "energy_j")
# Card-seconds per day row, as billing.ledger.allocation's figure read divides them.
_CARD_SECONDS = {
    "mem_billed_card_s": "d.mem_billed_mb_s / nullif(gp.memory_mb, 0)",
    "mem_used_card_s": "d.mem_used_mb_s / nullif(gp.memory_mb, 0)",
    "sm_billed_card_s": "d.sm_billed_s / nullif(gp.sm_count, 0)",
    "sm_used_card_s": "d.sm_used_s / nullif(gp.sm_count, 0)",
}
_WHOLE_MONTHS = {"enable_sort": "off", "work_mem": "64MB"}
_MONTH_OF = "date_trunc('month', d.day, 'UTC')"
_GROUP = f"{_MONTH_OF}, d.gpu_uuid, d.node_id, {', '.join(f'd.{k}' for k in _KEYS)}, g.gpu_model, gp.memory_mb, gp.sm_count"


def _insert(source: str) -> str:
    """Month rows from the day rows of `source` (joins and a WHERE over the day row `d`)."""
    columns = ("month", "gpu_uuid", "node_id", *_KEYS, "gpu_model", "memory_mb", "sm_count", *_SUMS,
               "first_hour", "last_hour", *_CARD_SECONDS)
    return (
        f"INSERT INTO billing_usagemonth ({', '.join(columns)}) "  # noqa: S608 - built from constant column lists
        f"SELECT {_GROUP}, {', '.join(f'sum(d.{c})' for c in _SUMS)}, min(d.first_hour), max(d.last_hour), "
        f"{', '.join(f'sum({q})' for q in _CARD_SECONDS.values())} "
        "FROM billing_usageday d LEFT JOIN billing_gpuday g ON g.node_id = d.node_id AND g.gpu_uuid = d.gpu_uuid "
        "AND g.day = d.day LEFT JOIN billing_gpu gp ON gp.uuid = d.gpu_uuid "
        f"{source} GROUP BY {_GROUP}"
    )


def recompute_months(cur: CursorWrapper, days: set[tuple[int, str, datetime]]) -> None:
    """Replace the month rows of every node-GPU-month of `days` ((node, GPU, midnight) whose day rows
    were just replaced) from the day rows as they are now."""
    keys = sorted({(node, gpu, _month(day)) for node, gpu, day in days})
    if not keys:
        return
    params: list[Any] = [[k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]]
    touched = "unnest(%s::bigint[], %s::varchar[], %s::timestamptz[]) AS a(node_id, gpu_uuid, month)"
    cur.execute(f"DELETE FROM billing_usagemonth u USING {touched} WHERE u.node_id = a.node_id "  # noqa: S608 - fixed SQL; values are parameters
                "AND u.gpu_uuid = a.gpu_uuid AND u.month = a.month", params)
    cur.execute(_insert(f"JOIN {touched} ON d.node_id = a.node_id AND d.gpu_uuid = a.gpu_uuid "
                        "AND d.day >= a.month AND d.day < a.month + interval '1 month'"), params)


def rebuild_months(cur: CursorWrapper, *, lo: datetime, hi: datetime, gpu_uuid: str | None) -> None:
    """Recompute the month rows of every UTC month that meets the days [lo, hi) (midnights), of one
    GPU or of all, from the day ledger as it is."""
    cur.execute("SELECT date_trunc('month', %s::timestamptz, 'UTC'), "
                "date_trunc('month', %s::timestamptz - interval '1 microsecond', 'UTC') + interval '1 month'",
                [lo, hi])
    first, last = cur.fetchone()
    gpu = "" if gpu_uuid is None else " AND gpu_uuid = %s"
    params: list[Any] = [first, last] if gpu_uuid is None else [first, last, gpu_uuid]
    cur.execute(f"DELETE FROM billing_usagemonth WHERE month >= %s AND month < %s{gpu}", params)  # noqa: S608 - a constant filter; values are parameters
    # A month of every GPU is every day row of it: hashed, not sorted on disk (4.7 s to 3.5 s at 1,000 GPUs).
    with period_read_cursor(_WHOLE_MONTHS) as whole:
        whole.execute(_insert("WHERE d.day >= %s AND d.day < %s" + gpu.replace("gpu_uuid", "d.gpu_uuid")), params)


def _month(day: datetime) -> datetime:
    return day.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
