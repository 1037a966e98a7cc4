"""Pool rebalancing: plans empty whole nodes only, with the fewest evictions for what they claim
(checked against every plan of small pools), never overcommit at any step, respect pins, models
and K; right-sizing, in GPUs and in whole nodes."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.rebalance import (
    EXACT_CANDIDATES,
    HOURS_PER_MONTH,
    DemandSeries,
    Move,
    Pool,
    PoolNode,
    PoolWorkload,
    RebalancePlan,
    apply_moves,
    gpu_cost,
    nearest_rank,
    parse_rebalance_input,
    plan_rebalance,
    right_size,
)
from allocator.rebalance.__main__ import main

EXAMPLE = Path(__file__).resolve().parents[2] / "allocator" / "rebalance" / "examples" / "demo_fleet.json"
A100 = "NVIDIA A100-SXM4-80GB"
PRICE = Decimal("5.12")


def _node(name: str, gpus: int = 2, model: str = A100, **host: int) -> PoolNode:
    return PoolNode(name=name, model=model, gpus=gpus, gpu_memory_mb=81920, **host)


def _w(key: str, node: str, gpu: int, mem: int, sm: int, **extra: Any) -> PoolWorkload:
    return PoolWorkload(key=key, node=node, gpus=(gpu,), memory_mb=mem, sm_milli=sm, **extra)


def _plan(pool: Pool, k: int = 10) -> RebalancePlan:
    return plan_rebalance(pool, max_moves=k, price_per_gpu_hour=PRICE)


# --- hand-made cases with a known best plan ----------------------------------------------------


def test_gpus_freed_on_a_node_that_stays_busy_are_not_claimed() -> None:
    """Two half-empty GPUs of one node would merge into one, but the node stays: nothing is handed
    back, so the plan evicts nobody and claims nothing."""
    pool = Pool.build([_node("n1")], [_w("a", "n1", 0, 30000, 400), _w("b", "n1", 1, 20000, 300)])
    plan = _plan(pool)
    assert plan.moves == ()
    assert (plan.gpus_released, plan.nodes_freed, plan.projected_savings) == (0, 0, Decimal(0))
    assert plan.smallest_release is None  # no other node to empty it onto


def test_emptying_a_node_hands_back_all_its_gpus_idle_ones_too() -> None:
    pool = Pool.build([_node("n1", 2), _node("n2", 4)], [_w("a", "n1", 0, 1000, 300), _w("b", "n2", 0, 900, 200)])
    plan = _plan(pool)
    # Either node could go with one eviction: the larger, n2, hands back 4 GPUs.
    assert plan.moves == (Move("b", "n2", 0, "n1", 0),)
    assert plan.freed_nodes == ("n2",)
    assert (plan.gpus_released, plan.gpus_freed, plan.evictions) == (4, 1, 1)
    assert plan.projected_savings == 4 * Decimal(730) * PRICE


def test_of_two_equal_nodes_the_one_with_fewer_pods_is_emptied() -> None:
    workloads = [_w("a1", "n1", 0, 100, 100), _w("a2", "n1", 1, 100, 100), _w("b", "n2", 0, 100, 100)]
    plan = _plan(Pool.build([_node("n1"), _node("n2")], workloads))
    assert [m.workload for m in plan.moves] == ["b"]
    assert plan.freed_nodes == ("n2",)


def test_a_node_that_needs_more_evictions_than_k_is_not_emptied_and_is_named() -> None:
    workloads = [_w("a1", "n1", 0, 100, 100), _w("a2", "n1", 1, 100, 100), _w("b", "n2", 0, 100, 100),
                 _w("c", "n2", 1, 100, 100)]
    pool = Pool.build([_node("n1"), _node("n2")], workloads)
    assert _plan(pool, k=1).moves == ()
    assert _plan(pool, k=1).smallest_release == ("n1", 2)
    two = _plan(pool, k=2)
    assert (two.freed_nodes, two.evictions) == (("n1",), 2)
    assert two.smallest_release is None


def test_a_node_with_a_pinned_or_multi_gpu_workload_is_never_emptied() -> None:
    nodes = [_node("n1", 4), _node("n2", 4), _node("n3", 4)]
    workloads = [
        _w("pinned", "n1", 0, 100, 100, movable=False),
        PoolWorkload(key="wide", node="n2", gpus=(1, 2), memory_mb=100, sm_milli=100),
        _w("free", "n3", 3, 100, 100),
    ]
    plan = _plan(Pool.build(nodes, workloads))
    assert plan.pinned_workloads == ("pinned", "wide")
    assert [m.workload for m in plan.moves] == ["free"]
    assert plan.freed_nodes == ("n3",)


def test_a_node_with_no_workload_is_reported_not_claimed() -> None:
    pool = Pool.build([_node("n1"), _node("idle")], [_w("a", "n1", 0, 100, 100)])
    plan = _plan(pool)
    assert plan.idle_nodes == ("idle",)
    assert (plan.moves, plan.gpus_released) == ((), 0)  # nothing to move it onto but an idle node


def test_model_constraint_keeps_a_workload_off_other_gpu_models() -> None:
    nodes = [_node("a100", 1), _node("t4", 1, model="T4")]
    workloads = [_w("x", "a100", 0, 100, 100, models=(A100,)), _w("y", "t4", 0, 100, 100)]
    plan = _plan(Pool.build(nodes, workloads))
    assert plan.moves == (Move("y", "t4", 0, "a100", 0),)  # x may not go to the T4, y may go anywhere


def test_host_capacity_of_the_target_node_is_respected() -> None:
    nodes = [_node("n1", 1, cpu_milli=4000), _node("n2", 1, cpu_milli=4000)]
    workloads = [_w("a", "n1", 0, 100, 100, cpu_milli=3000), _w("b", "n2", 0, 100, 100, cpu_milli=2000)]
    assert _plan(Pool.build(nodes, workloads)).moves == ()
    with pytest.raises(ValueError, match=r"move 1 \(b\): node 'n1' would use 5000 CPU milli of 4000"):
        apply_moves(Pool.build(nodes, workloads), [Move("b", "n2", 0, "n1", 0)])


def test_a_gpu_over_capacity_at_start_is_reported_and_never_given_load() -> None:
    workloads = [_w("a", "n1", 0, 50000, 700), _w("b", "n1", 0, 50000, 400), _w("c", "n2", 0, 10, 10)]
    plan = _plan(Pool.build([_node("n1", 1), _node("n2", 1)], workloads))
    assert plan.overcommitted_at_start == ("n1/0 memory", "n1/0 sm")
    assert plan.moves == ()  # c fits only on n1/0, which is over capacity already
    assert plan.smallest_release is None


def test_best_fit_that_fails_is_completed_by_searching() -> None:
    """Six pods of 500, 400, 300, 300, 300 and 200 MB leave for two GPUs of 1000 MB: best fit puts
    500 + 400 on one and then has no room for the 200; 500 + 300 + 200 and 400 + 300 + 300 fit."""
    nodes = [dataclasses.replace(_node("keep", 2), gpu_memory_mb=1000),
             dataclasses.replace(_node("go", 3), gpu_memory_mb=1000)]
    sizes = [(0, 500), (0, 400), (1, 300), (1, 300), (2, 300), (2, 200)]
    workloads = [_w("k0", "keep", 0, 0, 0), _w("k1", "keep", 1, 0, 0),
                 *(_w(f"g{i}", "go", gpu, mem, 0) for i, (gpu, mem) in enumerate(sizes))]
    plan = _plan(Pool.build(nodes, workloads))
    assert (plan.freed_nodes, plan.evictions, plan.gpus_released) == (("go",), 6, 3)


def test_apply_moves_names_the_first_bad_move() -> None:
    pool = Pool.build([_node("n1")], [_w("a", "n1", 0, 40000, 100), _w("b", "n1", 1, 30000, 100)])
    with pytest.raises(ValueError, match=r"move 1 \(b\): it runs on n1/1, not on n1/0"):
        apply_moves(pool, [Move("b", "n1", 0, "n1", 1)])
    with pytest.raises(ValueError, match=r"move 2 \(c\): unknown workload 'c'"):
        apply_moves(pool, [Move("b", "n1", 1, "n1", 0), Move("c", "n1", 1, "n1", 0)])
    with pytest.raises(ValueError, match=r"move 2 \(a\): workload 'a' is already on n1/0"):
        apply_moves(pool, [Move("b", "n1", 1, "n1", 0), Move("a", "n1", 0, "n1", 0)])
    crowded = Pool.build([_node("n1")], [*pool.workloads, _w("c", "n1", 1, 45000, 100)])
    with pytest.raises(ValueError, match=r"move 2 \(c\): n1/0 would hold 115000 MB of 81920 MB"):
        apply_moves(crowded, [Move("b", "n1", 1, "n1", 0), Move("c", "n1", 1, "n1", 0)])
    after = apply_moves(pool, [Move("a", "n1", 0, "n1", 1)])
    assert {w.key: w.gpus for w in after.workloads} == {"a": (1,), "b": (1,)}


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Pool.build([_node("n"), _node("n")], []), "node 'n' appears more than once"),
        (lambda: Pool.build([_node("n")], [_w("a", "m", 0, 1, 1)]), "workload 'a': unknown node 'm'"),
        (lambda: Pool.build([_node("n")], [_w("a", "n", 2, 1, 1)]), "node 'n' has 2 GPU\\(s\\), no GPU 2"),
        (lambda: Pool.build([_node("n")], [_w("a", "n", 0, 1, 1, models=("T4",))]), "allows only T4"),
        (lambda: _w("a", "n", 0, -1, 1), "memory_mb must be >= 0, got -1"),
        (lambda: _w("a", "n", 0, True, 1), "memory_mb must be an integer, got True"),
        (lambda: PoolNode(name="n", model=A100, gpus=1, gpu_memory_mb=0), "gpu_memory_mb must be >= 1"),
    ],
)
def test_invalid_pools_are_rejected_with_a_precise_message(build: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_plan_arguments_are_validated() -> None:
    pool = Pool.build([_node("n")], [])
    with pytest.raises(ValueError, match="max_moves must be an integer >= 0, got -1"):
        plan_rebalance(pool, max_moves=-1, price_per_gpu_hour=PRICE)
    with pytest.raises(ValueError, match="price_per_gpu_hour must be a finite Decimal"):
        plan_rebalance(pool, max_moves=1, price_per_gpu_hour=5.12)  # type: ignore[arg-type]  # a float on purpose


# --- properties -----------------------------------------------------------------------------------

MODELS = ("A", "B")


@st.composite
def pools(draw: st.DrawFn) -> Pool:
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        host = draw(st.booleans())
        nodes.append(
            PoolNode(
                name=f"n{i}",
                model=draw(st.sampled_from(MODELS)),
                gpus=draw(st.integers(1, 4)),
                gpu_memory_mb=1000,
                gpu_sm_milli=1000,
                cpu_milli=draw(st.integers(0, 8)) * 1000 if host else None,
                memory_mib=draw(st.integers(0, 8)) * 1000 if host else None,
            )
        )
    workloads = []
    for j in range(draw(st.integers(0, 12))):
        node = draw(st.sampled_from(nodes))
        wide = node.gpus > 1 and draw(st.integers(0, 9)) == 0
        gpus = (0, 1) if wide else (draw(st.integers(0, node.gpus - 1)),)
        models = draw(st.sampled_from([(), (node.model,), MODELS]))
        workloads.append(
            PoolWorkload(
                key=f"w{j}",
                node=node.name,
                gpus=gpus,
                memory_mb=draw(st.integers(0, 6)) * 100,
                sm_milli=draw(st.integers(0, 6)) * 100,
                cpu_milli=draw(st.integers(0, 3)) * 1000,
                memory_mib=draw(st.integers(0, 3)) * 1000,
                movable=draw(st.integers(0, 4)) > 0,
                models=models,
            )
        )
    return Pool.build(nodes, workloads)


@st.composite
def roomy_pools(draw: st.DrawFn) -> Pool:
    """Two or three nodes with room to spare, so that emptying one is often possible."""
    nodes = [PoolNode(name=f"n{i}", model=draw(st.sampled_from(MODELS)), gpus=draw(st.integers(1, 3)),
                      gpu_memory_mb=1000, gpu_sm_milli=1000,
                      cpu_milli=draw(st.sampled_from([None, 4000, 8000]))) for i in range(draw(st.integers(2, 3)))]
    workloads = []
    for j in range(draw(st.integers(1, 7))):
        node = draw(st.sampled_from(nodes))
        workloads.append(PoolWorkload(
            key=f"w{j}", node=node.name, gpus=(draw(st.integers(0, node.gpus - 1)),),
            memory_mb=draw(st.integers(0, 5)) * 100, sm_milli=draw(st.integers(0, 5)) * 100,
            cpu_milli=draw(st.integers(0, 2)) * 1000, movable=draw(st.integers(0, 9)) > 0,
            models=draw(st.sampled_from([(), (), (node.model,)]))))
    return Pool.build(nodes, workloads)


def _replay_independently(pool: Pool, plan: RebalancePlan) -> dict[str, tuple[str, int]]:
    """Replay with plain dicts (not the planner's state) and check every intermediate state."""
    nodes = {n.name: n for n in pool.nodes}
    spec = {w.key: w for w in pool.workloads}
    gpu_mem: dict[tuple[str, int], int] = {}
    gpu_sm: dict[tuple[str, int], int] = {}
    cpu = dict.fromkeys(nodes, 0)
    mib = dict.fromkeys(nodes, 0)
    where: dict[str, tuple[str, int]] = {}
    for w in pool.workloads:
        for g in w.gpus:
            gpu_mem[w.node, g] = gpu_mem.get((w.node, g), 0) + w.memory_mb
            gpu_sm[w.node, g] = gpu_sm.get((w.node, g), 0) + w.sm_milli
        cpu[w.node] += w.cpu_milli
        mib[w.node] += w.memory_mib
        where[w.key] = (w.node, w.gpus[0])
    for m in plan.moves:
        w = spec[m.workload]
        assert w.movable
        assert len(w.gpus) == 1
        assert where[w.key] == (m.from_node, m.from_gpu)
        target = nodes[m.to_node]
        assert 0 <= m.to_gpu < target.gpus
        assert not w.models or target.model in w.models
        src, dst = (m.from_node, m.from_gpu), (m.to_node, m.to_gpu)
        gpu_mem[src] -= w.memory_mb
        gpu_sm[src] -= w.sm_milli
        gpu_mem[dst] = gpu_mem.get(dst, 0) + w.memory_mb
        gpu_sm[dst] = gpu_sm.get(dst, 0) + w.sm_milli
        assert gpu_mem[dst] <= target.gpu_memory_mb
        assert gpu_sm[dst] <= target.gpu_sm_milli
        if m.from_node != m.to_node:
            cpu[m.from_node] -= w.cpu_milli
            mib[m.from_node] -= w.memory_mib
            cpu[m.to_node] += w.cpu_milli
            mib[m.to_node] += w.memory_mib
            assert target.cpu_milli is None or cpu[m.to_node] <= target.cpu_milli
            assert target.memory_mib is None or mib[m.to_node] <= target.memory_mib
        where[w.key] = dst
    return where


def _check_claims(pool: Pool, plan: RebalancePlan, k: int) -> None:
    """Replayed independently, the plan never overcommits; what it claims is exactly the nodes it
    empties: only their pods move, each once, onto nodes that were busy and stay so."""
    assert len(plan.moves) <= k
    where = _replay_independently(pool, plan)
    occupied = {(w.node, g) for w in pool.workloads for g in w.gpus if len(w.gpus) > 1} | set(where.values())
    busy_before = {(w.node, g) for w in pool.workloads for g in w.gpus}
    busy_nodes_before = {node for node, _ in busy_before}
    for ref in plan.freed_gpus:
        assert (ref.node, ref.gpu) in busy_before
        assert (ref.node, ref.gpu) not in occupied
    # (Busy GPUs may grow on a node that stays: its empty GPUs take pods; it is paid for anyway.)
    assert (plan.gpus_busy_before, plan.gpus_busy_after) == (len(busy_before), len(occupied))
    assert plan.nodes_busy_after == plan.nodes_busy_before - len(plan.freed_nodes)
    for node in plan.freed_nodes:
        assert node in busy_nodes_before
        assert node not in {n for n, _ in occupied}
    moved = [m.workload for m in plan.moves]
    assert len(moved) == len(set(moved))
    assert all(m.from_node in plan.freed_nodes for m in plan.moves)
    assert all(m.to_node in busy_nodes_before and m.to_node not in plan.freed_nodes for m in plan.moves)
    assert {w.key for w in pool.workloads if w.node in plan.freed_nodes} == set(moved)
    sizes = {n.name: n.gpus for n in pool.nodes}
    assert plan.gpus_released == sum(sizes[n] for n in plan.freed_nodes)
    assert plan.projected_savings == plan.gpus_released * HOURS_PER_MONTH * PRICE
    assert plan.nodes_freed == len(plan.freed_nodes)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=pools(), k=st.integers(0, 8))
