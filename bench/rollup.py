"""Rollup benchmark (the rollup sharded by node): the sharded rollup against end-to-end ingest of the same rows.

    python bench/rollup.py [--agents 8] [--gpus 4] [--workloads-per-gpu 16] [--seconds-per-batch 60]
                           [--batches-per-agent 30] [--warmup-batches 2] [--repeats 2] [--write-docs]

DATABASE_URL and REDIS_URL must be set (`python -m config.embedded -- python bench/rollup.py`
provides them). The benchmark drops and creates `<dbname>_bench` on that server and drops it
again at the end (unless --keep-db). One run, so that the ratios compare on one (shared, noisy)
machine:

1. ingest, end to end: the agents (one node each, 1-second samples, `--seconds-per-batch`
   windows) post real gzip batches over HTTP to gunicorn (sync, 2 workers), with
   bench/ingest.py's machinery; samples/s from the first timed request to the last answer.
2. rollup, 1 worker: one real process (its own connection) runs billing.ledger.rollup.rollup_usage
   with shards=1 until nothing is pending.
3. rollup, 2 workers: the ledger is emptied, every batch set pending again and its integral rows
   put back in the inbox (the rollup deletes them once they are in the minutes: the same rows),
   then two processes run shard 0 and shard 1 of 2 at once.

A first run with 1 worker reads the freshly ingested rows cold (and sets their hint bits): it is
reported, not used in the ratios. Then steps 2 and 3 alternate `--repeats` times (1w, 2w, 1w,
2w, ...), each over the same rows from an empty ledger; the table gives every run, and the ratios
use the medians. Last, a steady cycle: every batch rolled up but the newest of each node, which is then rolled up
in-process. Worker processes start Django before the clock starts and wait for a go line on
stdin. Each run's ledger is checked to be identical to the first run's (every minute, hour and
day row), so a faster rollup cannot be a wrong one. A benchmark never fails on speed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.ingest import (  # noqa: E402 - after the path fix above
    DOCS_FILE,
    ServerConfig,
    Timeline,
    bench_database,
    build_payloads,
    child_env,
    drop_bench_database,
    encode,
    ensure_partitions,
    gunicorn,
    http_run,
    log,
    machine_info,
    make_agent,
    manage,
    recreate_database,
    setup_django,
    with_database,
)

SECTION_TITLE = "## Rollup: sharded by node"
# The ledger as read (the minute views) and as stored (the minute store's tables in their place).
LEDGER_TABLES = ("billing_usageminute", "billing_gpuminute", "billing_usagehour", "billing_gpuhour",
                 "billing_usageday", "billing_gpuday")
STORED_TABLES = ("billing_usageminute_store", "billing_gpuminute_store", *LEDGER_TABLES[2:])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, default=8, help="nodes (one agent each); >= 8 so shards have work")
    p.add_argument("--gpus", type=int, default=4, help="A100-80GB GPUs per node")
    p.add_argument("--workloads-per-gpu", type=int, default=16)
    p.add_argument("--seconds-per-batch", type=int, default=60, help="batch window, s (1-second samples)")
    p.add_argument("--batches-per-agent", type=int, default=30, help="timed batches per agent")
    p.add_argument("--warmup-batches", type=int, default=2, help="untimed batches per agent (rolled up too)")
    p.add_argument("--repeats", type=int, default=2, help="rollup runs per worker count, alternating")
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--keep-db", action="store_true")
    p.add_argument("--write-docs", action="store_true", help=f"append/replace '{SECTION_TITLE}' in docs/benchmarks.md")
    p.add_argument("--worker", nargs=2, type=int, metavar=("SHARD", "SHARDS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("agents", "gpus", "workloads_per_gpu", "seconds_per_batch", "batches_per_agent", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


# --------------------------------------------------------------------------------------------
# A rollup worker: its own process and connection


def worker_main(shard: int, shards: int) -> int:
    """Set up Django, wait for `go` on stdin, roll up the shard until nothing of it is pending."""
    import django

    django.setup()
    from django.db import connection
    from django.utils import timezone

    from billing.ledger.rollup import rollup_usage

    connection.ensure_connection()
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]
    print("ready", flush=True)
    sys.stdin.readline()
    began, cpu_began = time.perf_counter(), time.process_time() + _backend_cpu(backend)
    batches = minutes = 0
    while True:
        result = rollup_usage(now=timezone.now(), shard=shard, shards=shards, max_batches=100_000)
        batches, minutes = batches + result.batches, minutes + result.gpu_minutes
        if result.batches == 0 and not result.skipped:
            break
    print(json.dumps({"shard": shard, "batches": batches, "gpu_minutes": minutes,
                      "seconds": time.perf_counter() - began,
                      "cpu_s": time.process_time() + _backend_cpu(backend) - cpu_began}), flush=True)
    return 0


def _backend_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a Postgres backend on this machine, from /proc (10 ms ticks):
    with the worker's own, what the rollup costs whatever else the shared machine runs. 0 where the
    server is on another machine."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class RollupRun:
    workers: int
    seconds: float
    batches: int
    gpu_minutes: int
    cpu_s: float = 0.0  # the workers' CPU and their Postgres backends'


def run_workers(env: dict[str, str], workers: int) -> RollupRun:
    procs = [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(k), str(workers)],
                              cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for k in range(workers)]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
    began = time.perf_counter()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        assert proc.stdout is not None
        results.append(json.loads(proc.stdout.readline()))
        proc.wait()
        if proc.returncode:
            raise RuntimeError(f"rollup worker exited with {proc.returncode}")
    elapsed = time.perf_counter() - began
    return RollupRun(workers, elapsed, sum(r["batches"] for r in results), sum(r["gpu_minutes"] for r in results),
                     sum(r["cpu_s"] for r in results))


# A copy of the inbox as ingest left it: the rollup deletes a batch's integral rows once it has
# added them into the minutes, so each run from an empty ledger gets them back from here.
INBOX_COPY = "bench_inbox_copy"


def keep_inbox() -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE {INBOX_COPY} AS SELECT * FROM billing_raw_sample")  # noqa: S608 - fixed name


def reset_ledger() -> None:
    """Every batch pending again, its integral rows back in the inbox, and the ledger empty: the next
    run rolls up the same rows."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"TRUNCATE {', '.join(STORED_TABLES)}, billing_raw_sample")
        cur.execute(f"INSERT INTO billing_raw_sample SELECT * FROM {INBOX_COPY}")  # noqa: S608 - fixed name
        cur.execute("UPDATE billing_usagebatch SET rolled_up_at = NULL")
    with connection.cursor() as cur:
        cur.execute(f"VACUUM ANALYZE {', '.join(STORED_TABLES)}, billing_raw_sample, billing_usagebatch")


