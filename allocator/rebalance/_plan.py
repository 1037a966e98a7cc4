"""Plan at most K workload moves that empty whole nodes, the only capacity a fleet can hand back
(docs/rebalance.md): cloud instances and servers are paid for whole, so a GPU freed on a node that
stays busy saves nothing. The plan frees the nodes worth the most GPUs and, for those, evicts the
fewest pods: it moves only the workloads of the nodes it empties, each once, straight onto the GPUs
of nodes that stay busy (never onto a node with no workload, which would then be paid for again).

Which nodes: every set of candidate nodes (busy nodes whose workloads may all move, at most K of
them) is tried, largest saving first and, for an equal saving, fewest evictions first (then the
least load to move, then by name), when there are at most EXACT_CANDIDATES candidates; beyond
that, nodes are added one by one, fewest evictions per GPU first, each one's pods placed on top of
the moves already chosen while the moves stay within K (greedy; a node that received a pod is not
emptied afterwards). Whether a set fits: best-fit decreasing onto the GPUs of the nodes that stay
busy, then, for up to EXACT_FIT_WORKLOADS workloads, a bounded exhaustive search when best fit
fails.

Moves only add load to GPUs that stay and only remove it from nodes that empty, so a plan whose end
state fits never overcommits at any step; it is replayed from the start pool by ``apply_moves``
before it is returned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from allocator.rebalance._model import GpuRef, Move, Pool, PoolWorkload
from allocator.rebalance._state import PoolState

__all__ = ["EXACT_CANDIDATES", "HOURS_PER_MONTH", "RebalancePlan", "apply_moves", "gpu_cost", "plan_rebalance"]

HOURS_PER_MONTH = Decimal(730)  # 365 days × 24 h / 12, the usual cloud-billing month
EXACT_CANDIDATES = 12  # up to this many candidate nodes, every set of them is tried
EXACT_FIT_WORKLOADS = 10  # best fit failed: an exhaustive search for up to this many workloads
_EXACT_FIT_STEPS = 20_000  # ... that gives up (the set is taken not to fit) after this many tries


def gpu_cost(gpus: int, *, price_per_gpu_hour: Decimal, hours: Decimal = HOURS_PER_MONTH) -> Decimal:
    """What ``gpus`` GPUs cost over ``hours`` at ``price_per_gpu_hour``, exact (negative for a
    negative count). The one money rule of this package: a plan's ``projected_savings`` and
    right-sizing's ``monthly_cost_difference`` are both this, of a GPU count against the same
    pool, so one rate and one horizon give numbers that can be read side by side."""
    return gpus * hours * price_per_gpu_hour


@dataclass(frozen=True, slots=True)
class RebalancePlan:
    """Ordered moves and what they free.

    ``freed_nodes`` were busy before and are empty after the plan: handing them back returns
    ``gpus_released`` GPUs (all of theirs, idle ones too), and ``projected_savings = gpus_released
    × hours × price_per_gpu_hour``, exact (round once where it is shown). ``freed_gpus`` /
    ``gpus_freed`` are the GPUs that were busy and are empty after (those of the freed nodes, less
    any GPU of a node that stays that the moves start using): capacity, not money. ``evictions``
    is the number of moves, one pod each. ``idle_nodes`` had no workload to begin with: no move is
    needed to hand them back, and the plan does not count them. When the plan frees no node,
    ``smallest_release`` is the node that could be emptied with the fewest evictions were K no
    limit (and how many), or None when no node's workloads fit on the others.
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
    gpus_released: int
    idle_nodes: tuple[str, ...]
    smallest_release: tuple[str, int] | None
    exhaustive: bool  # every set of candidate nodes was tried

    @property
    def gpus_freed(self) -> int:
        return self.gpus_busy_before - self.gpus_busy_after

    @property
    def nodes_freed(self) -> int:
        return self.nodes_busy_before - self.nodes_busy_after

    @property
    def evictions(self) -> int:
        return len(self.moves)


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
    """The plan of at most ``max_moves`` moves (see the module docstring for the rule)."""
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
    candidates = _candidates(start)
    exhaustive = len([n for n in candidates if _evictions(start, n) <= max_moves]) <= EXACT_CANDIDATES
    chosen, plan_moves = (_every_set if exhaustive else _greedy)(pool, candidates, max_moves)
    smallest = None if chosen else _smallest_release(pool, candidates)
    final = PoolState(apply_moves(pool, plan_moves))  # the plan is valid from the start pool
    busy_after = final.busy_gpus()
    nodes_after = {n for n in final.nodes if final.node_busy(n)}
    freed_nodes = tuple(sorted(nodes_before - nodes_after))
    released = sum(start.nodes[n].gpus for n in freed_nodes)
    return RebalancePlan(
        moves=tuple(plan_moves),
        max_moves=max_moves,
        freed_gpus=tuple(sorted(busy_before - busy_after)),
        freed_nodes=freed_nodes,
        gpus_busy_before=len(busy_before),
        gpus_busy_after=len(busy_after),
        nodes_busy_before=len(nodes_before),
        nodes_busy_after=len(nodes_after),
        pinned_workloads=tuple(sorted(w.key for w in pool.workloads if not w.can_move)),
        overcommitted_at_start=tuple(start.overcommitted()),
        price_per_gpu_hour=price_per_gpu_hour,
        hours=hours,
        projected_savings=gpu_cost(released, price_per_gpu_hour=price_per_gpu_hour, hours=hours),
        gpus_released=released,
        idle_nodes=tuple(sorted(n for n in start.nodes if not start.node_busy(n))),
        smallest_release=smallest,
        exhaustive=exhaustive,
    )


