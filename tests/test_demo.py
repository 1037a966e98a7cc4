"""`make demo` as a newcomer runs it: the launcher starts web, worker, beat and three
simulated agents, the finance page shows live, growing numbers, and Ctrl-C stops it all.

It runs on the suite's shared demo (the `demo` fixture), as the last test of its group: each
demo of its own was minutes of the suite's longest path, and this test's budget change and its
Ctrl-C would disturb every test after it."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from decimal import Decimal
from pathlib import Path

import requests

from tests.demo_process import STARTUP_BUDGET_S, Demo
from tests.promtool import promtool


def _total_cost(session: requests.Session, base: str) -> Decimal:
    html = session.get(f"{base}/finance/", timeout=10).text
    match = re.search(r'data-testid="total-gpu-cost">([\d,.]+)', html)
    assert match, html[:2000]
    return Decimal(match.group(1).replace(",", ""))


def _found(pattern: str, text: str) -> str:
    """The first group of the pattern's first match in the text, which must have one."""
    match = re.search(pattern, text)
    assert match, (pattern, text[:2000])
    return match.group(1)


def _login(base: str, username: str, password: str, landing: str = "/budgets/") -> requests.Session:
    s = requests.Session()
    s.get(f"{base}/accounts/login/", timeout=10)
    resp = s.post(f"{base}/accounts/login/", timeout=10, headers={"Referer": f"{base}/accounts/login/"},
                  data={"username": username, "password": password, "next": landing,
                        "csrfmiddlewaretoken": s.cookies["csrftoken"]})
    assert resp.url.endswith(landing), resp.url
    return s


def _lower_acme_budget_and_watch_enforcement(banner: str, base: str, demo_dir: Path) -> None:
    """The budgets demo: an admin lowers acme's budget below its spend; the tenant sees it
    enforced, agents get the throttle in their next policy poll, an email and a signed webhook
    are delivered, and the audit log has each step."""
    admin = _login(base, "admin", _found(r"user admin\s+password (\S+)", banner))
    # Start from the budget's current values (the demo configured its email and webhook).
    page = admin.get(f"{base}/budgets/acme/", timeout=10).text
    form = dict(re.findall(r'<input type="[^"]*" name="([a-z_]+)" value="([^"]*)"', page))
    form.update(re.findall(r'<select name="([a-z_]+)"[^>]*>.*?<option value="([^"]*)" selected', page, re.S))
    assert form.get("webhook_url", "").startswith("http://127.0.0.1:"), form
    form.update({"amount": "0.01", "csrfmiddlewaretoken": admin.cookies["csrftoken"]})
    resp = admin.post(f"{base}/budgets/acme/", data=form, timeout=10, headers={"Referer": f"{base}/budgets/acme/"})
    assert resp.url.endswith("/budgets/"), resp.text[:1000]
    tenant = _login(base, "acme-engineer", _found(r"user acme-engineer\s+password (\S+)", banner))
    deadline = time.monotonic() + 60
    state = ""
    while state != "enforced" and time.monotonic() < deadline:
        match = re.search(r'data-testid="budget-state-acme" data-state="(\w+)"', tenant.get(f"{base}/budgets/").text)
        state = match.group(1) if match else ""
        time.sleep(1)
    assert state == "enforced"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        throttled = any("throttled=acme" in p.read_text() for p in (demo_dir / "logs").glob("agent-*.log"))
        # The demo's alert rule mails and posts to the same places: only the budget's count here.
        mails = [p for p in (demo_dir / "mail").glob("*.log") if "Budget of Acme" in p.read_text()]
        hooks = [h for h in ((demo_dir / "webhooks.jsonl").read_text().splitlines()
                             if (demo_dir / "webhooks.jsonl").exists() else [])
                 if str(json.loads(h)["payload"].get("event", "")).startswith("budget.")]
        if throttled and mails and hooks:
            break
        time.sleep(2)
    assert throttled, "no agent applied the throttle"
    assert mails, "no budget email"
    assert hooks, "no signed budget webhook"
    assert json.loads(hooks[-1])["valid_signature"], "no signed budget webhook"
    audit = admin.get(f"{base}/audit/", params={"action": "budget."}, timeout=10).text
    assert "budget.set" in audit
    assert "budget.state_changed" in audit


def _finance_sees_the_simulated_day(demo: Demo) -> None:
    """The invoices demo: after the simulated day, finance sees a closed period, downloads invoices
    in all three formats, opens the paired report beside the study's figures, and sees a
    rebalance plan with its savings."""
    demo.wait_for_history()
    base = demo.base
    finance = _login(base, "finance", demo.passwords["finance"])
    invoices = finance.get(f"{base}/invoices/", timeout=10).text
    numbers = sorted(set(re.findall(r"/invoices/(VGL-[0-9]{6}-[a-z0-9-]+)\.pdf", invoices)))
    assert numbers, invoices[:2000]
    for fmt, magic in (("pdf", b"%PDF"), ("csv", b""), ("focus", b"")):
        resp = finance.get(f"{base}/invoices/{numbers[0]}.{fmt}", timeout=60)
        assert resp.status_code == 200, fmt
        assert resp.content.startswith(magic), fmt
        assert resp.content, fmt
    reports = finance.get(f"{base}/reports/", timeout=10).text
    report_id = _found(r'href="/reports/(\d+)/"', reports)
    detail = finance.get(f"{base}/reports/{report_id}/", timeout=10).text
    assert 'data-testid="study-comparison"' in detail
    assert "−37 %" in detail
    for other in sorted(set(re.findall(r'href="/reports/(\d+)/"', reports))):
        _dynamic_costs_less_than_every_static_alternative(finance.get(f"{base}/reports/{other}/", timeout=10).text)
    plans = finance.get(f"{base}/rebalance/", timeout=10).text
    assert 'data-testid="rebalance-plan-' in plans


