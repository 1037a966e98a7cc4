"""The kubelet replaces a projected ServiceAccount token before it expires; every request the
agent makes (usage batches, policy, events, undelivered reports) reads the token file afresh, so
the next request carries the new token, with no restart."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agents.credentials import read_token
from agents.events import Event, EventSink
from agents.policy_client import PolicyClient, PollOutcome
from agents.spool import Spool
from agents.undelivered import UndeliveredReporter
from agents.uploader import Outcome, Uploader
from tests import clock


class _Recorder(BaseHTTPRequestHandler):
    """A service that accepts everything and records which token each request carried."""

    seen: list[tuple[str, str, str]]

    def log_message(self, format: str, *args: Any) -> None:  # signature of BaseHTTPRequestHandler
        pass

    def _answer(self, status: int, body: bytes = b"") -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(304)

    def do_POST(self) -> None:
        self._answer(201, b'{"status": "stored", "accepted": 1}')


@pytest.fixture
def service() -> Iterator[tuple[str, list[tuple[str, str, str]]]]:
    seen: list[tuple[str, str, str]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def rotate(directory: Path, token: str) -> None:
    """As the kubelet's atomic writer does: a new timestamped directory, then swap `..data`."""
    target = directory / f"..{token}"
    target.mkdir()
    (target / "token").write_text(token)
    (directory / "..data_tmp").symlink_to(target.name)
    os.replace(directory / "..data_tmp", directory / "..data")
    if not (directory / "token").is_symlink():
        (directory / "token").symlink_to("..data/token")


def test_every_agent_request_carries_the_token_file_as_it_is_now(
    tmp_path: Path, service: tuple[str, list[tuple[str, str, str]]]
) -> None:
    url, seen = service
    volume = tmp_path / "token-volume"
    volume.mkdir()
    rotate(volume, "first-token")
    token = partial(read_token, volume / "token")
    spool = Spool(tmp_path / "spool.sqlite", node="n1", now=clock.now)
    uploader = Uploader(spool=spool, server=url, token=token)
    policy = PolicyClient(server=url, node="n1", token=token, cache_path=tmp_path / "policy.json")
    events = EventSink(server=url, node="n1", token=token)
    reporter = UndeliveredReporter(spool=spool, server=url, node="n1", token=token)
    start = clock.now().replace(microsecond=0) - timedelta(minutes=10)

    def one_of_each(minute: int) -> None:
        at = start + timedelta(minutes=minute)
        spool.store_batch(window_start=at, window_end=at + timedelta(seconds=10), render=lambda seq: b"{}")
        sent = uploader.send_next()
        assert sent is not None
        assert sent.outcome is Outcome.SENT
        assert policy.poll() is PollOutcome.NOT_MODIFIED
        events.emit(Event(at=at, action="watchdog.over_grant", target="ns/pod/c", detail={}))
        assert events.flush().sent == 1
        dead = spool.store_batch(window_start=at + timedelta(seconds=10), window_end=at + timedelta(seconds=20),
                                 render=lambda seq: b"{}")
        spool.mark_dead(dead, status=409, answer="conflict")
        assert reporter.report_if_due() == 1

    try:
        one_of_each(0)
        rotate(volume, "second-token")
        one_of_each(1)
    finally:
        spool.close()

    paths = ["/api/v1/usage/batches", "/api/v1/nodes/n1/policy", "/api/v1/nodes/n1/events",
             "/api/v1/nodes/n1/undelivered"]
    assert [(path, auth) for _, path, auth in seen] == (
        [(p, "Bearer first-token") for p in paths] + [(p, "Bearer second-token") for p in paths]
    )
