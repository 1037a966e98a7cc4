"""The agent's predictions and grants are pinned: a change to the predictors' hot path (batching,
compiling, vectorised bookkeeping) must reproduce them.

``fixtures/prediction_reference.json`` was written by :func:`drive` (numpy LSTM, per-sample
predictor bookkeeping), with

    python -m tests.agents.test_prediction_reference > tests/agents/fixtures/prediction_reference.json

The scenario goes through every path of the bookkeeping: workloads that come, leave and come back,
readings 0.3-0.7 s apart and one 6 s gap (the interpolation's cap), bursts, flat use, zero use, two
GPUs of different SM counts, online calibration on, the default (lstm) and the last-value kinds.
Every tenth tick's grants, predictions and calibration state are compared to 1e-9.
"""

from __future__ import annotations

import json
import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import pytest

from agents.allocation import Policy, compute_grants
from agents.interfaces import GpuInfo, UsageReading, Workload
from agents.prediction import DEFAULT_HEADROOM, make_workload_predictors

FIXTURE = Path(__file__).parent / "fixtures" / "prediction_reference.json"
T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
GPUS = (
    GpuInfo(uuid="GPU-0", model="NVIDIA A100-SXM4-80GB", memory_mb=81920, sm_count=108),
    GpuInfo(uuid="GPU-1", model="half an A100", memory_mb=40960, sm_count=54),
)
TICKS = 160
WORKLOADS = 20
Record = dict[str, object]


def _use(rng: random.Random, k: int, t: float) -> tuple[float, float]:
    """Memory MiB and SMs of workload ``k`` at ``t`` s: flat, bursty, ramping or idle by ``k``."""
    kind = k % 4
    if kind == 0:  # flat
        return 6000.0 + 100.0 * k, 12.0
    if kind == 1:  # bursty
        return 9000.0 + rng.expovariate(1 / 1500), min(54.0, rng.expovariate(1 / 10))
    if kind == 2:  # a KV cache filling and being freed every 12 s
        phase = t % 12.0
        return 4000.0 + 600.0 * min(phase, 8.0) * (phase < 10.0), 30.0 * (phase < 10.0)
    return 0.0, 0.0  # loaded, idle


def drive(kind: Literal["lstm", "last-value"], seed: int) -> list[Record]:
    """One record per tenth tick: the grants, and each workload's prediction and calibration state."""
    rng = random.Random(seed)
    predictors = make_workload_predictors(kind, gpus=GPUS)
    workloads = [
        Workload(tenant=f"t{k % 5}", namespace="ns", pod=f"p{k}", container="c", pod_uid=f"u{k}", sla_tier="silver")
        for k in range(WORKLOADS)
    ]
    # The headroom ``vgpu-agent run --predictor KIND`` applies: these forecasters' margins were fitted
    # for it, and the Policy's own default (0) is the margin predictor's.
    policy = Policy(throttled_tenants=frozenset({"t4"}), headroom=DEFAULT_HEADROOM[kind])
    records: list[Record] = []
    t = 0.0
    for i in range(TICKS):
        t += 6.0 if i == 80 else rng.uniform(0.3, 0.7)
        present = [k for k in range(WORKLOADS) if (i // 25 + k) % 5 != 0]  # some leave and come back
        readings = []
        for k in present:
            mem, sm = _use(rng, k, t)
            gpu = GPUS[k % 2]
            readings.append(
                UsageReading(
                    workload=workloads[k],
                    gpu=gpu.uuid,
                    mem_used_mb=min(mem, gpu.memory_mb / 4),
                    sm_used=min(sm, float(gpu.sm_count)),
                    pcie_mb_per_s=0.0,
                )
            )
        result = compute_grants(gpus=GPUS, readings=readings, policy=policy, predictor=predictors, now=T0 + timedelta(seconds=t))
        predictors.observe(grants=result.grants, readings=readings)
        if i % 10 == 9:
            records.append(
                {
                    "tick": i,
                    "grants": [[g.workload.key, g.gpu, g.mem_mb, g.sm] for g in result.grants],
                    "stats": [
                        [
                            s.workload.key,
                            s.gpu,
                            s.mem_predicted_mb,
                            s.sm_predicted,
                            s.mem_margin_mb,
                            s.sm_margin,
                            s.mem_underprediction_rate,
                            s.sm_underprediction_rate,
                            s.mem_over_reservation_mb,
                            s.sm_over_reservation,
                        ]
                        for s in sorted(predictors.stats(), key=lambda s: (s.workload.key, s.gpu))
                    ],
                }
            )
    return records


SCENARIOS: tuple[tuple[Literal["lstm", "last-value"], int], ...] = (("lstm", 1), ("lstm", 2), ("last-value", 1))


def _close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-9, abs=1e-9)
    return a == b


@pytest.mark.parametrize(("kind", "seed"), SCENARIOS)
def test_predictions_and_grants_equal_the_reference(kind: Literal["lstm", "last-value"], seed: int) -> None:
    expected = json.loads(FIXTURE.read_text())[f"{kind}/{seed}"]
    got = json.loads(json.dumps(drive(kind, seed)))  # the fixture's own types: lists, floats, None
    assert len(got) == len(expected) == TICKS // 10
    for g, e in zip(got, expected, strict=True):
        assert g["tick"] == e["tick"]
        for section in ("grants", "stats"):
            assert len(g[section]) == len(e[section]), (e["tick"], section)
            for row_g, row_e in zip(g[section], e[section], strict=True):
                assert all(_close(x, y) for x, y in zip(row_g, row_e, strict=True)), (e["tick"], section, row_g, row_e)


if __name__ == "__main__":
    json.dump({f"{kind}/{seed}": drive(kind, seed) for kind, seed in SCENARIOS}, sys.stdout)
    sys.stdout.write("\n")
