"""Disk per ledger row, indexes included: what docs/operations.md's disk budget is built from.

    python bench/ledger_disk.py [--agents 4] [--gpus 8] [--workloads-per-gpu 4] [--minutes 30]
                                [--rows 200000]

DATABASE_URL must be set (`python -m config.embedded -- python bench/ledger_disk.py` provides it).
Like bench/rollup.py it drops and creates `<dbname>_bench`, stores 1-second batches through the
ingest service and rolls them up with the real rollup. Raw samples are measured as stored. The
minute, hour and day ledgers of a short run have too few rows for a per-row figure (a table and
each index start at one 8 KiB page), so their real rows are repeated, shifted by whole windows,
up to `--rows` rows each before measuring: same values and widths, same indexes.
Bytes per row = pg_total_relation_size (heap + indexes + TOAST, all partitions) / rows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.ingest import (  # noqa: E402 - after the path fix above
    Timeline,
    bench_database,
    build_payloads,
    child_env,
    make_agent,
    manage,
    recreate_database,
    setup_django,
    with_database,
)

# table -> (time column, shift step of one copy): copies never collide with real rows or each other.
LEDGERS = {
    "billing_usageminute": ("minute", "1 hour"),
    "billing_gpuminute": ("minute", "1 hour"),
    "billing_usagehour": ("hour", "1 day"),
    "billing_gpuhour": ("hour", "1 day"),
    "billing_usageday": ("day", "1 day"),
    "billing_gpuday": ("day", "1 day"),
}
# Rows per day per 1,000 GPUs with 4 workloads each (the fleet docs/scaling.md sizes), by table.
ROWS_PER_DAY_PER_1000 = {
    "billing_raw_sample": 1000 * 4 * 86400,
    "billing_usageminute": 1000 * 4 * 1440, "billing_gpuminute": 1000 * 1440,
    "billing_usagehour": 1000 * 4 * 24, "billing_gpuhour": 1000 * 24,
    "billing_usageday": 1000 * 4, "billing_gpuday": 1000,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--workloads-per-gpu", type=int, default=4)
    p.add_argument("--minutes", type=int, default=30)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=20261201)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    admin_url, name = bench_database(os.environ["DATABASE_URL"])
    recreate_database(admin_url, name)
    try:
        env = child_env(with_database(admin_url, name))
        manage(env, "migrate", "--noinput")
        setup_django(env)
        return run(args)
    finally:
        from django.db import connections

        connections.close_all()
        recreate_database(admin_url, name, drop_only=True)


def _generate(args: argparse.Namespace) -> None:
    from django.utils import timezone

    from billing.ledger.rollup import rollup_usage
    from billing.models import Node, RateCard
    from billing.services.identity.tokens import issue_node_token
    from billing.services.ingest.batches import record_usage_batch

    rng = random.Random(args.seed)
    RateCard.objects.create(gpu_model="NVIDIA A100-SXM4-80GB", currency="USD", price_per_gpu_hour=Decimal("4.10"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    agents = [make_agent(i, gpus=args.gpus, workloads_per_gpu=args.workloads_per_gpu, rng=rng)
              for i in range(args.agents)]
    end = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=5)
    batches = args.minutes * 6  # 10-second batches of 1-second samples
    payloads = build_payloads(agents, Timeline(end=end, seconds=10, total=batches).take(batches), 10, rng)
    for agent, agent_batches in zip(agents, payloads, strict=True):
        issue_node_token(node_name=agent.node, now=timezone.now(), actor_label="bench")
        node = Node.objects.get(name=agent.node)
        for payload in agent_batches:
            record_usage_batch(node=node, payload=payload, content=json.dumps(payload).encode(), now=timezone.now())
    rollup_usage(now=timezone.now(), max_batches=10**6)


def _repeat(cur, table: str, column: str, step: str, rows: int) -> None:
    """Copies of the real rows, each shifted by one more `step`, until `rows` rows (new ids)."""
    from billing.ledger.partitions import days_between, ensure_minute_partitions

    cur.execute(f"SELECT count(*), min({column}), max({column}) FROM {table}")  # noqa: S608 - fixed names
    real, lo, hi = cur.fetchone()
    copies = max(0, -(-rows // real) - 1)
    if column == "minute":  # the copies' days need their partitions
        ensure_minute_partitions(days_between(lo, hi + timedelta(hours=copies) + timedelta(minutes=1)))
    cur.execute(
        "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped AND attname NOT IN ('id', %s)",
        [table, column],
    )
    others = cur.fetchone()[0]
    cur.execute(
        f"INSERT INTO {table} ({column}, {others}) SELECT t.{column} + k * interval '{step}', {others} "  # noqa: S608 - names read from the catalogue, the count a parameter
        f"FROM {table} t, generate_series(1, %s) k",
        [copies],
    )


def run(args: argparse.Namespace) -> int:
    from django.db import connection, transaction

    _generate(args)
    with transaction.atomic(), connection.cursor() as cur:
        for table, (column, step) in LEDGERS.items():
            _repeat(cur, table, column, step, args.rows)
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE")
    print("| table | rows measured | bytes per row (indexes included) | MB per day per 1,000 GPUs |")
    print("|---|---:|---:|---:|")
    with connection.cursor() as cur:
        for table in ("billing_raw_sample", *LEDGERS):
            cur.execute(
                "SELECT count(*), (SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "  # noqa: S608 - fixed names
                "WHERE c.oid = %s::regclass OR c.oid IN (SELECT inhrelid FROM pg_inherits "
                f"WHERE inhparent = %s::regclass)) FROM {table}",
                [table, table],
            )
            rows, size = cur.fetchone()
            per_row = int(size) / rows
            per_day_mb = per_row * ROWS_PER_DAY_PER_1000[table] / 1e6
            print(f"| {table} | {rows:,} | {per_row:,.0f} | {per_day_mb:,.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
