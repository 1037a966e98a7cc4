"""Per-workload peak prediction in the agent: pre-reservation, the default predictor, online calibration."""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agents.allocation import CurrentUsePredictor, Policy, compute_grants
from agents.fakes.clock import FakeClock
from agents.interfaces import GpuInfo, Grant, Prediction, Predictor, UsageReading, Workload
from agents.loop import Agent, AgentConfig
from agents.metrics import AgentMetrics
from agents.prediction import Calibration, MarginPredictor, WorkloadPredictors, make_workload_predictors
from agents.spool import Spool
from allocator.predict import default_predictor

T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
GPU = GpuInfo(uuid="GPU-0", model="NVIDIA A100-SXM4-80GB", memory_mb=81920, sm_count=108)
LLM = Workload(tenant="acme", namespace="acme-prod", pod="llm-0", container="server", pod_uid="u-0", sla_tier="gold")
OTHER = Workload(tenant="globex", namespace="globex", pod="bert-0", container="server", pod_uid="u-1", sla_tier="bronze")
RAMP_START_S, RAMP_END_S, RAMP_MB_PER_S = 10.0, 16.0, 800.0


def llm_memory_mb(t: float) -> float:
    """Idle at 8 GB, then a KV cache filling at 800 MB/s for 6 s, then flat."""
    return 8000.0 + RAMP_MB_PER_S * (min(max(t, RAMP_START_S), RAMP_END_S) - RAMP_START_S)


class RampBackend:
    """The GPU edge: one workload whose memory ramps up (a function of time, like the sim)."""

    def inventory(self) -> Sequence[GpuInfo]:
        return [GPU]

    def read(self, *, now: datetime) -> Sequence[UsageReading]:
        t = (now - T0).total_seconds()
        return [UsageReading(workload=LLM, gpu=GPU.uuid, mem_used_mb=llm_memory_mb(t), sm_used=20.0, pcie_mb_per_s=0.0)]


class RecordingEnforcer:
    def __init__(self) -> None:
        self.rounds: list[tuple[Grant, ...]] = []

    def apply(self, grants: Sequence[Grant]) -> None:
        self.rounds.append(tuple(grants))


def run_ramp(tmp_path: Path, predictor: Predictor | None) -> tuple[Agent, dict[float, float]]:
    """Grants in MB by tick time (s after T0), headroom 0 so that only the prediction reserves ahead."""
    enforcer = RecordingEnforcer()
    agent = Agent(
        config=AgentConfig(node="gpu-node-01", tick_ms=500, batch_seconds=10, policy=Policy(headroom=0.0)),
        backend=RampBackend(),
        clock=FakeClock(start=T0),
        enforcer=enforcer,
        spool=Spool(tmp_path / "spool.sqlite", node="gpu-node-01", now=lambda: T0),
        predictor=predictor,
        checkpoint=False,
    )
    agent.run(stop=threading.Event(), start=T0 + timedelta(seconds=1), until=T0 + timedelta(seconds=20))
    # The first tick lands one tick before ``start``; ticks are 500 ms apart.
    return agent, {0.5 + 0.5 * i: r[0].mem_mb for i, r in enumerate(enforcer.rounds)}


def reading(workload: Workload, *, mem_mb: float, sm: float) -> UsageReading:
    return UsageReading(workload=workload, gpu=GPU.uuid, mem_used_mb=mem_mb, sm_used=sm, pcie_mb_per_s=0.0)


def test_grants_rise_before_the_memory_arrives_on_a_ramp(tmp_path: Path) -> None:
    agent, grants = run_ramp(tmp_path, predictor=None)
    assert isinstance(agent.predictor, MarginPredictor)  # the default, no predictor passed
    ramp = [t for t in grants if RAMP_START_S < t < RAMP_END_S]
    assert len(ramp) >= 10
    for t in ramp:
        # Reserved a tick ahead: what the workload will hold at the next tick is already granted.
        assert grants[t] >= llm_memory_mb(t + 0.5), t
    assert all(grants[a] < grants[b] for a, b in itertools.pairwise(ramp))  # rising with the ramp
    _, current_use = run_ramp(tmp_path / "current", predictor=CurrentUsePredictor())
    assert all(current_use[t] == llm_memory_mb(t) < llm_memory_mb(t + 0.5) for t in ramp)  # always a tick late


