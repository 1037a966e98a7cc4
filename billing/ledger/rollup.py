"""Rollup of the batches' integral rows into the priced minute, hour and day ledgers (docs/billing.md;
docs/design.md, Scale path).

The unit of work is a node-GPU-minute: the ledger's key is (node, GPU, window), the distribution
key first (docs/scaling.md). Nodes are rolled up a few at a time, in one transaction per group
(VGPU_ROLLUP_NODES_PER_TRANSACTION): it takes the nodes' pending batches, finds the node-GPU-minutes
they touch, takes the batches' integral rows out of the inbox (billing_raw_sample) and adds them to
the integrals the minutes store, prices those minutes again wholesale, then derives their hours
from minutes and their UTC days from hours, and marks the batches rolled up. Each batch is added
once (marked in the same transaction); pricing the whole GPU-minute from its sums lets late
batches land in already-rolled minutes, and a rebuild prices the stored integrals alone.

What a recompute reads is a function of the batches, not of timing: the card seconds of the
node's batches that are rolled up and not quarantined, plus the ones this transaction rolls up,
and the integrals of the latter. A batch another connection is still storing, or one waiting for
a later cycle, stays out until its own rollup.

Locks (transaction-level advisory locks, so a worker killed mid-rollup releases them with its
connection and leaves nothing half-applied):

- one per node, taken with a try-lock: two workers never roll the same node at once, whatever
  shard arithmetic each was given (N may change between the beat and the workers, a task may be
  redelivered); the one that does not get it skips the node, which the holder is rolling up;
- the ledger lock (billing.ledger.locks), shared by every rollup transaction and exclusive for
  `lock_ledger` (a rate-card change, `rebuild_ledger`, `rebuild_days`, a retention drop):
  re-pricing waits for the rollups in flight and no rollup starts meanwhile. There is no global lock between rollups.

Work is sharded by node: shard k of N rolls the nodes with node_id % N == k (billing.tasks fans
the beat's cycle out into N shard tasks). A batch that cannot be rolled up is quarantined, never
allowed to stop the others: the ledger marks it and hands it to the caller's `on_quarantine`,
which records the audit event in the same transaction (billing.services.ingest.rollup).
"""

from __future__ import annotations

import io
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper

from billing.errors import InvalidInput
from billing.ledger.ids import WORKLOAD_KEY, card_ids, workload_ids
from billing.ledger.locks import lock_ledger, try_lock_ledger_shared
from billing.ledger.months import close_days, rebuild_months, recompute_months
from billing.ledger.partitions import MINUTE_TABLES, RAW_TABLE, days_between, ensure_minute_partitions, partition_name
from billing.ledger.pricing import (
    GpuWindowUsage,
    Rate,
    RateCards,
    WorkloadQuantities,
    committed_keys,
    load_rate_cards,
    price_gpu_window,
)
from billing.ledger.reads import fetch_rows
from billing.ledger.requests import (
    REQUESTED_COLUMNS,
    requested_sql,
    requested_sums,
    store_changed_requests,
    store_requests,
)
from billing.ledger.retention import require_hours_retained, require_repriceable
from billing.ledger.statistics import analyze_stale_partitions
from billing.money import ledger_amount

__all__ = [
    "QuarantinedBatch",
    "RollupResult",
    "quarantine_batch",
    "rebuild_days",
    "rebuild_ledger",
    "release_quarantined",
    "rollup_usage",
]

log = logging.getLogger(__name__)

# Two-key advisory locks (class, node id) live in their own key space, apart from one-key locks.
_NODE_LOCK_CLASS = 0x6E6F6465  # "node"
_INT4 = 2**31
_MINUTE = timedelta(minutes=1)
_MICROSECONDS = Decimal(1_000_000)
_WORKLOAD_KEY = WORKLOAD_KEY
_USAGE_COLUMNS = (
    "gpu_uuid", "node_id", "tenant", "namespace", "pod", "container", "pod_uid", "sla_tier", "seconds",
    "mem_used_mb_s", "mem_granted_mb_s", "mem_billed_mb_s", "sm_used_s", "sm_granted_s", "sm_billed_s",
    "pcie_mb", "share_gpu_s", "charge", "idle_share", "energy_j",
)
# The slim minute store (migration 0043; docs/architecture.md, "The slim minute store"): a usage
# minute is also the store of the integrals, so it keeps the billed maxima the pricing reads.
USAGE_STORE, GPU_STORE = MINUTE_TABLES
_STORE_COLUMNS = (
    "minute", "card_id", "workload_id", "seconds", "mem_used_mb_s", "mem_granted_mb_s", "mem_max_mb_s", "sm_used_s",
    "sm_granted_s", "sm_max_s", "pcie_mb", "billed_basis", "share_gpu_s", "charge", "idle_share", "energy_j",
)
# What the rate card billed is one of the integrals, by its basis: the store keeps the basis.
_BASIS_CODE = {"max": "m", "granted": "g", "used": "u"}
# The billed integrals as the view gives them (migration 0043): the basis's integral.
_BILLED_FROM_BASIS = {
    "mem_billed_mb_s": "CASE {m}.billed_basis WHEN 'g' THEN {m}.mem_granted_mb_s WHEN 'u' THEN {m}.mem_used_mb_s "
                       "ELSE {m}.mem_max_mb_s END",
    "sm_billed_s": "CASE {m}.billed_basis WHEN 'g' THEN {m}.sm_granted_s WHEN 'u' THEN {m}.sm_used_s "
                   "ELSE {m}.sm_max_s END",
}
_GPU_STORE_COLUMNS = (
    "minute", "card_id", "rate_card_id", "metered_seconds", "committed_seconds", "energy_seconds", "card_cost",
    "charged", "idle_cost", "idle_allocated", "committed_cost", "energy_j", "idle_energy_j", "priced", "currency",
)


def _stored(column: str, alias: str) -> str:
    """A usage minute's integral as the store keeps it (float8), a billed one by its basis."""
    return _BILLED_FROM_BASIS[column].format(m=alias) if column in _BILLED_FROM_BASIS else f"{alias}.{column}"


# Rollups that price a committed GPU model take this lock (class, 0) before they read which of its
# cards other nodes metered: the cover of one card depends on the others' (docs/billing.md).
_COMMITMENT_LOCK_CLASS = 0x636F6D6D  # "comm"
_QUARANTINE_ERROR_MAX_CHARS = 2000

Key = tuple[int, str, datetime]  # (node_id, gpu_uuid, minute | hour | day): the ledger's key


@dataclass(frozen=True)
class QuarantinedBatch:
    """A batch the rollup could not roll up: marked quarantined, its samples left out."""

    batch_id: int
    node_id: int
    node_name: str
    batch_seq: int
    error: str


@dataclass(frozen=True)
class RollupResult:
    batches: int
    gpu_minutes: int
    gpu_hours: int
    # True when some node was left to another worker (it held the node) or the ledger was locked
    # for re-pricing: a caller that wants everything rolled up tries again shortly.
    skipped: bool = False
    quarantined: int = 0
    nodes: int = 0

    def __add__(self, other: RollupResult) -> RollupResult:
        return RollupResult(batches=self.batches + other.batches, gpu_minutes=self.gpu_minutes + other.gpu_minutes,
                            gpu_hours=self.gpu_hours + other.gpu_hours, skipped=self.skipped or other.skipped,
                            quarantined=self.quarantined + other.quarantined, nodes=self.nodes + other.nodes)


