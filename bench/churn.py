"""What a churning fleet costs the rollup's day step and the month close: the two ledger steps whose
work grows with the pods a GPU ran that day or month, not with the pods running now.

    python bench/churn.py [--gpus 1000] [--pods-per-gpu-day 100] [--days 20] [--runs 3]

DATABASE_URL must be set (`python -m config.embedded -- python bench/churn.py` provides it).
Drops and creates `<dbname>_bench`, migrates it, and writes with SQL a month of day rows of a
churning fleet: `--gpus` GPUs on nodes of 8, each running `--pods-per-gpu-day` pods a day: one in ten
a service that runs all month (a day row every day), the others jobs that live within a day (one
day row each), with their GPU-day rows and GPU records. The month rows are derived for the first
`--days` days (billing.ledger.months.rebuild_months), as if closed. The next day gets hour rows (each
job an hour of its own, the services every hour, 16 pods of a GPU in its last hour) and its day rows
derived from them. Then, each alternating with its baseline from the same state (rolled back to a
savepoint), `--runs` times, and checked to leave the same rows:

1. **the day step of one rollup cycle at the day's end**: the day rows after every GPU's last hour
   was recomputed (billing.ledger.rollup._recompute_days), one call per transaction's nodes
   (VGPU_ROLLUP_NODES_PER_TRANSACTION) as the rollup makes it. Shipped: the day rows of the workloads of
   those hours; baseline: every day row of each GPU-day, deleted and summed again from its hours
   (the day step before).
2. **the month close of that day**: shipped `close_days`, which merges the day's rows into the month
   rows of the same workloads and leaves the others; baseline: the month's rows all deleted and
   summed again with the day's, in one statement (close_days before the month key index).
3. **a late batch into the day before, already closed**, on every GPU: the month rows of the
   workloads of that day's last hour re-derived (billing.ledger.months.recompute_months), one call
   per transaction's nodes. Shipped: those workloads' month rows; baseline: every month row of each
   GPU-month, deleted and summed again from its days (the month step before).

Each is timed and its WAL measured (pg_current_wal_insert_lsn before and after: what a commit would
flush and a replica receive). A benchmark never fails on speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.ingest import in_fresh_database  # noqa: E402 - after the path fix above

GPUS_PER_NODE = 8
MONTH = datetime(2026, 3, 1, tzinfo=UTC)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--pods-per-gpu-day", type=int, default=100)
    p.add_argument("--days", type=int, default=20, help="days already in the month rows (1-27)")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    if not 1 <= args.days <= 27:
        p.error("--days: 1 to 27")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return in_fresh_database(lambda: run(args))


def _fill(args: argparse.Namespace) -> None:
    """Nodes, GPUs, --days days of day rows and GPU-day rows and their month rows, and the next day's
    hour rows with the day rows derived from them."""
    from django.db import connection

    from billing.ledger.months import rebuild_months
    from billing.ledger.rollup import rebuild_days

    nodes = -(-args.gpus // GPUS_PER_NODE)
    day_sql = (
        "INSERT INTO billing_usageday (day, gpu_uuid, node_id, tenant, namespace, pod, container, pod_uid, sla_tier, "
        "seconds, mem_used_mb_s, mem_granted_mb_s, mem_billed_mb_s, sm_used_s, sm_granted_s, sm_billed_s, pcie_mb, "
        "share_gpu_s, charge, idle_share, energy_j, first_hour, last_hour) "
        "SELECT %(month)s::timestamptz + d * interval '1 day', 'GPU-' || g, n.id, 'tenant-' || (p %% 20), "
        "'team-' || (p %% 50), w.pod, 'main', md5(w.pod), 'standard', "
        "1800, 1800 * 20480.5, 1800 * 40960, 1800 * 40960, 1800 * 30.25, 1800 * 54, 1800 * 54, 12345.0009765625, "
        "1800 * 0.5, 0.001234567890, 0, 0, %(month)s::timestamptz + d * interval '1 day' + (p %% 24) * interval '1 hour', "
        "%(month)s::timestamptz + d * interval '1 day' + (p %% 24) * interval '1 hour' "
        "FROM generate_series(0, %(days)s - 1) d, generate_series(0, %(gpus)s - 1) g, "
        "generate_series(0, %(pods)s - 1) p, billing_node n, "
        # Every tenth pod a service that runs all month (a row a day, merged each midnight), the rest
        # jobs of a day.
        "LATERAL (SELECT CASE WHEN p %% 10 = 0 THEN 'svc-' || g || '-' || p ELSE 'job-' || d || '-' || g || '-' || p END "
        "AS pod) w WHERE n.name = 'node-' || (g / 8)"
    )
    with connection.cursor() as cur:
        cur.execute("INSERT INTO billing_node (name, created_at, last_seen_at) SELECT 'node-' || i, now(), now() "
                    "FROM generate_series(0, %s - 1) i", [nodes])
        cur.execute("INSERT INTO billing_gpu (uuid, node_id, model, memory_mb, sm_count, first_seen_at, last_seen_at) "
                    "SELECT 'GPU-' || g, n.id, 'NVIDIA A100-SXM4-80GB', 81920, 108, now(), now() "
                    "FROM generate_series(0, %s - 1) g JOIN billing_node n ON n.name = 'node-' || (g / 8)", [args.gpus])
        cur.execute(day_sql, {"month": MONTH, "days": args.days, "gpus": args.gpus, "pods": args.pods_per_gpu_day})
        cur.execute(
            "INSERT INTO billing_gpuday (day, gpu_uuid, node_id, gpu_model, metered_seconds, card_cost, charged, "
            "idle_cost, idle_allocated, currency, priced, unpriced_seconds) "
            "SELECT DISTINCT day, gpu_uuid, node_id, 'NVIDIA A100-SXM4-80GB', 86400, 98.4, 90, 8.4, 0, 'USD', true, 0 "
            "FROM billing_usageday")
        cur.execute("UPDATE billing_month_closed SET closed_through = %s", [MONTH + timedelta(days=args.days)])
        rebuild_months(cur, lo=MONTH, hi=MONTH + timedelta(days=args.days), gpu_uuid=None)
        cur.execute(_HOURS_SQL, {"day": MONTH + timedelta(days=args.days), "gpus": args.gpus,
                                 "pods": args.pods_per_gpu_day})
        cur.execute(_GPU_HOURS_SQL, {"day": MONTH + timedelta(days=args.days)})
    rebuild_days(start=MONTH + timedelta(days=args.days), end=MONTH + timedelta(days=args.days + 1))
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE")


# The closing day's hour rows: the services every hour, each job in an hour of its own (p mod 24),
# with the same names as the month's day rows.
_HOURS_SQL = (
    "INSERT INTO billing_usagehour (hour, gpu_uuid, node_id, tenant, namespace, pod, container, pod_uid, sla_tier, "
    "seconds, mem_used_mb_s, mem_granted_mb_s, mem_billed_mb_s, sm_used_s, sm_granted_s, sm_billed_s, pcie_mb, "
    "share_gpu_s, charge, idle_share, energy_j) "
    "SELECT %(day)s::timestamptz + h * interval '1 hour', 'GPU-' || g, n.id, 'tenant-' || (p %% 20), "
    "'team-' || (p %% 50), w.pod, 'main', md5(w.pod), 'standard', "
    "1800, 1800 * 20480.5, 1800 * 40960, 1800 * 40960, 1800 * 30.25, 1800 * 54, 1800 * 54, 12345.0009765625, "
    "1800 * 0.5, 0.001234567890, 0, 0 "
    "FROM generate_series(0, %(gpus)s - 1) g, generate_series(0, %(pods)s - 1) p, generate_series(0, 23) h, "
    "billing_node n, LATERAL (SELECT CASE WHEN p %% 10 = 0 THEN 'svc-' || g || '-' || p "
    "ELSE 'job-' || extract(day FROM %(day)s::timestamptz AT TIME ZONE 'UTC')::int - 1 || '-' || g || '-' || p END AS pod) w "
    "WHERE n.name = 'node-' || (g / 8) AND (p %% 10 = 0 OR h = p %% 24)"
)
_GPU_HOURS_SQL = (
    "INSERT INTO billing_gpuhour (hour, gpu_uuid, node_id, gpu_model, metered_seconds, card_cost, charged, idle_cost, "
    "idle_allocated, currency, priced) SELECT DISTINCT hour, gpu_uuid, node_id, 'NVIDIA A100-SXM4-80GB', 3600, 4.1, "
    "3.75, 0.35, 0, 'USD', true FROM billing_usagehour WHERE hour >= %(day)s"
)


def _last_hours(day: datetime) -> set[tuple[int, str, datetime]]:
    """What one rollup cycle at the day's end recomputes: every GPU's last hour of `day`."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT DISTINCT node_id, gpu_uuid, hour FROM billing_gpuhour WHERE hour = %s",
                    [day + timedelta(hours=23)])
        return set(cur.fetchall())


