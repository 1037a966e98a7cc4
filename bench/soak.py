"""Soak-and-fault harness (docs/reliability.md): the whole product under faults and a hostile node.

    python bench/soak.py --minutes M [--agents N] [--seed S] [--servers given|own] [--write-docs]

Runs on a database of its own (`vgpu_soak`, dropped before and after) and a Redis db of its own,
on the servers in DATABASE_URL / REDIS_URL (`--servers given`, the default when both are set) or
on embedded servers it starts itself under `--data-dir` (`--servers own`, config/embedded.py).
Everything listens on 127.0.0.1 only. Processes: gunicorn (2 sync workers, an access log), a
Celery worker and beat (rollup every VGPU_ROLLUP_EVERY_S = 3 s), N honest agents (the real agent
CLI, sim backend, each its own spool) and one rogue node process (its own valid token) sending
hostile batches throughout: another node's GPU, overflowing values, over-long names, a workload
twice in one GPU-second, malformed gzip, garbage JSON.

Faults, spread over the run in a seeded order: kill -9 of a gunicorn worker, of the Celery worker
(restarted), of an honest agent (restarted on its spool), a Postgres restart and a Redis restart.
Restarts are real for servers this harness started; servers it was given are not ours to restart,
so it says so and uses stand-ins: the soak database refuses connections and every backend of it is
terminated (pg_terminate_backend) for the outage, and the soak's Redis clients are killed
(CLIENT KILL) throughout it.

At the end the agents stop with SIGTERM (each spools its partial batch), their spools are drained
with the agent's own uploader, the rollup is waited for, and what the honest agents metered (Σ over
their spools) is compared exactly (Decimal) with the ledger per node. Exit status 1 when anything
was lost, duplicated or left undelivered, when a rogue batch with an honest GPU reached the ledger,
or when a valid request got a 5xx outside an outage; 2 when the harness itself could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import psycopg2
import redis as redis_lib
import requests

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python bench/soak.py` puts bench/ first, not the repository
    sys.path.insert(0, str(REPO))

from agents.backends.sim import demo_scenario  # noqa: E402 - after the path fix above
from agents.clock import utc_now  # noqa: E402 - after the path fix above
from agents.spool import Spool  # noqa: E402 - after the path fix above
from agents.uploader import Uploader  # noqa: E402 - after the path fix above
from bench.ingest import child_env, free_port, manage, recreate_database, with_database  # noqa: E402 - after the path fix above
from config.embedded import DATA_DIR, _embedded_postgres, _embedded_redis  # noqa: E402 - after the path fix above

DATABASE = "vgpu_soak"
ROGUE = "soak-rogue"
TENANTS = [("acme", "gold"), ("globex", "silver")]
A100 = {"model": "NVIDIA A100-SXM4-80GB", "memory_mb": 81920, "sm_count": 108}
QUANTITIES = ("seconds", "mem_used_mb_s", "sm_used_s")
FAULTS = ("web_worker", "celery_worker", "agent", "postgres", "redis")
# A web worker's persistent database connection (CONN_MAX_AGE, config/settings.py) that an outage
# broke fails the one request that meets it, with a 503: that answer belongs to the outage.
ACCESS_FORMAT = '%(t)s %(p)s %(s)s "%(r)s" "%(a)s"'
ACCESS_LINE = re.compile(r'^\[(?P<t>[^\]]+)\] <(?P<pid>\d+)> (?P<status>\d{3}) "(?P<req>[^"]*)" "(?P<ua>[^"]*)"$')
ROGUE_AGENT = "vgpu-soak-rogue"


def _now() -> float:
    return time.time()


# --------------------------------------------------------------------------------------------
# Servers: given (stand-in faults) or our own (real restarts)


@dataclass
class Outage:
    fault: str
    start: float
    end: float
    note: str


class Servers:
    """Postgres and Redis, and how to take each down for `outage_s` seconds."""

    def __init__(self, *, admin_url: str, redis_url: str, own_pgdata: Path | None, own_redis: bool) -> None:
        self.admin_url, self.base_redis_url = admin_url, redis_url
        self.own_pgdata, self.own_redis = own_pgdata, own_redis
        self.replacements: list[subprocess.Popen[bytes]] = []  # redis-servers we restarted, to stop at the end

    @property
    def database_url(self) -> str:
        return with_database(self.admin_url, DATABASE)

    def redis_url(self, db: int) -> str:
        return urllib.parse.urlsplit(self.base_redis_url)._replace(path=f"/{db}").geturl()

    def describe(self) -> dict[str, str]:
        return {
            "postgres": "restart (pg_ctl stop, then start)" if self.own_pgdata else
            "given server, not ours to restart: stand-in = soak database refuses connections and "
            "pg_terminate_backend of all its backends",
            "redis": "restart (SIGTERM, then redis-server again on its port, same settings)" if self.own_redis else
            "given server, not ours to restart: stand-in = CLIENT KILL of the soak's connections throughout the outage",
        }

    def take_down_postgres(self, outage_s: float) -> None:
        if self.own_pgdata is not None:
            _pg_ctl(self.own_pgdata, "stop", "-m", "fast")
            time.sleep(outage_s)
            # `restart` on a stopped cluster starts it with the options it last ran with (postmaster.opts).
            _pg_ctl(self.own_pgdata, "restart")
            return
        with _admin(self.admin_url) as cur:
            cur.execute(f'ALTER DATABASE "{DATABASE}" ALLOW_CONNECTIONS false')
            try:
                deadline = time.monotonic() + outage_s
                while time.monotonic() < deadline:  # new backends may have slipped in before the ALTER
                    cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                                "AND pid <> pg_backend_pid()", [DATABASE])
                    time.sleep(0.5)
            finally:
                cur.execute(f'ALTER DATABASE "{DATABASE}" ALLOW_CONNECTIONS true')

    def take_down_redis(self, outage_s: float, *, db: int) -> None:
        if self.own_redis:
            self._restart_own_redis(outage_s)
            return
        client = redis_lib.Redis.from_url(self.redis_url(db), socket_timeout=2)
        deadline = time.monotonic() + outage_s
        while time.monotonic() < deadline:
            # redis-py annotates its replies for the sync and async clients alike; this one is sync.
            for entry in cast("list[dict[str, str]]", client.client_list()):
                if int(entry.get("db", -1)) == db and entry.get("name") != "soak-harness":
                    with contextlib.suppress(redis_lib.ResponseError):  # gone already
                        client.client_kill_filter(_id=entry["id"])
            time.sleep(0.3)
        client.close()

    def _restart_own_redis(self, outage_s: float) -> None:
        # redis-server rewrites its process title, so its command line cannot be read back: it is
        # started again from its binary with the settings it reports (no persistence, as before).
        parts = urllib.parse.urlsplit(self.base_redis_url)
        assert parts.port is not None  # our own server's URL always names its port
        client = redis_lib.Redis(host="127.0.0.1", port=parts.port, socket_timeout=2)
        # redis-py annotates its replies for the sync and async clients alike; this one is sync.
        directory = cast("dict[str, str]", client.config_get("dir"))["dir"]
        pid = int(cast("dict[str, Any]", client.info("server"))["process_id"])
        executable = os.readlink(f"/proc/{pid}/exe")
        client.close()
        os.kill(pid, signal.SIGTERM)
        _wait_gone(pid, timeout_s=15)
        time.sleep(outage_s)
        argv = [executable, "--bind", "127.0.0.1", "--port", str(parts.port), "--dir", directory,
                "--save", "", "--appendonly", "no"]
        self.replacements.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def postgres_answers(self) -> bool:
        try:
            psycopg2.connect(self.database_url, connect_timeout=2).close()
        except psycopg2.Error:
            return False
        return True

    def redis_answers(self, db: int) -> bool:
        try:
            return bool(redis_lib.Redis.from_url(self.redis_url(db), socket_timeout=1, socket_connect_timeout=1).ping())
        except redis_lib.RedisError:
            return False

    def close(self) -> None:
        for proc in self.replacements:
            proc.terminate()
            proc.wait(timeout=15)
        if self.own_pgdata is not None:
            # pgserver stops only the postmaster it started; the one our restart started would outlive
            # the harness (and the suite), holding the data folder and a Postgres per run.
            with contextlib.suppress(subprocess.CalledProcessError):
                _pg_ctl(self.own_pgdata, "stop", "-m", "fast")


def _pg_ctl(pgdata: Path, *args: str) -> None:
    from pgserver._commands import create_command_function  # pgserver's own binaries (only with our own server)
    from pgserver.postgres_server import PostgresServer

    # What pgserver binds to pgserver._commands.pg_ctl at import, by a setattr that mypy cannot see.
    pg_ctl = create_command_function("pg_ctl")

    user = PostgresServer._instances[pgdata.resolve()].system_user  # "pgserver" when we run as root (README)
    pg_ctl(["-w", *args], pgdata=pgdata, user=user, timeout=60)


@contextlib.contextmanager
def _admin(url: str) -> Iterator[Any]:
    conn = psycopg2.connect(url, connect_timeout=5)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            yield cur
    finally:
        conn.close()


@contextlib.contextmanager
def servers(kind: str, data_dir: Path) -> Iterator[Servers]:
    with contextlib.ExitStack() as stack:
        if kind == "given":
            found = Servers(admin_url=os.environ["DATABASE_URL"], redis_url=os.environ["REDIS_URL"],
                            own_pgdata=None, own_redis=False)
        else:
            data_dir.mkdir(parents=True, exist_ok=True)
            admin_url = stack.enter_context(_embedded_postgres(data_dir))
            redis_url = stack.enter_context(_embedded_redis(data_dir))
            found = Servers(admin_url=admin_url, redis_url=redis_url, own_pgdata=(data_dir / "pg").resolve(), own_redis=True)
        stack.callback(found.close)
        yield found


# --------------------------------------------------------------------------------------------
# Processes


def _child_pids(pid: int, *, recursive: bool = True) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                    found.append(int(entry.name))
    return found + [c for p in found for c in _child_pids(p)] if recursive else found


def _cmdline(pid: int) -> list[str]:
    try:
        return [a for a in (Path("/proc") / str(pid) / "cmdline").read_bytes().decode().split("\0") if a]
    except OSError:
        return []


def _wait_gone(pid: int, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it when it is ours
        time.sleep(0.1)


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    def start(self, env: dict[str, str]) -> None:
        with self.log.open("ab") as out:
            # Own session, so a kill reaches the whole tree (celery's pool, gunicorn's workers).
            self.proc = subprocess.Popen(self.argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)

    def wait(self, *, timeout_s: float) -> None:
        """Until the started process has ended (after a signal)."""
        assert self.proc is not None, f"{self.name} was never started"
        self.proc.wait(timeout=timeout_s)

    def stop(self, *, timeout_s: float = 30) -> bool:
        """SIGTERM, then SIGKILL after `timeout_s`; True when it stopped by itself."""
        if self.proc is None or self.proc.poll() is not None:
            return True
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
            return False


@dataclass
class HonestNode:
    name: str
    token: str
    spool: Path
    gpus: list[str]
    child: Child


# --------------------------------------------------------------------------------------------
# The rogue node: a process of its own (`soak.py rogue CONFIG`)


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sample(gpu: str, start: float, **overrides: Any) -> dict[str, Any]:
    sample = {"start": _iso(start), "seconds": 1, "gpu": gpu, "tenant": "acme", "namespace": "acme-prod",
              "pod": "rogue-1", "container": "main", "pod_uid": "", "sla_tier": "gold",
              "mem_used_mb_s": 1024.0, "mem_granted_mb_s": 2048.0, "sm_used_s": 10.0, "sm_granted_s": 20.0,
              "pcie_mb": 1.0}
    sample.update(overrides)
    return sample


def hostile_request(kind: str, *, seq: int, own_gpu: str, victim_gpu: str, now: float) -> tuple[bytes, dict[str, str]]:
    """Body and headers of one hostile upload; each is refused for exactly one reason."""
    start = float(int(now) - 20)  # well inside the window a batch may cover
    gpu = {**A100, "uuid": own_gpu}
    samples = [_sample(own_gpu, start)]
    headers = {"Content-Type": "application/json"}
    if kind == "steal_gpu":  # another node's GPU: 403, and the owner keeps billing it
        gpu, samples = {**A100, "uuid": victim_gpu}, [_sample(victim_gpu, start)]
    elif kind == "overflow_pcie":
        samples = [_sample(own_gpu, start, pcie_mb=1e25)]
    elif kind == "overflow_memory":
        gpu = {**gpu, "memory_mb": 2**31}
    elif kind == "long_name":
        samples = [_sample(own_gpu, start, pod="p" * 254)]
    elif kind == "duplicate_workload_second":
        samples = [_sample(own_gpu, start), _sample(own_gpu, start)]
    elif kind == "malformed_gzip":
        return b"\x1f\x8b\x08\x00" + os.urandom(64), {**headers, "Content-Encoding": "gzip"}
    elif kind == "garbage_json":
        return b'{"schema": "vgpu-ledger/usage-batch/v1", "node": ', headers
    document = {"schema": "vgpu-ledger/usage-batch/v1", "node": ROGUE, "batch_seq": seq,
                "window": {"start": _iso(start), "end": _iso(start + 1)}, "gpus": [gpu], "samples": samples}
    return json.dumps(document).encode(), headers


HOSTILE_KINDS = ("steal_gpu", "overflow_pcie", "overflow_memory", "long_name", "duplicate_workload_second",
                 "malformed_gzip", "garbage_json")


def run_rogue(config_path: Path) -> int:
    """Hostile uploads until the deadline or the request budget, one result line each."""
    config = json.loads(config_path.read_text())
    rng = random.Random(config["seed"])
    session = requests.Session()
    session.headers["User-Agent"] = ROGUE_AGENT
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    seq = int(_now() * 1000)
    with Path(config["results"]).open("a") as out:
        for index in range(config["max_requests"]):
            if stop.is_set() or _now() > config["deadline"]:
                break
            kind = HOSTILE_KINDS[index % len(HOSTILE_KINDS)]  # every kind, in turn
            body, headers = hostile_request(kind, seq=seq + index, own_gpu=config["own_gpu"],
                                            victim_gpu=rng.choice(config["victim_gpus"]), now=_now())
            headers["Authorization"] = f"Bearer {config['token']}"
            sent = _now()
            try:
                status: int | None = session.post(config["url"], data=body, headers=headers, timeout=10).status_code
            except requests.RequestException:
                status = None  # a killed web worker or an outage: counted, not an answer
            out.write(json.dumps({"t": sent, "kind": kind, "status": status}) + "\n")
            out.flush()
            stop.wait(config["interval_s"])
    return 0


# --------------------------------------------------------------------------------------------
# Watching: /healthz and the ledger's total, every second


@dataclass
class Watch:
    max_rollup_lag_s: float = 0.0
    health_polls: int = 0
    health_unanswered: int = 0
    totals: list[tuple[float, Decimal]] = field(default_factory=list)


class Watcher(threading.Thread):
    def __init__(self, *, url: str, database_url: str, nodes: list[str]) -> None:
        super().__init__(daemon=True)
        self.url, self.database_url, self.nodes = url, database_url, nodes
        self.watch = Watch()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            self._health()
            self._total()

    def _health(self) -> None:
        self.watch.health_polls += 1
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=3) as resp:  # noqa: S310 - loopback
                body = json.loads(resp.read())
        except urllib.error.HTTPError as error:  # 503 degraded still carries the figures
            body = json.loads(error.read() or b"{}")
        except (OSError, ValueError):
            self.watch.health_unanswered += 1
            return
        lag = body.get("ledger", {}).get("rollup_lag_s")
        if isinstance(lag, int | float):
            self.watch.max_rollup_lag_s = max(self.watch.max_rollup_lag_s, float(lag))

    def _total(self) -> None:
        try:
            conn = psycopg2.connect(self.database_url, connect_timeout=2)
        except psycopg2.Error:
            return  # an outage: the stall goes on
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT coalesce(sum(u.seconds), 0) FROM billing_usageminute u "
                            "JOIN billing_node n ON n.id = u.node_id WHERE n.name = ANY(%s)", [self.nodes])
                self.watch.totals.append((_now(), cur.fetchone()[0]))
        except psycopg2.Error:
            return
        finally:
            conn.close()


def longest_stall_s(totals: list[tuple[float, Decimal]], *, start: float, end: float) -> float:
    """Longest time inside [start, end] in which the honest ledger total did not grow."""
    points = [(t, v) for t, v in totals if start <= t <= end]
    longest, since, last = 0.0, start, None
    for t, v in points:
        if last is not None and v > last:
            since = t
        last = v
        longest = max(longest, t - since)
    return max(longest, end - since) if points else end - start


# --------------------------------------------------------------------------------------------
# The run


@dataclass
class Run:
    args: argparse.Namespace
    servers: Servers
    dir: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    web: Child | None = None
    worker: Child | None = None
    beat: Child | None = None
    rogue: Child | None = None
    rogue_token: str = ""
    nodes: list[HonestNode] = field(default_factory=list)
    outages: list[Outage] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    unplanned_exits: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self, message: str) -> None:
        line = f"soak: {datetime.now(UTC):%H:%M:%S} {message}"
        self.events.append(line)
        print(line, flush=True)


def prepare(run: Run) -> None:
    """Fresh database, schema, a rate card and one token per node; nothing is started yet."""
    recreate_database(run.servers.admin_url, DATABASE)
    run.env = child_env(run.servers.database_url)
    run.env.update(REDIS_URL=run.servers.redis_url(run.args.redis_db), VGPU_ROLLUP_EVERY_S=str(run.args.rollup_every_s),
                   VGPU_OUTAGE_RETRY_AFTER_S="2", PYTHONUNBUFFERED="1", VGPU_DATA_DIR=str(run.dir))
    redis_lib.Redis.from_url(run.env["REDIS_URL"]).flushdb()  # a Redis db of our own: no stale tasks
    manage(run.env, "migrate", "--noinput")
    # A card from 2020 on, written like the tests' fixtures: the rate-card service refuses past
    # starts by design (minutes already metered keep their price), and this database is empty.
    manage(run.env, "shell", "-c", (
        "from datetime import UTC, datetime\n"
        "from billing.models import RateCard\n"
        f"RateCard.objects.create(gpu_model={A100['model']!r}, price_per_gpu_hour='3.60', currency='USD', "
        "effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url='https://example.org/soak', "
        "source_note='soak harness')\n"))
    run.port = free_port()
    bindir = Path(sys.executable).parent
    logs = run.dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    run.web = Child("web", [str(bindir / "gunicorn"), "config.wsgi", "-c", str(REPO / "config" / "gunicorn.conf.py"),
                            "--bind", f"127.0.0.1:{run.port}",
                            "--workers", "2", "--worker-class", "sync", "--timeout", "60",
                            "--access-logfile", str(logs / "access.log"), "--access-logformat", ACCESS_FORMAT],
                    logs / "web.log")
    run.worker = Child("worker", [str(bindir / "celery"), "-A", "config", "worker", "--loglevel", "WARNING",
                                  "--concurrency", "1", "--without-gossip", "--without-mingle",
                                  "--hostname", "soak-worker@%h"], logs / "worker.log")
    run.beat = Child("beat", [str(bindir / "celery"), "-A", "config", "beat", "--loglevel", "WARNING",
                              "--schedule", str(run.dir / "celerybeat-schedule")], logs / "beat.log")
    names = [f"soak-node-{index}" for index in range(1, run.args.agents + 1)]
    # Every node's token, the rogue's included, from one Django start-up.
    tokens = dict(zip([*names, ROGUE], manage(run.env, "create_node_token", *names, ROGUE).split(), strict=True))
    run.rogue_token = tokens[ROGUE]
    for index, name in enumerate(names, start=1):
        scenario = demo_scenario(name, seed=run.args.seed * 100 + index, gpu_count=2, tenants=TENANTS)
        (run.dir / f"{name}.scenario.json").write_text(json.dumps(scenario))
        token = tokens[name]
        token_file = run.dir / f"{name}.token"
        token_file.write_text(token + "\n")
        spool = run.dir / f"{name}.spool.sqlite"
        argv = [sys.executable, "-m", "agents", "run", "--server", run.url, "--token-file", str(token_file),
                "--backend", "sim", "--scenario", str(run.dir / f"{name}.scenario.json"), "--spool", str(spool),
                "--batch-seconds", str(run.args.batch_seconds), "--timeout-s", "5", "--policy-interval-s", "30"]
        run.nodes.append(HonestNode(name, token, spool, [g["uuid"] for g in scenario["gpus"]],
                                    Child(f"agent-{name}", argv, logs / f"{name}.log")))


def start_rogue(run: Run, *, deadline: float) -> None:
    config = {"url": run.url + "/api/v1/usage/batches", "token": run.rogue_token, "seed": run.args.seed,
              "own_gpu": "GPU-soak-rogue-0", "victim_gpus": [g for n in run.nodes for g in n.gpus],
              "deadline": deadline, "max_requests": int((deadline - _now()) / run.args.rogue_interval_s) + 1,
              "interval_s": run.args.rogue_interval_s, "results": str(run.dir / "rogue.jsonl")}
    (run.dir / "rogue.json").write_text(json.dumps(config))
    run.rogue = Child("rogue", [sys.executable, str(Path(__file__).resolve()), "rogue", str(run.dir / "rogue.json")],
                      run.dir / "logs" / "rogue.log")
    run.rogue.start(run.env)


def wait_for(what: str, check: Any, *, timeout_s: float, every_s: float = 1.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise HarnessError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(every_s)


class HarnessError(RuntimeError):
    """The harness could not do its part (exit 2): not a finding about the product."""


def _query(run: Run, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with contextlib.closing(psycopg2.connect(run.servers.database_url, connect_timeout=5)) as conn, conn.cursor() as cur:
        cur.execute(sql, params or [])
        return list(cur.fetchall())


def nodes_with_batches(run: Run) -> set[str]:
    try:
        rows = _query(run, "SELECT DISTINCT n.name FROM billing_usagebatch b JOIN billing_node n ON n.id = b.node_id")
    except psycopg2.Error:
        return set()
    return {r[0] for r in rows}


def readyz(run: Run) -> bool:
    try:
        with urllib.request.urlopen(run.url + "/readyz", timeout=3) as resp:  # noqa: S310 - loopback
            return resp.status == 200
    except OSError:
        return False


# --------------------------------------------------------------------------------------------
# Faults


def schedule(*, seed: int, start: float, duration_s: float) -> list[tuple[float, str]]:
    """Every fault once per round, rounds every ~2 minutes (at least one), seeded order and jitter."""
    rng = random.Random(seed)
    rounds = max(1, int(duration_s // 120))
    kinds = [k for _ in range(rounds) for k in rng.sample(FAULTS, len(FAULTS))]
    slot = duration_s / (len(kinds) + 1)
    return [(start + slot * (i + 1) + rng.uniform(-0.2, 0.2) * slot, kind) for i, kind in enumerate(kinds)]


def inject(run: Run, kind: str, rng: random.Random) -> None:
    outage_s = run.args.outage_s
    if kind == "web_worker":
        assert run.web is not None
        assert run.web.proc is not None
        workers = _child_pids(run.web.proc.pid, recursive=False)
        victim = rng.choice(workers)
        os.kill(victim, signal.SIGKILL)
        run.log(f"fault: kill -9 gunicorn worker {victim} (of {len(workers)}; the master respawns it)")
    elif kind == "celery_worker":
        assert run.worker is not None
        run.worker.signal(signal.SIGKILL)
        run.worker.wait(timeout_s=30)
        time.sleep(1)
        run.worker.start(run.env)
        run.worker.restarts += 1
        run.log("fault: kill -9 the Celery worker (pool included), restarted after 1 s")
    elif kind == "agent":
        node = rng.choice(run.nodes)
        node.child.signal(signal.SIGKILL)
        node.child.wait(timeout_s=30)
        time.sleep(1)
        node.child.start(run.env)
        node.child.restarts += 1
        run.log(f"fault: kill -9 agent {node.name}, restarted after 1 s on the same spool")
    elif kind == "postgres":
        start = _now()
        run.servers.take_down_postgres(outage_s)
        wait_for("postgres back", run.servers.postgres_answers, timeout_s=60, every_s=0.2)
        run.outages.append(Outage(kind, start, _now(), run.servers.describe()["postgres"]))
        run.log(f"fault: postgres down {run.outages[-1].end - start:.1f} s ({run.servers.describe()['postgres']})")
    elif kind == "redis":
        start = _now()
        run.servers.take_down_redis(outage_s, db=run.args.redis_db)
        wait_for("redis back", lambda: run.servers.redis_answers(run.args.redis_db), timeout_s=60, every_s=0.2)
        run.outages.append(Outage(kind, start, _now(), run.servers.describe()["redis"]))
        run.log(f"fault: redis down {run.outages[-1].end - start:.1f} s ({run.servers.describe()['redis']})")


def supervise(run: Run) -> None:
    """A process that died without a fault is a finding; it is restarted so the run goes on."""
    for child in (run.web, run.worker, run.beat, *(n.child for n in run.nodes)):
        if child is not None and child.proc is not None and child.proc.poll() is not None:
            run.unplanned_exits.append(f"{child.name} exited with {child.proc.returncode}")
            run.log(f"unplanned exit: {child.name} ({child.proc.returncode}); restarting it")
            child.start(run.env)


# --------------------------------------------------------------------------------------------
# The end: stop, drain, catch up, compare


def drain(run: Run, node: HonestNode, *, timeout_s: float) -> int:
    """Send what the agent left pending with the agent's own uploader; returns what stays pending."""
    spool = Spool(node.spool, node=node.name, now=utc_now)
    try:
        uploader = Uploader(spool=spool, server=run.url, token=lambda: node.token)
        deadline = time.monotonic() + timeout_s
        while (pending := uploader.flush_once()) and time.monotonic() < deadline:
            time.sleep(1)
        return pending
    finally:
        spool.close()