_NOTHING = RollupResult(batches=0, gpu_minutes=0, gpu_hours=0)
_SKIPPED = RollupResult(batches=0, gpu_minutes=0, gpu_hours=0, skipped=True)


@dataclass(frozen=True)
class _Window:
    """A GPU's card over one minute: what its batch GPU rows declared, and the seconds they cover."""

    model: str
    memory_mb: int
    sm_count: int
    seconds: Decimal
    # Joules from the batches that metered energy, each spread evenly over its window, and the seconds they cover.
    energy_j: Decimal = Decimal(0)
    energy_seconds: Decimal = Decimal(0)


# --------------------------------------------------------------------------------------------
# Entry points


OnQuarantine = Callable[[QuarantinedBatch], None]


# How long after midnight a day stays open to the month ledger. The batches that end a day arrive
# after it (a minute's batch a minute later, an hour's an hour later): rolled up once their day is
# closed, each would make the day step re-derive its workloads' month rows from days
# (recompute_months), reading its GPUs' month of day rows, which after every midnight is every GPU of
# the fleet. Rolled up before the close, they are in the day rows the close merges. A batch later
# still re-derives its own workloads' month rows.
CLOSE_GRACE = timedelta(hours=1)


def rollup_usage(*, now: datetime, max_batches: int = 5000, shard: int = 0, shards: int = 1,
                 on_quarantine: OnQuarantine | None = None) -> RollupResult:
    """Roll up the pending batches of the nodes of shard `shard` of `shards` (node_id % shards),
    oldest first, at most `max_batches` per transaction of VGPU_ROLLUP_NODES_PER_TRANSACTION nodes.

    A batch that cannot be rolled up, for any reason, must not stop billing for the fleet: when a
    node's cycle fails, each of its batches is rolled up alone and the ones that still fail are
    quarantined with their error and passed to `on_quarantine` inside the same transaction. A node
    another worker holds is left to it (`skipped`)."""
    if shards < 1 or not 0 <= shard < shards:
        raise ValueError(f"shard must lie in [0, shards) and shards be >= 1, got shard {shard} of {shards}")
    if max_batches < 1:
        raise ValueError("max_batches must be >= 1")
    close_days(now=now - CLOSE_GRACE)  # yesterday into the month ledger, once, by the first cycle past the grace
    node_ids = _pending_nodes(shard=shard, shards=shards)
    if not node_ids:
        return _NOTHING
    days = _pending_days(node_ids)
    # The minute days it will write, before the rollup's transactions take their locks
    # (billing.ledger.partitions says why); inside them they are cache hits.
    ensure_minute_partitions(days)
    # The inbox's and the minute store's partitions it reads: a day's partitions fill all day, and the
    # stored integrals' lookup, planned on an empty day's statistics, read every workload of the
    # fleet's minute once per GPU-minute (the wide minute table's (minute, tenant) index): 11 s a
    # statement at 10,000 GPUs, 15 ms once the partition was analysed.
    analyze_stale_partitions(only=_partitions(days))
    total = _NOTHING
    per = settings.VGPU_ROLLUP_NODES_PER_TRANSACTION
    for group in (node_ids[i:i + per] for i in range(0, len(node_ids), per)):
        total += _roll_up_nodes(group, now=now, max_batches=max_batches, on_quarantine=on_quarantine)
    return total


def _partitions(days: Iterable[date]) -> set[str]:
    return {partition_name(d, table) for d in days for table in (RAW_TABLE, *MINUTE_TABLES)}


def _pending_nodes(*, shard: int, shards: int) -> list[int]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT DISTINCT node_id FROM billing_usagebatch WHERE rolled_up_at IS NULL AND quarantined_at IS NULL "
            "AND node_id %% %s = %s ORDER BY 1",
            [shards, shard],
        )
        return [r[0] for r in cur.fetchall()]


def _pending_days(node_ids: list[int]) -> set[date]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT DISTINCT d::date FROM billing_usagebatch b, generate_series(date_trunc('day', b.window_start, 'UTC'), "
            "b.window_end - interval '1 microsecond', interval '1 day') AS d WHERE b.node_id = ANY(%s) "
            "AND b.rolled_up_at IS NULL AND b.quarantined_at IS NULL",
            [node_ids],
        )
        return {r[0] for r in cur.fetchall()}


def _roll_up_nodes(node_ids: list[int], *, now: datetime, max_batches: int,
                   on_quarantine: OnQuarantine | None) -> RollupResult:
    """One transaction for a group of nodes: a transaction's fixed cost (some twenty statements)
    would otherwise dominate a cycle that finds one batch per node. The nodes another worker holds
    are left to it."""
    with transaction.atomic(), connection.cursor() as cur:
        locked = _lock_for_rollup(cur, node_ids)
        if not locked:
            return _SKIPPED
        cur.execute(
            "SELECT id FROM billing_usagebatch WHERE node_id = ANY(%s) AND rolled_up_at IS NULL "
            "AND quarantined_at IS NULL ORDER BY id LIMIT %s",
            [locked, max_batches],
        )
        batch_ids = [r[0] for r in cur.fetchall()]
        skipped = len(locked) < len(node_ids)
        if not batch_ids:  # another worker rolled these nodes up between the listing and the lock
            return RollupResult(batches=0, gpu_minutes=0, gpu_hours=0, skipped=skipped)
        _tune_transaction(cur)
        cards = load_rate_cards()  # under the ledger lock: no rate-card change commits meanwhile
        try:
            with transaction.atomic():
                minutes, hours = _roll_up(cur, batch_ids, now=now, cards=cards)
        except Exception:  # noqa: BLE001 - any failure of one batch is isolated below, not raised
            result = _roll_up_one_by_one(cur, batch_ids, now=now, cards=cards, on_quarantine=on_quarantine)
            return RollupResult(batches=result.batches, gpu_minutes=result.gpu_minutes, gpu_hours=result.gpu_hours,
                                quarantined=result.quarantined, nodes=len(locked), skipped=skipped)
    return RollupResult(batches=len(batch_ids), gpu_minutes=minutes, gpu_hours=hours, nodes=len(locked),
                        skipped=skipped)


def _lock_for_rollup(cur: CursorWrapper, node_ids: list[int]) -> list[int]:
    """The ledger lock (shared) and the locks of the nodes no other worker holds, until the
    transaction ends. Returns those nodes: none while re-pricing runs."""
    if not try_lock_ledger_shared(cur):
        return []
    # One try per node, in id order. Node ids past int4 share a lock with another node: that only
    # serialises the two.
    cur.execute("SELECT n FROM unnest(%s::bigint[]) WITH ORDINALITY AS u(n, i) "
                "WHERE pg_try_advisory_xact_lock(%s, (n %% %s)::int) ORDER BY i",
                [sorted(node_ids), _NODE_LOCK_CLASS, _INT4])
    return [r[0] for r in cur.fetchall()]


