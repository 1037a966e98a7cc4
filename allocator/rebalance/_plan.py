"""Plan at most K moves that free the most whole GPUs, then whole nodes (docs/rebalance.md).

Greedy, deterministic:

1. **GPU drains.** Busy GPUs whose workloads can all move are drain candidates, fewest
   workloads first (most GPUs per move), then on the least-loaded node, then least-loaded GPU.
   A candidate is drained only if every one of its workloads fits, one after another, on other
   busy GPUs (never on an empty one: that would free nothing) within the moves left; each goes
   to the tightest fit. A GPU that received workloads is never drained afterwards, so no
   workload is moved twice by this step.
2. **Node drains.** Nodes still in use, fewest busy GPUs first, are emptied onto other nodes in
   use when all their workloads fit within the moves left and the number of busy GPUs does not
   grow (empty GPUs of nodes in use may be taken here: one GPU given up for one freed).
3. Repeat 1–2 until neither accepts anything; then collapse a workload's moves into one
   (first source → last target). K counts each workload once; if the collapsed plan is not
   valid at every step, the plan is built again counting every move, so K is a hard cap.

Each move is checked against the loads at its step (``PoolState.refusal``), and the finished
plan is replayed from the start pool by ``apply_moves`` before it is returned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from allocator.rebalance._model import GpuRef, Move, Pool, PoolWorkload
from allocator.rebalance._state import PoolState

__all__ = ["HOURS_PER_MONTH", "RebalancePlan", "apply_moves", "gpu_cost", "plan_rebalance"]

HOURS_PER_MONTH = Decimal(730)  # 365 days × 24 h / 12, the usual cloud-billing month


def gpu_cost(gpus: int, *, price_per_gpu_hour: Decimal, hours: Decimal = HOURS_PER_MONTH) -> Decimal:
    """What ``gpus`` GPUs cost over ``hours`` at ``price_per_gpu_hour``, exact (negative for a
    negative count). The one money rule of this package: a plan's ``projected_savings`` and
    right-sizing's ``monthly_cost_difference`` are both this, of a GPU count against the same
    pool, so one rate and one horizon give numbers that can be read side by side."""
    return gpus * hours * price_per_gpu_hour


@dataclass(frozen=True, slots=True)
class RebalancePlan:
    """Ordered moves and what they free.

    ``freed_gpus`` / ``freed_nodes`` were busy before and are empty after the plan;
    ``gpus_freed`` / ``nodes_freed`` are the net drops in busy GPUs / nodes (a node drain may
    occupy an empty GPU elsewhere). ``projected_savings = gpus_freed × hours ×
    price_per_gpu_hour``, in the price's currency, exact (round once where it is shown).
    """

    moves: tuple[Move, ...]
    max_moves: int
    freed_gpus: tuple[GpuRef, ...]
    freed_nodes: tuple[str, ...]
    gpus_busy_before: int
    gpus_busy_after: int
    nodes_busy_before: int
    nodes_busy_after: int
    pinned_workloads: tuple[str, ...]
    overcommitted_at_start: tuple[str, ...]
    price_per_gpu_hour: Decimal
    hours: Decimal
    projected_savings: Decimal

    @property
    def gpus_freed(self) -> int:
        return self.gpus_busy_before - self.gpus_busy_after

    @property
    def nodes_freed(self) -> int:
        return self.nodes_busy_before - self.nodes_busy_after


def apply_moves(pool: Pool, moves: Iterable[Move]) -> Pool:
    """Replay ``moves`` in order from ``pool`` and return the pool after them.

    Raises ``ValueError`` naming the first move (1-based) that does not start where its
    workload runs at that step, targets a missing GPU, breaks a model constraint, moves a
    pinned workload, or would put any GPU or node over capacity.
    """
    state = PoolState(pool)
    for number, move in enumerate(moves, start=1):
        if not isinstance(move, Move):
            raise ValueError(f"move {number}: expected a Move, got {type(move).__name__}")
        current = state.where.get(move.workload)
        if current is not None and current != move.source:
            raise ValueError(f"move {number} ({move.workload}): it runs on {current}, not on {move.source}")
        try:
            state.move(move.workload, move.target)
        except ValueError as error:
            raise ValueError(f"move {number} ({move.workload}): {error}") from None
    placed: list[PoolWorkload] = []
    for w in pool.workloads:
        ref = state.where.get(w.key)
        if ref is not None and (ref.node, (ref.gpu,)) != (w.node, w.gpus):
            placed.append(dataclasses.replace(w, node=ref.node, gpus=(ref.gpu,)))
        else:
            placed.append(w)
    return Pool(nodes=pool.nodes, workloads=tuple(placed))


def plan_rebalance(
    pool: Pool,
    *,
    max_moves: int,
    price_per_gpu_hour: Decimal,
    hours: Decimal = HOURS_PER_MONTH,
) -> RebalancePlan:
    """The plan of at most ``max_moves`` moves (see the module docstring for the algorithm)."""
    if not isinstance(pool, Pool):
        raise ValueError(f"pool must be a Pool, got {type(pool).__name__}")
    if isinstance(max_moves, bool) or not isinstance(max_moves, int) or max_moves < 0:
        raise ValueError(f"max_moves must be an integer >= 0, got {max_moves!r}")
    for name, value in (("price_per_gpu_hour", price_per_gpu_hour), ("hours", hours)):
        if not isinstance(value, Decimal) or not value.is_finite() or value < 0:
            raise ValueError(f"{name} must be a finite Decimal >= 0, got {value!r}")

    start = PoolState(pool)
    busy_before = start.busy_gpus()
    nodes_before = {n for n in start.nodes if start.node_busy(n)}
    overcommitted = tuple(start.overcommitted())
    # First count a workload's moves once (they collapse into one); if collapsing turns out to
    # be invalid for this pool, plan again counting every move, so K is a hard cap either way.
    plan_moves = _collapse(pool, _greedy(pool, max_moves, count_once=True))
    if len(plan_moves) > max_moves:
        plan_moves = _collapse(pool, _greedy(pool, max_moves, count_once=False))
    final = PoolState(apply_moves(pool, plan_moves))  # the plan is valid from the start pool
    busy_after = final.busy_gpus()
    nodes_after = {n for n in final.nodes if final.node_busy(n)}
    gpus_freed = len(busy_before) - len(busy_after)
    return RebalancePlan(
        moves=tuple(plan_moves),
        max_moves=max_moves,
        freed_gpus=tuple(sorted(busy_before - busy_after)),
        freed_nodes=tuple(sorted(nodes_before - nodes_after)),
        gpus_busy_before=len(busy_before),
        gpus_busy_after=len(busy_after),
        nodes_busy_before=len(nodes_before),
        nodes_busy_after=len(nodes_after),
        pinned_workloads=tuple(sorted(w.key for w in pool.workloads if not w.can_move)),
        overcommitted_at_start=overcommitted,
        price_per_gpu_hour=price_per_gpu_hour,
        hours=hours,
        projected_savings=gpu_cost(gpus_freed, price_per_gpu_hour=price_per_gpu_hour, hours=hours),
    )


def _greedy(pool: Pool, max_moves: int, *, count_once: bool) -> list[Move]:
    state = PoolState(pool)
    budget = _Budget(max_moves, count_once=count_once)
    receivers: set[GpuRef] = set()
    progress = True
    while progress:
        progress = False
        while _drain_one_gpu(state, budget, receivers):
            progress = True
        while _drain_one_node(state, budget):
            progress = True
    return budget.moves


class _Budget:
    """The moves so far and what another batch of moves would cost against K."""

    def __init__(self, max_moves: int, *, count_once: bool) -> None:
        self.max_moves = max_moves
        self.count_once = count_once  # a workload already moved costs nothing more
        self.moves: list[Move] = []
        self._moved: set[str] = set()

    def affords(self, keys: Sequence[str]) -> bool:
        if self.count_once:
            return len(self._moved) + sum(1 for k in keys if k not in self._moved) <= self.max_moves
        return len(self.moves) + len(keys) <= self.max_moves

    def add(self, moves: Sequence[Move]) -> None:
        self.moves.extend(moves)
        self._moved.update(m.workload for m in moves)


def _all_movable(state: PoolState, keys: Iterable[str]) -> bool:
    return all(state.workloads[k].can_move for k in keys)


def _size(state: PoolState, key: str) -> float:
    """A workload's larger share of one GPU where it runs (memory or SM), for ordering."""
    w = state.workloads[key]
    node = state.nodes[state.where[key].node]
    return max(w.memory_mb / node.gpu_memory_mb, w.sm_milli / node.gpu_sm_milli)


