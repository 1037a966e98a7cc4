"""Fleet-scale benchmark (docs/scaling.md): a synthetic fleet, run faster than real time through
HTTP ingest (gunicorn), the rollup (N worker processes) and a few pages, reported per 1,000 GPUs
in cores, disk and memory, for 1-second samples and coarser metering, with what coarser metering
costs in billing precision.

    python bench/fleet.py [--gpus 200] [--gpus-per-node 8] [--workloads-per-gpu 16] [--minutes 10]
                          [--meter-ms 1000 5000 15000 60000] [--batch-seconds 60] [--agents 4]
                          [--gunicorn-workers 3] [--rollup-workers 1 [2 ...]] [--rollup-batches N]
                          [--parallel-query] [--page-runs 3] [--seed 14] [--db-name NAME] [--keep-db]
                          [--json-out FILE] [--from-json FILE] [--write-docs]

DATABASE_URL and REDIS_URL must be set. Nothing is written to DATABASE_URL's database: the
benchmark builds `<dbname>_fleet` on the same server (migrate, node tokens, a rate card, tenants,
two users, raw partitions), copies it to `<dbname>_fleettpl`, and starts every meter setting from
a fresh copy of that template, so the settings never see each other's rows. Both are dropped at
the end unless --keep-db.

The load. One synthetic fleet: --gpus A100-80GB GPUs on nodes of --gpus-per-node, each GPU shared
by --workloads-per-gpu containers, over the last --minutes minutes (ending two minutes ago, so no
window is in the future). Per workload and second (numpy, seeded, in the agent's 1/1024 units):
a granted share of the card that the allocator re-grants now and then (a new level about every
20 s), use below the grant most of the time, and short bursts above it (about one every two
minutes, 1-5 s, 1.2-1.5 x the grant: what the watchdog's grace period or dry-run enforcement lets
through). Σ granted stays under 0.66 of a card and Σ used under 0.99, so every batch is valid.

Metering. `--meter-ms M` is the agent's own option (agents/__main__.py `run --meter-ms`,
AgentConfig.meter_ms: the width of one usage sample, whole seconds from 1000 to 60000). The same
1-second series is integrated into M/1000-second samples exactly as the agent's meter does:
integrals add, so a coarse sample is the sum of its seconds. Batches are the agent's: one per node
per --batch-seconds window (AgentConfig.batch_seconds, default 60), every GPU of the node in it,
samples ordered by (start, gpu), compact JSON, gzip. Every body is built before timing.

Per meter setting, in order:
1. ingest: gunicorn (config.wsgi, sync workers, the product's gunicorn.conf.py) on loopback;
   --agents client threads post the nodes' batches in time order as fast as answered. CPU of the
   gunicorn tree, this database's Postgres backends (+ auxiliaries) and the client, from /proc.
   Parallel query is off (PGOPTIONS) unless --parallel-query: a parallel worker's CPU cannot be
   attributed to this database and leaves /proc with the worker.
2. rollup: --rollup-workers N processes, each with its own connection, call
   billing.ledger.rollup.rollup_usage(now=..., shard=k, shards=N, max_batches=--rollup-batches),
   as the service's shard tasks do, until nothing of their shard is pending. A call answered
   skipped=True (a node of it was held by another session) sleeps 0.2 s and tries again; such
   calls are counted and reported. Default --rollup-batches: what one
   beat cycle (VGPU_ROLLUP_EVERY_S, 15 s) finds when nodes upload evenly. With several counts
   (--rollup-workers 1 2) the 1-second setting is rolled up once per count, each time from a copy
   of the database taken after ingest; the first count's run is the headline.
3. checks: every batch rolled up, none quarantined; samples accepted x seconds = seconds in the
   minute ledger; per GPU-day Σ charges + idle = card cost; card cost = price x GPU-seconds.
4. disk: pg_total_relation_size (indexes and TOAST included, summed over partitions) of raw
   samples, batches, batch GPUs and the minute, hour and day ledgers, the last five after VACUUM
   FULL (the rollup's rewrites leave dead rows a short run has not vacuumed); WAL from
   pg_current_wal_lsn() around ingest + rollup (cluster-wide: on a shared server it includes other
   databases' writes, so it is an upper bound).
5. memory: the largest RSS of a gunicorn worker and of a rollup worker, and the private memory (USS)
   of this database's Postgres backends, sampled every 0.5 s (psutil); shared_buffers apart.
6. pages: /finance/, /tenants/, the biggest tenant's portal and /invoices/ through Django's test
   client (median of --page-runs after one warm-up).
7. precision: each workload's charge (and billed MB·s, SM·s) from the day ledger, compared with
   the 1-second setting of the same load.

Per 1,000 GPUs: CPU seconds per second of fleet time x 1000 / --gpus (the cores a fleet of 1,000
such GPUs keeps busy); bytes per GPU-day = bytes per row x rows per GPU-day of a steady fleet (a
run of minutes already holds whole hour and day rows, so bytes do not scale with its length); WAL
bytes x 86400 / (GPUs x fleet seconds). A plan table scales it all to PLAN_GPUS GPUs.

A benchmark is not a test: it reports numbers and never fails on speed. It fails (exit 1) when
the ledger does not account for what was sent, because then its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.client
import json
import math
import multiprocessing
import os
import random
import resource
import shlex
import statistics
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import psycopg2

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `python bench/fleet.py` puts bench/, not the repository, on the path

from bench.ingest import (  # noqa: E402 - after the path fix above
    A100,
    API_PATH,
    DOCS_FILE,
    SCHEMA,
    CpuSnapshot,
    CpuUse,
    ServerConfig,
    child_env,
    gunicorn,
    machine_info,
    manage,
    recreate_database,
    setup_django,
    with_database,
    write_docs,
)

SECTION_TITLE = "## Fleet scale"
Q = 1024  # the agent's integrals are multiples of 1/1024 (agents/meter.py QUANTUM)
PRICE_PER_GPU_HOUR = Decimal("2.48")
TENANTS = ("acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "tyrell")
APPS = ("bert", "llama", "resnet", "whisper", "sdxl", "t5", "vit", "gptj")
TIERS = (("gold", "Gold", "1.5"), ("silver", "Silver", "1.0"), ("bronze", "Bronze", "0.7"))
# The synthetic load (see the module docstring); fractions of one card.
GRANTED_FRACTION = 0.55  # Σ of the workloads' base grants on a GPU
REGRANT_EVERY_S = 20  # mean seconds between two grant levels of a workload
REGRANT_RANGE = (0.8, 1.2)  # a grant level, relative to the workload's base share
USE_RANGE = (0.2, 0.95)  # use outside bursts, relative to the grant
BURST_EVERY_S = 120  # mean seconds between two bursts of a workload (memory and SM apart)
BURST_MAX_S = 5
BURST_RANGE = (1.2, 1.5)  # use in a burst, relative to the grant
PCIE_MB_PER_S = 400.0
ROLLUP_EVERY_S = 15  # the beat's default period (config/settings.py VGPU_ROLLUP_EVERY_S)
SKIPPED_RETRY_S = 0.2
SAMPLE_EVERY_S = 0.5
PAGES = (("finance", "/finance/"), ("tenants", "/tenants/"), ("portal", "/tenants/{big}/"),
         ("invoices", "/invoices/"))


# --------------------------------------------------------------------------------------------
# Options


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=200, help="A100-80GB GPUs in the fleet")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--workloads-per-gpu", type=int, default=16, help="containers sharing each GPU")
    p.add_argument("--minutes", type=int, default=10, help="simulated fleet minutes")
    p.add_argument("--meter-ms", type=int, nargs="+", default=[1000, 5000, 15000, 60000],
                   help="sample widths (the agent's --meter-ms); the first must be 1000, the precision baseline")
    p.add_argument("--batch-seconds", type=int, default=60, help="batch window (the agent's --batch-seconds)")
    p.add_argument("--agents", type=int, default=4, help="client threads posting the nodes' batches")
    p.add_argument("--gunicorn-workers", type=int, default=3, help="sync gunicorn workers")
    p.add_argument("--rollup-workers", type=int, nargs="+", default=[1],
                   help="rollup processes calling rollup_usage at once; the first count is the headline, and "
                        "with more counts the 1-second setting's rollup is repeated with each, from a copy of "
                        "the database taken after ingest (one run compares them)")
    p.add_argument("--rollup-batches", type=int, default=0,
                   help="max_batches per rollup_usage call (default: one beat cycle's worth of batches)")
    p.add_argument("--parallel-query", action="store_true",
                   help="let Postgres use parallel workers (their CPU is then missing from the Postgres columns)")
    p.add_argument("--page-runs", type=int, default=3, help="timed runs per page (after one warm-up)")
    p.add_argument("--seed", type=int, default=14)
    p.add_argument("--db-name", default="", help="the bench database (default <dbname>_fleet)")
    p.add_argument("--keep-db", action="store_true", help="keep the last setting's database and the template")
    p.add_argument("--json-out", type=Path, help="write the whole report as JSON")
    p.add_argument("--from-json", type=Path, help="render a report saved with --json-out instead of running")
    p.add_argument("--write-docs", action="store_true",
                   help=f"replace the '{SECTION_TITLE}' section of {DOCS_FILE.relative_to(REPO)}")
    args = p.parse_args(argv)
    for name in ("gpus", "gpus_per_node", "workloads_per_gpu", "minutes", "batch_seconds", "agents",
                 "gunicorn_workers", "page_runs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if min(args.rollup_workers) < 1:
        p.error("--rollup-workers must be >= 1")
    if args.meter_ms[0] != 1000:
        p.error("the first --meter-ms must be 1000: the other settings are compared with it")
    for ms in args.meter_ms:
        # The agent's own rule (agents/loop.py AgentConfig): whole seconds in [1, 60] dividing the batch.
        if ms < 1000 or ms % 1000 or ms > 60_000 or (args.batch_seconds * 1000) % ms:
            p.error(f"--meter-ms {ms}: whole seconds in [1000, 60000] dividing --batch-seconds x 1000")
    if (args.minutes * 60) % args.batch_seconds:
        p.error("--minutes x 60 must be a multiple of --batch-seconds")
    if len(set(args.meter_ms)) != len(args.meter_ms):
        p.error("--meter-ms values must differ")
    return args


@dataclass(frozen=True)
class Shape:
    gpus: int
    gpus_per_node: int
    workloads_per_gpu: int
    seconds: int
    batch_seconds: int

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def windows(self) -> int:
        return self.seconds // self.batch_seconds

    def node_gpus(self, node: int) -> range:
        return range(node * self.gpus_per_node, min(self.gpus, (node + 1) * self.gpus_per_node))


# --------------------------------------------------------------------------------------------
# The synthetic load: one 1-second series per workload, coarsened exactly as the meter would


@dataclass(frozen=True)
class Load:
    """Integrals per (GPU, workload, second) in 1/1024 units (int64 arrays of shape G x W x S)."""

    gpu_uuids: list[str]
    names: list[list[dict[str, str]]]  # [gpu][workload] -> tenant, namespace, pod, container, pod_uid, sla_tier
    mem_used: np.ndarray[Any, np.dtype[np.int64]]
    mem_granted: np.ndarray[Any, np.dtype[np.int64]]
    sm_used: np.ndarray[Any, np.dtype[np.int64]]
    sm_granted: np.ndarray[Any, np.dtype[np.int64]]
    pcie: np.ndarray[Any, np.dtype[np.int64]]

    def coarsened(self, period_s: int) -> dict[str, np.ndarray[Any, np.dtype[np.int64]]]:
        """Each series summed over consecutive `period_s`-second periods (integrals add)."""
        out = {}
        for name in ("mem_used", "mem_granted", "sm_used", "sm_granted", "pcie"):
            a: np.ndarray[Any, np.dtype[np.int64]] = getattr(self, name)
            g, w, s = a.shape
            out[name] = a.reshape(g, w, s // period_s, period_s).sum(axis=3)
        return out


def _piecewise(rng: np.random.Generator, shape: tuple[int, int, int], every_s: float,
               low: float, high: float) -> np.ndarray[Any, np.dtype[np.float64]]:
    """A level per second that changes about every `every_s` seconds, uniform in [low, high)."""
    # Index of each second's level: the number of changes so far (never past the last level).
    segment = np.minimum(np.cumsum(rng.random(shape) < 1 / every_s, axis=2), shape[2] - 1).astype(np.int64)
    levels = rng.uniform(low, high, shape)
    out: np.ndarray[Any, np.dtype[np.float64]] = np.take_along_axis(levels, segment, axis=2)
    return out


def _bursts(rng: np.random.Generator, shape: tuple[int, int, int]) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Seconds inside a burst: starts about every BURST_EVERY_S s, each 1..BURST_MAX_S s long."""
    starts = rng.random(shape) < 1 / BURST_EVERY_S
    lengths = rng.integers(1, BURST_MAX_S + 1, shape)
    inside = starts.copy()
    for d in range(1, BURST_MAX_S):
        inside[..., d:] |= (starts & (lengths > d))[..., :-d]
    return inside


