"""The small tables of the slim ledger (docs/architecture.md, "The slim minute store"): a card
(billing_card: a node's GPU and its model) and a workload (billing_workload: its six names) are named
by an int4 id in the minute store and the batch GPU rows. Ingest makes a batch's cards, the rollup its
workloads; both find an id or make it here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import date
from typing import Any

from django.db.backends.utils import CursorWrapper

__all__ = ["CARD_KEY", "WORKLOAD_KEY", "card_ids", "workload_ids"]

CARD_KEY = ("node_id", "gpu_uuid", "gpu_model")
WORKLOAD_KEY = ("tenant", "namespace", "pod", "container", "pod_uid", "sla_tier")


def card_ids(cur: CursorWrapper, keys: Iterable[tuple[int, str, str]]) -> dict[tuple[Any, ...], int]:
    """(node id, GPU uuid, GPU model) -> card id, made where missing."""
    return _ids(cur, "billing_card", CARD_KEY, ("bigint", "varchar", "varchar"), set(keys))


def workload_ids(cur: CursorWrapper, last_days: Mapping[tuple[str, ...], date]) -> dict[tuple[Any, ...], int]:
    """(tenant, namespace, pod, container, pod uid, SLA tier) -> workload id, made where missing, for
    workloads the caller writes minutes of, each with the UTC day of its latest such minute: a
    workload's last_day is that day when it is made, and raised to it when it was earlier, so retention
    keeps the workload while those minutes are kept. Rows already at that day or later are not
    written (the usual case: a cycle's minutes are today's)."""
    ids = _ids(cur, "billing_workload", WORKLOAD_KEY, ("varchar",) * len(WORKLOAD_KEY), set(last_days),
               made_with=("last_day", "date", last_days))
    if ids:
        cur.execute(
            "UPDATE billing_workload w SET last_day = v.day FROM unnest(%s::int[], %s::date[]) AS v(id, day) "
            "WHERE w.id = v.id AND w.last_day < v.day",
            [[ids[k] for k in last_days], list(last_days.values())],
        )
    return ids


def _ids(
    cur: CursorWrapper, table: str, columns: Sequence[str], types: Sequence[str], keys: set[tuple[Any, ...]], *,
    made_with: tuple[str, str, Mapping[tuple[Any, ...], Any]] | None = None,
) -> dict[tuple[Any, ...], int]:
    """The id of each key, made for the keys the table lacks (with `made_with`'s column, type and value
    by key, where given). Only missing keys are inserted: an insert that conflicts still draws an id
    from the sequence, and an int4 drawn for every key of every cycle would run out within days. Keys
    go in sorted, so two transactions that insert the same new keys wait for each other, never
    deadlock. One statement when nothing is new, or nothing raced it."""
    if not keys:
        return {}
    ordered = sorted(keys)
    arrays = [[k[i] for k in ordered] for i in range(len(columns))]
    names, kinds = [*columns], [*types]
    if made_with is not None:
        names.append(made_with[0])
        kinds.append(made_with[1])
        arrays.append([made_with[2][k] for k in ordered])
    cols, values = ", ".join(columns), ", ".join(names)
    unnest = f"unnest({', '.join(f'%s::{t}[]' for t in kinds)}) WITH ORDINALITY AS v({values}, ord)"
    same = " AND ".join(f"t.{c} = v.{c}" for c in columns)
    select = f"SELECT t.id, {', '.join(f't.{c}' for c in columns)} FROM {table} t JOIN {unnest} ON {same}"  # noqa: S608 - fixed names
    cur.execute(
        f"WITH made AS (INSERT INTO {table} ({values}) SELECT {values} FROM {unnest} WHERE NOT EXISTS "  # noqa: S608 - fixed names
        f"(SELECT 1 FROM {table} t WHERE {same}) ORDER BY v.ord ON CONFLICT DO NOTHING RETURNING id, {cols}) "
        f"SELECT * FROM made UNION ALL {select}",
        [*arrays, *arrays],
    )
    ids = {tuple(r[1:]): r[0] for r in cur.fetchall()}
    if len(ids) < len(ordered):  # made by a transaction that committed after this statement began
        cur.execute(select, arrays)
        ids.update({tuple(r[1:]): r[0] for r in cur.fetchall()})
    return ids