def _slack_after(state: PoolState, key: str, target: GpuRef) -> float:
    w = state.workloads[key]
    node = state.nodes[target.node]
    return 2.0 - state.gpu_load(target) - w.memory_mb / node.gpu_memory_mb - w.sm_milli / node.gpu_sm_milli


def _evacuate(
    state: PoolState,
    keys: Iterable[str],
    allowed: Callable[[GpuRef], bool],
    score: Callable[[str, GpuRef], tuple[float, ...]],
) -> list[Move] | None:
    """Move every workload in ``keys`` (largest first) to its best allowed target, or none."""
    done: list[Move] = []
    for key in sorted(keys, key=lambda k: (-_size(state, k), k)):
        best: tuple[tuple[float, ...], GpuRef] | None = None
        for target in state.gpus():
            if not allowed(target) or state.refusal(key, target) is not None:
                continue
            ranked = score(key, target)
            if best is None or (ranked, target) < best:
                best = (ranked, target)
        if best is None:
            for move in reversed(done):
                state.undo(move)
            return None
        done.append(state.move(key, best[1]))
    return done


def _busy_elsewhere(state: PoolState, drained: GpuRef) -> Callable[[GpuRef], bool]:
    return lambda target: target != drained and state.busy(target)


def _on_other_node_in_use(state: PoolState, drained: str) -> Callable[[GpuRef], bool]:
    return lambda target: target.node != drained and state.node_busy(target.node)


