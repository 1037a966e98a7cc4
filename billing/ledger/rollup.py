"""Rollup of raw samples into the priced minute, hour and day ledgers (DESIGN §4, §8).

The unit of work is a GPU-minute. Each run takes the batches not yet rolled up, finds the
GPU-minutes they touch, and recomputes those minutes wholesale from raw samples (then
their hours from minutes and their UTC days from hours, in the same transaction). Recomputing instead of adding makes the rollup idempotent —
running it twice changes nothing — and lets late batches land in already-rolled minutes.
One rollup runs at a time (transaction-level advisory lock). A batch that cannot be rolled
up is quarantined, never allowed to stop the others.
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection, transaction

from billing.ledger.partitions import days_between, ensure_minute_partitions
from billing.ledger.retention import require_raw_samples
from billing.models import RateCard
from billing.services.pricing import GpuWindowUsage, Rate, WorkloadQuantities, price_gpu_window
from billing.services.quarantine import quarantine_batch

__all__ = ["RollupResult", "lock_ledger", "rebuild_days", "rebuild_ledger", "rollup_usage"]

_LOCK_KEY = 0x726F6C6C  # "roll"
_WORKLOAD_KEY = ("tenant", "namespace", "pod", "container", "pod_uid", "sla_tier")
_USAGE_COLUMNS = (
    "gpu_uuid", "node_id", "tenant", "namespace", "pod", "container", "pod_uid", "sla_tier", "seconds",
    "mem_used_mb_s", "mem_granted_mb_s", "mem_billed_mb_s", "sm_used_s", "sm_granted_s", "sm_billed_s",
    "pcie_mb", "share_gpu_s", "charge", "idle_share",
)
_GPU_COLUMNS = (
    "gpu_uuid", "node_id", "gpu_model", "metered_seconds", "card_cost", "charged", "idle_cost",
    "idle_allocated", "currency", "priced",
)


@dataclass(frozen=True)
class RollupResult:
    batches: int
    gpu_minutes: int
    gpu_hours: int
    skipped: bool = False
    quarantined: int = 0


@dataclass(frozen=True)
class _Card:
    id: int
    gpu_model: str
    start: datetime
    end: datetime | None
    currency: str
    rate: Rate


def _load_cards() -> dict[str, list[_Card]]:
    cards: dict[str, list[_Card]] = defaultdict(list)
    for rc in RateCard.objects.order_by("effective_from"):
        cards[rc.gpu_model].append(
            _Card(
                id=rc.pk,
                gpu_model=rc.gpu_model,
                start=rc.effective_from,
                end=rc.effective_to,
                currency=rc.currency,
                rate=Rate(
                    price_per_gpu_hour=rc.price_per_gpu_hour,
                    alpha=rc.alpha,
                    billed_basis=rc.billed_basis,
                    idle_policy=rc.idle_policy,
                ),
            )
        )
    return cards


def _card_for(cards: dict[str, list[_Card]], model: str, minute: datetime) -> _Card | None:
    for card in cards.get(model, ()):
        if card.start <= minute and (card.end is None or minute < card.end):
            return card
    return None


def rollup_usage(*, now: datetime, max_batches: int = 5000) -> RollupResult:
    """Roll up pending batches (at most `max_batches`, oldest first).

    A batch that cannot be rolled up, for any reason, must not stop billing for the fleet: when
    the cycle fails, each batch is rolled up alone and the ones that still fail are quarantined
    with their error (billing.services.quarantine); every other batch goes on."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_xact_lock(%s)", [_LOCK_KEY])
        if not cur.fetchone()[0]:
            return RollupResult(batches=0, gpu_minutes=0, gpu_hours=0, skipped=True)
        cur.execute(
            "SELECT id FROM billing_usagebatch WHERE rolled_up_at IS NULL AND quarantined_at IS NULL "
            "ORDER BY id LIMIT %s", [max_batches]
        )
        batch_ids = [r[0] for r in cur.fetchall()]
        if not batch_ids:
            return RollupResult(batches=0, gpu_minutes=0, gpu_hours=0)
        try:
            with transaction.atomic():
                minutes, hours = _roll_up(cur, batch_ids, now=now, held_back=())
        except Exception:  # noqa: BLE001 - any failure of one batch is isolated below, not raised
            return _roll_up_one_by_one(cur, batch_ids, now=now)
    return RollupResult(batches=len(batch_ids), gpu_minutes=minutes, gpu_hours=hours)


