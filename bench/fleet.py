"""Fleet-scale benchmark (docs/scaling.md): a synthetic fleet, sending what agents send, through
HTTP ingest (gunicorn), the rollup (N worker processes) and a few pages, reported per 1,000 GPUs
in cores, disk and memory, and as wall seconds per fleet minute (the steady state); optionally
with coarser metering and what it costs in billing precision.

    python bench/fleet.py [--gpus 200] [--gpus-per-node 8] [--workloads-per-gpu 16] [--minutes 10]
                          [--meter-ms 1000 [5000 ...]] [--wire v2|v1] [--batch-seconds 60] [--agents 4]
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

Each node's series are drawn on their own, seeded by (--seed, node), so a fleet of any size is built
one node at a time.

Metering and the wire. `--meter-ms M` is the agent's own option (agents/__main__.py `run
--meter-ms`, AgentConfig.meter_ms: the width of one usage sample, whole seconds from 1000 to
60000). The 1-second series is integrated into M/1000-second samples exactly as the agent's meter
does: integrals add, so a coarse sample is the sum of its seconds. Batches are the agent's: one
per node per --batch-seconds window (AgentConfig.batch_seconds, default 60), every GPU of the node
in it, rendered by the agent's own agents.batch.render_batch from agents.batch.Sample objects and
gzipped as its spool does. `--wire` is the agent's option too: v2 (its default, docs/protocol.md)
sends one window per workload, GPU and UTC minute, the integrals of its samples (agents.batch
windows_of), v1 every sample. Every body is built before timing, on a process per core.

With v2 the meter no longer changes what the service does: a window carries the same integrals of
used and granted memory, SM·s and PCIe whatever the meter (exact sums of the same 1/1024 quanta),
one row per workload-minute. What a coarser meter changes is the `max` basis' billed integral, Σ
per sample of max(used, granted), which a wider sample lowers when a burst above the grant is
absorbed by the rest of the sample's headroom; so the default is --meter-ms 1000 alone, and more
widths (--meter-ms 1000 5000 ...) add a precision table against the first.

Per meter setting, batch window by batch window (as a steady fleet runs: every node uploads the
window's batch, and the rollup, a beat cycle behind, rolls up what is pending), faster than real
time where the machine allows, with gunicorn and the rollup workers running through all windows:
1. ingest: gunicorn (config.wsgi, sync workers, the product's gunicorn.conf.py) on loopback;
   --agents client threads post every node's batch of the window as fast as answered. CPU of the
   gunicorn tree, this database's Postgres backends (+ auxiliaries) and the client, from /proc.
   Parallel query is off (PGOPTIONS) unless --parallel-query: a parallel worker's CPU cannot be
   attributed to this database and leaves /proc with the worker.
2. rollup: then --rollup-workers N processes, each with its own connection kept for the run, call
   billing.ledger.rollup.rollup_usage(now=..., shard=k, shards=N, max_batches=--rollup-batches),
   as the service's shard tasks do, until nothing of their shard is pending. A call answered
   skipped=True (a node of it was held by another session) sleeps 0.2 s and tries again; such
   calls are counted and reported. Default --rollup-batches: the service's VGPU_ROLLUP_MAX_BATCHES.
   Ingest and rollup never overlap, so each one's CPU is measured alone. With several counts
   (--rollup-workers 1 2) the 1-second setting runs once per count, each from a fresh copy of the
   template; the first count's run is the headline, the others' rollups are compared with it.
3. checks: every batch rolled up, none quarantined; samples (v1) or windows (v2) sent = accepted;
   their workload-seconds = every workload's seconds of the run = seconds in the minute and day
   ledgers; Σ of every integral in the minute ledger (used, granted, billed memory and SM·s, PCIe)
   = the metered series summed in 1/1024 units, exactly; per GPU-day Σ charges + idle = card cost;
   card cost = price x GPU-seconds.
4. disk: pg_total_relation_size (indexes and TOAST included, summed over partitions) of the
   integral rows ingest writes (the raw table: one row per batch, workload, GPU and minute, v1
   samples summed per minute at ingest; an inbox the rollup empties into the minutes, so with every
   batch rolled up it holds no live row and counts 0 a day), batches, batch GPUs and the minute, hour and day
   ledgers, the last five as a fresh copy of their live rows (compact_bytes: what VACUUM FULL
   leaves; the rollup's rewrites leave dead rows a short run has not vacuumed); WAL from
   pg_current_wal_lsn() around ingest + rollup (cluster-wide: on a shared server it includes other
   databases' writes, so it is an upper bound).
5. memory: the largest RSS of a gunicorn worker and of a rollup worker, and the private memory (USS)
   of this database's Postgres backends, sampled every 0.5 s (psutil) through the whole run;
   shared_buffers apart.
6. pages: /finance/, /tenants/, the biggest tenant's portal and /invoices/ through Django's test
   client (median of --page-runs after one warm-up).
7. precision (with more than one --meter-ms): each workload's charge (and billed MB·s, SM·s) from
   the day ledger, compared with the 1-second setting of the same load.
8. steady state: wall seconds of each batch window's ingest and rollup. The first window pays for
   cold caches and the first claim of every GPU; later ones should be flat.

Per 1,000 GPUs: CPU seconds per second of fleet time x 1000 / --gpus (the cores a fleet of 1,000
such GPUs keeps busy); bytes per GPU-day = bytes per row x rows per GPU-day of a steady fleet (a
run of minutes already holds whole hour and day rows, so bytes do not scale with its length); WAL
bytes x 86400 / (GPUs x fleet seconds). A plan table scales it all to PLAN_GPUS GPUs (measured,
not extrapolated, when --gpus is PLAN_GPUS).

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
    p.add_argument("--meter-ms", type=int, nargs="+", default=[1000],
                   help="sample widths (the agent's --meter-ms); the first must be 1000, the precision baseline of "
                        "the others (with wire v2 the service's work does not depend on it)")
    p.add_argument("--wire", choices=("v1", "v2"), default="v2",
                   help="the batches' wire protocol (the agent's --wire; v2, one window per workload-minute, is its "
                        "default)")
    p.add_argument("--batch-seconds", type=int, default=60, help="batch window (the agent's --batch-seconds)")
    p.add_argument("--agents", type=int, default=4, help="client threads posting the nodes' batches")
    p.add_argument("--gunicorn-workers", type=int, default=3, help="sync gunicorn workers")
    p.add_argument("--rollup-workers", type=int, nargs="+", default=[1],
                   help="rollup processes calling rollup_usage at once; the first count is the headline, and "
                        "with more counts the 1-second setting is run again with each, from a copy of the "
                        "template (one run compares them)")
    p.add_argument("--rollup-batches", type=int, default=0,
                   help="max_batches per rollup_usage call (default: the service's VGPU_ROLLUP_MAX_BATCHES)")
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
    """One node's integrals per (GPU, workload, second) in 1/1024 units (int64 arrays G x W x S)."""

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