def test_the_default_is_the_calibrated_lstm_for_memory_and_last_value_plus_margin_for_sms() -> None:
    predictors = make_workload_predictors("lstm", gpus=[GPU])
    prediction = predictors.predict(reading=reading(LLM, mem_mb=9000.0, sm=30.0), now=T0)
    memory, sm = default_predictor("memory_mb"), default_predictor("sm")
    memory.observe(9000.0)
    sm.observe(30.0)
    assert prediction.mem_peak_mb == pytest.approx(max(memory.predict().as_tuple()))
    assert prediction.sm_peak == pytest.approx(max(sm.predict().as_tuple()))
    assert prediction.sm_peak > 30.0 + 50  # one prefill's worth of SMs above the last value


def test_sm_is_predicted_in_the_units_of_each_gpus_own_sm_count() -> None:
    small = GpuInfo(uuid="GPU-1", model="half an A100", memory_mb=81920, sm_count=54)
    predictors = make_workload_predictors("lstm", gpus=[GPU, small])
    full = predictors.predict(reading=reading(LLM, mem_mb=9000.0, sm=20.0), now=T0)
    half = predictors.predict(
        reading=UsageReading(workload=LLM, gpu=small.uuid, mem_used_mb=9000.0, sm_used=10.0, pcie_mb_per_s=0.0),
        now=T0,
    )
    assert half.sm_peak == pytest.approx(full.sm_peak / 2)
    assert half.mem_peak_mb == pytest.approx(full.mem_peak_mb)


def test_a_workload_that_left_is_forgotten() -> None:
    predictors = make_workload_predictors("lstm", gpus=[GPU])
    for i in range(3):
        readings = [reading(LLM, mem_mb=9000.0, sm=10.0), reading(OTHER, mem_mb=2000.0, sm=5.0)]
        for r in readings:
            predictors.predict(reading=r, now=T0 + timedelta(seconds=0.5 * i))
        predictors.observe(grants=(), readings=readings)
    predictors.observe(grants=(), readings=[reading(LLM, mem_mb=9000.0, sm=10.0)])
    assert [s.workload.key for s in predictors.stats()] == [LLM.key]


def drive(predictors: WorkloadPredictors, *, ticks: int, seed: int) -> list[tuple[float, float]]:
    """Bursty synthetic use every 500 ms; the rolling (memory, SM) under-prediction rates every 100 ticks."""
    rng = random.Random(seed)
    rates: list[tuple[float, float]] = []
    for i in range(ticks):
        r = reading(LLM, mem_mb=12000.0 + rng.expovariate(1 / 1500), sm=min(108.0, rng.expovariate(1 / 15)))
        predictors.predict(reading=r, now=T0 + timedelta(seconds=0.5 * i))
        if i % 100 == 99 and i >= ticks // 2:
            s = predictors.stats()[0]
            assert s.mem_underprediction_rate is not None
            assert s.sm_underprediction_rate is not None
            rates.append((s.mem_underprediction_rate, s.sm_underprediction_rate))
    return rates


def test_online_calibration_holds_the_under_prediction_rate_at_the_target() -> None:
    # Off the shipped trace: the shipped margins under-predict memory half the time and SMs almost never.
    fixed = drive(make_workload_predictors("lstm", gpus=[GPU], calibration=Calibration(enabled=False)), ticks=3000, seed=5)
    assert min(m for m, _ in fixed) > 0.3
    assert sum(s for _, s in fixed) / len(fixed) < 0.025
    online = make_workload_predictors("lstm", gpus=[GPU])
    rates = drive(online, ticks=3000, seed=5)
    mean_mem = sum(m for m, _ in rates) / len(rates)
    mean_sm = sum(s for _, s in rates) / len(rates)
    assert 0.03 <= mean_mem <= 0.08
    assert 0.03 <= mean_sm <= 0.08
    s = online.stats()[0]
    assert s.mem_margin_mb > 0 > s.sm_margin  # memory needed more margin, SMs less
    assert abs(s.mem_margin_mb) <= 0.25 * GPU.memory_mb
    assert abs(s.sm_margin) <= 0.25 * GPU.sm_count


