"""Ingest benchmark: usage samples per second through the HTTP API against raw COPY.

    python bench/ingest.py [--agents 4] [--batches-per-agent 250] [--seconds-per-batch 10]
                           [--gpus 8] [--workloads-per-gpu 3] [--worker-class sync]
                           [--workers 3] [--threads 1] [--compare sync:2 gthread:2x4] [--write-docs]

DATABASE_URL and REDIS_URL must be set (`make bench` runs this under `python -m config.embedded`,
which provides them). Nothing is written to that database: the benchmark drops and creates
`<dbname>_bench` on the same server, migrates it, issues node tokens with `create_node_token`,
and drops it again at the end (unless --keep-db).

Phases, all in one run so that the numbers compare on the same (shared, noisy) machine:

1. raw COPY: the rows of agents x batches-per-agent batches, COPYed with psycopg2 into
   `billing_raw_sample` on one connection, once as one transaction per batch and once as a
   single big COPY. The rows come from the same generator, nodes and GPUs as the HTTP batches,
   in an earlier time range, formatted exactly as the service formats them.
2. in-process stages: requests through the WSGI application (as gunicorn calls it, without the
   socket), every stage timed (token lookup, gunzip + JSON, validation, each SQL statement, COPY
   buffer, COPY, commit, the Django/DRF rest), alternating with requests under cProfile.
3. HTTP end-to-end: gunicorn (config.wsgi) on a free loopback port; one thread per simulated
   agent (own node, own token, own keep-alive connection) posting pre-built, pre-gzipped
   batches as fast as the server answers. CPU seconds of the client, the gunicorn workers and
   the Postgres processes are read from /proc around the timed part.

A benchmark is not a test: it reports absolute numbers and ratios and never fails on speed.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gzip
import http.client
import io
import json
import math
import os
import platform
import pstats
import random
import re
import secrets
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, TypedDict

import psycopg2

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `python bench/ingest.py` puts bench/, not the repository, on the path

API_PATH = "/api/v1/usage/batches"
SCHEMA = "vgpu-ledger/usage-batch/v1"


class GpuSpec(TypedDict):
    """A card as the agent reports it: its model, memory and SMs."""

    model: str
    memory_mb: int
    sm_count: int


A100: GpuSpec = {"model": "NVIDIA A100-SXM4-80GB", "memory_mb": 81920, "sm_count": 108}
QUANTUM = 1024  # the agent reports integrals in 1/1024 units (agents/meter.py)
RAW_BATCH_ID_BASE = 10**12  # batch ids of raw-COPY rows: far above any real batch id
TENANTS = ("acme", "globex", "initech", "umbrella", "hooli", "stark")
APPS = ("bert", "llama", "resnet", "whisper", "sdxl", "t5", "vit", "gpt-j")
TIERS = ("gold", "silver", "bronze")
DOCS_FILE = REPO / "docs" / "benchmarks.md"
DOCS_HEADER = """# Benchmarks

