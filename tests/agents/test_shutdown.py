"""SIGTERM: the running agent spools its partial batch and exits 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from agents.backends.sim import demo_scenario
from agents.spool import Spool
from tests import clock

REPO = Path(__file__).resolve().parents[2]


def test_sigterm_spools_the_partial_batch_and_exits_zero(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t\n")
    (tmp_path / "scenario.json").write_text(
        json.dumps(demo_scenario("gpu-node-05", seed=1, gpu_count=1, tenants=[("acme", "gold")]))
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed after this block: the server is down
    spool_path = tmp_path / "spool.sqlite"
    command = [sys.executable, "-m", "agents", "run", "--server", url, "--token-file", "token"]
    command += ["--backend", "sim", "--scenario", "scenario.json", "--spool", str(spool_path)]
    command += ["--tick-ms", "100", "--batch-seconds", "60"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))))
    agent = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3.5)  # at least two whole metered seconds, well inside the 60 s batch
        agent.send_signal(signal.SIGTERM)
        _, stderr = agent.communicate(timeout=30)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0, stderr
    assert "event=shutdown_requested signal=SIGTERM" in stderr
    spool = Spool(spool_path, node="gpu-node-05", now=clock.now)
    (batch,) = spool.list_batches(state="pending")  # never sent: the server was down
    window = json.loads(batch.json_bytes())["window"]
    seconds = (datetime.fromisoformat(window["end"][:-1]) - datetime.fromisoformat(window["start"][:-1])).seconds
    assert 1 <= seconds < 60