def make_load(shape: Shape, seed: int, node: int) -> Load:
    """The load of one node's GPUs, seeded by (seed, node): each node's series is drawn on its own,
    so a fleet of any size is built one node at a time (10,000 GPUs x 16 workloads x 5 minutes
    would be 2 GB per series at once) and every meter setting redraws the same load."""
    rng = np.random.default_rng([seed, node])
    names_rng = random.Random(f"{seed}/{node}")
    g, w, s = len(shape.node_gpus(node)), shape.workloads_per_gpu, shape.seconds
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


# --------------------------------------------------------------------------------------------
# The agents' batches, rendered by the agent's own code (agents/batch.py)

# The integrals the minute ledger must hold, in 1/1024 units: what was metered, summed (the billed
# maxima are the store's mem_max_mb_s and sm_max_s).
INTEGRALS = ("mem_used_mb_s", "mem_granted_mb_s", "mem_max_mb_s", "sm_used_s", "sm_granted_s", "sm_max_s",
             "pcie_mb")


@dataclass(frozen=True)
class Batch:
    node: int
    seq: int
    items: int  # samples (v1) or windows (v2): what ingest answers as `accepted`
    body: bytes  # gzip of the compact JSON


@dataclass
class Sent:
    """What the fleet's batches carry, summed: the ledger must account for all of it, exactly."""

    items: int = 0
    workload_seconds: int = 0
    quanta: dict[str, int] = field(default_factory=lambda: dict.fromkeys(INTEGRALS, 0))

    def add(self, coarse: dict[str, np.ndarray[Any, np.dtype[np.int64]]], period_s: int) -> None:
        """One node's metered series: each period is a sample, billed = max(used, granted) per sample."""
        self.workload_seconds += int(coarse["mem_used"].size) * period_s
        for name, series in (("mem_used_mb_s", coarse["mem_used"]), ("mem_granted_mb_s", coarse["mem_granted"]),
                             ("mem_max_mb_s", np.maximum(coarse["mem_used"], coarse["mem_granted"])),
                             ("sm_used_s", coarse["sm_used"]), ("sm_granted_s", coarse["sm_granted"]),
                             ("sm_max_s", np.maximum(coarse["sm_used"], coarse["sm_granted"])),
                             ("pcie_mb", coarse["pcie"])):
            self.quanta[name] += int(series.sum())

    def merge(self, other: Sent) -> None:
        self.items += other.items
        self.workload_seconds += other.workload_seconds
        for name, quanta in other.quanta.items():
            self.quanta[name] += quanta


