"""`make demo` as a newcomer runs it: the launcher starts web, worker, beat and three
simulated agents, the finance page shows live, growing numbers, and Ctrl-C stops it all."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from decimal import Decimal
from pathlib import Path

import psycopg2
import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def demo_env(tmp_path):
    """The demo on its own database and Redis db, so it never touches the test database."""
    url = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    admin = psycopg2.connect(os.environ["DATABASE_URL"])
    admin.autocommit = True
    # Own database per run: two test runs on one server must not drop each other's.
    name = f"vgpu_demo_test_{os.getpid()}"
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {name}")
    env = dict(os.environ)
    env["DATABASE_URL"] = urllib.parse.urlunsplit(url._replace(path=f"/{name}"))
    redis = urllib.parse.urlsplit(os.environ["REDIS_URL"])
    env["REDIS_URL"] = urllib.parse.urlunsplit(redis._replace(path="/13"))
    env["VGPU_DATA_DIR"] = str(tmp_path)
    env["PORT"] = str(_free_port())
    env["VGPU_ROLLUP_EVERY_S"] = "3"
    env.pop("DJANGO_SETTINGS_MODULE", None)
    yield env
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    admin.close()


def _total_cost(session: requests.Session, base: str) -> Decimal:
    html = session.get(f"{base}/finance/", timeout=10).text
    match = re.search(r'data-testid="total-gpu-cost">([\d,.]+)', html)
    assert match, html[:2000]
    return Decimal(match.group(1).replace(",", ""))


def _login(base: str, username: str, password: str) -> requests.Session:
    s = requests.Session()
    s.get(f"{base}/accounts/login/", timeout=10)
    resp = s.post(f"{base}/accounts/login/", timeout=10, headers={"Referer": f"{base}/accounts/login/"},
                  data={"username": username, "password": password, "next": "/budgets/",
                        "csrfmiddlewaretoken": s.cookies["csrftoken"]})
    assert resp.url.endswith("/budgets/"), resp.url
    return s


def _lower_acme_budget_and_watch_enforcement(banner: str, base: str, demo_dir: Path) -> None:
    """Issue 6's demo: an admin lowers acme's budget below its spend; the tenant sees it
    enforced, agents get the throttle in their next policy poll, an email and a signed webhook
    are delivered, and the audit log has each step."""
    admin = _login(base, "admin", re.search(r"user admin\s+password (\S+)", banner).group(1))
    # Start from the budget's current values (the demo configured its email and webhook).
    page = admin.get(f"{base}/budgets/acme/", timeout=10).text
    form = dict(re.findall(r'<input type="[^"]*" name="([a-z_]+)" value="([^"]*)"', page))
    form.update(re.findall(r'<select name="([a-z_]+)"[^>]*>.*?<option value="([^"]*)" selected', page, re.S))
    assert form.get("webhook_url", "").startswith("http://127.0.0.1:"), form
    form.update({"amount": "0.01", "csrfmiddlewaretoken": admin.cookies["csrftoken"]})
    resp = admin.post(f"{base}/budgets/acme/", data=form, timeout=10, headers={"Referer": f"{base}/budgets/acme/"})
    assert resp.url.endswith("/budgets/"), resp.text[:1000]
    tenant = _login(base, "acme-engineer", re.search(r"user acme-engineer\s+password (\S+)", banner).group(1))
    deadline = time.monotonic() + 60
    state = ""
    while state != "enforced" and time.monotonic() < deadline:
        match = re.search(r'data-testid="budget-state-acme"><strong>(\w+)', tenant.get(f"{base}/budgets/").text)
        state = match.group(1) if match else ""
        time.sleep(1)
    assert state == "enforced"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        throttled = any("throttled=acme" in p.read_text() for p in (demo_dir / "logs").glob("agent-*.log"))
        mails = list((demo_dir / "mail").glob("*.log"))
        hooks = (demo_dir / "webhooks.jsonl").read_text().splitlines() if (demo_dir / "webhooks.jsonl").exists() else []
        if throttled and mails and hooks:
            break
        time.sleep(2)
    assert throttled, "no agent applied the throttle"
    assert mails, "no budget email"
    assert hooks and json.loads(hooks[-1])["valid_signature"], "no signed budget webhook"
    audit = admin.get(f"{base}/audit/", params={"action": "budget."}, timeout=10).text
    assert "budget.set" in audit and "budget.state_changed" in audit


def _finance_sees_the_simulated_day(banner: str, base: str, demo_dir: Path) -> None:
    """Issue 5's demo: after the simulated day, finance sees a closed period, downloads invoices
    in all three formats, opens the paired report beside the study's figures, and sees a
    rebalance plan with its savings."""
    deadline = time.monotonic() + 240
    while not list(demo_dir.glob("history-*.done")) and time.monotonic() < deadline:
        time.sleep(2)
    assert list(demo_dir.glob("history-*.done")), (demo_dir / "logs" / "history.log").read_text()[-3000:]
    finance = _login(base, "finance", re.search(r"user finance\s+password (\S+)", banner).group(1))
    invoices = finance.get(f"{base}/invoices/", timeout=10).text
    numbers = sorted(set(re.findall(r"/invoices/(VGL-[0-9]{6}-[a-z0-9-]+)\.pdf", invoices)))
    assert numbers, invoices[:2000]
    for fmt, magic in (("pdf", b"%PDF"), ("csv", b""), ("focus", b"")):
        resp = finance.get(f"{base}/invoices/{numbers[0]}.{fmt}", timeout=60)
        assert resp.status_code == 200 and resp.content.startswith(magic) and resp.content, fmt
    reports = finance.get(f"{base}/reports/", timeout=10).text
    report_id = re.search(r'href="/reports/(\d+)/"', reports).group(1)
    detail = finance.get(f"{base}/reports/{report_id}/", timeout=10).text
    assert 'data-testid="study-comparison"' in detail and "−37 %" in detail
    plans = finance.get(f"{base}/rebalance/", timeout=10).text
    assert 'data-testid="rebalance-plan-' in plans


def test_demo_serves_growing_numbers_and_stops_cleanly_on_ctrl_c(demo_env):
    proc = subprocess.Popen([sys.executable, "-m", "config.demo"], cwd=ROOT, env=demo_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    try:
        deadline = time.monotonic() + 150
        while not any("Press Ctrl-C" in line for line in out):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "".join(out)
            out.append(line)
            assert time.monotonic() < deadline, "".join(out)
        text = "".join(out)
        password = re.search(r"user finance\s+password (\S+)", text).group(1)
        base = f"http://127.0.0.1:{demo_env['PORT']}"
        health = requests.get(f"{base}/healthz", timeout=10)
        assert health.status_code == 200 and health.json()["worker"]["ok"]
        s = requests.Session()
        s.get(f"{base}/accounts/login/", timeout=10)
        resp = s.post(f"{base}/accounts/login/", timeout=10, headers={"Referer": f"{base}/accounts/login/"},
                      data={"username": "finance", "password": password, "next": "/finance/",
                            "csrfmiddlewaretoken": s.cookies["csrftoken"]})
        assert resp.url.endswith("/finance/")
        first = Decimal(0)
        deadline = time.monotonic() + 60
        while first == 0 and time.monotonic() < deadline:
            time.sleep(2)
            first = _total_cost(s, base)
        assert first > 0, "no priced usage within a minute of the demo starting"
        deadline = time.monotonic() + 60
        later = first
        while later <= first and time.monotonic() < deadline:
            time.sleep(3)
            later = _total_cost(s, base)
        assert later > first, "the finance page's numbers did not grow"
        _lower_acme_budget_and_watch_enforcement(text, base, Path(demo_env["VGPU_DATA_DIR"]) / "demo")
        _finance_sees_the_simulated_day(text, base, Path(demo_env["VGPU_DATA_DIR"]) / "demo")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rest, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, rest
    assert "demo: stopped." in rest
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", int(demo_env["PORT"]))) != 0, "the web server still listens"
    leftovers = subprocess.run(["pgrep", "-f", str(demo_env["VGPU_DATA_DIR"])], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", leftovers.stdout
