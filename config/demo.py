"""The demo launcher behind `make demo`.

Starts (or reuses, with DATABASE_URL / REDIS_URL) Postgres and Redis, migrates, loads the
demo data set, issues node tokens, and runs the whole product as child processes:
gunicorn (web), a Celery worker, Celery beat, and one simulated agent per node running
the real agent code with its `sim` backend. Prints the URL and logins, runs until
Ctrl-C, then stops every child cleanly (agents first, so they flush their spools).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from datetime import UTC, date, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO

from agents.backends.sim import demo_fleet, demo_scenario
from config.demo_opencost import OpenCostPort, port_from_env
from config.embedded import DATA_DIR, embedded_services

ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = DATA_DIR / "demo"
LOG_DIR = DEMO_DIR / "logs"
NODES = [f"sim-a100-{i}" for i in range(1, 4)]
TENANTS = [("acme", "gold"), ("globex", "silver"), ("initech", "bronze"), ("xinghe", "silver")]
STOP_ORDER = ("agent", "web", "beat", "worker")


class _WebhookSink:
    """A loopback receiver for budget webhooks, written as a customer would write one: it checks
    the HMAC signature and appends each delivery to .data/demo/webhooks.jsonl."""

    def __init__(self, *, secret: str, path: Path) -> None:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                timestamp = self.headers.get("X-VGPU-Timestamp", "")
                expected = "sha256=" + hmac.new(sink.secret.encode(), timestamp.encode() + b"." + body,
                                                hashlib.sha256).hexdigest()
                valid = hmac.compare_digest(expected, self.headers.get("X-VGPU-Signature", ""))
                record = {"received_at": datetime.now(UTC).isoformat(), "valid_signature": valid,
                          "payload": json.loads(body or b"null")}
                with sink.path.open("a") as fh:
                    fh.write(json.dumps(record) + "\n")
                self.send_response(204 if valid else 401)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.secret, self.path = secret, path
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/budget-events"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


class _SlackSink:
    """A loopback Slack-compatible incoming webhook: it takes what Slack's does (a JSON object with
    a non-empty `text`, and optional Block Kit `blocks`), answers "ok" as Slack does, and appends
    each message to .data/demo/slack.jsonl; anything else is answered 400 invalid_payload."""

    def __init__(self, *, path: Path) -> None:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    message = json.loads(body)
                    valid = isinstance(message, dict) and isinstance(message.get("text"), str) and bool(message["text"])
                except ValueError:
                    message, valid = None, False
                if valid:
                    with sink.path.open("a") as fh:
                        fh.write(json.dumps({"received_at": datetime.now(UTC).isoformat(), "message": message}) + "\n")
                self.send_response(200 if valid else 400)
                self.end_headers()
                self.wfile.write(b"ok" if valid else b"invalid_payload")

            def log_message(self, *args: object) -> None:
                pass

        self.path = path
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # Slack's URLs are /services/<team>/<bot>/<secret>: the demo's looks the same, its secret invented.
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/T0DEMO/B0DEMO/{secrets.token_urlsafe(12)}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


# The scripted spend spike (docs/alerts.md, In the demo): globex runs a training job on a node of
# its own, on one card at the same hour of each of the previous four weeks, and on all eight in the
# hour two hours before the demo starts; the spend-anomaly rule finds that hour.
BURST_NODE = "sim-a100-burst"
_BURST_WEEKS = 4


def burst_scenario(*, gpus: int, guarantee_mb: int) -> dict[str, Any]:
    """The training job: one pod per card, each guaranteed `guarantee_mb` of it (billed as granted)."""
    scenario = demo_scenario(BURST_NODE, seed=99, gpu_count=8, tenants=[("globex", "bronze")])
    cards = scenario["gpus"][:gpus]
    workloads = [{"tenant": "globex", "namespace": "globex-training", "pod": f"trainer-{i}", "container": "trainer",
                  "pod_uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"vgpu-ledger:{BURST_NODE}:trainer-{i}")),
                  "sla_tier": "bronze", "gpu": card["uuid"], "profile": "resnet50", "guarantee_mem_mb": guarantee_mb,
                  "limit_mem_mb": card["memory_mb"], "controller_kind": "Job", "controller_name": "nightly-finetune",
                  "labels": {"app": "trainer", "team": "globex-research"}}
                 for i, card in enumerate(cards)]
    return {"node": BURST_NODE, "seed": 99, "gpus": cards, "workloads": workloads}


def history_agent_args(py: str, *, url: str, token_file: Path, scenario_file: Path, start: datetime, seconds: int,
                       spool: Path) -> list[str]:
    """The real agent metering [start, start + seconds) of simulated history on a fast clock (60 s
    samples, dry-run), as the demo's history runs it (bench/demo_savings.py runs the same)."""
    return [py, "-m", "agents", "run", "--server", url, "--token-file", str(token_file),
            "--backend", "sim", "--scenario", str(scenario_file), "--spool", str(spool),
            "--once-seconds", str(seconds), "--start", f"{start:%Y-%m-%dT%H:%M:%S}Z", "--tick-ms", "60000",
            "--meter-ms", "60000", "--batch-seconds", "3600", "--no-kube", "--enforcer", "dry-run",
            "--policy-interval-s", "3600"]