def test_replaying_any_plan_never_overcommits_and_claims_only_the_nodes_it_empties(pool: Pool, k: int) -> None:
    _check_claims(pool, _plan(pool, k), k)


@st.composite
def large_pools(draw: st.DrawFn) -> Pool:
    """More candidate nodes than are tried exhaustively: the greedy choice."""
    nodes = [PoolNode(name=f"n{i:02d}", model="A", gpus=draw(st.integers(1, 2)), gpu_memory_mb=1000,
                      gpu_sm_milli=1000) for i in range(draw(st.integers(EXACT_CANDIDATES + 1, 18)))]
    workloads: list[PoolWorkload] = []
    for node in nodes:
        for g in range(node.gpus):
            for _ in range(draw(st.integers(1, 2))):
                workloads.append(PoolWorkload(key=f"w{len(workloads)}", node=node.name, gpus=(g,),
                                              memory_mb=draw(st.integers(0, 4)) * 100,
                                              sm_milli=draw(st.integers(0, 4)) * 100))
    return Pool.build(nodes, workloads)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=large_pools(), k=st.integers(4, 12))
def test_the_greedy_choice_of_many_nodes_claims_only_what_it_empties(pool: Pool, k: int) -> None:
    plan = _plan(pool, k)
    assert not plan.exhaustive
    _check_claims(pool, plan, k)
    assert plan.freed_nodes or plan.smallest_release is None or plan.smallest_release[1] > k or not _fits(
        pool, {plan.smallest_release[0]})