def _roll_up(cur, batch_ids: list[int], *, now: datetime, held_back: Sequence[int]) -> tuple[int, int]:
    """Recompute the GPU-minutes `batch_ids` touch, leaving out the samples of quarantined
    batches and of `held_back` (pending batches not tried yet), and mark `batch_ids` rolled up."""
    _exclude(cur, held_back)
    cur.execute(
        "CREATE TEMP TABLE rollup_affected ON COMMIT DROP AS "
        "SELECT DISTINCT bg.gpu_uuid, m.minute FROM billing_batchgpu bg, "
        "generate_series(date_trunc('minute', bg.window_start), bg.window_end - interval '1 microsecond', "
        "interval '1 minute') AS m(minute) WHERE bg.batch_id = ANY(%s)",
        [batch_ids],
    )
    minutes, hours = _recompute(cur)
    cur.execute("UPDATE billing_usagebatch SET rolled_up_at = %s WHERE id = ANY(%s)", [now, batch_ids])
    return minutes, hours


def _roll_up_one_by_one(cur, batch_ids: list[int], *, now: datetime) -> RollupResult:
    """Each batch alone, oldest first, with the batches after it held back: a batch fails here
    only for what it carries itself, never for a poisoned neighbour in the same GPU-minute.
    The last recompute of a minute includes every good batch of it, so the ledger ends as if
    the quarantined batches had never arrived."""
    minutes = hours = rolled = 0
    for i, batch_id in enumerate(batch_ids):
        try:
            with transaction.atomic():
                m, h = _roll_up(cur, [batch_id], now=now, held_back=batch_ids[i + 1:])
        except Exception as exc:  # noqa: BLE001 - the error is kept on the batch and shown
            quarantine_batch(batch_id=batch_id, error=f"{type(exc).__name__}: {exc}", now=now)
            continue
        minutes, hours, rolled = minutes + m, hours + h, rolled + 1
    return RollupResult(batches=rolled, gpu_minutes=minutes, gpu_hours=hours, quarantined=len(batch_ids) - rolled)


def _exclude(cur, held_back: Sequence[int]) -> None:
    """rollup_excluded: batches whose samples and GPU windows this recompute leaves out."""
    cur.execute("DROP TABLE IF EXISTS rollup_affected, rollup_hours, rollup_days, rollup_excluded")
    cur.execute(
        "CREATE TEMP TABLE rollup_excluded ON COMMIT DROP AS "
        "SELECT id AS batch_id FROM billing_usagebatch WHERE quarantined_at IS NOT NULL "
        "UNION SELECT unnest(%s::bigint[])",
        [list(held_back)],
    )