class _History(threading.Thread):
    """History, so finance has something to close, compare and chart from the first minutes.

    The real agent code meters simulated days on a fast clock (60 s samples, dry-run enforcer):
    first the last day of the previous month, which is then closed, reported (a paired report of
    the whole month) and rebalanced; then up to VGPU_DEMO_HISTORY_DAYS days of this month before today, one day at a
    time so the dashboard fills in as they land, followed by a paired report for them. Each day
    is done once (marker files), so restarting the demo never meters a GPU-second twice."""

    def __init__(self, *, py: str, env: dict[str, str], url: str,
                 agents: list[tuple[str, Path, Path]], recent_days: int, burst_token: Path) -> None:
        super().__init__(daemon=True)
        self.py, self.env, self.url, self.agents, self.burst_token = py, env, url, agents, burst_token
        today = datetime.now(UTC).date()
        self.day = today.replace(day=1) - timedelta(days=1)
        self.marker = DEMO_DIR / f"history-{self.day:%Y-%m}.done"
        first = max(today.replace(day=1), today - timedelta(days=recent_days))
        self.recent = [first + timedelta(days=i) for i in range((today - first).days)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopping = False
        # Two complete hours before the demo started: inside the day the alert rule looks at.
        self.spike_hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)

    def _agent(self, token_file: Path, scenario_file: Path, *, start: datetime, seconds: int, spool: Path,
               log: BinaryIO) -> subprocess.Popen[bytes]:
        return subprocess.Popen(  # noqa: S603 - the demo's own processes, argument lists, no shell
            history_agent_args(self.py, url=self.url, token_file=token_file, scenario_file=scenario_file,
                               start=start, seconds=seconds, spool=spool),
            env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait(self, what: str) -> None:
        for proc in self.procs:
            if proc.wait() != 0:
                raise subprocess.CalledProcessError(proc.returncode, what)

    def _meter(self, day: date, log: BinaryIO) -> None:
        midnight = datetime(day.year, day.month, day.day, tzinfo=UTC)
        self.procs = [self._agent(token_file, scenario_file, start=midnight, seconds=86400,
                                  spool=DEMO_DIR / f"{node}.history-{day}.sqlite", log=log)
                      for node, token_file, scenario_file in self.agents]
        self._wait("agent (history)")

    def _meter_spike(self, log: BinaryIO) -> None:
        """The training job's hours (burst_scenario), metered by the real agent code like any other
        history; done once (a marker file), so a restart never meters a GPU-second twice."""
        marker = DEMO_DIR / "spike.done"
        if marker.exists():
            return
        hours = [(self.spike_hour - timedelta(weeks=k), 1, 16384) for k in range(_BURST_WEEKS, 0, -1)]
        # The hours at once, each on a spool of its own whose batch numbers carry its own random id
        # (agents/spool.py), as the live and history agents of one node already run side by side.
        self.procs = []
        for hour, gpus, guarantee_mb in [*hours, (self.spike_hour, 8, 65536)]:
            scenario = DEMO_DIR / f"{BURST_NODE}.{hour:%Y%m%dT%H}.scenario.json"
            scenario.write_text(json.dumps(burst_scenario(gpus=gpus, guarantee_mb=guarantee_mb), indent=1))
            self.procs.append(self._agent(self.burst_token, scenario, start=hour, seconds=3600,
                                          spool=DEMO_DIR / f"{BURST_NODE}.{hour:%Y%m%dT%H}.sqlite", log=log))
        self._wait(f"agent ({BURST_NODE}, the training job's hours)")
        self._manage(log, "rollup_usage")
        marker.touch()
        print(f"demo: a spend spike is scripted: globex's training job ran on 8 cards at {self.spike_hour:%Y-%m-%d %H:00} "
              "UTC against 1 card at that hour of the 4 weeks before; the alert reaches /alerts/, .data/demo/mail, "
              "webhooks.jsonl and slack.jsonl within minutes", flush=True)

    def _manage(self, log: BinaryIO, *args: str) -> None:
        subprocess.run([self.py, "manage.py", *args], env=self.env, cwd=ROOT, stdout=log,  # noqa: S603 - this interpreter running manage.py, no shell
                       stderr=subprocess.STDOUT, check=True)

    def run(self) -> None:
        (DEMO_DIR / "recent.done").unlink(missing_ok=True)
        with open(LOG_DIR / "history.log", "ab") as log:
            try:
                self._meter_spike(log)
                if not self.marker.exists():
                    self._meter(self.day, log)
                    next_day = self.day + timedelta(days=1)
                    for args in (["rollup_usage"], ["close_period", "--month", f"{self.day:%Y-%m}"],
                                 # The whole month, as the dashboard's "last month" shows it: its
                                 # savings card reads only a report of exactly its period.
                                 ["paired_report", "--from", f"{self.day.replace(day=1)}", "--to", f"{next_day}"],
                                 ["propose_rebalance"]):
                        self._manage(log, *args)
                    self.marker.touch()
                    print(f"demo: history ready: {self.day:%Y-%m} is closed (see /invoices/), a paired report "
                          f"for {self.day:%Y-%m} is at /reports/, a rebalance plan at /rebalance/", flush=True)
                pending = [d for d in self.recent if not (DEMO_DIR / f"day-{d}.done").exists()]
                for day in pending:
                    if self.stopping:
                        return
                    self._meter(day, log)
                    self._manage(log, "rollup_usage")
                    (DEMO_DIR / f"day-{day}.done").touch()
                if pending and not self.stopping:
                    self._manage(log, "paired_report", "--from", f"{self.recent[0]}",
                                 "--to", f"{self.recent[-1] + timedelta(days=1)}")
                    print(f"demo: this month so far: {len(self.recent)} simulated day(s) from {self.recent[0]} "
                          "are metered and reported (see /finance/)", flush=True)
                (DEMO_DIR / "recent.done").touch()
            except (OSError, subprocess.CalledProcessError) as exc:
                if not self.stopping:
                    print(f"demo: simulated history failed ({exc}); see {LOG_DIR / 'history.log'}", flush=True)

    def stop(self) -> None:
        self.stopping = True
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)


