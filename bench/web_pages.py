"""Web pages at fleet scale: the ledger reads behind the finance dashboard, the tenant list and
portal, the periods page, the upcoming invoices, the drill-down and the fleet view, against a full month of a real fleet.

    python bench/web_pages.py [--gpus 200] [--gpus-per-node 8] [--days 31] [--workloads-per-gpu 6]
                              [--tenants 20] [--runs 5] [--explain 6] [--no-energy] [--keep-db] [--reuse-db]
                              [--save-json FILE] [--before-json FILE] [--write-docs]

DATABASE_URL and REDIS_URL must be set (run it under `python -m config.embedded -- ...`, which
provides them). Nothing is written to that database: the benchmark drops and creates
`<dbname>_webbench` on the same server, migrates it, fills it and drops it at the end (unless
--keep-db).

1. Fill: Tenant (one with a Chinese name), SlaTier, Node, Gpu and RateCard rows through the ORM,
   then the hour ledger COPYed straight into billing_gpuhour and billing_usagehour: every GPU-hour
   of the last --days days up to the end of a 31-day month, --workloads-per-gpu workload slots per
   GPU (a slot's pod is replaced every 12-240 h), charges that reconcile per GPU-hour
   (Σ charge + idle_cost = card_cost, to the 1e-12 unit), each card's energy (a steady draw by its
   model and load) split over its workloads by their share as the rollup splits it, the nodes in two
   locations whose energy is priced and has a CO2e factor (--no-energy: none of that, the ledger as
   a fleet without energy readings or locations has it), with the secondary indexes dropped for the
   COPY and rebuilt from their own definitions after it, then VACUUM ANALYZE; then the day ledger
   (UsageDay, GpuDay, and UsageMonth from the closed days) derived from those hours by
   billing.ledger.rollup.rebuild_days, as the rollup would have written it, timed apart, and
   compacted (VACUUM FULL, ANALYZE). The closed days are those before the last day's midnight, as
   the rollup's close leaves them at the benchmark's `now` (close_month_ledger), not those before
   the machine's date: the last day is in day rows only.
2. Time, warm, with django.utils.timezone.now fixed at the month's last hour: the queries the pages
   call (get_finance_dashboard for the month to date and for 7 days, get_tenant_portal for the
   biggest tenant, list_tenant_portals, list_billing_periods, preview_invoices), then the pages
   through Django's test Client (logged in as finance or as a member of that tenant), templates
   included. Median and p95 of --runs runs after one warm-up; one more run under
   CaptureQueriesContext counts the queries.
3. BASELINE, measured in the same run: `SELECT sum(card_cost) FROM billing_gpuhour WHERE hour >= start
   AND hour < end` over the month: the floor any dashboard over that period pays. Ratios are
   against it, because the machine is shared and noisy.

--reuse-db measures against the `<dbname>_webbench` database an earlier run left (--keep-db) instead
of filling a new one (it is migrated first; the fill is minutes at fleet scale): for iterating on a fix.
The row counts are read from it; its fill times are not measured again. The run it came from must have
had the same options and seed. Its derived ledger (days and months) is compacted first: the day step
measured at the end of each run rewrites a day of every GPU, and on a server with autovacuum off the
dead rows would pile up run after run (vacuum_derived_ledger).

--explain N prints EXPLAIN (ANALYZE, BUFFERS) of the N slowest statements seen. --save-json keeps
the results; --before-json adds the results of an earlier run (e.g. before a fix) as columns.
A benchmark is not a test: it reports numbers and never fails on speed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shlex
import statistics
import sys
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from unittest import mock

import psycopg2

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `python bench/web_pages.py` puts bench/, not the repository, on the path

from bench.ingest import (  # noqa: E402 - after the path fix above
    DOCS_FILE,
    child_env,
    machine_info,
    manage,
    recreate_database,
    setup_django,
    with_database,
    write_docs,
)

SECTION_TITLE = "## Web pages at fleet scale"
UNIT = 10**12  # ledger amounts have 12 decimal places (billing.money.LEDGER_PLACES)
PRICE_PER_HOUR = {"NVIDIA A100-SXM4-80GB": Decimal("2.48"), "NVIDIA H100 80GB HBM3": Decimal("4.10")}
GPU_SPECS = {"NVIDIA A100-SXM4-80GB": (81920, 108), "NVIDIA H100 80GB HBM3": (81559, 132)}
# A card's draw in watts: idle, and at full load (its board power); a GPU-hour draws between them by
# the share of the card its workloads hold.
WATTS = {"NVIDIA A100-SXM4-80GB": (60, 400), "NVIDIA H100 80GB HBM3": (70, 700)}
# Where the nodes run (every other node in each): price per kWh in USD and kg CO2e per kWh, from
# long before the ledger, and again from the month the bench reads (a new tariff on the 1st).
LOCATIONS = {"bench-dc-east": (("0.118", "0.386"), ("0.124", "0.371")),
             "bench-dc-west": (("0.091", "0.052"), ("0.093", "0.049"))}
TIERS = (("gold", "Gold", "1.5"), ("silver", "Silver", "1.0"), ("bronze", "Bronze", "0.7"))
APPS = ("bert", "llama", "resnet", "whisper", "sdxl", "t5", "vit", "gptj", "mixtral", "clip")
TENANT_NAMES = [
    ("acme", "Acme Corp"), ("globex", "Globex"), ("initech", "Initech"), ("umbrella", "Umbrella Research"),
    ("hooli", "Hooli"), ("stark", "Stark Industries"), ("wayne", "Wayne Enterprises"), ("cyberdyne", "Cyberdyne"),
    ("tyrell", "Tyrell"), ("soylent", "Soylent"), ("wonka", "Wonka Labs"), ("oscorp", "Oscorp"),
    ("aperture", "Aperture Science"), ("massive", "Massive Dynamic"), ("vandelay", "Vandelay Industries"),
    ("gringotts", "Gringotts"), ("monarch", "Monarch"), ("pied-piper", "Pied Piper"), ("dunder", "Dunder Mifflin"),
    ("huaxia", "华夏智算科技有限公司"),
]


# --------------------------------------------------------------------------------------------
# Options


def default_month(today: date) -> date:
    """The latest 31-day month that is over."""
    m = today.replace(day=1)
    while True:
        m = (m - timedelta(days=1)).replace(day=1)
        if ((m + timedelta(days=32)).replace(day=1) - m).days == 31:
            return m


def add_energy_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-energy", dest="energy", action="store_false",
                   help="no energy in the ledger and no priced locations (as the tables before 2026-12-07 were filled)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=200, help="GPUs in the fleet (the real customer: 800)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--days", type=int, default=31, help="days of ledger, ending with --month (more: history)")
    p.add_argument("--workloads-per-gpu", type=int, default=6, help="workload slots per GPU")
    p.add_argument("--tenants", type=int, default=20, help=f"at most {len(TENANT_NAMES)}")
    p.add_argument("--month", type=lambda s: date.fromisoformat(f"{s}-01"), default=None,
                   help="the month the analyst looks at, YYYY-MM (default: the latest 31-day month that is over)")
    p.add_argument("--runs", type=int, default=5, help="timed runs per item, after one warm-up")
    p.add_argument("--explain", type=int, default=0, metavar="N", help="EXPLAIN (ANALYZE, BUFFERS) the N slowest SQL")
    p.add_argument("--seed", type=int, default=20261130)
    add_energy_option(p)
    p.add_argument("--keep-db", action="store_true", help="keep the <dbname>_webbench database afterwards")
    p.add_argument("--reuse-db", action="store_true",
                   help="measure against the <dbname>_webbench database kept by an earlier run with the same options")
    p.add_argument("--save-json", type=Path, help="write the results to this file")
    p.add_argument("--before-json", type=Path, help="results of an earlier run (--save-json) shown as 'before'")
    p.add_argument("--before-label", default="before", help="what the --before-json run was")
    p.add_argument("--write-docs", action="store_true",
                   help=f"replace the '{SECTION_TITLE}' section of {DOCS_FILE.relative_to(REPO)}")
    args = p.parse_args(argv)
    for name in ("gpus", "gpus_per_node", "days", "workloads_per_gpu", "tenants", "runs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    args.tenants = min(args.tenants, len(TENANT_NAMES))
    args.month = args.month or default_month(datetime.now(UTC).date())
    return args


# --------------------------------------------------------------------------------------------
# Fill


@dataclass
class Slot:
    """A workload slot on a GPU: one pod after another, same tenant, namespace and app."""

    tenant: str
    namespace: str
    app: str
    tier: str
    weight: float  # relative share of the card
    mem_mb: int  # granted
    sm: float  # granted SMs
    pod: str = ""
    pod_uid: str = ""
    container: str = ""
    ends_at: int = -1  # hour index at which the pod is replaced


@dataclass
class FillStats:
    gpus: int = 0
    nodes: int = 0
    gpu_hours: int = 0
    usage_hours: int = 0
    pods: int = 0
    seconds: float = 0.0
    usage_days: int = 0
    gpu_days: int = 0
    days_seconds: float = 0.0  # rebuild_days over the whole period + VACUUM ANALYZE of the day tables
    table_mb: dict[str, float] = field(default_factory=dict)
    reused: bool = False  # --reuse-db: counts read from the kept database, fill times not measured


def reused_fill_stats(start: datetime, end: datetime, now: datetime) -> FillStats:
    """What a kept database holds (--reuse-db), its month ledger closed as of `now` (close_month_ledger)
    and vacuumed first (vacuum_derived_ledger)."""
    from django.db import connection

    close_month_ledger(start, end, now)
    vacuum_derived_ledger()
    stats = FillStats(reused=True)
    with connection.cursor() as cur:
        cur.execute("SELECT count(DISTINCT gpu_uuid), count(DISTINCT node_id), count(*) FROM billing_gpuhour")
        stats.gpus, stats.nodes, stats.gpu_hours = cur.fetchone()
        cur.execute("SELECT count(*), count(DISTINCT pod_uid) FROM billing_usagehour")
        stats.usage_hours, stats.pods = cur.fetchone()
        cur.execute("SELECT count(*) FROM billing_gpuday")
        stats.gpu_days = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM billing_usageday")
        stats.usage_days = cur.fetchone()[0]
        for table in ("billing_gpuhour", "billing_usagehour", *DERIVED_LEDGER):
            cur.execute("SELECT pg_total_relation_size(%s)", [table])
            stats.table_mb[table] = cur.fetchone()[0] / 2**20
    return stats


def _amount(units: int) -> str:
    return f"{units // UNIT}.{units % UNIT:012d}"


def _new_pod(slot: Slot, hour_index: int, rng: random.Random) -> None:
    slot.pod = f"{slot.app}-{rng.getrandbits(36):09x}-{rng.getrandbits(20):05x}"
    slot.pod_uid = str(uuid.UUID(int=rng.getrandbits(128)))
    slot.container = rng.choice(("server", "worker", "trainer"))
    slot.ends_at = hour_index + rng.randint(12, 240)


def _tenant_weights(n: int) -> list[float]:
    return [1.0 / (k + 1) ** 0.9 for k in range(n)]  # a few big tenants, a long tail


def create_reference_rows(args: argparse.Namespace, first_hour: datetime, rng: random.Random) -> dict[str, Any]:
    """Tenants, tiers, nodes, GPUs, rate cards; returns what the ledger rows need."""
    from billing.models import Gpu, Node, RateCard, SlaTier, Tenant

    tiers = {slug: SlaTier.objects.create(slug=slug, name=name, weight=Decimal(w)) for slug, name, w in TIERS}
    tenants = [Tenant.objects.create(slug=slug, name=name, default_sla_tier=tiers["silver"],
                                     namespaces=[f"{slug}-prod", f"{slug}-research"])
               for slug, name in TENANT_NAMES[:args.tenants]]
    for model, price in PRICE_PER_HOUR.items():
        RateCard.objects.create(gpu_model=model, currency="USD", price_per_gpu_hour=price,
                                effective_from=first_hour - timedelta(days=400),
                                source_url="https://example.org/bench-prices", source_note="bench/web_pages.py")
    node_count = -(-args.gpus // args.gpus_per_node)
    nodes = Node.objects.bulk_create([Node(name=f"webbench-node-{i:04d}") for i in range(node_count)])
    models = list(PRICE_PER_HOUR)
    gpus = []
    for i in range(args.gpus):
        node = nodes[i // args.gpus_per_node]
        model = models[1] if (i // args.gpus_per_node) % 4 == 3 else models[0]  # every 4th node: H100s
        mem, sms = GPU_SPECS[model]
        gpus.append(Gpu(uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128))}", node=node, model=model, memory_mb=mem,
                        sm_count=sms, first_seen_at=first_hour, last_seen_at=first_hour + timedelta(days=args.days)))
    Gpu.objects.bulk_create(gpus)
    if args.energy:
        _locate(nodes, first_hour, args.month)
    return {"tenants": [t.slug for t in tenants], "gpus": gpus, "nodes": node_count}


def _locate(nodes: list[Any], first_hour: datetime, month: date) -> None:
    """Every other node in each of LOCATIONS, each priced from before the ledger and anew from `month`."""
    from billing.models import Location, LocationRate, NodeLocation

    long_before = first_hour.date() - timedelta(days=400)
    for i, (label, tariffs) in enumerate(LOCATIONS.items()):
        location = Location.objects.create(label=label, created_at=first_hour)
        for since, (price, co2e) in zip((long_before, month), tariffs, strict=True):
            LocationRate.objects.create(location=location, effective_from=since, price_per_kwh=Decimal(price),
                                        currency="USD", co2e_kg_per_kwh=Decimal(co2e), created_at=first_hour)
        NodeLocation.objects.bulk_create(NodeLocation(node=node, location=location, effective_from=long_before,
                                                      created_at=first_hour) for node in nodes[i::len(LOCATIONS)])


GPU_COLUMNS = ("gpu_uuid", "node_id", "gpu_model", "metered_seconds", "card_cost", "charged", "idle_cost",
               "idle_allocated", "currency", "priced", "share_gpu_s", "energy_j", "idle_energy_j", "energy_seconds",
               "hour")
USAGE_COLUMNS = ("gpu_uuid", "node_id", "tenant", "namespace", "pod", "container", "pod_uid", "sla_tier", "seconds",
                 "mem_used_mb_s", "mem_granted_mb_s", "mem_billed_mb_s", "sm_used_s", "sm_granted_s", "sm_billed_s",
                 "pcie_mb", "share_gpu_s", "charge", "idle_share", "energy_j", "hour")


# The ledger tables the rollup derives and rewrites: the day step measured here (rebuild_days) leaves
# every row it rewrites dead, about 39k month rows a run at 1,000 GPUs. Production's autovacuum
# reuses their space as they die; on a server with autovacuum off (the shared bench machine) a kept
# database reused run after run grew its month ledger to 372 MB for 17 MB of live rows (784k dead
# rows to 39k), and every read of whole months scanned all of it.
DERIVED_LEDGER = ("billing_gpuday", "billing_usageday", "billing_usagemonth")


def vacuum_derived_ledger() -> None:
    """Compact the derived ledger tables (VACUUM FULL, ANALYZE): a filled or reused database is
    measured at its live rows' size, as autovacuum keeps it, not with earlier write steps' dead rows."""
    from django.db import connection

    with connection.cursor() as cur:  # autocommit outside atomic(): VACUUM may run
        for table in DERIVED_LEDGER:
            cur.execute(f"VACUUM (FULL, ANALYZE) {table}")


def close_month_ledger(start: datetime, end: datetime, now: datetime) -> None:
    """The month ledger of [start, end) as the rollup leaves it at `now`: the days before now's
    midnight closed into month rows (the close's grace, an hour, is past at the benchmark's now), the
    day in progress in day rows only (billing.ledger.months). Not as of the machine's date, which the
    migrations close through: the fill is dated in the past, and closed through today the month rows
    held the fill's last day too, which no ledger holds at its `now`, and reads that take closed days
    from the month rows could not (billing.ledger.spend.list_month_to_date_spends)."""
    from django.db import connection, transaction

    from billing.ledger.months import rebuild_months

    midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT closed_through FROM billing_month_closed")
        if cur.fetchone()[0] == midnight:
            return
        cur.execute("UPDATE billing_month_closed SET closed_through = %s", [midnight])
        rebuild_months(cur, lo=start, hi=end, gpu_uuid=None)


def fill_days(stats: FillStats, start: datetime, end: datetime, now: datetime) -> None:
    """Derive the day ledger from the hours just COPYed, as the rollup keeps it (one transaction), and
    the month ledger as it is at `now` (close_month_ledger)."""
    from django.db import connection

    from billing.ledger.models import UsageDay
    from billing.ledger.rollup import rebuild_days

    t0 = time.perf_counter()
    close_month_ledger(start, end, now)  # first: rebuild_days derives the months of the closed days
    stats.gpu_days = rebuild_days(start=start, end=end)
    vacuum_derived_ledger()
    with connection.cursor() as cur:
        for table in DERIVED_LEDGER:
            cur.execute("SELECT pg_total_relation_size(%s)", [table])
            stats.table_mb[table] = cur.fetchone()[0] / 2**20
    stats.usage_days = UsageDay.objects.count()
    stats.days_seconds = time.perf_counter() - t0


def fill_ledger(args: argparse.Namespace, database_url: str, ref: dict[str, Any], first_hour: datetime,
                rng: random.Random) -> FillStats:
    """COPY every GPU-hour and workload-hour, one day per COPY, on one psycopg2 connection."""
    stats = FillStats(gpus=len(ref["gpus"]), nodes=ref["nodes"])
    tenants = ref["tenants"]
    weights = _tenant_weights(len(tenants))
    slots: list[list[Slot]] = []
    for gpu in ref["gpus"]:
        mem_total, sm_total = GPU_SPECS[gpu.model]
        shares = [rng.uniform(0.5, 1.0) for _ in range(args.workloads_per_gpu)]
        scale = 0.95 / sum(shares)
        gpu_slots = []
        for share in shares:
            tenant = rng.choices(tenants, weights)[0]
            gpu_slots.append(Slot(tenant=tenant, namespace=f"{tenant}-{rng.choice(('prod', 'research'))}",
                                  app=rng.choice(APPS), tier=rng.choice(TIERS)[0], weight=share * scale,
                                  mem_mb=int(mem_total * share * scale), sm=round(sm_total * share * scale, 3)))
        slots.append(gpu_slots)
    hours = args.days * 24
    t0 = time.perf_counter()
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            # Secondary indexes are dropped for the COPY and rebuilt after it, from their own definitions
            # (the same indexes the migrations create; constraint indexes stay): minutes faster at scale.
            cur.execute(
                "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i "
                "WHERE i.indrelid IN ('billing_gpuhour'::regclass, 'billing_usagehour'::regclass) "
                "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)"
            )
            index_ddl = cur.fetchall()
            for index, _ddl in index_ddl:
                cur.execute(f"DROP INDEX {index}")
            conn.commit()
            for day in range(args.days):
                gpu_buf, usage_buf = io.StringIO(), io.StringIO()
                for h in range(day * 24, min(day * 24 + 24, hours)):
                    at = (first_hour + timedelta(hours=h)).isoformat()
                    for gpu, gpu_slots in zip(ref["gpus"], slots, strict=True):
                        if rng.random() < 0.01:
                            continue  # the node was down this hour
                        metered = 3600 if rng.random() > 0.03 else rng.randint(300, 3599)
                        card = PRICE_PER_HOUR[gpu.model] * UNIT * metered // 3600
                        card_units = int(card)
                        charged, shared = 0, Decimal(0)
                        # Joules: the card's draw by the share its slots hold (without a draw from the
                        # random sequence, so the fill is otherwise the one --no-energy gives).
                        idle_w, full_w = WATTS[gpu.model]
                        card_j = (idle_w + (full_w - idle_w) * sum(sl.weight for sl in gpu_slots)) * metered \
                            if args.energy else 0
                        card_j_int, attributed_j = int(card_j), 0
                        prefix = f"{gpu.uuid}\t{gpu.node_id}\t"
                        for slot in gpu_slots:
                            if rng.random() < 0.03:
                                continue  # slot empty this hour
                            if h >= slot.ends_at:
                                _new_pod(slot, h, rng)
                                stats.pods += 1
                            charge = card_units * int(slot.weight * 1_000_000) // 1_000_000
                            charged += charge
                            slot_j = card_j_int * int(slot.weight * 1_000_000) // 1_000_000
                            attributed_j += slot_j
                            mem_g = slot.mem_mb * metered
                            sm_g = slot.sm * metered
                            slot_share = f"{slot.weight * metered:.6f}"
                            shared += Decimal(slot_share)
                            usage_buf.write(
                                f"{prefix}{slot.tenant}\t{slot.namespace}\t{slot.pod}\t{slot.container}\t"
                                f"{slot.pod_uid}\t{slot.tier}\t{metered}\t{mem_g * rng.uniform(0.2, 1.0):.3f}\t"
                                f"{mem_g}\t{mem_g}\t{sm_g * rng.uniform(0.05, 1.0):.3f}\t{sm_g:.3f}\t{sm_g:.3f}\t"
                                f"{rng.uniform(0, 4e5):.3f}\t{slot_share}\t{_amount(charge)}\t0\t{slot_j}\t{at}\n"
                            )
                            stats.usage_hours += 1
                        gpu_buf.write(f"{prefix}{gpu.model}\t{metered}\t{_amount(card_units)}\t{_amount(charged)}\t"
                                      f"{_amount(card_units - charged)}\t0\tUSD\tt\t{shared}\t{card_j_int}\t"
                                      f"{card_j_int - attributed_j}\t{metered if args.energy else 0}\t{at}\n")
                        stats.gpu_hours += 1
                for table, columns, buf in (("billing_gpuhour", GPU_COLUMNS, gpu_buf),
                                            ("billing_usagehour", USAGE_COLUMNS, usage_buf)):
                    buf.seek(0)
                    cur.copy_expert(f"COPY {table} ({', '.join(columns)}) FROM STDIN", buf)
                conn.commit()
                log(f"  day {day + 1}/{args.days}: {stats.usage_hours:,} usage-hours so far")
        with conn.cursor() as cur:
            cur.execute("SET maintenance_work_mem = '256MB'")
            for _index, ddl in index_ddl:
                cur.execute(ddl)
        conn.commit()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("VACUUM (ANALYZE) billing_gpuhour")
            cur.execute("VACUUM (ANALYZE) billing_usagehour")
            for table in ("billing_gpuhour", "billing_usagehour"):
                cur.execute("SELECT pg_total_relation_size(%s)", [table])
                stats.table_mb[table] = cur.fetchone()[0] / 2**20
    finally:
        conn.close()
    stats.pods += sum(len(s) for s in slots)
    stats.seconds = time.perf_counter() - t0
    return stats


# --------------------------------------------------------------------------------------------
# Measuring


@dataclass
class Result:
    key: str
    label: str
    median_s: float
    p95_s: float
    queries: int | None
    slowest_sql: list[tuple[float, str]] = field(default_factory=list)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, -(-95 * len(ordered) // 100) - 1)]  # nearest rank


def measure(key: str, label: str, fn: Callable[[], Any], runs: int) -> Result:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    fn()  # warm-up
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    with CaptureQueriesContext(connection) as ctx:
        fn()
    slowest = sorted(((float(q["time"]), q["sql"]) for q in ctx.captured_queries), reverse=True)[:3]
    result = Result(key, label, statistics.median(times), p95(times), len(ctx.captured_queries), slowest)
    log(f"  {label}: median {result.median_s * 1000:,.0f} ms, p95 {result.p95_s * 1000:,.0f} ms, "
        f"{result.queries} queries")
    return result


def _client_get(client: Any, url: str) -> Callable[[], Any]:
    def get() -> Any:
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url}: HTTP {response.status_code}")
        return response.content

    return get


def run_measurements(args: argparse.Namespace, tenants: list[str], now: datetime) -> list[Result]:
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.db import connection
    from django.test import Client

    from billing.calendar import month_bounds
    from billing.ledger.models import UsageHour
    from billing.ledger.rollup import rebuild_days
    from billing.models import TenantMembership
    from billing.queries.dashboard import get_finance_dashboard
    from billing.queries.periods import list_billing_periods
    from billing.queries.portal import WORKLOAD_TABLE_ROWS, get_tenant_portal, list_tenant_portals
    from billing.scope import get_scope
    from billing.services.invoicing.close import preview_invoices

    if "testserver" not in settings.ALLOWED_HOSTS:
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    start, end = month_bounds(args.month)
    week = end - timedelta(days=7)
    big = (UsageHour.objects.filter(hour__gte=start, hour__lt=end).values("tenant").order_by()
           .annotate(n=_count()).order_by("-n").values_list("tenant", flat=True).first()) or tenants[0]
    finance = User.objects.get_or_create(username="webbench-finance")[0]  # a kept database has them (--reuse-db)
    finance.groups.add(Group.objects.get_or_create(name="finance")[0])
    member = User.objects.get_or_create(username="webbench-member")[0]
    TenantMembership.objects.get_or_create(user=member, tenant_id=_tenant_id(big))
    scope = get_scope(finance)
    month_end_day = (end - timedelta(days=1)).date()

    def baseline() -> Any:
        with connection.cursor() as cur:
            cur.execute("SELECT sum(card_cost) FROM billing_gpuhour WHERE hour >= %s AND hour < %s", [start, end])
            return cur.fetchone()

    finance_client, member_client = Client(), Client()
    finance_client.force_login(finance)
    member_client.force_login(member)
    q = f"start={args.month.isoformat()}&end={month_end_day.isoformat()}"
    q7 = f"start={(month_end_day - timedelta(days=6)).isoformat()}&end={month_end_day.isoformat()}"
    items: list[tuple[str, str, Callable[[], Any]]] = [
        ("baseline", "BASELINE: sum(card_cost) over the month's GpuHour rows", baseline),
        ("dashboard_mtd", "get_finance_dashboard, month to date (finance)",
         lambda: get_finance_dashboard(scope=scope, start=start, end=end)),
        ("dashboard_7d", "get_finance_dashboard, last 7 days (finance)",
         lambda: get_finance_dashboard(scope=scope, start=week, end=end)),
        ("portal", f"get_tenant_portal, biggest tenant ({big}), month to date, as the page asks "
                   f"({WORKLOAD_TABLE_ROWS} costliest workloads)",
         lambda: get_tenant_portal(scope=scope, slug=big, start=start, end=end, now=now,
                                   workload_limit=WORKLOAD_TABLE_ROWS)),
        ("tenant_list", "list_tenant_portals (finance)", lambda: list_tenant_portals(scope=scope, now=now)),
        ("periods", "list_billing_periods (finance)", lambda: list_billing_periods(scope=scope, now=now)),
        ("preview_invoices", "preview_invoices, every tenant, month in progress",
         lambda: preview_invoices(month=args.month, now=now)),
        ("page_finance_mtd", f"page /finance/?{q} (finance)", _client_get(finance_client, f"/finance/?{q}")),
        ("page_finance_7d", f"page /finance/?{q7} (finance)", _client_get(finance_client, f"/finance/?{q7}")),
        ("page_tenants", "page /tenants/ (finance)", _client_get(finance_client, "/tenants/")),
        ("page_portal", f"page /tenants/{big}/ (tenant member)", _client_get(member_client, f"/tenants/{big}/")),
        ("page_portal_7d", f"page /tenants/{big}/?{q7} (tenant member; the last 7 days)",
         _client_get(member_client, f"/tenants/{big}/?{q7}")),
        # A download, not a page: every workload of the month with its reasons.
        ("portal_csv", f"download /tenants/{big}/?{q}&format=csv (tenant member; every workload)",
         _client_get(member_client, f"/tenants/{big}/?{q}&format=csv")),
        ("page_periods", "page /periods/ (finance)", _client_get(finance_client, "/periods/")),
        ("page_invoices", "page /invoices/ (finance; upcoming invoices)", _client_get(finance_client, "/invoices/")),
        ("page_explore", f"page /explore/?{q} (finance; the tenants)", _client_get(finance_client, f"/explore/?{q}")),
        ("page_explore_tenant", f"page /explore/?{q}&tenant={big} (finance; its namespaces)",
         _client_get(finance_client, f"/explore/?{q}&tenant={big}")),
        ("page_fleet", f"page /fleet/?{q} (finance; every node and GPU)", _client_get(finance_client, f"/fleet/?{q}")),
        # The rollup's day step when every GPU reported in a cycle: each touched GPU-day is deleted
        # and re-derived from its hour rows (here the month's last day, all GPUs, 24 h of rows).
        ("rollup_day_step", "rollup day step: re-derive one day of every GPU (write)",
         lambda: rebuild_days(start=end - timedelta(days=1), end=end)),
    ]
    return [measure(key, label, fn, args.runs) for key, label, fn in items]


def _count() -> Any:
    from django.db.models import Count

    return Count("id")


def _tenant_id(slug: str) -> int:
    from billing.models import Tenant

    return int(Tenant.objects.get(slug=slug).pk)


def explain(results: list[Result], n: int) -> str:
    from django.db import connection

    seen: list[tuple[float, str, str]] = []
    for r in results:
        if r.key == "baseline":
            continue
        seen.extend((t, sql, r.key) for t, sql in r.slowest_sql)
    out = []
    done: set[str] = set()
    for t, sql, key in sorted(seen, reverse=True):
        if sql in done or len(done) >= n:
            continue
        done.add(sql)
        with connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
            plan = "\n".join(row[0] for row in cur.fetchall())
        out.append(f"--- {key}: {t * 1000:,.0f} ms\n{sql}\n{plan}\n")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Report


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}"


def results_table(results: list[Result], before: dict[str, Any] | None, before_label: str) -> str:
    base = next(r for r in results if r.key == "baseline").median_s
    head = "| what | median ms | p95 ms | × baseline | queries |"
    rule = "|---|---:|---:|---:|---:|"
    if before:
        head += f" {before_label}: median ms | {before_label}: × its baseline | {before_label}: queries | speed-up |"
        rule += "---:|---:|---:|---:|"
        before_base = before["results"]["baseline"]["median_s"]
    lines = [head, rule]
    for r in results:
        line = f"| {r.label} | {_ms(r.median_s)} | {_ms(r.p95_s)} | {r.median_s / base:.1f} | {r.queries} |"
        if before:
            b = before["results"].get(r.key)
            if b:
                line += (f" {_ms(b['median_s'])} | {b['median_s'] / before_base:.1f} | {b['queries']} | "
                         f"{b['median_s'] / r.median_s:.1f}× |")
            else:
                line += " | | | |"
        lines.append(line)
    return "\n".join(lines)


def command_line(argv: list[str]) -> str:
    return "python -m config.embedded -- .venv/bin/python bench/web_pages.py " + " ".join(shlex.quote(a) for a in argv)


ANALYSIS = """\
What changed against the "before" columns (the fleet-scale work; the same benchmark, data generator and seed; the
"before" run is of commit b65687e, the start of the fleet-scale work):