Benchmarks live in `bench/` and are run by hand or with `make bench`; they are not tests and
never fail on speed. The machines we run them on are shared and noisy, so absolute numbers
move from run to run: compare the ratios measured within one run (every benchmark measures
its own baseline in the same run), and rerun before drawing conclusions from a few percent.
"""


# --------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class ServerConfig:
    """One gunicorn configuration: worker class, worker processes, threads per worker."""

    worker_class: str
    workers: int
    threads: int

    @property
    def label(self) -> str:
        if self.worker_class == "sync":
            return f"sync, {self.workers} workers"
        return f"{self.worker_class}, {self.workers} workers x {self.threads} threads"

    @classmethod
    def parse(cls, spec: str) -> ServerConfig:
        """`sync:3` or `gthread:2x4` (class:workers[xthreads])."""
        match = re.fullmatch(r"(sync|gthread):(\d+)(?:x(\d+))?", spec)
        if not match:
            raise argparse.ArgumentTypeError(f"{spec!r}: expected sync:WORKERS or gthread:WORKERSxTHREADS")
        worker_class, workers, threads = match.group(1), int(match.group(2)), int(match.group(3) or 1)
        return cls(worker_class, workers, 1 if worker_class == "sync" else threads)


DEFAULT_COMPARE = (ServerConfig("sync", 2, 1), ServerConfig("gthread", 2, 4))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, default=4, help="concurrent simulated agents (one node each)")
    p.add_argument("--batches-per-agent", type=int, default=250, help="timed batches per agent and server config")
    p.add_argument("--warmup-batches", type=int, default=5, help="untimed batches per agent before timing")
    p.add_argument("--seconds-per-batch", type=int, default=10, help="batch window, s (1-second samples)")
    p.add_argument("--gpus", type=int, default=8, help="A100-80GB GPUs per node")
    p.add_argument("--workloads-per-gpu", type=int, default=3, help="workloads (containers) per GPU")
    p.add_argument("--worker-class", choices=("gthread", "sync"), default="sync",
                   help="gunicorn worker class of the headline run (sync: see bench/README.md)")
    p.add_argument("--workers", type=int, default=3, help="gunicorn worker processes")
    p.add_argument("--threads", type=int, default=1, help="threads per gthread worker")
    p.add_argument("--compare", type=ServerConfig.parse, nargs="*", default=list(DEFAULT_COMPARE), metavar="SPEC",
                   help="further gunicorn configs measured in the same run (default: sync:2 gthread:2x4, the "
                        "Dockerfile's; none: --compare with no SPEC)")
    p.add_argument("--profile-batches", type=int, default=240, help="batches for the in-process stage timing")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--no-grouping-fields", action="store_true",
                   help="samples without controller, labels and requests (an agent from before the grouping fields)")
    p.add_argument("--keep-db", action="store_true", help="keep the <dbname>_bench database afterwards")
    p.add_argument("--write-docs", action="store_true", help=f"replace the '## Ingest' section of {DOCS_FILE.relative_to(REPO)}")
    args = p.parse_args(argv)
    for name in ("agents", "batches_per_agent", "seconds_per_batch", "gpus", "workloads_per_gpu", "workers", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.worker_class == "sync":
        args.threads = 1
    return args


# --------------------------------------------------------------------------------------------
# Realistic batches


@dataclass(frozen=True)
class Workload:
    gpu: int
    names: dict[str, str]  # tenant, namespace, pod, container, pod_uid, sla_tier
    # The optional grouping fields agents send (docs/protocol.md): controller, labels, requests.
    meta: dict[str, Any]
    mem_granted: float  # MB per second
    sm_granted: float  # SMs per second


@dataclass
class Agent:
    node: str
    gpus: list[dict[str, Any]]
    workloads: list[Workload]
    token: str = ""
    node_id: int = 0


def _floor_quantum(value: float) -> float:
    return math.floor(value * QUANTUM) / QUANTUM


def make_agent(index: int, *, gpus: int, workloads_per_gpu: int, rng: random.Random,
               grouping_fields: bool = True) -> Agent:
    """A node with `gpus` A100s, each shared by `workloads_per_gpu` containers of different tenants;
    each sample carries the grouping fields our agent sends unless `grouping_fields` is off (an old agent)."""
    node = f"bench-node-{index:03d}"
    gpu_list = [{"uuid": f"GPU-{uuid.UUID(int=rng.getrandbits(128))}", **A100} for _ in range(gpus)]
    workloads = []
    for g in range(gpus):
        shares = [rng.uniform(0.5, 1.0) for _ in range(workloads_per_gpu)]
        scale = 0.95 / sum(shares)  # Σ granted stays below the GPU's capacity
        for share in shares:
            tenant, app = rng.choice(TENANTS), rng.choice(APPS)
            pod = f"{app}-{rng.getrandbits(40):010x}-{rng.getrandbits(20):05x}"
            names = {
                "tenant": tenant,
                "namespace": f"{tenant}-{rng.choice(('prod', 'staging', 'research'))}",
                "pod": pod,
                "container": rng.choice(("server", "worker", "trainer")),
                "pod_uid": str(uuid.UUID(int=rng.getrandbits(128))),
                "sla_tier": rng.choice(TIERS),
            }
            mem_granted = _floor_quantum(A100["memory_mb"] * share * scale)
            meta: dict[str, Any] = {
                "controller_kind": "Deployment", "controller_name": pod.rsplit("-", 2)[0],
                "labels": {"app": app, "team": tenant}, "mem_requested_mb": int(mem_granted),
                "sm_requested": int(A100["sm_count"] * share * scale),
            } if grouping_fields else {}
            workloads.append(Workload(g, names, meta, mem_granted, _floor_quantum(A100["sm_count"] * share * scale)))
    return Agent(node=node, gpus=gpu_list, workloads=workloads)


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def make_payload(agent: Agent, *, seq: int, start: datetime, seconds: int, rng: random.Random) -> dict[str, Any]:
    """One batch as agents/batch.py renders it: 1-second samples ordered by (start, gpu)."""
    samples: list[dict[str, Any]] = []
    for s in range(seconds):
        at = iso(start + timedelta(seconds=s))
        samples.extend({
            "start": at, "seconds": 1, "gpu": agent.gpus[w.gpu]["uuid"], **w.names, **w.meta,
            "mem_used_mb_s": _floor_quantum(w.mem_granted * rng.uniform(0.2, 1.0)),
            "mem_granted_mb_s": w.mem_granted,
            "sm_used_s": _floor_quantum(w.sm_granted * rng.uniform(0.05, 1.0)),
            "sm_granted_s": w.sm_granted,
            "pcie_mb": _floor_quantum(rng.uniform(0.0, 400.0)),
        } for w in agent.workloads)
    return {
        "schema": SCHEMA,
        "node": agent.node,
        "batch_seq": seq,
        "window": {"start": iso(start), "end": iso(start + timedelta(seconds=seconds))},
        "gpus": agent.gpus,
        "samples": samples,
    }


def encode(payload: dict[str, Any]) -> bytes:
    """Compact JSON, gzip-compressed, as the agent sends it."""
    return gzip.compress(json.dumps(payload, separators=(",", ":"), allow_nan=False).encode(), compresslevel=6)


@dataclass
class Timeline:
    """Consecutive, non-overlapping batch windows per node, handed out phase by phase."""

    end: datetime
    seconds: int
    total: int
    next_index: int = 0

    def take(self, count: int) -> list[tuple[int, datetime]]:
        """`count` windows as (batch_seq, window start), oldest first."""
        first = self.end - timedelta(seconds=self.seconds * self.total)
        taken = [(i + 1, first + timedelta(seconds=self.seconds * i))
                 for i in range(self.next_index, self.next_index + count)]
        self.next_index += count
        assert self.next_index <= self.total, "timeline too short"
        return taken

    def days(self) -> set[date]:
        first = self.end - timedelta(seconds=self.seconds * self.total)
        return {first.date(), self.end.date()}


def build_payloads(agents: list[Agent], windows: list[tuple[int, datetime]], seconds: int,
                   rng: random.Random) -> list[list[dict[str, Any]]]:
    """Per agent, one payload per window."""
    return [[make_payload(a, seq=seq, start=start, seconds=seconds, rng=rng) for seq, start in windows] for a in agents]


# --------------------------------------------------------------------------------------------
# Database, Django and gunicorn


def bench_database(url: str) -> tuple[str, str]:
    """(admin URL, bench database name): `<dbname>_bench` on the server of `url`."""
    parts = urllib.parse.urlsplit(url)
    name = parts.path.lstrip("/") or "postgres"
    return url, f"{name}_bench"


def with_database(url: str, name: str) -> str:
    return urllib.parse.urlsplit(url)._replace(path=f"/{name}").geturl()


def drop_bench_database(admin_url: str, name: str) -> None:
    """Drop a benchmark's database after closing this process's Django connections to it (a
    connection left open would make DROP DATABASE fail; one already broken is no reason to keep it)."""
    with contextlib.suppress(Exception):
        from django.db import connections

        connections.close_all()
    recreate_database(admin_url, name, drop_only=True)


def recreate_database(admin_url: str, name: str, *, drop_only: bool = False) -> None:
    conn = psycopg2.connect(admin_url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            if not drop_only:
                cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()


def child_env(database_url: str) -> dict[str, str]:
    env = dict(os.environ, DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="config.settings",
               DJANGO_DEBUG="", VGPU_PRODUCTION="", VGPU_LOG_LEVEL="ERROR",
               PYTHONWARNINGS="ignore:No directory at:UserWarning")
    env.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))  # no key file written for a benchmark
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def setup_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    import django

    django.setup()


def in_fresh_database(run: Callable[[], int]) -> int:
    """`run()` with Django set up on a freshly migrated `<dbname>_bench` (DATABASE_URL's server),
    dropped again afterwards, whatever `run` did."""
    admin_url, name = bench_database(os.environ["DATABASE_URL"])
    recreate_database(admin_url, name)
    try:
        env = child_env(with_database(admin_url, name))
        manage(env, "migrate", "--noinput")
        setup_django(env)
        return run()
    finally:
        from django.db import connections

        connections.close_all()
        recreate_database(admin_url, name, drop_only=True)


def ensure_partitions(days: set[date]) -> None:
    from django.db import transaction

    from billing.ledger.partitions import ensure_raw_partitions

    with transaction.atomic():
        ensure_raw_partitions(days)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int


def _wait_until_serving(server: Server, timeout_s: float = 60.0) -> None:
    """Until the port accepts (gunicorn binds before its workers boot; the agents' warm-up covers the rest)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {server.proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("gunicorn did not start serving") from None
            time.sleep(0.1)


@contextlib.contextmanager
def gunicorn(env: dict[str, str], config: ServerConfig) -> Iterator[Server]:
    port = free_port()
    # The product's gunicorn settings (config/gunicorn.conf.py: /metrics counters in multiprocess mode).
    cmd = [sys.executable, "-m", "gunicorn", "config.wsgi:application", "-c", str(REPO / "config" / "gunicorn.conf.py"),
           "--bind", f"127.0.0.1:{port}",
           "--worker-class", config.worker_class, "--workers", str(config.workers),
           "--threads", str(config.threads), "--keep-alive", "75", "--timeout", "120", "--log-level", "warning"]
    server = Server(subprocess.Popen(cmd, cwd=REPO, env=env), port)
    try:
        _wait_until_serving(server)
        yield server
    finally:
        server.proc.terminate()
        try:
            server.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


# --------------------------------------------------------------------------------------------
# CPU accounting from /proc (Linux); every figure is None where /proc is not readable


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


POSTGRES_AUXILIARIES = ("checkpointer", "background writer", "walwriter", "autovacuum")


def _proc_stats() -> dict[int, tuple[str, int, float]]:
    """pid -> (command line, ppid, CPU seconds) for every readable process."""
    out = {}
    for entry in Path("/proc").iterdir() if Path("/proc/stat").exists() else ():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = (entry / "stat").read_text()
            fields = text[text.rindex(")") + 2:].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            out[int(entry.name)] = (cmdline, int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    return out


def _busy_seconds() -> float | None:
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / CLOCK_TICKS


def _is_ours(cmdline: str, database: str) -> bool:
    """A Postgres backend of the bench database, or an auxiliary process doing work for every database."""
    if not cmdline.startswith("postgres: "):
        return False
    return f" {database} " in cmdline or any(aux in cmdline for aux in POSTGRES_AUXILIARIES)


@dataclass(frozen=True)
class CpuSnapshot:
    client: float
    gunicorn: dict[int, float]
    postgres: dict[int, float]
    busy: float | None

    @classmethod
    def take(cls, database: str, gunicorn_pid: int | None = None) -> CpuSnapshot:
        procs = _proc_stats()
        times = os.times()
        return cls(
            client=times.user + times.system,
            gunicorn={pid: cpu for pid, (_, ppid, cpu) in procs.items() if gunicorn_pid in (pid, ppid)},
            postgres={pid: cpu for pid, (cmd, _, cpu) in procs.items() if _is_ours(cmd, database)},
            busy=_busy_seconds(),
        )


@dataclass(frozen=True)
class CpuUse:
    client: float
    gunicorn: float
    gunicorn_per_process: list[float]
    postgres: float | None
    busy: float | None

    @classmethod
    def between(cls, a: CpuSnapshot, b: CpuSnapshot) -> CpuUse:
        per_process = [b.gunicorn[pid] - a.gunicorn.get(pid, 0.0) for pid in sorted(b.gunicorn)]
        postgres = sum(b.postgres[pid] - a.postgres.get(pid, 0.0) for pid in b.postgres) if b.postgres else None
        busy = b.busy - a.busy if a.busy is not None and b.busy is not None else None
        return cls(b.client - a.client, sum(per_process), per_process, postgres, busy)


# --------------------------------------------------------------------------------------------
# Phase 1: raw COPY


@dataclass(frozen=True)
class Measurement:
    label: str
    samples: int
    seconds: float
    batches: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    cpu: CpuUse | None = None

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0


def copy_texts(agents: list[Agent], payloads: list[list[dict[str, Any]]], first_batch_id: int) -> list[tuple[str, int]]:
    """Per batch, (COPY text exactly as the service builds it, sample count)."""
    from django.conf import settings

    from billing.ledger.batches import _copy_buffer
    from billing.services.ingest.batch_validation import validate_batch

    texts = []
    now = datetime.now(UTC)
    batch_id = first_batch_id
    for agent, batches in zip(agents, payloads, strict=True):
        for payload in batches:
            batch = validate_batch(payload, now=now, max_skew=settings.VGPU_INGEST_MAX_CLOCK_SKEW,
                                   max_samples=settings.VGPU_INGEST_MAX_SAMPLES)
            texts.append((_copy_buffer(batch_id, agent.node_id, batch).getvalue(), batch.sample_count))
            batch_id += 1
    return texts


def _copy_sql() -> str:
    from billing.ledger.batches import COPY_COLUMNS as _COPY_COLUMNS
    from billing.ledger.partitions import RAW_TABLE

    return f"COPY {RAW_TABLE} ({_COPY_COLUMNS}) FROM STDIN"


def raw_copy(database_url: str, database: str, texts: list[tuple[str, int]], *, per_batch: bool) -> Measurement:
    """COPY the rows on one connection: one transaction per batch, or one big COPY."""
    sql = _copy_sql()
    samples = sum(n for _, n in texts)
    big = "".join(t for t, _ in texts) if not per_batch else ""
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            before = CpuSnapshot.take(database)
            started = time.perf_counter()
            if per_batch:
                for text, _ in texts:
                    cur.copy_expert(sql, io.StringIO(text))
                    conn.commit()
            else:
                cur.copy_expert(sql, io.StringIO(big))
                conn.commit()
            elapsed = time.perf_counter() - started
            cpu = CpuUse.between(before, CpuSnapshot.take(database))
    finally:
        conn.close()
    label = "raw COPY, one transaction per batch" if per_batch else "raw COPY, one big COPY"
    return Measurement(label, samples, elapsed, batches=len(texts), cpu=cpu)


# --------------------------------------------------------------------------------------------
# Phase 2: in-process stage timing


DECODE_STAGE = "gunzip + JSON decode"
PYTHON_STAGES = (DECODE_STAGE, "validation", "COPY buffer build")
AUTH_STAGE = "token lookup (authenticate_node)"
WARMUP_REQUESTS = 8
DJANGO_STAGE = "Django, DRF, middleware, response"
# The first statement a query runs names it ("WITH b AS (INSERT INTO x ...)" -> INSERT x).
_SQL_TABLE = re.compile(r'(INSERT INTO|UPDATE|SELECT .*? FROM)\s+"?(\w+)', re.S)


def _sql_key(sql: str) -> str:
    match = _SQL_TABLE.search(sql)
    if not match:
        return "SQL other"
    verb = match.group(1).split()[0]
    return f"SQL {verb} {match.group(2)}" + (" (upsert)" if "ON CONFLICT" in sql and "DO UPDATE" in sql else "")


@contextlib.contextmanager
def _timed(module: ModuleType, name: str, sink: dict[str, float], key: str | Callable[..., str]) -> Iterator[None]:
    """Replace module.name by a wrapper adding its wall time to sink[key] (key may be computed from the args)."""
    original: Callable[..., Any] = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            sink[key if isinstance(key, str) else key(*args)] += time.perf_counter() - started

    setattr(module, name, wrapper)
    try:
        yield
    finally:
        setattr(module, name, original)


@dataclass(frozen=True)
class StageTiming:
    batches: int
    samples: int
    seconds: dict[str, float]  # stage -> total seconds, in pipeline order
    profile: str

    def ms_per_batch(self, stage: str) -> float:
        return 1000 * self.seconds.get(stage, 0.0) / self.batches

    def ms_matching(self, prefix: str) -> float:
        return sum(self.ms_per_batch(s) for s in self.seconds if s.startswith(prefix))

    @property
    def total_ms(self) -> float:
        return sum(self.ms_per_batch(s) for s in self.seconds)


def _wsgi_one(token: str, body: bytes) -> None:
    """One request through the WSGI application exactly as gunicorn calls it, minus the socket."""
    from config.wsgi import application

    environ = {
        "REQUEST_METHOD": "POST", "PATH_INFO": API_PATH, "SCRIPT_NAME": "", "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1", "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
        "HTTP_CONTENT_ENCODING": "gzip", "HTTP_AUTHORIZATION": f"Bearer {token}",
        "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr, "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0), "wsgi.multithread": False, "wsgi.multiprocess": True, "wsgi.run_once": False,
    }
    statuses: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]],
                       exc_info: object = None) -> Callable[[bytes], object]:
        statuses.append(status)
        return io.BytesIO().write  # WSGI's legacy write(), which Django never calls

    result = application(environ, start_response)
    try:
        b"".join(result)
    finally:
        result.close()  # fires request_finished, as gunicorn does
    if not statuses or not statuses[0].startswith("201"):
        raise RuntimeError(f"in-process request answered {statuses}")