# Planner settings of a rollup transaction (SET LOCAL: they end with it), from EXPLAIN ANALYZE of the
# raw GROUP BY (docs/benchmarks.md, "Rollup: sharded by node"):
# - work_mem: one group per workload-minute of the node's cycle stays in memory, never spilled;
# - no sort-based aggregation: the planner underestimates a node's rows (node and batch are
#   correlated and it multiplies their selectivities: 1,036 rows expected, 65,280 read) and sorts
#   the raw rows on eight collated text keys for a GroupAggregate, 2-4x slower than hashing them;
#   with sorts penalised it hashes, and sorts only the groups for the ORDER BY;
# - no JIT: the penalty lifts the plan's cost past jit_above_cost, and compiling takes 0.4-0.9 s
#   for a 0.2 s statement;
# - no parallel query: the rollup's parallelism is its shards, one core each. One worker that took
#   every core with parallel workers (it did: Gather, 2 workers) left nothing to a second shard.
_TRANSACTION_SETTINGS = (("enable_sort", "off"), ("enable_incremental_sort", "off"), ("jit", "off"),
                         ("max_parallel_workers_per_gather", "0"))


def _tune_transaction(cur: CursorWrapper) -> None:
    names = [("work_mem", settings.VGPU_ROLLUP_WORK_MEM), *_TRANSACTION_SETTINGS]
    cur.execute("SELECT " + ", ".join("set_config(%s, %s, true)" for _ in names), [v for pair in names for v in pair])


def _roll_up(cur: CursorWrapper, batch_ids: list[int], *, now: datetime,
             cards: RateCards) -> tuple[int, int]:
    """Recompute the node-GPU-minutes that `batch_ids` touch, and mark them rolled up."""
    cur.execute("SELECT c.node_id, c.gpu_uuid, g.window_start, g.window_end FROM billing_batchgpu g "
                "JOIN billing_card c ON c.id = g.card_id WHERE g.batch_id = ANY(%s)", [batch_ids])
    affected: set[Key] = set()
    for node_id, gpu_uuid, start, end in cur.fetchall():
        affected.update((node_id, gpu_uuid, m) for m in _minutes(start, end))
    minutes, hours = _recompute(cur, affected, rolling=batch_ids, cards=cards)
    # After the hours: the requests the batches changed (their ingest flagged the pods) stored again.
    store_changed_requests(cur, sorted({node_id for node_id, _gpu, _minute in affected}))
    cur.execute("UPDATE billing_usagebatch SET rolled_up_at = %s WHERE id = ANY(%s)", [now, batch_ids])
    return minutes, hours


def _roll_up_one_by_one(cur: CursorWrapper, batch_ids: list[int], *, now: datetime,
                        cards: RateCards, on_quarantine: OnQuarantine | None) -> RollupResult:
    """Each batch alone, oldest first: the batches after it are still pending, so left out. A batch
    fails here only for what it carries itself, never for a poisoned neighbour in the same
    GPU-minute. The last recompute of a minute includes every good batch of it, so the ledger ends
    as if the quarantined batches had never arrived."""
    minutes = hours = rolled = 0
    for batch_id in batch_ids:
        try:
            with transaction.atomic():
                m, h = _roll_up(cur, [batch_id], now=now, cards=cards)
        except Exception as exc:  # noqa: BLE001 - the error is kept on the batch and shown
            _quarantine(cur, batch_id, error=f"{type(exc).__name__}: {exc}", now=now, on_quarantine=on_quarantine)
            continue
        minutes, hours, rolled = minutes + m, hours + h, rolled + 1
    return RollupResult(batches=rolled, gpu_minutes=minutes, gpu_hours=hours, quarantined=len(batch_ids) - rolled)


def _quarantine(cur: CursorWrapper, batch_id: int, *, error: str, now: datetime,
                on_quarantine: OnQuarantine | None) -> None:
    batch = _mark_quarantined(cur, batch_id=batch_id, error=error, now=now)
    # An SRE reads logs before pages: say which batch and why, once.
    log.error("event=batch_quarantined node=%s batch_seq=%s batch_id=%s error=%s",
              batch.node_name, batch.batch_seq, batch_id, batch.error)
    if on_quarantine is not None:
        on_quarantine(batch)


def quarantine_batch(*, batch_id: int, error: str, now: datetime) -> QuarantinedBatch:
    """Keep a pending batch out of the ledger with its error, inside the caller's transaction (the
    caller audits it: billing.services.ingest.rollup). A batch already rolled up is refused: its
    integrals were added into the minute store's sums and cannot be taken out of them."""
    with connection.cursor() as cur:
        return _mark_quarantined(cur, batch_id=batch_id, error=error, now=now)


def _mark_quarantined(cur: CursorWrapper, *, batch_id: int, error: str, now: datetime) -> QuarantinedBatch:
    cur.execute(
        "UPDATE billing_usagebatch b SET quarantined_at = %s, quarantine_error = %s FROM billing_node n "
        "WHERE b.id = %s AND n.id = b.node_id AND b.rolled_up_at IS NULL "
        "RETURNING b.node_id, n.name, b.batch_seq, b.quarantine_error",
        [now, error[:_QUARANTINE_ERROR_MAX_CHARS], batch_id],
    )
    row = cur.fetchone()
    if row is None:
        raise ValueError(f"no usage batch {batch_id} that is not rolled up")
    node_id, node_name, batch_seq, kept = row
    return QuarantinedBatch(batch_id=batch_id, node_id=node_id, node_name=node_name, batch_seq=batch_seq, error=kept)


def release_quarantined(*, batch_ids: list[int] | None, node: str | None) -> list[QuarantinedBatch]:
    """Give quarantined batches back to the rollup (by id, or every one of `node`, or all when both
    are None), inside the caller's transaction, which audits them. Each returned batch carries the
    error it was quarantined with. Ids that are not quarantined batches are refused, none released."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT b.id AS batch_id, b.node_id, n.name AS node_name, b.batch_seq, b.quarantine_error AS error "
            "FROM billing_usagebatch b JOIN billing_node n ON n.id = b.node_id WHERE b.quarantined_at IS NOT NULL "
            "AND (%(ids)s::bigint[] IS NULL OR b.id = ANY(%(ids)s::bigint[])) AND (%(node)s::text IS NULL OR n.name = %(node)s) "
            "ORDER BY b.id FOR UPDATE OF b",
            {"ids": batch_ids, "node": node},
        )
        chosen = fetch_rows(cur, QuarantinedBatch)
        if batch_ids is not None and len(chosen) != len(set(batch_ids)):
            missing = sorted(set(batch_ids) - {b.batch_id for b in chosen})
            raise InvalidInput(f"batch ids {missing} are not quarantined")
        cur.execute("UPDATE billing_usagebatch SET quarantined_at = NULL, quarantine_error = '' WHERE id = ANY(%s)",
                    [[b.batch_id for b in chosen]])
    return chosen


def rebuild_ledger(*, start: datetime, end: datetime) -> RollupResult:
    """Price every GPU-minute in [start, end) again from the integrals the minutes store and the
    batches' card seconds (after a rate-card change), day by day, under the exclusive ledger lock."""
    if end <= start:
        raise ValueError("end must be after start")
    total = _NOTHING
    with transaction.atomic(), connection.cursor() as cur:
        lock_ledger()
        require_repriceable(start=start)  # retention may have pruned batches or minutes: refuse, never guess
        _tune_transaction(cur)
        cards = load_rate_cards()
        cur.execute(
            "SELECT c.node_id, c.gpu_uuid, greatest(g.window_start, %s), least(g.window_end, %s) FROM billing_batchgpu g "
            "JOIN billing_card c ON c.id = g.card_id WHERE g.window_start < %s AND g.window_end > %s",
            [start, end, end, start],
        )
        chunks: dict[date, set[Key]] = defaultdict(set)  # a UTC day of every node at a time
        for node_id, gpu_uuid, lo, hi in cur.fetchall():
            for minute in _minutes(lo, hi):
                chunks[minute.date()].add((node_id, gpu_uuid, minute))
        analyze_stale_partitions(only=_partitions(chunks))
        for _day, affected in sorted(chunks.items()):
            minutes, hours = _recompute(cur, affected, rolling=[], cards=cards)
            total += RollupResult(batches=0, gpu_minutes=minutes, gpu_hours=hours)
    return total


