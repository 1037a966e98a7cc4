"""Simulated GPUs: deterministic, realistic, never beyond the card."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.backends._profiles import profile_usage
from agents.backends.sim import SimBackend, demo_scenario, parse_scenario

EPOCH = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
TENANTS = [("acme", "gold"), ("globex", "silver"), ("initech", "bronze")]


def test_demo_scenario_is_the_same_for_the_same_arguments() -> None:
    assert demo_scenario("gpu-node-01", seed=7, tenants=TENANTS) == demo_scenario(
        "gpu-node-01", seed=7, tenants=TENANTS
    )


def test_demo_scenario_differs_between_seeds_and_nodes() -> None:
    base = demo_scenario("gpu-node-01", seed=7, tenants=TENANTS)
    assert demo_scenario("gpu-node-01", seed=8, tenants=TENANTS)["workloads"] != base["workloads"]
    other = demo_scenario("gpu-node-02", seed=7, tenants=TENANTS)
    assert {g["uuid"] for g in other["gpus"]}.isdisjoint(g["uuid"] for g in base["gpus"])


def test_demo_scenario_is_a_realistic_a100_node() -> None:
    doc = demo_scenario("gpu-node-01", seed=3, tenants=TENANTS)
    scenario = parse_scenario(doc)  # the demo validates as a scenario file
    assert len(scenario.gpus) == 8
    assert {(g.model, g.memory_mb, g.sm_count) for g in scenario.gpus} == {("NVIDIA A100-SXM4-80GB", 81920, 108)}
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", g.uuid) for g in scenario.gpus)
    for gpu in scenario.gpus:
        assert 2 <= sum(w.gpu == gpu.uuid for w in scenario.workloads) <= 4
    assert {w.profile for w in scenario.workloads} == {"bert-base", "resnet50", "llama2-7b-q4"}
    for w in scenario.workloads:
        assert re.fullmatch(r"(bert|resnet50|llama2-7b)-[a-z0-9]{5}-[a-z0-9]{5}", w.workload.pod)
        assert (w.workload.tenant, w.workload.sla_tier) in TENANTS
        assert w.workload.namespace.startswith(w.workload.tenant + "-")
    assert len({w.workload.pod_uid for w in scenario.workloads}) == len(scenario.workloads)


def test_readings_are_a_function_of_seed_and_elapsed_time() -> None:
    scenario = parse_scenario(demo_scenario("gpu-node-01", seed=11, tenants=TENANTS))
    a = SimBackend(scenario, epoch=EPOCH)
    b = SimBackend(scenario, epoch=EPOCH + timedelta(hours=5))
    instant = timedelta(seconds=123.5)
    later_reading = b.read(now=EPOCH + timedelta(hours=5) + instant)
    assert a.read(now=EPOCH + instant) == later_reading
    reseeded = parse_scenario(dict(demo_scenario("gpu-node-01", seed=11, tenants=TENANTS), seed=12))
    assert SimBackend(reseeded, epoch=EPOCH).read(now=EPOCH + instant) != later_reading


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32), elapsed_s=st.floats(min_value=0, max_value=1e6))
def test_simulated_use_never_exceeds_any_card(seed: int, elapsed_s: float) -> None:
    scenario = parse_scenario(demo_scenario("gpu-node-09", seed=seed, tenants=TENANTS))
    readings = SimBackend(scenario, epoch=EPOCH).read(now=EPOCH + timedelta(seconds=elapsed_s))
    for gpu in scenario.gpus:
        on_gpu = [r for r in readings if r.gpu == gpu.uuid]
        assert sum(r.mem_used_mb for r in on_gpu) <= gpu.memory_mb
        assert sum(r.sm_used for r in on_gpu) <= gpu.sm_count
        assert all(r.mem_used_mb >= 0 and r.sm_used >= 0 and r.pcie_mb_per_s >= 0 for r in on_gpu)


def test_an_overfull_card_is_scaled_down_to_its_capacity() -> None:
    gpu = {"uuid": "GPU-x", "model": "small", "memory_mb": 8000, "sm_count": 10}
    workloads = [
        {
            "tenant": "acme",
            "namespace": "acme-prod",
            "pod": f"llama2-7b-{i}",
            "container": "llm",
            "pod_uid": f"uid-{i}",
            "sla_tier": "gold",
            "gpu": "GPU-x",
            "profile": "llama2-7b-q4",
        }
        for i in range(6)
    ]
    scenario = parse_scenario({"node": "n", "seed": 1, "gpus": [gpu], "workloads": workloads})
    readings = SimBackend(scenario, epoch=EPOCH).read(now=EPOCH + timedelta(seconds=30))
    assert sum(r.mem_used_mb for r in readings) <= 8000
    assert sum(r.sm_used for r in readings) <= 10


def _series(profile: str, key: int, seconds: int) -> list[tuple[float, float, float]]:
    out = []
    for half_second in range(seconds * 2):
        u = profile_usage(profile, key=key, elapsed_s=half_second / 2)
        out.append((u.mem_mb, u.sm_fraction, u.pcie_mb_per_s))
    return out


def test_bert_base_holds_300_to_500_mb_and_5_to_10_percent_of_sms() -> None:
    for key in range(5):
        for mem, sm, _ in _series("bert-base", key, 120):
            assert 300 <= mem <= 500
            assert 0.05 <= sm <= 0.10


def test_resnet50_batch_4_holds_about_1180_mb_with_periodic_sm_load() -> None:
    series = _series("resnet50", 42, 120)
    assert all(1150 <= mem <= 1210 for mem, _, _ in series)
    sms = [sm for _, sm, _ in series]
    # Rises and falls with batches.
    assert min(sms) < 0.12
    assert max(sms) > 0.30


def test_llama_bursts_spike_sms_and_grow_then_release_the_kv_cache() -> None:
    series = _series("llama2-7b-q4", 5, 600)
    mems = [mem for mem, _, _ in series]
    sms = [sm for _, sm, _ in series]
    assert all(4000 <= mem <= 6144 for mem in mems)
    assert all(sm <= 0.80 for sm in sms)
    # Bursty: spikes and quiet spells.
    assert max(sms) >= 0.40
    assert min(sms) < 0.05
    assert max(mems) - min(mems) > 300  # KV cache grows with requests ...
    assert sum(mem < 4200 for mem in mems) > len(mems) // 10  # ... and is released after them


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["workloads"][0].update(gpu="GPU-nope"), r"workloads\[0\]\.gpu: unknown GPU"),
        (lambda d: d["workloads"][1].update(profile="gpt-5"), r"workloads\[1\]\.profile: unknown"),
        (lambda d: d["workloads"][0].update(sla_tier="platinum"), r"workloads\[0\]\.sla_tier: unknown"),
        (lambda d: d["workloads"][0].pop("pod_uid"), r"workloads\[0\]\.pod_uid: required"),
        (lambda d: d["workloads"][0].update(limit_mem_mb=10), r"limit_mem_mb: must be >= guarantee"),
        (lambda d: d["gpus"][0].update(memory_mb="80GB"), r"gpus\[0\]\.memory_mb: expected int"),
        (lambda d: d["gpus"].append(dict(d["gpus"][0])), r"gpus\[8\]\.uuid: duplicate GPU"),
        (lambda d: d.update(seed=-1), r"scenario\.seed: must be >= 0"),
    ],
)
def test_invalid_scenarios_are_refused_with_the_offending_path(mutate: object, message: str) -> None:
    doc = demo_scenario("gpu-node-01", seed=7, tenants=TENANTS)
    assert callable(mutate)
    mutate(doc)
    with pytest.raises(ValueError, match=message):
        parse_scenario(doc)


def test_an_evicted_pod_leaves_every_gpu_and_the_rest_keep_running() -> None:
    scenario = parse_scenario(demo_scenario("gpu-node-01", seed=4, gpu_count=2, tenants=TENANTS))
    backend = SimBackend(scenario, epoch=EPOCH)
    victim = scenario.workloads[0].workload
    before = backend.read(now=EPOCH + timedelta(seconds=5))
    assert backend.remove_pod(namespace=victim.namespace, pod=victim.pod) == 1
    after = backend.read(now=EPOCH + timedelta(seconds=5))
    assert victim.key not in {r.workload.key for r in after}
    assert len(after) == len(before) - 1
    assert backend.remove_pod(namespace=victim.namespace, pod=victim.pod) == 0
    assert backend.processes(victim) == ()
