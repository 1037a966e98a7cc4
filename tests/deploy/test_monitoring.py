"""deploy/monitoring/: the alert rules pass promtool and their unit tests, a real agent's /metrics
passes `promtool check metrics`, every series the dashboard and the rules query is one the
service or the agent exposes, and every alert has its runbook in docs/operations.md.
(The service's exposition under gunicorn: tests/billing/test_service_metrics_gunicorn.py.)"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agents.backends.sim import demo_scenario
from agents.interfaces import Grant, UsageReading, Workload
from agents.metrics import AgentMetrics
from agents.spool import Spool
from tests import clock
from tests.promtool import promtool

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
TOKEN = "scrape-token-for-monitoring-tests"
# Series Prometheus itself makes for every target.
PROMETHEUS_SERIES = {"up"}


def _promtool(*args: str, cwd: Path = MONITORING, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, input=stdin, capture_output=True, text=True, check=False,
                          timeout=120)


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"]
            for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_alert_rules_pass_promtool_check():
    result = _promtool("check", "rules", "alerts.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_alert_fires_on_its_case_and_not_on_a_healthy_system():
    result = _promtool("test", "rules", "alerts.test.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", (MONITORING / "alerts.test.yaml").read_text()))
    assert tested == {rule["alert"] for rule in _rules()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_real_agents_exposition_passes_promtool(tmp_path):
    scenario, token = tmp_path / "scenario.json", tmp_path / "token"
    scenario.write_text(json.dumps(demo_scenario("sim-node-1", seed=1, tenants=[("acme", "gold")])))
    token.write_text("vgl_not-a-real-token\n")
    port = _free_port()
    # The service URL is a closed loopback port: uploads fail and are counted, metering goes on.
    agent = subprocess.Popen(
        [sys.executable, "-m", "agents", "run", "--server", f"http://127.0.0.1:{_free_port()}", "--token-file",
         str(token), "--backend", "sim", "--scenario", str(scenario), "--spool", str(tmp_path / "spool.sqlite"),
         "--no-kube", "--enforcer", "dry-run", "--metrics-address", "127.0.0.1", "--metrics-port", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=(tmp_path / "agent.log").open("wb"))
    try:
        text, deadline = "", time.monotonic() + 60
        while "vgpu_agent_memory_granted_bytes{" not in text:
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()
            assert time.monotonic() < deadline, f"no per-workload series within 60 s:\n{text}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    text = resp.read().decode()
            except OSError:
                time.sleep(0.3)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    result = _promtool("check", "metrics", stdin=text)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


@pytest.mark.django_db
def test_the_services_opencost_exposition_passes_promtool(client, settings):
    """/metrics/opencost with every family populated (tests/billing/test_opencost_metrics.py checks
    the values): the text Prometheus reads passes `promtool check metrics`."""
    from datetime import timedelta
    from decimal import Decimal

    from billing.ledger.models import GpuHour, UsageHour
    from billing.models import Node

    settings.VGPU_METRICS_TOKEN, settings.VGPU_METRICS_TOKEN_FILE = TOKEN, ""
    hour = clock.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    node = Node.objects.create(name="gpu-node-1", cluster="east")
    zero = Decimal(0)
    GpuHour.objects.create(gpu_uuid="GPU-1", node=node, gpu_model="A100", hour=hour, metered_seconds=Decimal(3600),
                           card_cost=Decimal(3), charged=zero, idle_cost=Decimal(3), idle_allocated=zero,
                           currency="USD", priced=True)
    UsageHour.objects.create(gpu_uuid="GPU-1", node=node, tenant="acme", namespace="acme-prod", pod="bert",
                             container="main", pod_uid="uid-bert", sla_tier="gold", seconds=Decimal(3600),
                             share_gpu_s=Decimal(1800), charge=zero, idle_share=zero, hour=hour,
                             **dict.fromkeys(("mem_billed_mb_s", "sm_billed_s", "pcie_mb", "mem_granted_mb_s",
                                              "sm_granted_s", "mem_used_mb_s", "sm_used_s"), zero))
    resp = client.get("/metrics/opencost", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert resp.status_code == 200
    text = resp.content.decode()
    for family in ("node_gpu_count{", "node_gpu_hourly_cost{", "container_gpu_allocation{", "kubecost_cluster_info{"):
        assert family in text, text
    result = _promtool("check", "metrics", stdin=text)
    # The one lint is OpenCost's own name, which dashboards query and so must stay as it is; a parse
    # error ("error while linting") or any other lint fails.
    lints = (result.stdout + result.stderr).strip().splitlines()
    assert lints == ['node_gpu_count non-histogram and non-summary metrics should not have "_count" suffix'], lints
    assert result.returncode == 3  # promtool's "lint problems", not 1 (the text did not parse)


def _agent_series(tmp_path: Path) -> set[str]:
    metrics = AgentMetrics()
    spool = Spool(tmp_path / "spool.sqlite", node="n", now=clock.now)
    try:
        metrics.watch_spool(spool)
        metrics.watch_policy(age_s=lambda: 1.0, etag=lambda: "e")
        w = Workload(tenant="t", namespace="ns", pod="p", container="c", pod_uid="u", sla_tier="gold")
        metrics.observe(grants=[Grant(workload=w, gpu="G", mem_mb=1.0, sm=1.0)],
                        readings=[UsageReading(workload=w, gpu="G", mem_used_mb=1.0, sm_used=1.0, pcie_mb_per_s=0)])
        metrics.record_tick(0.001)
        metrics.record_upload_error("retry")
        return {s.name for family in metrics.registry.collect() for s in family.samples}
    finally:
        spool.close()


def _service_series(client, settings) -> set[str]:
    settings.VGPU_METRICS_TOKEN, settings.VGPU_METRICS_TOKEN_FILE = TOKEN, ""
    resp = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert resp.status_code == 200
    families = list(text_string_to_metric_families(resp.content.decode()))
    # Family names too: a gauge with no samples yet (no undelivered batch, no cost) is still declared.
    return {f.name for f in families} | {s.name for f in families for s in f.samples}


_FUNCTIONS_AND_KEYWORDS = {
    "max", "min", "sum", "avg", "count", "by", "without", "rate", "irate", "increase", "absent", "vector", "or",
    "and", "unless", "histogram_quantile", "le", "on", "ignoring",
}


def _queried_series(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside label matchers, {{ }} templates and
    range selectors that are neither functions nor keywords nor label names in by (...)."""
    stripped = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)
    stripped = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", stripped)
    return {name for name in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", stripped)
            if name not in _FUNCTIONS_AND_KEYWORDS and not re.fullmatch(r"\d.*|e\d*", name)}