def _drain_one_gpu(state: PoolState, budget: _Budget, receivers: set[GpuRef]) -> bool:
    """Empty the first candidate GPU that can be emptied within the moves left.

    The order is recomputed after every drain (node loads change), which on a 142-node,
    1136-GPU fleet takes seconds and saves ~15 % of the moves of a single ordered pass.
    """
    candidates = [
        ref
        for ref in state.gpus()
        if state.busy(ref) and ref not in receivers and _all_movable(state, state.members[ref])
    ]
    candidates.sort(key=lambda r: (len(state.members[r]), state.node_load(r.node), state.gpu_load(r), r))

    def score(key: str, target: GpuRef) -> tuple[float, ...]:
        return (_slack_after(state, key, target), -state.node_load(target.node))

    for ref in candidates:
        keys = sorted(state.members[ref])
        if not budget.affords(keys):
            continue
        done = _evacuate(state, keys, _busy_elsewhere(state, ref), score)
        if done is not None:
            budget.add(done)
            receivers.update(m.target for m in done)
            return True
    return False


def _drain_one_node(state: PoolState, budget: _Budget) -> bool:
    """Empty the first node in use that can be emptied onto other nodes in use."""
    in_use = [n for n in sorted(state.nodes) if state.node_busy(n)]
    if len(in_use) < 2:
        return False

    def keys_on(node: str) -> list[str]:
        return sorted(k for g in range(state.nodes[node].gpus) for k in state.members[GpuRef(node, g)])

    def score(key: str, target: GpuRef) -> tuple[float, ...]:
        if state.busy(target):
            return (0.0, _slack_after(state, key, target), -state.node_load(target.node))
        return (1.0, -state.node_load(target.node), 0.0)

    in_use.sort(key=lambda n: (state.busy_count[n], state.node_load(n), n))
    for node in in_use:
        keys = keys_on(node)
        if not budget.affords(keys) or not _all_movable(state, keys):
            continue
        busy_before = sum(state.busy_count.values())
        done = _evacuate(state, keys, _on_other_node_in_use(state, node), score)
        if done is None:
            continue
        if sum(state.busy_count.values()) > busy_before:
            for move in reversed(done):
                state.undo(move)
            continue
        budget.add(done)
        return True
    return False


def _collapse(pool: Pool, moves: Sequence[Move]) -> list[Move]:
    """One move per workload (first source → last target, at its last move's place).

    Kept only when replaying the shorter plan is still valid at every step: a workload that
    stays longer on its first GPU and node may hold room a later move needed.
    """
    first: dict[str, GpuRef] = {}
    last: dict[str, int] = {}
    for index, move in enumerate(moves):
        first.setdefault(move.workload, move.source)
        last[move.workload] = index
    if len(last) == len(moves):
        return list(moves)
    shorter: list[Move] = []
    for index, move in enumerate(moves):
        if last[move.workload] != index:
            continue
        source = first[move.workload]
        if source == move.target:
            continue
        shorter.append(dataclasses.replace(move, from_node=source.node, from_gpu=source.gpu))
    try:
        apply_moves(pool, shorter)
    except ValueError:
        return list(moves)
    return shorter
