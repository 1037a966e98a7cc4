"""How the uploader reacts to each answer (scripted ``requests`` session, no network)."""

from __future__ import annotations

import gzip
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests

from agents.fakes.service import ScriptedSession
from agents.spool import Spool
from agents.uploader import Outcome, RetryPolicy, Uploader

T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    spool = Spool(tmp_path / "spool.sqlite", node="gpu-node-17", now=lambda: T0)
    for i in range(3):
        spool.store_batch(
            window_start=T0 + timedelta(seconds=10 * i),
            window_end=T0 + timedelta(seconds=10 * (i + 1)),
            render=lambda seq: b'{"batch_seq":%d}' % seq,
        )
    return spool


def uploader(spool: Spool, session: ScriptedSession) -> Uploader:
    return Uploader(
        spool=spool,
        server="http://ledger.test",
        token=lambda: "secret-token",
        session=session,
        retry=RetryPolicy(base_s=1.0, cap_s=60.0, timeout_s=5.0),
        rng=random.Random(3),
        now=lambda: T0,
    )


def test_batches_go_oldest_first_with_token_gzip_and_timeout(spool: Spool) -> None:
    session = ScriptedSession([(201, {}, b'{"status":"stored","accepted":0}')] * 3)
    assert uploader(spool, session).flush_once() == 0
    first = session.sent[0]
    assert first.url == "http://ledger.test/api/v1/usage/batches"
    assert first.headers == {
        "Authorization": "Bearer secret-token",
        "Content-Type": "application/json",
        "Content-Encoding": "gzip",
    }
    assert first.timeout == 5.0
    sent_seqs = [gzip.decompress(r.body) for r in session.sent]
    assert sent_seqs == [b.json_bytes() for b in spool.list_batches()]
    assert [b.state for b in spool.list_batches()] == ["sent"] * 3


def test_a_duplicate_answer_counts_as_delivered(spool: Spool) -> None:
    session = ScriptedSession([(200, {}, b'{"status":"duplicate"}')])
    result = uploader(spool, session).send_next()
    assert result is not None
    assert result.outcome is Outcome.SENT
    assert spool.count(state="sent") == 1


def test_a_retry_resends_exactly_the_same_bytes(spool: Spool) -> None:
    session = ScriptedSession([requests.ConnectionError("refused"), (502, {}, b"bad gateway"), (201, {}, b"{}")])
    up = uploader(spool, session)
    first, second, third = up.send_next(), up.send_next(), up.send_next()
    assert first is not None
    assert second is not None
    assert third is not None
    assert [first.outcome, second.outcome, third.outcome] == [Outcome.RETRY, Outcome.RETRY, Outcome.SENT]
    # Full jitter, doubling ceiling.
    assert 0 <= first.delay_s <= 1.0
    assert 0 <= second.delay_s <= 2.0
    assert session.sent[0].body == session.sent[1].body == session.sent[2].body


@pytest.mark.parametrize("status", [400, 409, 413])
def test_a_rejected_batch_is_dead_lettered_with_the_answer_and_the_next_one_proceeds(
    spool: Spool, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    answer = b'{"errors":[{"path":"samples[3].sm_granted_s","message":"above capacity"}]}'
    session = ScriptedSession([(status, {}, answer), (201, {}, b"{}"), (201, {}, b"{}")])
    assert uploader(spool, session).flush_once() == 0
    (dead,) = spool.list_batches(state="dead")
    assert (dead.last_status, dead.last_error) == (status, answer.decode())
    assert spool.count(state="sent") == 2
    assert any(r.levelname == "ERROR" and "samples[3].sm_granted_s" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("status", [401, 403])
def test_an_unauthorised_answer_keeps_the_batch_and_backs_off(
    spool: Spool, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    session = ScriptedSession([(status, {}, b'{"detail":"revoked"}')])
    result = uploader(spool, session).send_next()
    assert result is not None
    assert result.outcome is Outcome.AUTH
    assert result.delay_s >= 0
    assert spool.count(state="pending") == 3
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "token refused" in line


@pytest.mark.parametrize(("status", "header", "delay"), [(429, "7", 7.0), (503, "Mon, 30 Nov 2026 03:00:30 GMT", 30.0)])
def test_load_shedding_answers_are_honoured_via_retry_after(
    spool: Spool, status: int, header: str, delay: float
) -> None:
    session = ScriptedSession([(status, {"Retry-After": header}, b"")])
    result = uploader(spool, session).send_next()
    assert result is not None
    assert (result.outcome, result.delay_s) == (Outcome.THROTTLED, delay)
    assert spool.count(state="pending") == 3


def test_final_flush_stops_at_the_first_answer_that_asks_to_wait(spool: Spool) -> None:
    session = ScriptedSession([(201, {}, b"{}"), (503, {"Retry-After": "5"}, b"")])
    assert uploader(spool, session).flush_once() == 2
    assert len(session.sent) == 2


def test_a_vanished_token_file_keeps_the_batch_and_backs_off(spool: Spool, tmp_path: Path) -> None:
    from agents.credentials import read_token

    up = Uploader(
        spool=spool,
        server="http://ledger.test",
        token=lambda: read_token(tmp_path / "gone"),
        session=ScriptedSession([]),
        rng=random.Random(1),
    )
    result = up.send_next()
    assert result is not None
    assert result.outcome is Outcome.AUTH
    assert spool.count(state="pending") == 3
