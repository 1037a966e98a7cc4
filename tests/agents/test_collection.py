"""Garbage collection between ticks, not inside them (agents.collection)."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator, Sequence
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
    with TickCollector() as collector:
        assert not gc.isenabled()
        _Cycle()
        for _ in range(5_000):  # far past any threshold: nothing collects on its own
            [[] for _ in range(3)]
        assert _cycle_alive(_Cycle)
        collector.between_ticks()
        assert not _cycle_alive(_Cycle)
    assert gc.isenabled()  # left as found


class _Minutes:
    """The collector's clock, set by hand (seconds)."""

    def __init__(self) -> None:
        self.at = 0.0

    def __call__(self) -> float:
        return self.at


@contextlib.contextmanager
def _full_passes() -> Iterator[list[int]]:
    """The passes that collected everything (their generation), while it is open."""
    full: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(2)

    gc.callbacks.append(record)
    try:
        yield full
    finally:
        gc.callbacks.remove(record)


def test_a_cycle_that_grew_old_goes_with_the_full_pass_once_a_minute() -> None:
    clock = _Minutes()
    with TickCollector(now=clock) as collector:
        held = _Cycle()
        gc.collect(1)  # held, it moves up to the oldest generation, which the young passes do not look at
        del held
        assert _cycle_alive(_Cycle)
        clock.at = 59.9
        collector.between_ticks()  # young generations only
        assert _cycle_alive(_Cycle)
        clock.at = 60.0
        collector.between_ticks()  # a minute since the last full pass: everything
        assert not _cycle_alive(_Cycle)


def test_ticks_back_to_back_share_the_minutes_full_pass() -> None:
    """An agent metering history ticks a simulated minute in milliseconds: a minute of its own
    ticks is not a minute of the process's, and it collects everything once a minute like any."""
    clock = _Minutes()
    with TickCollector(now=clock) as collector, _full_passes() as full:
        for _ in range(1_000):
            collector.between_ticks()
        assert full == []
        clock.at = 61.0
        for _ in range(1_000):
            collector.between_ticks()
        assert full == [2]


def test_collection_left_off_stays_off() -> None:
    gc.disable()
    with TickCollector():
        pass
    assert not gc.isenabled()


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
