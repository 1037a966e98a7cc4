"""The meter turns piecewise-constant rates into exact per-second integrals."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.batch import format_utc
from agents.interfaces import GpuInfo, Workload
from agents.meter import QUANTUM, Meter, Rate

T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
GPU = GpuInfo(uuid="GPU-a", model="NVIDIA A100-SXM4-80GB", memory_mb=81920, sm_count=108)
BERT = Workload(
    tenant="acme",
    namespace="acme-prod",
    pod="bert-7f9c4-x2k9p",
    container="server",
    pod_uid="6c1e",
    sla_tier="gold",
)
LLAMA = Workload(
    tenant="globex",
    namespace="globex-prod",
    pod="llama2-7b-b2c4d-q5r6s",
    container="llm",
    pod_uid="9a0b",
    sla_tier="silver",
)


def rate(
    workload: Workload = BERT,
    *,
    mem: float = 0.0,
    mem_granted: float = 0.0,
    sm: float = 0.0,
    sm_granted: float = 0.0,
    pcie: float = 0.0,
    gpu: str = GPU.uuid,
) -> Rate:
    return Rate(
        workload=workload,
        gpu=gpu,
        mem_used_mb=mem,
        mem_granted_mb=mem_granted,
        sm_used=sm,
        sm_granted=sm_granted,
        pcie_mb_per_s=pcie,
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_integrals_are_exact_for_rates_that_change_inside_a_second() -> None:
    meter = Meter(gpus=[GPU], start=T0)
    meter.update(at=at(0), rates=[rate(mem=312.5, mem_granted=512, sm=7.5, sm_granted=13.5)])
    meter.update(at=at(0.25), rates=[rate(mem=400, mem_granted=512, sm=10, sm_granted=13.5, pcie=4)])
    (sample,) = meter.update(at=at(1), rates=[])
    assert sample.start == T0
    assert sample.seconds == 1
    assert sample.mem_used_mb_s == 312.5 * 0.25 + 400 * 0.75
    assert sample.mem_granted_mb_s == 512.0
    assert sample.sm_used_s == 7.5 * 0.25 + 10 * 0.75
    assert sample.sm_granted_s == 13.5
    assert sample.pcie_mb == 3.0


def test_a_rate_held_across_seconds_is_split_at_each_whole_second() -> None:
    meter = Meter(gpus=[GPU], start=T0)
    meter.update(at=at(0.5), rates=[rate(mem=1024, mem_granted=2048)])
    samples = meter.update(at=at(3.5), rates=[])
    assert [s.start for s in samples] == [at(0), at(1), at(2)]
    assert [s.mem_used_mb_s for s in samples] == [512.0, 1024.0, 1024.0]
    assert [s.mem_granted_mb_s for s in samples] == [1024.0, 2048.0, 2048.0]
    assert meter.completed_until == at(3)
    (tail,) = meter.advance(to=at(4))  # the rate stopped at 3.5: half a second of use
    assert (tail.start, tail.mem_used_mb_s) == (at(3), 512.0)
    assert meter.advance(to=at(4)) == []  # advancing to the same instant again adds nothing


def test_nothing_before_the_meter_start_is_counted() -> None:
    meter = Meter(gpus=[GPU], start=T0)
    meter.update(at=at(-5), rates=[rate(mem=100)])
    (sample,) = meter.advance(to=at(1))
    assert sample.mem_used_mb_s == 100.0


def test_idle_seconds_produce_no_samples_but_still_complete() -> None:
    meter = Meter(gpus=[GPU], start=T0)
    assert meter.advance(to=at(5)) == []
    assert meter.completed_until == at(5)


def test_wider_periods_integrate_several_seconds_into_one_sample() -> None:
    meter = Meter(gpus=[GPU], start=T0, period_s=10)
    meter.update(at=at(0), rates=[rate(sm=2, sm_granted=4)])
    (sample,) = meter.advance(to=at(10))
    assert (sample.seconds, sample.sm_used_s, sample.sm_granted_s) == (10, 20.0, 40.0)


def test_sample_start_is_formatted_as_whole_utc_seconds_with_z() -> None:
    meter = Meter(gpus=[GPU], start=T0)
    meter.update(at=at(0), rates=[rate(mem=1)])
    (sample,) = meter.advance(to=at(1))
    assert sample.to_wire()["start"] == "2026-11-30T03:00:00Z"
    assert format_utc(at(1)) == "2026-11-30T03:00:01Z"


def test_meter_start_must_be_a_whole_second() -> None:
    with pytest.raises(ValueError, match="not a whole second"):
        Meter(gpus=[GPU], start=at(0.5))


def test_time_going_backwards_is_refused() -> None:
    meter = Meter(gpus=[GPU], start=T0)
    meter.advance(to=at(2))
    with pytest.raises(ValueError, match="time went backwards"):
        meter.advance(to=at(1))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (rate(mem=81921), "mem_used_mb=81921"),
        (rate(sm_granted=109), "sm_granted=109"),
        (rate(pcie=-1), "pcie_mb_per_s=-1"),
        (rate(mem=math.nan), "mem_used_mb=nan"),
        (rate(gpu="GPU-unknown"), "unknown GPU"),
    ],
)
def test_rates_outside_the_card_are_refused(bad: Rate, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Meter(gpus=[GPU], start=T0).update(at=T0, rates=[bad])


def test_granted_rates_summing_above_capacity_are_refused() -> None:
    meter = Meter(gpus=[GPU], start=T0)
    with pytest.raises(ValueError, match="SMs granted on GPU-a sum to"):
        meter.update(at=T0, rates=[rate(BERT, sm_granted=60), rate(LLAMA, sm_granted=60)])


grant_fraction = st.floats(min_value=0.0, max_value=1.0)


@settings(max_examples=200)
@given(
    ticks=st.lists(
        st.tuples(
            st.integers(min_value=1, max_value=1500),  # tick length, ms
            st.lists(grant_fraction, min_size=1, max_size=6),  # split of the card
        ),
        min_size=1,
        max_size=12,
    )
)
def test_granted_per_gpu_per_second_never_exceeds_capacity(
    ticks: list[tuple[int, list[float]]],
) -> None:
    workloads = [
        Workload(
            tenant="t",
            namespace="ns",
            pod=f"pod-{i}",
            container="c",
            pod_uid=f"uid-{i}",
            sla_tier="gold",
        )
        for i in range(6)
    ]
    meter = Meter(gpus=[GPU], start=T0)
    now_ms = 0
    samples = []
    for length_ms, weights in ticks:
        total = sum(weights) or 1.0
        rates = [
            rate(
                workloads[i],
                mem=GPU.memory_mb * w / total,
                mem_granted=GPU.memory_mb * w / total,
                sm=GPU.sm_count * w / total,
                sm_granted=GPU.sm_count * w / total,
            )
            for i, w in enumerate(weights)
        ]
        samples += meter.update(at=at(now_ms / 1000), rates=rates)
        now_ms += length_ms
    samples += meter.advance(to=at(math.ceil(now_ms / 1000)))
    by_second: dict[datetime, list[float]] = {}
    for s in samples:
        assert 0 <= s.mem_used_mb_s <= GPU.memory_mb
        assert 0 <= s.sm_used_s <= GPU.sm_count
        by_second.setdefault(s.start, []).append(s.sm_granted_s)
        by_second.setdefault(s.start + timedelta(microseconds=1), []).append(s.mem_granted_mb_s)
        for value in (s.mem_used_mb_s, s.mem_granted_mb_s, s.sm_used_s, s.sm_granted_s):
            assert (value / QUANTUM).is_integer()  # exact in binary floating point
    for key, granted in by_second.items():
        capacity = GPU.sm_count if key.microsecond == 0 else GPU.memory_mb
        assert sum(granted) <= capacity
        assert sum(reversed(granted)) <= capacity
