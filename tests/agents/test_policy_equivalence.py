"""One policy, two callers: the agent loop and the replay grant the same, second by second.

The same per-second use (the replay's usage model on a small synthetic request trace) is fed
to the agent loop on a fake clock, through a backend that reads it, with the default predictor;
the replay runs ``agent-default`` over the same pods. Every second's grant the agent applied must
equal the reservation the replay holds for the second after it (a grant decided on reading
second ``s`` is in force until second ``s + 1`` is read).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from agents.allocation import Policy
from agents.fakes.clock import FakeClock
from agents.interfaces import Entitlement, GpuInfo, Grant, UsageReading, Workload
from agents.loop import Agent, AgentConfig
from agents.prediction import MarginPredictor
from agents.spool import Spool
from allocator.policy import MarginConfig
from allocator.replay import AzureRequests, BurstSignals, GpuPod, UsageModel, build_burst_signals, build_pod_usage
from allocator.replay._agent import agent_rows, row_reservations
from allocator.risk import MissTarget

T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
GPU = GpuInfo(uuid="GPU-eq", model="NVIDIA A100-SXM4-80GB", memory_mb=81_920, sm_count=108)
STEPS = 4
# A target this loose moves margins within minutes, so the short run exercises calibration.
TARGET = MissTarget(memory=0.02, sm=0.05)
MARGIN = MarginConfig(prior_margin=0.1, min_margin=0.0, step=0.2)


def _signals() -> BurstSignals:
    rng = np.random.default_rng(3)
    arrival = np.sort(rng.uniform(0.0, 900.0, 3_000))
    arrival -= arrival[0]
    requests = AzureRequests(
        arrival_s=arrival,
        context_tokens=rng.integers(50, 2_000, arrival.size).astype(np.float64),
        generated_tokens=rng.integers(10, 400, arrival.size).astype(np.float64),
    )
    return build_burst_signals(requests, step_s=60)


class _Playback:
    """The NVML edge: each workload's use of the current second, from the usage model."""

    def __init__(self, use: Sequence[np.ndarray], workloads: Sequence[Workload], shares: Sequence[float]) -> None:
        self._use, self._workloads, self._shares = use, workloads, shares

    def inventory(self) -> Sequence[GpuInfo]:
        return (GPU,)

    def read(self, *, now: datetime) -> Sequence[UsageReading]:
        second = int((now - T0).total_seconds() // 1)
        return [
            UsageReading(
                workload=w,
                gpu=GPU.uuid,
                mem_used_mb=float(u[second, 0]),
                sm_used=float(u[second, 1]),
                pcie_mb_per_s=0.0,
                entitlement=Entitlement(limit_mem_mb=share * GPU.memory_mb, limit_sm=share * GPU.sm_count),
            )
            for w, u, share in zip(self._workloads, self._use, self._shares, strict=True)
            if second < u.shape[0]
        ]


class _Recorder:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.grants: dict[tuple[str, float], Grant] = {}

    def apply(self, grants: Sequence[Grant]) -> None:
        at = (self.clock.now() - T0).total_seconds()
        for g in grants:
            self.grants[g.workload.key, at] = g


def test_agent_loop_and_replay_grant_the_same_every_second(tmp_path: Path) -> None:
    model = UsageModel()
    signals = _signals()
    pods = [GpuPod(name=f"pod-{i}", num_gpu=1, gpu_milli=milli, start_s=0.0, end_s=STEPS * 60.0)
            for i, milli in enumerate((250, 400, 300))]
    usage = build_pod_usage(pods, model, signals)
    agent = agent_rows(usage, model, signals, margin=MARGIN, target=TARGET)
    use, reserved = row_reservations(usage, model, signals, agent, np.arange(usage.rows, dtype=np.int64), window_blocks=MARGIN.window_blocks)
    # (steps, resources, step_s) → one (second, resource) row per second
    per_pod_use = [use[usage.offset[i] : usage.offset[i] + STEPS].transpose(0, 2, 1).reshape(-1, 2) for i in range(len(pods))]
    per_pod_reserved = [
        reserved[usage.offset[i] : usage.offset[i] + STEPS].transpose(0, 2, 1).reshape(-1, 2) for i in range(len(pods))
    ]
    assert max(float(r[1:, 1].max()) for r in per_pod_reserved) * len(pods) < GPU.sm_count  # no contention

    workloads = [Workload(tenant="t", namespace="n", pod=p.name, container="c", pod_uid=p.name, sla_tier="bronze")
                 for p in usage.pods]
    policy = replace(Policy(), miss_targets={"bronze": TARGET})
    clock = FakeClock(start=T0)
    recorder = _Recorder(clock)
    Agent(
        config=AgentConfig(node="eq", tick_ms=500, batch_seconds=60),
        backend=_Playback(per_pod_use, workloads, [p.share for p in usage.pods]),
        clock=clock,
        enforcer=recorder,
        spool=Spool(tmp_path / "spool.sqlite", node="eq", now=lambda: T0),
        # The agent's default predictor, with the same knobs as the replay above.
        predictor=MarginPredictor(gpus=(GPU,), targets=policy.miss_target_for, config=MARGIN),
        policy=lambda: policy,
        checkpoint=False,
    ).run(stop=threading.Event(), start=T0, until=T0 + timedelta(seconds=STEPS * 60 - 1))

    compared = 0
    for w, r in zip(workloads, per_pod_reserved, strict=True):
        for second in range(STEPS * 60 - 1):
            for at in (second, second + 0.5):
                g = recorder.grants[w.key, at]
                assert (g.mem_mb, g.sm) == (r[second + 1, 0], r[second + 1, 1]), (w.pod, at)
                compared += 1
    assert compared == len(pods) * (STEPS * 60 - 1) * 2
    assert np.unique(agent.factor[:, 1]).size > 1  # the margins moved: calibration was exercised, not only the prior