def _fits(pool: Pool, leaving: set[str]) -> bool:
    """Whether every workload of ``leaving`` fits, by some assignment, on the GPUs of the nodes
    that were busy and stay (plain dicts and an exhaustive search, not the planner's code)."""
    nodes = {n.name: n for n in pool.nodes}
    busy = {w.node for w in pool.workloads}
    mem: dict[tuple[str, int], int] = {}
    sm: dict[tuple[str, int], int] = {}
    cpu = dict.fromkeys(nodes, 0)
    mib = dict.fromkeys(nodes, 0)
    for w in pool.workloads:
        for g in w.gpus:
            mem[w.node, g] = mem.get((w.node, g), 0) + w.memory_mb
            sm[w.node, g] = sm.get((w.node, g), 0) + w.sm_milli
        cpu[w.node] += w.cpu_milli
        mib[w.node] += w.memory_mib
    targets = [(n, g) for n in sorted(busy - leaving) for g in range(nodes[n].gpus)]
    moving = [w for w in pool.workloads if w.node in leaving]

    def place(i: int) -> bool:
        if i == len(moving):
            return True
        w = moving[i]
        for ref in targets:
            node = nodes[ref[0]]
            if w.models and node.model not in w.models:
                continue
            if mem.get(ref, 0) + w.memory_mb > node.gpu_memory_mb or sm.get(ref, 0) + w.sm_milli > node.gpu_sm_milli:
                continue
            if node.cpu_milli is not None and cpu[ref[0]] + w.cpu_milli > node.cpu_milli:
                continue
            if node.memory_mib is not None and mib[ref[0]] + w.memory_mib > node.memory_mib:
                continue
            mem[ref] = mem.get(ref, 0) + w.memory_mb
            sm[ref] = sm.get(ref, 0) + w.sm_milli
            cpu[ref[0]] += w.cpu_milli
            mib[ref[0]] += w.memory_mib
            if place(i + 1):
                return True
            mem[ref] -= w.memory_mb
            sm[ref] -= w.sm_milli
            cpu[ref[0]] -= w.cpu_milli
            mib[ref[0]] -= w.memory_mib
        return False

    return place(0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=st.one_of(pools(), roomy_pools()), k=st.integers(0, 8))
