"""End to end on real components: the real agent (sim backend) uploads over HTTP to the real
Django server (live server thread on the test Postgres), the rollup prices it, and the
ledger's totals equal exactly what the agent metered — also across a server outage."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.db.models import Sum

from agents.__main__ import main as agent_main
from agents.backends.sim import demo_scenario
from agents.spool import Spool
from billing.ledger.models import GpuMinute, UsageBatch, UsageMinute
from billing.ledger.rollup import rollup_usage
from billing.models import RateCard
from billing.services.demo import A100_80GB_MODEL
from billing.services.identity.tokens import issue_node_token
from tests import clock

NODE = "e2e-node"
QUANTITIES = ("mem_used_mb_s", "mem_granted_mb_s", "sm_used_s", "sm_granted_s", "pcie_mb")


@pytest.fixture
def agent_files(tmp_path: Path, transactional_db) -> dict[str, Path]:
    token = issue_node_token(node_name=NODE, now=clock.now(), actor_label="test").token
    files = {"token": tmp_path / "token", "scenario": tmp_path / "scenario.json", "spool": tmp_path / "spool.sqlite"}
    files["token"].write_text(token + "\n")
    scenario = demo_scenario(NODE, seed=3, gpu_count=2, tenants=[("acme", "gold"), ("globex", "silver")])
    files["scenario"].write_text(json.dumps(scenario))
    RateCard.objects.create(gpu_model=A100_80GB_MODEL, currency="USD", price_per_gpu_hour=Decimal("3.6"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    return files


def run_agent(files: dict[str, Path], server: str, seconds: int, start: datetime, *, wire: str = "v2") -> int:
    return agent_main([
        "run", "--server", server, "--token-file", str(files["token"]), "--backend", "sim",
        "--scenario", str(files["scenario"]), "--spool", str(files["spool"]), "--wire", wire,
        "--batch-seconds", "10", "--once-seconds", str(seconds), "--start", start.isoformat().replace("+00:00", "Z"),
    ])


def metered_totals(spool_path: Path) -> tuple[dict[str, Decimal], int, int]:
    """What the agent metered: Σ of each quantity over every per-second sample the spool keeps as
    evidence, the windows its batches sent (their per-minute integrals), and the batches."""
    spool = Spool(spool_path, node=NODE, now=clock.now)
    try:
        batches = spool.list_batches()
        totals = dict.fromkeys(QUANTITIES, Decimal(0))
        for s in spool.export_samples(start=datetime(2000, 1, 1, tzinfo=UTC), end=datetime(2100, 1, 1, tzinfo=UTC)):
            for q in QUANTITIES:
                totals[q] += Decimal(repr(s[q]))
        # What each batch carried: its windows (v2) or its samples (an agent run with --wire v1).
        documents = [json.loads(b.json_bytes()) for b in batches]
        windows = sum(len(d["windows"] if "windows" in d else d["samples"]) for d in documents)
        return totals, windows, len(batches)
    finally:
        spool.close()


def ledger_totals() -> dict[str, Decimal]:
    sums = UsageMinute.objects.aggregate(**{q: Sum(q) for q in QUANTITIES})
    return {q: sums[q] or Decimal(0) for q in QUANTITIES}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("wire", ["v2", "v1"])  # v1: an agent not yet upgraded keeps working
def test_agent_to_priced_ledger_with_exact_totals(agent_files, live_server, wire):
    start = clock.now().replace(second=0, microsecond=0) - timedelta(minutes=5)  # whole batches: they close on whole 10 s
    assert run_agent(agent_files, live_server.url, 60, start, wire=wire) == 0
    expected, windows, batches = metered_totals(agent_files["spool"])
    assert batches == 6
    assert windows > 0
    assert UsageBatch.objects.count() == 6
    assert UsageBatch.objects.aggregate(n=Sum("sample_count"))["n"] == windows
    rollup_usage(now=clock.now())
    assert ledger_totals() == expected
    for gm in GpuMinute.objects.all():
        assert gm.priced
        assert gm.charged + gm.idle_cost == gm.card_cost
    # 2 GPUs metered for 60 s each at 0.001 per GPU-second.
    assert GpuMinute.objects.aggregate(s=Sum("card_cost"))["s"] == Decimal("0.12")
    assert UsageMinute.objects.aggregate(s=Sum("charge"))["s"] > 0


def test_spooled_batches_survive_a_server_outage_and_land_exactly_once(agent_files, live_server):
    start = clock.now().replace(second=0, microsecond=0) - timedelta(minutes=5)  # whole batches: they close on whole 10 s
    down = f"http://127.0.0.1:{closed_port()}"
    # Server down: the agent meters and spools, and exits 75 with batches pending.
    assert run_agent(agent_files, down, 30, start) == 75
    assert UsageBatch.objects.count() == 0
    # Server back: the old batches go first, then the new ones; nothing is lost or doubled.
    assert run_agent(agent_files, live_server.url, 30, start + timedelta(seconds=30)) == 0
    expected, windows, batches = metered_totals(agent_files["spool"])
    assert batches == 6
    assert UsageBatch.objects.count() == 6
    assert UsageBatch.objects.aggregate(n=Sum("sample_count"))["n"] == windows
    # A replay of every batch (e.g. an agent restored from a backup) answers duplicate.
    spool = Spool(agent_files["spool"], node=NODE, now=clock.now)
    try:
        import requests

        token = agent_files["token"].read_text().strip()
        for b in spool.list_batches():
            body = b.json_bytes()
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            if body[:2] == b"\x1f\x8b":
                headers["Content-Encoding"] = "gzip"
            resp = requests.post(f"{live_server.url}/api/v1/usage/batches", data=body, headers=headers, timeout=10)
            assert resp.status_code == 200
            assert resp.json() == {"status": "duplicate"}
    finally:
        spool.close()
    rollup_usage(now=clock.now())
    assert ledger_totals() == expected
