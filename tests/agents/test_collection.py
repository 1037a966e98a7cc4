"""Garbage collection between ticks, not inside them (agents.collection)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest

from agents.backends.sim import SimBackend, demo_scenario, parse_scenario
from agents.collection import TickCollector
from agents.enforcers import DryRunEnforcer
from agents.fakes.clock import FakeClock
from agents.interfaces import Grant, UsageReading
from agents.loop import Agent, AgentConfig
from agents.spool import Spool
from tests.agents.test_loop import T0, TENANTS


class _Cycle:
    def __init__(self) -> None:
        self.me = self  # only the cyclic collector frees it


def _cycle_alive(make: type[_Cycle]) -> bool:
    return any(type(o) is make for o in gc.get_objects())


@pytest.fixture(autouse=True)
def _collector_restored() -> object:
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


def test_no_automatic_collection_inside_and_the_loop_collects_between_ticks() -> None:
    gc.enable()
    with TickCollector(tick_s=0.5) as collector:
        assert not gc.isenabled()
        _Cycle()
        for _ in range(5_000):  # far past any threshold: nothing collects on its own
            [[] for _ in range(3)]
        assert _cycle_alive(_Cycle)
        collector.between_ticks()
        assert not _cycle_alive(_Cycle)
    assert gc.isenabled()  # left as found


def test_a_cycle_that_grew_old_goes_with_the_full_pass_once_a_minute() -> None:
    with TickCollector(tick_s=30.0) as collector:  # a full pass every 2 ticks
        held = _Cycle()
        gc.collect(1)  # held, it moves up to the oldest generation, which the young passes do not look at
        del held
        assert _cycle_alive(_Cycle)
        collector.between_ticks()  # tick 1: young generations only
        assert _cycle_alive(_Cycle)
        collector.between_ticks()  # tick 2: everything
        assert not _cycle_alive(_Cycle)


def test_collection_left_off_stays_off() -> None:
    gc.disable()
    with TickCollector(tick_s=0.5):
        pass
    assert not gc.isenabled()


def test_tick_length_must_be_positive() -> None:
    with pytest.raises(ValueError, match="tick_s"):
        TickCollector(tick_s=0)


class _Recorder:
    def __init__(self) -> None:
        self.enabled_in_tick: list[bool] = []

    def observe(self, *, grants: Sequence[Grant], readings: Sequence[UsageReading]) -> None:
        self.enabled_in_tick.append(gc.isenabled())


def test_the_agent_ticks_without_automatic_collection_and_restores_it(tmp_path: Path) -> None:
    gc.enable()
    scenario = parse_scenario(demo_scenario("gpu-node-01", seed=7, gpu_count=1, tenants=TENANTS))
    recorder = _Recorder()
    Agent(
        config=AgentConfig(node=scenario.node, tick_ms=500, batch_seconds=10),
        backend=SimBackend(scenario, epoch=T0),
        clock=FakeClock(start=T0),
        enforcer=DryRunEnforcer(),
        spool=Spool(tmp_path / "spool.sqlite", node=scenario.node, now=lambda: T0),
        observers=[recorder],
    ).run(stop=threading.Event(), start=T0, until=T0 + timedelta(seconds=5))
    assert recorder.enabled_in_tick
    assert not any(recorder.enabled_in_tick)
    assert gc.isenabled()
