"""What the allocation API's week of hourly sets would take with the requested figures stored in the
hour rows instead of joined from the containers' requests (docs/architecture.md, "No pre-aggregated
ledger of hours per grouping key yet"): a prototype on copies of the rows, not the ledger.

    python bench/stored_requests.py [--runs 5] [--rounds 2]

DATABASE_URL and REDIS_URL must be set; it reads `<dbname>_webbench` as bench/allocation.py left it
(`--keep-db`: 1,000 GPUs x 31 days of 2026-10 with its WorkloadMeta rows) and changes nothing in its
ledger. It captures the groups' statement that `allocation_sets` runs for bench/allocation.py's week
(7 days not on midnights, aggregate=namespace, step=1h), copies that week's hour rows into two tables
of their own, one as they are and one with each row's requested memory and SM (request x seconds,
by the statement's own join), each with the (hour, tenant) index and analysed, and times, alternating
`--rounds` times, `--runs` runs each:

1. the statement as shipped, on the plain copy;
2. the same without the join (the requested figures left out): what the join costs;
3. the stored figures summed, no join, on the copy that holds them.

It checks that 1 and 3 give the same groups to the last digit, prints the bytes per row of both
copies, and drops them. A benchmark is not a test: it reports numbers and never fails on speed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import urllib.parse
import warnings
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ingest import child_env, setup_django, with_database

PLAIN, STORED = "bench_hours_plain", "bench_hours_requested"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--month", type=lambda s: datetime.strptime(s, "%Y-%m").replace(tzinfo=UTC).date(),
                   default=datetime(2026, 10, 1, tzinfo=UTC).date())
    return p.parse_args(argv)


def groups_statement(end: datetime) -> tuple[str, Any]:
    """The groups' statement of the week's hourly sets, and its parameters, as allocation_sets runs it."""
    from django.contrib.auth.models import Group, User
    from django.db import connection

    from billing.queries.allocation import Window, allocation_sets
    from billing.scope import get_scope

    finance = User.objects.get_or_create(username="storedbench-finance")[0]
    finance.groups.add(Group.objects.get_or_create(name="finance")[0])
    week = Window(end - timedelta(days=7, hours=-5), end - timedelta(hours=3))
    seen: list[tuple[str, Any]] = []

    def capture(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith("SELECT width_bucket"):
            seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        allocation_sets(get_scope(finance), window=week, aggregate=["namespace"], step=timedelta(hours=1),
                        include_idle=True)
    if len(seen) != 1:
        raise SystemExit(f"expected one groups' statement, saw {len(seen)}")
    return seen[0]


def variants(sql: str) -> dict[str, str]:
    """The statement on the plain copy, without its requests' join, and on the stored copy."""
    from billing.ledger import allocation

    on_plain = sql.replace("FROM billing_usagehour u", f"FROM {PLAIN} u")
    if on_plain == sql or allocation._REQUESTS_JOIN not in sql:
        raise SystemExit("the groups' statement no longer reads the hour rows through the requests' join")
    mem, sm = allocation._REQUESTED["mem_mb"], allocation._REQUESTED["sm"]
    no_join = (on_plain.replace(allocation._REQUESTS_JOIN, "")
               .replace("r.mem_mb IS NOT NULL", "FALSE").replace("r.sm IS NOT NULL", "FALSE")
               .replace(mem, "NULL::numeric").replace(sm, "NULL::numeric"))
    stored = (sql.replace("FROM billing_usagehour u", f"FROM {STORED} u")
              .replace("u.energy_j, u.hour AS at", "u.energy_j, u.mem_requested_mb_s, u.sm_requested_s, u.hour AS at")
              .replace(allocation._REQUESTS_JOIN, "")
              .replace("r.mem_mb IS NOT NULL", "u.mem_requested_mb_s IS NOT NULL").replace(mem, "u.mem_requested_mb_s")
              .replace("r.sm IS NOT NULL", "u.sm_requested_s IS NOT NULL").replace(sm, "u.sm_requested_s"))
    if "r." in stored.replace("er.", ""):
        raise SystemExit("the stored variant still reads the requests' join")
    return {"as shipped, joining the requests": on_plain, "without the requests' join": no_join,
            "the stored figures summed, no join": stored}