def _use(rng: np.random.Generator, granted: np.ndarray[Any, np.dtype[np.float64]]) -> np.ndarray[Any, np.dtype[np.float64]]:
    below = granted * rng.uniform(*USE_RANGE, granted.shape)
    above = granted * rng.uniform(*BURST_RANGE, granted.shape)
    use: np.ndarray[Any, np.dtype[np.float64]] = np.where(_bursts(rng, granted.shape), above, below)
    return use


def _quanta(values: np.ndarray[Any, np.dtype[np.float64]]) -> np.ndarray[Any, np.dtype[np.int64]]:
    quanta: np.ndarray[Any, np.dtype[np.int64]] = np.floor(values * Q).astype(np.int64)
    return quanta


def make_load(shape: Shape, seed: int) -> Load:
    rng = np.random.default_rng(seed)
    names_rng = random.Random(seed)
    g, w, s = shape.gpus, shape.workloads_per_gpu, shape.seconds
    dims = (g, w, s)
    base = rng.uniform(0.5, 1.0, (g, w))
    base = (base / base.sum(axis=1, keepdims=True) * GRANTED_FRACTION)[..., None]
    granted_mem = base * _piecewise(rng, dims, REGRANT_EVERY_S, *REGRANT_RANGE)
    granted_sm = base * _piecewise(rng, dims, REGRANT_EVERY_S, *REGRANT_RANGE)
    names = []
    for _ in range(g):
        gpu_names = []
        for _ in range(w):
            tenant, app = names_rng.choice(TENANTS), names_rng.choice(APPS)
            gpu_names.append({
                "tenant": tenant, "namespace": f"{tenant}-{names_rng.choice(('prod', 'research'))}",
                "pod": f"{app}-{names_rng.getrandbits(40):010x}", "container": names_rng.choice(("server", "trainer")),
                "pod_uid": str(uuid.UUID(int=names_rng.getrandbits(128))), "sla_tier": names_rng.choice(TIERS)[0],
            })
        names.append(gpu_names)
    mem, sms = float(A100["memory_mb"]), float(A100["sm_count"])
    return Load(
        gpu_uuids=[f"GPU-{uuid.UUID(int=names_rng.getrandbits(128))}" for _ in range(g)],
        names=names,
        mem_used=_quanta(_use(rng, granted_mem) * mem),
        mem_granted=_quanta(granted_mem * mem),
        sm_used=_quanta(_use(rng, granted_sm) * sms),
        sm_granted=_quanta(granted_sm * sms),
        pcie=_quanta(rng.uniform(0.0, PCIE_MB_PER_S, dims)),
    )


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Batch:
    node: int
    seq: int
    samples: int
    body: bytes  # gzip of the compact JSON