def test_no_plan_of_a_small_pool_frees_more_or_evicts_fewer_for_as_much(pool: Pool, k: int) -> None:
    """Every set of nodes whose pods may all move, with at most K pods, that fits elsewhere: none
    hands back more GPUs than the plan, and none that hands back as many evicts fewer pods."""
    plan = _plan(pool, k)
    assert plan.exhaustive
    sizes = {n.name: n.gpus for n in pool.nodes}
    movable = {n.name for n in pool.nodes} - {w.node for w in pool.workloads if not w.can_move}
    candidates = sorted(movable & {w.node for w in pool.workloads})
    pods = {n: sum(1 for w in pool.workloads if w.node == n) for n in candidates}
    feasible = [(sum(sizes[n] for n in s), sum(pods[n] for n in s))
                for r in range(1, len(candidates) + 1) for s in itertools.combinations(candidates, r)
                if sum(pods[n] for n in s) <= k and _fits(pool, set(s))]
    best = max((released for released, _ in feasible), default=0)
    assert plan.gpus_released == best
    if best:
        assert plan.evictions == min(evictions for released, evictions in feasible if released >= best)


# --- right-sizing --------------------------------------------------------------------------------


def test_nearest_rank_percentiles_ignore_rare_spikes() -> None:
    assert nearest_rank(list(range(1, 101)), 95) == 95
    assert nearest_rank([10] * 99 + [1000], 99) == 10
    assert nearest_rank([10] * 98 + [1000, 1000], 99) == 1000


