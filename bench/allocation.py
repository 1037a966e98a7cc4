"""The allocation API (docs/allocation-api.md) over a month of a fleet: allocation_sets and GET /allocation/compute
for the reads OpenCost clients make, against the same data generator as bench/web_pages.py.

    python bench/allocation.py [--gpus 100] [--days 31] [--workloads-per-gpu 6] [--runs 3] [--no-energy]
                               [--keep-db] [--reuse-db] [--write-docs]

DATABASE_URL and REDIS_URL must be set (`python -m config.embedded -- ...` provides them). Like
bench/web_pages.py it drops and creates `<dbname>_webbench`, migrates and fills it (its fill: hour
ledger by COPY with each card's energy and the nodes' priced locations unless --no-energy, day
ledger derived), then adds one WorkloadMeta row per pod instance (a controller,
an `app` label for 3 of 4 pods, a request for each container), and drops it at the end.

Ratios are against two reads measured in the same run: BASELINE, `sum(card_cost)` over the month's
GPU-hours (the floor of any read of the month), and the finance dashboard's one-pass per-pod summary
of the month (billing.ledger.totals.summarise_workloads), the nearest existing read of the same rows.
A benchmark is not a test: it reports numbers and never fails on speed.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import urllib.parse
import warnings
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import web_pages as wp
from bench.ingest import (
    child_env,
    machine_info,
    manage,
    recreate_database,
    setup_django,
    with_database,
    write_docs,
)

SECTION_TITLE = "## Allocation API"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=100)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--days", type=int, default=31)
    p.add_argument("--workloads-per-gpu", type=int, default=6)
    p.add_argument("--tenants", type=int, default=20)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=20261130)
    wp.add_energy_option(p)
    p.add_argument("--keep-db", action="store_true")
    p.add_argument("--reuse-db", action="store_true")
    p.add_argument("--write-docs", action="store_true")
    args = p.parse_args(argv)
    args.tenants = min(args.tenants, len(wp.TENANT_NAMES))
    args.month = wp.default_month(datetime.now(UTC).date())
    return args


def add_workload_meta(first_seen: datetime, end: datetime) -> int:
    """One WorkloadMeta row per pod instance and node of the hour ledger (the metadata's key since
    nodes speak only for their own pods): a controller per pod name, an `app` label on 3 pods of 4,
    and a request for every container the pod ran. Before the day ledger is derived (fill_days),
    whose rebuild_days stores the hours' requested figures from it and sums them into the days and
    months, as the rollup writes them (billing.ledger.requests)."""
    from django.db import connection

    from billing.ledger.models import WorkloadMeta

    table = WorkloadMeta._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {table} (node_id, namespace, pod, pod_uid, controller_kind, controller_name, labels, requests, "  # noqa: S608 - the model's own table name; values are fixed
            "first_seen, last_seen, requests_changed) SELECT node_id, namespace, pod, pod_uid, 'deployment', "
            "split_part(pod, '-', 1), CASE WHEN abs(hashtext(pod_uid)) %% 4 = 0 THEN '{}'::jsonb "
            "ELSE jsonb_build_object('app', 'app-' || (abs(hashtext(pod)) %% 12)) END, "
            "jsonb_object_agg(container, jsonb_build_object('mem_mb', 8192, 'sm', 20)), %s, %s, false "
            "FROM (SELECT DISTINCT node_id, namespace, pod, pod_uid, container FROM billing_usagehour) p "
            "GROUP BY node_id, namespace, pod, pod_uid ON CONFLICT DO NOTHING", [first_seen, end])
        count = cur.rowcount
        cur.execute(f"ANALYZE {table}")
    return int(count)


def order_hours_as_written() -> None:
    """The hour table rewritten in the order the rollup writes it, without the versions that storing
    the requested figures left dead. Each drain deletes and inserts a GPU-hour's rows together, the
    hours in time order, so a GPU's rows of an hour share pages. Ordered by tenant instead (as
    migration 0052 leaves the rows it found), the portal's peak hours (billing.ledger.billed_basis),
    which probed a GPU's hours, read about 6x the pages, 0.36-0.5 s against 0.18, while a week's
    hourly sets read 3-8 % faster than production would (docs/benchmarks.md). CLUSTER needs an index
    for the order: one made for it, then dropped."""
    from django.db import connection

    from billing.ledger.models import UsageHour

    hours = UsageHour._meta.db_table
    with connection.cursor() as cur:
        cur.execute(f"CREATE INDEX bench_hour_written_order ON {hours} (hour, node_id, gpu_uuid)")
        cur.execute(f"CLUSTER {hours} USING bench_hour_written_order")
        cur.execute("DROP INDEX bench_hour_written_order")
        cur.execute(f"ANALYZE {hours}")


def run_measurements(args: argparse.Namespace, now: datetime) -> list[wp.Result]:
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.db import connection
    from django.test import Client

    from billing.calendar import month_bounds
    from billing.ledger.models import UsageHour
    from billing.ledger.totals import summarise_workloads
    from billing.models import TenantMembership
    from billing.queries.allocation import Window, allocation_sets
    from billing.scope import get_scope

    if "testserver" not in settings.ALLOWED_HOSTS:
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    start, end = month_bounds(args.month)
    finance = User.objects.get_or_create(username="allocbench-finance")[0]
    finance.groups.add(Group.objects.get_or_create(name="finance")[0])
    big = (UsageHour.objects.filter(hour__gte=start, hour__lt=end).values("tenant").order_by()
           .annotate(n=wp._count()).order_by("-n").values_list("tenant", flat=True).first())
    member = User.objects.get_or_create(username="allocbench-member")[0]
    TenantMembership.objects.get_or_create(user=member, tenant_id=wp._tenant_id(str(big)))
    scope, tenant_scope = get_scope(finance), get_scope(member)
    month = Window(start, end)
    # Not whole days: the hour ledger.
    hours = Window(end - timedelta(days=7, hours=-5), end - timedelta(hours=3))
    client = Client()
    client.force_login(finance)

    def baseline() -> Any:
        with connection.cursor() as cur:
            cur.execute("SELECT sum(card_cost) FROM billing_gpuhour WHERE hour >= %s AND hour < %s", [start, end])
            return cur.fetchone()

    def sets(scope_: Any = None, **kw: Any) -> Callable[[], Any]:
        # The scope bound here, not popped from `kw` at the first call: every timed run reads as the
        # warm-up did (a popped scope made a tenant's runs read every tenant's pods).
        chosen = scope if scope_ is None else scope_
        return lambda: allocation_sets(chosen, **{"window": month, **kw})

    q = f"window={start:%Y-%m-%dT%H:%M:%SZ},{end:%Y-%m-%dT%H:%M:%SZ}"
    items: list[tuple[str, str, Callable[[], Any]]] = [
        ("baseline", "BASELINE: sum(card_cost) over the month's GpuHour rows", baseline),
        ("summary", "reference: summarise_workloads, the month (the dashboard's per-pod pass)",
         lambda: summarise_workloads(start=start, end=end, tenants=None, top=10)),
        ("namespace", "month, aggregate=namespace, includeIdle (day ledger)",
         sets(aggregate=["namespace"], include_idle=True, accumulate=True)),
        ("label", "month, aggregate=label:app (WorkloadMeta join)", sets(aggregate=["label:app"], accumulate=True)),
        ("controller_pod", "month, aggregate=controller,pod", sets(aggregate=["controller", "pod"])),
        ("default", "month, unaggregated (cluster/node/namespace/pod/container)", sets(aggregate=[])),
        ("daily", "month, aggregate=namespace, step=1d, includeIdle", sets(aggregate=["namespace"], step=timedelta(days=1),
                                                                           include_idle=True)),
        ("share", "month, aggregate=namespace, shareIdle, idleByNode",
         sets(aggregate=["namespace"], share_idle=True, idle_by_node=True, include_idle=True)),
        ("gpu_model", "month, aggregate=gpu_model,sla_tier (GPU join)", sets(aggregate=["gpu_model", "sla_tier"])),
        ("tenant", f"month, aggregate=pod, tenant scope ({big})", sets(aggregate=["pod"], scope_=tenant_scope)),
        ("hours", "7 days not on midnights (hour ledger), aggregate=namespace, step=1h",
         sets(aggregate=["namespace"], window=hours, step=timedelta(hours=1), include_idle=True)),
        # Every hour row of the month, one set per hour (docs/scaling.md, "Long windows at an hour's step").
        ("month_hours", "month, aggregate=namespace, step=1h, includeIdle (744 sets of the hour ledger)",
         sets(aggregate=["namespace"], step=timedelta(hours=1), include_idle=True)),
        ("http", "GET /allocation/compute, month, aggregate=namespace,label:app, includeIdle",
         wp._client_get(client, f"/allocation/compute?{q}&aggregate=namespace,label:app&includeIdle=true")),
        # The per-pod month as a client receives it: the query above plus tens of MB of JSON.
        ("http_pod", "GET /allocation/compute, month, aggregate=pod (the whole answer, its JSON included)",
         wp._client_get(client, f"/allocation/compute?{q}&aggregate=pod")),
        # The other answers of about an allocation per pod, as large: OpenCost's default keys, a
        # controller's pods (the metadata joined), and idle shared per node (the exact charges read).
        ("http_default", "GET /allocation/compute, month, unaggregated (cluster/node/namespace/pod/container)",
         wp._client_get(client, f"/allocation/compute?{q}")),
        ("http_controller_pod", "GET /allocation/compute, month, aggregate=controller,pod",
         wp._client_get(client, f"/allocation/compute?{q}&aggregate=controller,pod")),
        ("http_pod_share", "GET /allocation/compute, month, aggregate=pod, shareIdle, idleByNode",
         wp._client_get(client, f"/allocation/compute?{q}&aggregate=pod&shareIdle=true&idleByNode=true")),
        ("http_hours", "GET /allocation/compute, the 7 days above, aggregate=namespace, step=1h, includeIdle",
         wp._client_get(client, f"/allocation/compute?window={hours.start:%Y-%m-%dT%H:%M:%SZ},"
                                f"{hours.end:%Y-%m-%dT%H:%M:%SZ}&aggregate=namespace&step=1h&includeIdle=true")),
    ]
    return [wp.measure(key, label, fn, args.runs) for key, label, fn in items]


def run(args: argparse.Namespace, argv: list[str]) -> int:
    admin_url = os.environ.get("DATABASE_URL")
    if not admin_url or not os.environ.get("REDIS_URL"):
        wp.log("DATABASE_URL and REDIS_URL must be set (run under `python -m config.embedded -- ...`)")
        return 2
    name = (urllib.parse.urlsplit(admin_url).path.lstrip("/") or "postgres") + "_webbench"
    url = with_database(admin_url, name)
    admin_url = with_database(admin_url, "postgres")
    start_month = datetime(args.month.year, args.month.month, 1, tzinfo=UTC)
    month_end = start_month + timedelta(days=31)
    first_hour = month_end - timedelta(days=args.days)
    now = month_end - timedelta(minutes=30)
    rng = random.Random(args.seed)
    if not args.reuse_db:
        recreate_database(admin_url, name)
    try:
        env = child_env(url)
        manage(env, "migrate", "--no-input")
        warnings.filterwarnings("ignore", message="No directory at")
        setup_django(env)
        if args.reuse_db:
            fill = wp.reused_fill_stats(first_hour, month_end, now)
        else:
            ref = wp.create_reference_rows(args, first_hour, rng)
            fill = wp.fill_ledger(args, url, ref, first_hour, rng)
            metas = add_workload_meta(first_hour, month_end)
            wp.fill_days(fill, first_hour, month_end, now)
            order_hours_as_written()
            wp.log(f"filled {fill.gpu_hours:,} GPU-hours, {fill.usage_hours:,} usage-hours, {metas:,} WorkloadMeta rows")
        with mock.patch("django.utils.timezone.now", return_value=now):
            results = run_measurements(args, now)
        machine = machine_info(url)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            recreate_database(admin_url, name, drop_only=True)
    table = wp.results_table(results, None, "")
    print(table)
    if args.write_docs:
        command = "python -m config.embedded -- .venv/bin/python bench/allocation.py " + " ".join(argv)
        section = (f"{SECTION_TITLE}\n\n```\n{command}\n```\n\n{args.gpus} GPUs × {args.days} days × "
                   f"{args.workloads_per_gpu} workload slots per GPU ({fill.gpu_hours:,} GPU-hours, "
                   f"{fill.usage_hours:,} usage-hours); {machine.get('CPU', '')}, {machine.get('cores', '')} cores, "
                   f"PostgreSQL {machine.get('PostgreSQL', '')}. Median of {args.runs} warm runs; × baseline is against "
                   "`sum(card_cost)` over the month in the same run.\n\n" + table + "\n")
        write_docs(section, SECTION_TITLE)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run(parse_args(argv), argv)


if __name__ == "__main__":
    sys.exit(main())