# --------------------------------------------------------------------------------------------
# Raw partitions' statistics


# --------------------------------------------------------------------------------------------
# The recompute


def _minutes(start: datetime, end: datetime) -> Iterable[datetime]:
    """The UTC minutes [start, end) meets."""
    minute = start.astimezone(UTC).replace(second=0, microsecond=0)
    while minute < end:
        yield minute
        minute += _MINUTE


def _arrays(keys: Iterable[Key]) -> tuple[list[int], list[str], list[datetime]]:
    ordered = sorted(keys)
    return [k[0] for k in ordered], [k[1] for k in ordered], [k[2] for k in ordered]


_UNNEST = "unnest(%s::bigint[], %s::varchar[], %s::timestamptz[])"


def _recompute(cur: CursorWrapper, affected: set[Key], *, rolling: Sequence[int],
               cards: RateCards) -> tuple[int, int]:
    """Replace the minute rows of `affected` (node, GPU, minute), then their hours and days. The
    integrals are those stored in the minutes (every batch rolled up so far) plus the inbox rows of
    `rolling` (the batches being rolled up); the card seconds come from the GPU rows of the batches
    of those nodes that are rolled up and not quarantined, plus `rolling`."""
    if not affected:
        return 0, 0
    lo = min(k[2] for k in affected)
    hi = max(k[2] for k in affected) + _MINUTE
    nodes = sorted({k[0] for k in affected})
    gpus = sorted({k[1] for k in affected})
    windows = _windows(cur, nodes, gpus, lo, hi, affected, rolling=rolling)
    covered, flipped = _commitment_cover(cur, windows, cards)
    if flipped:  # other nodes' cards whose cover this recompute changes are recomputed with it
        windows.update(_windows(cur, sorted({k[0] for k in flipped}), sorted({k[1] for k in flipped}), lo, hi,
                                flipped, rolling=rolling))
        affected = affected | flipped
        nodes, gpus = sorted({k[0] for k in affected}), sorted({k[1] for k in affected})
    workloads = _workloads(cur, nodes, gpus, lo, hi, affected, rolling)
    if unmetered := workloads.keys() - windows.keys():
        # Only what is priced is written back: integrals of a GPU-minute with no card seconds
        # would be lost. Refused, so the batch is quarantined instead.
        raise ValueError(f"integrals without metered card seconds in {len(unmetered)} GPU-minute(s), "
                         f"e.g. {min(unmetered)}")
    usage_buf, gpu_buf = _priced_rows(
        windows, workloads, cards, covered, card_ids=card_ids(cur, {(n, g, w.model) for (n, g, _), w in windows.items()}),
        workload_ids=workload_ids(cur, _last_days(workloads)))
    ensure_minute_partitions(days_between(lo, hi))  # the minute ledger is day-partitioned (retention)
    for table in MINUTE_TABLES:  # every card of the node's GPU: the minute's model may have changed
        cur.execute(
            f"DELETE FROM {table} m USING {_UNNEST} AS a(node_id, gpu_uuid, minute) JOIN billing_card c "  # noqa: S608 - fixed names
            "ON c.node_id = a.node_id AND c.gpu_uuid = a.gpu_uuid WHERE m.card_id = c.id AND m.minute = a.minute",
            [*_arrays(affected)],
        )
    cur.copy_expert(f"COPY {USAGE_STORE} ({', '.join(_STORE_COLUMNS)}) FROM STDIN", usage_buf)
    cur.copy_expert(f"COPY {GPU_STORE} ({', '.join(_GPU_STORE_COLUMNS)}) FROM STDIN", gpu_buf)
    hours = {(n, g, m.replace(minute=0)) for n, g, m in affected}
    _recompute_hours(cur, hours)
    _recompute_days(cur, hours)
    return len(windows), len(hours)