@pytest.mark.django_db
def test_every_series_the_dashboard_and_the_rules_query_is_exposed(client, settings, tmp_path):
    exposed = _service_series(client, settings) | _agent_series(tmp_path) | PROMETHEUS_SERIES
    exprs = _dashboard_exprs() + [rule["expr"] for rule in _rules()]
    queried = set().union(*map(_queried_series, exprs))
    assert "vgpu_agent_tick_seconds_bucket" in queried
    assert "vgpu_ledger_rollup_lag_seconds" in queried
    assert queried - exposed == set()


def test_the_scrape_config_has_the_jobs_the_rules_and_dashboard_name():
    config = yaml.safe_load((MONITORING / "prometheus.yaml").read_text())
    assert config["rule_files"] == ["alerts.yaml"]
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    named = set(re.findall(r'job="([^"]+)"', " ".join(_dashboard_exprs() + [r["expr"] for r in _rules()])))
    # The opencost job feeds dashboards written for OpenCost's metrics, not ours.
    assert named == jobs - {"opencost"} == {"vgpu-ledger-web", "vgpu-agent"}
    [opencost] = [job for job in config["scrape_configs"] if job["job_name"] == "opencost"]
    assert opencost["metrics_path"] == "/metrics/opencost"
    assert opencost["honor_labels"] is True


def test_every_alert_has_a_summary_a_description_and_a_runbook_in_operations_md():
    headings = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", (ROOT / "docs" / "operations.md").read_text(), re.M)}
    for rule in _rules():
        annotations = rule["annotations"]
        assert annotations["summary"], rule["alert"]
        assert annotations["description"], rule["alert"]
        page, _, anchor = annotations["runbook_url"].partition("#")
        assert page == "docs/operations.md", (rule["alert"], anchor)
        assert anchor in headings, (rule["alert"], anchor)