- **The upcoming invoice and month-to-date spend read closed days plus today's hours**
  (billing/ledger/spend.py). The UTC days of the month that are over come from the day ledger
  (UsageDay joined to GpuDay for currency, model and `priced`), the day in progress and the hours
  after it from the hour ledger, instead of every workload-hour of the month joined to its GPU-hour.
  Days in which a rate card starts or ends other than at midnight, and days on which some GPU has
  priced and unpriced hours, are read from hours, so the lines equal the hour-based close's to the
  ledger unit and after the one rounding (tests/billing/test_spend_equivalence.py, a hypothesis
  property). The close itself still reads hours. Budgets, the tenant list and the portal's
  month-to-date spend use the same split.
- **Planner settings for these period reads**, for the statement only: the planner estimates the
  join of usage rows to GPU rows on (gpu_uuid, window) as the product of the two columns'
  selectivities and chose a nested loop of index probes; hash joins were 2-5x faster here. Sorts of
  the per-workload groups spilled at the default 4 MB work_mem (32 MB now), and JIT compilation cost
  ~0.3 s on sub-second statements (off).
- **The portal's daily chart** sums the top series and "other" in SQL (31 x 8 rows instead of one
  row per workload-day, ~43k for the biggest tenant), and its workload table shows the 100 costliest
  of the period (the biggest tenant ran 7,686 pods this month; rendering them all took ~4 s); the
  CSV still lists every workload.
