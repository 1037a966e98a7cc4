"""Disk per ledger row, indexes included, and what the ledger writes a day at a fleet's size:
what docs/operations.md's disk budget is built from.

    python bench/ledger_disk.py [--agents 4] [--gpus 8] [--workloads-per-gpu 4] [--minutes 30]
                                [--rows 200000] [--fleet-gpus 10000] [--fleet-workloads-per-gpu 16]

DATABASE_URL must be set (`python -m config.embedded -- python bench/ledger_disk.py` provides it).
Like bench/rollup.py it drops and creates `<dbname>_bench`, stores minute batches of 1-second
samples through the ingest service (which sums them per workload-minute, as a v2 batch sends them:
one integral row per batch, workload, GPU and minute) and rolls them up with the real rollup, which
adds the integral rows into the minutes and deletes them: the raw table is an inbox that holds
only the rows of batches not rolled up. The integral rows are also measured as they were held
before (47 days beside the minutes), from a copy taken before the rollup. A
short run has too few rows for a per-row figure (a table and each index start at one 8 KiB page),
so every table's real rows are repeated, shifted by whole windows, up to `--rows` rows each
before measuring: same values and widths, same indexes (batches and their GPUs get new batch
numbers, so their constraints and the overlap trigger still hold).
Bytes per row = pg_total_relation_size (heap + indexes + TOAST, all partitions) / rows, after
VACUUM: what a day of rows holds, not the dead versions the rollup's rewrites leave for vacuum.

The minute ledger is the slim store (migration 0043): billing_usageminute_store and
billing_gpuminute_store, keyed by card and workload ids. Its copies are written as a day's rows arrive:
minute by minute, the nodes of a minute in an arbitrary order (the rollup's node groups), each node's
rows in key order. The layout before it (the wide minute tables of migration 0042, rebuilt here from
the views with the same columns, keys, indexes and foreign keys) is measured beside it, as are the
small tables of cards and workloads (they grow with new GPUs and pods, not with minutes).
The batch GPU rows are keyed by card id too (migration 0044); their layout before it
(`bench_wide_batchgpu`: node, uuid and model strings, a surrogate id and four indexes) is measured
beside them the same way.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.ingest import Timeline, build_payloads, in_fresh_database, make_agent  # noqa: E402 - after the path fix above

# table -> (time column, shift step of one copy): copies never collide with real rows or each other.
LEDGERS = {
    "billing_raw_sample": ("start", "1 hour"),
    "billing_usageminute_store": ("minute", "1 hour"),
    "billing_gpuminute_store": ("minute", "1 hour"),
    "billing_usagehour": ("hour", "1 day"),
    "billing_gpuhour": ("hour", "1 day"),
    "billing_usageday": ("day", "1 day"),
    "billing_gpuday": ("day", "1 day"),
    "billing_usagemonth": ("month", "1 month"),
}
BATCH_TABLES = ("billing_usagebatch", "billing_batchgpu")
SMALL_TABLES = ("billing_card", "billing_workload")
# The integral rows as ingest wrote them, before the rollup emptied the inbox (same columns and index).
INTEGRAL_ROWS = "bench_integral_rows"
# The tables before the slim store (migration 0042's layout) and what replaced each.
WIDE = {"bench_wide_usageminute": "billing_usageminute_store", "bench_wide_gpuminute": "billing_gpuminute_store",
        "bench_wide_batchgpu": "billing_batchgpu"}
GPUS_PER_NODE = 8  # a node's batch covers its GPUs: one batch row per node and minute


def rows_per_day(table: str, *, gpus: int, workloads_per_gpu: int) -> float:
    """Rows a day of a steady fleet writes (held, not rewritten) with minute batches."""
    workload_minutes = gpus * workloads_per_gpu * 1440
    return {
        # The inbox holds a rollup cycle's rows, not a day's: nothing a day adds to the disk held.
        "billing_raw_sample": 0, INTEGRAL_ROWS: workload_minutes,
        "billing_usageminute_store": workload_minutes, "bench_wide_usageminute": workload_minutes,
        "billing_gpuminute_store": gpus * 1440, "bench_wide_gpuminute": gpus * 1440,
        "billing_usagehour": gpus * workloads_per_gpu * 24, "billing_gpuhour": gpus * 24,
        "billing_usageday": gpus * workloads_per_gpu, "billing_gpuday": gpus,
        # A month's rows over its days (a mean month): the same workloads all month.
        "billing_usagemonth": gpus * workloads_per_gpu / (365.25 / 12),
        "billing_usagebatch": gpus / GPUS_PER_NODE * 1440, "billing_batchgpu": gpus * 1440,
        "bench_wide_batchgpu": gpus * 1440,
        # Rows per new GPU or pod, not per minute: nothing a steady fleet's day adds.
        "billing_card": 0, "billing_workload": 0,
    }[table]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--workloads-per-gpu", type=int, default=4)
    p.add_argument("--minutes", type=int, default=30)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--fleet-gpus", type=int, default=10_000, help="the fleet the GB a day are projected to")
    p.add_argument("--fleet-workloads-per-gpu", type=int, default=16)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return in_fresh_database(lambda: run(args))


def _generate(args: argparse.Namespace) -> None:
    from django.db import connection
    from django.utils import timezone

    from billing.ledger.months import close_days
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
    # Minute batches of 1-second samples: agents close batches on whole minutes (docs/agent.md).
    payloads = build_payloads(agents, Timeline(end=end, seconds=60, total=args.minutes).take(args.minutes), 60, rng)
    for agent, agent_batches in zip(agents, payloads, strict=True):
        issue_node_token(node_name=agent.node, now=timezone.now(), actor_label="bench")
        node = Node.objects.get(name=agent.node)
        for payload in agent_batches:
            record_usage_batch(node=node, payload=payload, content=json.dumps(payload).encode(), now=timezone.now())
    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE {INTEGRAL_ROWS} (LIKE billing_raw_sample INCLUDING ALL)")
        cur.execute(f"INSERT INTO {INTEGRAL_ROWS} SELECT * FROM billing_raw_sample")  # noqa: S608 - fixed names
    rollup_usage(now=timezone.now(), max_batches=10**6)
    # Month rows hold closed days only (billing.ledger.months): close the run's days as the next
    # midnight would, so the month ledger has its rows too.
    close_days(now=timezone.now() + timedelta(days=1))


def _repeat(cur, table: str, column: str, step: str, rows: int) -> None:
    """Copies of the real rows, each shifted by one more `step`, until `rows` rows (new ids). The minute
    store's copies go in as a day's rows arrive (the module's docstring)."""
    from billing.ledger.partitions import MINUTE_TABLES, days_between, ensure_minute_partitions, ensure_raw_partitions

    cur.execute(f"SELECT count(*), min({column}), max({column}) FROM {table}")  # noqa: S608 - fixed names
    real, lo, hi = cur.fetchone()
    copies = max(0, -(-rows // real) - 1)
    ensure = {"minute": ensure_minute_partitions, "start": ensure_raw_partitions}.get(column)
    if ensure is not None:  # the copies' days need their partitions
        ensure(days_between(lo, hi + timedelta(hours=copies) + timedelta(minutes=1)))
    cur.execute(
        "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped AND attname NOT IN ('id', %s)",
        [table, column],
    )
    others = cur.fetchone()[0]
    order = ""
    if table in MINUTE_TABLES:  # minute by minute, the nodes of a minute in an arbitrary order
        node = "(SELECT c.node_id FROM billing_card c WHERE c.id = t.card_id)"
        workload = ", t.workload_id" if "workload_id" in others else ""
        order = f" ORDER BY 1, md5({node}::text || (t.minute + k * interval '1 hour')::text), t.card_id{workload}"
    cur.execute(
        f"INSERT INTO {table} ({column}, {others}) SELECT t.{column} + k * interval '{step}', {others} "  # noqa: S608 - names read from the catalogue, the count a parameter
        f"FROM {table} t, generate_series(1, %s) k{order}",
        [copies],
    )


def _repeat_batches(cur, rows: int) -> None:
    """Copies of the batches and their GPUs, a day later each (new batch numbers), until `rows` GPU rows."""
    cur.execute("SELECT count(*) FROM billing_batchgpu")
    copies = max(0, -(-rows // cur.fetchone()[0]) - 1)
    shift = 10**12  # above every real batch_seq of the run
    cur.execute(
        "INSERT INTO billing_usagebatch (node_id, batch_seq, content_sha256, window_start, window_end, sample_count, "
        "received_at, rolled_up_at, quarantined_at, quarantine_error) SELECT node_id, batch_seq + k * %s, "
        "content_sha256, window_start + k * interval '1 day', window_end + k * interval '1 day', sample_count, "
        "received_at, rolled_up_at, quarantined_at, quarantine_error FROM billing_usagebatch, generate_series(1, %s) k",
        [shift, copies])
    cur.execute(
        "INSERT INTO billing_batchgpu (batch_id, card_id, memory_mb, sm_count, window_start, window_end, energy_j) "
        "SELECT n.id, g.card_id, g.memory_mb, g.sm_count, g.window_start + (n.batch_seq / %s) * interval '1 day', "
        "g.window_end + (n.batch_seq / %s) * interval '1 day', g.energy_j FROM billing_batchgpu g "
        "JOIN billing_usagebatch b ON b.id = g.batch_id "
        "JOIN billing_usagebatch n ON n.node_id = b.node_id AND n.batch_seq %% %s = b.batch_seq AND n.batch_seq > %s "
        "ORDER BY n.id, g.card_id",
        [shift, shift, shift, shift])


# The wide minute tables of migration 0042 (the layout before the slim store), with its keys, indexes
# and foreign keys, filled from the views in key order (ids in arrival order, as the rollup gave them).
def _wide_sql() -> str:
    import importlib

    migration = importlib.import_module("billing.migrations.0043_slim_minute_store")
    sql = migration.WIDE + migration.WIDE_INDEXES
    sql = sql.replace("billing_usageminute", "bench_wide_usageminute").replace("billing_gpuminute", "bench_wide_gpuminute")
    for index in ("gpu_minute_minute_idx", "usage_minute_gpu_idx", "usage_minute_tenant_idx", "gpu_minute_unique"):
        sql = sql.replace(index, f"bench_{index}")
    rows = migration.WIDE_ROWS.replace("billing_usageminute", "bench_wide_usageminute").replace(
        "billing_gpuminute", "bench_wide_gpuminute")
    rows = rows.replace("slim_usage", "billing_usageminute").replace("slim_gpu", "billing_gpuminute")
    return (sql + "CREATE TABLE bench_wide_usageminute_default PARTITION OF bench_wide_usageminute DEFAULT;\n"
            "CREATE TABLE bench_wide_gpuminute_default PARTITION OF bench_wide_gpuminute DEFAULT;\n" + rows)


# The batch GPU rows as migration 0032 left them (before migration 0044), filled in arrival order.
_WIDE_BATCH_GPU_SQL = """
CREATE TABLE bench_wide_batchgpu (
    id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, gpu_uuid varchar(128) NOT NULL,
    model varchar(128) NOT NULL, memory_mb integer NOT NULL CHECK (memory_mb >= 0),
    sm_count integer NOT NULL CHECK (sm_count >= 0), window_start timestamptz NOT NULL,
    window_end timestamptz NOT NULL, batch_id bigint NOT NULL REFERENCES billing_usagebatch (id),
    node_id bigint NOT NULL REFERENCES billing_node (id), energy_j numeric(30, 10),
    UNIQUE (node_id, batch_id, gpu_uuid)
);
CREATE INDEX ON bench_wide_batchgpu (node_id, gpu_uuid, window_end);
CREATE INDEX ON bench_wide_batchgpu (gpu_uuid, window_end);
CREATE INDEX ON bench_wide_batchgpu (batch_id);
CREATE INDEX ON bench_wide_batchgpu (node_id);
INSERT INTO bench_wide_batchgpu (batch_id, node_id, gpu_uuid, model, memory_mb, sm_count, window_start, window_end,
                                 energy_j)
SELECT g.batch_id, c.node_id, c.gpu_uuid, c.gpu_model, g.memory_mb, g.sm_count, g.window_start, g.window_end, g.energy_j
FROM billing_batchgpu g JOIN billing_card c ON c.id = g.card_id ORDER BY g.batch_id, c.gpu_uuid;
"""


def _measure(cur, table: str) -> tuple[int, float]:
    cur.execute(
        "SELECT count(*), (SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "  # noqa: S608 - fixed names
        "WHERE c.oid = %s::regclass OR c.oid IN (SELECT inhrelid FROM pg_inherits "
        f"WHERE inhparent = %s::regclass)) FROM {table}",
        [table, table],
    )
    rows, size = cur.fetchone()
    return rows, int(size) / rows


def run(args: argparse.Namespace) -> int:
    from django.db import connection, transaction

    _generate(args)
    with transaction.atomic(), connection.cursor() as cur:
        for table, (column, step) in (*LEDGERS.items(), (INTEGRAL_ROWS, ("start", "1 hour"))):
            if table == "billing_raw_sample":
                continue  # the inbox, empty once rolled up: nothing to repeat
            _repeat(cur, table, column, step, args.rows)
        _repeat_batches(cur, args.rows)
        cur.execute(_wide_sql())
        cur.execute(_WIDE_BATCH_GPU_SQL)
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE")
    fleet = {"gpus": args.fleet_gpus, "workloads_per_gpu": args.fleet_workloads_per_gpu}
    per_workload_minute = 1 / (args.fleet_gpus * args.fleet_workloads_per_gpu * 1440)
    print(f"At {args.fleet_gpus:,} GPUs x {args.fleet_workloads_per_gpu} workloads, minute batches "
          f"({args.fleet_gpus // GPUS_PER_NODE:,} nodes of {GPUS_PER_NODE} GPUs):\n")
    print("| table | rows measured | bytes per row (indexes included) | rows per day | GB per day | "
          "bytes per workload-minute |")
    print("|---|---:|---:|---:|---:|---:|")
    totals: dict[str, float] = {}
    with connection.cursor() as cur:
        for table in (*LEDGERS, *BATCH_TABLES, *SMALL_TABLES, INTEGRAL_ROWS, *WIDE):
            if table == "billing_raw_sample":
                continue  # the inbox: empty once rolled up, nothing held a day
            rows, per_row = _measure(cur, table)
            day = rows_per_day(table, **fleet)
            totals[table] = per_row * day
            print(f"| {table} | {rows:,} | {per_row:,.0f} | {day:,.0f} | {per_row * day / 1e9:,.1f} | "
                  f"{per_row * day * per_workload_minute:,.1f} |")
    today = sum(v for t, v in totals.items() if t not in {*WIDE, INTEGRAL_ROWS})
    wide = today + sum(totals[old] - totals[new] for old, new in WIDE.items())
    before = wide + totals[INTEGRAL_ROWS]
    for label, total in (("before the minutes stored the integrals (the integral rows held too)", before),
                         ("the wide minute and batch GPU tables (migration 0042), the integral rows an inbox", wide),
                         ("every table as stored now (the slim minute store, batch GPUs by card)", today)):
        print(f"\n{label}: {total / 1e9:,.1f} GB per day, {total * per_workload_minute:,.0f} bytes per workload-minute")
    return 0


if __name__ == "__main__":
    sys.exit(main())
