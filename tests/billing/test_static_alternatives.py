"""Static alternatives placed on the fleet (pure): MIG profiles as NVIDIA sizes them, and, on random
fleets, placements that never exceed a card, keep to the cards the fleet had while it had them,
and are called infeasible exactly when some slice needed a card the fleet lacked."""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.services.savings.static_alternatives import (
    ALTERNATIVES,
    FleetCard,
    Placement,
    WorkloadSlice,
    choose_baseline,
    choose_profile,
    mig_geometry,
    place,
    profile_name,
    slice_share,
)

A100 = "NVIDIA A100-SXM4-80GB"
L4 = "NVIDIA L4"  # no MIG
CAPACITY = {A100: (81920, 108), L4: (23034, 58)}
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _at(minute: int) -> datetime:
    return T0 + timedelta(minutes=minute)


@pytest.mark.parametrize(("mem_mb", "sm", "name"), [
    (0, 0, "1g.10gb"), (10240, 15, "1g.10gb"), (10241, 15, "1g.20gb"), (10240, 16, "2g.20gb"),
    (20480, 30, "2g.20gb"), (20481, 1, "3g.40gb"), (30000, 47, "4g.40gb"), (40960, 46, "3g.40gb"),
    (40961, 1, "7g.80gb"), (100, 93, "7g.80gb"), (81920, 108, "7g.80gb"),
])
def test_a100_80gb_profiles_are_the_smallest_that_hold_the_need(mem_mb, sm, name):
    geometry = mig_geometry(A100)
    profile = choose_profile(geometry, mem_mb=Decimal(mem_mb), sm=Decimal(sm), memory_mb=81920, sm_count=108)
    assert profile_name(geometry, profile, model=A100, memory_mb=81920) == name