def _node_groups(day: datetime) -> list[set[tuple[int, str, datetime]]]:
    """The cycle's hours by the rollup's transactions: VGPU_ROLLUP_NODES_PER_TRANSACTION nodes each."""
    from django.conf import settings

    hours = _last_hours(day)
    nodes = sorted({n for n, _, _ in hours})
    per = settings.VGPU_ROLLUP_NODES_PER_TRANSACTION
    return [{h for h in hours if h[0] in nodes[i:i + per]} for i in range(0, len(nodes), per)]


def _day_step_baseline(day: datetime) -> None:
    """Every day row of each GPU-day deleted and summed again from all its hours (the day step before)."""
    from django.db import connection

    from billing.ledger import rollup

    with connection.cursor() as cur:
        for group in _node_groups(day):
            keys: list[Any] = list(rollup._arrays({(n, g, day) for n, g, _ in group}))
            for table in ("billing_usageday", "billing_gpuday"):
                cur.execute(f"DELETE FROM {table} d USING {rollup._UNNEST} AS a(node_id, gpu_uuid, day) "  # noqa: S608 - fixed names
                            "WHERE d.node_id = a.node_id AND d.gpu_uuid = a.gpu_uuid AND d.day = a.day", keys)
            cur.execute(rollup._usage_days_insert(rollup._TOUCHED_DAYS), keys)
            cur.execute(rollup._gpu_days_insert(rollup._TOUCHED_DAYS), keys)


