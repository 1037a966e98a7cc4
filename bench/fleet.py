"""Fleet-scale benchmark (docs/scaling.md): a synthetic fleet, sending what agents send, through
HTTP ingest (gunicorn), the rollup (N worker processes) and a few pages, reported per 1,000 GPUs
in cores, disk and memory, and as wall seconds per fleet minute (the steady state); optionally
with coarser metering and what it costs in billing precision.

    python bench/fleet.py [--gpus 200] [--gpus-per-node 8] [--workloads-per-gpu 16] [--minutes 10]
                          [--meter-ms 1000 [5000 ...]] [--wire v2|v1] [--batch-seconds 60]
                          [--pod-minutes 5 360] [--agents 4] [--gunicorn-workers 3]
                          [--rollup-workers 1 [2 ...]] [--concurrent] [--real-time] [--rollup-every-s S]
                          [--rollup-batches N] [--parallel-query] [--page-runs 3] [--seed 14]
                          [--db-name NAME] [--keep-db] [--json-out FILE] [--from-json FILE] [--write-docs]

DATABASE_URL and REDIS_URL must be set. Nothing is written to DATABASE_URL's database: the
benchmark builds `<dbname>_fleet` on the same server (migrate, node tokens, a rate card, tenants,
two users, raw partitions), copies it to `<dbname>_fleettpl`, and starts every meter setting from
a fresh copy of that template, so the settings never see each other's rows. Both are dropped at
the end unless --keep-db.

The load. One synthetic fleet: --gpus A100-80GB GPUs on nodes of --gpus-per-node, each GPU shared
by --workloads-per-gpu workload slots (a container each), over the last --minutes minutes (ending
two minutes ago, so no window is in the future). Per workload and second (numpy, seeded, in the agent's 1/1024 units):
a granted share of the card that the allocator re-grants now and then (a new level about every
20 s), use below the grant most of the time, and short bursts above it (about one every two
minutes, 1-5 s, 1.2-1.5 x the grant: what the watchdog's grace period or dry-run enforcement lets
through). Σ granted stays under 0.66 of a card and Σ used under 0.99, so every batch is valid.

Each node's series are drawn on their own, seeded by (--seed, node), so a fleet of any size is built
one node at a time.

Pod churn. A slot's pods come and go: each lives --pod-minutes LOW HIGH minutes (default 5 to 360,
log-uniform: many short jobs, a few servers of hours; mean 83 minutes), and when one ends a new pod
(new name, UID and tenant) takes the slot in the same second, so the card's load, the series and
the workload-seconds are the same as without churn and only the identities change. The pod the run
finds in a slot is the one a steady fleet shows at a random moment (its lifetime length-biased, part
of it gone), so churn starts at its steady rate. Pods change on multiples of every --meter-ms
period (their least common multiple), so no sample spans two pods and every setting bills the same
pods. Lifetimes come from a random stream of their own: the series, the GPUs and each slot's first
pod are the same with churn or without, and --pod-minutes 0 0 (one pod per slot for the whole run)
sends the batches the bench sent before churn, byte for byte.

Metering and the wire. `--meter-ms M` is the agent's own option (agents/__main__.py `run
--meter-ms`, AgentConfig.meter_ms: the width of one usage sample, whole seconds from 1000 to
60000). The 1-second series is integrated into M/1000-second samples exactly as the agent's meter
does: integrals add, so a coarse sample is the sum of its seconds. Batches are the agent's: one
per node per --batch-seconds window (AgentConfig.batch_seconds, default 60), every GPU of the node
in it, gzipped as its spool does. `--wire` is the agent's option too: v2 (its default,
docs/protocol.md) sends one window per pod, GPU and UTC minute, the integrals of its samples, v1
every sample. v1 batches are rendered by the agent's agents.batch.render_batch from Sample objects;
v2 windows are summed from the arrays with numpy (v2_windows: what agents.batch.windows_of makes
of the same samples, to the bit) and rendered by the agent's agents.batch.render_windows, so a v2
body is byte for byte what render_batch would send (tests/bench/test_fleet_load.py) at about a
twentieth of the CPU (bench/README.md). Every body is built before timing, on a process per core.

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
2b. concurrent (--concurrent, 1-second setting): ingest and rollup at once, as production runs
   them, once per --rollup-workers count, each from a fresh copy of the template and before the
   alternating runs. The windows are posted back to back, as fast as answered, while each rollup
   worker calls rollup_usage once per beat (--rollup-every-s, default the service's
   VGPU_ROLLUP_EVERY_S; a call that outlasts the beat is followed at once by the next, as Celery
   runs the beats it queued), until a call that began after the last post finds nothing of its
   shard pending. Wall time runs from the first post to the return of the last call that rolled
   something up, and x real time is fleet seconds over it; while the fleet runs faster than real
   time, a beat of wall seconds covers more fleet time than in production, so each cycle is bigger
   and the rollup's fixed cost per cycle is spread thinner. --real-time posts on the fleet's clock
   instead: each window's batches spread evenly over its --batch-seconds (agents start at different
   moments, so their windows end, and they upload, all through the minute), so the beats cover
   what they cover in production; the run then lasts at least the fleet time, and what it reports
   is CPU and how long the last batch waited.
   CPU over the whole run: gunicorn, the rollup workers, and Postgres split by backend (the rollup
   workers' own backends, the rest of this database's and the auxiliaries as ingest's).
3. checks, after every run: every batch rolled up, none quarantined; samples (v1) or windows (v2)
   sent = accepted; their workload-seconds = every slot's seconds of the run = seconds in the
   minute and day ledgers; Σ of every integral in the minute ledger (used, granted, billed memory
   and SM·s, PCIe) = the metered series summed in 1/1024 units, exactly; every pod in the day
   ledger with exactly its own seconds, and no other pod; per GPU-day Σ charges + idle = card
   cost; card cost = price x GPU-seconds. The minute ledger is read in one place (minute_sums)
   and the day ledger per pod in one (day_by_pod), by value columns and the pod's UID.
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
7. precision (with more than one --meter-ms): each pod's charge (and billed MB·s, SM·s) from
   the day ledger, compared with the 1-second setting of the same load.
8. steady state: wall seconds of each batch window's ingest and rollup. The first window pays for
   cold caches and the first claim of every GPU; later ones should be flat.

Per 1,000 GPUs: CPU seconds per second of fleet time x 1000 / --gpus (the cores a fleet of 1,000
such GPUs keeps busy); bytes per GPU-day = bytes per row x rows per GPU-day of a steady fleet (a
run of minutes already holds whole hour and day rows, so bytes do not scale with its length; with
churn, a pod that starts inside a minute, hour or day adds a row of it: rows_per_gpu_day); WAL
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
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event as MpEvent

    from agents.batch import Sample, Window
    from agents.interfaces import Workload

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
# Pods live 5 minutes to 6 hours (log-uniform: mean 83 minutes), from short jobs to long-running servers.
POD_MINUTES = (5, 360)
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
    p.add_argument("--pod-minutes", type=int, nargs=2, default=list(POD_MINUTES), metavar=("LOW", "HIGH"),
                   help="pod churn: each workload slot's pods live LOW to HIGH minutes (log-uniform, seeded per "
                        "slot), and a new pod (new name and UID) takes the slot when one ends; 0 0: one pod per "
                        "slot for the whole run")
    p.add_argument("--agents", type=int, default=4, help="client threads posting the nodes' batches")
    p.add_argument("--gunicorn-workers", type=int, default=3, help="sync gunicorn workers")
    p.add_argument("--rollup-workers", type=int, nargs="+", default=[1],
                   help="rollup processes calling rollup_usage at once; the first count is the headline, and "
                        "with more counts the 1-second setting is run again with each, from a copy of the "
                        "template (one run compares them)")
    p.add_argument("--concurrent", action="store_true",
                   help="also run ingest and rollup at once, as production does (the windows posted back to back "
                        "while each rollup worker runs on the beat's cadence), with each --rollup-workers count, "
                        "each from a copy of the template")
    p.add_argument("--real-time", action="store_true",
                   help="in the concurrent runs, post on the fleet's clock (each window's batches spread evenly "
                        "over its --batch-seconds) instead of back to back, so each beat covers the fleet time it "
                        "covers in production; such a run lasts at least the fleet time")
    p.add_argument("--rollup-every-s", type=float, default=0.0,
                   help="the beat's cadence in the concurrent runs (default: the service's VGPU_ROLLUP_EVERY_S)")
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
    low, high = args.pod_minutes
    if (low, high) != (0, 0) and not 1 <= low <= high:
        p.error("--pod-minutes: 0 0 (no churn), or 1 <= LOW <= HIGH")
    return args


def make_shape(args: argparse.Namespace) -> Shape:
    """The fleet's shape. Pods change on multiples of every meter period (their least common
    multiple), so no sample spans two pods and every setting bills the same pods."""
    low, high = args.pod_minutes
    return Shape(args.gpus, args.gpus_per_node, args.workloads_per_gpu, args.minutes * 60, args.batch_seconds,
                 low, high, math.lcm(*(ms // 1000 for ms in args.meter_ms)))


@dataclass(frozen=True)
class Shape:
    gpus: int
    gpus_per_node: int
    workloads_per_gpu: int
    seconds: int
    batch_seconds: int
    # Pod churn: each workload slot's pods live between these many minutes (log-uniform); 0 and 0:
    # one pod per slot for the whole run. Pods start and end on multiples of pod_grid_s seconds.
    pod_minutes_low: int = 0
    pod_minutes_high: int = 0
    pod_grid_s: int = 1

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
    """One node's integrals per (GPU, workload slot, second) in 1/1024 units (int64 arrays G x W x S),
    and the pods each slot held: per slot, the second each pod started (the first at 0) and its names."""

    gpu_uuids: list[str]
    starts: list[list[list[int]]]  # [gpu][slot] -> each pod's first second, ascending, starting at 0
    names: list[list[list[dict[str, str]]]]  # [gpu][slot][pod] -> tenant, namespace, pod, container, pod_uid, sla_tier
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

    def pod_index(self, period_s: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Per (GPU, slot, `period_s`-second sample): which of the slot's pods it meters. Pods change
        on multiples of the grid, which every meter period divides, so no sample spans two pods."""
        g, w, s = self.mem_used.shape
        sample_starts = np.arange(s // period_s) * period_s
        out = np.empty((g, w, s // period_s), dtype=np.int64)
        for i in range(g):
            for j in range(w):
                out[i, j] = np.searchsorted(self.starts[i][j], sample_starts, side="right") - 1
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


def _pod_names(rng: random.Random) -> dict[str, str]:
    """A new pod's names: a tenant, one of its namespaces, a pod named after its app, a fresh UID."""
    tenant, app = rng.choice(TENANTS), rng.choice(APPS)
    return {
        "tenant": tenant, "namespace": f"{tenant}-{rng.choice(('prod', 'research'))}",
        "pod": f"{app}-{rng.getrandbits(40):010x}", "container": rng.choice(("server", "trainer")),
        "pod_uid": str(uuid.UUID(int=rng.getrandbits(128))), "sla_tier": rng.choice(TIERS)[0],
    }


def _pod_starts(rng: random.Random, shape: Shape) -> list[int]:
    """The seconds at which a slot's pods start: 0, then each time the pod before it ends. A new pod
    takes the slot in the second its predecessor leaves it, so the card's load is the same with or
    without churn and only the identities change. Lifetimes are log-uniform in [low, high] minutes
    (many short jobs, a few pods of hours); the pod the run finds running is the one a steady fleet
    would show at a random moment: its lifetime length-biased (for a log-uniform law, uniform in
    [low, high]) and a uniform part of it already gone."""
    if not shape.pod_minutes_high:
        return [0]
    low, high, grid = shape.pod_minutes_low * 60, shape.pod_minutes_high * 60, shape.pod_grid_s

    def on_grid(seconds: float) -> int:
        return max(grid, round(seconds / grid) * grid)

    starts, end = [0], on_grid(rng.uniform(low, high) * (1.0 - rng.random()))
    while end < shape.seconds:
        starts.append(end)
        end += on_grid(low * math.exp(rng.uniform(0.0, math.log(high / low))))
    return starts


def make_load(shape: Shape, seed: int, node: int) -> Load:
    """The load of one node's GPUs, seeded by (seed, node): each node's series is drawn on its own,
    so a fleet of any size is built one node at a time (10,000 GPUs x 16 workloads x 5 minutes
    would be 2 GB per series at once) and every meter setting redraws the same load. The pods that
    follow each slot's first come from a stream of their own, so the series, the GPUs and the first
    pods are the same with churn or without."""
    rng = np.random.default_rng([seed, node])
    names_rng, churn_rng = random.Random(f"{seed}/{node}"), random.Random(f"{seed}/{node}/churn")
    g, w, s = len(shape.node_gpus(node)), shape.workloads_per_gpu, shape.seconds
    dims = (g, w, s)
    base = rng.uniform(0.5, 1.0, (g, w))
    base = (base / base.sum(axis=1, keepdims=True) * GRANTED_FRACTION)[..., None]
    granted_mem = base * _piecewise(rng, dims, REGRANT_EVERY_S, *REGRANT_RANGE)
    granted_sm = base * _piecewise(rng, dims, REGRANT_EVERY_S, *REGRANT_RANGE)
    first = [[_pod_names(names_rng) for _ in range(w)] for _ in range(g)]
    starts = [[_pod_starts(churn_rng, shape) for _ in range(w)] for _ in range(g)]
    names = [[[pod, *(_pod_names(churn_rng) for _ in slot[1:])] for pod, slot in zip(gpu_first, gpu_starts, strict=True)]
             for gpu_first, gpu_starts in zip(first, starts, strict=True)]
    mem, sms = float(A100["memory_mb"]), float(A100["sm_count"])
    return Load(
        gpu_uuids=[f"GPU-{uuid.UUID(int=names_rng.getrandbits(128))}" for _ in range(g)],
        starts=starts,
        names=names,
        mem_used=_quanta(_use(rng, granted_mem) * mem),
        mem_granted=_quanta(granted_mem * mem),
        sm_used=_quanta(_use(rng, granted_sm) * sms),
        sm_granted=_quanta(granted_sm * sms),
        pcie=_quanta(rng.uniform(0.0, PCIE_MB_PER_S, dims)),
    )


# --------------------------------------------------------------------------------------------
# The agents' batches: v2 windows summed from the arrays and rendered by the agent's own code
# (agents/batch.py render_windows); v1 samples rendered by agents.batch.render_batch

# The integrals the minute ledger must hold, in 1/1024 units: what was metered, summed (the billed
# maxima are the store's mem_max_mb_s and sm_max_s).
INTEGRALS = ("mem_used_mb_s", "mem_granted_mb_s", "mem_max_mb_s", "sm_used_s", "sm_granted_s", "sm_max_s",
             "pcie_mb")
PodKey = tuple[str, str]  # (gpu_uuid, pod_uid)


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
    pod_seconds: dict[PodKey, int] = field(default_factory=dict)  # every pod's metered seconds

    def add(self, coarse: dict[str, np.ndarray[Any, np.dtype[np.int64]]], period_s: int) -> None:
        """One node's metered series: each period is a sample, billed = max(used, granted) per sample."""
        self.workload_seconds += int(coarse["mem_used"].size) * period_s
        for name, series in (("mem_used_mb_s", coarse["mem_used"]), ("mem_granted_mb_s", coarse["mem_granted"]),
                             ("mem_max_mb_s", np.maximum(coarse["mem_used"], coarse["mem_granted"])),
                             ("sm_used_s", coarse["sm_used"]), ("sm_granted_s", coarse["sm_granted"]),
                             ("sm_max_s", np.maximum(coarse["sm_used"], coarse["sm_granted"])),
                             ("pcie_mb", coarse["pcie"])):
            self.quanta[name] += int(series.sum())

    def add_pods(self, load: Load, seconds: int) -> None:
        for uuid_, gpu_starts, gpu_names in zip(load.gpu_uuids, load.starts, load.names, strict=True):
            for starts, pods in zip(gpu_starts, gpu_names, strict=True):
                for begin, end, names in zip(starts, [*starts[1:], seconds], pods, strict=True):
                    self.pod_seconds[(uuid_, names["pod_uid"])] = end - begin

    def merge(self, other: Sent) -> None:
        self.items += other.items
        self.workload_seconds += other.workload_seconds
        for name, quanta in other.quanta.items():
            self.quanta[name] += quanta
        self.pod_seconds |= other.pod_seconds


def _workloads(load: Load) -> list[list[list[Workload]]]:
    from agents.interfaces import Workload

    return [[[Workload(tenant=n["tenant"], namespace=n["namespace"], pod=n["pod"], container=n["container"],
                       pod_uid=n["pod_uid"], sla_tier=n["sla_tier"]) for n in pods] for pods in gpu]
            for gpu in load.names]


def v2_windows(load: Load, shape: Shape, *, start: datetime, period_s: int) -> list[list[Window]]:
    """Per batch window, what agents.batch.windows_of makes of its samples, summed with numpy: one
    window per (UTC minute, GPU, pod) of consecutive samples, in windows_of's order (first sample,
    GPU, workload key). Exactly the same floats: integrals are multiples of 1/1024 far below 2^53, so
    an int64 sum divided by 1024 is the float sum, and a peak is the largest sample's integral / its
    seconds either way (division by a positive number keeps the order). Python summing Sample
    objects cost 17 µs per sample (11.7 minutes for 6,250 node-batches); this, a few µs per window."""
    from agents.batch import Window

    coarse, pods = load.coarsened(period_s), load.pod_index(period_s)
    g, w, n = pods.shape
    k = np.arange(n)
    batch_of, minute_of = k * period_s // shape.batch_seconds, k * period_s // 60
    # A window starts where the minute, the batch window or the slot's pod changes.
    cut = np.zeros((g, w, n), dtype=bool)
    cut[..., 0] = True
    cut[..., 1:] = ((batch_of[1:] != batch_of[:-1]) | (minute_of[1:] != minute_of[:-1])) | (pods[..., 1:] != pods[..., :-1])
    at = np.flatnonzero(cut)

    def sums(a: np.ndarray[Any, Any]) -> list[float]:
        out: list[float] = (np.add.reduceat(a.ravel(), at) / Q).tolist()
        return out

    def peak(a: np.ndarray[Any, Any]) -> list[float]:
        out: list[float] = (np.maximum.reduceat(a.ravel(), at) / Q / period_s).tolist()
        return out

    columns = zip(
        (at // (w * n)).tolist(), (at // n % w).tolist(), (at % n).tolist(), pods.ravel()[at].tolist(),
        (np.diff(np.append(at, g * w * n)) * period_s).tolist(),
        sums(coarse["mem_used"]), sums(coarse["mem_granted"]),
        sums(np.maximum(coarse["mem_used"], coarse["mem_granted"])),
        sums(coarse["sm_used"]), sums(coarse["sm_granted"]), sums(np.maximum(coarse["sm_used"], coarse["sm_granted"])),
        sums(coarse["pcie"]), peak(coarse["mem_used"]), peak(coarse["sm_used"]), strict=True)
    workloads = _workloads(load)
    per_batch: list[list[tuple[int, str, str, Window]]] = [[] for _ in range(shape.windows)]
    for gi, wi, k0, pod, seconds, mu, mg, mb, su, sg, sb, pcie, mpeak, speak in columns:
        workload, gpu = workloads[gi][wi][pod], load.gpu_uuids[gi]
        window = Window(minute=start + timedelta(minutes=int(minute_of[k0])), gpu=gpu, workload=workload,
                        seconds=seconds, mem_used_mb_s=mu, mem_granted_mb_s=mg, mem_billed_mb_s=mb, sm_used_s=su,
                        sm_granted_s=sg, sm_billed_s=sb, pcie_mb=pcie, mem_peak_mb=mpeak, sm_peak=speak)
        per_batch[int(batch_of[k0])].append((k0, gpu, workload.key, window))
    return [[x[3] for x in sorted(ws, key=lambda x: x[:3])] for ws in per_batch]


def v1_samples(load: Load, shape: Shape, *, start: datetime, period_s: int) -> list[list[Sample]]:
    """Per batch window, the samples the agent's meter closes: one per GPU, slot and period, billed to
    the pod the slot held."""
    from agents.batch import Sample

    coarse, pods = load.coarsened(period_s), load.pod_index(period_s).tolist()
    # Per (GPU, slot): its five series as Python floats in agent units (exact: multiples of 1/1024
    # far below 2^53), one node's worth (the whole fleet's would be GBs).
    series = [(coarse[name] / Q).tolist() for name in ("mem_used", "mem_granted", "sm_used", "sm_granted", "pcie")]
    workloads, per_window = _workloads(load), shape.batch_seconds // period_s
    starts = [start + timedelta(seconds=k * period_s) for k in range(shape.seconds // period_s)]
    return [[Sample(starts[k], period_s, gpu, workloads[i][j][pods[i][j][k]], *(x[i][j][k] for x in series))
             for k in range(window * per_window, (window + 1) * per_window)
             for i, gpu in enumerate(load.gpu_uuids) for j in range(len(workloads[i]))]
            for window in range(shape.windows)]


def node_batches(shape: Shape, seed: int, node: int, *, start: datetime, period_s: int,
                 wire: str) -> tuple[list[Batch], Sent]:
    """One node's batches in time order, as the agent renders them: v2 windows through
    agents.batch.render_windows (the windows summed by `v2_windows`), v1 samples through
    agents.batch.render_batch; gzipped as its spool does."""
    from agents.batch import render_batch, render_windows
    from agents.interfaces import GpuInfo

    load = make_load(shape, seed, node)
    sent = Sent()
    sent.add(load.coarsened(period_s), period_s)
    sent.add_pods(load, shape.seconds)
    gpus = [GpuInfo(uuid=u, model=str(A100["model"]), memory_mb=int(A100["memory_mb"]), sm_count=int(A100["sm_count"]))
            for u in load.gpu_uuids]
    batches = []
    if wire == "v2":
        contents: list[list[Any]] = list(v2_windows(load, shape, start=start, period_s=period_s))
    else:
        contents = list(v1_samples(load, shape, start=start, period_s=period_s))
    for window, items in enumerate(contents):
        w_start = start + timedelta(seconds=window * shape.batch_seconds)
        w_end = w_start + timedelta(seconds=shape.batch_seconds)
        body = (render_windows(node=node_name(node), batch_seq=window + 1, window_start=w_start, window_end=w_end,
                               gpus=gpus, windows=items) if wire == "v2"
                else render_batch(node=node_name(node), batch_seq=window + 1, window_start=w_start, window_end=w_end,
                                  gpus=gpus, samples=items, wire=wire))
        batches.append(Batch(node, window + 1, len(items), gzip.compress(body, mtime=0)))
    sent.items = sum(b.items for b in batches)
    return batches, sent


def _node_batches(job: tuple[Shape, int, int, datetime, int, str]) -> tuple[list[Batch], Sent]:
    shape, seed, node, start, period_s, wire = job
    return node_batches(shape, seed, node, start=start, period_s=period_s, wire=wire)


def build_batches(shape: Shape, seed: int, *, start: datetime, period_s: int,
                  wire: str) -> tuple[list[list[Batch]], Sent]:
    """Every node's batches, before anything is timed, one node per task on a process per core.
    Kept in memory: at v2 a node-minute is about 13 KB of gzip."""
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


def _post_all(port: int, work: list[tuple[str, Batch]], result: PosterResult, spread: tuple[float, float]) -> None:
    """One client thread: its nodes' batches of one window, on one keep-alive connection; with a
    spread (start, seconds), the j-th of n batches no earlier than start + j x seconds / n."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        for j, (token, batch) in enumerate(work):
            if spread[1]:
                time.sleep(max(0.0, spread[0] + j * spread[1] / len(work) - time.time()))
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


def ingest_window(port: int, work: list[list[tuple[str, Batch]]],
                  spread: tuple[float, float] = (0.0, 0.0)) -> list[PosterResult]:
    """One window's batches, each client thread posting its nodes' as fast as answered or, with a
    spread (start, seconds), evenly over those seconds from that Unix time."""
    results = [PosterResult() for _ in work]
    threads = [threading.Thread(target=_post_all, args=(port, w, r, spread), daemon=True)
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
    backend_pid: int = 0  # its Postgres backend, kept for the run: the rollup's share of Postgres' CPU
    last_rolled_at: float = 0.0  # Unix time its last call that rolled something up returned

    def plus(self, other: WorkerReport) -> WorkerReport:
        """This worker's windows so far and one more."""
        return WorkerReport(self.cycles + other.cycles, self.skipped + other.skipped, self.batches + other.batches,
                            self.gpu_minutes + other.gpu_minutes, self.quarantined + other.quarantined,
                            self.busy_s + other.busy_s, self.cpu_s + other.cpu_s, max(self.max_rss, other.max_rss),
                            self.error or other.error, self.backend_pid or other.backend_pid,
                            max(self.last_rolled_at, other.last_rolled_at))


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class _Calls:
    """One worker's rollup_usage calls, counted as WorkerReport counts them."""

    cycles: int = 0
    skipped: int = 0
    batches: int = 0
    minutes: int = 0
    quarantined: int = 0
    busy: float = 0.0
    last_rolled_at: float = 0.0
    cpu_at_start: float = field(default_factory=_cpu_self)

    def call(self, shard: tuple[int, int], max_batches: int) -> Any:
        """One call, as the service's shard task makes it; a call can roll some nodes up and find
        others held (skipped): what it did counts."""
        from billing.ledger.rollup import rollup_usage

        began = time.perf_counter()
        result = rollup_usage(now=datetime.now(UTC), shard=shard[0], shards=shard[1], max_batches=max_batches)
        if result.batches or result.quarantined:
            self.busy += time.perf_counter() - began
            self.last_rolled_at = time.time()  # compared across processes: the wall clock, not perf_counter
            self.cycles, self.batches = self.cycles + 1, self.batches + result.batches
            self.minutes, self.quarantined = self.minutes + result.gpu_minutes, self.quarantined + result.quarantined
        self.skipped += bool(result.skipped)
        return result

    def report(self) -> WorkerReport:
        return WorkerReport(self.cycles, self.skipped, self.batches, self.minutes, self.quarantined, self.busy,
                            _cpu_self() - self.cpu_at_start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                            last_rolled_at=self.last_rolled_at)


def _roll_up_pending(shard: tuple[int, int], max_batches: int) -> WorkerReport:
    """rollup_usage on the shard until nothing of it is pending (one window's batches); a call
    answered skipped=True sleeps SKIPPED_RETRY_S and tries again."""
    calls = _Calls()
    while True:
        result = calls.call(shard, max_batches)
        if result.skipped:
            time.sleep(SKIPPED_RETRY_S)
        elif result.batches == 0 and result.quarantined == 0:
            return calls.report()


def _roll_up_on_beats(shard: tuple[int, int], max_batches: int, every_s: float,
                      ingest_done: MpEvent) -> WorkerReport:
    """One call per beat, every `every_s` seconds, as the beat's shard tasks run while batches
    arrive; a call that outlasts the beat is followed at once by the next (Celery queues the beats it
    missed). Ends with the first call that began after ingest ended and found nothing of its shard
    pending: every batch was stored before that call's snapshot."""
    calls, beat = _Calls(), time.monotonic()
    while True:
        time.sleep(max(0.0, beat - time.monotonic()))
        beat += every_s
        last = ingest_done.is_set()
        result = calls.call(shard, max_batches)
        if last and not result.skipped and result.batches == 0 and result.quarantined == 0:
            return calls.report()


def _idle(error: str = "") -> WorkerReport:
    return WorkerReport(0, 0, 0, 0, 0, 0.0, 0.0, 0, error)


def rollup_worker(env: dict[str, str], shard: tuple[int, int], max_batches: int, every_s: float,
                  ingest_done: MpEvent, commands: multiprocessing.Queue[str],
                  reports: multiprocessing.Queue[WorkerReport]) -> None:
    """One rollup process for the whole run: its own Django connection, rolling up its shard (k of
    N, as the service's shard tasks do: the nodes with node_id % N == k) each time it is told to:
    "pending", until nothing of it is pending; "beats", on the beat's cadence until ingest is done
    and nothing is pending. The connection stays open between windows, as a long-running worker's
    does, and until the end: a backend that exits takes its CPU time out of /proc before the
    parent's last snapshot. It answers every command, failed or not, so the parent never waits in
    vain; an error fails the run."""
    error, backend_pid = "", 0
    try:
        setup_django(env)
        from django.db import connection

        with connection.cursor() as cur:  # connected before the first window, as a long-running worker is
            cur.execute("SELECT pg_backend_pid()")
            backend_pid = int(cur.fetchone()[0])
    except Exception as exc:  # noqa: BLE001 - reported by the parent, which fails the run
        error = f"{type(exc).__name__}: {exc}"
    reports.put(replace(_idle(error), backend_pid=backend_pid))  # ready
    while command := commands.get():
        try:
            if error:
                reports.put(_idle(error))
            elif command == "beats":
                reports.put(_roll_up_on_beats(shard, max_batches, every_s, ingest_done))
            else:
                reports.put(_roll_up_pending(shard, max_batches))
        except Exception as exc:  # noqa: BLE001 - reported by the parent, which fails the run
            reports.put(_idle(f"{type(exc).__name__}: {exc}"))


class RollupWorkers:
    """N rollup processes that roll up on request, each reporting per request."""

    def __init__(self, env: dict[str, str], workers: int, max_batches: int, every_s: float = 0.0) -> None:
        ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no Django state or sockets inherited
        self.ingest_done = ctx.Event()
        self._commands: list[multiprocessing.Queue[str]] = [ctx.Queue() for _ in range(workers)]
        self._reports: list[multiprocessing.Queue[WorkerReport]] = [ctx.Queue() for _ in range(workers)]
        self._procs = [ctx.Process(target=rollup_worker,
                                   args=(env, (k, workers), max_batches, every_s, self.ingest_done, c, r))
                       for k, (c, r) in enumerate(zip(self._commands, self._reports, strict=True))]
        for proc in self._procs:
            proc.start()
        # Every worker connected before the first window; a start-up error stays in its totals.
        self.totals = [r.get(timeout=300) for r in self._reports]

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid]

    def backend_pids(self) -> set[int]:
        return {w.backend_pid for w in self.totals if w.backend_pid}

    def roll_up(self) -> float:
        """Every worker rolls its shard up until nothing is pending; returns when all have, with the
        CPU seconds the workers used."""
        self.start("pending")
        return self.wait()

    def start(self, command: str) -> None:
        for q in self._commands:
            q.put(command)

    def wait(self) -> float:
        """Until every worker has answered its command; the CPU seconds they used for it."""
        reports = [r.get(timeout=3600) for r in self._reports]
        self.totals = [total.plus(r) for total, r in zip(self.totals, reports, strict=True)]
        return sum(r.cpu_s for r in reports)

    def close(self) -> None:
        for q in self._commands:
            q.put("")
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


def _by_window(tokens: dict[str, str], batches: list[list[Batch]], shape: Shape,
               agents: int) -> list[list[list[tuple[str, Batch]]]]:
    """Per batch window, per client thread: the (token, batch) it posts, nodes dealt round the threads."""
    by_window: list[list[list[tuple[str, Batch]]]] = [[[] for _ in range(agents)] for _ in range(shape.windows)]
    for node, node_batches in enumerate(batches):
        for window, batch in enumerate(node_batches):
            by_window[window][node % agents].append((tokens[node_name(node)], batch))
    return by_window


@dataclass(frozen=True)
class Posted:
    """What the client threads' posts came to."""

    batches: int
    accepted: int
    errors: list[str]
    latency_p50_ms: float
    latency_p99_ms: float

    @classmethod
    def of(cls, results: list[PosterResult]) -> Posted:
        latencies = sorted(x for r in results for x in r.latencies)
        return cls(sum(r.batches for r in results), sum(r.accepted for r in results),
                   [e for r in results for e in r.errors],
                   1000 * statistics.median(latencies) if latencies else 0.0,
                   1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else 0.0)


def run_fleet(env: dict[str, str], database: str, tokens: dict[str, str], batches: list[list[Batch]],
              args: argparse.Namespace, shape: Shape, workers: int, max_batches: int) -> tuple[IngestRun, RollupRun]:
    """Batch window by batch window: every node's batch of the window posted over HTTP (ingest),
    then rolled up by the rollup workers (rollup); each phase timed and its CPU read from /proc on
    its own, so the two never share a measurement."""
    results: list[PosterResult] = []
    ingest, roll = _Phase(), _Phase()
    with gunicorn(env, ServerConfig("sync", args.gunicorn_workers, 1)) as server:
        _wait_ready(server.port)
        pool = RollupWorkers(env, workers, max_batches)
        try:
            with MemorySampler(database, lambda: _children(server.proc.pid) + pool.pids()) as memory:
                for window, work in enumerate(_by_window(tokens, batches, shape, args.agents)):
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
    posted = Posted.of(results)
    rollup_pids = set(pool.pids())
    ingest_run = IngestRun(
        wall_s=ingest.wall, batches=posted.batches, accepted=posted.accepted,
        sent=sum(b.items for node in batches for b in node), errors=posted.errors, window_s=ingest.windows,
        latency_p50_ms=posted.latency_p50_ms, latency_p99_ms=posted.latency_p99_ms,
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


@dataclass(frozen=True)
class ConcurrentRun:
    """Ingest and rollup at once, as production runs them: the windows posted back to back, as fast
    as answered, while each rollup worker calls rollup_usage on the beat's cadence; done when the
    last batch is rolled up. Postgres' CPU is split by backend: the rollup workers' own backends,
    and the rest of this database's (gunicorn's, and the auxiliary processes) as ingest's."""

    workers: list[WorkerReport]
    rollup_every_s: float
    max_batches: int
    real_time: bool  # windows posted on the fleet's clock (--real-time), not back to back
    wall_s: float  # first post to the return of the last call that rolled something up
    ingest_s: float  # first post to the last answer
    window_s: list[float]  # wall seconds of each batch window's posts
    batches: int
    accepted: int
    errors: list[str]
    latency_p50_ms: float
    latency_p99_ms: float
    cpu_gunicorn_s: float
    cpu_postgres_ingest_s: float
    cpu_workers_s: float
    cpu_postgres_rollup_s: float
    cpu_client_s: float
    machine_busy_s: float | None
    cpu_span_s: float  # first post to the end of the call that found nothing left: what the CPU figures cover

    @property
    def cpu_service_s(self) -> float:
        return self.cpu_gunicorn_s + self.cpu_postgres_ingest_s + self.cpu_workers_s + self.cpu_postgres_rollup_s


def run_concurrent(env: dict[str, str], database: str, tokens: dict[str, str], batches: list[list[Batch]],
                   args: argparse.Namespace, shape: Shape, workers: int, max_batches: int,
                   every_s: float) -> ConcurrentRun:
    """The windows posted back to back while the rollup workers run on their beats (ConcurrentRun)."""
    results: list[PosterResult] = []
    windows: list[float] = []
    with gunicorn(env, ServerConfig("sync", args.gunicorn_workers, 1)) as server:
        _wait_ready(server.port)
        pool = RollupWorkers(env, workers, max_batches, every_s)
        try:
            before, started = CpuSnapshot.take(database, server.proc.pid), time.time()
            pool.start("beats")
            for window, work in enumerate(_by_window(tokens, batches, shape, args.agents)):
                # With --real-time, spread over the window's fleet time: agents start at different
                # moments, so their batch windows end, and they upload, all through the minute.
                spread = (started + window * shape.batch_seconds, float(shape.batch_seconds) if args.real_time else 0.0)
                began = time.perf_counter()
                results += ingest_window(server.port, work, spread)
                windows.append(time.perf_counter() - began)
                log(f"  window {window + 1}/{shape.windows}: ingest {windows[-1]:.1f} s")
            ingested = time.time()
            pool.ingest_done.set()
            workers_cpu = pool.wait()
            after, measured = CpuSnapshot.take(database, server.proc.pid), time.time()
        finally:
            pool.close()
    # Done when the last batch was rolled up, not when the next beat found nothing more to do.
    rolled = max(w.last_rolled_at for w in pool.totals)
    cpu, rollup_backends = CpuUse.between(before, after), pool.backend_pids()
    postgres_rollup = sum(after.postgres.get(pid, 0.0) - before.postgres.get(pid, 0.0) for pid in rollup_backends)
    posted = Posted.of(results)
    log(f"  ingest {ingested - started:.1f} s, last batch rolled up {rolled - ingested:.1f} s later")
    return ConcurrentRun(pool.totals, every_s, max_batches, args.real_time, rolled - started, ingested - started, windows,
                         posted.batches, posted.accepted, posted.errors, posted.latency_p50_ms, posted.latency_p99_ms,
                         cpu.gunicorn, (cpu.postgres or 0.0) - postgres_rollup, workers_cpu, postgres_rollup,
                         cpu.client, cpu.busy, measured - started)


# --------------------------------------------------------------------------------------------
# Checks, disk and precision: ledger reads through the ORM (models looked up by name, so this
# keeps working wherever billing.ledger keeps them) and catalog sizes. The minute ledger is read in
# one place (minute_sums) and the day ledger per pod in one (day_by_pod), both by value columns
# and the pod's UID: what they are keyed by can change without this file.


def _model(name: str) -> Any:
    from django.apps import apps

    return apps.get_model("billing", name)


LEDGER_MODELS = ("UsageBatch", "BatchGpu", "UsageMinute", "GpuMinute", "Workload", "WorkloadMeta", "UsageHour", "GpuHour",
                 "UsageDay", "GpuDay", "UsageMonth")


def minute_sums() -> dict[str, Decimal]:
    """Σ over the minute ledger's usage rows: seconds, charge and every integral."""
    from django.db.models import Sum

    sums = _model("UsageMinute").objects.aggregate(**{n: Sum(n) for n in ("seconds", "charge", *INTEGRALS)})
    return {name: Decimal(value or 0) for name, value in sums.items()}


@dataclass(frozen=True)
class PodTotals:
    seconds: int
    charge: Decimal
    mem_billed_mb_s: Decimal
    sm_billed_s: Decimal


def day_by_pod() -> dict[PodKey, PodTotals]:
    """Every pod's seconds, charge and billed MB·s and SM·s over the run, from the day ledger."""
    from django.db.models import Sum

    rows = (_model("UsageDay").objects.values("gpu_uuid", "pod_uid").order_by()
            .annotate(t=Sum("seconds"), c=Sum("charge"), m=Sum("mem_billed_mb_s"), s=Sum("sm_billed_s")))
    return {(r["gpu_uuid"], r["pod_uid"]): PodTotals(int(r["t"]), r["c"], r["m"], r["s"]) for r in rows}


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


def accounting(price_per_gpu_hour: Decimal, minutes: dict[str, Decimal]) -> Accounting:
    from django.db.models import Sum

    batch = _model("UsageBatch").objects
    usage_day = _model("UsageDay").objects.aggregate(s=Sum("seconds"), c=Sum("charge"))
    gpu_day = _model("GpuDay").objects.aggregate(cost=Sum("card_cost"), idle=Sum("idle_cost"),
                                                 secs=Sum("metered_seconds"))
    gpu_seconds = Decimal(gpu_day["secs"] or 0)
    return Accounting(
        pending_batches=batch.filter(rolled_up_at__isnull=True, quarantined_at__isnull=True).count(),
        quarantined_batches=batch.filter(quarantined_at__isnull=False).count(),
        seconds_in_minutes=minutes["seconds"], seconds_in_days=Decimal(usage_day["s"] or 0),
        card_cost=Decimal(gpu_day["cost"] or 0), charges=Decimal(usage_day["c"] or 0), idle=Decimal(gpu_day["idle"] or 0),
        gpu_seconds=gpu_seconds, expected_card_cost=price_per_gpu_hour * gpu_seconds / 3600,
        charges_in_minutes=minutes["charge"],
    )


def check(acc: Accounting, errors: list[str], accepted: int, sent: Sent, shape: Shape) -> list[str]:
    """What must hold for the numbers to mean anything (every item a failure)."""
    tolerance = Decimal("1e-6")  # money: ledger rows carry 12 decimals, sums over ~10^6 rows
    problems = []
    if errors:
        problems.append(f"{len(errors)} batches not stored, e.g. {errors[0]}")
    if accepted != sent.items:
        problems.append(f"samples or windows sent {sent.items:,} != accepted {accepted:,}")
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


def integral_problems(sent: Sent, minutes: dict[str, Decimal]) -> list[str]:
    """Every integral the batches carried is in the minute ledger exactly: Σ used, granted and billed
    memory and SM·s and PCIe MB, against the metered series summed in the agent's 1/1024 units
    (billed = Σ per sample of max(used, granted), the `max` basis' integral)."""
    return [f"minute ledger holds {name} = {minutes[name]}, sent {Decimal(quanta) / Q}"
            for name, quanta in sent.quanta.items() if minutes[name] != Decimal(quanta) / Q]


def pod_problems(sent: Sent, pods: dict[PodKey, PodTotals]) -> list[str]:
    """Every pod sent is in the day ledger with exactly its seconds, and no other: with churn, the
    pods that ended and the ones that took their slots, each billed for its own part of the run."""
    wrong = [k for k, seconds in sent.pod_seconds.items() if k not in pods or pods[k].seconds != seconds]
    extra = set(pods) - set(sent.pod_seconds)
    if not wrong and not extra:
        return []
    example = wrong[0] if wrong else next(iter(extra))
    return [f"{len(wrong)} of {len(sent.pod_seconds):,} pods sent are missing or hold other seconds in the day "
            f"ledger and {len(extra)} are not sent, e.g. {example}: sent {sent.pod_seconds.get(example)}, "
            f"ledger {pods[example].seconds if example in pods else None}"]


def _stored_table(model: str) -> str:
    """Where a ledger model's rows are stored: the minute models read views over the minute store."""
    from billing.ledger.partitions import MINUTE_TABLES

    return dict(zip(("UsageMinute", "GpuMinute"), MINUTE_TABLES, strict=True)).get(model) or _model(model)._meta.db_table


def table_bytes(database_url: str) -> dict[str, int]:
    """Bytes on disk (heap, indexes, TOAST; every partition) of each ledger table."""
    from billing.ledger.partitions import RAW_TABLE

    tables = {"integral rows": RAW_TABLE, **{m: _stored_table(m) for m in LEDGER_MODELS}}
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
                table = _stored_table(m)
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


def pod_starts_per_slot_day(shape: dict[str, int]) -> float:
    """Pods a workload slot starts a day in a steady fleet: a day over the mean lifetime (for a
    log-uniform law in [low, high], (high - low) / ln(high / low)); 0 without churn."""
    low, high = shape.get("pod_minutes_low", 0), shape.get("pod_minutes_high", 0)
    if not high:
        return 0.0
    mean_minutes = low if high == low else (high - low) / math.log(high / low)
    return 1440 / mean_minutes


MONTH_DAYS = 365.25 / 12  # a mean month


def rows_per_gpu_day(shape: dict[str, int]) -> dict[str, float]:
    """Rows each table gains per GPU and day in a steady fleet: the minute, hour and day ledgers have
    one row per workload and window, however short the run was, and one more for each pod that starts
    inside a window (the slot's old pod has a row of the window too); a pod starts on a multiple of
    pod_grid_s, so at a window's edge in grid / lcm(grid, window) of the cases. Integral rows: one per
    batch, workload, GPU and UTC minute, whatever the meter or the wire (ingest sums v1 samples per
    minute), so one per workload-minute with minute batches. Workloads (the minute store's names):
    one per pod started, and so are the pods' metadata rows (WorkloadMeta: one per pod and node, upserted by
    every batch, never pruned). Months: kept for good like days, one row per pod and GPU and month."""
    w, per_node, batch_s = shape["workloads_per_gpu"], shape["gpus_per_node"], shape["batch_seconds"]
    starts, grid = w * pod_starts_per_slot_day(shape), shape.get("pod_grid_s", 1)

    def inside(window_s: int) -> float:
        return starts * (1 - grid / math.lcm(grid, window_s))

    batches = 86400 / batch_s
    return {"integral rows": w * 86400 * max(1, batch_s // 60) / batch_s + inside(60),
            "UsageBatch": batches / per_node, "BatchGpu": batches,
            "UsageMinute": 1440.0 * w + inside(60), "GpuMinute": 1440.0, "Workload": starts, "WorkloadMeta": starts,
            "UsageHour": 24.0 * w + inside(3600),
            "GpuHour": 24.0, "UsageDay": float(w) + inside(86400), "GpuDay": 1.0,
            # A month is no fixed length: a slot's pod of the month, and a row for each pod that starts
            # (any start but the month's first instant; none falls on it in a day's worth).
            "UsageMonth": w / MONTH_DAYS + starts}


def close_days_of_run(end: datetime) -> None:
    """Month rows hold closed days only (billing.ledger.months): close the run's days as the next
    midnight's first rollup would, so that the month ledger is measured with the others."""
    from billing.ledger.months import close_days

    began = time.perf_counter()
    closed = close_days(now=end + timedelta(days=1))
    log(f"  closed {closed} day(s) into the month ledger in {time.perf_counter() - began:.1f} s")


def wal_lsn(database_url: str) -> int:
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")
            return int(cur.fetchone()[0])
    finally:
        conn.close()


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


def precision(fine: dict[PodKey, PodTotals], coarse: dict[PodKey, PodTotals]) -> Precision:
    if set(fine) != set(coarse):
        raise RuntimeError(f"workloads differ between settings: {len(set(fine) ^ set(coarse))} keys")

    def rel(value: Callable[[PodTotals], Decimal]) -> list[float]:
        return [float((value(coarse[k]) - value(f)) / value(f)) for k, f in fine.items() if value(f)]

    charges = rel(lambda t: t.charge)
    total_fine, total_coarse = sum(v.charge for v in fine.values()), sum(v.charge for v in coarse.values())
    return Precision(
        total_charge=str(total_coarse), total_charge_rel=float((total_coarse - total_fine) / total_fine),
        charge_rel_mean=statistics.mean(charges), charge_rel_max_abs=max(abs(x) for x in charges),
        mem_billed_rel_mean=statistics.mean(rel(lambda t: t.mem_billed_mb_s)),
        sm_billed_rel_mean=statistics.mean(rel(lambda t: t.sm_billed_s)), workloads=len(fine),
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
    # With --concurrent (1-second setting): ingest and rollup at once, with each --rollup-workers count.
    concurrent: list[ConcurrentRun] = field(default_factory=list)
    pods: int = 0  # pods metered (with churn, more than the workload slots)
    build_s: float = 0.0  # wall seconds building every batch, before anything was timed


def ledger_problems(errors: list[str], accepted: int, sent: Sent, shape: Shape) -> tuple[list[str], Accounting,
                                                                                     dict[PodKey, PodTotals]]:
    """The checks of one run against the ledger it left, with the accounting and the pods read for them."""
    minutes, pods = minute_sums(), day_by_pod()
    acc = accounting(PRICE_PER_GPU_HOUR, minutes)
    return check(acc, errors, accepted, sent, shape) + integral_problems(sent, minutes) + pod_problems(sent, pods), acc, pods


def run_setting(env: dict[str, str], dbs: Databases, tokens: dict[str, str], shape: Shape,
                start: datetime, meter_ms: int, args: argparse.Namespace) -> tuple[Setting, dict[PodKey, PodTotals]]:
    period_s = meter_ms // 1000
    log(f"meter {meter_ms} ms: building {args.wire} batches")
    began = time.perf_counter()
    batches, sent = build_batches(shape, args.seed, start=start, period_s=period_s, wire=args.wire)
    build_s = time.perf_counter() - began
    body_bytes = sum(len(b.body) for node in batches for b in node)
    log(f"  {sent.items:,} {items_label(args.wire)} of {len(sent.pod_seconds):,} pods, {body_bytes / 2**20:,.1f} MiB "
        f"of gzip, built in {build_s:.1f} s")
    from django.conf import settings

    max_batches = args.rollup_batches or settings.VGPU_ROLLUP_MAX_BATCHES  # what the shard task passes
    every_s = args.rollup_every_s or float(settings.CELERY_BEAT_SCHEDULE["rollup-usage"]["schedule"])
    counts = args.rollup_workers if meter_ms == 1000 else args.rollup_workers[:1]
    fresh = iter(range(len(counts) * (2 if args.concurrent and meter_ms == 1000 else 1)))
    problems: list[str] = []
    concurrent: list[ConcurrentRun] = []
    for workers in counts if args.concurrent and meter_ms == 1000 else ():
        if next(fresh):
            copy_database(dbs, source=dbs.template, target=dbs.name)
        log(f"meter {meter_ms} ms: {len(batches) * shape.windows:,} batches over HTTP while {workers} worker(s) roll "
            f"up every {every_s:g} s, max_batches={max_batches}")
        both = run_concurrent(env, dbs.name, tokens, batches, args, shape, workers, max_batches, every_s)
        found, _, _ = ledger_problems(both.errors, both.accepted, sent, shape)
        problems += [f"{workers} rollup worker(s), concurrent: {p}" for p in found]
        problems += [f"rollup worker: {w.error}" for w in both.workers if w.error]
        concurrent.append(both)
    runs: list[tuple[IngestRun, RollupRun]] = []
    for workers in reversed(counts):  # the headline count last: its database is the one kept
        if next(fresh):
            copy_database(dbs, source=dbs.template, target=dbs.name)
        wal_start = wal_lsn(dbs.url)
        log(f"meter {meter_ms} ms: {len(batches) * shape.windows:,} batches over HTTP, rolled up after each window "
            f"by {workers} worker(s), max_batches={max_batches}")
        run, rolled = run_fleet(env, dbs.name, tokens, batches, args, shape, workers, max_batches)
        log(f"  ingest {run.accepted:,} {items_label(args.wire)} in {run.wall_s:.1f} s, {len(run.errors)} errors; "
            f"rollup {rolled.wall_s:.1f} s; together {shape.seconds / (run.wall_s + rolled.wall_s):.2f} x real time; "
            + "; ".join(f"worker {n}: {w.cycles} cycles, {w.skipped} skipped, {w.batches} batches"
                        f"{' ' + w.error if w.error else ''}" for n, w in enumerate(rolled.workers)))
        found, acc, pods = ledger_problems(run.errors, run.accepted, sent, shape)
        problems += [f"{workers} rollup worker(s): {p}" for p in found]
        problems += [f"rollup worker: {w.error}" for w in rolled.workers if w.error]
        runs.insert(0, (run, rolled))
    del batches  # a large fleet's bodies are not needed past ingest
    wal = wal_lsn(dbs.url) - wal_start  # the headline run's ingest and rollup
    close_days_of_run(start + timedelta(seconds=shape.seconds))
    sizes_before = table_bytes(dbs.url)
    sizes = sizes_before | compact_bytes(dbs.url)
    log(f"meter {meter_ms} ms: pages")
    pages = time_pages(args.page_runs)
    run = runs[0][0]
    setting = Setting(meter_ms, run.accepted, run.batches, body_bytes, run,
                      runs[0][1], {k: str(v) for k, v in asdict(acc).items()}, problems, sizes,
                      table_rows(), wal, pages,
                      rollup_scaling=[rolled for _, rolled in runs[1:]], table_bytes_as_left=sizes_before,
                      concurrent=concurrent, pods=len(sent.pod_seconds), build_s=build_s)
    return setting, pods


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
    shape = make_shape(args)
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
    fine: dict[PodKey, PodTotals] = {}
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


def modes_table(report: Report) -> str:
    """The headline run (ingest, then rollup, window by window) beside the concurrent runs, if any:
    wall and CPU seconds of the whole run, x real time and cores per 1,000 GPUs."""
    s = report.settings[0]
    if not s.concurrent:
        return ""
    rows = ["| mode | rollup workers | wall s | x real time | ingest s | rollup after the last post, s "
            "| post p50 / p99, ms | CPU s: gunicorn | Postgres, ingest | rollup workers | Postgres, rollup "
            "| **service** | cores per 1,000 GPUs | rollup calls that rolled up (skipped) per worker "
            "| busy cores (whole machine) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]

    def row(mode: str, workers: list[WorkerReport], wall: float, ingest: float, latency: tuple[float, float],
            cpu: tuple[float, float, float, float], busy: float | None, span: float) -> str:
        calls = ", ".join(f"{w.cycles} ({w.skipped})" for w in workers)
        return (f"| {mode} | {len(workers)} | {wall:.1f} | {fleet_seconds(report) / wall:.2f} | {ingest:.1f} "
                f"| {wall - ingest:.1f} | {latency[0]:,.0f} / {latency[1]:,.0f} | "
                + " | ".join(f"{x:.1f}" for x in cpu) + f" | **{sum(cpu):.1f}** | {cores(report, sum(cpu)):.3f} "
                f"| {calls} | {'n/a' if busy is None else f'{busy / span:.2f}'} |")

    i, r = s.ingest, s.rollup
    busy = None if i.machine_busy_s is None or r.machine_busy_s is None else i.machine_busy_s + r.machine_busy_s
    rows.append(row("alternating", r.workers, i.wall_s + r.wall_s, i.wall_s, (i.latency_p50_ms, i.latency_p99_ms),
                    (i.cpu_gunicorn_s, i.cpu_postgres_s, r.cpu_workers_s, r.cpu_postgres_s), busy,
                    i.wall_s + r.wall_s))
    rows.extend(row(f"concurrent{', real time' if c.real_time else ''}, every {c.rollup_every_s:g} s", c.workers, c.wall_s, c.ingest_s,
                    (c.latency_p50_ms, c.latency_p99_ms), (c.cpu_gunicorn_s, c.cpu_postgres_ingest_s,
                                                           c.cpu_workers_s, c.cpu_postgres_rollup_s),
                    c.machine_busy_s, c.cpu_span_s) for c in s.concurrent)
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
             ("minute ledger", ("UsageMinute", "GpuMinute")), ("workloads (the minutes' names)", ("Workload",)),
             ("pods' metadata (WorkloadMeta)", ("WorkloadMeta",)), ("hour ledger", ("UsageHour", "GpuHour")),
             ("day ledger", ("UsageDay", "GpuDay")), ("month ledger", ("UsageMonth",)))


def bytes_per_gpu_day(report: Report, s: Setting, table: str) -> float:
    """Bytes per row measured in this run x rows per GPU-day in a steady fleet."""
    rows = s.table_rows.get(table, 0)  # a report from before a table was counted has none of it
    return s.table_bytes[table] / rows * rows_per_gpu_day(report.shape)[table] if rows else 0.0


def disk_table(report: Report) -> str:
    head = " | ".join(f"{s.meter_ms} ms" for s in report.settings)
    rows = [f"| table (heap + indexes + TOAST) | bytes per row, {report.settings[0].meter_ms} ms | as the run left it "
            f"| bytes per GPU-day: {head} | GB/day per 1,000 GPUs: {head} |",
            "|---|---:|---:|" + "---:|" * (2 * len(report.settings))]
    first = report.settings[0]
    for label, names in (*DISK_ROWS, ("**all ledger tables**", tuple(n for _, ns in DISK_ROWS for n in ns))):
        per_day = [sum(bytes_per_gpu_day(report, s, n) for n in names) for s in report.settings]
        n_rows = sum(first.table_rows.get(n, 0) for n in names)
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


# Retention held by the plan, two ways (docs/operations.md, "Retention and disk"; docs/scaling.md,
# "Held under 2 TB"): the shipped defaults (the integral rows' day partitions and the batches for the
# late-usage horizon, 45 days, plus the 2-day margin; minutes and their workloads 100 days) and the
# retention documented for a fleet of 10,000 GPUs (a 21-day horizon: 23 days of batches, minutes and
# workloads). Both keep hours 396 days (13 months); days are kept forever: the plan counts a year.
PLAN_GPUS = 10_000
PLAN_UTILISATION = 0.5  # cores planned at half busy: headroom for peaks and for catching up a backlog
_KEPT_ALWAYS = {"UsageHour": 396, "GpuHour": 396, "UsageDay": 365, "GpuDay": 365, "UsageMonth": 365, "WorkloadMeta": 365}
PLAN_RETENTIONS = {
    "shipped defaults": {"integral rows": 47, "UsageBatch": 47, "BatchGpu": 47, "UsageMinute": 100, "GpuMinute": 100,
                         "Workload": 100, **_KEPT_ALWAYS},
    "10,000-GPU retention": {"integral rows": 23, "UsageBatch": 23, "BatchGpu": 23, "UsageMinute": 23, "GpuMinute": 23,
                             "Workload": 23, **_KEPT_ALWAYS},
}


def plan_table(report: Report) -> str:
    """What PLAN_GPUS GPUs with this run's workloads per GPU need, from this run's per-1,000 figures."""
    scale = PLAN_GPUS / 1000
    rows = [f"| meter | cores at {PLAN_UTILISATION:.0%} busy: web/ingest + Postgres + rollup = total | ledger GB/day "
            "| WAL GB/day | disk held, TB: shipped defaults (batches 47 d, minutes 100 d, hours 396 d, days, months and pods' metadata 1 year) "
            "| disk held, TB: 10,000-GPU retention (batches and minutes 23 d, hours 396 d, days, months and pods' metadata 1 year) "
            "| RAM: gunicorn + rollup workers, GiB |",
            "|---|---|---:|---:|---:|---:|---:|"]
    for s in report.settings:
        web = cores(report, s.ingest.cpu_gunicorn_s) * scale / PLAN_UTILISATION
        pg = cores(report, s.ingest.cpu_postgres_s + s.rollup.cpu_postgres_s) * scale / PLAN_UTILISATION
        roll = cores(report, s.rollup.cpu_workers_s) * scale / PLAN_UTILISATION
        per_day = {t: bytes_per_gpu_day(report, s, t) * PLAN_GPUS for t in PLAN_RETENTIONS["shipped defaults"]}
        held = [sum(per_day[t] * days for t, days in kept.items()) for kept in PLAN_RETENTIONS.values()]
        # One sync gunicorn worker or rollup process uses at most one core: a process per planned core.
        ram = (math.ceil(web) * s.ingest.gunicorn_worker_rss_max
               + math.ceil(roll) * max(w.max_rss for w in s.rollup.workers)) / 2**30
        rows.append(f"| {s.meter_ms} ms | {web:.1f} + {pg:.1f} + {roll:.1f} = **{web + pg + roll:.1f}** "
                    f"| {sum(per_day.values()) / 1e9:,.0f} | {_gb_day(report, s.wal_bytes) * scale:,.0f} "
                    f"| {held[0] / 1e12:,.2f} | **{held[1] / 1e12:,.2f}** | {ram:,.1f} |")
    return "\n".join(rows)


def tables(report: Report) -> str:
    scaling = scaling_table(report)
    if scaling:
        scaling = (f"\n\nThe 1-second setting's rollup with each worker count, each a run of its own from a copy "
                   f"of the template (max_batches={report.settings[0].rollup.max_batches} per call; a "
                   f"call answered skipped=True waits {SKIPPED_RETRY_S} s):\n\n{scaling}")
    modes = modes_table(report)
    if modes:
        modes = (f"\n\nIngest and rollup at once, as production runs them (the windows posted back to back, or with "
                 f"--real-time on the fleet's clock, while each rollup worker calls rollup_usage on the beat's "
                 f"cadence; each run from a copy of the template), "
                 f"beside the headline run, which alternates them; \"ingest s\" ends with the last post's answer, "
                 f"and in the concurrent runs Postgres' CPU is split by backend (the rollup workers' own, the rest "
                 f"as ingest's; the CPU and the machine's busy cores of a concurrent run cover it up to the "
                 f"call that found nothing left, the next beat after the last batch rolled up):\n\n{modes}")
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
            f"(integral rows, minute, hour, day ledgers: one row per workload and window, and with churn one more per "
            f"pod starting inside a window; "
            f"batch GPUs: one per batch window), all but the integral rows measured as a fresh copy of their live rows, "
            f"which is what VACUUM FULL leaves (\"as the run left it\": dead rows of the rollup's rewrites included); WAL scaled by GPU-days:\n\n{disk_table(report)}\n\nMemory (peaks sampled "
            f"every {SAMPLE_EVERY_S} s; Postgres' shared_buffers come on top):\n\n{memory_table(report)}"
            f"{precision}{scaling}{modes}\n\n"
            f"{PLAN_GPUS:,} GPUs x {report.shape['workloads_per_gpu']} workloads, {plan_source}; retention as "
            f"assumed in bench/fleet.py PLAN_RETENTIONS; Postgres' own RAM is planned in "
            f"docs/scaling.md:\n\n{plan_table(report)}\n\nPages after the run (median of the "
            f"timed runs; {fleet_seconds(report) // 60} minutes of data, so they say little about "
            f"pages at a month's scale: bench/web_pages.py measures that):\n\n{pages_table(report)}")


def render_section(report: Report) -> str:
    machine = "\n".join(f"- {k}: {v}" for k, v in report.machine.items())
    sh = report.shape
    problems = ("failed:\n\n" + "\n".join(f"- {p}" for p in report.problems) if report.problems else
                f"all passed: every {items_label(report.wire)[:-1]} sent is in the ledger (its workload-seconds and "
                "every integral, exactly), every pod with its own seconds, every batch rolled up, and per GPU-day "
                "charges + idle = card cost = price x GPU-seconds.")
    first = report.settings[0]
    churn = (f"pods living {sh['pod_minutes_low']}-{sh['pod_minutes_high']} minutes, log-uniform, a new pod taking "
             f"a slot when one ends: {first.pods:,} pods in all" if sh.get("pod_minutes_high")
             else "one pod per slot for the whole run")
    built = f"; every batch built in {first.build_s:.1f} s before anything was timed" if first.build_s else ""
    return f"""{SECTION_TITLE}

Measured {report.started} with

```
{report.command}
```

on a shared, noisy machine (other engineers' tests and benchmarks ran on the same cores and the
same Postgres server during the run; compare ratios within the run):

{machine}

Fleet: {sh['gpus']:,} A100-80GB GPUs on {-(-sh['gpus'] // sh['gpus_per_node']):,} nodes of {sh['gpus_per_node']},
{sh['workloads_per_gpu']} workload slots per GPU ({churn}), {sh['seconds'] // 60} simulated minutes, one wire
{report.wire} batch per node per {sh['batch_seconds']} s{built}; {report.rollup_workers[0]} rollup worker process(es)
in the headline rows. The load and what each
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

    def with_workers(r: dict[str, Any]) -> dict[str, Any]:
        return {**r, "workers": [WorkerReport(**w) for w in r["workers"]]}

    settings = [Setting(**{**s, "ingest": IngestRun(**s["ingest"]), "rollup": RollupRun(**with_workers(s["rollup"])),
                           "precision": Precision(**s["precision"]) if s["precision"] else None,
                           "rollup_scaling": [RollupRun(**with_workers(r)) for r in s["rollup_scaling"]],
                           "concurrent": [ConcurrentRun(**with_workers(c)) for c in s.get("concurrent", [])]})
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