def build_batches(load: Load, shape: Shape, *, start: datetime, period_s: int) -> list[list[Batch]]:
    """Per node, its batches in time order, as agents/batch.py renders them."""
    coarse = load.coarsened(period_s)
    per_window = shape.batch_seconds // period_s
    gpu_wire = [{"uuid": u, **A100} for u in load.gpu_uuids]
    out: list[list[Batch]] = []
    for node in range(shape.nodes):
        gpus = shape.node_gpus(node)
        # Python numbers of this node's GPUs only (the whole fleet's would be hundreds of MB of ints).
        series = {k: v[gpus.start:gpus.stop].tolist() for k, v in coarse.items()}
        batches = []
        for window in range(shape.windows):
            w_start = start + timedelta(seconds=window * shape.batch_seconds)
            samples = []
            for k in range(window * per_window, (window + 1) * per_window):
                at = iso(start + timedelta(seconds=k * period_s))
                for i, g in enumerate(gpus):
                    for w, names in enumerate(load.names[g]):
                        samples.append({
                            "start": at, "seconds": period_s, "gpu": load.gpu_uuids[g], **names,
                            "mem_used_mb_s": series["mem_used"][i][w][k] / Q,
                            "mem_granted_mb_s": series["mem_granted"][i][w][k] / Q,
                            "sm_used_s": series["sm_used"][i][w][k] / Q,
                            "sm_granted_s": series["sm_granted"][i][w][k] / Q,
                            "pcie_mb": series["pcie"][i][w][k] / Q,
                        })
            payload = {
                "schema": SCHEMA, "node": node_name(node), "batch_seq": window + 1,
                "window": {"start": iso(w_start), "end": iso(w_start + timedelta(seconds=shape.batch_seconds))},
                "gpus": [gpu_wire[g] for g in gpus], "samples": samples,
            }
            body = gzip.compress(json.dumps(payload, separators=(",", ":"), allow_nan=False).encode(), 6)
            batches.append(Batch(node, window + 1, len(samples), body))
        out.append(batches)
    return out


def node_name(index: int) -> str:
    return f"fleet-node-{index:04d}"


# --------------------------------------------------------------------------------------------
# The template database: reference rows every setting starts from


@dataclass(frozen=True)
class Databases:
    admin_url: str  # the maintenance database of the server
    name: str
    template: str

    @property
    def after_ingest(self) -> str:
        """A copy of `name` taken after ingest, for rollups with other worker counts."""
        return f"{self.name}ing"

    @property
    def url(self) -> str:
        return with_database(self.admin_url, self.name)


def databases(base_url: str, db_name: str) -> Databases:
    import urllib.parse

    name = db_name or (urllib.parse.urlsplit(base_url).path.lstrip("/") or "postgres") + "_fleet"
    return Databases(with_database(base_url, "postgres"), name, f"{name}tpl")


