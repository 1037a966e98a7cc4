"""The short form of the soak-and-fault harness (bench/soak.py, docs/reliability.md): the whole product
under every fault once while a rogue node sends hostile batches, and nothing honest is lost,
duplicated or left undelivered.

It runs on servers of its own (embedded Postgres and Redis under .data/soak-test), so its
Postgres and Redis restarts are real and never touch the servers the rest of the suite uses.
VGPU_SOAK_SERVERS=given runs it on DATABASE_URL / REDIS_URL instead (its own database and Redis
db there), with the harness's stand-ins for the restarts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from tests import workers

REPO = Path(__file__).resolve().parent.parent
# Five faults about 10 s apart (each fault once: the same assertions as a longer run); with start-up
# and drain under 2 minutes in all. It was 1.3 (13 s apart), 18 s more of the suite's load-sensitive chain.
SOAK_MINUTES = "1.0"


@pytest.mark.soak
@pytest.mark.timeout(420)
def test_soak_with_every_fault_loses_duplicates_and_strands_nothing(tmp_path: Path) -> None:
    servers = os.environ.get("VGPU_SOAK_SERVERS", "own")
    out = tmp_path / "soak.json"
    command = [sys.executable, "bench/soak.py", "--minutes", SOAK_MINUTES, "--agents", "2", "--seed", "12",
               "--servers", servers, "--redis-db", str(workers.redis_db("soak")),
               "--data-dir", str(REPO / ".data" / "soak-test"), "--json-out", str(out)]
    # Bounded twice: the harness stops by itself; this is the backstop for a hung child.
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=400, check=False)
    log = (done.stdout + done.stderr)[-6000:]
    assert done.returncode in (0, 1), f"the harness itself failed:\n{log}"
    result = json.loads(out.read_text())
    assert result["failures"] == [], log
    for name, node in result["per_node"].items():
        spooled = {q: Decimal(v) for q, v in node["spooled"].items()}
        assert spooled == {q: Decimal(v) for q, v in node["ledger"].items()}, name  # exact
        assert node["undelivered"] == 0, (name, node["states"])
        assert node["states"].get("sent", 0) > 0, (name, node["states"])
    integrity = result["integrity"]
    assert integrity["rogue_batches_with_honest_gpu"] == 0
    assert Decimal(integrity["duplicate_gpu_seconds"]) == 0
    assert result["http"]["counts"].get("valid_unexpected", 0) == 0, result["http"]["unexpected"]
    assert result["http"]["counts"]["requests"] > 0, "no access log lines parsed"
    # Every fault happened, and every hostile kind was answered 4xx at least once.
    events = "\n".join(result["events"])
    for fault in ("gunicorn worker", "Celery worker", "agent soak-node", "postgres down", "redis down"):
        assert f"{fault}" in events, events
    for kind, statuses in result["rogue"].items():
        assert any(s.startswith("4") for s in statuses), (kind, statuses)
    assert result["rogue"]["steal_gpu"].get("403", 0) > 0
    assert done.returncode == 0, log