def node_batches(shape: Shape, seed: int, node: int, *, start: datetime, period_s: int,
                 wire: str) -> tuple[list[Batch], Sent]:
    """One node's batches in time order, rendered by agents.batch.render_batch exactly as the agent
    renders them (v1: the samples; v2: their integrals per workload, GPU and minute, `windows_of`),
    from `Sample`s of `period_s` seconds as the agent's meter closes them, gzipped as its spool does."""
    from agents.batch import Sample, render_batch
    from agents.interfaces import GpuInfo, Workload

    load = make_load(shape, seed, node)
    coarse = load.coarsened(period_s)
    sent = Sent()
    sent.add(coarse, period_s)
    gpus = [GpuInfo(uuid=u, model=str(A100["model"]), memory_mb=int(A100["memory_mb"]), sm_count=int(A100["sm_count"]))
            for u in load.gpu_uuids]
    # Per (GPU, workload): its identity and its five series as Python floats in agent units (exact:
    # multiples of 1/1024 far below 2^53), one node's worth (the whole fleet's would be GBs).
    series = [(coarse[name] / Q).tolist() for name in ("mem_used", "mem_granted", "sm_used", "sm_granted", "pcie")]
    columns = [(gpu.uuid, Workload(tenant=n["tenant"], namespace=n["namespace"], pod=n["pod"], container=n["container"],
                                   pod_uid=n["pod_uid"], sla_tier=n["sla_tier"]), *(x[i][w] for x in series))
               for i, gpu in enumerate(gpus) for w, n in enumerate(load.names[i])]
    per_window = shape.batch_seconds // period_s
    starts = [start + timedelta(seconds=k * period_s) for k in range(shape.seconds // period_s)]
    batches = []
    for window in range(shape.windows):
        w_start = start + timedelta(seconds=window * shape.batch_seconds)
        samples = [Sample(starts[k], period_s, uuid_, workload, mem_used[k], mem_granted[k], sm_used[k], sm_granted[k],
                          pcie[k])
                   for k in range(window * per_window, (window + 1) * per_window)
                   for uuid_, workload, mem_used, mem_granted, sm_used, sm_granted, pcie in columns]
        body = render_batch(node=node_name(node), batch_seq=window + 1, window_start=w_start,
                            window_end=w_start + timedelta(seconds=shape.batch_seconds), gpus=gpus, samples=samples,
                            wire=wire)
        items = len(json.loads(body)["samples" if wire == "v1" else "windows"])  # what ingest will count
        batches.append(Batch(node, window + 1, items, gzip.compress(body, mtime=0)))
    sent.items = sum(b.items for b in batches)
    return batches, sent


def _node_batches(job: tuple[Shape, int, int, datetime, int, str]) -> tuple[list[Batch], Sent]:
    shape, seed, node, start, period_s, wire = job
    return node_batches(shape, seed, node, start=start, period_s=period_s, wire=wire)


def build_batches(shape: Shape, seed: int, *, start: datetime, period_s: int,
                  wire: str) -> tuple[list[list[Batch]], Sent]:
    """Every node's batches, before anything is timed, one node per task on a process per core
    (rendering 1-second samples into v2 windows is about 17 µs of Python per sample, 14 CPU
    minutes for 5 minutes of 10,000 GPUs x 16 workloads). Kept in memory: at v2 a node-minute is
    about 13 KB of gzip."""
    jobs = [(shape, seed, node, start, period_s, wire) for node in range(shape.nodes)]
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no Django connection inherited
    with ctx.Pool(os.cpu_count() or 1) as pool:
        built = pool.map(_node_batches, jobs, chunksize=max(1, len(jobs) // (8 * (os.cpu_count() or 1))))
    total = Sent()
    for _, sent in built:
        total.merge(sent)
    return [batches for batches, _ in built], total


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
# The run, batch window by batch window: every node's batch of the window over HTTP (ingest), then
# the rollup of what is pending, as a steady fleet keeps the rollup one window behind its uploads


@dataclass
class PosterResult:
    batches: int = 0
    accepted: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


def _post_all(port: int, work: list[tuple[str, Batch]], result: PosterResult) -> None:
    """One client thread: its nodes' batches of one window, on one keep-alive connection."""
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


def ingest_window(port: int, work: list[list[tuple[str, Batch]]]) -> list[PosterResult]:
    """One window's batches, each client thread posting its nodes' as fast as answered."""
    results = [PosterResult() for _ in work]
    threads = [threading.Thread(target=_post_all, args=(port, w, r), daemon=True)
               for w, r in zip(work, results, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@dataclass(frozen=True)
class IngestRun:
    wall_s: float
    batches: int
    accepted: int  # samples (v1) or windows (v2), as ingest answered
    sent: int
    errors: list[str]
    window_s: list[float]  # wall seconds of each batch window's ingest
    latency_p50_ms: float
    latency_p99_ms: float
    cpu_gunicorn_s: float
    cpu_postgres_s: float
    cpu_client_s: float
    gunicorn_worker_rss_max: int
    postgres_uss_sum: int  # this database's backends, over the whole run (ingest and rollup)
    machine_busy_s: float | None = None  # every process on the (shared) machine, from /proc/stat
    window_cpu_s: list[float] = field(default_factory=list)  # the service's CPU seconds (gunicorn + Postgres)
    window_busy_s: list[float | None] = field(default_factory=list)  # the whole machine's, per window


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

    def plus(self, other: WorkerReport) -> WorkerReport:
        """This worker's windows so far and one more."""
        return WorkerReport(self.cycles + other.cycles, self.skipped + other.skipped, self.batches + other.batches,
                            self.gpu_minutes + other.gpu_minutes, self.quarantined + other.quarantined,
                            self.busy_s + other.busy_s, self.cpu_s + other.cpu_s, max(self.max_rss, other.max_rss),
                            self.error or other.error)


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _roll_up_pending(shard: tuple[int, int], max_batches: int) -> WorkerReport:
    """rollup_usage on the shard until nothing of it is pending (one window's batches)."""
    from billing.ledger.rollup import rollup_usage

    cycles = skipped = batches = minutes = quarantined = 0
    busy, cpu_at_start = 0.0, _cpu_self()
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
    return WorkerReport(cycles, skipped, batches, minutes, quarantined, busy, _cpu_self() - cpu_at_start,
                        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _idle(error: str = "") -> WorkerReport:
    return WorkerReport(0, 0, 0, 0, 0, 0.0, 0.0, 0, error)


def rollup_worker(env: dict[str, str], shard: tuple[int, int], max_batches: int,
                  commands: multiprocessing.Queue[bool], reports: multiprocessing.Queue[WorkerReport]) -> None:
    """One rollup process for the whole run: its own Django connection, rolling up its shard (k of
    N, as the service's shard tasks do: the nodes with node_id % N == k) each time it is told to,
    until nothing of it is pending. The connection stays open between windows, as a long-running
    worker's does, and until the end: a backend that exits takes its CPU time out of /proc before
    the parent's last snapshot. It answers every command, failed or not, so the parent never waits
    in vain; an error fails the run."""
    error = ""
    try:
        setup_django(env)
        from django.db import connection

        connection.ensure_connection()  # connected before the first window, as a long-running worker is
    except Exception as exc:  # noqa: BLE001 - reported by the parent, which fails the run
        error = f"{type(exc).__name__}: {exc}"
    reports.put(_idle(error))  # ready
    while commands.get():
        try:
            reports.put(_idle(error) if error else _roll_up_pending(shard, max_batches))
        except Exception as exc:  # noqa: BLE001 - reported by the parent, which fails the run
            reports.put(_idle(f"{type(exc).__name__}: {exc}"))


class RollupWorkers:
    """N rollup processes that roll up on request, each reporting per request."""

    def __init__(self, env: dict[str, str], workers: int, max_batches: int) -> None:
        ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no Django state or sockets inherited
        self._commands: list[multiprocessing.Queue[bool]] = [ctx.Queue() for _ in range(workers)]
        self._reports: list[multiprocessing.Queue[WorkerReport]] = [ctx.Queue() for _ in range(workers)]
        self._procs = [ctx.Process(target=rollup_worker, args=(env, (k, workers), max_batches, c, r))
                       for k, (c, r) in enumerate(zip(self._commands, self._reports, strict=True))]
        for proc in self._procs:
            proc.start()
        # Every worker connected before the first window; a start-up error stays in its totals.
        self.totals = [r.get(timeout=300) for r in self._reports]

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid]

    def roll_up(self) -> float:
        """Every worker rolls its shard up until nothing is pending; returns when all have, with the
        CPU seconds the workers used."""
        for q in self._commands:
            q.put(True)
        reports = [r.get(timeout=3600) for r in self._reports]
        self.totals = [total.plus(r) for total, r in zip(self.totals, reports, strict=True)]
        return sum(r.cpu_s for r in reports)

    def close(self) -> None:
        for q in self._commands:
            q.put(False)
        for proc in self._procs:
            proc.join(timeout=60)


@dataclass(frozen=True)
class RollupRun:
    wall_s: float
    workers: list[WorkerReport]
    cpu_workers_s: float
    cpu_postgres_s: float
    max_batches: int
    machine_busy_s: float | None = None  # every process on the (shared) machine, from /proc/stat
    window_s: list[float] = field(default_factory=list)  # wall seconds of each batch window's rollup
    window_cpu_s: list[float] = field(default_factory=list)  # the service's CPU seconds (workers + Postgres)
    window_busy_s: list[float | None] = field(default_factory=list)  # the whole machine's, per window


@dataclass
class _Phase:
    """Wall and CPU seconds of one phase, summed over the windows."""

    wall: float = 0.0
    gunicorn: float = 0.0
    postgres: float = 0.0
    client: float = 0.0
    busy: float | None = 0.0
    windows: list[float] = field(default_factory=list)
    window_cpu: list[float] = field(default_factory=list)  # the service's CPU seconds in each window
    window_busy: list[float | None] = field(default_factory=list)  # the whole machine's busy CPU seconds

    def add(self, wall: float, cpu: CpuUse, service_cpu: float) -> None:
        self.wall += wall
        self.windows.append(wall)
        self.window_cpu.append(service_cpu)
        self.window_busy.append(cpu.busy)
        self.gunicorn += cpu.gunicorn
        self.postgres += cpu.postgres or 0.0
        self.client += cpu.client
        self.busy = None if self.busy is None or cpu.busy is None else self.busy + cpu.busy


def run_fleet(env: dict[str, str], database: str, tokens: dict[str, str], batches: list[list[Batch]],
              args: argparse.Namespace, shape: Shape, workers: int, max_batches: int) -> tuple[IngestRun, RollupRun]:
    """Batch window by batch window: every node's batch of the window posted over HTTP (ingest),
    then rolled up by the rollup workers (rollup); each phase timed and its CPU read from /proc on
    its own, so the two never share a measurement."""
    by_window: list[list[list[tuple[str, Batch]]]] = [[[] for _ in range(args.agents)] for _ in range(shape.windows)]
    for node, node_batches in enumerate(batches):
        for window, batch in enumerate(node_batches):
            by_window[window][node % args.agents].append((tokens[node_name(node)], batch))
    results: list[PosterResult] = []
    ingest, roll = _Phase(), _Phase()
    with gunicorn(env, ServerConfig("sync", args.gunicorn_workers, 1)) as server:
        _wait_ready(server.port)
        pool = RollupWorkers(env, workers, max_batches)
        try:
            with MemorySampler(database, lambda: _children(server.proc.pid) + pool.pids()) as memory:
                for window, work in enumerate(by_window):
                    before, started = CpuSnapshot.take(database, server.proc.pid), time.perf_counter()
                    results += ingest_window(server.port, work)
                    middle, ingested = CpuSnapshot.take(database, server.proc.pid), time.perf_counter()
                    workers_cpu = pool.roll_up()
                    after, rolled = CpuSnapshot.take(database, server.proc.pid), time.perf_counter()
                    cpu = CpuUse.between(before, middle)
                    ingest.add(ingested - started, cpu, cpu.gunicorn + (cpu.postgres or 0.0))
                    cpu = CpuUse.between(middle, after)
                    roll.add(rolled - ingested, cpu, workers_cpu + (cpu.postgres or 0.0))
                    log(f"  window {window + 1}/{shape.windows}: ingest {ingested - started:.1f} s "
                        f"({ingest.window_cpu[-1]:.1f} CPU s), rollup {rolled - ingested:.1f} s "
                        f"({roll.window_cpu[-1]:.1f} CPU s)")
                memory.sample()
        finally:
            pool.close()
    latencies = sorted(x for r in results for x in r.latencies)
    rollup_pids = set(pool.pids())
    ingest_run = IngestRun(
        wall_s=ingest.wall, batches=sum(r.batches for r in results), accepted=sum(r.accepted for r in results),
        sent=sum(b.items for node in batches for b in node), errors=[e for r in results for e in r.errors],
        window_s=ingest.windows,
        latency_p50_ms=1000 * statistics.median(latencies) if latencies else 0.0,
        latency_p99_ms=1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else 0.0,
        cpu_gunicorn_s=ingest.gunicorn, cpu_postgres_s=ingest.postgres, cpu_client_s=ingest.client,
        gunicorn_worker_rss_max=max((v for pid, v in memory.max_rss.items()
                                     if pid != server.proc.pid and pid not in rollup_pids), default=0),
        postgres_uss_sum=memory.pg_uss_total, machine_busy_s=ingest.busy,
        window_cpu_s=ingest.window_cpu, window_busy_s=ingest.window_busy,
    )
    totals = pool.totals
    rollup_run = RollupRun(roll.wall, totals, sum(w.cpu_s for w in totals), roll.postgres, max_batches, roll.busy,
                           roll.windows, roll.window_cpu, roll.window_busy)
    return ingest_run, rollup_run


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


def check(acc: Accounting, run: IngestRun, sent: Sent, shape: Shape) -> list[str]:
    """What must hold for the numbers to mean anything (every item a failure)."""
    tolerance = Decimal("1e-6")  # money: ledger rows carry 12 decimals, sums over ~10^6 rows
    problems = []
    if run.errors:
        problems.append(f"{len(run.errors)} batches not stored, e.g. {run.errors[0]}")
    if run.accepted != run.sent:
        problems.append(f"samples or windows sent {run.sent:,} != accepted {run.accepted:,}")
    if acc.pending_batches or acc.quarantined_batches:
        problems.append(f"{acc.pending_batches} batches pending, {acc.quarantined_batches} quarantined")
    metered = shape.gpus * shape.workloads_per_gpu * shape.seconds
    if sent.workload_seconds != metered:
        problems.append(f"the batches carry {sent.workload_seconds} workload-seconds, the fleet metered {metered}")
    for label, seconds in (("minute", acc.seconds_in_minutes), ("day", acc.seconds_in_days)):
        if seconds != sent.workload_seconds:
            problems.append(f"{label} ledger holds {seconds} workload-seconds, sent {sent.workload_seconds}")
    if acc.gpu_seconds != shape.gpus * shape.seconds:
        problems.append(f"GPU-seconds metered {acc.gpu_seconds} != {shape.gpus * shape.seconds}")
    if abs(acc.charges + acc.idle - acc.card_cost) > tolerance:
        problems.append(f"charges {acc.charges} + idle {acc.idle} != card cost {acc.card_cost}")
    if abs(acc.card_cost - acc.expected_card_cost) > tolerance:
        problems.append(f"card cost {acc.card_cost} != price x GPU-seconds {acc.expected_card_cost}")
    if abs(acc.charges_in_minutes - acc.charges) > tolerance:
        problems.append(f"minute charges {acc.charges_in_minutes} != day charges {acc.charges}")
    return problems


def integral_problems(sent: Sent) -> list[str]:
    """Every integral the batches carried is in the minute ledger exactly: Σ used, granted and billed
    memory and SM·s and PCIe MB, against the metered series summed in the agent's 1/1024 units
    (billed = Σ per sample of max(used, granted), the `max` basis' integral)."""
    from django.db.models import Sum

    stored = _model("UsageMinute").objects.aggregate(**{name: Sum(name) for name in INTEGRALS})
    return [f"minute ledger holds {name} = {stored[name]}, sent {Decimal(quanta) / Q}"
            for name, quanta in sent.quanta.items() if Decimal(stored[name] or 0) != Decimal(quanta) / Q]


def table_bytes(database_url: str) -> dict[str, int]:
    """Bytes on disk (heap, indexes, TOAST; every partition) of each ledger table."""
    from billing.ledger.partitions import RAW_TABLE

    tables = {"integral rows": RAW_TABLE, **{m: _model(m)._meta.db_table for m in LEDGER_MODELS}}
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


def compact_bytes(database_url: str) -> dict[str, int]:
    """Bytes of each batch, minute, hour and day table (heap, indexes, TOAST) holding its live rows
    only: a fresh copy with the same columns and indexes, the indexes built in bulk, which is what
    VACUUM FULL leaves. Every rollup cycle rewrites the hour and day rows of each GPU it touches
    (and marks batches rolled up), and in a run of minutes autovacuum has not reclaimed those dead
    rows: measured as the run left them, they inflate a short run's bytes per row far beyond a steady
    fleet's. VACUUM FULL itself cannot be relied on on a shared server: a transaction left open in any
    database of the cluster is running to every snapshot taken here, so the dead rows stay
    "recently dead" and are kept (seen: x 2.8 on the hour ledger after VACUUM FULL). The integral
    rows are written once and never updated: their size as stored is their size."""
    conn = psycopg2.connect(database_url)
    try:
        conn.autocommit = True
        out = {}
        with conn.cursor() as cur:
            for m in LEDGER_MODELS:
                table = _model(m)._meta.db_table
                cur.execute(f'CREATE TEMP TABLE fleet_compact (LIKE "{table}" INCLUDING ALL)')
                cur.execute(f'INSERT INTO fleet_compact SELECT * FROM "{table}"')  # noqa: S608 - a model's table name
                cur.execute("REINDEX TABLE fleet_compact")
                cur.execute("SELECT pg_total_relation_size('fleet_compact')")
                out[m] = int(cur.fetchone()[0])
                cur.execute("DROP TABLE fleet_compact")
        return out
    finally:
        conn.close()


def table_rows() -> dict[str, int]:
    """Rows of each ledger table."""
    from django.db import connection

    from billing.ledger.partitions import RAW_TABLE

    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {RAW_TABLE}")  # noqa: S608 - our constant table name, no input
        raw = int(cur.fetchone()[0])
    return {"integral rows": raw, **{m: int(_model(m).objects.count()) for m in LEDGER_MODELS}}


def rows_per_gpu_day(shape: dict[str, int]) -> dict[str, float]:
    """Rows each table gains per GPU and day in a steady fleet (the same workloads all day): the
    minute, hour and day ledgers have one row per window, however short the run was. Integral rows:
    one per batch, workload, GPU and UTC minute, whatever the meter or the wire (ingest sums v1
    samples per minute), so one per workload-minute with minute batches."""
    w, per_node, batch_s = shape["workloads_per_gpu"], shape["gpus_per_node"], shape["batch_seconds"]
    batches = 86400 / batch_s
    return {"integral rows": w * 86400 * max(1, batch_s // 60) / batch_s, "UsageBatch": batches / per_node,
            "BatchGpu": batches,
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
    items: int  # samples (wire v1) or windows (v2) accepted
    batches: int
    body_bytes: int
    ingest: IngestRun
    rollup: RollupRun
    accounting: dict[str, str]
    problems: list[str]
    table_bytes: dict[str, int]  # live rows only (compact_bytes) for every table but the integral rows
    table_rows: dict[str, int]
    wal_bytes: int
    pages_s: dict[str, float]
    precision: Precision | None = None
    table_bytes_as_left: dict[str, int] = field(default_factory=dict)
    # The same ingested rows rolled up again with each further --rollup-workers count (1-second setting).
    rollup_scaling: list[RollupRun] = field(default_factory=list)


def run_setting(env: dict[str, str], dbs: Databases, tokens: dict[str, str], shape: Shape,
                start: datetime, meter_ms: int, args: argparse.Namespace) -> tuple[Setting, dict[WorkloadKey, Any]]:
    period_s = meter_ms // 1000
    log(f"meter {meter_ms} ms: building {args.wire} batches")
    batches, sent = build_batches(shape, args.seed, start=start, period_s=period_s, wire=args.wire)
    body_bytes = sum(len(b.body) for node in batches for b in node)
    log(f"  {sent.items:,} {items_label(args.wire)}, {body_bytes / 2**20:,.1f} MiB of gzip")
    from django.conf import settings

    max_batches = args.rollup_batches or settings.VGPU_ROLLUP_MAX_BATCHES  # what the shard task passes
    counts = args.rollup_workers if meter_ms == 1000 else args.rollup_workers[:1]
    runs: list[tuple[IngestRun, RollupRun]] = []
    problems: list[str] = []
    for i, workers in enumerate(reversed(counts)):  # the headline count last: its database is the one kept
        if i:
            copy_database(dbs, source=dbs.template, target=dbs.name)
        wal_start = wal_lsn(dbs.url)
        log(f"meter {meter_ms} ms: {len(batches) * shape.windows:,} batches over HTTP, rolled up after each window "
            f"by {workers} worker(s), max_batches={max_batches}")
        run, rolled = run_fleet(env, dbs.name, tokens, batches, args, shape, workers, max_batches)
        log(f"  ingest {run.accepted:,} {items_label(args.wire)} in {run.wall_s:.1f} s, {len(run.errors)} errors; "
            f"rollup {rolled.wall_s:.1f} s; together {shape.seconds / (run.wall_s + rolled.wall_s):.2f} x real time; "
            + "; ".join(f"worker {n}: {w.cycles} cycles, {w.skipped} skipped, {w.batches} batches"
                        f"{' ' + w.error if w.error else ''}" for n, w in enumerate(rolled.workers)))
        acc = accounting(PRICE_PER_GPU_HOUR)
        problems += [f"{workers} rollup worker(s): {p}" for p in check(acc, run, sent, shape) + integral_problems(sent)]
        problems += [f"rollup worker: {w.error}" for w in rolled.workers if w.error]
        runs.insert(0, (run, rolled))
    del batches  # a large fleet's bodies are not needed past ingest
    wal = wal_lsn(dbs.url) - wal_start  # the headline run's ingest and rollup
    sizes_before = table_bytes(dbs.url)
    sizes = sizes_before | compact_bytes(dbs.url)
    log(f"meter {meter_ms} ms: pages")
    pages = time_pages(args.page_runs)
    run = runs[0][0]
    setting = Setting(meter_ms, run.accepted, run.batches, body_bytes, run,
                      runs[0][1], {k: str(v) for k, v in asdict(acc).items()}, problems, sizes,
                      table_rows(), wal, pages,
                      rollup_scaling=[rolled for _, rolled in runs[1:]], table_bytes_as_left=sizes_before)
    return setting, per_workload()


@dataclass(frozen=True)
class Report:
    command: str
    started: str
    machine: dict[str, str]
    shape: dict[str, int]
    rollup_workers: list[int]
    settings: list[Setting]
    wire: str

    @property
    def problems(self) -> list[str]:
        return [f"meter {s.meter_ms} ms: {p}" for s in self.settings for p in s.problems]


def items_label(wire: str) -> str:
    return "samples" if wire == "v1" else "windows"


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
    log(f"load: {shape.gpus} GPUs x {shape.workloads_per_gpu} workloads x {shape.seconds} s, wire {args.wire}")
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
            setting, workloads = run_setting(env, dbs, tokens, shape, start, meter_ms, args)
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
                  machine, asdict(shape), args.rollup_workers, settings, args.wire)


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
    items = items_label(report.wire)
    rows = [f"| meter | {items} | batches | gzip MiB | ingest s | {items}/s | x real time | rollup s | {items}/s "
            "| x real time | rollup ÷ ingest rate | rollup cycles (skipped) per worker |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for s in report.settings:
        cycles = ", ".join(f"{w.cycles} ({w.skipped})" for w in s.rollup.workers)
        rows.append(f"| {s.meter_ms} ms | {s.items:,} | {s.batches:,} | {_mib(s.body_bytes)} | {s.ingest.wall_s:.1f} "
                    f"| {s.items / s.ingest.wall_s:,.0f} | {fleet_seconds(report) / s.ingest.wall_s:.2f} "
                    f"| {s.rollup.wall_s:.1f} | {s.items / s.rollup.wall_s:,.0f} "
                    f"| {fleet_seconds(report) / s.rollup.wall_s:.2f} | {s.ingest.wall_s / s.rollup.wall_s:.2f} "
                    f"| {cycles} |")
    return "\n".join(rows)


def steady_table(report: Report) -> str:
    """The headline setting's wall and CPU seconds of each batch window's ingest and rollup. Flat CPU
    after the first window is the steady state the per-1,000 figures need; wall seconds that move
    while the CPU does not are the shared machine's other work (its busy cores say how much)."""
    s, batch_s = report.settings[0], report.shape["batch_seconds"]
    rows = [f"| batch window ({batch_s} s of fleet time) | ingest: wall s | CPU s | rollup: wall s | CPU s "
            "| busy cores of the whole machine, ingest / rollup | ingest + rollup, x real time |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    ingest, rollup = s.ingest, s.rollup
    for k in range(len(ingest.window_s)):
        busy = " / ".join("n/a" if b is None else f"{b / wall:.2f}"
                          for b, wall in ((ingest.window_busy_s[k], ingest.window_s[k]),
                                          (rollup.window_busy_s[k], rollup.window_s[k])))
        rows.append(f"| {k + 1} | {ingest.window_s[k]:.1f} | {ingest.window_cpu_s[k]:.1f} | {rollup.window_s[k]:.1f} "
                    f"| {rollup.window_cpu_s[k]:.1f} | {busy} | {batch_s / (ingest.window_s[k] + rollup.window_s[k]):.2f} |")
    return "\n".join(rows)


def scaling_table(report: Report) -> str:
    """The 1-second setting's rows rolled up with each --rollup-workers count ("" with one count)."""
    s = report.settings[0]
    if not s.rollup_scaling:
        return ""
    rows = [f"| rollup workers | wall s | {items_label(report.wire)}/s | vs first | per worker: cycles (skipped), batches "
            "| CPU s, workers | CPU s, Postgres |", "|---:|---:|---:|---:|---|---:|---:|"]
    for r in (s.rollup, *s.rollup_scaling):
        workers = "; ".join(f"{w.cycles} ({w.skipped}), {w.batches}" for w in r.workers)
        rows.append(f"| {len(r.workers)} | {r.wall_s:.1f} | {s.items / r.wall_s:,.0f} | "
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
        rows.append(f"| {s.meter_ms} ms | " + " | ".join(f"{cores(report, x):.3f}" for x in parts)
                    + f" | **{cores(report, sum(parts)):.3f}** | {cores(report, s.ingest.cpu_client_s):.3f} | {busy} |")
    return "\n".join(rows)


DISK_ROWS = (("integral rows", ("integral rows",)), ("batches + batch GPUs", ("UsageBatch", "BatchGpu")),
             ("minute ledger", ("UsageMinute", "GpuMinute")), ("hour ledger", ("UsageHour", "GpuHour")),
             ("day ledger", ("UsageDay", "GpuDay")))


def bytes_per_gpu_day(report: Report, s: Setting, table: str) -> float:
    """Bytes per row measured in this run x rows per GPU-day in a steady fleet."""
    rows = s.table_rows[table]
    return s.table_bytes[table] / rows * rows_per_gpu_day(report.shape)[table] if rows else 0.0


def disk_table(report: Report) -> str:
    head = " | ".join(f"{s.meter_ms} ms" for s in report.settings)
    rows = [f"| table (heap + indexes + TOAST) | bytes per row, {report.settings[0].meter_ms} ms | as the run left it "
            f"| bytes per GPU-day: {head} | GB/day per 1,000 GPUs: {head} |",
            "|---|---:|---:|" + "---:|" * (2 * len(report.settings))]
    first = report.settings[0]
    for label, names in (*DISK_ROWS, ("**all ledger tables**", tuple(n for _, ns in DISK_ROWS for n in ns))):
        per_day = [sum(bytes_per_gpu_day(report, s, n) for n in names) for s in report.settings]
        n_rows = sum(first.table_rows[n] for n in names)
        per_row = f"{sum(first.table_bytes[n] for n in names) / n_rows:,.0f}" if n_rows and len(names) < 3 else "-"
        before = sum(first.table_bytes_as_left.get(n, 0) for n in names)
        bloat = f"x {before / sum(first.table_bytes[n] for n in names):.1f}" if before and len(names) < 3 else "-"
        rows.append(f"| {label} | {per_row} | {bloat} | " + " | ".join(f"{b:,.0f}" for b in per_day) + " | "
                    + " | ".join(f"{b * 1000 / 1e9:,.2f}" for b in per_day) + " |")
    wal = [s.wal_bytes for s in report.settings]
    rows.append("| WAL written, ingest + rollup (cluster-wide, upper bound) | - | - | "
                + " | ".join(f"{b / gpu_days(report):,.0f}" for b in wal) + " | "
                + " | ".join(f"{_gb_day(report, b):,.2f}" for b in wal) + " |")
    return "\n".join(rows)


def memory_table(report: Report) -> str:
    rows = ["| meter | gunicorn worker RSS, max MiB | rollup worker RSS, max MiB | Postgres backends USS, Σ MiB |",
            "|---|---:|---:|---:|"]
    rows.extend(f"| {s.meter_ms} ms | {_mib(s.ingest.gunicorn_worker_rss_max)} "
                f"| {_mib(max(w.max_rss for w in s.rollup.workers))} | {_mib(s.ingest.postgres_uss_sum)} |"
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
# and disk"): integral rows for the late-usage horizon (45 days) plus the 2-day margin, and the
# batches with their GPU rows as long as them; the minute ledger 100 days, hours 396 (13 months).
# Days are kept forever: the plan counts one year of them.
PLAN_GPUS = 10_000
PLAN_UTILISATION = 0.5  # cores planned at half busy: headroom for peaks and for catching up a backlog
PLAN_DAYS = {"integral rows": 47, "UsageBatch": 47, "BatchGpu": 47, "UsageMinute": 100, "GpuMinute": 100,
             "UsageHour": 396, "GpuHour": 396, "UsageDay": 365, "GpuDay": 365}


def plan_table(report: Report) -> str:
    """What PLAN_GPUS GPUs with this run's workloads per GPU need, from this run's per-1,000 figures."""
    scale = PLAN_GPUS / 1000
    rows = [f"| meter | cores at {PLAN_UTILISATION:.0%} busy: web/ingest + Postgres + rollup = total | ledger GB/day "
            "| WAL GB/day | disk held, TB (integral rows and batches 47 d, minutes 100 d, hours 396 d, days 1 year) "
            "| RAM: gunicorn + rollup workers, GiB |",
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
        scaling = (f"\n\nThe 1-second setting's rollup with each worker count, each a run of its own from a copy "
                   f"of the template (max_batches={report.settings[0].rollup.max_batches} per call; a "
                   f"call answered skipped=True waits {SKIPPED_RETRY_S} s):\n\n{scaling}")
    precision = ""
    if len(report.settings) > 1:
        precision = (f"\n\nBilling precision against 1-second samples of the same load (charges per workload from "
                     f"the day ledger; negative = billed less; only the `max` basis' billed integral depends on the "
                     f"meter):\n\n{precision_table(report)}")
    measured = report.shape["gpus"] == PLAN_GPUS
    plan_source = ("measured at this size (the per-1,000 figures x 10)" if measured
                   else "scaled from this run (linear in GPUs)")
    return (f"Speed (fleet time is {fleet_seconds(report)} s; \"x real time\" is fleet seconds per wall second):\n\n"
            f"{speed_table(report)}\n\nSteady state: wall and CPU seconds (the service's: gunicorn or rollup workers, and Postgres) of "
            f"each batch window's ingest and rollup, "
            f"{report.settings[0].meter_ms} ms setting:\n\n{steady_table(report)}\n\n"
            f"Cores per 1,000 GPUs (CPU seconds per second of fleet time, scaled from "
            f"{report.shape['gpus']:,} GPUs):\n\n{cores_table(report)}\n\nDisk per GPU-day and per 1,000 GPUs a day: "
            f"bytes per row (pg_total_relation_size / rows after the run) x rows per GPU-day of a steady fleet "
            f"(integral rows, minute, hour, day ledgers: one row per workload and window; "
            f"batch GPUs: one per batch window), all but the integral rows measured as a fresh copy of their live rows, "
            f"which is what VACUUM FULL leaves (\"as the run left it\": dead rows of the rollup's rewrites included); WAL scaled by GPU-days:\n\n{disk_table(report)}\n\nMemory (peaks sampled "
            f"every {SAMPLE_EVERY_S} s; Postgres' shared_buffers come on top):\n\n{memory_table(report)}"
            f"{precision}{scaling}\n\n"
            f"{PLAN_GPUS:,} GPUs x {report.shape['workloads_per_gpu']} workloads, {plan_source}; retention as "
            f"assumed in bench/fleet.py PLAN_DAYS; Postgres' own RAM is planned in "
            f"docs/scaling.md:\n\n{plan_table(report)}\n\nPages after the run (median of the "
            f"timed runs; {fleet_seconds(report) // 60} minutes of data, so they say little about "
            f"pages at a month's scale: bench/web_pages.py measures that):\n\n{pages_table(report)}")


def render_section(report: Report) -> str:
    machine = "\n".join(f"- {k}: {v}" for k, v in report.machine.items())
    sh = report.shape
    problems = ("failed:\n\n" + "\n".join(f"- {p}" for p in report.problems) if report.problems else
                f"all passed: every {items_label(report.wire)[:-1]} sent is in the ledger (its workload-seconds and "
                "every integral, exactly), every batch rolled up, and per GPU-day charges + idle = card cost = "
                "price x GPU-seconds.")
    return f"""{SECTION_TITLE}

Measured {report.started} with

```
{report.command}
```

on a shared, noisy machine (other engineers' tests and benchmarks ran on the same cores and the
same Postgres server during the run; compare ratios within the run):

{machine}

Fleet: {sh['gpus']:,} A100-80GB GPUs on {-(-sh['gpus'] // sh['gpus_per_node']):,} nodes of {sh['gpus_per_node']},
{sh['workloads_per_gpu']} workloads per GPU, {sh['seconds'] // 60} simulated minutes, one wire {report.wire} batch
per node per {sh['batch_seconds']} s; {report.rollup_workers[0]} rollup worker process(es) in the headline rows. The load and what each
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
    return Report(data["command"], data["started"], data["machine"], data["shape"], data["rollup_workers"], settings,
                  data["wire"])


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
