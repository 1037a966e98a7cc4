"""The agent loop end to end on a fake clock: batches in the spool, as the server expects."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.backends.sim import SimBackend, demo_scenario, parse_scenario
from agents.batch import gpu_from_wire
from agents.enforcers import DryRunEnforcer
from agents.fakes.clock import FakeClock
from agents.interfaces import UsageReading
from agents.loop import Agent, AgentConfig
from agents.spool import Spool
from tests.agents.helpers import evidence

T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
TENANTS = [("acme", "gold"), ("globex", "silver"), ("initech", "bronze")]


def run_agent(
    spool_path: Path,
    *,
    seconds: float,
    start: datetime = T0,
    seed: int = 7,
    gpu_count: int = 2,
    tick_ms: int = 500,
    batch_seconds: int = 10,
    clock_start: datetime | None = None,
) -> tuple[list[dict[str, Any]], Spool]:
    scenario = parse_scenario(demo_scenario("gpu-node-01", seed=seed, gpu_count=gpu_count, tenants=TENANTS))
    spool = Spool(spool_path, node=scenario.node, now=lambda: T0)
    agent = Agent(
        config=AgentConfig(node=scenario.node, tick_ms=tick_ms, batch_seconds=batch_seconds),
        backend=SimBackend(scenario, epoch=T0),
        clock=FakeClock(start=clock_start or start),
        enforcer=DryRunEnforcer(),
        spool=spool,
    )
    agent.run(stop=threading.Event(), start=start, until=start + timedelta(seconds=seconds))
    return [json.loads(b.json_bytes()) for b in spool.list_batches()], spool


def parse_z(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))



def test_batches_tile_the_run_with_contiguous_windows(tmp_path: Path) -> None:
    batches, _ = run_agent(tmp_path / "spool.sqlite", seconds=30)
    windows = [(b["window"]["start"], b["window"]["end"]) for b in batches]
    assert windows == [
        ("2026-11-30T03:00:00Z", "2026-11-30T03:00:10Z"),
        ("2026-11-30T03:00:10Z", "2026-11-30T03:00:20Z"),
        ("2026-11-30T03:00:20Z", "2026-11-30T03:00:30Z"),
    ]
    assert [b["batch_seq"] for b in batches] == sorted({b["batch_seq"] for b in batches})
    assert all(b["schema"] == "vgpu-ledger/usage-batch/v2" and b["node"] == "gpu-node-01" for b in batches)


def test_every_workload_has_one_sample_per_gpu_per_second_inside_the_window(tmp_path: Path) -> None:
    batches, spool = run_agent(tmp_path / "spool.sqlite", seconds=20)
    scenario = parse_scenario(demo_scenario("gpu-node-01", seed=7, gpu_count=2, tenants=TENANTS))
    for batch in batches:
        assert [g["uuid"] for g in batch["gpus"]] == [g.uuid for g in scenario.gpus]
        start, end = parse_z(batch["window"]["start"]), parse_z(batch["window"]["end"])
        # Sent: one window per workload (the batch lies inside one minute) holding all its seconds.
        assert sorted((w["gpu"], w["pod"], w["container"], w["seconds"]) for w in batch["windows"]) == sorted(
            (w.gpu, w.workload.pod, w.workload.container, (end - start).total_seconds()) for w in scenario.workloads)
        samples = evidence(spool, batch)
        keys = [(s["start"], s["gpu"], s["namespace"], s["pod"], s["container"]) for s in samples]
        assert len(keys) == len(set(keys))
        assert len(keys) == len(scenario.workloads) * int((end - start).total_seconds())
        for s in samples:
            assert s["seconds"] == 1
            assert start <= parse_z(s["start"]) < end
            assert s["start"].endswith("Z")


def test_a_stopped_agent_spools_its_partial_batch(tmp_path: Path) -> None:
    batches, _ = run_agent(tmp_path / "spool.sqlite", seconds=13, batch_seconds=10)
    assert [(b["window"]["start"], b["window"]["end"]) for b in batches][-1] == (
        "2026-11-30T03:00:10Z",
        "2026-11-30T03:00:13Z",
    )


def test_a_restarted_agent_continues_after_its_spooled_history(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite"
    first, spool = run_agent(path, seconds=15)
    spool.close()
    # The restart asks to start inside what was already metered: it must not meter it twice.
    both, _ = run_agent(path, seconds=20, start=T0 + timedelta(seconds=5), clock_start=T0 + timedelta(seconds=5))
    new = both[len(first) :]
    assert new[0]["window"]["start"] == "2026-11-30T03:00:15Z"
    assert new[0]["batch_seq"] > first[-1]["batch_seq"]


def test_a_stop_request_ends_the_run_and_flushes_what_was_metered(tmp_path: Path) -> None:
    scenario = parse_scenario(demo_scenario("gpu-node-01", seed=1, gpu_count=1, tenants=TENANTS))
    spool = Spool(tmp_path / "spool.sqlite", node=scenario.node, now=lambda: T0)
    stop = threading.Event()

    class StopAfter(SimBackend):
        def read(self, *, now: datetime) -> list[UsageReading]:
            if now >= T0 + timedelta(seconds=4):
                stop.set()
            return list(super().read(now=now))

    summary = Agent(
        config=AgentConfig(node=scenario.node),
        backend=StopAfter(scenario, epoch=T0),
        clock=FakeClock(start=T0),
        enforcer=DryRunEnforcer(),
        spool=spool,
    ).run(stop=stop, start=T0)
    assert summary.metered_until == T0 + timedelta(seconds=4)
    (batch,) = spool.list_batches()
    assert json.loads(batch.json_bytes())["window"]["end"] == "2026-11-30T03:00:04Z"


def test_a_stalled_tick_is_integrated_not_lost(tmp_path: Path) -> None:
    scenario = parse_scenario(demo_scenario("gpu-node-01", seed=2, gpu_count=1, tenants=TENANTS))
    spool = Spool(tmp_path / "spool.sqlite", node=scenario.node, now=lambda: T0)
    clock = FakeClock(start=T0)

    class Stalls(SimBackend):
        def read(self, *, now: datetime) -> list[UsageReading]:
            if now == T0 + timedelta(seconds=2):
                clock.advance(timedelta(seconds=3.3))  # this tick took 3.3 s
            return list(super().read(now=now))

    Agent(
        config=AgentConfig(node=scenario.node, batch_seconds=10),
        backend=Stalls(scenario, epoch=T0),
        clock=clock,
        enforcer=DryRunEnforcer(),
        spool=spool,
    ).run(stop=threading.Event(), start=T0, until=T0 + timedelta(seconds=10))
    (batch,) = spool.list_batches()
    seconds = {s["start"] for s in evidence(spool, json.loads(batch.json_bytes()))}
    assert len(seconds) == 10  # every second of the window is present, the stall included


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(min_value=0, max_value=10_000),
    tick_ms=st.sampled_from([100, 250, 300, 500, 700, 1000]),
    offset_s=st.integers(min_value=0, max_value=86_400),
)
def test_granted_per_gpu_per_second_never_exceeds_capacity_in_produced_batches(
    tmp_path_factory: pytest.TempPathFactory, seed: int, tick_ms: int, offset_s: int
) -> None:
    path = tmp_path_factory.mktemp("spool") / "spool.sqlite"
    batches, spool = run_agent(
        path, seconds=12, seed=seed, gpu_count=3, tick_ms=tick_ms, start=T0 + timedelta(seconds=offset_s)
    )
    for batch in batches:
        gpus = {g["uuid"]: gpu_from_wire(g) for g in batch["gpus"]}
        mem: dict[tuple[str, str], float] = {}
        sm: dict[tuple[str, str], float] = {}
        for s in evidence(spool, batch):
            gpu = gpus[s["gpu"]]
            for field, cap in (
                ("mem_used_mb_s", gpu.memory_mb),
                ("mem_granted_mb_s", gpu.memory_mb),
                ("sm_used_s", gpu.sm_count),
                ("sm_granted_s", gpu.sm_count),
            ):
                assert 0 <= s[field] <= cap * s["seconds"]
            key = (s["gpu"], s["start"])
            mem[key] = mem.get(key, 0.0) + s["mem_granted_mb_s"]
            sm[key] = sm.get(key, 0.0) + s["sm_granted_s"]
        for (uuid, _), total in mem.items():
            assert total <= gpus[uuid].memory_mb
        for (uuid, _), total in sm.items():
            assert total <= gpus[uuid].sm_count


def test_agent_config_rejects_windows_that_do_not_divide_into_samples() -> None:
    with pytest.raises(ValueError, match="batch_seconds must be a positive multiple"):
        AgentConfig(node="n", meter_ms=2000, batch_seconds=5)
    with pytest.raises(ValueError, match="tick_ms must be in"):
        AgentConfig(node="n", tick_ms=5)