def metered(node: HonestNode) -> tuple[dict[str, Decimal], Counter[str], int]:
    """Σ of each quantity over the node's spooled batches (their per-minute integrals, wire protocol
    v2), batches by state, and sent ones kept."""
    spool = Spool(node.spool, node=node.name, now=utc_now)
    try:
        batches = spool.list_batches()
    finally:
        spool.close()
    totals = dict.fromkeys(QUANTITIES, Decimal(0))
    for batch in batches:
        for window in json.loads(batch.json_bytes())["windows"]:
            for q in QUANTITIES:
                totals[q] += Decimal(repr(window[q]))
    return totals, Counter(b.state for b in batches), sum(b.state == "sent" for b in batches)


def ledger(run: Run) -> dict[str, dict[str, Decimal]]:
    rows = _query(run, "SELECT n.name, " + ", ".join(f"coalesce(sum(u.{q}), 0)" for q in QUANTITIES)  # noqa: S608 - constant column names
                  + " FROM billing_usageminute u JOIN billing_node n ON n.id = u.node_id GROUP BY n.name")
    return {r[0]: dict(zip(QUANTITIES, r[1:], strict=True)) for r in rows}


def integrity(run: Run) -> dict[str, Any]:
    honest = [g for n in run.nodes for g in n.gpus]
    rogue_on_honest = _query(run, "SELECT count(*) FROM billing_batchgpu g JOIN billing_usagebatch b ON b.id = g.batch_id "
                             "JOIN billing_card c ON c.id = g.card_id JOIN billing_node n ON n.id = b.node_id "
                             "WHERE n.name = %s AND c.gpu_uuid = ANY(%s)", [ROGUE, honest])[0][0]
    # Two stored batches covering the same GPU-second would bill it twice.
    overlap = _query(run, "SELECT coalesce(sum(extract(epoch FROM least(a.window_end, b.window_end) "
                     "- greatest(a.window_start, b.window_start))), 0) FROM billing_batchgpu a "
                     "JOIN billing_card ca ON ca.id = a.card_id JOIN billing_card cb ON cb.gpu_uuid = ca.gpu_uuid "
                     "JOIN billing_batchgpu b ON b.card_id = cb.id AND (a.batch_id, a.card_id) < (b.batch_id, b.card_id) "
                     "AND a.window_start < b.window_end AND b.window_start < a.window_end")[0][0]
    batches = _query(run, "SELECT count(*) FILTER (WHERE quarantined_at IS NOT NULL), "
                     "count(*) FILTER (WHERE rolled_up_at IS NULL AND quarantined_at IS NULL) FROM billing_usagebatch")[0]
    return {"rogue_batches_with_honest_gpu": int(rogue_on_honest), "duplicate_gpu_seconds": Decimal(overlap),
            "quarantined_batches": int(batches[0]), "backlog_batches": int(batches[1])}