def _windows(cur: CursorWrapper, nodes: list[int], gpus: list[str], lo: datetime, hi: datetime, affected: set[Key],  # noqa: PLR0917 - a private helper whose one caller passes its loop's state in order
             *, rolling: Sequence[int]) -> dict[Key, _Window]:
    """Card seconds per affected node-GPU-minute: the overlap of the GPU's batch windows on that
    node with the minute."""
    cur.execute(
        "SELECT c.node_id, c.gpu_uuid, bg.window_start, bg.window_end, c.gpu_model, bg.memory_mb, "
        "bg.sm_count, bg.energy_j FROM billing_card c JOIN billing_batchgpu bg ON bg.card_id = c.id "
        "JOIN billing_usagebatch b ON b.node_id = c.node_id AND b.id = bg.batch_id WHERE c.node_id = ANY(%s) "
        "AND c.gpu_uuid = ANY(%s) AND bg.window_end > %s "
        "AND bg.window_start < %s AND b.quarantined_at IS NULL AND (b.rolled_up_at IS NOT NULL OR b.id = ANY(%s))",
        [nodes, gpus, lo, hi, list(rolling)],
    )
    seconds: dict[Key, Decimal] = defaultdict(Decimal)
    energy: dict[Key, list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])  # joules, seconds metered
    card: dict[Key, tuple[str, int, int]] = {}
    for node_id, gpu_uuid, start, end, model, memory_mb, sm_count, energy_j in cur.fetchall():
        window_s = Decimal((end - start) // timedelta(microseconds=1)) / _MICROSECONDS
        for minute in _minutes(max(start, lo), min(end, hi)):
            key = (node_id, gpu_uuid, minute)
            if key not in affected:
                continue
            overlap = min(end, minute + _MINUTE) - max(start, minute)
            overlap_s = Decimal(overlap // timedelta(microseconds=1)) / _MICROSECONDS
            seconds[key] += overlap_s
            if energy_j is not None:  # the batch's energy, spread evenly over its window
                energy[key][0] += energy_j * overlap_s / window_s
                energy[key][1] += overlap_s
            # As the SQL it replaces: max() of each declared figure when batches of one minute differ.
            seen = card.get(key)
            card[key] = (model, memory_mb, sm_count) if seen is None else (
                max(seen[0], model), max(seen[1], memory_mb), max(seen[2], sm_count))
    return {k: _Window(model=card[k][0], memory_mb=card[k][1], sm_count=card[k][2], seconds=s,
                          energy_j=ledger_amount(energy[k][0]) if k in energy else Decimal(0),
                          energy_seconds=energy[k][1] if k in energy else Decimal(0))
               for k, s in seconds.items()}


def _commitment_cover(cur: CursorWrapper, windows: dict[Key, _Window], cards: RateCards) -> tuple[set[Key], set[Key]]:
    """Which GPU-minutes a commitment covers, of those in `windows` and of the same model and minute
    on other nodes (read from the minute ledger, as their rollups left them), and which of the
    latter this changes (covered then, not now, or the reverse). Takes the commitment lock first,
    so two rollups never decide the cover of one minute from each other's uncommitted rows."""
    pools = {(w.model, key[2]): pool for key, w in windows.items()
             if (pool := cards.pool_for(w.model, key[2])) is not None}
    if not pools:
        return set(), set()
    cur.execute("SELECT pg_advisory_xact_lock(%s, 0)", [_COMMITMENT_LOCK_CLASS])
    cur.execute("SELECT node_id, gpu_uuid, minute, gpu_model, metered_seconds, committed_seconds > 0 "
                "FROM billing_gpuminute WHERE minute = ANY(%s) AND gpu_model = ANY(%s)",
                [sorted({m for _, m in pools}), sorted({model for model, _ in pools})])
    present: dict[tuple[str, datetime], dict[tuple[int, str], Decimal]] = defaultdict(dict)
    was_covered: dict[Key, bool] = {}
    for node_id, gpu_uuid, minute, model, seconds, covered in cur.fetchall():
        if (node_id, gpu_uuid, minute) not in windows and (model, minute) in pools:
            present[(model, minute)][(node_id, gpu_uuid)] = seconds
            was_covered[(node_id, gpu_uuid, minute)] = covered
    for (node_id, gpu_uuid, minute), w in windows.items():
        if (w.model, minute) in pools:
            present[(w.model, minute)][(node_id, gpu_uuid)] = w.seconds
    covered_now: set[Key] = set()
    for (model, minute), cards_present in present.items():
        covered_now.update((n, g, minute) for n, g in committed_keys(cards_present, pools[(model, minute)].cards))
    flipped = {key for key, was in was_covered.items() if was != (key in covered_now)}
    return covered_now, flipped


# The integrals each workload-minute sums, in the ledger's column order. A row stored before wire
# protocol v2 was one sample and has no billed maximum: max(used, granted) of that row is it.
_RAW_SUMS = ("r.seconds", "r.mem_used_mb_s", "r.mem_granted_mb_s", "r.mem_billed", "r.sm_used_s", "r.sm_granted_s",
             "r.sm_billed", "r.pcie_mb")
_BILLED = ("coalesce(mem_billed_mb_s, greatest(mem_used_mb_s, mem_granted_mb_s)) AS mem_billed, "
           "coalesce(sm_billed_s, greatest(sm_used_s, sm_granted_s)) AS sm_billed")
_RAW_COLUMNS = ("seconds", "mem_used_mb_s", "mem_granted_mb_s", "coalesce(mem_billed_mb_s, 0)", "sm_used_s",
                "sm_granted_s", "coalesce(sm_billed_s, 0)", "pcie_mb")
# Casting every float8 to numeric cost the rollup most of its time (2/3 of the raw GROUP BY,
# docs/benchmarks.md), and it is not exact: the cast keeps 15 significant digits. Agents report
# integrals in multiples of 2^-10 (agents/meter.py), and ingest sums them per workload-minute
# (billing.services.ingest.batch_validation.summed_per_minute); float8 adds such values exactly
# while every partial sum stays below 2^43, which a workload-minute's does (at most 60 s of a card
# whose capacity fits an int4, or of 10 TB/s of PCIe, doubled for billed), and the greater of two
# such values is one too. A row whose values all are (`q`, computed once per row: OFFSET 0 keeps
# the planner from copying it into every aggregate) is summed in float8, any other row (what else a
# client sent) through numeric, and the caller adds the two exactly (Decimal(float) is the float's
# exact value).
def _quantized(c: str) -> str:
    return f"{c} < 8796093022208 AND {c} * 1024 = trunc({c} * 1024)"


_QUANTIZED = " AND ".join(_quantized(c) for c in _RAW_COLUMNS)
_KEY_COLUMNS = "node_id, gpu_uuid, minute, tenant, namespace, pod, container, pod_uid, sla_tier"
# The inbox: the integral rows of the batches being rolled up, taken out of it (DELETE ... RETURNING:
# one scan reads and deletes them), each integral as (float8, numeric), the one its path sums, the
# other NULL.
_INBOX_SQL = (
    "WITH inbox AS (DELETE FROM billing_raw_sample WHERE node_id = ANY(%s) AND gpu_uuid = ANY(%s) AND start >= %s "  # noqa: S608 - fixed SQL built from constant column lists; values are parameters
    "AND start < %s AND batch_id = ANY(%s) RETURNING node_id, gpu_uuid, start, tenant, namespace, pod, container, "
    f"pod_uid, sla_tier, seconds, mem_used_mb_s, mem_granted_mb_s, sm_used_s, sm_granted_s, pcie_mb, {_BILLED}, "
    f"{_QUANTIZED} AS q) "
)
_INBOX_ROWS = (
    "SELECT r.node_id, r.gpu_uuid, date_trunc('minute', r.start), r.tenant, r.namespace, r.pod, r.container, "  # noqa: S608 - as above
    "r.pod_uid, r.sla_tier, "
    + ", ".join(f"CASE WHEN r.q THEN {e} END, CASE WHEN NOT r.q THEN {e}::numeric END" for e in _RAW_SUMS)
    + " FROM inbox r"
)
# The store: the integrals of every batch rolled up so far for exactly the GPU-minutes recomputed,
# in the inbox's column order, each as (float8, numeric) like the inbox's: the store keeps them as
# float8, and one that is a multiple of 2^-10 below 2^43 (every sum of our agents' values) is summed
# in float8, any other converted (billing_exact, migration 0043) and summed in numeric.
_STORED_INTEGRALS = ("seconds", "mem_used_mb_s", "mem_granted_mb_s", "mem_max_mb_s", "sm_used_s", "sm_granted_s",
                     "sm_max_s", "pcie_mb")
_STORED_SQL = (
    "SELECT a.node_id, a.gpu_uuid, a.minute, " + ", ".join(f"w.{k}" for k in _WORKLOAD_KEY) + ", "  # noqa: S608 - fixed SQL built from constant column lists; values are parameters
    + ", ".join(f"CASE WHEN {_quantized(f'm.{c}')} THEN m.{c} END, "
                f"CASE WHEN NOT ({_quantized(f'm.{c}')}) THEN billing_exact(m.{c}) END" for c in _STORED_INTEGRALS)
    + f" FROM {_UNNEST} AS a(node_id, gpu_uuid, minute) JOIN billing_card c ON c.node_id = a.node_id "  # noqa: S608 - as above
    # One lookup into the key per card-minute, whatever the statistics say: the minute being rolled up
    # is written by this very cycle, after its partition's last ANALYZE, so the planner took the
    # minute's range for one row and hashed all of it (9.3 s per transaction of 4 nodes at 10,000
    # GPUs, against 10 ms). The fence (OFFSET 0) keeps it from flattening the lookup into a join.
    f"AND c.gpu_uuid = a.gpu_uuid CROSS JOIN LATERAL (SELECT * FROM {USAGE_STORE} s WHERE s.card_id = c.id "
    "AND s.minute = a.minute AND s.minute >= %s AND s.minute < %s OFFSET 0) m "
    "JOIN billing_workload w ON w.id = m.workload_id"
)
# One aggregation over both (not the inbox summed first): it costs what summing the inbox alone did.
_WORKLOADS_SQL = (
    f"{_INBOX_SQL}SELECT {_KEY_COLUMNS}, "  # noqa: S608 - as above
    f"{', '.join(f'sum(f{i}), sum(x{i})' for i in range(len(_STORED_INTEGRALS)))} "
    f"FROM ({_INBOX_ROWS} UNION ALL {_STORED_SQL}) "
    f"AS w({_KEY_COLUMNS}, {', '.join(f'f{i}, x{i}' for i in range(len(_STORED_INTEGRALS)))}) "
    "GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9 ORDER BY 1, 2, 3, 4, 5, 6, 7, 8, 9"
)
_ZERO = Decimal(0)


def _total(fast: float | None, exact: Decimal | None) -> Decimal:
    return (_ZERO if fast is None else Decimal(fast)) + (_ZERO if exact is None else exact)


def _workloads(cur: CursorWrapper, nodes: list[int], gpus: list[str], lo: datetime, hi: datetime,  # noqa: PLR0917 - a private helper whose one caller passes its loop's state in order
               affected: set[Key], rolling: Sequence[int]) -> dict[Key, list[tuple[Any, ...]]]:
    """Each workload's integrals per affected GPU-minute, summed exactly: those the minute store
    holds plus the inbox rows of the `rolling` batches, which it deletes (the caller writes the sums
    into the store in the same transaction): (tenant, namespace, pod, container, pod_uid, sla_tier,
    seconds, mem used, granted, max, sm used, granted, max, pcie). Ordered by workload identity
    within a minute: the order the largest-remainder allocation breaks ties in. The rolling
    batches' rows lie in their GPUs' windows (ingest checks it), which `affected` holds; the caller
    refuses any other, which would be deleted unpriced."""
    cur.execute(_WORKLOADS_SQL, [nodes, gpus, lo, hi, list(rolling), *_arrays(affected), lo, hi])
    workloads: dict[Key, list[tuple[Any, ...]]] = defaultdict(list)
    for r in cur.fetchall():
        workloads[(r[0], r[1], r[2])].append((*r[3:9], *(_total(r[i], r[i + 1]) for i in range(9, 25, 2))))
    return workloads


def _rate_of(cards: RateCards, model: str, minute: datetime, *, covered: bool) -> tuple[Rate, str, bool]:
    """The rate, currency and priced flag of one GPU-minute: the commitment pool's rate when the
    card is covered (α, billed basis and idle policy still the market card's), else the market card's."""
    card = cards.card_for(model, minute)
    pool = cards.pool_for(model, minute) if covered else None
    if pool is not None:
        base = card.rate if card else Rate(price_per_gpu_hour=Decimal(0))
        rate = Rate(price_per_gpu_hour=pool.price_per_gpu_hour, alpha=base.alpha, billed_basis=base.billed_basis,
                    idle_policy=base.idle_policy)
        return rate, pool.currency, True
    if card is not None:
        return card.rate, card.currency, True
    return Rate(price_per_gpu_hour=Decimal(0)), "", False


def _last_days(workloads: dict[Key, list[tuple[Any, ...]]]) -> dict[tuple[Any, ...], date]:
    """Each workload written and the UTC day of its latest minute among them."""
    days: dict[tuple[Any, ...], date] = {}
    for (_, _, minute), rows in workloads.items():
        day = minute.astimezone(UTC).date()
        for r in rows:
            if days.get(r[:6], day) <= day:
                days[r[:6]] = day
    return days


def _priced_rows(windows: dict[Key, _Window], workloads: dict[Key, list[tuple[Any, ...]]],
                 cards: RateCards, covered: set[Key], *, card_ids: dict[tuple[Any, ...], int],
                 workload_ids: dict[tuple[Any, ...], int]) -> tuple[io.StringIO, io.StringIO]:
    """COPY text of the minute rows, for the slim store (_STORE_COLUMNS, _GPU_STORE_COLUMNS): each
    GPU-minute priced by the commitment that covers it, else by the card in force (docs/billing.md,
    Rate cards; Commitments and on-prem cards)."""
    usage_lines: list[str] = []
    gpu_lines: list[str] = []
    for (node_id, gpu_uuid, minute), w in windows.items():
        rows = workloads.get((node_id, gpu_uuid, minute), [])
        card = cards.card_for(w.model, minute)
        is_covered = (node_id, gpu_uuid, minute) in covered
        rate, currency, is_priced = _rate_of(cards, w.model, minute, covered=is_covered)
        priced = price_gpu_window(
            window=GpuWindowUsage(memory_mb=w.memory_mb, sm_count=w.sm_count, metered_seconds=w.seconds,
                                  workloads=[WorkloadQuantities(mem_used_mb_s=r[7], mem_granted_mb_s=r[8],
                                                                mem_max_mb_s=r[9], sm_used_s=r[10],
                                                                sm_granted_s=r[11], sm_max_s=r[12]) for r in rows],
                                  energy_j=w.energy_j),
            rate=rate,
        )
        prefix = f"{minute.isoformat()}\t{card_ids[(node_id, gpu_uuid, w.model)]}\t"
        basis = _BASIS_CODE[rate.billed_basis]  # priced.billed_*: the integrals of that basis
        for i, r in enumerate(rows):
            usage_lines.append(
                f"{prefix}{workload_ids[r[:6]]}\t{r[6]}\t{r[7]}\t{r[8]}\t{r[9]}\t{r[10]}\t{r[11]}\t{r[12]}\t{r[13]}\t"
                f"{basis}\t{priced.share_gpu_s[i]}\t{priced.charges[i]}\t{priced.idle_shares[i]}\t{priced.energies[i]}\n"
            )
        committed = (w.seconds, priced.card_cost) if is_covered else (0, 0)
        gpu_lines.append(
            f"{prefix}{card.id if card else 0}\t{w.seconds}\t{committed[0]}\t{w.energy_seconds}\t"
            f"{priced.card_cost}\t{priced.charged}\t{priced.idle_cost}\t{priced.idle_allocated}\t{committed[1]}\t"
            f"{w.energy_j}\t{priced.idle_energy_j}\t{'t' if is_priced else 'f'}\t{currency}\n"
        )
    return io.StringIO("".join(usage_lines)), io.StringIO("".join(gpu_lines))


def _recompute_hours(cur: CursorWrapper, hours: set[Key]) -> None:
    """Replace the hour rows of `hours` (node, GPU, hour) with the sums of their minutes. The store is
    read minute by minute of each hour (its index is (minute, card): a range of minutes
    would read the whole fleet's index entries of the hour for each card; docs/architecture.md)."""
    node_col, gpu_col, hour_col = _arrays(hours)
    keys: list[Any] = [node_col, gpu_col, hour_col]
    touched = f"{_UNNEST} AS a(node_id, gpu_uuid, hour)"
    for table in ("billing_usagehour", "billing_gpuhour"):
        cur.execute(f"DELETE FROM {table} h USING {touched} WHERE h.node_id = a.node_id "  # noqa: S608 - fixed names
                    "AND h.gpu_uuid = a.gpu_uuid AND h.hour = a.hour", keys)
    minutes = f"FROM {touched} JOIN billing_card c ON c.node_id = a.node_id AND c.gpu_uuid = a.gpu_uuid "
    # Each minute of the hour probed by (minute, card): 378 buffers for one card-hour of a day of 1,000
    # cards x 16 workloads, against 3,799 for the range of the hour, which reads every card's entries.
    of_hour = ("m.minute = ANY(ARRAY(SELECT generate_series(a.hour, a.hour + interval '59 minutes', "
               "interval '1 minute'))) AND m.card_id = c.id")
    integrals = ", ".join(f"sum(billing_exact({_stored(c, 'm')})) AS {c}" for c in _USAGE_COLUMNS[8:16])
    amounts = ", ".join(f"sum(m.{c}) AS {c}" for c in _USAGE_COLUMNS[16:])
    # Each row with its container's requested figures from the pod's metadata as it is now
    # (billing.ledger.requests: a change committed after this statement flags the pod).
    requested = ", ".join(requested_sql(f, requests="r.requests", container="w.container", seconds="h.seconds")
                          for f in REQUESTED_COLUMNS)
    cur.execute(
        f"INSERT INTO billing_usagehour (hour, {', '.join(_USAGE_COLUMNS)}, {', '.join(REQUESTED_COLUMNS.values())}) "  # noqa: S608 - fixed column names
        f"SELECT h.hour, h.gpu_uuid, h.node_id, {', '.join(f'w.{k}' for k in _WORKLOAD_KEY)}, "
        f"{', '.join(f'h.{c}' for c in _USAGE_COLUMNS[8:])}, {requested} FROM (SELECT a.hour, a.gpu_uuid, a.node_id, "
        f"m.workload_id, {integrals}, {amounts} {minutes}JOIN {USAGE_STORE} m ON {of_hour} "
        "GROUP BY a.hour, a.gpu_uuid, a.node_id, m.workload_id) h JOIN billing_workload w ON w.id = h.workload_id "
        "LEFT JOIN billing_workloadmeta r ON r.node_id = h.node_id AND r.namespace = w.namespace AND r.pod = w.pod "
        "AND r.pod_uid = w.pod_uid",
        keys,
    )
    # The card's Σ share from the usage rows just written (a GPU-hour's few, by their index): what idle
    # reads instead of the usage rows (GpuHour.share_gpu_s).
    cur.execute(
        "INSERT INTO billing_gpuhour (hour, gpu_uuid, node_id, gpu_model, metered_seconds, card_cost, charged, "
        "idle_cost, idle_allocated, currency, priced, committed_seconds, committed_cost, energy_j, idle_energy_j, "
        "energy_seconds, share_gpu_s) "
        "SELECT a.hour, a.gpu_uuid, a.node_id, max(c.gpu_model), sum(billing_exact(m.metered_seconds)), "
        "sum(m.card_cost), sum(m.charged), sum(m.idle_cost), sum(m.idle_allocated), max(m.currency), "
        "bool_and(m.priced), sum(billing_exact(m.committed_seconds)), sum(m.committed_cost), sum(m.energy_j), "
        f"sum(m.idle_energy_j), sum(billing_exact(m.energy_seconds)), {_CARD_SHARE_OF_HOUR} "
        f"{minutes}JOIN {GPU_STORE} m ON {of_hour} GROUP BY a.hour, a.gpu_uuid, a.node_id",
        keys,
    )


# Σ the share of the usage rows of the GPU-hour `a` (its node, GPU and hour): GpuHour.share_gpu_s.
_CARD_SHARE_OF_HOUR = ("coalesce((SELECT sum(u.share_gpu_s) FROM billing_usagehour u WHERE u.node_id = a.node_id "
                       "AND u.gpu_uuid = a.gpu_uuid AND u.hour = a.hour), 0)")


# Day rows are grouped exactly like hour rows (node, GPU + workload identity), per UTC day. The
# migration 0013 backfill froze the same SQL before the node joined the key (one node per GPU-day
# then); tests/billing/test_daily_ledger.py checks they agree.
_DAY_OF = "date_trunc('day', h.hour, 'UTC')"
# A day row's columns as the day step writes them: the hours' sums, first and last hour, requested figures.
_DAY_COLUMNS = (*_USAGE_COLUMNS, "first_hour", "last_hour", *REQUESTED_COLUMNS.values(), "peak_hour_mean_mb",
                "peak_hour_mean_sm")
# A day row's highest hourly means, of its hour rows `h` (UsageDay.peak_hour_mean_mb).
_DAY_PEAKS = "max(h.mem_used_mb_s / nullif(h.seconds, 0)), max(h.sm_used_s / nullif(h.seconds, 0))"


def _usage_days_insert(source: str) -> str:
    keys = ", ".join(f"h.{k}" for k in _WORKLOAD_KEY)
    sums = ", ".join(f"sum(h.{c})" for c in _USAGE_COLUMNS[8:])
    return (
        f"INSERT INTO billing_usageday (day, {', '.join(_DAY_COLUMNS)}) "  # noqa: S608 - built from constant column lists
        f"SELECT {_DAY_OF}, h.gpu_uuid, h.node_id, {keys}, {sums}, min(h.hour), max(h.hour), {requested_sums('h')}, "
        f"{_DAY_PEAKS} FROM billing_usagehour h {source} GROUP BY {_DAY_OF}, h.gpu_uuid, h.node_id, {keys}"
    )


def _gpu_days_insert(source: str) -> str:
    return (
        "INSERT INTO billing_gpuday (day, gpu_uuid, node_id, gpu_model, metered_seconds, card_cost, charged, "  # noqa: S608 - built from constant column lists
        "idle_cost, idle_allocated, currency, priced, unpriced_seconds, committed_seconds, committed_cost, "
        "energy_j, idle_energy_j, energy_seconds, share_gpu_s) "
        f"SELECT {_DAY_OF}, h.gpu_uuid, h.node_id, max(h.gpu_model), sum(h.metered_seconds), sum(h.card_cost), "
        "sum(h.charged), sum(h.idle_cost), sum(h.idle_allocated), max(h.currency), bool_and(h.priced), "
        "coalesce(sum(h.metered_seconds) FILTER (WHERE NOT h.priced), 0), sum(h.committed_seconds), "
        "sum(h.committed_cost), sum(h.energy_j), sum(h.idle_energy_j), sum(h.energy_seconds), sum(h.share_gpu_s) "
        f"FROM billing_gpuhour h {source} GROUP BY {_DAY_OF}, h.gpu_uuid, h.node_id"
    )


_TOUCHED_DAYS = (f"JOIN {_UNNEST} AS a(node_id, gpu_uuid, day) ON h.node_id = a.node_id "
                 "AND h.gpu_uuid = a.gpu_uuid AND h.hour >= a.day AND h.hour < a.day + interval '1 day'")
# The workload-days of the hours just recomputed: each (node, GPU, UTC day) with a workload's names.
_TOUCHED_WORKLOAD_DAYS = (
    f"SELECT DISTINCT h.node_id, h.gpu_uuid, {_DAY_OF}, {', '.join(f'h.{k}' for k in _WORKLOAD_KEY)} "  # noqa: S608 - built from constant column lists
    f"FROM billing_usagehour h JOIN {_UNNEST} AS a(node_id, gpu_uuid, hour) ON h.node_id = a.node_id "
    "AND h.gpu_uuid = a.gpu_uuid AND h.hour = a.hour"
)
_WORKLOAD_DAY = f"node_id, gpu_uuid, day, {', '.join(_WORKLOAD_KEY)}"
# Rows of the GPU-days (a) that are one of those workload-days: each GPU-day's rows read by its index
# (node, GPU, time) behind a fence, then kept by a hashed lookup of the workload-days, so that a
# cycle reads a GPU-day's rows once whatever the planner makes of the arrays' sizes.
_OF_WORKLOAD_DAYS = (
    f"IN (SELECT * FROM unnest(%s::bigint[], %s::varchar[], %s::timestamptz[], {', '.join(['%s::varchar[]'] * 6)}))"  # noqa: S608 - fixed SQL; values are parameters
)
_USAGE_DAYS_OF_WORKLOADS = (
    f"INSERT INTO billing_usageday (day, {', '.join(_DAY_COLUMNS)}) "  # noqa: S608 - built from constant column lists
    f"SELECT {_DAY_OF}, h.gpu_uuid, h.node_id, {', '.join(f'h.{k}' for k in _WORKLOAD_KEY)}, "
    f"{', '.join(f'sum(h.{c})' for c in _USAGE_COLUMNS[8:])}, min(h.hour), max(h.hour), {requested_sums('h')}, "
    f"{_DAY_PEAKS} FROM {_UNNEST} AS a(node_id, gpu_uuid, day) CROSS JOIN LATERAL (SELECT * FROM billing_usagehour u "
    "WHERE u.node_id = a.node_id AND u.gpu_uuid = a.gpu_uuid AND u.hour >= a.day AND u.hour < a.day + interval '1 day' "
    f"OFFSET 0) h WHERE (h.node_id, h.gpu_uuid, {_DAY_OF}, {', '.join(f'h.{k}' for k in _WORKLOAD_KEY)}) "
    f"{_OF_WORKLOAD_DAYS} GROUP BY {_DAY_OF}, h.gpu_uuid, h.node_id, {', '.join(f'h.{k}' for k in _WORKLOAD_KEY)}"
)
_DELETE_USAGE_DAYS_OF_WORKLOADS = (
    "DELETE FROM billing_usageday WHERE ctid = ANY(ARRAY(SELECT d.ctid "  # noqa: S608 - built from constant column lists
    f"FROM {_UNNEST} AS a(node_id, gpu_uuid, day) CROSS JOIN LATERAL (SELECT u.ctid, u.* FROM billing_usageday u "
    "WHERE u.node_id = a.node_id AND u.gpu_uuid = a.gpu_uuid AND u.day = a.day OFFSET 0) d "
    f"WHERE (d.{_WORKLOAD_DAY.replace(', ', ', d.')}) {_OF_WORKLOAD_DAYS}))"
)


def _recompute_days(cur: CursorWrapper, hours: set[Key]) -> None:
    """Replace the day rows of the workloads whose hour rows in `hours` (node, GPU, hour) were just
    recomputed, and the GPU-day rows of those GPU-days.

    Only those workloads: a GPU-day holds a row for every pod that ran on it that day, and where
    pods churn that is many times the pods running now (the fleet bench's pods, living 5-360
    minutes, are 277 a GPU by the day's end against 16 at a time), so re-deriving every row of the
    GPU-day on each cycle rewrote the whole day's pods every minute, growing through the day. The
    hours just recomputed hold every workload whose figures changed: a minute priced again changes
    only its own workloads, and a recompute never drops a workload from an hour (integrals add)."""
    node_col, gpu_col, hour_col = _arrays(hours)
    cur.execute(_TOUCHED_WORKLOAD_DAYS, [node_col, gpu_col, hour_col])
    workload_days = sorted(cur.fetchall())
    touched = [list(c) for c in zip(*workload_days, strict=True)]
    days = {(n, g, h.replace(hour=0)) for n, g, h in hours}
    keys: list[Any] = list(_arrays(days))
    if touched:
        cur.execute(_DELETE_USAGE_DAYS_OF_WORKLOADS, [*keys, *touched])
        cur.execute(_USAGE_DAYS_OF_WORKLOADS, [*keys, *touched])
    cur.execute("DELETE FROM billing_gpuday d USING " + _UNNEST + " AS a(node_id, gpu_uuid, day) "  # noqa: S608 - fixed SQL; values are parameters
                "WHERE d.node_id = a.node_id AND d.gpu_uuid = a.gpu_uuid AND d.day = a.day "
                "RETURNING d.node_id, d.gpu_uuid, d.day, d.gpu_model", keys)
    models_before = set(cur.fetchall())
    cur.execute(_gpu_days_insert(_TOUCHED_DAYS) + " RETURNING node_id, gpu_uuid, day, gpu_model", keys)
    remodelled = {r[:3] for r in models_before ^ set(cur.fetchall())}  # a month row's group has the model
    recompute_months(cur, workload_days, remodelled)


def rebuild_days(*, start: datetime, end: datetime, gpu_uuid: str | None = None) -> int:
    """Recompute the day ledger for every UTC day that meets [start, end) (of one GPU, or of all)
    from the hour ledger as it is: for hour rows written other than by the rollup (the web-pages
    benchmark's COPY, hour rows saved through the ORM). Returns the number of GpuDay rows written.
    Holds the ledger lock exclusively. Refused for days whose hours retention pruned: recomputed
    from what is left, the days would lose them."""
    if end <= start:
        raise ValueError("end must be after start")
    with transaction.atomic(), connection.cursor() as cur:
        lock_ledger()
        require_hours_retained(start=start.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0))
        cur.execute(
            "SELECT date_trunc('day', %s::timestamptz, 'UTC'), "
            "date_trunc('day', %s::timestamptz - interval '1 microsecond', 'UTC') + interval '1 day'",
            [start, end],
        )
        lo, hi = cur.fetchone()
        gpu = "" if gpu_uuid is None else " AND gpu_uuid = %s"
        params = [lo, hi] if gpu_uuid is None else [lo, hi, gpu_uuid]
        # Hours written other than by the rollup carry no Σ share of their usage rows (or a stale one).
        cur.execute(f"UPDATE billing_gpuhour a SET share_gpu_s = {_CARD_SHARE_OF_HOUR} "  # noqa: S608 - as below
                    f"WHERE a.hour >= %s AND a.hour < %s{gpu.replace('gpu_uuid', 'a.gpu_uuid')} "
                    f"AND a.share_gpu_s <> {_CARD_SHARE_OF_HOUR}", params)
        # Nor the requested figures of their pods' metadata (billing.ledger.requests).
        store_requests(cur, start=lo, end=hi, gpu_uuid=gpu_uuid)
        cur.execute(f"DELETE FROM billing_usageday WHERE day >= %s AND day < %s{gpu}", params)  # noqa: S608 - a constant filter; values are parameters
        cur.execute(f"DELETE FROM billing_gpuday WHERE day >= %s AND day < %s{gpu}", params)  # noqa: S608 - as above
        in_range = "WHERE h.hour >= %s AND h.hour < %s" + gpu.replace("gpu_uuid", "h.gpu_uuid")
        cur.execute(_usage_days_insert(in_range), params)
        cur.execute(_gpu_days_insert(in_range), params)
        written = int(cur.rowcount)
        rebuild_months(cur, lo=lo, hi=hi, gpu_uuid=gpu_uuid)
        return written