def _day_step_shipped(day: datetime) -> None:
    from django.db import connection

    from billing.ledger.rollup import _recompute_days

    with connection.cursor() as cur:
        for group in _node_groups(day):
            _recompute_days(cur, group)


def _late_groups(day: datetime) -> list[list[tuple[Any, ...]]]:
    """A late batch into the closed `day` on every GPU, by the rollup's transactions: the workload-days
    of its last hour (the pods whose day rows the day step replaced)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT node_id, gpu_uuid, day, tenant, namespace, pod, container, pod_uid, sla_tier "
                    "FROM billing_usageday WHERE day = %s AND last_hour = %s", [day, day + timedelta(hours=23)])
        rows = cur.fetchall()
    groups = _node_groups(day + timedelta(days=1))
    return [[r for r in rows if r[0] in {n for n, _, _ in group}] for group in groups]


def _late_baseline(day: datetime) -> None:
    """Every month row of each GPU-month the late batch touched, deleted and summed again from its days."""
    from django.db import connection

    from billing.ledger.months import recompute_months

    with connection.cursor() as cur:
        for group in _late_groups(day):
            recompute_months(cur, [], {(r[0], r[1], r[2]) for r in group})


def _late_shipped(day: datetime) -> None:
    from django.db import connection

    from billing.ledger.months import recompute_months

    with connection.cursor() as cur:
        for group in _late_groups(day):
            recompute_months(cur, group)


def _close_baseline(day: datetime) -> None:
    """The month's rows all deleted and summed again with the closing day's rows."""
    from django.db import connection

    from billing.ledger import months

    with connection.cursor() as cur:
        cur.execute("UPDATE billing_month_closed SET closed_through = %s", [day + timedelta(days=1)])
        old = f"SELECT {', '.join(months._COLUMNS)} FROM gone"  # noqa: S608 - constant column names
        cur.execute("WITH gone AS (DELETE FROM billing_usagemonth WHERE month = %(month)s RETURNING *) "  # noqa: S608 - built from constant column lists
                    + months._insert(f"{old} UNION ALL {months._day_rows('WHERE d.day >= %(lo)s AND d.day < %(hi)s')}"),
                    {"month": MONTH, "lo": day, "hi": day + timedelta(days=1)})


def _close_shipped(day: datetime) -> None:
    from billing.ledger.months import close_days

    assert close_days(now=day + timedelta(days=1)) == 1


# What each step writes, summed to one checksum: the day rows of the day, the month rows.
_DAY_ROWS = ("SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) FROM (SELECT day, node_id, gpu_uuid, tenant, pod, "
             "pod_uid, seconds, charge, first_hour, last_hour FROM billing_usageday WHERE day = %s) t")
_MONTH_ROWS = ("SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) FROM (SELECT month, node_id, gpu_uuid, tenant, "
               "pod, pod_uid, gpu_model, seconds, charge, mem_billed_mb_s, first_hour, last_hour FROM billing_usagemonth "
               "WHERE %s IS NOT NULL) t")


def _timed(step: Callable[[datetime], None], day: datetime, checksum: str) -> tuple[float, int, object]:
    """Seconds `step` took, the WAL it wrote (what a commit would flush, and a replica receive), and
    the checksum of what it left; then everything is rolled back."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cur:
        sid = transaction.savepoint()
        cur.execute("SELECT pg_current_wal_insert_lsn()")
        lsn = cur.fetchone()[0]
        began = time.perf_counter()
        step(day)
        seconds = time.perf_counter() - began
        cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", [lsn])
        wal = int(cur.fetchone()[0])
        cur.execute(checksum, [day])
        rows = cur.fetchone()[0]
        transaction.savepoint_rollback(sid)
    return seconds, wal, rows