def access_log_5xx(run: Run) -> dict[str, Any]:
    """5xx answers from the access log: inside an outage, the first one per web worker after an
    outage (its persistent connection broke), and the rest (unexpected), valid or hostile."""
    counts: Counter[str] = Counter()
    unexpected: list[str] = []
    stale_seen: set[tuple[int, str]] = set()
    path = run.dir / "logs" / "access.log"
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        match = ACCESS_LINE.match(line)
        if not match:
            continue
        counts["requests"] += 1
        status = int(match["status"])
        if status < 500 or " /healthz " in match["req"]:  # /healthz answers 503 when degraded, by design
            continue
        at = datetime.strptime(match["t"], "%d/%b/%Y:%H:%M:%S %z").timestamp()
        who = "hostile" if match["ua"] == ROGUE_AGENT else "valid"
        during = [o for o in run.outages if o.start - 1 <= at <= o.end + 2]
        after = [o for o in run.outages if o.end < at]
        key = (int(match["pid"]), after[-1].fault) if after else None
        if during:
            counts[f"{who}_in_outage"] += 1
        elif status == 503 and key is not None and key not in stale_seen:
            stale_seen.add(key)
            counts[f"{who}_stale_connection"] += 1
        else:
            counts[f"{who}_unexpected"] += 1
            unexpected.append(line)
    return {"counts": counts, "unexpected": unexpected}


