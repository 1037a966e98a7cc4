"""``batch_seq`` never repeats on one node: two spools, restarts, clock jumps, old spools."""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.spool import Spool, SpoolKind, compose_batch_seq

T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
NODE = "gpu-node-17"


@dataclass
class WallClock:
    """The node's wall clock, which an operator or NTP may step either way."""

    at: datetime = T0

    def now(self) -> datetime:
        return self.at


def _store(spool: Spool, clock: WallClock) -> int:
    # Windows do not matter to numbering; each batch gets the next free second of its spool.
    start = spool.last_window_end or T0
    return spool.store_batch(window_start=start, window_end=start + timedelta(seconds=1), render=lambda s: b"{}")


_steps = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.integers(0, 1)),
        st.tuples(st.just("restart"), st.integers(0, 1)),
        # Steps of up to ten days either way, down to a millisecond.
        st.tuples(st.just("jump"), st.integers(-10 * 86_400_000, 10 * 86_400_000)),
        st.tuples(st.just("jump"), st.integers(-5, 5)),
    ),
    min_size=1,
    max_size=60,
)


@pytest.mark.parametrize(
    ("kinds", "seeds"),
    [(("live", "replay"), (None, None)), (("live", "live"), (1, 2)), (("replay", "replay"), (3, 4))],
    ids=["live-and-history", "two-live-spools", "two-history-runs"],
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_steps)
def test_two_spools_of_one_node_never_share_a_batch_seq(
    tmp_path: Path, kinds: tuple[SpoolKind, SpoolKind], seeds: tuple[int | None, int | None], steps: list[tuple[str, int]]
) -> None:
    """Live and history spools never collide whatever the clock does. Two spools of one kind
    are told apart by their random ids (seeded here so they differ, as they do but for 2^-19)."""
    clock = WallClock()
    run = tmp_path / f"run-{random.getrandbits(64):x}"  # hypothesis reuses tmp_path across examples
    paths = [run / "a.sqlite", run / "b.sqlite"]

    def open_spool(i: int) -> Spool:
        rng = None if seeds[i] is None else random.Random(seeds[i])
        return Spool(paths[i], node=NODE, now=clock.now, kind=kinds[i], rng=rng)

    spools = [open_spool(0), open_spool(1)]
    seen: list[list[int]] = [[], []]
    for action, value in steps:
        if action == "store":
            seen[value].append(_store(spools[value], clock))
        elif action == "restart":
            spools[value].close()
            spools[value] = open_spool(value)
        else:
            clock.at += timedelta(milliseconds=value)
    for spool in spools:
        spool.close()
    everything = seen[0] + seen[1]
    assert len(set(everything)) == len(everything)
    for seqs in seen:
        # Strictly increasing per spool.
        assert seqs == sorted(seqs)
        assert len(set(seqs)) == len(seqs)
    assert all(0 <= seq < 2**63 for seq in everything)  # a Postgres bigint; the service accepts [0, 2^63)


def test_a_clock_stepped_back_never_repeats_a_number(tmp_path: Path) -> None:
    clock = WallClock()
    spool = Spool(tmp_path / "s.sqlite", node=NODE, now=clock.now)
    first = _store(spool, clock)
    clock.at -= timedelta(days=365)
    second = _store(spool, clock)
    assert second > first


def test_a_replay_spool_and_a_live_spool_differ_in_their_ids_top_bit(tmp_path: Path) -> None:
    live = Spool(tmp_path / "live.sqlite", node=NODE, now=lambda: T0, kind="live")
    replay = Spool(tmp_path / "replay.sqlite", node=NODE, now=lambda: T0, kind="replay")
    assert live.spool_id < 2**19 <= replay.spool_id < 2**20


def test_a_spool_from_before_per_spool_ids_continues_above_its_old_numbers(tmp_path: Path) -> None:
    """Old spools counted from the Unix time in seconds; their pending batches keep their numbers."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(
            """
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE batches (
                batch_seq INTEGER PRIMARY KEY, window_start TEXT NOT NULL, window_end TEXT NOT NULL,
                body BLOB NOT NULL, content_encoding TEXT NOT NULL, state TEXT NOT NULL, created_at TEXT NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0, last_status INTEGER, last_error TEXT, finished_at TEXT);
            """
        )
        db.execute("INSERT INTO meta VALUES ('node', ?), ('next_batch_seq', '1796000001')", (NODE,))
        db.execute(
            "INSERT INTO batches (batch_seq, window_start, window_end, body, content_encoding, state, created_at)"
            " VALUES (1796000000, ?, ?, x'7b7d', 'identity', 'pending', ?)",
            (T0.isoformat(), (T0 + timedelta(seconds=10)).isoformat(), T0.isoformat()),
        )
        db.execute("INSERT INTO meta VALUES ('last_window_end', ?)", ((T0 + timedelta(seconds=10)).isoformat(),))
    spool = Spool(path, node=NODE, now=lambda: T0)
    (old,) = spool.list_batches(state="pending")
    assert old.batch_seq == 1796000000
    new = _store(spool, WallClock())
    assert new > 2**60 > old.batch_seq


def test_numbers_stay_a_bigint_until_the_year_2248() -> None:
    last_ms = int((datetime(2248, 1, 1, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1000)
    assert compose_batch_seq(stamp_ms=last_ms, spool_id=2**20 - 1) < 2**63
    with pytest.raises(ValueError, match="spool_id"):
        compose_batch_seq(stamp_ms=1, spool_id=2**20)


def test_a_clock_beyond_the_scheme_is_not_trusted(tmp_path: Path) -> None:
    """A clock reading the year 9999 does not exhaust the number space; the high-water mark moves by one."""
    clock = WallClock()
    spool = Spool(tmp_path / "s.sqlite", node=NODE, now=clock.now)
    first = _store(spool, clock)
    clock.at = datetime(9999, 1, 1, tzinfo=UTC)
    assert _store(spool, clock) == first + 2**20