def _keys_on(state: PoolState, node: str) -> list[str]:
    return sorted({k for g in range(state.nodes[node].gpus) for k in state.members[GpuRef(node, g)]})


def _evictions(state: PoolState, node: str) -> int:
    return len(_keys_on(state, node))


def _candidates(state: PoolState) -> list[str]:
    """Busy nodes whose every workload may move: the nodes a plan could empty."""
    return [n for n in sorted(state.nodes) if state.node_busy(n)
            and all(state.workloads[k].can_move for k in _keys_on(state, n))]


def _order(state: PoolState, nodes: Sequence[str]) -> tuple[int, int, float, tuple[str, ...]]:
    """A set's rank: the most GPUs handed back, then the fewest evictions, then the least load to
    move (the most room left where it goes), then by name."""
    return (-sum(state.nodes[n].gpus for n in nodes), sum(_evictions(state, n) for n in nodes),
            sum(state.node_load(n) for n in nodes), tuple(nodes))


def _every_set(pool: Pool, candidates: Sequence[str], max_moves: int) -> tuple[tuple[str, ...], list[Move]]:
    """The best set of candidates that fits within K, trying every set (at most EXACT_CANDIDATES
    candidates), best first; a set containing one that did not fit is not tried."""
    state = PoolState(pool)
    within = [n for n in candidates if _evictions(state, n) <= max_moves]
    index = {n: i for i, n in enumerate(within)}
    sets = []
    for mask in range(1, 1 << len(within)):
        nodes = tuple(n for i, n in enumerate(within) if mask >> i & 1)
        if sum(_evictions(state, n) for n in nodes) <= max_moves:
            sets.append((_order(state, nodes), mask, nodes))
    failed: list[int] = []
    for _, mask, nodes in sorted(sets):
        if any(mask & f == f for f in failed):
            continue
        moves = _empty(state, nodes)
        if moves is not None:
            return nodes, moves
        failed.append(sum(1 << index[n] for n in nodes))
    return (), []


def _greedy(pool: Pool, candidates: Sequence[str], max_moves: int) -> tuple[tuple[str, ...], list[Move]]:
    """Add nodes one by one, fewest evictions per GPU first, while the moves stay within K and the
    node's pods fit on the nodes that stay, placed on top of the moves already chosen. A node that
    received a pod is not emptied afterwards, so no pod moves twice."""
    state = PoolState(pool)
    busy_at_start = {n for n in state.nodes if state.node_busy(n)}
    order = sorted(candidates, key=lambda n: (_evictions(state, n) / state.nodes[n].gpus, _evictions(state, n),
                                              state.node_load(n), n))
    leaving: set[str] = set()
    receivers: set[str] = set()
    moves: list[Move] = []
    for node in order:
        keys = _keys_on(state, node)
        if node in receivers or len(moves) + len(keys) > max_moves:
            continue
        done = _fit(state, keys, [ref for ref in state.gpus() if ref.node in busy_at_start
                                  and ref.node not in leaving and ref.node != node])
        if done is not None:
            moves.extend(done)
            leaving.add(node)
            receivers.update(m.to_node for m in done)
    return tuple(sorted(leaving)), moves