def _free_loopback_port() -> int:
    """A port free on 127.0.0.1 now (the agent binds it a moment later; a clash fails it loudly)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(args: list[str], env: dict[str, str]) -> str:
    result = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, check=False)  # noqa: S603 - the demo's own command line, no shell
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"demo: `{' '.join(args[1:3])}` failed with exit code {result.returncode}")
    return result.stdout


def _token_file(node: str, token: str) -> Path:
    """The node's token in a file only its owner reads, as the agent's --token-file takes it."""
    path = DEMO_DIR / f"{node}.token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def _wait_healthy(url: str, procs: dict[str, subprocess.Popen[bytes]], timeout_s: float | None = None) -> dict[str, Any]:
    # VGPU_DEMO_HEALTHY_TIMEOUT_S: more patience on a loaded machine (tests on shared CPUs).
    timeout_s = float(os.environ.get("VGPU_DEMO_HEALTHY_TIMEOUT_S", "120")) if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise SystemExit(f"demo: {name} exited with code {proc.returncode}; see {LOG_DIR / (name + '.log')}")
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:  # noqa: S310 - our own loopback URL
                health: dict[str, Any] = json.loads(resp.read())
                return health
        except Exception as exc:  # noqa: BLE001 - keep polling until healthy or out of time
            last = str(exc)
        time.sleep(1)
    raise SystemExit(f"demo: {url} did not report healthy within {timeout_s:.0f} s ({last})")


def _opencost_port(py: str, env: dict[str, str], url: str) -> tuple[OpenCostPort | None, str]:
    """OpenCost's clients send no credential (docs/allocation-api.md): a loopback proxy adds a
    finance API token issued now, held only in memory. Returns the proxy and its banner line."""
    port = port_from_env(os.environ.get("VGPU_DEMO_OPENCOST_PORT"))
    if port == 0:
        return None, "opencost: off (VGPU_DEMO_OPENCOST_PORT=0)\n"
    token = _run([py, "manage.py", "create_api_token", "finance", "--name", "demo OpenCost port"], env)
    try:
        proxy = OpenCostPort(upstream=url, token=token.strip().splitlines()[-1], port=port)
    except OSError as exc:
        return None, f"opencost: port {port} is not free ({exc}); set VGPU_DEMO_OPENCOST_PORT to another\n"
    return proxy, (f"opencost: {proxy.url} (OpenCost's API as finance, read-only, no credential: kubectl-cost's\n"
                   f"  requests or the OpenCost UI; docs/allocation-api.md), e.g. curl '{proxy.url}/allocation/compute"
                   "?window=7d&aggregate=namespace&accumulate=true'\n")


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for prefix in STOP_ORDER:
        group = {n: p for n, p in procs.items() if n.startswith(prefix) and p.poll() is None}
        for proc in group.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for name, proc in group.items():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                print(f"demo: {name} did not stop in 20 s; killing it", flush=True)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main() -> int:  # noqa: PLR0915 - the demo's start-up, step by step in the order it runs
    port = int(os.environ.get("PORT", "8000"))
    py = sys.executable
    bindir = Path(py).parent
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with embedded_services() as env:
        env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        env.setdefault("VGPU_ROLLUP_EVERY_S", "10")
        # The simulated nodes report one cluster (the agents read it; their scenarios carry the
        # pods' controllers and app/team labels), so the demo can group by cluster, controller and label.
        env.setdefault("VGPU_AGENT_CLUSTER", "demo")
        # The issuer every demo invoice and credit note names (an invented company).
        env.setdefault("VGPU_ISSUER_NAME", "Example GPU Cloud Ltd")
        env.setdefault("VGPU_ISSUER_ADDRESS", "1 Example Quay|London EC1A 1AA|United Kingdom")
        env.setdefault("VGPU_ISSUER_TAX_ID", "GB 123 4567 89")
        # Budget notification emails land as files under .data/demo/mail, not on a mail server.
        env.setdefault("VGPU_EMAIL_BACKEND", "django.core.mail.backends.filebased.EmailBackend")
        env.setdefault("VGPU_EMAIL_FILE_PATH", str(DEMO_DIR / "mail"))
        # The fleet FOCUS dataset (docs/exports.md) under .data/demo/focus, every 2 minutes rather than daily.
        env.setdefault("VGPU_FOCUS_DATASET_DIR", str(DEMO_DIR / "focus"))
        env.setdefault("VGPU_FOCUS_DATASET_EVERY_S", "120")
        # Alerts (docs/alerts.md) are evaluated every minute rather than every 5, and link to this demo.
        env.setdefault("VGPU_ALERTS_EVERY_S", "60")
        # Saved views' scheduled reports are looked for every 30 s, so finance's lands within a minute.
        env.setdefault("VGPU_REPORTS_EVERY_S", "30")
        env.setdefault("VGPU_PUBLIC_URL", f"http://127.0.0.1:{port}")
        env["PYTHONUNBUFFERED"] = "1"
        # The admission webhook answers only an API server that presents this token; the demo has
        # no API server, but a product without a credential warns at every command (billing.W001).
        env.setdefault("VGPU_ADMISSION_TOKEN", secrets.token_urlsafe(32))
        # /metrics answers only a scraper with this token; the banner prints it for curl.
        env.setdefault("VGPU_METRICS_TOKEN", secrets.token_urlsafe(24))
        print("demo: migrating the database…", flush=True)
        _run([py, "manage.py", "migrate", "--noinput"], env)
        webhooks = _WebhookSink(secret=secrets.token_urlsafe(16), path=DEMO_DIR / "webhooks.jsonl")
        env["VGPU_DEMO_WEBHOOK_SECRET"] = webhooks.secret
        env["VGPU_WEBHOOK_ALLOWED_HOSTS"] = "127.0.0.1"  # budget webhooks reach loopback only when allow-listed
        slack = _SlackSink(path=DEMO_DIR / "slack.jsonl")
        logins = _run([py, "manage.py", "load_demo", "--budget-webhook-url", webhooks.url, "--alert-webhook-url",
                       webhooks.url.replace("/budget-events", "/alert-events"), "--slack-url", slack.url,
                       *(arg for node in [*NODES, BURST_NODE] for arg in ("--node", node))], env)
        del env["VGPU_DEMO_WEBHOOK_SECRET"]
        # Every node's token from one command: each Django start-up is seconds of the demo's.
        names = [*NODES, BURST_NODE]
        tokens = dict(zip(names, _run([py, "manage.py", "create_node_token", *names], env).split(), strict=True))
        agents = []
        for node, scenario in demo_fleet(NODES, tenants=TENANTS).items():
            token_file = _token_file(node, tokens[node])
            scenario_file = DEMO_DIR / f"{node}.scenario.json"
            scenario_file.write_text(json.dumps(scenario, indent=1))
            agents.append((node, token_file, scenario_file))
        burst_token = _token_file(BURST_NODE, tokens[BURST_NODE])
        url = f"http://127.0.0.1:{port}"
        commands: dict[str, list[str]] = {
            "worker": [str(bindir / "celery"), "-A", "config", "worker", "--loglevel", "INFO", "--concurrency", "2",
                       "--hostname", "demo-worker@%h"],
            "beat": [str(bindir / "celery"), "-A", "config", "beat", "--loglevel", "INFO",
                     "--schedule", str(DEMO_DIR / "celerybeat-schedule")],
            # config/gunicorn.conf.py: counters in /metrics summed over the 3 workers.
            "web": [str(bindir / "gunicorn"), "config.wsgi", "-c", str(ROOT / "config" / "gunicorn.conf.py"),
                    "--bind", f"127.0.0.1:{port}", "--workers", "3", "--worker-class", "sync", "--access-logfile", "-"],
        }
        agent_metrics: dict[str, str] = {}
        for node, token_file, scenario_file in agents:
            metrics_port = _free_loopback_port()
            agent_metrics[node] = f"http://127.0.0.1:{metrics_port}/metrics"
            commands[f"agent-{node}"] = [
                py, "-m", "agents", "run", "--server", url, "--token-file", str(token_file), "--backend", "sim",
                "--scenario", str(scenario_file), "--spool", str(DEMO_DIR / f"{node}.spool.sqlite"),
                # 10 s batches (the default is 60 s) so the demo's numbers move every few seconds.
                "--batch-seconds", "10",
                "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics_port),
            ]
        procs: dict[str, subprocess.Popen[bytes]] = {}
        history: _History | None = None
        opencost: OpenCostPort | None = None
        interrupted = False

        def on_signal(signum: int, frame: object) -> None:
            nonlocal interrupted
            interrupted = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        try:
            for name, args in commands.items():
                log = open(LOG_DIR / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
                # Own session: Ctrl-C reaches only this launcher, which stops children in order.
                procs[name] = subprocess.Popen(  # noqa: S603 - the demo's own processes, argument lists, no shell
                    args, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            health = _wait_healthy(f"{url}/healthz", procs)
            history = _History(py=py, env=env, url=url, agents=agents,
                               recent_days=int(os.environ.get("VGPU_DEMO_HISTORY_DAYS", "6")), burst_token=burst_token)
            history.start()
            opencost, opencost_line = _opencost_port(py, env, url)
            metrics_lines = (f"metrics: curl -H 'Authorization: Bearer {env['VGPU_METRICS_TOKEN']}' {url}/metrics\n"
                             + "".join(f"  agent {node}: {agent_url}\n" for node, agent_url in agent_metrics.items()))
            print(
                f"\nvGPU Ledger demo is running: {url}/\n"
                f"health: {url}/healthz ({health.get('status')})\n"
                f"{metrics_lines}{opencost_line}"
                f"fleet: {len(NODES)} simulated nodes x 8 NVIDIA A100-SXM4-80GB; logs in {LOG_DIR}\n\n"
                f"logins (each lands on its own start page; the language menu is top right):\n{logins}\n"
                "  finance        the GPU cost dashboard (cost by tenant over time, idle, savings vs static,\n"
                "                 top workloads), invoices, savings reports, closing a month\n"
                "  acme-engineer  Acme's portal: month-to-date cost and forecast, budget, cost per workload,\n"
                "                 invoices to download\n"
                "  admin          SLA tiers, rate cards, budgets, nodes and tokens, rebalance approvals, audit log\n"
                "numbers grow as agents upload (every 10 s) and the ledger rolls up (every 10 s).\n"
                f"budgets: acme has 3000 USD/month; lower it at {url}/budgets/ as admin to see enforcement.\n"
                f"  emails -> {DEMO_DIR / 'mail'}, webhooks -> {DEMO_DIR / 'webhooks.jsonl'}\n"
                f"alerts: a scripted spend spike (globex's training job) is alerted at {url}/alerts/ within minutes,\n"
                f"  by email, signed webhook and Slack-compatible webhook -> {DEMO_DIR / 'slack.jsonl'}\n"
                f"saved views: finance's \"GPU cost this month\" ({url}/views/) is e-mailed as CSV daily at this hour;\n"
                f"  today's report lands in {DEMO_DIR / 'mail'} within a minute\n"
                "history: a simulated day of last month is metered, closed and reported (about a minute),\n"
                "  then the days of this month before today (a few minutes); a line says when each is ready.\n"
                "Press Ctrl-C to stop.",
                flush=True,
            )
            while not interrupted:
                for name, proc in procs.items():
                    if proc.poll() is not None:
                        print(f"demo: {name} exited with code {proc.returncode}; see {LOG_DIR / (name + '.log')}")
                        interrupted = True
                        break
                time.sleep(0.5)
        finally:
            print("\ndemo: stopping agents, web, beat and worker…", flush=True)
            if history is not None:
                history.stop()
            _stop(procs)
            if opencost is not None:
                opencost.close()
            webhooks.close()
            slack.close()
            print("demo: stopped.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