def build_template(dbs: Databases, shape: Shape, days: set[date]) -> tuple[dict[str, str], dict[str, str]]:
    """Migrate `dbs.name`, add the reference rows, copy it to the template. Returns the child
    environment and each node's token."""
    recreate_database(dbs.admin_url, dbs.template, drop_only=True)
    recreate_database(dbs.admin_url, dbs.name)
    env = child_env(dbs.url)
    manage(env, "migrate", "--noinput", "-v", "0")
    setup_django(env)
    from django.contrib.auth.models import Group, User
    from django.db import connections, transaction

    from billing.ledger.partitions import ensure_raw_partitions
    from billing.models import RateCard, SlaTier, Tenant
    from billing.services.identity.tokens import issue_node_token

    now = datetime.now(UTC)
    tiers = {slug: SlaTier.objects.create(slug=slug, name=label, weight=Decimal(w)) for slug, label, w in TIERS}
    for slug in TENANTS:
        Tenant.objects.create(slug=slug, name=slug.title(), default_sla_tier=tiers["silver"],
                              namespaces=[f"{slug}-prod", f"{slug}-research"])
    RateCard.objects.create(gpu_model=str(A100["model"]), currency="USD", price_per_gpu_hour=PRICE_PER_GPU_HOUR,
                            effective_from=now - timedelta(days=400), source_url="https://example.org/bench-prices",
                            source_note="bench/fleet.py")
    tokens = {node_name(n): issue_node_token(node_name=node_name(n), now=now, actor_label="bench/fleet.py").token
              for n in range(shape.nodes)}
    finance = User.objects.create_user("fleet-finance")
    finance.groups.add(Group.objects.get_or_create(name="finance")[0])
    User.objects.create_user("fleet-member")
    with transaction.atomic():
        ensure_raw_partitions(days)
    connections.close_all()
    conn = psycopg2.connect(dbs.admin_url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{dbs.template}" TEMPLATE "{dbs.name}"')
    finally:
        conn.close()
    return env, tokens


def copy_database(dbs: Databases, *, source: str, target: str) -> None:
    """`target` as a copy of `source` (dropped first; Django reconnects on its next query).
    FILE_COPY: a checkpoint and a file copy, instead of WAL-logging every block of the copy."""
    from django.db import connections

    connections.close_all()
    recreate_database(dbs.admin_url, target, drop_only=True)
    conn = psycopg2.connect(dbs.admin_url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{target}" TEMPLATE "{source}" STRATEGY FILE_COPY')
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# Memory: a sampler of the largest RSS / USS seen per process group


class MemorySampler:
    """Every SAMPLE_EVERY_S, the RSS of `pids()` and the USS of this database's Postgres backends."""

    def __init__(self, database: str, pids: Callable[[], list[int]]) -> None:
        self._database, self._pids = database, pids
        self.max_rss: dict[int, int] = {}
        self.max_pg_uss: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_EVERY_S)

    def sample(self) -> None:
        for pid in self._pids():
            with contextlib.suppress(psutil.Error):
                self.max_rss[pid] = max(self.max_rss.get(pid, 0), psutil.Process(pid).memory_info().rss)
        for proc in psutil.process_iter(["cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or ())
            if cmd.startswith("postgres: ") and f" {self._database} " in cmd:
                with contextlib.suppress(psutil.Error):
                    uss = proc.memory_full_info().uss
                    self.max_pg_uss[proc.pid] = max(self.max_pg_uss.get(proc.pid, 0), uss)

    @property
    def pg_uss_total(self) -> int:
        """Σ over backends of each one's peak private memory (an upper bound of the peak of the sum)."""
        return sum(self.max_pg_uss.values())


def _children(pid: int) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    return []


# --------------------------------------------------------------------------------------------
# Phase 1: ingest over HTTP


@dataclass
class PosterResult:
    batches: int = 0
    accepted: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


def _post_all(port: int, work: list[tuple[str, Batch]], result: PosterResult) -> None:
    """One client thread: its nodes' batches, in time order, on one keep-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        for token, batch in work:
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                       "Content-Encoding": "gzip"}
            started = time.perf_counter()
            for attempt in (1, 2):  # a sync worker closes the connection after each response: reconnect once
                try:
                    conn.request("POST", API_PATH, body=batch.body, headers=headers)
                    response = conn.getresponse()
                    status, text = response.status, response.read()
                    break
                except (http.client.HTTPException, ConnectionError):
                    conn.close()
                    if attempt == 2:
                        raise
            result.latencies.append(time.perf_counter() - started)
            if status == 201:
                result.batches += 1
                result.accepted += int(json.loads(text)["accepted"])
            else:
                result.errors.append(f"{batch.node}/{batch.seq}: {status} {text[:300]!r}")
    except Exception as exc:  # noqa: BLE001 - reported with the run; the other threads go on
        result.errors.append(f"client failed: {exc!r}")
    finally:
        conn.close()


def _wait_ready(port: int, timeout_s: float = 60.0) -> None:
    """Until /readyz answers 200: gunicorn binds before its workers have imported Django."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError("gunicorn did not answer /readyz")
        time.sleep(0.2)


@dataclass(frozen=True)
class IngestRun:
    wall_s: float
    batches: int
    accepted: int
    sent: int
    errors: list[str]
    latency_p50_ms: float
    latency_p99_ms: float
    cpu_gunicorn_s: float
    cpu_postgres_s: float
    cpu_client_s: float
    gunicorn_worker_rss_max: int
    postgres_uss_sum: int
    machine_busy_s: float | None = None  # every process on the (shared) machine, from /proc/stat


def ingest(env: dict[str, str], database: str, tokens: dict[str, str], batches: list[list[Batch]],
           args: argparse.Namespace) -> IngestRun:
    work: list[list[tuple[str, Batch]]] = [[] for _ in range(args.agents)]
    for node, node_batches in enumerate(batches):
        work[node % args.agents].extend((tokens[node_name(node)], b) for b in node_batches)
    for items in work:
        items.sort(key=lambda tb: (tb[1].seq, tb[1].node))  # the fleet advances together, window by window
    results = [PosterResult() for _ in work]
    config = ServerConfig("sync", args.gunicorn_workers, 1)
    with gunicorn(env, config) as server:
        _wait_ready(server.port)
        with MemorySampler(database, lambda: _children(server.proc.pid)) as memory:
            threads = [threading.Thread(target=_post_all, args=(server.port, w, r), daemon=True)
                       for w, r in zip(work, results, strict=True)]
            before = CpuSnapshot.take(database, server.proc.pid)
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.perf_counter() - started
            cpu = CpuUse.between(before, CpuSnapshot.take(database, server.proc.pid))
            memory.sample()
    latencies = sorted(x for r in results for x in r.latencies)
    return IngestRun(
        wall_s=wall, batches=sum(r.batches for r in results), accepted=sum(r.accepted for r in results),
        sent=sum(b.samples for node in batches for b in node), errors=[e for r in results for e in r.errors],
        latency_p50_ms=1000 * statistics.median(latencies) if latencies else 0.0,
        latency_p99_ms=1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else 0.0,
        cpu_gunicorn_s=cpu.gunicorn, cpu_postgres_s=cpu.postgres or 0.0, cpu_client_s=cpu.client,
        gunicorn_worker_rss_max=max((v for pid, v in memory.max_rss.items() if pid != server.proc.pid), default=0),
        postgres_uss_sum=memory.pg_uss_total, machine_busy_s=cpu.busy,
    )


# --------------------------------------------------------------------------------------------
# Phase 2: the rollup, N processes


@dataclass(frozen=True)
class WorkerReport:
    cycles: int  # rollup_usage calls that rolled something up
    skipped: int  # calls answered skipped=True (another session held one of the shard's nodes)
    batches: int
    gpu_minutes: int
    quarantined: int
    busy_s: float  # wall time inside calls that were not skipped
    cpu_s: float
    max_rss: int
    error: str = ""


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rollup_worker(env: dict[str, str], shard: tuple[int, int], max_batches: int, start: EventType, finish: EventType,
                  ready: multiprocessing.Queue[int], queue: multiprocessing.Queue[WorkerReport]) -> None:
    """One rollup process: its own Django connection, rolling up its shard (k of N, as the service's
    shard tasks do: the nodes with node_id % N == k) until nothing of it is pending. The connection
    stays open until `finish`: a backend that exits takes its CPU time out of /proc before the
    parent's last snapshot."""
    cycles = skipped = batches = minutes = quarantined = 0
    busy = cpu_at_start = 0.0
    error = ""
    try:
        setup_django(env)
        from django.db import connection

        from billing.ledger.rollup import rollup_usage

        connection.ensure_connection()  # connected before the start, as a long-running worker is
        ready.put(os.getpid())
        start.wait()
        cpu_at_start = _cpu_self()  # Django's start-up is not the rollup's cost
        while True:
            began = time.perf_counter()
            result = rollup_usage(now=datetime.now(UTC), shard=shard[0], shards=shard[1], max_batches=max_batches)
            # A call can roll some nodes up and find others held (skipped): count what it did.
            if result.batches or result.quarantined:
                busy += time.perf_counter() - began
                cycles, batches = cycles + 1, batches + result.batches
                minutes, quarantined = minutes + result.gpu_minutes, quarantined + result.quarantined
            if result.skipped:
                skipped += 1
                time.sleep(SKIPPED_RETRY_S)
                continue
            if result.batches == 0 and result.quarantined == 0:
                break
    except Exception as exc:  # noqa: BLE001 - reported by the parent, which fails the run
        error = f"{type(exc).__name__}: {exc}"
        ready.put(os.getpid())
    queue.put(WorkerReport(cycles, skipped, batches, minutes, quarantined, busy, _cpu_self() - cpu_at_start,
                           resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, error))
    finish.wait(timeout=600)


@dataclass(frozen=True)
class RollupRun:
    wall_s: float
    workers: list[WorkerReport]
    cpu_workers_s: float
    cpu_postgres_s: float
    postgres_uss_sum: int
    max_batches: int
    machine_busy_s: float | None = None  # every process on the (shared) machine, from /proc/stat


def rollup(env: dict[str, str], database: str, workers: int, max_batches: int) -> RollupRun:
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no Django state or sockets inherited
    start, finish = ctx.Event(), ctx.Event()
    ready: multiprocessing.Queue[int] = ctx.Queue()
    queue: multiprocessing.Queue[WorkerReport] = ctx.Queue()
    procs = [ctx.Process(target=rollup_worker, args=(env, (k, workers), max_batches, start, finish, ready, queue))
             for k in range(workers)]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=300)  # every worker connected: the clock starts with all of them able to work
    with MemorySampler(database, lambda: [p.pid for p in procs if p.pid]) as memory:
        before = CpuSnapshot.take(database)
        started = time.perf_counter()
        start.set()
        reports = [queue.get(timeout=3600) for _ in procs]
        wall = time.perf_counter() - started
        cpu = CpuUse.between(before, CpuSnapshot.take(database))
    finish.set()
    for proc in procs:
        proc.join()
    return RollupRun(wall, reports, sum(r.cpu_s for r in reports), cpu.postgres or 0.0, memory.pg_uss_total,
                     max_batches, cpu.busy)


# --------------------------------------------------------------------------------------------
# Checks, disk and precision: ledger reads through the ORM (models looked up by name, so this
# keeps working wherever billing.ledger keeps them) and catalog sizes


def _model(name: str) -> Any:
    from django.apps import apps

    return apps.get_model("billing", name)


LEDGER_MODELS = ("UsageBatch", "BatchGpu", "UsageMinute", "GpuMinute", "UsageHour", "GpuHour", "UsageDay", "GpuDay")


@dataclass(frozen=True)
class Accounting:
    pending_batches: int
    quarantined_batches: int
    seconds_in_minutes: Decimal  # Σ usage-minute seconds
    seconds_in_days: Decimal
    card_cost: Decimal
    charges: Decimal
    idle: Decimal
    gpu_seconds: Decimal
    expected_card_cost: Decimal
    charges_in_minutes: Decimal


def accounting(price_per_gpu_hour: Decimal) -> Accounting:
    from django.db.models import Sum

    batch = _model("UsageBatch").objects
    usage_day = _model("UsageDay").objects.aggregate(s=Sum("seconds"), c=Sum("charge"))
    gpu_day = _model("GpuDay").objects.aggregate(cost=Sum("card_cost"), idle=Sum("idle_cost"),
                                                 secs=Sum("metered_seconds"))
    minutes = _model("UsageMinute").objects.aggregate(s=Sum("seconds"), c=Sum("charge"))
    gpu_seconds = Decimal(gpu_day["secs"] or 0)
    return Accounting(
        pending_batches=batch.filter(rolled_up_at__isnull=True, quarantined_at__isnull=True).count(),
        quarantined_batches=batch.filter(quarantined_at__isnull=False).count(),
        seconds_in_minutes=Decimal(minutes["s"] or 0), seconds_in_days=Decimal(usage_day["s"] or 0),
        card_cost=Decimal(gpu_day["cost"] or 0), charges=Decimal(usage_day["c"] or 0), idle=Decimal(gpu_day["idle"] or 0),
        gpu_seconds=gpu_seconds, expected_card_cost=price_per_gpu_hour * gpu_seconds / 3600,
        charges_in_minutes=Decimal(minutes["c"] or 0),
    )


def check(acc: Accounting, run: IngestRun, period_s: int, shape: Shape) -> list[str]:
    """What must hold for the numbers to mean anything (every item a failure)."""
    tolerance = Decimal("1e-6")  # money: ledger rows carry 12 decimals, sums over ~10^5 rows
    problems = []
    if run.errors:
        problems.append(f"{len(run.errors)} batches not stored, e.g. {run.errors[0]}")
    if run.accepted != run.sent:
        problems.append(f"samples sent {run.sent:,} != accepted {run.accepted:,}")
    if acc.pending_batches or acc.quarantined_batches:
        problems.append(f"{acc.pending_batches} batches pending, {acc.quarantined_batches} quarantined")
    for label, seconds in (("minute", acc.seconds_in_minutes), ("day", acc.seconds_in_days)):
        if seconds != run.accepted * period_s:
            problems.append(f"{label} ledger holds {seconds} workload-seconds, accepted {run.accepted * period_s}")
    if acc.gpu_seconds != shape.gpus * shape.seconds:
        problems.append(f"GPU-seconds metered {acc.gpu_seconds} != {shape.gpus * shape.seconds}")
    if abs(acc.charges + acc.idle - acc.card_cost) > tolerance:
        problems.append(f"charges {acc.charges} + idle {acc.idle} != card cost {acc.card_cost}")
    if abs(acc.card_cost - acc.expected_card_cost) > tolerance:
        problems.append(f"card cost {acc.card_cost} != price x GPU-seconds {acc.expected_card_cost}")
    if abs(acc.charges_in_minutes - acc.charges) > tolerance:
        problems.append(f"minute charges {acc.charges_in_minutes} != day charges {acc.charges}")
    return problems


def table_bytes(database_url: str) -> dict[str, int]:
    """Bytes on disk (heap, indexes, TOAST; every partition) of each ledger table."""
    from billing.ledger.partitions import RAW_TABLE

    tables = {"raw samples": RAW_TABLE, **{m: _model(m)._meta.db_table for m in LEDGER_MODELS}}
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            out = {}
            for label, table in tables.items():
                # A partitioned parent has no storage of its own: sum its leaves (pg_partition_tree lists
                # nothing for a plain table).
                cur.execute("SELECT CASE WHEN c.relkind = 'p' THEN (SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0) "
                            "FROM pg_partition_tree(c.oid) t WHERE t.isleaf) ELSE pg_total_relation_size(c.oid) END "
                            "FROM pg_class c WHERE c.oid = %s::regclass", [table])
                out[label] = int(cur.fetchone()[0])
            return out
    finally:
        conn.close()


def vacuum_full(database_url: str) -> None:
    """Rewrite the batch, minute, hour and day tables compactly (not the raw samples: written once,
    never updated). Every rollup cycle deletes and rewrites the hour and day rows of each GPU it
    touches, and in a run of minutes autovacuum has not reclaimed those dead rows: measured before,
    they inflate the bytes per row of a short run far beyond a steady fleet's."""
    conn = psycopg2.connect(database_url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            for m in LEDGER_MODELS:
                cur.execute(f'VACUUM FULL "{_model(m)._meta.db_table}"')
    finally:
        conn.close()


def table_rows(samples: int) -> dict[str, int]:
    """Rows of each ledger table (raw samples: the samples accepted, every one a row)."""
    return {"raw samples": samples, **{m: int(_model(m).objects.count()) for m in LEDGER_MODELS}}


def rows_per_gpu_day(shape: dict[str, int], meter_ms: int) -> dict[str, float]:
    """Rows each table gains per GPU and day in a steady fleet (the same workloads all day): the
    minute, hour and day ledgers have one row per window, however short the run was."""
    w, per_node = shape["workloads_per_gpu"], shape["gpus_per_node"]
    batches = 86400 / shape["batch_seconds"]
    return {"raw samples": 86400 / (meter_ms / 1000) * w, "UsageBatch": batches / per_node, "BatchGpu": batches,
            "UsageMinute": 1440.0 * w, "GpuMinute": 1440.0, "UsageHour": 24.0 * w, "GpuHour": 24.0,
            "UsageDay": float(w), "GpuDay": 1.0}


def wal_lsn(database_url: str) -> int:
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")
            return int(cur.fetchone()[0])
    finally:
        conn.close()


WorkloadKey = tuple[str, str]  # (gpu_uuid, pod_uid)


def per_workload() -> dict[WorkloadKey, tuple[Decimal, Decimal, Decimal]]:
    """(charge, billed MB·s, billed SM·s) of every workload over the run, from the day ledger."""
    from django.db.models import Sum

    rows = (_model("UsageDay").objects.values("gpu_uuid", "pod_uid").order_by()
            .annotate(c=Sum("charge"), m=Sum("mem_billed_mb_s"), s=Sum("sm_billed_s")))
    return {(r["gpu_uuid"], r["pod_uid"]): (r["c"], r["m"], r["s"]) for r in rows}


@dataclass(frozen=True)
class Precision:
    """Relative difference to the 1-second setting, per workload (coarse - fine) / fine."""

    total_charge: str  # Decimal as text
    total_charge_rel: float
    charge_rel_mean: float
    charge_rel_max_abs: float
    mem_billed_rel_mean: float
    sm_billed_rel_mean: float
    workloads: int


def precision(fine: dict[WorkloadKey, tuple[Decimal, Decimal, Decimal]],
              coarse: dict[WorkloadKey, tuple[Decimal, Decimal, Decimal]]) -> Precision:
    if set(fine) != set(coarse):
        raise RuntimeError(f"workloads differ between settings: {len(set(fine) ^ set(coarse))} keys")

    def rel(i: int) -> list[float]:
        return [float((coarse[k][i] - fine[k][i]) / fine[k][i]) for k in fine if fine[k][i]]

    charges = rel(0)
    total_fine, total_coarse = sum(v[0] for v in fine.values()), sum(v[0] for v in coarse.values())
    return Precision(
        total_charge=str(total_coarse), total_charge_rel=float((total_coarse - total_fine) / total_fine),
        charge_rel_mean=statistics.mean(charges), charge_rel_max_abs=max(abs(x) for x in charges),
        mem_billed_rel_mean=statistics.mean(rel(1)), sm_billed_rel_mean=statistics.mean(rel(2)),
        workloads=len(fine),
    )


# --------------------------------------------------------------------------------------------
# Pages


def time_pages(runs: int) -> dict[str, float]:
    """Median seconds of each page, logged in as finance (the portal: as a member of the biggest tenant)."""
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.db.models import Count
    from django.test import Client

    from billing.models import Tenant, TenantMembership

    warnings.filterwarnings("ignore", message="No directory at")  # no collectstatic for a benchmark
    if "testserver" not in settings.ALLOWED_HOSTS:
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    big = (_model("UsageDay").objects.values("tenant").order_by().annotate(n=Count("id")).order_by("-n")
           .values_list("tenant", flat=True).first()) or TENANTS[0]
    member = User.objects.get(username="fleet-member")
    TenantMembership.objects.get_or_create(user=member, tenant=Tenant.objects.get(slug=big))
    finance, portal = Client(), Client()
    finance.force_login(User.objects.get(username="fleet-finance"))
    portal.force_login(member)
    out = {}
    for key, path in PAGES:
        client, url = (portal if key == "portal" else finance), path.format(big=big)

        def get(client: Any = client, url: str = url) -> bytes:
            response = client.get(url)
            if response.status_code != 200:
                raise RuntimeError(f"GET {url}: HTTP {response.status_code}")
            return bytes(response.content)

        get()  # warm-up: the first request of a page imports its views and compiles its templates
        times = []
        for _ in range(runs):
            began = time.perf_counter()
            get()
            times.append(time.perf_counter() - began)
        out[key] = statistics.median(times)
        log(f"  page {url}: median {1000 * out[key]:,.0f} ms of {runs}")
    return out


# --------------------------------------------------------------------------------------------
# One meter setting, and the report


@dataclass(frozen=True)
class Setting:
    meter_ms: int
    samples: int
    batches: int
    body_bytes: int
    ingest: IngestRun
    rollup: RollupRun
    accounting: dict[str, str]
    problems: list[str]
    table_bytes: dict[str, int]  # after VACUUM FULL of every table but the raw samples
    table_rows: dict[str, int]
    wal_bytes: int
    pages_s: dict[str, float]
    precision: Precision | None = None
    table_bytes_before_vacuum: dict[str, int] = field(default_factory=dict)
    # The same ingested rows rolled up again with each further --rollup-workers count (1-second setting).
    rollup_scaling: list[RollupRun] = field(default_factory=list)


def run_setting(env: dict[str, str], dbs: Databases, tokens: dict[str, str], load: Load, shape: Shape,
                start: datetime, meter_ms: int, args: argparse.Namespace) -> tuple[Setting, dict[WorkloadKey, Any]]:
    period_s = meter_ms // 1000
    log(f"meter {meter_ms} ms: building batches")
    batches = build_batches(load, shape, start=start, period_s=period_s)
    wal_before = wal_lsn(dbs.url)
    log(f"meter {meter_ms} ms: ingest, {sum(len(b) for b in batches):,} batches over HTTP")
    run = ingest(env, dbs.name, tokens, batches, args)
    ingest_wal = wal_lsn(dbs.url) - wal_before
    log(f"  {run.accepted:,} samples in {run.wall_s:.1f} s ({run.accepted / run.wall_s:,.0f}/s), "
        f"{len(run.errors)} errors")
    max_batches = args.rollup_batches or max(1, math.ceil(shape.nodes * ROLLUP_EVERY_S / shape.batch_seconds))
    counts = args.rollup_workers if meter_ms == 1000 else args.rollup_workers[:1]
    if len(counts) > 1:
        copy_database(dbs, source=dbs.name, target=dbs.after_ingest)
    runs: list[RollupRun] = []
    problems: list[str] = []
    for i, workers in enumerate(reversed(counts)):  # the headline count last: its database is the one kept
        if i:
            copy_database(dbs, source=dbs.after_ingest, target=dbs.name)
        wal_start = wal_lsn(dbs.url)
        log(f"meter {meter_ms} ms: rollup, {workers} worker(s), max_batches={max_batches}")
        rolled = rollup(env, dbs.name, workers, max_batches)
        log(f"  {rolled.wall_s:.1f} s; " + "; ".join(
            f"worker {n}: {w.cycles} cycles, {w.skipped} skipped, {w.batches} batches{' ' + w.error if w.error else ''}"
            for n, w in enumerate(rolled.workers)))
        acc = accounting(PRICE_PER_GPU_HOUR)
        problems += [f"{workers} rollup worker(s): {p}" for p in check(acc, run, period_s, shape)]
        problems += [f"rollup worker: {w.error}" for w in rolled.workers if w.error]
        runs.insert(0, rolled)
    if len(counts) > 1:
        recreate_database(dbs.admin_url, dbs.after_ingest, drop_only=True)
    # WAL of ingest and of the headline rollup (the repeated rollups' own WAL is left out).
    wal = wal_lsn(dbs.url) - wal_start + ingest_wal
    sizes_before = table_bytes(dbs.url)
    vacuum_full(dbs.url)
    sizes = table_bytes(dbs.url)
    log(f"meter {meter_ms} ms: pages")
    pages = time_pages(args.page_runs)
    setting = Setting(meter_ms, run.accepted, run.batches, sum(len(b.body) for node in batches for b in node), run,
                      runs[0], {k: str(v) for k, v in asdict(acc).items()}, problems, sizes,
                      table_rows(run.accepted), wal, pages,
                      rollup_scaling=runs[1:], table_bytes_before_vacuum=sizes_before)
    return setting, per_workload()


@dataclass(frozen=True)
class Report:
    command: str
    started: str
    machine: dict[str, str]
    shape: dict[str, int]
    rollup_workers: list[int]
    settings: list[Setting]

    @property
    def problems(self) -> list[str]:
        return [f"meter {s.meter_ms} ms: {p}" for s in self.settings for p in s.problems]


def log(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", flush=True)


def run(args: argparse.Namespace, argv: list[str]) -> Report:
    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url or not os.environ.get("REDIS_URL"):
        raise SystemExit("DATABASE_URL and REDIS_URL must be set (or run under python -m config.embedded --)")
    started = datetime.now(UTC)
    shape = Shape(args.gpus, args.gpus_per_node, args.workloads_per_gpu, args.minutes * 60, args.batch_seconds)
    end = started.replace(second=0, microsecond=0) - timedelta(minutes=2)
    start = end - timedelta(seconds=shape.seconds)
    dbs = databases(base_url, args.db_name)
    log(f"load: {shape.gpus} GPUs x {shape.workloads_per_gpu} workloads x {shape.seconds} s")
    load = make_load(shape, args.seed)
    log(f"database {dbs.name}: migrate, reference rows, template {dbs.template}")
    if not args.parallel_query:
        # Every CPU second of the ledger's queries in a backend of this database, where /proc can
        # attribute it: a parallel worker is named after its leader's PID, not the database, and
        # exits (taking its CPU time with it) before the next snapshot. libpq reads PGOPTIONS, so
        # gunicorn, the rollup workers and this process all connect with it.
        os.environ["PGOPTIONS"] = (os.environ.get("PGOPTIONS", "") + " -c max_parallel_workers_per_gather=0").strip()
    env, tokens = build_template(dbs, shape, {start.date(), end.date()})
    settings: list[Setting] = []
    fine: dict[WorkloadKey, Any] = {}
    try:
        for i, meter_ms in enumerate(args.meter_ms):
            if i:
                copy_database(dbs, source=dbs.template, target=dbs.name)
            setting, workloads = run_setting(env, dbs, tokens, load, shape, start, meter_ms, args)
            if i == 0:
                fine = workloads
            else:
                setting = replace(setting, precision=precision(fine, workloads))
            settings.append(setting)
            for problem in setting.problems:
                log(f"  PROBLEM: {problem}")
        machine = machine_info(dbs.url)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            recreate_database(dbs.admin_url, dbs.name, drop_only=True)
            recreate_database(dbs.admin_url, dbs.template, drop_only=True)
    return Report("python bench/fleet.py" + (" " + shlex.join(argv) if argv else ""), f"{started:%Y-%m-%d %H:%M} UTC",
                  machine, asdict(shape), args.rollup_workers, settings)


# --------------------------------------------------------------------------------------------
# Rendering: per 1,000 GPUs


def per_1000(report: Report, value: float) -> float:
    """A rate measured on this fleet, scaled to 1,000 GPUs."""
    return value * 1000 / report.shape["gpus"]


def fleet_seconds(report: Report) -> int:
    return report.shape["seconds"]


def gpu_days(report: Report) -> float:
    return report.shape["gpus"] * report.shape["seconds"] / 86400


def cores(report: Report, cpu_s: float) -> float:
    """CPU seconds per second of fleet time, per 1,000 GPUs."""
    return per_1000(report, cpu_s / fleet_seconds(report))


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f}"


def _gb_day(report: Report, n: int) -> float:
    """GB per day for 1,000 GPUs from bytes measured on this run."""
    return n / gpu_days(report) * 1000 / 1e9


def speed_table(report: Report) -> str:
    rows = ["| meter | samples | batches | gzip MiB | ingest s | samples/s | x real time | rollup s | samples/s "
            "| x real time | rollup ÷ ingest rate | rollup cycles (skipped) per worker |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for s in report.settings:
        cycles = ", ".join(f"{w.cycles} ({w.skipped})" for w in s.rollup.workers)
        rows.append(f"| {s.meter_ms} ms | {s.samples:,} | {s.batches:,} | {_mib(s.body_bytes)} | {s.ingest.wall_s:.1f} "
                    f"| {s.samples / s.ingest.wall_s:,.0f} | {fleet_seconds(report) / s.ingest.wall_s:.1f} "
                    f"| {s.rollup.wall_s:.1f} | {s.samples / s.rollup.wall_s:,.0f} "
                    f"| {fleet_seconds(report) / s.rollup.wall_s:.1f} | {s.ingest.wall_s / s.rollup.wall_s:.2f} "
                    f"| {cycles} |")
    return "\n".join(rows)


def scaling_table(report: Report) -> str:
    """The 1-second setting's rows rolled up with each --rollup-workers count ("" with one count)."""
    s = report.settings[0]
    if not s.rollup_scaling:
        return ""
    rows = ["| rollup workers | wall s | samples/s | vs first | per worker: cycles (skipped), batches "
            "| CPU s, workers | CPU s, Postgres |", "|---:|---:|---:|---:|---|---:|---:|"]
    for r in (s.rollup, *s.rollup_scaling):
        workers = "; ".join(f"{w.cycles} ({w.skipped}), {w.batches}" for w in r.workers)
        rows.append(f"| {len(r.workers)} | {r.wall_s:.1f} | {s.samples / r.wall_s:,.0f} | "
                    f"{s.rollup.wall_s / r.wall_s:.2f} | {workers} | {r.cpu_workers_s:.1f} | {r.cpu_postgres_s:.1f} |")
    return "\n".join(rows)


def cores_table(report: Report) -> str:
    rows = ["| meter | web/ingest (gunicorn) | Postgres, ingest | rollup workers | Postgres, rollup | **service total** "
            "| bench client (not the service) | busy cores while ingest / rollup ran (whole shared machine) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in report.settings:
        parts = [s.ingest.cpu_gunicorn_s, s.ingest.cpu_postgres_s, s.rollup.cpu_workers_s, s.rollup.cpu_postgres_s]
        busy = " / ".join("n/a" if b is None else f"{b / wall:.2f}"
                          for b, wall in ((s.ingest.machine_busy_s, s.ingest.wall_s),
                                          (s.rollup.machine_busy_s, s.rollup.wall_s)))
        rows.append(f"| {s.meter_ms} ms | " + " | ".join(f"{cores(report, x):.2f}" for x in parts)
                    + f" | **{cores(report, sum(parts)):.2f}** | {cores(report, s.ingest.cpu_client_s):.2f} | {busy} |")
    return "\n".join(rows)


DISK_ROWS = (("raw samples", ("raw samples",)), ("batches + batch GPUs", ("UsageBatch", "BatchGpu")),
             ("minute ledger", ("UsageMinute", "GpuMinute")), ("hour ledger", ("UsageHour", "GpuHour")),
             ("day ledger", ("UsageDay", "GpuDay")))


def bytes_per_gpu_day(report: Report, s: Setting, table: str) -> float:
    """Bytes per row measured in this run x rows per GPU-day in a steady fleet."""
    rows = s.table_rows[table]
    return s.table_bytes[table] / rows * rows_per_gpu_day(report.shape, s.meter_ms)[table] if rows else 0.0


def disk_table(report: Report) -> str:
    head = " | ".join(f"{s.meter_ms} ms" for s in report.settings)
    rows = [f"| table (heap + indexes + TOAST) | bytes per row, {report.settings[0].meter_ms} ms | before VACUUM FULL "
            f"| bytes per GPU-day: {head} | GB/day per 1,000 GPUs: {head} |",
            "|---|---:|---:|" + "---:|" * (2 * len(report.settings))]
    first = report.settings[0]
    for label, names in (*DISK_ROWS, ("**all ledger tables**", tuple(n for _, ns in DISK_ROWS for n in ns))):
        per_day = [sum(bytes_per_gpu_day(report, s, n) for n in names) for s in report.settings]
        n_rows = sum(first.table_rows[n] for n in names)
        per_row = f"{sum(first.table_bytes[n] for n in names) / n_rows:,.0f}" if n_rows and len(names) < 3 else "-"
        before = sum(first.table_bytes_before_vacuum.get(n, 0) for n in names)
        bloat = f"x {before / sum(first.table_bytes[n] for n in names):.1f}" if before and len(names) < 3 else "-"
        rows.append(f"| {label} | {per_row} | {bloat} | " + " | ".join(f"{b:,.0f}" for b in per_day) + " | "
                    + " | ".join(f"{b * 1000 / 1e9:,.2f}" for b in per_day) + " |")
    wal = [s.wal_bytes for s in report.settings]
    rows.append("| WAL written, ingest + rollup (cluster-wide, upper bound) | - | - | "
                + " | ".join(f"{b / gpu_days(report):,.0f}" for b in wal) + " | "
                + " | ".join(f"{_gb_day(report, b):,.2f}" for b in wal) + " |")
    return "\n".join(rows)


def memory_table(report: Report) -> str:
    rows = ["| meter | gunicorn worker RSS, max MiB | rollup worker RSS, max MiB | Postgres backends USS, Σ MiB "
            "(ingest / rollup) |", "|---|---:|---:|---:|"]
    rows.extend(f"| {s.meter_ms} ms | {_mib(s.ingest.gunicorn_worker_rss_max)} "
                f"| {_mib(max(w.max_rss for w in s.rollup.workers))} "
                f"| {_mib(s.ingest.postgres_uss_sum)} / {_mib(s.rollup.postgres_uss_sum)} |"
                for s in report.settings)
    return "\n".join(rows)


def precision_table(report: Report) -> str:
    rows = ["| meter | total charged, USD | total vs 1 s | per workload: mean | max abs | billed MB·s, mean "
            "| billed SM·s, mean |", "|---|---:|---:|---:|---:|---:|---:|"]
    first = report.settings[0]
    rows.append(f"| {first.meter_ms} ms | {Decimal(first.accounting['charges']):.2f} | - | - | - | - | - |")
    for s in report.settings[1:]:
        p = s.precision
        assert p is not None
        rows.append(f"| {s.meter_ms} ms | {Decimal(p.total_charge):.2f} | {p.total_charge_rel:+.3%} "
                    f"| {p.charge_rel_mean:+.3%} | {p.charge_rel_max_abs:.3%} | {p.mem_billed_rel_mean:+.3%} "
                    f"| {p.sm_billed_rel_mean:+.3%} |")
    return "\n".join(rows)


def pages_table(report: Report) -> str:
    head = " | ".join(p for p, _ in PAGES)
    rows = [f"| meter | {head} |", "|---|" + "---:|" * len(PAGES)]
    rows.extend(f"| {s.meter_ms} ms | " + " | ".join(f"{1000 * s.pages_s[k]:,.0f} ms" for k, _ in PAGES) + " |"
                for s in report.settings)
    return "\n".join(rows)


# Retention held by the plan (docs/scaling.md), the shipped defaults (docs/operations.md, "Retention
# and disk"): raw samples for the late-usage horizon (45 days) plus the 2-day margin, the minute
# ledger 100 days. Batches, their GPUs, hours and days are kept: the plan counts one year of them.
PLAN_GPUS = 10_000
PLAN_UTILISATION = 0.5  # cores planned at half busy: headroom for peaks and for catching up a backlog
PLAN_DAYS = {"raw samples": 47, "UsageBatch": 365, "BatchGpu": 365, "UsageMinute": 100, "GpuMinute": 100,
             "UsageHour": 365, "GpuHour": 365, "UsageDay": 365, "GpuDay": 365}


def plan_table(report: Report) -> str:
    """What PLAN_GPUS GPUs with this run's workloads per GPU need, from this run's per-1,000 figures."""
    scale = PLAN_GPUS / 1000
    rows = [f"| meter | cores at {PLAN_UTILISATION:.0%} busy: web/ingest + Postgres + rollup = total | ledger GB/day "
            "| WAL GB/day | disk held, TB (raw 47 d, minutes 100 d, batches/hours/days 1 year) | RAM: gunicorn + rollup workers, GiB |",
            "|---|---|---:|---:|---:|---:|"]
    for s in report.settings:
        web = cores(report, s.ingest.cpu_gunicorn_s) * scale / PLAN_UTILISATION
        pg = cores(report, s.ingest.cpu_postgres_s + s.rollup.cpu_postgres_s) * scale / PLAN_UTILISATION
        roll = cores(report, s.rollup.cpu_workers_s) * scale / PLAN_UTILISATION
        per_day = {t: bytes_per_gpu_day(report, s, t) * PLAN_GPUS for t in PLAN_DAYS}
        held = sum(per_day[t] * days for t, days in PLAN_DAYS.items())
        # One sync gunicorn worker or rollup process uses at most one core: a process per planned core.
        ram = (math.ceil(web) * s.ingest.gunicorn_worker_rss_max
               + math.ceil(roll) * max(w.max_rss for w in s.rollup.workers)) / 2**30
        rows.append(f"| {s.meter_ms} ms | {web:.1f} + {pg:.1f} + {roll:.1f} = **{web + pg + roll:.1f}** "
                    f"| {sum(per_day.values()) / 1e9:,.0f} | {_gb_day(report, s.wal_bytes) * scale:,.0f} "
                    f"| {held / 1e12:,.1f} | {ram:,.1f} |")
    return "\n".join(rows)


def tables(report: Report) -> str:
    scaling = scaling_table(report)
    if scaling:
        scaling = (f"\n\nThe 1-second setting's rollup with each worker count, every one from a copy of the "
                   f"database taken after ingest (max_batches={report.settings[0].rollup.max_batches} per call; a "
                   f"call answered skipped=True waits {SKIPPED_RETRY_S} s):\n\n{scaling}")
    return (f"Speed (fleet time is {fleet_seconds(report)} s; \"x real time\" is fleet seconds per wall second):\n\n"
            f"{speed_table(report)}\n\nCores per 1,000 GPUs (CPU seconds per second of fleet time, scaled from "
            f"{report.shape['gpus']} GPUs):\n\n{cores_table(report)}\n\nDisk per GPU-day and per 1,000 GPUs a day: "
            f"bytes per row (pg_total_relation_size / rows after the run) x rows per GPU-day of a steady fleet "
            f"(raw: 86400 / meter s x workloads; minute, hour, day ledgers: one row per workload and window; "
            f"batch GPUs: one per batch window), all but the raw samples measured after VACUUM FULL (\"before\": the size "
            f"the run left, dead rows of the rollup's rewrites included); WAL scaled by GPU-days:\n\n{disk_table(report)}\n\nMemory (peaks sampled "
            f"every {SAMPLE_EVERY_S} s; Postgres' shared_buffers come on top):\n\n{memory_table(report)}\n\n"
            f"Billing precision against 1-second samples of the same load (charges per workload from the day "
            f"ledger; negative = billed less):\n\n{precision_table(report)}{scaling}\n\n"
            f"{PLAN_GPUS:,} GPUs x {report.shape['workloads_per_gpu']} workloads, scaled from this run (linear in "
            f"GPUs; retention as assumed in bench/fleet.py PLAN_DAYS; Postgres' own RAM is planned in "
            f"docs/scaling.md):\n\n{plan_table(report)}\n\nPages after the run (median of the "
            f"timed runs; {fleet_seconds(report) // 60} minutes of data, so they say little about "
            f"pages at a month's scale: bench/web_pages.py measures that):\n\n{pages_table(report)}")


def render_section(report: Report) -> str:
    machine = "\n".join(f"- {k}: {v}" for k, v in report.machine.items())
    sh = report.shape
    problems = ("failed:\n\n" + "\n".join(f"- {p}" for p in report.problems) if report.problems else
                "all passed: every sample sent is in the ledger, every batch rolled up, and per GPU-day "
                "charges + idle = card cost = price x GPU-seconds.")
    return f"""{SECTION_TITLE}

Measured {report.started} with

```
{report.command}
```

on a shared, noisy machine (other engineers' tests and benchmarks ran on the same cores and the
same Postgres server during the run; compare ratios within the run):

{machine}

Fleet: {sh['gpus']} A100-80GB GPUs on {-(-sh['gpus'] // sh['gpus_per_node'])} nodes of {sh['gpus_per_node']},
{sh['workloads_per_gpu']} workloads per GPU, {sh['seconds'] // 60} simulated minutes, one batch per node
per {sh['batch_seconds']} s; {report.rollup_workers[0]} rollup worker process(es) in the headline rows. The load and what each
column means: `bench/fleet.py`'s docstring and `bench/README.md`; what the numbers mean for
10,000 GPUs, and the design for a distributed Postgres: `docs/scaling.md`.

Checks: {problems}

{tables(report)}
"""


def print_report(report: Report) -> None:
    print()
    print(tables(report))
    for problem in report.problems:
        print(f"PROBLEM: {problem}")


def report_from_json(data: dict[str, Any]) -> Report:
    """A report saved with --json-out, to render again (--from-json) without running again."""

    def rollup_run(r: dict[str, Any]) -> RollupRun:
        return RollupRun(**{**r, "workers": [WorkerReport(**w) for w in r["workers"]]})

    settings = [Setting(**{**s, "ingest": IngestRun(**s["ingest"]), "rollup": rollup_run(s["rollup"]),
                           "precision": Precision(**s["precision"]) if s["precision"] else None,
                           "rollup_scaling": [rollup_run(r) for r in s["rollup_scaling"]]})
                for s in data["settings"]]
    return Report(data["command"], data["started"], data["machine"], data["shape"], data["rollup_workers"], settings)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    report = report_from_json(json.loads(args.from_json.read_text())) if args.from_json else run(args, argv)
    print_report(report)
    if args.json_out:
        args.json_out.write_text(json.dumps(asdict(report) | {"problems": report.problems}, indent=1, default=str))
    if args.write_docs:
        write_docs(render_section(report), SECTION_TITLE)
        log(f"wrote the '{SECTION_TITLE}' section of {DOCS_FILE}")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
