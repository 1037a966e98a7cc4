"""/metrics under real gunicorn with several workers (config/gunicorn.conf.py) on real Postgres:
every scrape, whichever worker answers it, shows the samples stored through all of them, and
the exposition passes `promtool check metrics`."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from billing.services.identity.tokens import issue_node_token
from tests import clock
from tests.conftest import make_batch
from tests.promtool import promtool

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "scrape-token-for-gunicorn-tests"
WORKERS = 3


@dataclass
class Gunicorn:
    port: int
    access_log: Path

    def request(self, method: str, path: str, *, body: bytes | None = None, token: str = TOKEN) -> tuple[int, bytes]:
        # A new connection per request: the kernel hands each to whichever worker accepts first.
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = {"Authorization": f"Bearer {token}", "Connection": "close"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def scrape(self) -> str:
        status, body = self.request("GET", "/metrics")
        assert status == 200, body
        return body.decode()

    def worker_pids(self, path: str) -> set[str]:
        """Worker processes that answered requests for `path` (the access log names the pid)."""
        return {line.split()[0] for line in self.access_log.read_text().splitlines() if f" {path} " in line}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _test_database_url() -> str:
    url = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    return urllib.parse.urlunsplit(url._replace(path=f"/{connection.settings_dict['NAME']}"))


@pytest.fixture
def gunicorn(transactional_db, tmp_path) -> Iterator[Gunicorn]:
    port, access_log = _free_port(), tmp_path / "access.log"
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env |= {"DATABASE_URL": _test_database_url(), "VGPU_METRICS_TOKEN": TOKEN, "VGPU_METRICS_TOKEN_FILE": "",
            "DJANGO_SETTINGS_MODULE": "config.settings"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "config.wsgi", "-c", str(ROOT / "config" / "gunicorn.conf.py"),
         "--bind", f"127.0.0.1:{port}", "--workers", str(WORKERS), "--worker-class", "sync",
         "--access-logfile", str(access_log), "--access-logformat", "%(p)s %(m)s %(U)s %(s)s"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "gunicorn.log").open("wb"),
    )
    server = Gunicorn(port=port, access_log=access_log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "gunicorn.log").read_text()
            try:
                if server.request("GET", "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "gunicorn did not answer /readyz within 60 s"
            time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _ingested(text: str) -> float:
    (value,) = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "vgpu_ledger_ingest_samples_total"]
    return value


def test_every_worker_scrapes_the_samples_stored_through_all_workers(gunicorn):
    start = clock.now().replace(second=0, microsecond=0) - timedelta(minutes=30)
    tokens = {f"gpu-node-{n}": issue_node_token(node_name=f"gpu-node-{n}", now=clock.now(), actor_label="test").token
              for n in range(3)}

    def upload(node: str, seqs: range) -> int:
        samples = 0
        for seq in seqs:
            batch = make_batch(node=node, seq=seq, start=start + timedelta(seconds=10 * seq), seconds=10)
            status, body = gunicorn.request("POST", "/api/v1/usage/batches", body=json.dumps(batch).encode(),
                                            token=tokens[node])
            assert status == 201, body
            samples += len(batch["samples"])
        return samples

    # The nodes upload at once, as real ones do, so more than one worker has a request to take (the
    # kernel hands a lone client's sequential requests to whichever worker waits, often the same).
    expected, first = 0, 1
    with ThreadPoolExecutor(max_workers=len(tokens)) as pool:
        while first == 1 or (len(gunicorn.worker_pids("/api/v1/usage/batches")) < 2 and first < 60):
            nodes = list(tokens)
            expected += sum(pool.map(upload, nodes, [range(first, first + 5)] * len(nodes)))
            first += 5
    # The point of the test: the batches and the scrapes really were spread over the workers. The
    # kernel picks the worker that accepts: on a busy machine one may win 20 in a row, so scrape
    # until two workers have answered (every answer must be the whole count).
    assert len(gunicorn.worker_pids("/api/v1/usage/batches")) >= 2
    scrapes = [_ingested(gunicorn.scrape()) for _ in range(20)]
    deadline = time.monotonic() + 60
    while len(gunicorn.worker_pids("/metrics")) < 2 and time.monotonic() < deadline:
        scrapes.append(_ingested(gunicorn.scrape()))
    assert scrapes == [expected] * len(scrapes)
    assert len(gunicorn.worker_pids("/metrics")) >= 2


def test_the_services_exposition_passes_promtool(gunicorn):
    text = gunicorn.scrape()
    assert "vgpu_ledger_rollup_lag_seconds" in text
    assert "vgpu_ledger_admission_reviews_total" in text
    result = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not result.stdout.strip(), result.stdout + result.stderr
    assert not result.stderr.strip(), result.stdout + result.stderr
