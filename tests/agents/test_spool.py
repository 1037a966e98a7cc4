"""The spool keeps every closed batch exactly once, across restarts and crashes."""

from __future__ import annotations

import gzip
import json
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agents.batch import Sample, render_batch
from agents.interfaces import GpuInfo, Workload
from agents.spool import Spool

T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]


def clock() -> datetime:
    return T0


def open_spool(path: Path, *, compress: bool = True, keep_sent: int = 1000) -> Spool:
    return Spool(path, node="gpu-node-17", now=clock, compress=compress, keep_sent=keep_sent)


def document(seq: int) -> bytes:
    return json.dumps({"batch_seq": seq}).encode()


def store(spool: Spool, index: int) -> int:
    return spool.store_batch(
        window_start=T0 + timedelta(seconds=10 * index),
        window_end=T0 + timedelta(seconds=10 * (index + 1)),
        render=document,
    )


def test_batches_survive_reopening_the_spool(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite"
    spool = open_spool(path)
    seqs = [store(spool, i) for i in range(3)]
    spool.close()

    reopened = open_spool(path)
    pending = reopened.list_batches(state="pending")
    assert [b.batch_seq for b in pending] == seqs
    assert [json.loads(b.json_bytes()) for b in pending] == [{"batch_seq": s} for s in seqs]


def test_batch_seq_strictly_increases_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite"
    seen: list[int] = []
    for restart in range(4):
        spool = open_spool(path)
        seen += [store(spool, restart * 2), store(spool, restart * 2 + 1)]
        if restart % 2:
            spool.mark_sent(seen[-1], status=201)
        spool.close()
    assert seen == sorted(seen)
    assert len(set(seen)) == len(seen)
    assert {seq & (2**20 - 1) for seq in seen} == {open_spool(path).spool_id}  # one spool, one id


def test_batch_seq_of_a_recreated_spool_starts_above_the_old_one(tmp_path: Path) -> None:
    old = Spool(tmp_path / "old.sqlite", node="n", now=lambda: T0)
    last_old = max(store(old, i) for i in range(5))
    later = T0 + timedelta(seconds=50)  # five 10 s batches later, the disk is wiped
    fresh = Spool(tmp_path / "new.sqlite", node="n", now=lambda: later)
    assert fresh.next_batch_seq > last_old


def test_the_stored_bytes_are_exactly_what_render_returned(tmp_path: Path) -> None:
    plain = open_spool(tmp_path / "plain.sqlite", compress=False)
    zipped = open_spool(tmp_path / "zipped.sqlite", compress=True)
    store(plain, 0)
    store(zipped, 0)
    (p,) = plain.list_batches()
    (z,) = zipped.list_batches()
    assert p.body == document(p.batch_seq)
    assert p.content_encoding == "identity"
    assert gzip.decompress(z.body) == document(z.batch_seq)
    assert z.content_encoding == "gzip"


def test_a_failing_render_stores_nothing_and_consumes_no_seq(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool.sqlite")
    before = spool.next_batch_seq

    def broken(seq: int) -> bytes:
        raise RuntimeError("render failed")

    with pytest.raises(RuntimeError, match="render failed"):
        spool.store_batch(window_start=T0, window_end=T0 + timedelta(seconds=10), render=broken)
    assert spool.list_batches() == []
    assert spool.next_batch_seq == before
    assert spool.last_window_end is None


def _run_and_die(path: Path, body: str) -> None:
    """Run ``body`` in a child process that is killed (os._exit) where the body says."""
    script = textwrap.dedent(
        f"""
        import os
        from datetime import UTC, datetime, timedelta
        from agents.spool import Spool
        T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
        spool = Spool({str(path)!r}, node="gpu-node-17", now=lambda: T0)
        """
    ) + textwrap.dedent(body)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=60, check=False)
    assert result.returncode == 17, result.stderr.decode()


def test_a_crash_between_close_and_mark_sent_leaves_the_batch_pending(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite"
    _run_and_die(
        path,
        """
        seq = spool.store_batch(
            window_start=T0, window_end=T0 + timedelta(seconds=10), render=lambda s: b"{}"
        )
        os._exit(17)  # killed before the upload could mark it sent
        """,
    )
    spool = open_spool(path)
    pending = spool.oldest_pending()
    assert pending is not None
    assert pending.body is not None
    assert [b.batch_seq for b in spool.list_batches()] == [pending.batch_seq]
    spool.mark_sent(pending.batch_seq, status=200)  # the resend was answered "duplicate"
    assert spool.oldest_pending() is None
    assert spool.count(state="sent") == 1


def test_a_crash_in_the_middle_of_storing_leaves_no_trace(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite"
    _run_and_die(
        path,
        """
        def render(seq):
            os._exit(17)  # killed inside the storing transaction
        spool.store_batch(window_start=T0, window_end=T0 + timedelta(seconds=10), render=render)
        """,
    )
    spool = open_spool(path)
    assert spool.list_batches() == []
    assert spool.last_window_end is None
    expected = spool.next_batch_seq
    assert store(spool, 0) == expected  # the killed transaction took no number


def test_pending_batches_are_served_oldest_first_and_dead_ones_never(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool.sqlite")
    a, b, c = (store(spool, i) for i in range(3))
    head = spool.oldest_pending()
    assert head is not None
    assert head.batch_seq == a
    spool.mark_dead(a, status=400, answer='{"errors":[{"path":"samples[0]","message":"x"}]}')
    spool.record_attempt(b, status=503, error="busy")
    head = spool.oldest_pending()
    assert head is not None
    assert (head.batch_seq, head.attempts, head.last_status) == (b, 1, 503)
    spool.mark_sent(b, status=201)
    head = spool.oldest_pending()
    assert head is not None
    assert head.batch_seq == c
    (dead,) = spool.list_batches(state="dead")
    assert (dead.batch_seq, dead.last_status) == (a, 400)
    assert dead.last_error is not None
    assert "samples[0]" in dead.last_error


def test_marking_a_dead_batch_sent_does_not_revive_it(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool.sqlite")
    seq = store(spool, 0)
    spool.mark_dead(seq, status=409, answer="conflict")
    spool.mark_sent(seq, status=201)
    assert [b.state for b in spool.list_batches()] == ["dead"]


def test_only_the_newest_sent_batches_are_retained(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool.sqlite", keep_sent=3)
    seqs = [store(spool, i) for i in range(6)]
    dead = seqs[0]
    spool.mark_dead(dead, status=413, answer="too large")
    for seq in seqs[1:]:
        spool.mark_sent(seq, status=201)
    assert [b.batch_seq for b in spool.list_batches(state="sent")] == seqs[-3:]
    assert [b.batch_seq for b in spool.list_batches(state="dead")] == [dead]


def test_overlapping_windows_are_refused(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool.sqlite")
    store(spool, 0)
    with pytest.raises(ValueError, match="overlaps metered history"):
        spool.store_batch(
            window_start=T0 + timedelta(seconds=5),
            window_end=T0 + timedelta(seconds=15),
            render=document,
        )


def test_a_spool_belongs_to_one_node(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite"
    open_spool(path).close()
    with pytest.raises(ValueError, match="belongs to node 'gpu-node-17'"):
        Spool(path, node="gpu-node-18", now=clock)


def test_spool_file_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite"
    open_spool(path).close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_the_spool_keeps_per_second_samples_for_their_retention_and_exports_a_range(tmp_path: Path) -> None:
    now = [datetime(2026, 11, 30, 3, 1, tzinfo=UTC)]
    spool = Spool(tmp_path / "s.sqlite", node="n", now=lambda: now[0], sample_retention=timedelta(days=1))
    gpu = GpuInfo(uuid="GPU-0", model="m", memory_mb=10, sm_count=2)
    start = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
    samples = [Sample(start=start + timedelta(seconds=s), seconds=1, gpu="GPU-0",
                      workload=Workload(tenant="t", namespace="ns", pod="p", container="c", pod_uid="u", sla_tier="g"),
                      mem_used_mb_s=1.0, mem_granted_mb_s=2.0, sm_used_s=0.5, sm_granted_s=1.0, pcie_mb=0.0)
               for s in range(60)]

    def render(wire: str) -> Callable[[int], bytes]:
        return lambda seq: render_batch(node="n", batch_seq=seq, window_start=start, window_end=start + timedelta(minutes=1),
                                        gpus=[gpu], samples=samples, wire=wire)

    seq = spool.store_batch(window_start=start, window_end=start + timedelta(minutes=1), render=render("v2"),
                            evidence=render("v1"))
    assert json.loads(spool.oldest_pending().json_bytes())["windows"][0]["seconds"] == 60  # type: ignore[union-attr]
    exported = list(spool.export_samples(start=start + timedelta(seconds=10), end=start + timedelta(seconds=13)))
    assert [(e["batch_seq"], e["start"]) for e in exported] == [
        (seq, f"2026-11-30T03:00:{s}Z") for s in (10, 11, 12)]
    now[0] += timedelta(days=1, minutes=1)  # past the retention: the next stored batch prunes them
    spool.store_batch(window_start=start + timedelta(minutes=1), window_end=start + timedelta(minutes=2),
                      render=render("v2"))
    assert list(spool.export_samples(start=start, end=start + timedelta(minutes=1))) == []