def ledger_digest() -> str:
    """A digest of every ledger row (ids left out), to check that each run wrote the same ledger."""
    from django.db import connection

    digest = hashlib.sha256()
    with connection.cursor() as cur:
        for table in LEDGER_TABLES:
            cur.execute(f"SELECT * FROM {table} LIMIT 0")  # noqa: S608 - fixed names
            columns = [c.name for c in cur.description if c.name not in {"id", "card_id", "workload_id"}]
            cur.execute(f"SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM "  # noqa: S608 - fixed table names and their catalogue columns
                        f"(SELECT {', '.join(columns)} FROM {table}) t")
            digest.update(f"{table}:{cur.fetchone()[0]}".encode())
    return digest.hexdigest()[:16]


def steady_cycle() -> RollupRun:
    """A cycle as the beat runs it once caught up: every batch rolled up but the newest of each node,
    then those rolled up (their minutes, hours and days re-derived), one in-process worker."""
    from django.db import connection
    from django.utils import timezone

    from billing.ledger.rollup import rollup_usage

    newest = "id IN (SELECT max(id) FROM billing_usagebatch GROUP BY node_id)"
    reset_ledger()
    with connection.cursor() as cur:
        cur.execute(f"UPDATE billing_usagebatch SET quarantined_at = now() WHERE {newest}")  # noqa: S608 - fixed SQL
    rollup_usage(now=timezone.now())
    with connection.cursor() as cur:
        cur.execute("UPDATE billing_usagebatch SET quarantined_at = NULL")
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]
    began, cpu_began = time.perf_counter(), time.process_time() + _backend_cpu(backend)
    result = rollup_usage(now=timezone.now())
    return RollupRun(1, time.perf_counter() - began, result.batches, result.gpu_minutes,
                     time.process_time() + _backend_cpu(backend) - cpu_began)


# --------------------------------------------------------------------------------------------
# The run


@dataclass
class Result:
    command: str
    started: datetime
    machine: dict[str, str]
    workload: str
    samples: int
    gpu_minutes: int
    ingest_samples: int
    ingest_seconds: float
    runs: list[RollupRun]
    digests: set[str]
    steady: RollupRun
    cold: RollupRun


