"""``agent-default`` in the replay: the agent's own policy object fed every pod's per-second use.

The usage model knows each pod's use second by second (a class profile scaled by the pod's
share, driven by a burst signal read from the pod's own start second, docs/replay.md §Usage
model). Each replay step is one block of the policy (:class:`allocator.policy.MarginPolicy`):
for every pod active in the step the replay builds its 60 per-second readings and hands them to
``observe_block`` at once, exactly as the agent hands it readings tick by tick. Every shard of a
pod uses the same, so the policy runs once per pod.

Per row (pod, step) the replay keeps what placement and fair share need (the reservation in
force at the step's first second, the step's largest reservation) and the step's outcome: seconds
above the reservation, the amount short, SM-seconds served and MB-seconds reserved. A pod's very
first second has no reservation from the policy (its first reading admits it): it counts against
the admission prior, the class's profile peak scaled to the request, times the prior margin.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from allocator.policy import RESOURCES, MarginConfig, MarginPolicy, block_reservations
from allocator.replay._usage import BurstSignals, Driver, PodUsage, UsageModel
from allocator.risk import MissTarget

__all__ = ["AgentRows", "admission_prior", "agent_rows", "capped_outcomes", "row_outcomes", "row_reservations", "row_use"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
_BLOCKS = 32  # blocks per pod and call while many pods are left
_BLOCKS_FEW, _FEW = 64, 64  # ... and once at most _FEW are
_CALL_BLOCKS = 40_000  # pod-blocks per call: bounds the per-second arrays' memory, never the results


@dataclass(frozen=True, slots=True)
class AgentRows:
    """The policy's decisions and outcome per row of a ``PodUsage`` (per GPU shard; resources last)."""

    first: FloatArray  # (rows, 2): in force at the row's first second (a pod's first row: the prior)
    peak: FloatArray  # (rows, 2): the row's largest reservation
    factor: FloatArray  # (rows, 2): 1 + margin for the row's other seconds
    missed: FloatArray  # (rows, 3): seconds of the row's burst window above the reservation: memory, SM, either
    short: FloatArray  # (rows, 2): Σ (use − reservation) over those seconds, MB-s and SM-s
    served_sm: FloatArray  # (rows,): Σ min(use, reservation) SM-seconds over the window
    reserved_mem: FloatArray  # (rows,): Σ reservation MB-seconds over the window


def _coefficients(usage: PodUsage, model: UsageModel) -> tuple[FloatArray, FloatArray, IntArray]:
    """Per pod and resource: base, burst (in MB and SMs, scaled by the share) and which signal drives it."""
    drivers = {"requests": 0, "tokens": 1, "none": 2}
    classes = model.classes
    base = np.array([[c.mem_base_mb, c.sm_base * model.card_sm_count] for c in classes])[usage.class_index]
    burst = np.array([[c.mem_burst_mb, c.sm_burst * model.card_sm_count] for c in classes])[usage.class_index]
    driver = np.array([[drivers[c.mem_driver], drivers[c.sm_driver]] for c in classes], dtype=np.int64)
    return base * usage.share[:, None], burst * usage.share[:, None], driver[usage.class_index]


def row_use(usage: PodUsage, model: UsageModel, signals: BurstSignals, rows: IntArray) -> FloatArray:
    """Per-second use of ``rows``, (n, 2, step_s): memory MB and SMs, as the usage model defines it."""
    base, burst, driver = _coefficients(usage, model)
    return _use(usage, _windows(signals, usage.step_s), base, burst, driver, rows)


def _windows(signals: BurstSignals, step_s: int) -> FloatArray:
    """(driver, window start, second of the window): each signal's ``step_s`` seconds from every start."""
    index = (np.arange(signals.length_s)[:, None] + np.arange(step_s)[None, :]) % signals.length_s
    drivers: tuple[Driver, ...] = ("requests", "tokens", "none")
    result: FloatArray = np.stack([signals.per_second(d)[index] for d in drivers])
    return result


def _use(  # noqa: PLR0917 - a private helper whose callers pass the loop's precomputed arrays
    usage: PodUsage, windows: FloatArray, base: FloatArray, burst: FloatArray, driver: IntArray, rows: IntArray
) -> FloatArray:
    pod = np.searchsorted(usage.offset, rows, side="right") - 1
    use: FloatArray = windows[driver[pod], usage.window[rows][:, None]]  # (n, 2, step): one window per resource
    use *= burst[pod][:, :, None]
    use += base[pod][:, :, None]
    return use


def admission_prior(usage: PodUsage, model: UsageModel, margin: MarginConfig) -> FloatArray:
    """Per pod, (memory, SM): the class's profile peak scaled to the request, × (1 + prior margin), capped at the request."""
    classes = model.classes
    peak = np.array([[c.mem_base_mb + c.mem_burst_mb, (c.sm_base + c.sm_burst) * model.card_sm_count] for c in classes])
    cap = _request(usage, model)
    result: FloatArray = np.minimum(cap, peak[usage.class_index] * usage.share[:, None] * (1.0 + margin.prior_margin))
    return result


def _request(usage: PodUsage, model: UsageModel) -> FloatArray:
    result: FloatArray = usage.share[:, None] * np.array([model.card_memory_mb, float(model.card_sm_count)])[None, :]
    return result


