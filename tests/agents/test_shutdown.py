"""SIGTERM: the running agent spools its partial batch and exits 0."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from agents.backends.sim import demo_scenario
from agents.spool import Spool
from tests import clock

REPO = Path(__file__).resolve().parents[2]


def agent_env() -> dict[str, str]:
    """This environment with the repository importable, keeping what PYTHONPATH already holds
    (make test-dates puts its faketime site there)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))))


def _open_periods(spool_path: Path) -> list[tuple[datetime, datetime]]:
    """The periods of the open batch the agent has checkpointed so far (it does so each metered
    second), read from its spool as it runs; none before the spool exists."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{spool_path}?mode=ro", uri=True, timeout=5)) as db:
            rows = db.execute("SELECT period_start, period_end FROM open_periods").fetchall()
    except sqlite3.OperationalError:  # no spool, or no table in it, yet
        return []
    return [(datetime.fromisoformat(start), datetime.fromisoformat(end)) for start, end in rows]


def _wait_until_metered(agent: subprocess.Popen[str], spool_path: Path, seconds: float, *,
                        after: datetime | None = None) -> None:
    """Until the running agent has checkpointed `seconds` of its open batch (those starting at or
    after `after`): a fixed sleep measured the machine's load instead (an agent still importing
    was sent its signal, or had metered one second where two were needed)."""
    deadline = time.monotonic() + 120
    while sum((end - start).total_seconds() for start, end in _open_periods(spool_path)
              if after is None or start >= after) < seconds:
        assert agent.poll() is None, f"the agent exited before metering {seconds} s"
        assert time.monotonic() < deadline, f"the agent did not meter {seconds} s within 120 s"
        time.sleep(0.1)


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
    agent = subprocess.Popen(command, cwd=tmp_path, env=agent_env(), stderr=subprocess.PIPE, text=True)
    try:
        _wait_until_metered(agent, spool_path, 2)  # two whole metered seconds, well inside the 60 s batch
        agent.send_signal(signal.SIGTERM)
        _, stderr = agent.communicate(timeout=30)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0, stderr
    assert "event=shutdown_requested signal=SIGTERM" in stderr
    spool = Spool(spool_path, node="gpu-node-05", now=clock.now)
    # Never sent: the server was down. Batch windows end on the minute, so an agent started in a
    # minute's last seconds closed one batch there before the one SIGTERM cut short.
    pending = sorted(spool.list_batches(state="pending"), key=lambda b: b.window_start)
    assert 1 <= len(pending) <= 2, [(b.window_start, b.window_end) for b in pending]
    assert all(a.window_end == b.window_start for a, b in itertools.pairwise(pending))  # nothing lost between
    window = json.loads(pending[-1].json_bytes())["window"]
    seconds = (datetime.fromisoformat(window["end"][:-1]) - datetime.fromisoformat(window["start"][:-1])).seconds
    assert 1 <= seconds < 60


def _windows(spool_path: Path, node: str) -> list[tuple[datetime, datetime]]:
    spool = Spool(spool_path, node=node, now=clock.now)
    try:
        return [(b.window_start, b.window_end) for b in spool.list_batches()]
    finally:
        spool.close()


def test_sigkill_loses_only_the_seconds_the_agent_was_down(tmp_path: Path) -> None:
    """The open batch is checkpointed each metered second: after ``kill -9`` and a restart the
    spooled windows never overlap, and the gap is the downtime plus at most one second."""
    (tmp_path / "token").write_text("t\n")
    (tmp_path / "scenario.json").write_text(
        json.dumps(demo_scenario("gpu-node-06", seed=2, gpu_count=2, tenants=[("acme", "gold")]))
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # the server is down: everything stays spooled
    spool_path = tmp_path / "spool.sqlite"
    command = [sys.executable, "-m", "agents", "run", "--server", url, "--token-file", "token"]
    command += ["--backend", "sim", "--scenario", "scenario.json", "--spool", str(spool_path)]
    command += ["--tick-ms", "100", "--batch-seconds", "60"]
    env = agent_env()

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)

    first = start()
    try:
        _wait_until_metered(first, spool_path, 3)  # a few metered seconds inside a 60 s batch that never closes
        first.kill()
        first.communicate(timeout=30)
        killed_at = time.monotonic()
        last_checkpoint = max(end for _, end in _open_periods(spool_path))
        time.sleep(2.0)
        down_s = time.monotonic() - killed_at
        second = start()
        restarted_at = time.monotonic()
        _wait_until_metered(second, spool_path, 1, after=last_checkpoint)
        starting_s = time.monotonic() - restarted_at  # imports and its first metered second
        _wait_until_metered(second, spool_path, 3, after=last_checkpoint)  # a few seconds of its own
        second.send_signal(signal.SIGTERM)
        _, stderr = second.communicate(timeout=30)
    finally:
        for proc in (first, locals().get("second")):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert second.returncode == 0, stderr
    assert "event=checkpoint_recovered" in stderr
    # The killed run's periods, closed at restart, and the second run's batch; either may be split
    # where a minute ended (batches close on whole minutes), into windows that follow on each other.
    windows = sorted(_windows(spool_path, "gpu-node-06"))
    assert 2 <= len(windows) <= 4, windows
    assert all(start < end for start, end in windows)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(windows))  # never a second twice
    gaps = [(b_start - a_end).total_seconds() for (_, a_end), (b_start, _) in itertools.pairwise(windows)]
    down = max(range(len(gaps)), key=gaps.__getitem__)  # the one stretch no run metered
    assert all(gap == 0 for i, gap in enumerate(gaps) if i != down), windows
    metered_before_kill = (windows[down][1] - windows[0][0]).total_seconds()
    assert metered_before_kill >= 2  # the killed run's seconds were kept
    gap_s = gaps[down]
    # Down for `down_s`, plus the new process' start-up until its first metered second (measured:
    # imports take 1 s on a quiet machine and 6 on a loaded one), plus the second the kill
    # interrupted and the wait for the next whole second.
    assert gap_s <= down_s + starting_s + 2, (gap_s, down_s, starting_s)