def _smallest_release(pool: Pool, candidates: Sequence[str]) -> tuple[str, int] | None:
    """The node that could be emptied with the fewest evictions, were K no limit."""
    state = PoolState(pool)
    for node in sorted(candidates, key=lambda n: (_evictions(state, n), -state.nodes[n].gpus, n)):
        evictions = _evictions(state, node)  # before the moves that empty it
        if _empty(state, (node,)) is not None:
            return node, evictions
    return None


def _size(state: PoolState, key: str) -> float:
    """A workload's larger share of one GPU where it runs (memory or SM), for ordering."""
    w = state.workloads[key]
    node = state.nodes[state.where[key].node]
    return max(w.memory_mb / node.gpu_memory_mb, w.sm_milli / node.gpu_sm_milli)


def _slack_after(state: PoolState, key: str, target: GpuRef) -> float:
    w = state.workloads[key]
    node = state.nodes[target.node]
    return 2.0 - state.gpu_load(target) - w.memory_mb / node.gpu_memory_mb - w.sm_milli / node.gpu_sm_milli


def _empty(state: PoolState, nodes: Sequence[str]) -> list[Move] | None:
    """Moves that put every workload of ``nodes`` on GPUs of the nodes that stay busy, applied to
    ``state``, or None with ``state`` as it was (so one state serves every set tried)."""
    leaving = set(nodes)
    staying = [ref for ref in state.gpus() if ref.node not in leaving and state.node_busy(ref.node)]
    return _fit(state, [k for n in nodes for k in _keys_on(state, n)], staying)


def _fit(state: PoolState, keys: Sequence[str], targets: Sequence[GpuRef]) -> list[Move] | None:
    """Best fit of ``keys``, largest first, onto ``targets``; when that fails, for up to
    EXACT_FIT_WORKLOADS workloads, a bounded search. None (the state as it was) when neither fits."""
    keys = sorted(keys, key=lambda k: (-_size(state, k), k))
    targets = _with_room(state, keys, targets)
    moves = _best_fit(state, keys, targets)
    if moves is None and len(keys) <= EXACT_FIT_WORKLOADS:
        moves = _search(state, keys, targets, [_EXACT_FIT_STEPS])
    return moves


def _with_room(state: PoolState, keys: Sequence[str], targets: Sequence[GpuRef]) -> list[GpuRef]:
    """The targets with room for the least memory and the least SM among ``keys``: no other could
    take any of them, since a fit only adds load to its targets. Checking only these keeps a plan
    on a pool of thousands of packed GPUs from weighing every workload against every GPU."""
    if not keys:
        return list(targets)
    memory = min(state.workloads[k].memory_mb for k in keys)
    sm = min(state.workloads[k].sm_milli for k in keys)
    room: list[GpuRef] = []
    for ref in targets:
        node = state.nodes[ref.node]
        if state.gpu_memory_mb[ref] + memory <= node.gpu_memory_mb and state.gpu_sm_milli[ref] + sm <= node.gpu_sm_milli:
            room.append(ref)
    return room


def _best_fit(state: PoolState, keys: Sequence[str], targets: Sequence[GpuRef]) -> list[Move] | None:
    """Each workload, largest first, onto the tightest target that takes it (busy GPUs before
    empty ones, then the fuller node); None, with the state as it was, when one fits nowhere."""
    done: list[Move] = []
    for key in keys:
        best: tuple[tuple[float, ...], GpuRef] | None = None
        for target in targets:
            if state.refusal(key, target) is not None:
                continue
            ranked = (0.0 if state.busy(target) else 1.0, _slack_after(state, key, target),
                      -state.node_load(target.node))
            if best is None or (ranked, target) < best:
                best = (ranked, target)
        if best is None:
            for move in reversed(done):
                state.undo(move)
            return None
        done.append(state.move(key, best[1]))
    return done


def _search(state: PoolState, keys: Sequence[str], targets: Sequence[GpuRef], budget: list[int]) -> list[Move] | None:
    """Every placement of ``keys`` on ``targets``, depth first, until one fits or ``budget`` (tries
    left, shared) runs out; GPUs of one node with the same load are tried once."""
    if not keys:
        return []
    key, rest = keys[0], keys[1:]
    seen: set[tuple[str, int, int]] = set()
    for target in targets:
        shape = (target.node, state.gpu_memory_mb[target], state.gpu_sm_milli[target])
        if shape in seen or state.refusal(key, target) is not None:
            continue
        seen.add(shape)
        budget[0] -= 1
        if budget[0] < 0:
            return None
        move = state.move(key, target)
        after = _search(state, rest, targets, budget)
        if after is not None:
            return [move, *after]
        state.undo(move)
    return None
