"""Closing a day into the month ledger where pods churn: what each midnight's first rollup does
(billing.ledger.months.close_days), late in a month.

    python bench/month_close.py [--gpus 1000] [--pods-per-gpu-day 100] [--days 20] [--runs 3]

DATABASE_URL must be set (`python -m config.embedded -- python bench/month_close.py` provides it).
Drops and creates `<dbname>_bench`, migrates it, and writes with SQL a month of day rows of a
churning fleet: `--gpus` GPUs on nodes of 8, each running `--pods-per-gpu-day` pods a day: one in ten a
service that runs all month (a day row every day), the others jobs that live within a day (one
day row each), with their GPU-day rows and GPU records. The month rows are then derived for the first `--days` days
(billing.ledger.months.rebuild_months), as if closed, and day `--days` + 1 is closed:

- **shipped**: `close_days`, which merges the day's rows into the month rows of the same workloads
  and leaves the others;
- **baseline**: the month's rows all deleted and summed again with the day's, in one statement
  (what close_days did before the month key index; the simplest correct merge).

Each run is rolled back to the same state (a savepoint) and the two alternate, `--runs` times
each; the shipped run is checked to leave the same month rows as the baseline. A benchmark
never fails on speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

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
    """Nodes, GPUs, and --days + 1 days of day rows and GPU-day rows; month rows of the first --days."""
    from django.db import connection

    from billing.ledger.months import rebuild_months

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
        "FROM generate_series(0, %(days)s) d, generate_series(0, %(gpus)s - 1) g, "
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
        cur.execute("VACUUM ANALYZE")


def _baseline(now: datetime) -> None:
    """The month's rows all deleted and summed again with the closing day's rows."""
    from django.db import connection

    from billing.ledger import months

    with connection.cursor() as cur:
        cur.execute("SELECT closed_through FROM billing_month_closed")
        lo = cur.fetchone()[0]
        cur.execute("UPDATE billing_month_closed SET closed_through = %s", [now])
        old = f"SELECT {', '.join(months._COLUMNS)} FROM gone"  # noqa: S608 - constant column names
        cur.execute("WITH gone AS (DELETE FROM billing_usagemonth WHERE month = %(month)s RETURNING *) "  # noqa: S608 - built from constant column lists
                    + months._insert(f"{old} UNION ALL {months._day_rows('WHERE d.day >= %(lo)s AND d.day < %(hi)s')}"),
                    {"month": MONTH, "lo": lo, "hi": now})


def _shipped(now: datetime) -> None:
    from billing.ledger.months import close_days

    assert close_days(now=now) == 1


def _timed(step: Callable[[datetime], None], now: datetime) -> tuple[float, list[tuple[object, ...]]]:
    """Seconds `step` took, and the month rows it left; then everything is rolled back."""
    from django.db import connection, transaction

    with transaction.atomic():
        sid = transaction.savepoint()
        began = time.perf_counter()
        step(now)
        seconds = time.perf_counter() - began
        with connection.cursor() as cur:
            cur.execute("SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) FROM (SELECT month, node_id, gpu_uuid, "
                        "tenant, pod, pod_uid, gpu_model, seconds, charge, mem_billed_card_s, first_hour, last_hour "
                        "FROM billing_usagemonth) t")
            rows = cur.fetchall()
        transaction.savepoint_rollback(sid)
    return seconds, rows


def run(args: argparse.Namespace) -> int:
    from django.db import connection

    began = time.perf_counter()
    _fill(args)
    with connection.cursor() as cur:
        cur.execute("SELECT (SELECT count(*) FROM billing_usagemonth), (SELECT count(*) FROM billing_usageday "
                    "WHERE day = %s)", [MONTH + timedelta(days=args.days)])
        month_rows, day_rows = cur.fetchone()
    print(f"filled in {time.perf_counter() - began:.0f} s: {month_rows:,} month rows, {day_rows:,} day rows to close "
          f"({args.gpus:,} GPUs x {args.pods_per_gpu_day} pods a day, {args.days} days closed)\n")
    now = MONTH + timedelta(days=args.days + 1)
    times: dict[str, list[float]] = {"baseline": [], "shipped": []}
    results = {}
    for i in range(args.runs):
        order = (("shipped", _shipped), ("baseline", _baseline))
        for label, step in order if i % 2 else reversed(order):
            seconds, results[label] = _timed(step, now)
            times[label].append(seconds)
    same = results["shipped"] == results["baseline"]
    print("| close of one day | runs, s | median s | × baseline |")
    print("|---|---|---:|---:|")
    base = statistics.median(times["baseline"])
    for label in ("baseline", "shipped"):
        name = ("BASELINE: the month's rows all rewritten" if label == "baseline"
                else "close_days: the day's workloads' month rows merged")
        print(f"| {name} | {', '.join(f'{t:.2f}' for t in times[label])} | {statistics.median(times[label]):.2f} "
              f"| {statistics.median(times[label]) / base:.2f} |")
    print(f"\nmonth rows left by the two: {'identical' if same else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
