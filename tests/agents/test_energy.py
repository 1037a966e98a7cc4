"""GPU energy on the agent (docs/agent.md, Energy): the NVML backend reads the total energy counter
where the GPU has one, else integrates its power draw, else reports nothing for it; the meter turns
the counts into joules per GPU per period, whole periods only; and the agent's batches carry each GPU's
energy over the whole window, as the simulated nodes of the demo meter it."""

from __future__ import annotations

import json
import math
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agents.backends.nvml import NvmlBackend
from agents.backends.sim import IDLE_POWER_W, MAX_POWER_W, SimBackend, demo_scenario, parse_scenario
from agents.batch import render_batch
from agents.enforcers import DryRunEnforcer
from agents.fakes.clock import FakeClock
from agents.fakes.nvml import FakeNvml, FakeNvmlDevice
from agents.interfaces import EnergyReader, GpuInfo
from agents.loop import Agent, AgentConfig
from agents.meter import Meter
from agents.spool import Spool

T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
GPU = GpuInfo(uuid="GPU-a", model="NVIDIA A100-SXM4-80GB", memory_mb=81920, sm_count=108)


def test_nvml_reads_the_energy_counter_in_joules() -> None:
    device = FakeNvmlDevice(uuid="GPU-a", total_energy_mj=5_000_000, power_mw=999_000)
    backend = NvmlBackend(nvml=FakeNvml(devices=[device]))
    assert isinstance(backend, EnergyReader)
    assert backend.energy_j(now=T0) == {"GPU-a": 5000.0}
    device.total_energy_mj = 5_001_250
    assert backend.energy_j(now=T0 + timedelta(seconds=1)) == {"GPU-a": 5001.25}


def test_without_a_counter_nvml_integrates_the_power_draw_and_without_either_reports_nothing() -> None:
    metered = FakeNvmlDevice(uuid="GPU-p", power_mw=300_000)
    blind = FakeNvmlDevice(uuid="GPU-x")
    backend = NvmlBackend(nvml=FakeNvml(devices=[metered, blind]))
    assert backend.energy_j(now=T0) == {"GPU-p": 0.0}
    metered.power_mw = 100_000  # 300 W held for the 10 s since the last read, then 100 W
    assert backend.energy_j(now=T0 + timedelta(seconds=10)) == {"GPU-p": 3000.0}
    assert backend.energy_j(now=T0 + timedelta(seconds=15)) == {"GPU-p": 3500.0}


def test_the_meter_spreads_a_counters_growth_evenly_and_keeps_whole_periods_only() -> None:
    meter = Meter(gpus=[GPU], start=T0, period_s=1)
    meter.update(at=T0, rates=[], energy_j={"GPU-a": 1000.0})  # the first count: no power known yet
    meter.update(at=T0 + timedelta(seconds=2.5), rates=[], energy_j={"GPU-a": 1500.0})  # 200 W
    meter.update(at=T0 + timedelta(seconds=4), rates=[], energy_j={"GPU-a": 1800.0})  # 200 W
    assert meter.take_energy(start=T0, end=T0 + timedelta(seconds=4)) == {"GPU-a": pytest.approx(800.0)}


def test_a_window_with_a_period_of_unknown_energy_has_none() -> None:
    meter = Meter(gpus=[GPU], start=T0, period_s=1)
    meter.update(at=T0 + timedelta(seconds=0.5), rates=[], energy_j={"GPU-a": 0.0})  # power unknown before this
    meter.update(at=T0 + timedelta(seconds=3), rates=[], energy_j={"GPU-a": 250.0})
    assert meter.take_energy(start=T0, end=T0 + timedelta(seconds=3)) == {}  # the first second lacks half
    meter.update(at=T0 + timedelta(seconds=5), rates=[], energy_j={"GPU-a": 200.0})  # the counter went back
    assert meter.take_energy(start=T0 + timedelta(seconds=3), end=T0 + timedelta(seconds=5)) == {}


def test_a_batch_names_each_gpus_energy_only_when_it_has_one() -> None:
    other = GpuInfo(uuid="GPU-b", model=GPU.model, memory_mb=GPU.memory_mb, sm_count=GPU.sm_count)
    body = render_batch(node="n", batch_seq=1, window_start=T0, window_end=T0 + timedelta(seconds=10),
                        gpus=[GPU, other], samples=[], energy_j={"GPU-a": 1234.56789}, wire="v2")
    assert b'"uuid":"GPU-a","model":"NVIDIA A100-SXM4-80GB","memory_mb":81920,"sm_count":108,"energy_j":1234.568}' in body
    assert b'"uuid":"GPU-b","model":"NVIDIA A100-SXM4-80GB","memory_mb":81920,"sm_count":108}' in body


def test_the_simulated_agent_meters_each_gpus_energy_within_its_power_range(tmp_path: Path) -> None:
    scenario = parse_scenario(demo_scenario("gpu-node-01", seed=3, gpu_count=2, tenants=[("acme", "gold")]))
    spool = Spool(tmp_path / "spool.sqlite", node=scenario.node, now=lambda: T0)
    agent = Agent(config=AgentConfig(node=scenario.node, tick_ms=500, batch_seconds=10),
                  backend=SimBackend(scenario, epoch=T0), clock=FakeClock(start=T0), enforcer=DryRunEnforcer(),
                  spool=spool)
    agent.run(stop=threading.Event(), start=T0, until=T0 + timedelta(seconds=30))
    batches = [json.loads(b.json_bytes()) for b in spool.list_batches()]
    assert len(batches) == 3
    for batch in batches:
        seconds = 10
        energies = [g.get("energy_j") for g in batch["gpus"]]
        assert all(e is not None for e in energies), batch["gpus"]
        for joules in energies:
            assert IDLE_POWER_W * seconds - 1e-6 <= joules <= MAX_POWER_W * seconds + 1e-6
            assert math.isfinite(joules)