@pytest.mark.parametrize(("model", "memory_mb", "names"), [
    ("NVIDIA A100-SXM4-40GB", 40960, ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
    ("NVIDIA H100 80GB HBM3", 81559, ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("NVIDIA H100 NVL", 95830, ["1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"]),
    ("NVIDIA A30", 24576, ["1g.6gb", "2g.12gb", "4g.24gb"]),
])
def test_each_mig_model_has_nvidias_profile_sizes(model, memory_mb, names):
    geometry = mig_geometry(model)
    assert [profile_name(geometry, p, model=model, memory_mb=memory_mb) for p in geometry.profiles] == names


def test_a_model_without_mig_gives_the_whole_card():
    s = WorkloadSlice(("t", "ns", "p", "c", "u", "g"), L4, 23034, 58, T0, _at(1), Decimal(1), Decimal(1))
    assert slice_share("fixed_profile", s) == (Decimal(1), "")


def test_two_3g_and_a_4g_with_a_3g_fill_a_card_but_a_third_3g_does_not():
    """NVIDIA's placements: 3g.40gb starts at memory slice 0 or 4, 4g.40gb at 0 only."""
    card = FleetCard(1, "n", "g", A100, 81920, 108, T0, _at(10))
    three = [WorkloadSlice(("t", "ns", f"p{i}", "c", f"u{i}", "g"), A100, 81920, 108, T0, _at(10), Decimal(30000),
                           Decimal(40)) for i in range(3)]
    placement = place("fixed_profile", [card], three)
    assert set(placement.profiles.values()) == {"3g.40gb"}
    assert placement.shortfall is not None
    assert (placement.shortfall.needed, placement.shortfall.had) == (2, 1)
    four_and_three = [three[0], WorkloadSlice(("t", "ns", "big", "c", "ub", "g"), A100, 81920, 108, T0, _at(10),
                                              Decimal(1000), Decimal(60))]
    placement = place("fixed_profile", [card], four_and_three)
    assert placement.feasible
    assert sorted(placement.profiles.values()) == ["3g.40gb", "4g.40gb"]


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[FleetCard], list[WorkloadSlice]]:
    cards = []
    for i in range(draw(st.integers(1, 4))):
        model = draw(st.sampled_from([A100, A100, L4]))
        start = draw(st.integers(0, 4))
        cards.append(FleetCard(1 + i // 2, f"node-{i // 2}", f"GPU-{i}", model, *CAPACITY[model], _at(start),
                               _at(draw(st.integers(start + 1, 12)))))
    slices = []
    for j in range(draw(st.integers(0, 9))):
        home = draw(st.sampled_from(cards))
        memory_mb, sm_count = CAPACITY[home.model]
        start = draw(st.integers(int((home.start - T0).total_seconds() // 60),
                                 int((home.end - T0).total_seconds() // 60) - 1))
        end = draw(st.integers(start + 1, int((home.end - T0).total_seconds() // 60)))
        workload = f"w{draw(st.integers(0, 5))}" if draw(st.booleans()) else f"solo{j}"
        slices.append(WorkloadSlice(("t", "ns", workload, "c", workload, f"GPU-{j}"), home.model, memory_mb, sm_count,
                                    _at(start), _at(end), Decimal(draw(st.integers(0, memory_mb))),
                                    Decimal(draw(st.integers(0, sm_count)))))
    # A workload on several GPUs runs on them together: its slices share its first slice's span.
    first: dict[tuple[str, ...], WorkloadSlice] = {}
    for s in slices:
        first.setdefault(s.workload, s)
    return cards, [dataclasses.replace(s, start=first[s.workload].start, end=first[s.workload].end) for s in slices]


def _holding(alternative: str, s: WorkloadSlice) -> tuple[Decimal, Decimal, int, int]:
    """What a slice holds of a card: memory, SMs, MIG compute slices and memory slices."""
    geometry = mig_geometry(s.model)
    mem_mb, sm = s.held
    profile = choose_profile(geometry, mem_mb=mem_mb, sm=sm, memory_mb=s.memory_mb, sm_count=s.sm_count)
    return mem_mb, sm, profile.compute, profile.memory


def _check(alternative: str, cards: list[FleetCard], slices: list[WorkloadSlice], placement: Placement) -> None:
    by_key = {s.key: s for s in slices}
    spec = {(c.node_id, c.uuid): c for c in cards}
    # Every slice is somewhere for its whole span, once, without gaps.
    stretches: dict[tuple[str, ...], list[tuple[datetime, datetime]]] = defaultdict(list)
    for a in placement.assignments:
        stretches[a.key].append((a.since, a.until))
    for s in slices:
        spans = sorted(stretches[s.key])
        assert spans[0][0] == s.start, (s.key, spans)
        assert spans[-1][1] == s.end, (s.key, spans)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), spans
    instants = sorted({a.since for a in placement.assignments})
    lacked = [a for a in placement.assignments if not a.uuid]
    assert placement.feasible == (not lacked)
    for at in instants:
        here = [a for a in placement.assignments if a.since <= at < a.until]
        on_card: dict[tuple[int, str], list] = defaultdict(list)
        for a in here:
            if a.uuid:
                card = spec[(a.node_id, a.uuid)]
                assert card.start <= at < card.end, "a slice on a card the fleet did not have then"
                assert card.model == by_key[a.key].model
                on_card[(a.node_id, a.uuid)].append(a)
        for ref, held in on_card.items():
            card = spec[ref]
            workloads = [by_key[a.key].workload for a in held]
            assert len(workloads) == len(set(workloads)), "one workload's GPUs share a card"
            if alternative == "whole_card":
                assert len(held) == 1
            elif alternative == "request_fraction":
                assert sum(_holding(alternative, by_key[a.key])[0] for a in held) <= card.memory_mb
                assert sum(_holding(alternative, by_key[a.key])[1] for a in held) <= card.sm_count
            else:
                geometry = mig_geometry(card.model)
                assert sum(_holding(alternative, by_key[a.key])[2] for a in held) <= geometry.compute
                slots: set[int] = set()
                for a in held:
                    size = _holding(alternative, by_key[a.key])[3]
                    taken = set(range(a.first_slot, a.first_slot + size))
                    assert not taken & slots
                    assert max(taken) < geometry.memory
                    slots |= taken
        # A card the fleet lacked is used only when every fleet card of that model was busy.
        for a in here:
            if not a.uuid:
                model = by_key[a.key].model
                live = [(c.node_id, c.uuid) for c in cards if c.model == model and c.start <= at < c.end]
                assert all(on_card.get(ref) for ref in live), (at, model)
    # A fleet card is occupied exactly while it holds a slice.
    busy: dict[tuple[int, str], set[datetime]] = defaultdict(set)
    for a in placement.assignments:
        if a.uuid:
            minute = a.since
            while minute < a.until:
                busy[(a.node_id, a.uuid)].add(minute)
                minute += timedelta(minutes=1)
    occupied: dict[tuple[int, str], set[datetime]] = defaultdict(set)
    for node_id, uuid, since, until in placement.occupied:
        minute = since
        while minute < until:
            assert minute not in occupied[(node_id, uuid)], "two occupied stretches overlap"
            occupied[(node_id, uuid)].add(minute)
            minute += timedelta(minutes=1)
    assert {k: v for k, v in busy.items() if v} == {k: v for k, v in occupied.items() if v}


@settings(max_examples=150, deadline=None)
@given(fleets(), st.sampled_from(ALTERNATIVES))
def test_placements_never_exceed_a_card_and_are_infeasible_only_when_cards_were_lacking(fleet, alternative):
    cards, slices = fleet
    placement = place(alternative, cards, slices)
    _check(alternative, cards, slices, placement)
    # Every slice's share of its card is in [0, 1].
    assert all(0 <= share <= 1 for share in placement.shares.values())
    if alternative == "whole_card":
        assert set(placement.shares.values()) <= {Decimal(1)}


@settings(max_examples=60, deadline=None)
@given(fleets())
def test_whole_cards_need_a_card_per_workload_gpu_at_once(fleet):
    cards, slices = fleet
    placement = place("whole_card", cards, slices)
    instants = {s.start for s in slices}
    most = max((sum(1 for s in slices if s.start <= at < s.end) for at in instants), default=0)
    assert placement.peak_cards == most


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({a: st.none() | st.integers(0, 50).map(Decimal) for a in ALTERNATIVES}))
def test_the_headline_baseline_is_the_cheapest_feasible_alternative(costs):
    baseline = choose_baseline(costs)
    feasible = {a: c for a, c in costs.items() if c is not None}
    if not feasible:
        assert baseline is None
        return
    assert baseline is not None
    assert costs[baseline] == min(feasible.values())
    # Equal costs: the first in the order whole cards, request fractions, fixed profiles.
    assert baseline == next(a for a in ALTERNATIVES if costs[a] == min(feasible.values()))