def test_right_sizing_a_constant_series_gives_the_exact_ceiling() -> None:
    series = [DemandSeries(key=f"w{i}", memory_mb=(30000,) * 5, sm_milli=(200,) * 5) for i in range(10)]
    sizing = right_size(series, gpu_memory_mb=81920, current_gpus=10, price_per_gpu_hour=PRICE)
    for e in sizing.estimates:
        assert (e.total_memory_mb, e.total_sm_milli) == (300000, 2000)
        assert e.lower_bound_gpus == 4  # ceil(300000 / 81920)
        assert e.ffd_gpus == 5  # two 30000 MB workloads per 81920 MB card
        assert e.gpus_needed == 5
        assert e.monthly_cost_difference == 5 * Decimal(730) * PRICE
    assert [e.percentile for e in sizing.estimates] == [95, 99]


def test_right_sizing_uses_the_sm_bound_when_sm_binds() -> None:
    series = [DemandSeries(key=f"w{i}", memory_mb=(100,), sm_milli=(250,)) for i in range(8)]
    (p95,) = right_size(
        series, gpu_memory_mb=81920, current_gpus=1, price_per_gpu_hour=PRICE, percentiles=(95,)
    ).estimates
    assert (p95.lower_bound_gpus, p95.ffd_gpus, p95.gpus_saved) == (2, 2, -1)
    assert p95.monthly_cost_difference == -Decimal(730) * PRICE  # the pool is too small: a cost