def rogue_results(run: Run) -> dict[str, Counter[str]]:
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    path = run.dir / "rogue.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        entry = json.loads(line)
        by_kind[entry["kind"]][str(entry["status"])] += 1
    return by_kind


def finish(run: Run, *, soak_start: float, soak_end: float, watcher: Watcher) -> dict[str, Any]:
    if run.rogue is not None:
        run.rogue.stop(timeout_s=15)
    graceful = {n.name: n.child.stop(timeout_s=30) for n in run.nodes}  # SIGTERM: the partial batch is spooled
    run.log("agents stopped (SIGTERM); draining their spools with the agent's uploader")
    still_pending = {n.name: drain(run, n, timeout_s=run.args.drain_timeout_s) for n in run.nodes}
    caught_up_by_itself = True
    try:
        wait_for("rollup backlog 0", lambda: integrity(run)["backlog_batches"] == 0, timeout_s=run.args.drain_timeout_s)
    except HarnessError:
        caught_up_by_itself = False
        run.log("the rollup did not catch up by itself; running `manage.py rollup_usage`")
        manage(run.env, "rollup_usage")
    watcher.stopping.set()
    watcher.join(timeout=10)
    in_ledger = ledger(run)
    per_node = {}
    for node in run.nodes:
        spooled, states, kept_sent = metered(node)
        booked = in_ledger.get(node.name, dict.fromkeys(QUANTITIES, Decimal(0)))
        per_node[node.name] = {
            "spooled": spooled, "ledger": booked, "states": dict(states), "still_pending": still_pending[node.name],
            "lost": {q: max(Decimal(0), spooled[q] - booked[q]) for q in QUANTITIES},
            "duplicated": {q: max(Decimal(0), booked[q] - spooled[q]) for q in QUANTITIES},
            "undelivered": sum(c for s, c in states.items() if s != "sent"),
            # The spool keeps the newest 1000 sent batches (agents/spool.py): beyond that Σ would be short.
            "retention_truncated": kept_sent >= 1000, "graceful_stop": graceful[node.name],
            "restarts": node.child.restarts,
        }
    web5xx = access_log_5xx(run)
    return {"per_node": per_node, "integrity": integrity(run), "http": web5xx, "rogue": rogue_results(run),
            "max_rollup_lag_s": watcher.watch.max_rollup_lag_s,
            "longest_stall_s": longest_stall_s(watcher.watch.totals, start=soak_start, end=soak_end),
            "health_polls": watcher.watch.health_polls, "health_unanswered": watcher.watch.health_unanswered,
            "caught_up_by_itself": caught_up_by_itself, "outages": run.outages, "events": run.events,
            "unplanned_exits": run.unplanned_exits, "soak_s": soak_end - soak_start}