@contextlib.contextmanager
def _stage_timers(sink: dict[str, float]) -> Iterator[None]:
    """Time each stage of a request by wrapping the names the view and ingest.py look up at call time."""
    from django.db import connection

    from billing.api import agent as view
    from billing.ledger import batches
    from billing.services.ingest import batches as ingest

    def sql_timer(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            sink[_sql_key(sql)] += time.perf_counter() - started

    with (_timed(view, "authenticate_node", sink, AUTH_STAGE), _timed(view, "decode_body", sink, DECODE_STAGE),
          _timed(view, "record_usage_batch", sink, "record"), _timed(ingest, "validate_batch", sink, "validation"),
          _timed(ingest, "store_batch", sink, "store"), _timed(batches, "_copy_buffer", sink, "COPY buffer build"),
          connection.execute_wrapper(sql_timer)):
        yield


def _stage_seconds(sink: dict[str, float]) -> dict[str, float]:
    """Stages in request order; the derived ones are what is left of their enclosing call."""
    sql = {k: v for k, v in sink.items() if k.startswith("SQL")}
    sql.pop("SQL SELECT billing_nodetoken", None)  # the token lookup's own query, inside AUTH_STAGE
    seconds = {AUTH_STAGE: sink[AUTH_STAGE], DECODE_STAGE: sink[DECODE_STAGE], "validation": sink["validation"]}
    seconds.update(sorted(sql.items()))
    seconds["COPY buffer build"] = sink["COPY buffer build"]
    seconds["COPY (client + server)"] = sink["store"] - sum(sql.values()) - sink["COPY buffer build"]
    # record_usage_batch = validation + SHA-256 of the body + store_batch + commit.
    seconds["SHA-256 + commit"] = sink["record"] - sink["validation"] - sink["store"]
    seconds[DJANGO_STAGE] = sink["wsgi"] - sink[AUTH_STAGE] - sink[DECODE_STAGE] - sink["record"]
    return seconds


def time_stages(agents: list[Agent], bodies: list[list[bytes]], samples_per_batch: int) -> StageTiming:
    """In-process, one thread, no socket: requests through the WSGI application as gunicorn calls it,
    alternately with every stage timed and under cProfile."""
    work = [(a.token, body) for a, batch_bodies in zip(agents, bodies, strict=True) for body in batch_bodies]
    for token, body in work[:WARMUP_REQUESTS]:  # the first requests import the URLconf, DRF, ...
        _wsgi_one(token, body)
    work = work[WARMUP_REQUESTS:]
    sink: dict[str, float] = defaultdict(float)
    profiler = cProfile.Profile()
    timed = work[0::2]
    for i, (token, body) in enumerate(timed):
        with _stage_timers(sink):
            started = time.perf_counter()
            _wsgi_one(token, body)
            sink["wsgi"] += time.perf_counter() - started
        if 2 * i + 1 < len(work):
            profiler.runcall(_wsgi_one, *work[2 * i + 1])
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).strip_dirs().sort_stats("tottime").print_stats(25)
    return StageTiming(len(timed), len(timed) * samples_per_batch, _stage_seconds(sink), out.getvalue())