def test_savings_and_right_sizing_price_gpu_counts_by_one_rule_over_one_horizon() -> None:
    # One pool of 4 GPUs, four workloads on their own GPU, half a GPU of SM each at every step.
    pool = Pool.build([_node("a", gpus=2), _node("b", gpus=2)],
                      [PoolWorkload(key=f"w{i}", node="ab"[i // 2], gpus=(i % 2,), memory_mb=100, sm_milli=500)
                       for i in range(4)])
    series = [DemandSeries(key=f"w{i}", memory_mb=(100,) * 4, sm_milli=(500,) * 4) for i in range(4)]
    week = Decimal(168)
    plan = plan_rebalance(pool, max_moves=4, price_per_gpu_hour=PRICE, hours=week)
    sizing = right_size(series, gpu_memory_mb=81920, current_gpus=pool.total_gpus, price_per_gpu_hour=PRICE,
                        hours=week)
    assert plan.gpus_freed == 2
    assert plan.projected_savings == gpu_cost(2, price_per_gpu_hour=PRICE, hours=week)
    for e in sizing.estimates:
        # The moves reach exactly what right-sizing needs: the same count prices the same.
        assert e.gpus_needed == plan.gpus_busy_after == 2
        assert e.monthly_cost_difference == plan.projected_savings == 2 * week * PRICE
    assert sizing.hours_per_month == week
    assert gpu_cost(-3, price_per_gpu_hour=PRICE) == -3 * HOURS_PER_MONTH * PRICE  # a short pool: a cost
    with pytest.raises(ValueError, match="hours must be a finite Decimal >= 0"):
        right_size(series, gpu_memory_mb=81920, current_gpus=4, price_per_gpu_hour=PRICE, hours=Decimal(-1))


def test_the_cli_right_sizes_over_the_inputs_hours_as_it_plans(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    doc = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    doc["hours"] = 24
    day = tmp_path / "day.json"
    day.write_text(json.dumps(doc), encoding="utf-8")
    assert main(["--input", str(day), "--max-moves", "24", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["projected_savings"]["amount"] == "983.04"  # one node of 8 GPUs x 24 h x 5.12
    assert out["right_sizing"]["hours_per_month"] == "24"
    for e in out["right_sizing"]["estimates"]:
        assert Decimal(e["monthly_cost_difference"]) == (24 - e["gpus_needed"]) * 24 * PRICE
        # 9 or 10 GPUs fit on two of the three 8-GPU nodes: one node handed back.
        assert (e["whole_node_gpus"], e["whole_node_gpus_released"]) == (16, 8)
        assert e["whole_node_monthly_difference"] == "983.04"


def test_right_sizing_rejects_a_workload_larger_than_one_gpu() -> None:
    with pytest.raises(ValueError, match="workload 'big' needs 90000 MB / 1 SM milli at this percentile"):
        right_size(
            [DemandSeries(key="big", memory_mb=(90000,), sm_milli=(1,))],
            gpu_memory_mb=81920,
            current_gpus=1,
            price_per_gpu_hour=PRICE,
        )


# --- the JSON format and the CLI -------------------------------------------------------------------


def _doc(**workload: object) -> dict[str, object]:
    base: dict[str, object] = {"key": "a", "node": "n", "gpus": [0], "memory_mb": 10.2, "sm_milli": 5}
    base.update(workload)
    return {"nodes": [{"name": "n", "model": A100, "gpus": 1, "gpu_memory_mb": 81920}], "workloads": [base]}


def test_json_input_rounds_fractional_demand_up() -> None:
    parsed = parse_rebalance_input(_doc())
    assert parsed.pool.workloads[0].memory_mb == 11
    assert (parsed.price_per_gpu_hour, parsed.hours, parsed.currency) == (Decimal("5.12"), Decimal(730), "USD")


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_doc(moveable=False), r"workloads\[0\]: unknown key\(s\) moveable"),
        (_doc(movable="no"), r"workloads\[0\].movable: expected true or false"),
        (_doc(memory_mb=-1), r"workloads\[0\].memory_mb: expected a finite number >= 0"),
        (_doc(node="m"), "input: workload 'a': unknown node 'm'"),
        ({"schema": "other", "nodes": [], "workloads": []}, "input.schema: expected"),
    ],
)
def test_json_input_errors_name_the_path(doc: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rebalance_input(doc)


def test_demo_fleet_plan_empties_one_node_with_eight_evictions(capsys: pytest.CaptureFixture[str]) -> None:
    """24 pods on 24 cards of 3 nodes: at their peaks no two nodes hold them all, so one node (8
    GPUs) can be handed back, by moving its 8 pods; the pinned Llama keeps sim-a100-1."""
    assert main(["--input", str(EXAMPLE), "--max-moves", "24", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "vgpu-ledger/rebalance-plan/v1"
    assert out["dry_run"] is True
    assert (out["nodes_freed"], out["gpus_released"], out["evictions"]) == (1, 8, 8)
    assert out["freed_nodes"] == ["sim-a100-2"]
    assert {m["from_node"] for m in out["moves"]} == {"sim-a100-2"}
    assert out["projected_savings"] == {
        "amount": "29900.80",
        "currency": "USD",
        "hours": "730",
        "price_per_gpu_hour": "5.12",
    }
    assert "chatapp/llama2-7b-4wpl7" in out["pinned_workloads"]
    assert [e["percentile"] for e in out["right_sizing"]["estimates"]] == [95, 99]


@pytest.mark.parametrize(("k", "freed", "smallest"), [(7, (), ("sim-a100-2", 8)), (8, ("sim-a100-2",), None),
                                                     (24, ("sim-a100-2",), None)])
def test_demo_fleet_under_a_smaller_k_frees_a_node_or_nothing(k: int, freed: tuple[str, ...],
                                                              smallest: tuple[str, int] | None) -> None:
    pool = parse_rebalance_input(json.loads(EXAMPLE.read_text(encoding="utf-8"))).pool
    plan = _plan(pool, k)
    assert (plan.freed_nodes, plan.smallest_release) == (freed, smallest)
    assert plan.evictions == (8 if freed else 0)


def test_cli_module_prints_valid_json_and_text() -> None:
    command = [sys.executable, "-m", "allocator.rebalance", "--input", str(EXAMPLE), "--max-moves", "5"]
    done = subprocess.run([*command, "--json"], capture_output=True, text=True, check=True, timeout=60)
    assert len(json.loads(done.stdout)["moves"]) <= 5
    text = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout
    assert text.startswith("Rebalance plan (dry run):")
    assert "Projected savings:" in text


def test_cli_reports_a_bad_file_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "pool.json"
    bad.write_text("{", encoding="utf-8")
    assert main(["--input", str(bad), "--max-moves", "3"]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_a_workloads_own_percentile_is_over_the_steps_it_ran_and_an_ended_one_is_not_packed() -> None:
    # 100 steps: "late" ran the last 4 only, at 60000 MB; counted as 0 before it started, its P95
    # would be 0 and the pool would need no GPU for it. "ended" ran the first 96 at 70000 MB.
    late = DemandSeries(key="late", memory_mb=(0,) * 96 + (60000,) * 4, sm_milli=(0,) * 96 + (100,) * 4,
                        ran=(False,) * 96 + (True,) * 4)
    ended = DemandSeries(key="ended", memory_mb=(70000,) * 96 + (0,) * 4, sm_milli=(100,) * 96 + (0,) * 4,
                         ran=(True,) * 96 + (False,) * 4, packed=False)
    sizing = right_size([late, ended], gpu_memory_mb=81920, current_gpus=4, price_per_gpu_hour=PRICE)
    for e in sizing.estimates:
        assert e.ffd_gpus == 1  # late at its own P95, 60000 MB; ended is not packed
        assert e.total_memory_mb == 70000  # the minutes ended ran are the fleet's demand too
        assert e.gpus_needed == 1
    assert sizing.workloads == 1
    assert late.own_percentile(95) == (60000, 100)
    with pytest.raises(ValueError, match="ran has 2 steps"):
        DemandSeries(key="x", memory_mb=(1,), sm_milli=(1,), ran=(True, True))