def run(args: argparse.Namespace) -> Result:
    started = datetime.now(UTC)
    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url or not os.environ.get("REDIS_URL"):
        raise SystemExit("DATABASE_URL and REDIS_URL must be set (or: python -m config.embedded -- python bench/rollup.py)")
    admin_url, bench_name = bench_database(base_url)
    bench_url = with_database(base_url, bench_name)
    rng = random.Random(args.seed)
    agents = [make_agent(i, gpus=args.gpus, workloads_per_gpu=args.workloads_per_gpu, rng=rng)
              for i in range(args.agents)]
    spb = args.gpus * args.workloads_per_gpu * args.seconds_per_batch
    per_agent = args.warmup_batches + args.batches_per_agent
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=2)
    timeline = Timeline(end=end, seconds=args.seconds_per_batch, total=per_agent)
    log(f"database {bench_name}: drop, create, migrate")
    recreate_database(admin_url, bench_name)
    try:
        env = child_env(bench_url)
        manage(env, "migrate", "--noinput", "-v", "0")
        for agent in agents:
            agent.token = manage(env, "create_node_token", agent.node).strip().splitlines()[-1]
        setup_django(env)
        from billing.models import RateCard

        RateCard.objects.create(gpu_model="NVIDIA A100-SXM4-80GB", currency="USD", price_per_gpu_hour=Decimal("4.10"),
                                effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
        ensure_partitions(timeline.days())
        log(f"building batches: {args.agents} agents x {per_agent} batches x {spb} samples")
        warm = [[encode(p) for p in ps] for ps in
                build_payloads(agents, timeline.take(args.warmup_batches), args.seconds_per_batch, rng)]
        timed = [[encode(p) for p in ps] for ps in
                 build_payloads(agents, timeline.take(args.batches_per_agent), args.seconds_per_batch, rng)]
        from django.db import connection

        connection.close()
        config = ServerConfig("sync", 2, 1)
        log(f"ingest over HTTP, gunicorn {config.label}")
        with gunicorn(env, config) as server:
            ingest = http_run(server, bench_name, config, agents, warm, timed, spb)
        if ingest.errors:
            raise RuntimeError(f"{ingest.errors} ingest errors")
        log(f"  {ingest.rate:,.0f} samples/s")
        # The first read of freshly ingested rows also sets their hint bits and warms the caches:
        # that cold run is reported apart, so that the timed runs compare like with like.
        keep_inbox()
        reset_ledger()
        cold = run_workers(env, 1)
        log(f"  rollup, 1 worker, cold: {cold.seconds:.2f} s, {cold.batches} batches")
        runs: list[RollupRun] = []
        digests = {ledger_digest()}
        for _ in range(args.repeats):
            for workers in (1, 2):
                reset_ledger()
                runs.append(run_workers(env, workers))
                digests.add(ledger_digest())
                log(f"  rollup, {workers} worker(s): {runs[-1].seconds:.2f} s, {runs[-1].batches} batches")
        steady = steady_cycle()
        log(f"  steady cycle, one new batch per node: {steady.seconds:.2f} s")
        machine = machine_info(bench_url)
    finally:
        if not args.keep_db:
            drop_bench_database(admin_url, bench_name)
    samples = args.agents * per_agent * spb
    workload = (f"{args.agents} nodes (one agent each) x {args.gpus} A100-80GB x {args.workloads_per_gpu} workloads "
                f"per GPU, 1-second samples, {args.seconds_per_batch}-second batches ({spb:,} samples each), "
                f"{per_agent} batches per node ({args.warmup_batches} of them ingest warm-up, rolled up too)")
    command = "python bench/rollup.py" + ("" if len(sys.argv) < 2 else " " + shlex.join(sys.argv[1:]))
    return Result(command, started, machine, workload, samples, runs[0].gpu_minutes, ingest.samples,
                  ingest.seconds, runs, digests, steady, cold)


# --------------------------------------------------------------------------------------------
# Report


def _cpu_ms(run: RollupRun) -> str:
    return f"{1000 * run.cpu_s / run.gpu_minutes:.2f}" if run.cpu_s and run.gpu_minutes else "-"


def _median(runs: list[RollupRun], workers: int) -> float:
    return statistics.median(r.seconds for r in runs if r.workers == workers)


def render(result: Result) -> str:
    ingest_rate = result.ingest_samples / result.ingest_seconds
    one, two = _median(result.runs, 1), _median(result.runs, 2)
    lines = [
        SECTION_TITLE,
        "",
        f"Measured {result.started:%Y-%m-%d %H:%M} UTC with",
        "",
        "```",
        result.command,
        "```",
        "",
        f"(DATABASE_URL and REDIS_URL set; its own `<dbname>_bench` database.) Machine: {result.machine.get('cores', '?').split(' ')[0]} "
        f"cores, {result.machine.get('CPU', '?')}, PostgreSQL {result.machine.get('PostgreSQL', '?').split(' ')[0]}.",
        "",
        f"Workload: {result.workload}: {result.samples:,} samples, {result.gpu_minutes:,} GPU-minutes. "
        "Ingest is end to end over HTTP (gunicorn sync, 2 workers, the agents as threads of the benchmark). "
        "Each rollup run starts from an empty ledger with every batch pending and rolls up all of them; "
        "each worker is a real process with its own connection, shard k of N (node_id % N).",
        "",
        "| step | seconds | samples/s | GPU-minutes/s | CPU ms per GPU-minute (workers + their Postgres backends) |",
        "|---|---:|---:|---:|---:|",
        f"| ingest, HTTP end to end ({result.ingest_samples:,} timed samples) | {result.ingest_seconds:.2f} "
        f"| {ingest_rate:,.0f} | {result.ingest_samples / result.samples * result.gpu_minutes / result.ingest_seconds:,.1f} "
        "| - |",
    ]
    c = result.cold
    lines.append(f"| rollup, 1 worker, first run after ingest (cold; not in the ratios) | {c.seconds:.2f} "
                 f"| {result.samples / c.seconds:,.0f} | {c.gpu_minutes / c.seconds:,.1f} | {_cpu_ms(c)} |")
    for i, r in enumerate(result.runs, start=1):
        lines.append(f"| rollup, {r.workers} worker{'s' if r.workers > 1 else ''} (run {i}) | {r.seconds:.2f} "
                     f"| {result.samples / r.seconds:,.0f} | {r.gpu_minutes / r.seconds:,.1f} | {_cpu_ms(r)} |")
    st = result.steady
    lines.append(f"| steady cycle: the newest batch of each node, 1 worker in-process | {st.seconds:.2f} "
                 f"| {st.batches * result.samples / result.runs[0].batches / st.seconds:,.0f} "
                 f"| {st.gpu_minutes / st.seconds:,.1f} | {_cpu_ms(st)} |")
    lines += [
        "",
        f"- rollup / ingest (samples/s, medians): 1 worker **{result.samples / one / ingest_rate:.2f}x**, "
        f"2 workers **{result.samples / two / ingest_rate:.2f}x** (target: at least 2x)",
        f"- 2 workers / 1 worker: **{one / two:.2f}x** (target: above 1)",
        f"- every run wrote the same ledger (digest of every minute, hour and day row): "
        f"{'yes' if len(result.digests) == 1 else 'NO: ' + ', '.join(sorted(result.digests))}",
    ]
    return "\n".join(lines) + "\n"


LATEST_RUN = "### Latest run (`bench/rollup.py --write-docs`)"


def write_docs(section: str, path: Path = DOCS_FILE) -> None:
    """Replace the latest-run subsection of the rollup section (the analysis above it is written
    by hand), or append the section at the end of the file."""
    text = path.read_text()
    body = section.split("\n", 1)[1].lstrip("\n")  # without the section title
    latest = f"{LATEST_RUN}\n\n{body}"
    if SECTION_TITLE not in text:
        path.write_text(text.rstrip("\n") + f"\n\n{SECTION_TITLE}\n\n{latest}")
        return
    head, rest = text.split(SECTION_TITLE, 1)
    if LATEST_RUN in rest:
        before, after = rest.split(LATEST_RUN, 1)
        ends = [i for i in (after.find("\n## "), after.find("\n### ")) if i >= 0]
        tail = after[min(ends):] if ends else ""
        rest = before + latest.rstrip("\n") + "\n" + tail
    else:
        rest = rest.rstrip("\n") + f"\n\n{latest}"
    path.write_text(head + SECTION_TITLE + rest)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(*args.worker)
    result = run(args)
    section = render(result)
    print(section)
    if args.write_docs:
        write_docs(section)
        log(f"wrote '{SECTION_TITLE}' in {DOCS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