def _compare(title: str, steps: dict[str, tuple[str, Callable[[datetime], None]]], day: datetime, checksum: str,
             runs: int) -> bool:
    """Baseline and shipped alternately from the same state; prints their table, returns whether they agree."""
    times: dict[str, list[float]] = {label: [] for label in steps}
    wal: dict[str, list[int]] = {label: [] for label in steps}
    results = {}
    labels = list(steps)
    for i in range(runs):
        for label in labels if i % 2 else reversed(labels):
            seconds, written, results[label] = _timed(steps[label][1], day, checksum)
            times[label].append(seconds)
            wal[label].append(written)
    same = len(set(results.values())) == 1
    print(f"| {title} | runs, s | median s | × baseline | WAL, MB (median) | × baseline |")
    print("|---|---|---:|---:|---:|---:|")
    base, base_wal = statistics.median(times["baseline"]), statistics.median(wal["baseline"])
    for label in labels:
        median, median_wal = statistics.median(times[label]), statistics.median(wal[label])
        print(f"| {steps[label][0]} | {', '.join(f'{t:.2f}' for t in times[label])} | {median:.2f} | {median / base:.2f} "
              f"| {median_wal / 1e6:,.1f} | {median_wal / base_wal:.2f} |")
    print(f"\nrows left by the two: {'identical' if same else 'DIFFERENT'}\n")
    return same


def run(args: argparse.Namespace) -> int:
    from django.db import connection

    began = time.perf_counter()
    _fill(args)
    day = MONTH + timedelta(days=args.days)
    with connection.cursor() as cur:
        cur.execute("SELECT (SELECT count(*) FROM billing_usagemonth), (SELECT count(*) FROM billing_usageday "
                    "WHERE day = %s), (SELECT count(*) FROM billing_usagehour WHERE hour = %s)",
                    [day, day + timedelta(hours=23)])
        month_rows, day_rows, last_hour_rows = cur.fetchone()
    print(f"filled in {time.perf_counter() - began:.0f} s: {args.gpus:,} GPUs x {args.pods_per_gpu_day} pods a day, "
          f"{args.days} days in {month_rows:,} month rows; the next day: {day_rows:,} day rows, "
          f"{last_hour_rows:,} hour rows in its last hour\n")
    day_ok = _compare("day step of a cycle at the day's end", {
        "baseline": ("BASELINE: every day row of each GPU-day rewritten", _day_step_baseline),
        "shipped": ("_recompute_days: the day rows of the cycle's workloads", _day_step_shipped)},
        day, _DAY_ROWS, args.runs)
    close_ok = _compare("close of that day", {
        "baseline": ("BASELINE: the month's rows all rewritten", _close_baseline),
        "shipped": ("close_days: the day's workloads' month rows merged", _close_shipped)},
        day, _MONTH_ROWS, args.runs)
    late_ok = _compare("late batch into a closed day", {
        "baseline": ("BASELINE: the GPU-months' rows all rewritten", _late_baseline),
        "shipped": ("recompute_months: the late workloads' month rows", _late_shipped)},
        day - timedelta(days=1), _MONTH_ROWS, args.runs)
    return 0 if day_ok and close_ok and late_ok else 1


if __name__ == "__main__":
    sys.exit(main())