def failures(result: dict[str, Any]) -> list[str]:
    found = []
    for name, node in result["per_node"].items():
        for q in QUANTITIES:
            if node["lost"][q]:
                found.append(f"{name}: {node['lost'][q]} {q} metered but not in the ledger (lost)")
            if node["duplicated"][q]:
                found.append(f"{name}: {node['duplicated'][q]} {q} more in the ledger than metered (duplicated)")
        if node["undelivered"]:
            found.append(f"{name}: {node['undelivered']} batch(es) not delivered (spool states {node['states']})")
        if node["retention_truncated"]:
            found.append(f"{name}: the spool kept only its newest 1000 sent batches; use a shorter run or longer batches")
    integ = result["integrity"]
    if integ["rogue_batches_with_honest_gpu"]:
        found.append(f"{integ['rogue_batches_with_honest_gpu']} rogue batch GPU row(s) with an honest GPU in the ledger")
    if integ["duplicate_gpu_seconds"]:
        found.append(f"{integ['duplicate_gpu_seconds']} GPU-seconds stored twice")
    counts = result["http"]["counts"]
    found.extend(f"{counts[f'{who}_unexpected']} 5xx on {who} requests outside outages: "
                 + "; ".join(result["http"]["unexpected"][:5])
                 for who in ("valid", "hostile") if counts[f"{who}_unexpected"])
    accepted = sum(c for kinds in result["rogue"].values() for s, c in kinds.items() if s.startswith("2"))
    if accepted:
        found.append(f"{accepted} hostile upload(s) answered 2xx")
    return found