def test_the_margin_stays_within_its_bound() -> None:
    predictors = make_workload_predictors("lstm", gpus=[GPU], calibration=Calibration(max_margin_fraction=0.01))
    drive(predictors, ticks=1000, seed=3)
    assert predictors.stats()[0].mem_margin_mb == pytest.approx(0.01 * GPU.memory_mb)


def scrape(metrics: AgentMetrics) -> dict[tuple[str, str], float]:
    """(sample name, pod) -> value of every per-workload series."""
    text = generate_latest(metrics.registry).decode()
    return {
        (sample.name, sample.labels["pod"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "pod" in sample.labels
    }


def test_prediction_metrics_are_exported_in_base_units() -> None:
    predictors = make_workload_predictors("lstm", gpus=[GPU])
    metrics = AgentMetrics()
    metrics.watch_predictions(predictors.stats)
    predictors.predict(reading=reading(LLM, mem_mb=9000.0, sm=10.0), now=T0)
    first = scrape(metrics)
    assert ("vgpu_agent_memory_predicted_bytes", "llm-0") in first
    assert ("vgpu_agent_memory_underprediction_ratio", "llm-0") not in first  # nothing checked yet
    for i in range(1, 10):
        predictors.predict(reading=reading(LLM, mem_mb=9000.0, sm=10.0), now=T0 + timedelta(seconds=0.5 * i))
    series = scrape(metrics)
    s = predictors.stats()[0]
    mib = 1024 * 1024
    assert series[("vgpu_agent_memory_predicted_bytes", "llm-0")] == pytest.approx(s.mem_predicted_mb * mib)
    assert s.mem_predicted_mb > 9000.0
    assert series[("vgpu_agent_sm_predicted", "llm-0")] == pytest.approx(s.sm_predicted)
    # A flat signal is never above its calibrated forecast; all of the forecast above use is over-reserved.
    assert series[("vgpu_agent_memory_underprediction_ratio", "llm-0")] == 0.0
    assert series[("vgpu_agent_sm_underprediction_ratio", "llm-0")] == 0.0
    assert s.mem_over_reservation_mb is not None
    assert s.sm_over_reservation is not None
    assert series[("vgpu_agent_memory_over_reservation_bytes", "llm-0")] == pytest.approx(s.mem_over_reservation_mb * mib)
    assert s.mem_over_reservation_mb > 0
    assert series[("vgpu_agent_sm_over_reservation", "llm-0")] == pytest.approx(s.sm_over_reservation)
    assert series[("vgpu_agent_memory_prediction_margin_bytes", "llm-0")] == pytest.approx(s.mem_margin_mb * mib)
    assert s.sm_margin < 0  # nine hits in a row: the SM margin came down
    assert series[("vgpu_agent_sm_prediction_margin", "llm-0")] == pytest.approx(s.sm_margin)
    predictors.observe(grants=(), readings=())
    assert scrape(metrics) == {}


class _OneByOne:
    """A plain ``Predictor``: hides ``predict_many``, so ``compute_grants`` asks reading by reading."""

    def __init__(self, inner: WorkloadPredictors) -> None:
        self.inner = inner

    def predict(self, *, reading: UsageReading, now: datetime) -> Prediction:
        return self.inner.predict(reading=reading, now=now)


def test_a_batched_tick_predicts_and_grants_what_reading_by_reading_does() -> None:
    """``predict_many`` (one LSTM pass for the tick) against ``predict`` per reading, over a workload churn."""
    small = GpuInfo(uuid="GPU-1", model="half an A100", memory_mb=40960, sm_count=54)
    gpus = [GPU, small]
    batched, single = (make_workload_predictors("lstm", gpus=gpus) for _ in range(2))
    one_by_one = _OneByOne(single)
    workloads = [
        Workload(tenant=f"t{k % 3}", namespace="ns", pod=f"p{k}", container="c", pod_uid=f"u{k}", sla_tier="silver")
        for k in range(10)
    ]
    rng = random.Random(5)
    policy = Policy()
    for i in range(120):
        now = T0 + timedelta(seconds=0.5 * i + rng.uniform(0, 0.3))
        present = [w for k, w in enumerate(workloads) if (i // 20 + k) % 4 != 0]  # some leave and come back
        readings = [
            UsageReading(
                workload=w,
                gpu=gpus[k % 2].uuid,
                mem_used_mb=rng.uniform(1000, 6000),
                sm_used=rng.uniform(0, 20),
                pcie_mb_per_s=0.0,
            )
            for k, w in enumerate(present)
        ]
        a = compute_grants(gpus=gpus, readings=readings, policy=policy, predictor=batched, now=now)
        b = compute_grants(gpus=gpus, readings=readings, policy=policy, predictor=one_by_one, now=now)
        assert [g.workload for g in a.grants] == [g.workload for g in b.grants]
        for ga, gb in zip(a.grants, b.grants, strict=True):
            assert (ga.mem_mb, ga.sm) == pytest.approx((gb.mem_mb, gb.sm), rel=1e-9, abs=1e-9)
        for predictors in (batched, single):
            predictors.observe(grants=a.grants, readings=readings)
        for x, y in zip(batched.stats(), single.stats(), strict=True):
            assert (x.workload, x.gpu) == (y.workload, y.gpu)
            assert (x.mem_predicted_mb, x.sm_predicted, x.mem_margin_mb, x.sm_margin) == pytest.approx(
                (y.mem_predicted_mb, y.sm_predicted, y.mem_margin_mb, y.sm_margin), rel=1e-9, abs=1e-9
            )
            assert (x.mem_underprediction_rate, x.sm_underprediction_rate) == (
                y.mem_underprediction_rate,
                y.sm_underprediction_rate,
            )


def test_predict_many_with_a_workload_read_twice_is_reading_by_reading() -> None:
    batched, single = (make_workload_predictors("lstm", gpus=[GPU]) for _ in range(2))
    readings = [reading(LLM, mem_mb=9000.0, sm=10.0), reading(OTHER, mem_mb=2000.0, sm=5.0), reading(LLM, mem_mb=9500.0, sm=12.0)]
    for i in range(5):
        now = T0 + timedelta(seconds=0.5 * i)
        assert batched.predict_many(readings=readings, now=now) == [single.predict(reading=r, now=now) for r in readings]


def test_the_default_margin_policy_exports_each_workloads_reservation() -> None:
    """The agent's default predictor feeds /metrics too: an SRE sees each workload's reservation and
    how far it stands above the use read, and a workload that left is no longer exported."""
    predictor = MarginPredictor(gpus=[GPU])
    metrics = AgentMetrics()
    metrics.watch_predictions(predictor.stats)
    r = reading(LLM, mem_mb=9000.0, sm=10.0)
    (prediction,) = predictor.predict_many(readings=[r], now=T0)
    series = scrape(metrics)
    mib = 1024 * 1024
    assert prediction.mem_peak_mb > 9000.0
    assert series[("vgpu_agent_memory_predicted_bytes", "llm-0")] == pytest.approx(prediction.mem_peak_mb * mib)
    assert series[("vgpu_agent_sm_predicted", "llm-0")] == pytest.approx(prediction.sm_peak)
    assert series[("vgpu_agent_memory_prediction_margin_bytes", "llm-0")] == pytest.approx((prediction.mem_peak_mb - 9000.0) * mib)
    assert ("vgpu_agent_memory_underprediction_ratio", "llm-0") not in series
    predictor.observe(grants=(), readings=())
    assert scrape(metrics) == {}


def test_the_default_forgets_a_workload_gone_in_the_tick_another_arrives() -> None:
    """The forgetting pass skips its search when every followed workload was read this tick; a tick
    that reads as many workloads as before, one of them new, must still forget the one that left."""
    predictor = MarginPredictor(gpus=[GPU])
    first = [reading(LLM, mem_mb=9000.0, sm=10.0)]
    predictor.predict_many(readings=first, now=T0)
    predictor.observe(grants=(), readings=first)
    then = [reading(OTHER, mem_mb=2000.0, sm=5.0)]
    predictor.predict_many(readings=then, now=T0 + timedelta(seconds=1))
    predictor.observe(grants=(), readings=then)
    assert [s.workload for s in predictor.stats()] == [OTHER]
    predictor.predict_many(readings=then, now=T0 + timedelta(seconds=2))
    predictor.observe(grants=(), readings=then)  # the same workloads: nothing to forget
    assert [s.workload for s in predictor.stats()] == [OTHER]