def copy_rows(cur: Any, start: datetime, end: datetime) -> dict[str, float]:
    """The week's hour rows copied twice (plain; with the requested figures), indexed and analysed."""
    from billing.ledger import allocation

    cur.execute(f"DROP TABLE IF EXISTS {PLAIN}, {STORED}")
    cur.execute(f"CREATE TABLE {PLAIN} AS SELECT * FROM billing_usagehour WHERE hour >= %s AND hour < %s",  # noqa: S608 - fixed names
                [start, end])
    mem, sm = allocation._REQUESTED["mem_mb"], allocation._REQUESTED["sm"]
    cur.execute(f"CREATE TABLE {STORED} AS SELECT u.*, {mem} AS mem_requested_mb_s, {sm} AS sm_requested_s "  # noqa: S608 - as above
                f"FROM {PLAIN} u{allocation._REQUESTS_JOIN}")
    sizes = {}
    for table in (PLAIN, STORED):
        cur.execute(f"CREATE INDEX ON {table} (hour, tenant)")
        cur.execute(f"ANALYZE {table}")
        cur.execute(f"SELECT pg_relation_size('{table}')::float8 / count(*) FROM {table}")  # noqa: S608 - as above
        sizes[table] = float(cur.fetchone()[0])
    return sizes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    admin_url = os.environ.get("DATABASE_URL")
    if not admin_url or not os.environ.get("REDIS_URL"):
        print("DATABASE_URL and REDIS_URL must be set", file=sys.stderr)
        return 2
    name = (urllib.parse.urlsplit(admin_url).path.lstrip("/") or "postgres") + "_webbench"
    warnings.filterwarnings("ignore", message="No directory at")
    setup_django(child_env(with_database(admin_url, name)))
    from django.db import connection

    from billing.ledger import allocation
    from billing.ledger.reads import period_read_cursor

    end = datetime(args.month.year, args.month.month, 1, tzinfo=UTC) + timedelta(days=31)
    sql, params = groups_statement(end)
    statements = variants(sql)
    # The read's own planner settings: a groups' read without the GPU rows' join (billing.ledger.allocation).
    settings = {**allocation._GROUP_READ_SETTINGS, **allocation._LATERAL_READ_SETTINGS}
    with connection.cursor() as cur:
        sizes = copy_rows(cur, end - timedelta(days=7, hours=-5), end - timedelta(hours=3))
    try:
        answers = {}
        times: dict[str, list[float]] = {label: [] for label in statements}
        for _round in range(args.rounds):
            for label, statement in statements.items():
                for run in range(args.runs + 1):  # the first warms the copy's pages
                    with period_read_cursor(settings) as cur:
                        began = time.perf_counter()
                        cur.execute(statement, params)
                        rows = cur.fetchall()
                        took = time.perf_counter() - began
                    if run:
                        times[label].append(took)
                    answers[label] = sorted(rows, key=repr)
        shipped, stored = answers["as shipped, joining the requests"], answers["the stored figures summed, no join"]
        same = "yes" if shipped == stored else "NO"
        print(f"| the week's hourly groups ({args.runs} runs each, {args.rounds} alternating rounds) | median ms | range ms |")
        print("|---|---:|---:|")
        for label, spans in times.items():
            print(f"| {label} | {statistics.median(spans) * 1000:,.0f} | "
                  f"{min(spans) * 1000:,.0f}-{max(spans) * 1000:,.0f} |")
        print(f"\n{len(shipped):,} groups; the shipped and stored answers equal to the last digit: {same}. "
              f"Heap bytes per row: {sizes[PLAIN]:.1f} as stored, {sizes[STORED]:.1f} with the two figures.")
        return 0 if shipped == stored else 1
    finally:
        with connection.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {PLAIN}, {STORED}")


if __name__ == "__main__":
    sys.exit(main())