- **The finance dashboard** takes its tenant totals and its top workloads from one pass over the
  period's usage (billing.ledger.totals.summarise_workloads: per pod and tier once, then per pod,
  then per tenant and the costliest pods from those groups), under the same planner settings;
  apart, the two aggregations of the month's ~174k workload-days took ~1 s of its ~1.2 s.
- The ledger is keyed by node since this change (every usage-to-GPU join carries node_id), and the
  rollup writes days as before: the day step's row is the same work.
- Rows whose code did not change (periods) differ only by machine noise: compare the "x baseline"
  columns.
"""


def render_section(args: argparse.Namespace, argv: list[str], fill: FillStats, results: list[Result],
                   before: dict[str, Any] | None, machine: dict[str, str]) -> str:
    slow = [r for r in results if r.median_s > 1.0 and r.key != "rollup_day_step"]  # a write, not a page
    still = ("Over 1 s (median) in this run: " + "; ".join(f"{r.label} ({r.median_s:.2f} s)" for r in slow) + "."
             if slow else "No page or page query over 1 s (median) in this run.")
    before_note = ""
    if before:
        before_note = (f"\n\"{args.before_label}\" columns: {before['when']}, `{before['command']}`, same data "
                       f"generator and seed, on the code before the fixes; each ratio is against the baseline of "
                       f"its own run.\n")
    return "\n".join([
        SECTION_TITLE,
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC:",
        "",
        "```",
        command_line(argv),
        "```",
        "",
        "Machine: " + "; ".join(f"{k}: {v}" for k, v in machine.items()) + ". Shared and noisy: read the ratios.",
        "",
        f"Data: {fill.gpus} GPUs on {fill.nodes} nodes, {args.days} days ending with {args.month:%Y-%m} "
        f"(month to date = the whole month, `now` = its last hour), {args.workloads_per_gpu} workload slots per GPU, "
        f"{args.tenants} tenants: {fill.gpu_hours:,} GpuHour rows ({fill.table_mb.get('billing_gpuhour', 0):,.0f} MiB "
        f"with indexes) and {fill.usage_hours:,} UsageHour rows ({fill.table_mb.get('billing_usagehour', 0):,.0f} MiB), "
        f"{fill.pods:,} pods; " + ("the database of an earlier fill, reused (--reuse-db): fill times not measured. Day "
                                  "ledger: " if fill.reused else
                                  f"COPY + VACUUM ANALYZE took {fill.seconds:.0f} s. Day ledger derived from those hours "
                                  f"(`rebuild_days`, + VACUUM FULL, ANALYZE) in {fill.days_seconds:.0f} s: ")
        + f"{fill.gpu_days:,} GpuDay rows "
        f"({fill.table_mb.get('billing_gpuday', 0):,.0f} MiB) and {fill.usage_days:,} UsageDay rows "
        f"({fill.table_mb.get('billing_usageday', 0):,.0f} MiB). Warm: median and p95 of {args.runs} "
        f"runs after one warm-up; queries counted in one more run.",
        before_note,
        results_table(results, before, args.before_label),
        "",
        still,
        "",
        ANALYSIS,
    ])


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    admin_url = os.environ.get("DATABASE_URL")
    if not admin_url or not os.environ.get("REDIS_URL"):
        log("DATABASE_URL and REDIS_URL must be set (run under `python -m config.embedded -- ...`)")
        return 2
    import urllib.parse

    name = (urllib.parse.urlsplit(admin_url).path.lstrip("/") or "postgres") + "_webbench"
    url = with_database(admin_url, name)
    admin_url = with_database(admin_url, "postgres")  # the maintenance database: DATABASE_URL's need not exist
    start_month = datetime(args.month.year, args.month.month, 1, tzinfo=UTC)
    month_end = start_month + timedelta(days=31)
    first_hour = month_end - timedelta(days=args.days)
    now = month_end - timedelta(minutes=30)
    rng = random.Random(args.seed)
    log(f"database {name}: {'reuse' if args.reuse_db else 'create'} and migrate")
    if not args.reuse_db:
        recreate_database(admin_url, name)
    try:
        env = child_env(url)
        manage(env, "migrate", "--no-input")
        warnings.filterwarnings("ignore", message="No directory at")  # no collectstatic for a benchmark
        setup_django(env)
        if args.reuse_db:
            fill = reused_fill_stats(first_hour, month_end, now)
            tenants = [slug for slug, _name in TENANT_NAMES[:args.tenants]]
            log(f"reused {fill.gpu_hours:,} GPU-hours, {fill.usage_hours:,} usage-hours")
        else:
            ref = create_reference_rows(args, first_hour, rng)
            tenants = ref["tenants"]
            log(f"fill: {args.gpus} GPUs x {args.days} days x {args.workloads_per_gpu} workloads")
            fill = fill_ledger(args, url, ref, first_hour, rng)
            log(f"filled {fill.gpu_hours:,} GPU-hours, {fill.usage_hours:,} usage-hours in {fill.seconds:.0f} s")
            fill_days(fill, first_hour, month_end, now)
            log(f"derived {fill.gpu_days:,} GPU-days, {fill.usage_days:,} usage-days in {fill.days_seconds:.0f} s")
        with mock.patch("django.utils.timezone.now", return_value=now):
            results = run_measurements(args, tenants, now)
            plans = explain(results, args.explain) if args.explain else ""
        machine = machine_info(url)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            recreate_database(admin_url, name, drop_only=True)
    before = json.loads(args.before_json.read_text()) if args.before_json else None
    print(results_table(results, before, args.before_label))
    if plans:
        print("\nEXPLAIN (ANALYZE, BUFFERS) of the slowest statements:\n")
        print(plans)
    if args.save_json:
        args.save_json.write_text(json.dumps({
            "when": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "command": command_line(argv),
            "fill": asdict(fill), "results": {r.key: asdict(r) for r in results},
        }, indent=1, default=str))
    if args.write_docs:
        write_docs(render_section(args, argv, fill, results, before, machine), SECTION_TITLE)
        log(f"wrote the '{SECTION_TITLE}' section of {DOCS_FILE}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run(parse_args(argv), argv)


if __name__ == "__main__":
    sys.exit(main())