def lock_ledger() -> None:
    """Hold the rollup's lock until the current transaction ends: no rollup or rebuild runs
    meanwhile (a rate-card change re-prices under it)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])


def rebuild_ledger(*, start: datetime, end: datetime) -> RollupResult:
    """Recompute every GPU-minute in [start, end) from raw samples (after a rate-card change)."""
    if end <= start:
        raise ValueError("end must be after start")
    with transaction.atomic(), connection.cursor() as cur:
        lock_ledger()
        require_raw_samples(start=start)  # retention may have dropped the samples: refuse, never guess
        _exclude(cur, ())
        cur.execute(
            "CREATE TEMP TABLE rollup_affected ON COMMIT DROP AS "
            "SELECT DISTINCT bg.gpu_uuid, m.minute FROM billing_batchgpu bg, "
            "generate_series(date_trunc('minute', greatest(bg.window_start, %s)), "
            "least(bg.window_end, %s) - interval '1 microsecond', interval '1 minute') AS m(minute) "
            "WHERE bg.window_start < %s AND bg.window_end > %s",
            [start, end, end, start],
        )
        minutes, hours = _recompute(cur)
    return RollupResult(batches=0, gpu_minutes=minutes, gpu_hours=hours)


def _recompute(cur) -> tuple[int, int]:
    cur.execute("CREATE INDEX ON rollup_affected (gpu_uuid, minute)")
    cur.execute("ANALYZE rollup_affected")
    cur.execute("SELECT min(minute), max(minute) + interval '1 minute' FROM rollup_affected")
    lo, hi = cur.fetchone()
    if lo is None:
        return 0, 0
    ensure_minute_partitions(days_between(lo, hi))  # the minute ledger is day-partitioned (retention)
    # Card seconds per GPU-minute: overlap of the GPU's batch windows with the minute.
    cur.execute(
        "SELECT a.gpu_uuid, a.minute, max(b.node_id), max(bg.model), max(bg.memory_mb), max(bg.sm_count), "
        "sum(extract(epoch FROM least(bg.window_end, a.minute + interval '1 minute') "
        "- greatest(bg.window_start, a.minute))) "
        "FROM rollup_affected a JOIN billing_batchgpu bg ON bg.gpu_uuid = a.gpu_uuid "
        "AND bg.window_start < a.minute + interval '1 minute' AND bg.window_end > a.minute "
        "JOIN billing_usagebatch b ON b.id = bg.batch_id "
        "WHERE NOT EXISTS (SELECT 1 FROM rollup_excluded x WHERE x.batch_id = bg.batch_id) "
        "GROUP BY a.gpu_uuid, a.minute"
    )
    windows = {(r[0], r[1]): r[2:] for r in cur.fetchall()}
    cur.execute(
        "SELECT r.gpu_uuid, date_trunc('minute', r.start), r.tenant, r.namespace, r.pod, r.container, "
        "r.pod_uid, r.sla_tier, sum(r.seconds::numeric), sum(r.mem_used_mb_s::numeric), "
        "sum(r.mem_granted_mb_s::numeric), sum(greatest(r.mem_used_mb_s, r.mem_granted_mb_s)::numeric), "
        "sum(r.sm_used_s::numeric), sum(r.sm_granted_s::numeric), "
        "sum(greatest(r.sm_used_s, r.sm_granted_s)::numeric), sum(r.pcie_mb::numeric) "
        "FROM billing_raw_sample r JOIN rollup_affected a ON a.gpu_uuid = r.gpu_uuid "
        "AND a.minute = date_trunc('minute', r.start) WHERE r.start >= %s AND r.start < %s "
        "AND NOT EXISTS (SELECT 1 FROM rollup_excluded x WHERE x.batch_id = r.batch_id) "
        "GROUP BY 1, 2, 3, 4, 5, 6, 7, 8 ORDER BY 1, 2, 3, 4, 5, 6, 7, 8",
        [lo, hi],
    )
    workloads: dict[tuple[str, datetime], list[tuple]] = defaultdict(list)
    for r in cur.fetchall():
        workloads[(r[0], r[1])].append(r[2:])

    cards = _load_cards()
    usage_buf, gpu_buf = io.StringIO(), io.StringIO()
    for (gpu_uuid, minute), (node_id, model, memory_mb, sm_count, seconds) in windows.items():
        rows = workloads.get((gpu_uuid, minute), [])
        card = _card_for(cards, model, minute)
        quantities = [
            WorkloadQuantities(
                mem_used_mb_s=r[7], mem_granted_mb_s=r[8], mem_max_mb_s=r[9],
                sm_used_s=r[10], sm_granted_s=r[11], sm_max_s=r[12],
            )
            for r in rows
        ]
        rate = card.rate if card else Rate(price_per_gpu_hour=Decimal(0))
        priced = price_gpu_window(
            window=GpuWindowUsage(memory_mb=memory_mb, sm_count=sm_count, metered_seconds=seconds, workloads=quantities),
            rate=rate,
        )
        for i, r in enumerate(rows):
            usage_buf.write(
                "\t".join(
                    str(v)
                    for v in (
                        minute.isoformat(), gpu_uuid, node_id, *r[:6], r[6],
                        r[7], r[8], priced.billed_mem_mb_s[i], r[10], r[11], priced.billed_sm_s[i], r[13],
                        priced.share_gpu_s[i], priced.charges[i], priced.idle_shares[i],
                        card.id if card else "\\N",
                    )
                )
                + "\n"
            )
        gpu_buf.write(
            "\t".join(
                str(v)
                for v in (
                    minute.isoformat(), gpu_uuid, node_id, model, seconds, priced.card_cost, priced.charged,
                    priced.idle_cost, priced.idle_allocated, card.currency if card else "",
                    "t" if card else "f", card.id if card else "\\N",
                )
            )
            + "\n"
        )
    cur.execute(
        "DELETE FROM billing_usageminute m USING rollup_affected a WHERE m.gpu_uuid = a.gpu_uuid AND m.minute = a.minute"
    )
    cur.execute(
        "DELETE FROM billing_gpuminute m USING rollup_affected a WHERE m.gpu_uuid = a.gpu_uuid AND m.minute = a.minute"
    )
    usage_buf.seek(0)
    gpu_buf.seek(0)
    cur.copy_expert(
        f"COPY billing_usageminute (minute, {', '.join(_USAGE_COLUMNS)}, rate_card_id) FROM STDIN", usage_buf
    )
    cur.copy_expert(f"COPY billing_gpuminute (minute, {', '.join(_GPU_COLUMNS)}, rate_card_id) FROM STDIN", gpu_buf)
    return len(windows), _recompute_hours(cur)


def _recompute_hours(cur) -> int:
    cur.execute(
        "CREATE TEMP TABLE rollup_hours ON COMMIT DROP AS "
        "SELECT DISTINCT gpu_uuid, date_trunc('hour', minute) AS hour FROM rollup_affected"
    )
    cur.execute("DELETE FROM billing_usagehour h USING rollup_hours a WHERE h.gpu_uuid = a.gpu_uuid AND h.hour = a.hour")
    cur.execute("DELETE FROM billing_gpuhour h USING rollup_hours a WHERE h.gpu_uuid = a.gpu_uuid AND h.hour = a.hour")
    keys = ", ".join(f"m.{k}" for k in _WORKLOAD_KEY)
    sums = ", ".join(f"sum(m.{c})" for c in _USAGE_COLUMNS[8:])
    cur.execute(
        f"INSERT INTO billing_usagehour (hour, {', '.join(_USAGE_COLUMNS)}) "  # noqa: S608 - fixed column names
        f"SELECT a.hour, m.gpu_uuid, max(m.node_id), {keys}, {sums} FROM billing_usageminute m "
        "JOIN rollup_hours a ON m.gpu_uuid = a.gpu_uuid AND m.minute >= a.hour AND m.minute < a.hour + interval '1 hour' "
        f"GROUP BY a.hour, m.gpu_uuid, {keys}"
    )
    cur.execute(
        "INSERT INTO billing_gpuhour (hour, gpu_uuid, node_id, gpu_model, metered_seconds, card_cost, charged, "
        "idle_cost, idle_allocated, currency, priced) "
        "SELECT a.hour, m.gpu_uuid, max(m.node_id), max(m.gpu_model), sum(m.metered_seconds), sum(m.card_cost), "
        "sum(m.charged), sum(m.idle_cost), sum(m.idle_allocated), max(m.currency), bool_and(m.priced) "
        "FROM billing_gpuminute m JOIN rollup_hours a ON m.gpu_uuid = a.gpu_uuid AND m.minute >= a.hour "
        "AND m.minute < a.hour + interval '1 hour' GROUP BY a.hour, m.gpu_uuid"
    )
    cur.execute("SELECT count(*) FROM rollup_hours")
    hours = int(cur.fetchone()[0])
    _recompute_days(cur)
    return hours


# Day rows are grouped exactly like hour rows (GPU + workload identity), per UTC day. The
# migration 0013 backfill freezes the same SQL; tests/billing/test_daily_ledger.py checks both.
_DAY_OF = "date_trunc('day', h.hour, 'UTC')"


def _usage_days_insert(source: str) -> str:
    keys = ", ".join(f"h.{k}" for k in _WORKLOAD_KEY)
    sums = ", ".join(f"sum(h.{c})" for c in _USAGE_COLUMNS[8:])
    return (
        f"INSERT INTO billing_usageday (day, {', '.join(_USAGE_COLUMNS)}, first_hour, last_hour) "  # noqa: S608
        f"SELECT {_DAY_OF}, h.gpu_uuid, max(h.node_id), {keys}, {sums}, min(h.hour), max(h.hour) "
        f"FROM billing_usagehour h {source} GROUP BY {_DAY_OF}, h.gpu_uuid, {keys}"
    )


def _gpu_days_insert(source: str) -> str:
    return (
        "INSERT INTO billing_gpuday (day, gpu_uuid, node_id, gpu_model, metered_seconds, card_cost, charged, "  # noqa: S608
        "idle_cost, idle_allocated, currency, priced, unpriced_seconds) "
        f"SELECT {_DAY_OF}, h.gpu_uuid, max(h.node_id), max(h.gpu_model), sum(h.metered_seconds), sum(h.card_cost), "
        "sum(h.charged), sum(h.idle_cost), sum(h.idle_allocated), max(h.currency), bool_and(h.priced), "
        "coalesce(sum(h.metered_seconds) FILTER (WHERE NOT h.priced), 0) "
        f"FROM billing_gpuhour h {source} GROUP BY {_DAY_OF}, h.gpu_uuid"
    )


_TOUCHED_DAYS = "JOIN rollup_days a ON h.gpu_uuid = a.gpu_uuid AND h.hour >= a.day AND h.hour < a.day + interval '1 day'"


def _recompute_days(cur) -> int:
    """Replace the day rows of every GPU-day whose hours were just recomputed."""
    cur.execute(
        "CREATE TEMP TABLE rollup_days ON COMMIT DROP AS "
        "SELECT DISTINCT gpu_uuid, date_trunc('day', hour, 'UTC') AS day FROM rollup_hours"
    )
    cur.execute("DELETE FROM billing_usageday d USING rollup_days a WHERE d.gpu_uuid = a.gpu_uuid AND d.day = a.day")
    cur.execute("DELETE FROM billing_gpuday d USING rollup_days a WHERE d.gpu_uuid = a.gpu_uuid AND d.day = a.day")
    cur.execute(_usage_days_insert(_TOUCHED_DAYS))
    cur.execute(_gpu_days_insert(_TOUCHED_DAYS))
    cur.execute("SELECT count(*) FROM rollup_days")
    return int(cur.fetchone()[0])


def rebuild_days(*, start: datetime, end: datetime, gpu_uuid: str | None = None) -> int:
    """Recompute the day ledger for every UTC day that meets [start, end) (of one GPU, or of all)
    from the hour ledger as it is: for hour rows written other than by the rollup (the web-pages
    benchmark's COPY, hour rows saved through the ORM). Returns the number of GpuDay rows written.
    Holds the rollup's lock."""
    if end <= start:
        raise ValueError("end must be after start")
    with transaction.atomic(), connection.cursor() as cur:
        lock_ledger()
        cur.execute(
            "SELECT date_trunc('day', %s::timestamptz, 'UTC'), "
            "date_trunc('day', %s::timestamptz - interval '1 microsecond', 'UTC') + interval '1 day'",
            [start, end],
        )
        lo, hi = cur.fetchone()
        gpu = "" if gpu_uuid is None else " AND gpu_uuid = %s"
        params = [lo, hi] if gpu_uuid is None else [lo, hi, gpu_uuid]
        cur.execute(f"DELETE FROM billing_usageday WHERE day >= %s AND day < %s{gpu}", params)  # noqa: S608
        cur.execute(f"DELETE FROM billing_gpuday WHERE day >= %s AND day < %s{gpu}", params)  # noqa: S608
        in_range = "WHERE h.hour >= %s AND h.hour < %s" + gpu.replace("gpu_uuid", "h.gpu_uuid")
        cur.execute(_usage_days_insert(in_range), params)
        cur.execute(_gpu_days_insert(in_range), params)
        return int(cur.rowcount)
