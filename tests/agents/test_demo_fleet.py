"""The demo's fleet: pods drawn one per card (so every static alternative fits), then packed by
their predicted reservations with the rebalance planner, never beyond a card."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.backends._profiles import PEAKS, PROFILES, profile_usage
from agents.backends.sim import SimBackend, demo_fleet, demo_scenario, parse_scenario, predicted_reservation
from allocator.rebalance import SM_MILLI

EPOCH = datetime(2026, 11, 30, tzinfo=UTC)
NODES = ["sim-a100-1", "sim-a100-2", "sim-a100-3"]
TENANTS = [("acme", "gold"), ("globex", "silver"), ("initech", "bronze"), ("xinghe", "silver")]


def _by_card(fleet: dict[str, dict[str, object]]) -> dict[str, list[dict[str, object]]]:
    cards: dict[str, list[dict[str, object]]] = defaultdict(list)
    for doc in fleet.values():
        for w in doc["workloads"]:  # type: ignore[attr-defined]
            cards[w["gpu"]].append(w)
    return cards


def test_the_demo_fleet_packs_one_pod_per_card_onto_fewer_cards_within_their_reservations() -> None:
    fleet = demo_fleet(NODES, tenants=TENANTS)
    assert list(fleet) == NODES
    drawn = [demo_scenario(node, seed=seed, tenants=TENANTS, pods_per_gpu=(1, 1)) for seed, node in enumerate(NODES, 1)]
    # The same pods as a scheduler of whole cards placed, one per card: whole cards fit on the fleet.
    assert sorted(w["pod_uid"] for d in fleet.values() for w in d["workloads"]) == sorted(
        w["pod_uid"] for d in drawn for w in d["workloads"])
    assert sum(len(d["workloads"]) for d in drawn) == sum(len(d["gpus"]) for d in drawn) == 24
    for node, doc in fleet.items():
        scenario = parse_scenario(doc)  # each node's document is a valid scenario of its own cards
        assert scenario.node == node
        assert {g.uuid for g in scenario.gpus} == {g["uuid"] for g in next(d for d in drawn if d["node"] == node)["gpus"]}
    cards = _by_card(fleet)
    for pods in cards.values():
        reserved = [predicted_reservation(str(w["profile"])) for w in pods]
        assert sum(m for m, _ in reserved) <= 81920
        assert sum(s for _, s in reserved) <= SM_MILLI
    # Packed: several pods share a card and most cards are left empty (the saving).
    assert len(cards) <= 12
    assert demo_fleet(NODES, tenants=TENANTS) == fleet  # deterministic


def test_a_reservation_is_its_profile_peak_rounded_up() -> None:
    assert set(PEAKS) == set(PROFILES)
    assert predicted_reservation("bert-base") == (500, 100)
    assert predicted_reservation("resnet50") == (1200, 450)
    assert predicted_reservation("llama2-7b-q4") == (6144, 800)


@settings(max_examples=200, deadline=None)
@given(profile=st.sampled_from(sorted(PROFILES)), key=st.integers(min_value=0, max_value=2**63),
       elapsed_s=st.floats(min_value=0, max_value=1e6))
def test_use_never_exceeds_its_profile_peak(profile: str, key: int, elapsed_s: float) -> None:
    """What makes the reservation safe at every tier's miss target: the peak bounds use."""
    use = profile_usage(profile, key=key, elapsed_s=elapsed_s)
    assert use.mem_mb <= PEAKS[profile].mem_mb
    assert use.sm_fraction <= PEAKS[profile].sm_fraction


@settings(max_examples=10, deadline=None)
@given(suffix=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=6),
       elapsed_s=st.floats(min_value=0, max_value=1e6))
def test_no_card_of_a_demo_fleet_is_ever_scaled_down(suffix: str, elapsed_s: float) -> None:
    """Packed cards still hold what their pods use, at any instant: the sim never time-slices them."""
    fleet = demo_fleet([f"node-{suffix}-{i}" for i in range(2)], tenants=TENANTS, gpu_count=4)
    for doc in fleet.values():
        scenario = parse_scenario(doc)
        now = EPOCH + timedelta(seconds=elapsed_s)
        for r in SimBackend(scenario, epoch=EPOCH).read(now=now):
            w = next(s for s in scenario.workloads if s.workload == r.workload)
            alone = profile_usage(w.profile, key=w.key, elapsed_s=(now - EPOCH).total_seconds())
            assert r.sm_used == pytest.approx(alone.sm_fraction * 108, rel=1e-12)
            assert r.mem_used_mb == pytest.approx(alone.mem_mb, rel=1e-12)