# --------------------------------------------------------------------------------------------
# Phase 3: HTTP end-to-end


@dataclass
class AgentResult:
    stored: int = 0
    samples: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


def _post(conn: http.client.HTTPConnection, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    for attempt in (1, 2):
        try:
            conn.request("POST", API_PATH, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        except (http.client.HTTPException, ConnectionError):
            conn.close()  # a closed keep-alive connection: reconnect once
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _agent(port: int, token: str, warmup: list[bytes], timed: list[bytes], samples_per_batch: int,
           barrier: threading.Barrier, result: AgentResult) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Content-Encoding": "gzip"}
    try:
        for body in warmup:
            status, text = _post(conn, body, headers)
            if status != 201:
                result.errors.append(f"warm-up: {status} {text[:300]!r}")
        barrier.wait()
        for body in timed:
            started = time.perf_counter()
            status, text = _post(conn, body, headers)
            result.latencies.append(time.perf_counter() - started)
            if status == 201:
                result.stored += 1
                result.samples += samples_per_batch
            else:
                result.errors.append(f"{status} {text[:300]!r}")
    except Exception as exc:  # noqa: BLE001 - reported below; the other agents are released
        result.errors.append(f"agent failed: {exc!r}")
        barrier.abort()
    finally:
        conn.close()


def http_run(server: Server, database: str, config: ServerConfig, agents: list[Agent], warmup: list[list[bytes]],
             timed: list[list[bytes]], samples_per_batch: int) -> Measurement:
    """All agents post concurrently; timing starts when every agent has finished its warm-up."""
    barrier = threading.Barrier(len(agents) + 1)
    results = [AgentResult() for _ in agents]
    threads = [threading.Thread(target=_agent, daemon=True,
                                args=(server.port, a.token, w, t, samples_per_batch, barrier, r))
               for a, w, t, r in zip(agents, warmup, timed, results, strict=True)]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # an agent failed: its error is reported below
        barrier.wait()
    before = CpuSnapshot.take(database, server.proc.pid)
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    cpu = CpuUse.between(before, CpuSnapshot.take(database, server.proc.pid))
    errors = [e for r in results for e in r.errors]
    for error in errors[:5]:
        print(f"  error: {error}", file=sys.stderr)
    return Measurement(f"HTTP end-to-end, {len(agents)} agents, gunicorn {config.label}",
                       sum(r.samples for r in results), elapsed, batches=sum(r.stored for r in results),
                       errors=len(errors), latencies=[x for r in results for x in r.latencies], cpu=cpu)


# --------------------------------------------------------------------------------------------
# Report


@dataclass
class Report:
    command: str
    started: datetime
    machine: dict[str, str]
    workload: str
    copy_single: Measurement
    copy_per_batch: Measurement
    http: list[Measurement]
    stages: StageTiming
    samples_per_batch: int
    cores: int


def machine_info(database_url: str) -> dict[str, str]:
    import django
    import gunicorn as gunicorn_pkg

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    models = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    mem_kb = re.search(r"^MemTotal:\s*(\d+)", meminfo, re.M)
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('server_version'), current_setting('synchronous_commit'), "
                        "current_setting('fsync'), current_setting('shared_buffers')")
            pg_version, sync_commit, fsync, shared_buffers = cur.fetchone()
    finally:
        conn.close()
    return {
        "cores": f"{len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} "
                 f"(nproc; {os.cpu_count()} online)",
        "CPU": models[0] if models else platform.processor() or "unknown",
        "RAM": f"{int(mem_kb.group(1)) / 1024 / 1024:.1f} GiB" if mem_kb else "unknown",
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "PostgreSQL": f"{pg_version} (same machine; synchronous_commit={sync_commit}, fsync={fsync}, "
                      f"shared_buffers={shared_buffers})",
        "Django / gunicorn": f"{django.get_version()} / {gunicorn_pkg.__version__}",
    }


def _ratio(m: Measurement, base: Measurement) -> str:
    return f"{m.rate / base.rate:.0%}" if base.rate else "n/a"


def results_table(report: Report) -> str:
    rows = ["| path | samples | seconds | samples/s | ratio to raw per-batch COPY |",
            "|---|---:|---:|---:|---:|"]
    for m in (report.copy_single, report.copy_per_batch, *report.http):
        note = f" ({m.errors} errors)" if m.errors else ""
        rows.append(f"| {m.label}{note} | {m.samples:,} | {m.seconds:.2f} | {m.rate:,.0f} | "
                    f"{_ratio(m, report.copy_per_batch)} |")
    return "\n".join(rows)


def _ms(seconds: float | None, batches: float) -> str:
    return f"{1000 * seconds / batches:.2f}" if seconds is not None and batches else "n/a"


def _short(label: str) -> str:
    return label.split("gunicorn ", 1)[-1] if label.startswith("HTTP") else label


def _split(cpu: CpuUse) -> str:
    """Share of the gunicorn CPU per worker process (the master, first, is left out)."""
    workers = cpu.gunicorn_per_process[1:]
    return "/".join(f"{100 * w / sum(workers):.0f}" for w in workers) if sum(workers) > 0 else "-"


def cpu_table(report: Report) -> str:
    """CPU milliseconds per batch of `samples_per_batch` samples, by process group, from /proc."""
    rows = ["| path | latency p50 / p99 ms | client | gunicorn | Postgres | sum | whole machine | busy cores "
            "| split over workers |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m in (report.copy_single, report.copy_per_batch, *report.http):
        if m.cpu is None or not m.samples:
            continue
        per = m.samples / report.samples_per_batch
        latency = "-"
        if m.latencies:
            lat = sorted(m.latencies)
            latency = f"{1000 * statistics.median(lat):.1f} / {1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]:.1f}"
        total = m.cpu.client + m.cpu.gunicorn + (m.cpu.postgres or 0.0)
        busy = f"{m.cpu.busy / m.seconds:.2f}" if m.cpu.busy is not None else "n/a"
        rows.append(f"| {_short(m.label)} | {latency} | {_ms(m.cpu.client, per)} | "
                    f"{_ms(m.cpu.gunicorn, per) if m.latencies else '-'} | {_ms(m.cpu.postgres, per)} | "
                    f"{_ms(total, per)} | {_ms(m.cpu.busy, per)} | {busy} | {_split(m.cpu)} |")
    return "\n".join(rows)


def stage_table(stages: StageTiming) -> str:
    rows = ["| stage (in-process, one thread, no socket) | ms per batch | share |", "|---|---:|---:|"]
    for stage in stages.seconds:
        ms = stages.ms_per_batch(stage)
        rows.append(f"| {stage} | {ms:.2f} | {ms / stages.total_ms:.0%} |")
    rate = stages.samples / sum(stages.seconds.values())
    rows.append(f"| **total (WSGI application)** | **{stages.total_ms:.2f}** | {rate:,.0f} samples/s on one core |")
    return "\n".join(rows)


def best_http(report: Report) -> Measurement:
    return max(report.http, key=lambda m: m.rate)


def _cpu_ms(m: Measurement, samples_per_batch: int) -> tuple[float, float, float, float]:
    """(client, gunicorn, Postgres, sum) CPU ms per batch of `samples_per_batch` samples."""
    assert m.cpu is not None
    per = m.samples / samples_per_batch / 1000
    client, server, postgres = m.cpu.client / per, m.cpu.gunicorn / per, (m.cpu.postgres or 0.0) / per
    return client, server, postgres, client + server + postgres


def analysis(report: Report) -> str:
    """What limits the rate, with this run's numbers."""
    st, best, raw, spb = report.stages, best_http(report), report.copy_per_batch, report.samples_per_batch
    python_ms = sum(st.ms_per_batch(s) for s in PYTHON_STAGES)
    sql_ms = st.ms_matching("SQL")
    copy_ms = st.ms_per_batch("COPY (client + server)") + st.ms_per_batch("SHA-256 + commit")
    top = sorted(st.seconds, key=st.ms_per_batch, reverse=True)[:4]
    budget_50k = 1000 * report.cores * spb / 50_000
    parts = [
        f"Best end-to-end rate: **{best.rate:,.0f} samples/s** with gunicorn {_short(best.label)}, "
        f"**{best.rate / raw.rate:.0%}** of raw per-batch COPY ({raw.rate:,.0f} samples/s) and "
        f"{best.rate / report.copy_single.rate:.0%} of one big COPY; the targets are >= 50 % of raw COPY and "
        f">= 50,000 samples/s on 2 cores.",
        f"In process (one thread, no socket) a batch of {spb} samples costs {st.total_ms:.1f} ms: "
        f"{python_ms:.1f} ms of ingest Python (validation {st.ms_per_batch('validation'):.1f}, gunzip and JSON "
        f"{st.ms_per_batch(DECODE_STAGE):.1f}, COPY buffer {st.ms_per_batch('COPY buffer build'):.1f}), "
        f"{st.ms_per_batch(AUTH_STAGE):.1f} ms for the token lookup, {sql_ms:.1f} ms in the "
        f"{sum(1 for s in st.seconds if s.startswith('SQL'))} statements around the COPY (batch row, its GPUs "
        f"with the overlap trigger, the GPU upsert, the node's last_seen_at), {copy_ms:.1f} ms in COPY and "
        f"commit, and {st.ms_per_batch(DJANGO_STAGE):.1f} ms in Django, DRF, middleware and the response. "
        f"The largest items: " + ", ".join(f"{s} ({st.ms_per_batch(s):.1f} ms)" for s in top) + ".",
    ]
    if best.cpu is not None and raw.cpu is not None and best.samples:
        client, server, postgres, total = _cpu_ms(best, spb)
        _, _, raw_pg, raw_total = _cpu_ms(raw, spb)
        busy = f"{best.cpu.busy / best.seconds:.2f}" if best.cpu.busy is not None else "n/a"
        parts.append(
            f"Over HTTP the rate is CPU-bound ({busy} of {report.cores} cores busy): a batch costs {total:.1f} ms "
            f"of CPU, {server:.1f} ms in the gunicorn worker, {postgres:.1f} ms in Postgres and {client:.1f} ms in "
            f"the benchmark's client, which shares the cores (it only sends pre-built, pre-gzipped bodies). Raw "
            f"COPY of the same rows costs {raw_total:.1f} ms of CPU per batch ({raw_pg:.1f} ms Postgres), so raw "
            f"COPY is bound by one connection's latency rather than by the cores. The worker's {server:.1f} ms is "
            f"the in-process Python above plus HTTP parsing, socket I/O and psycopg2; Postgres spends "
            f"{postgres - raw_pg:.1f} ms per batch more than for the bare COPY on the extra statements, the token "
            f"lookup and the transaction. At {total:.1f} ms per batch two saturated cores top out near "
            f"{1000 * report.cores * spb / total:,.0f} samples/s; 50,000 samples/s needs <= {budget_50k:.1f} ms "
            f"of CPU per {spb}-sample batch for everything (HTTP, Django, validation, Postgres), and 50 % of raw "
            f"per-batch COPY needs <= {1000 * report.cores * spb / (raw.rate / 2):.1f} ms."
        )
    return "\n\n".join(parts)


def section_title(seconds_per_batch: int) -> str:
    """One docs section per batch window: the default (10 s, as docs/protocol.md's example) and wider ones."""
    return "## Ingest" if seconds_per_batch == 10 else f"## Ingest, {seconds_per_batch}-second batches"


def render_section(report: Report, title: str) -> str:
    machine = "\n".join(f"- {k}: {v}" for k, v in report.machine.items())
    return f"""{title}

Measured {report.started:%Y-%m-%d %H:%M} UTC with

```
{report.command}
```

(`make bench` runs the same through `python -m config.embedded --`, which supplies DATABASE_URL and
REDIS_URL; the benchmark works in its own `<dbname>_bench` database and drops it afterwards.)

Machine:

{machine}

Workload: {report.workload}

{results_table(report)}

End-to-end is gunicorn (`config.wsgi`) on loopback with the agents as threads of the benchmark
process; the client runs on the same {report.cores} cores as the server and Postgres. Raw COPY is
psycopg2 `copy_expert` of the same kind and number of rows (same generator, nodes and GPUs, an
earlier time range, the text the service builds) into the same partitioned `billing_raw_sample`,
on one connection.

gunicorn: the headline config uses sync workers, one more than cores. A sync worker closes the
connection after each response, so every batch goes to whichever worker is free. With gthread an
agent's keep-alive connection stays with the worker process that accepted it, and with a few
agents one process (one GIL, so one core of Python) can end up serving all of them: see the split
column. Threads also buy little here, since a request is mostly Python under the GIL.

CPU milliseconds per batch of {report.samples_per_batch} samples while posting, from /proc ("sum" is the
client, gunicorn and this database's Postgres backends plus the Postgres auxiliaries; "whole machine"
also counts whatever else ran on the shared machine; "split" is each gunicorn worker's share, in %):

{cpu_table(report)}

Where the time goes in the service, per batch: requests through the WSGI application in-process, as
gunicorn calls it but without the socket, one at a time; wall time, so database stages include the
round trip and Postgres' own work:

{stage_table(report.stages)}

### What limits the rate

{analysis(report)}
"""


def write_docs(section: str, title: str, path: Path = DOCS_FILE) -> None:
    text = path.read_text() if path.exists() else DOCS_HEADER
    match = re.search(rf"^{re.escape(title)}\n.*?(?=^## |\Z)", text, re.M | re.S)
    if match:
        text = text[: match.start()] + section + ("\n" if match.end() < len(text) else "") + text[match.end():]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def print_report(report: Report) -> None:
    print()
    print(results_table(report))
    print()
    print(cpu_table(report))
    print()
    print(stage_table(report.stages))
    print()
    for m in report.http:
        if m.cpu is not None:
            print(f"{m.label}: CPU s per gunicorn process (master first): "
                  + ", ".join(f"{x:.2f}" for x in m.cpu.gunicorn_per_process))
    print()
    print(analysis(report))
    print()
    print("cProfile of the WSGI application, in-process (top by own time):")
    print(report.stages.profile)


# --------------------------------------------------------------------------------------------
# Main


def log(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", flush=True)


def run(args: argparse.Namespace) -> Report:
    started = datetime.now(UTC)
    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url or not os.environ.get("REDIS_URL"):
        raise SystemExit("DATABASE_URL and REDIS_URL must be set (or run: python -m config.embedded -- python bench/ingest.py)")
    admin_url, bench_name = bench_database(base_url)
    bench_url = with_database(base_url, bench_name)
    configs = [ServerConfig(args.worker_class, args.workers, args.threads), *args.compare]
    rng = random.Random(args.seed)
    agents = [make_agent(i, gpus=args.gpus, workloads_per_gpu=args.workloads_per_gpu, rng=rng,
                         grouping_fields=not args.no_grouping_fields)
              for i in range(args.agents)]
    spb = args.gpus * args.workloads_per_gpu * args.seconds_per_batch
    n = args.batches_per_agent
    profile_per_agent = max(2, math.ceil(args.profile_batches / args.agents))
    windows = 2 * n + profile_per_agent + len(configs) * (args.warmup_batches + n)
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    timeline = Timeline(end=now - timedelta(minutes=2), seconds=args.seconds_per_batch, total=windows)

    log(f"database {bench_name}: drop, create, migrate")
    recreate_database(admin_url, bench_name)
    try:
        env = child_env(bench_url)
        manage(env, "migrate", "--noinput", "-v", "0")
        for agent in agents:
            agent.token = manage(env, "create_node_token", agent.node).strip().splitlines()[-1]
        setup_django(env)
        from billing.models import Node

        for agent in agents:
            agent.node_id = Node.objects.get(name=agent.node).pk
        ensure_partitions(timeline.days())
        log(f"building batches: {args.agents} agents x {n} batches x {spb} samples")
        raw_single = copy_texts(agents, build_payloads(agents, timeline.take(n), args.seconds_per_batch, rng),
                                RAW_BATCH_ID_BASE)
        raw_per_batch = copy_texts(agents, build_payloads(agents, timeline.take(n), args.seconds_per_batch, rng),
                                   RAW_BATCH_ID_BASE + len(raw_single))
        profile_bodies = [[encode(p) for p in ps] for ps in
                          build_payloads(agents, timeline.take(profile_per_agent), args.seconds_per_batch, rng)]
        http_bodies = []
        for _ in configs:
            warm = [[encode(p) for p in ps] for ps in
                    build_payloads(agents, timeline.take(args.warmup_batches), args.seconds_per_batch, rng)]
            timed = [[encode(p) for p in ps] for ps in
                     build_payloads(agents, timeline.take(n), args.seconds_per_batch, rng)]
            http_bodies.append((warm, timed))
        body_kb = statistics.mean(len(b) for b in http_bodies[0][1][0]) / 1024
        raw_kb = statistics.mean(len(t) for t, _ in raw_per_batch) / 1024

        log("raw COPY, one transaction per batch")
        copy_per_batch = raw_copy(bench_url, bench_name, raw_per_batch, per_batch=True)
        log(f"  {copy_per_batch.rate:,.0f} samples/s")
        log("raw COPY, one big COPY")
        copy_single = raw_copy(bench_url, bench_name, raw_single, per_batch=False)
        log(f"  {copy_single.rate:,.0f} samples/s")
        log(f"in-process stage timing, {profile_per_agent * args.agents} batches")
        stages = time_stages(agents, profile_bodies, spb)
        from django.db import connection

        connection.close()
        http: list[Measurement] = []
        for config, (warm, timed) in zip(configs, http_bodies, strict=True):
            log(f"HTTP, gunicorn {config.label}")
            with gunicorn(env, config) as server:
                http.append(http_run(server, bench_name, config, agents, warm, timed, spb))
            log(f"  {http[-1].rate:,.0f} samples/s, {http[-1].errors} errors")
        machine = machine_info(bench_url)
    finally:
        if not args.keep_db:
            drop_bench_database(admin_url, bench_name)
    workload = (f"{args.agents} agents (one node each), {args.gpus} x A100-80GB per node (81920 MB, 108 SMs), "
                f"{args.workloads_per_gpu} workloads per GPU, 1-second samples, {args.seconds_per_batch}-second "
                f"windows = {spb} samples per batch; {n} timed batches per agent after {args.warmup_batches} "
                f"warm-up batches; compact JSON, gzip bodies of {body_kb:.1f} KiB on average "
                f"({raw_kb:.1f} KiB of COPY text per batch).")
    command = "python bench/ingest.py" + ("" if len(sys.argv) < 2 else " " + shlex.join(sys.argv[1:]))
    return Report(command, started, machine, workload, copy_single, copy_per_batch, http, stages, spb,
                  len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print_report(report)
    if args.write_docs:
        title = section_title(args.seconds_per_batch)
        write_docs(render_section(report, title), title)
        log(f"wrote the '{title}' section of {DOCS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