def row_outcomes(use: FloatArray, reserved: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Per row (use and reserved (n, 2, step_s)): seconds missed (memory, SM, either), amounts short,
    SM-seconds served, MB-seconds reserved."""
    over = use > reserved
    missed = np.concatenate([over.sum(axis=2), over.any(axis=1).sum(axis=1)[:, None]], axis=1).astype(np.float64)
    short = np.where(over, use - reserved, 0.0).sum(axis=2)
    served = np.minimum(use[:, 1], reserved[:, 1]).sum(axis=1)
    return missed, short, served, reserved[:, 0].sum(axis=1)


def agent_rows(
    usage: PodUsage, model: UsageModel, signals: BurstSignals, *, margin: MarginConfig, target: MissTarget
) -> AgentRows:
    """Drive one ``MarginPolicy`` over every pod's per-second use, many blocks per call.

    Pods do not interact in the policy (fair share comes after, on the cards), so every pod is
    fed at once regardless of when it ran, ``observe_blocks`` taking in each pod's blocks up to
    its next miss; the rounds needed are about the longest pod's blocks / ``_BLOCKS`` plus its
    blocks with a miss.
    """
    if margin.block_s != usage.step_s:
        raise ValueError(f"the policy's block ({margin.block_s} s) must be the replay's step ({usage.step_s} s)")
    n, resources = usage.rows, len(RESOURCES)
    first, peak, factor = np.empty((n, resources)), np.empty((n, resources)), np.empty((n, resources))
    missed, short = np.empty((n, 3)), np.empty((n, resources))
    served, reserved_mem = np.empty(n), np.empty(n)
    base, burst, driver = _coefficients(usage, model)
    windows = _windows(signals, usage.step_s)
    cap = _request(usage, model)
    prior = admission_prior(usage, model, margin)
    decays = margin.decays(target)
    policy = MarginPolicy(margin, capacity=len(usage.pods))
    slot = np.array([policy.admit(second=int(s) * usage.step_s, decays=decays) for s in usage.first_step], dtype=np.int64)
    done = np.zeros(len(usage.pods), dtype=np.int64)  # blocks fed per pod
    while True:
        left = usage.steps - done
        active = np.flatnonzero(left > 0)
        if not active.size:
            break
        # Few pods left (the long ones): longer calls, fewer rounds; many: bounded memory.
        k = int(min(_BLOCKS_FEW if active.size <= _FEW else _BLOCKS, left[active].max()))
        for chunk in np.array_split(active, max(1, -(-active.size * k // _CALL_BLOCKS))):
            each = np.arange(k)[None, :]
            local = np.minimum(done[chunk, None] + each, usage.steps[chunk, None] - 1)
            rows = (usage.offset[chunk, None] + local).reshape(-1)
            use = _use(usage, windows, base, burst, driver, rows).reshape(chunk.size, k, resources, usage.step_s)
            outcome = policy.observe_blocks(slot[chunk], use, cap[chunk], valid=left[chunk])
            taken = each < outcome.consumed[:, None]
            res = outcome.reservations[taken]
            got = rows.reshape(chunk.size, k)[taken]
            fresh = np.isnan(res[:, 0, 0])  # a pod's first second: the admission prior
            res[fresh, :, 0] = prior[chunk[np.nonzero(taken)[0][fresh]]]
            first[got], peak[got], factor[got] = res[:, :, 0], res.max(axis=2), outcome.factors[taken]
            missed[got], short[got], served[got], reserved_mem[got] = row_outcomes(use[taken], res)
            done[chunk] += outcome.consumed
    return AgentRows(
        first=first, peak=peak, factor=factor, missed=missed, short=short, served_sm=served, reserved_mem=reserved_mem
    )


def row_reservations(
    usage: PodUsage, model: UsageModel, signals: BurstSignals, agent: AgentRows, rows: IntArray, *, window_blocks: int
) -> tuple[FloatArray, FloatArray]:
    """Per-second use and the reservations in force of ``rows``, each (n, 2, step_s), from the policy's per-row state.

    A row's reservations read the ``window_blocks`` rows before it too; each distinct row's use is
    built once (the rows asked for are often runs of one pod, and a pod's shards share their rows).
    """
    pod = np.searchsorted(usage.offset, rows, side="right") - 1
    before = rows[:, None] - np.arange(window_blocks, 0, -1)[None, :]  # oldest first
    has = before >= usage.offset[pod][:, None]
    needed, inverse = np.unique(np.concatenate([rows, before[has]]), return_inverse=True)
    built = row_use(usage, model, signals, needed)
    use = built[inverse[: rows.size]]
    previous = np.full((rows.size, window_blocks, *use.shape[1:]), np.nan)
    previous[has] = built[inverse[rows.size :]]
    reserved = block_reservations(
        previous, use[:, None], agent.first[rows], agent.factor[rows][:, None], _request(usage, model)[pod]
    )[:, 0]
    return use, reserved


def capped_outcomes(  # noqa: PLR0917 - the replay's fair-share step passes its arrays in order
    usage: PodUsage,
    model: UsageModel,
    signals: BurstSignals,
    agent: AgentRows,
    rows: IntArray,
    grant: FloatArray,
    *,
    window_blocks: int,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """``row_outcomes`` of ``rows`` whose reservations fair share cut to ``grant`` (n, 2) on a contended card."""
    parts = []
    for at in range(0, rows.size, _CALL_BLOCKS):  # bounded per-second arrays, as in agent_rows
        use, reserved = row_reservations(usage, model, signals, agent, rows[at : at + _CALL_BLOCKS], window_blocks=window_blocks)
        parts.append(row_outcomes(use, np.minimum(reserved, grant[at : at + _CALL_BLOCKS, :, None])))
    missed, short, served, reserved_mem = (np.concatenate([p[i] for p in parts]) for i in range(4))
    return missed, short, served, reserved_mem