# --------------------------------------------------------------------------------------------
# Report


def _sum(result: dict[str, Any], part: str, q: str) -> Decimal:
    return sum((n[part][q] for n in result["per_node"].values()), Decimal(0))


def table(result: dict[str, Any]) -> str:
    counts, integ = result["http"]["counts"], result["integrity"]
    rows: list[tuple[str, object]] = [("honest nodes", len(result["per_node"]))]
    rows.extend((f"Σ {q}: metered (spools) / ledger", f"{_sum(result, 'spooled', q)} / {_sum(result, 'ledger', q)}")
                for q in QUANTITIES)
    rows += [
        ("lost (Σ over quantities and nodes)", sum(_sum(result, "lost", q) for q in QUANTITIES)),
        ("duplicated (Σ over quantities and nodes)", sum(_sum(result, "duplicated", q) for q in QUANTITIES)),
        ("honest batches spooled", sum(sum(n["states"].values()) for n in result["per_node"].values())),
        ("honest undelivered batches", sum(n["undelivered"] for n in result["per_node"].values())),
        ("duplicate GPU-seconds", integ["duplicate_gpu_seconds"]),
        ("rogue batches in the ledger with an honest GPU", integ["rogue_batches_with_honest_gpu"]),
        ("hostile uploads (answers)", _rogue_summary(result["rogue"])),
        ("requests in the access log", counts["requests"]),
        ("unexpected 5xx, valid requests, outside outages", counts["valid_unexpected"]),
        ("unexpected 5xx, hostile requests, outside outages", counts["hostile_unexpected"]),
        ("5xx inside outages (valid / hostile)", f"{counts['valid_in_outage']} / {counts['hostile_in_outage']}"),
        ("503 from a connection an outage broke (valid / hostile)",
         f"{counts['valid_stale_connection']} / {counts['hostile_stale_connection']}"),
        ("quarantined batches", integ["quarantined_batches"]),
        ("longest billing stall: max /healthz ledger.rollup_lag_s", f"{result['max_rollup_lag_s']:.1f} s"),
        ("longest billing stall: ledger total not growing", f"{result['longest_stall_s']:.1f} s"),
        ("rollup caught up by itself at the end", "yes" if result["caught_up_by_itself"] else "no"),
        ("agents stopped gracefully (SIGTERM)", sum(n["graceful_stop"] for n in result["per_node"].values())),
        ("unplanned process exits", len(result["unplanned_exits"])),
    ]
    lines = ["| measure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    lines += ["", "| fault | start (UTC) | down s | how |", "|---|---|---|---|"]
    lines += [f"| {o.fault} | {datetime.fromtimestamp(o.start, UTC):%H:%M:%S} | {o.end - o.start:.1f} | {o.note} |"
              for o in result["outages"]]
    return "\n".join(lines)


def _rogue_summary(by_kind: dict[str, Counter[str]]) -> str:
    return "; ".join(f"{kind}: " + ", ".join(f"{s}×{c}" for s, c in sorted(statuses.items()))
                     for kind, statuses in sorted(by_kind.items())) or "none"


def write_docs(result: dict[str, Any], *, command: str, report: str, failed: list[str]) -> None:
    machine = f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU(s), Python {platform.python_version()}"
    events = "\n".join(f"    {e}" for e in result["events"])
    verdict = "passed: nothing lost, duplicated or undelivered" if not failed else "FAILED:\n\n" + "\n".join(
        f"- {f}" for f in failed)
    (REPO / "docs" / "reliability.md").write_text(f"""# Reliability: soak and faults

The whole product (gunicorn, Celery worker and beat, Postgres, Redis, the real
agent) under kills and restarts while a rogue node sends hostile batches; what the honest agents
metered must reach the ledger exactly once. `bench/soak.py` is the harness (its docstring says how
it works); `tests/test_soak.py` runs a short form of it in `make test`. This page is written by the
command below; every number on it comes from that run.

    {command}

Machine: {machine}; shared with other work while it ran. Run length: {result['soak_s']:.0f} s of
soak, then the agents stop with SIGTERM, their spools are drained and the rollup catches up.

## Result: {verdict}

{report}

How the figures are taken: Σ metered is summed over every batch in each honest agent's spool
(Decimal of the JSON numbers); Σ ledger over `billing_usageminute` of that node. Undelivered
batches are spool rows in any state but `sent`. Duplicate GPU-seconds are overlaps between stored
batch windows of one GPU. 5xx come from gunicorn's access log: inside an outage window (from 1 s
before to 2 s after), the first 503 of each web worker after an outage (its persistent database
connection broke: config/settings.py keeps connections without a per-request check, by decision),
and the rest, which are unexpected. The stall is the longest time the honest nodes' ledger total
(polled every second) did not grow while agents were sending, and the largest `rollup_lag_s` that
`/healthz` reported.

## Events

{events}
""")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rogue"]:
        return run_rogue(Path(argv[1]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True, help="soak length (faults are spread over it)")
    parser.add_argument("--agents", type=int, default=3, help="honest sim agents")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--servers", choices=["given", "own"],
                        default="given" if os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL") else "own")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR / "soak", help="run files (and own servers)")
    parser.add_argument("--redis-db", type=int, default=11, help="the soak's Redis db number")
    parser.add_argument("--batch-seconds", type=int, default=3)
    parser.add_argument("--rollup-every-s", type=int, default=3)
    parser.add_argument("--outage-s", type=float, default=4.0, help="how long Postgres / Redis stay down")
    parser.add_argument("--rogue-interval-s", type=float, default=0.5)
    parser.add_argument("--drain-timeout-s", type=float, default=90.0)
    parser.add_argument("--json-out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--write-docs", action="store_true", help="write docs/reliability.md")
    args = parser.parse_args(argv)
    if args.servers == "given" and not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
        parser.error("--servers given needs DATABASE_URL and REDIS_URL")
    command = "python bench/soak.py " + shlex.join(argv)
    try:
        result = soak(args)
    except HarnessError as error:
        print(f"soak: the harness could not finish: {error}", file=sys.stderr)
        return 2
    report = table(result)
    print("\n" + report + "\n")
    failed = failures(result)
    if args.json_out:
        args.json_out.write_text(json.dumps({**result, "failures": failed}, default=_json_default, indent=1))
    if args.write_docs:
        write_docs(result, command=command, report=report, failed=failed)
    if failed:
        print("soak: FAILED\n" + "\n".join(f"  - {f}" for f in failed), file=sys.stderr)
        return 1
    print("soak: passed: nothing lost, duplicated or undelivered; no unexpected 5xx")
    return 0


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Outage):
        return value.__dict__
    raise TypeError(type(value).__name__)


def soak(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = args.data_dir / "run"
    if run_dir.exists():
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.mkdir(parents=True)
    with servers(args.servers, args.data_dir) as found:
        run = Run(args=args, servers=found, dir=run_dir)
        for part, how in found.describe().items():
            run.log(f"{part} fault: {how}")
        try:
            return _soak(run)
        finally:
            for child in (run.rogue, *(n.child for n in run.nodes), run.web, run.beat, run.worker):
                if child is not None:
                    child.stop(timeout_s=20)
            with contextlib.suppress(psycopg2.Error):
                recreate_database(found.admin_url, DATABASE, drop_only=True)


def _soak(run: Run) -> dict[str, Any]:
    prepare(run)
    # prepare() creates them.
    assert run.web is not None
    assert run.worker is not None
    assert run.beat is not None
    for child in (run.web, run.worker, run.beat, *(n.child for n in run.nodes)):
        child.start(run.env)
    wait_for("/readyz", lambda: readyz(run), timeout_s=120)
    # The rogue starts once every honest node owns its GPUs, so each theft attempt meets an owner.
    wait_for("a batch from every honest node", lambda: nodes_with_batches(run) >= {n.name for n in run.nodes},
             timeout_s=120)
    duration_s = run.args.minutes * 60
    soak_start = _now()
    soak_end = soak_start + duration_s
    start_rogue(run, deadline=soak_end)
    watcher = Watcher(url=run.url, database_url=run.servers.database_url, nodes=[n.name for n in run.nodes])
    watcher.start()
    rng = random.Random(run.args.seed)
    plan = schedule(seed=run.args.seed, start=soak_start, duration_s=duration_s)
    run.log(f"soaking {duration_s:.0f} s with {len(run.nodes)} honest agents, a rogue node and faults: "
            + ", ".join(kind for _, kind in plan))
    while _now() < soak_end:
        if plan and _now() >= plan[0][0]:
            inject(run, plan.pop(0)[1], rng)
        supervise(run)
        time.sleep(0.2)
    for _, kind in plan:  # a fault whose slot slipped past the end (a slow machine) still happens
        inject(run, kind, rng)
    return finish(run, soak_start=soak_start, soak_end=_now(), watcher=watcher)


if __name__ == "__main__":
    sys.exit(main())