def _dynamic_costs_less_than_every_static_alternative(detail: str) -> None:
    """The demo's point: each paired report places every static alternative on the demo's own cards
    (none may be infeasible: an alternative the fleet could not hold is not a baseline) and dynamic
    allocation, as the agents ran it, costs less than each of them. The reports span the history's
    days, the training job's hours and the live agents' minutes, with stretches between them that
    no agent metered."""
    assert 'data-testid="alternative-infeasible-' not in detail, detail[:3000]
    costs = {key: Decimal(re.sub(r"[^0-9.]", "", shown))
             for key, shown in re.findall(r'data-testid="alternative-cost-([a-z_]+)"[^>]*>([^<]+)<', detail)}
    assert set(costs) == {"dynamic", "whole_card", "fixed_profile", "request_fraction"}, costs
    assert all(costs["dynamic"] < cost for key, cost in costs.items() if key != "dynamic"), costs


def _every_batch_was_delivered(demo: Demo) -> None:
    """Reliability: history and live agents of one node never collide, so no node holds a refused
    batch — as the service sees it (/healthz and the nodes page), not only the agents' logs."""
    base = demo.base
    admin = _login(base, "admin", demo.passwords["admin"], landing="/nodes/")
    assert admin.get(f"{base}/healthz", timeout=10).json()["ledger"]["undelivered_batches"] == 0
    html = admin.get(f"{base}/nodes/", timeout=10).text
    counts = dict(re.findall(r'data-testid="node-undelivered-([\w-]+)" data-count="(\d+)"', html))
    assert set(counts) >= {"sim-a100-1", "sim-a100-2", "sim-a100-3"}, counts
    assert set(counts.values()) == {"0"}, counts


def _the_service_and_every_agent_serve_valid_metrics(demo: Demo) -> None:
    """The banner's curl line and agent URLs work, and each exposition passes `promtool check metrics`."""
    token = re.search(r"metrics: curl -H 'Authorization: Bearer (\S+)' (\S+)", demo.banner)
    assert token, demo.banner
    agents = re.findall(r"^  agent (\S+): (http://127\.0\.0\.1:\d+/metrics)$", demo.banner, flags=re.M)
    assert len(agents) == 3, demo.banner
    scrapes = {"service": requests.get(token.group(2), headers={"Authorization": f"Bearer {token.group(1)}"},
                                       timeout=30)}
    scrapes |= {node: requests.get(url, timeout=10) for node, url in agents}
    for name, response in scrapes.items():
        assert response.status_code == 200, (name, response.text[:500])
        checked = subprocess.run([promtool(), "check", "metrics"], input=response.text, capture_output=True,
                                 text=True, timeout=60, check=False)
        assert checked.returncode == 0, (name, checked.stdout, checked.stderr)
    assert "vgpu_ledger_ingest_samples_total" in scrapes["service"].text
    for node, _ in agents:
        assert re.search(r"^vgpu_agent_memory_granted_bytes\{", scrapes[node].text, flags=re.M), node
        # The agents run the load predictor by default (docs/prediction.md): its forecasts are exported.
        assert re.search(r"^vgpu_agent_memory_predicted_bytes\{", scrapes[node].text, flags=re.M), node
        assert re.search(r"^vgpu_agent_sm_predicted\{", scrapes[node].text, flags=re.M), node


def test_demo_serves_growing_numbers_and_stops_cleanly_on_ctrl_c(demo: Demo) -> None:
    # Its banner came within the start-up a newcomer is promised (history follows it).
    assert demo.banner_after_s <= STARTUP_BUDGET_S, demo.banner_after_s
    try:
        text, base = demo.banner, demo.base
        health = requests.get(f"{base}/healthz", timeout=10)
        # Anonymous: the status only.
        assert health.status_code == 200
        assert health.json() == {"status": "ok"}
        detail = _login(base, "admin", demo.passwords["admin"]).get(f"{base}/healthz", timeout=10)
        assert detail.status_code == 200
        assert detail.json()["worker"]["ok"]
        s = _login(base, "finance", demo.passwords["finance"], landing="/finance/")
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
        _lower_acme_budget_and_watch_enforcement(text, base, demo.data_dir)
        _finance_sees_the_simulated_day(demo)
        _every_batch_was_delivered(demo)
        _the_service_and_every_agent_serve_valid_metrics(demo)
    finally:
        demo.stop()  # Ctrl-C, as a newcomer stops it
    assert demo.proc.returncode == 0, demo.rest
    assert "demo: stopped." in demo.rest
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", int(demo.env["PORT"]))) != 0, "the web server still listens"
    leftovers = subprocess.run(["pgrep", "-f", str(demo.env["VGPU_DATA_DIR"])], capture_output=True, text=True,
                               check=False)
    assert leftovers.stdout.strip() == "", leftovers.stdout
