"""`make demo` as a child process for the tests that drive it: its own database, Redis db and
data folder, so it never touches the test database or another run's demo."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def demo_environment(data_dir: Path, *, name: str, redis_db: int, history_days: int = 0) -> Iterator[dict[str, str]]:
    """Environment for one demo run: database `name` (dropped before and after), Redis db
    `redis_db`, data under `data_dir`, a free loopback port, `history_days` simulated days of
    this month before today (the demo's default is more; fewer keep the suite quick)."""
    url = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    admin = psycopg2.connect(os.environ["DATABASE_URL"])
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {name}")
    env = dict(os.environ)
    env["DATABASE_URL"] = urllib.parse.urlunsplit(url._replace(path=f"/{name}"))
    redis = urllib.parse.urlsplit(os.environ["REDIS_URL"])
    env["REDIS_URL"] = urllib.parse.urlunsplit(redis._replace(path=f"/{redis_db}"))
    env["VGPU_DATA_DIR"] = str(data_dir)
    env["PORT"] = str(free_port())
    env["VGPU_DEMO_OPENCOST_PORT"] = str(free_port())  # not OpenCost's 9003: a real port-forward may hold it
    env["VGPU_ROLLUP_EVERY_S"] = "3"
    env["VGPU_DEMO_HISTORY_DAYS"] = str(history_days)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    try:
        yield env
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


@dataclass
class Demo:
    proc: subprocess.Popen[str]
    env: dict[str, str]
    banner: str = ""
    rest: str = ""
    passwords: dict[str, str] = field(default_factory=dict)
    stopped: bool = False
    banner_after_s: float = 0.0  # from the launch to "Press Ctrl-C": the services are up

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.env['PORT']}"

    @property
    def opencost(self) -> str:
        """The demo's OpenCost port (config/demo_opencost.py): OpenCost's API with no credential."""
        return f"http://127.0.0.1:{self.env['VGPU_DEMO_OPENCOST_PORT']}"

    @property
    def data_dir(self) -> Path:
        return Path(self.env["VGPU_DATA_DIR"]) / "demo"

    def wait_for_history(self, timeout_s: float = 240) -> None:
        """Until the simulated day of last month is metered, closed and reported."""
        deadline = time.monotonic() + timeout_s
        while not list(self.data_dir.glob("history-*.done")) and time.monotonic() < deadline:
            time.sleep(2)
        log = self.data_dir / "logs" / "history.log"
        assert list(self.data_dir.glob("history-*.done")), log.read_text()[-3000:] if log.exists() else "no log"

    def wait_for_recent_days(self, timeout_s: float = 420) -> None:
        """Until the simulated days of this month before today are metered and reported."""
        deadline = time.monotonic() + timeout_s
        while not (self.data_dir / "recent.done").exists() and time.monotonic() < deadline:
            time.sleep(2)
        log = self.data_dir / "logs" / "history.log"
        assert (self.data_dir / "recent.done").exists(), log.read_text()[-3000:] if log.exists() else "no log"

    def stop(self) -> None:
        """Ctrl-C, as a newcomer stops it; what it printed while stopping lands in `rest`."""
        if self.stopped:
            return
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.rest, _ = self.proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


# How long `make demo` may take to print its banner (web, worker, beat and agents up), as its test
# checks; history is metered after it.
STARTUP_BUDGET_S = 150


@contextmanager
def running_demo(env: dict[str, str], *, startup_timeout_s: float = STARTUP_BUDGET_S) -> Iterator[Demo]:
    proc = subprocess.Popen([sys.executable, "-m", "config.demo"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    demo = Demo(proc=proc, env=env)
    out: list[str] = []
    try:
        launched = time.monotonic()
        deadline = launched + startup_timeout_s
        while not any("Press Ctrl-C" in line for line in out):
            line = proc.stdout.readline() if proc.stdout else ""
            assert line or proc.poll() is None, "".join(out)
            out.append(line)
            assert time.monotonic() < deadline, "".join(out)
        demo.banner = "".join(out)
        demo.banner_after_s = time.monotonic() - launched
        demo.passwords = dict(re.findall(r"user (\S+)\s+password (\S+)", demo.banner))
        try:
            yield demo
        except BaseException as exc:
            # What the launcher said after its banner (a child that exited, a failed history)
            # is the first thing to read when a test against it fails.
            demo.stop()
            exc.add_note(f"make demo printed after its banner:\n{demo.rest[-3000:]}")
            raise
    finally:
        demo.stop()
