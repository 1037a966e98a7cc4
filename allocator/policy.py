"""The node's allocation policy: each workload's reservation from its own recent use (docs/prediction.md).

One object, two callers. The agent feeds it every tick (:meth:`MarginPolicy.observe`, a reading
per workload); the replay feeds it a whole block of per-second use for every active workload at
once (:meth:`MarginPolicy.observe_blocks`). Both run the same arithmetic, so a workload fed the
same seconds gets the same reservations (tests hold them to that); the per-tick path does it in
plain Python per workload, the block path in arrays over workloads and seconds.

The rule, per workload and resource (memory, SMs), in the workload's own seconds:

- the reservation decided after reading second ``s`` is ``min(cap, peak × factor)``, where
  ``peak`` is the largest use read over the last ``window_blocks × block_s`` seconds (``s``
  included: the peak window) and
  ``factor = 1 + margin``; it is in force until the next reading and is checked against the
  use of second ``s + 1`` (a reading tells what was used since the one before it);
- a **miss** is a second whose use exceeds the reservation in force for it;
- the margin is relative to the workload's own level (a factor on its peak, never absolute
  SMs or MB) and is calibrated per workload and resource toward its tier's miss target
  (``allocator.risk``): it is held on a level in integer steps, constant within a block of
  ``block_s`` seconds counted from the workload's first reading; when a block closes, each
  missed second in it (at most ``max_misses_per_block``) raises ``ln(factor)`` by ``step`` and
  the block lowers it by ``step × block_s × target``. At equilibrium a workload misses
  ``target`` of its seconds: a bursty workload climbs to a wide margin, a calm one sinks to a
  narrow one. A new workload starts at ``prior_margin`` (conservative) and narrows only as
  seconds without a miss accrue.

Levels are integers and the factor of a level is computed by one formula
(:meth:`MarginConfig.factor`), so the per-tick path and the block path cannot drift apart in
floating point.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from allocator.risk import MissTarget

__all__ = ["DEFAULT_MARGIN_CONFIG", "RESOURCES", "BlockOutcome", "MarginConfig", "MarginPolicy", "block_reservations"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

RESOURCES = ("memory", "sm")  # the last axis of every (workload, resource) array, in this order
_MAX = sys.float_info.max  # 0 <= x <= _MAX: finite and >= 0 in one comparison
_LEVELS_PER_STEP = 1_000_000  # integer levels per ``step`` of ln(factor): fine enough for any target
_NEVER = -(2**62)  # the second of a ring position never read: outside every window


@dataclass(frozen=True, slots=True)
class MarginConfig:
    """The knobs of the rule; the defaults are the shipped ones (docs/prediction.md argues them)."""

    block_s: int = 60  # calibration block, seconds of the workload's readings
    # The peak window, in blocks: a reservation covers the largest use of the last 3 minutes, so a
    # workload whose requests pause for a minute or two is not caught by its next burst (the Azure
    # code trace has such pauses; docs/replay.md, the frontier).
    window_blocks: int = 3
    prior_margin: float = 1.5  # margin of a new workload: peak x 2.5
    min_margin: float = 0.05  # the narrowest a calm workload gets
    max_margin: float = 3.0  # the widest a bursty one gets (peak x 4)
    step: float = 0.5  # rise of ln(1 + margin) per missed second
    # A block full of misses moves the margin by this many steps at most; at the block's length every
    # miss counts, so the equilibrium is the target (fewer: a burst counts less and misses more).
    max_misses_per_block: int = 60

    def __post_init__(self) -> None:
        if not 1 <= self.block_s <= 3_600:
            raise ValueError(f"block_s must be in 1..3600, got {self.block_s!r}")
        if not 1 <= self.window_blocks <= 60:
            raise ValueError(f"window_blocks must be in 1..60, got {self.window_blocks!r}")
        for name, value in (("min_margin", self.min_margin), ("step", self.step)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if not self.step > 0:
            raise ValueError(f"step must be > 0, got {self.step!r}")
        if not (math.isfinite(self.max_margin) and self.min_margin <= self.prior_margin <= self.max_margin):
            raise ValueError("margins must satisfy min_margin <= prior_margin <= max_margin (finite)")
        if self.max_misses_per_block < 1:
            raise ValueError(f"max_misses_per_block must be >= 1, got {self.max_misses_per_block!r}")

    @property
    def window_s(self) -> int:
        """The peak window in seconds."""
        return self.block_s * self.window_blocks

    def _level(self, margin: float) -> int:
        return round(math.log((1.0 + margin) / (1.0 + self.min_margin)) / self.step * _LEVELS_PER_STEP)

    @property
    def max_level(self) -> int:
        return self._level(self.max_margin)

    @property
    def prior_level(self) -> int:
        return self._level(self.prior_margin)

    def decay(self, target: float) -> int:
        """Levels a block without a miss lowers the margin by, for a miss target ``target``."""
        if not 0 < target < 1:
            raise ValueError(f"miss target must be in (0, 1), got {target!r}")
        return max(1, round(_LEVELS_PER_STEP * self.block_s * target))

    def decays(self, target: MissTarget) -> tuple[int, int]:
        """(memory, SM) decays of one tier's targets, in ``RESOURCES`` order."""
        return self.decay(target.memory), self.decay(target.sm)

    def factor(self, level: int) -> float:
        """1 + margin of one level: the one formula both paths price a level with."""
        return (1.0 + self.min_margin) * math.exp(level * (self.step / _LEVELS_PER_STEP))

    def factors(self, levels: IntArray) -> FloatArray:
        """1 + margin of each level (any shape); one :func:`math.exp` per distinct level."""
        flat = np.asarray(levels, dtype=np.int64).reshape(-1)
        distinct, inverse = np.unique(flat, return_inverse=True)
        values = np.array([self.factor(int(q)) for q in distinct], dtype=np.float64)
        result: FloatArray = values[inverse.reshape(-1)].reshape(np.shape(levels))
        return result

    def next_level(self, level: int, misses: int, decay: int, blocks: int) -> int:
        """:meth:`next_levels` of one level, in Python integers (the per-tick path: no array per call)."""
        moved = level + min(misses, self.max_misses_per_block) * _LEVELS_PER_STEP - decay * blocks
        return 0 if moved < 0 else min(moved, self.max_level)

    def next_levels(self, levels: IntArray, misses: IntArray, decays: IntArray, blocks: IntArray | int = 1) -> IntArray:
        """Levels after closing blocks with ``misses`` (the first of ``blocks`` closed blocks; the rest had none)."""
        counted = np.minimum(misses, self.max_misses_per_block)
        moved = levels + counted * _LEVELS_PER_STEP - decays * blocks
        result: IntArray = np.clip(moved, 0, self.max_level)
        return result

    def margin_of(self, level: int) -> float:
        return float(self.factors(np.array([level], dtype=np.int64))[0]) - 1.0


DEFAULT_MARGIN_CONFIG = MarginConfig()


def block_reservations(
    previous: FloatArray, use: FloatArray, first: FloatArray, factors: FloatArray, cap: FloatArray
) -> FloatArray:
    """Reservations in force for each second of ``k`` consecutive blocks, shape (n, k, resources, block_s).

    Seconds are the last axis, so every running maximum below walks contiguous memory.
    ``previous`` (n, w, resources, block_s) is the ``w`` blocks before the first, oldest first (the
    peak window is ``w`` blocks; NaN where the workload had no such second), ``use`` (n, k,
    resources, block_s) the blocks, ``factors`` (n, k, resources) the factor of each block.
    Second 0 of the first block has ``first``, decided before (NaN: none, the workload's first
    second). Any other second ``i`` of block ``j`` was decided after reading the second before it:
    the peak of the window up to it times the factor in force then (block ``j``'s, or block
    ``j - 1``'s for second 0). That window is block ``j - w`` from ``i`` on, the whole blocks
    ``j - w + 1 .. j - 1``, and block ``j`` before ``i``: a suffix maximum, block maxima and a
    prefix maximum. Every reservation is capped at ``cap``.
    """
    n, k, _, b = use.shape
    w = previous.shape[1]
    # Suffix maxima of every block, the ``w`` before the first included: [..., m] is seconds b-1-m .. b-1.
    suffix = np.maximum.accumulate(np.concatenate([previous, use], axis=1)[..., ::-1], axis=3)  # NaN stays NaN
    whole = suffix[..., -1]  # (n, w + k, resources): each block's maximum
    tail = suffix[:, :k]  # block j - w for each block j, as suffix maxima
    middle = np.full((n, k, use.shape[2]), np.nan)
    for d in range(1, w):  # the whole blocks j - w + 1 .. j - 1
        middle = np.fmax(middle, whole[:, d : d + k])
    head = np.maximum.accumulate(use[..., :-1], axis=3)  # [..., i-1]: seconds 0 .. i-1
    peak = np.fmax(tail[..., b - 2 :: -1], middle[..., None])  # fmax: a missing second is ignored
    np.fmax(peak, head, out=peak)
    limit = cap[:, None, :, None]
    result: FloatArray = np.empty_like(use)
    np.multiply(peak, factors[:, :, :, None], out=result[..., 1:])
    np.minimum(result[..., 1:], limit, out=result[..., 1:])
    result[:, 0, :, 0] = first
    if k > 1:
        # Second 0 of block j: the whole window before it, blocks j - w .. j - 1, at block j - 1's factor.
        result[:, 1:, :, 0] = np.minimum(cap[:, None, :], np.fmax(whole[:, 1:k], middle[:, 1:]) * factors[:, :-1])
    return result


def _ring_of(blocks: npt.NDArray[np.generic], position: IntArray) -> npt.NDArray[np.generic]:
    """(n, w, resources, b) blocks put at ``position`` (n, w) of a (n, resources, w × b) ring."""
    n, w, r, b = blocks.shape
    ring = np.empty((n, r, w, b), dtype=blocks.dtype)
    ring[np.arange(n)[:, None], :, position] = blocks
    return ring.reshape(n, r, w * b)


@dataclass(frozen=True, slots=True)
class BlockOutcome:
    """What :meth:`MarginPolicy.observe_blocks` decided; only each slot's first ``consumed`` blocks count."""

    reservations: FloatArray  # (n, k, resources, block_s): in force for each second; NaN: none yet
    missed: BoolArray  # (n, k, resources, block_s): use above the reservation in force
    factors: FloatArray  # (n, k, resources): 1 + margin of each block's seconds after its first
    consumed: IntArray  # (n,): blocks taken in; the state now follows the last of them


class _TickResource:
    """One resource of one slot on the per-tick path: its calibration and the running peak."""

    __slots__ = ("factor", "in_force", "level", "missed", "misses", "next", "window")

    def __init__(self, *, level: int, factor: float) -> None:
        self.level, self.factor = level, factor
        self.misses, self.missed = 0, False
        self.in_force = self.next = math.nan  # NaN: none decided yet, never a miss
        # (second, its use), use strictly decreasing: the front is the peak of the window. Each second
        # enters once and leaves once, so the peak costs O(1) a reading instead of a scan of the window.
        self.window: deque[tuple[int, float]] = deque()

    def close(self, config: MarginConfig, blocks: int, decay: int) -> None:
        """``blocks`` blocks have passed since the open one began: price the new level (``decay``: the
        tier's, as read at the tick that closes them)."""
        self.level = config.next_level(self.level, self.misses, decay, blocks)
        self.factor = config.factor(self.level)
        self.misses = 0

    def read(self, second: int, value: float, cap: float, window_s: int) -> float:
        """A reading of ``second`` → the reservation from now on (conditionals, not min/max: hot path)."""
        window = self.window
        if window and window[-1][0] == second:  # read before in this second: the larger counts
            earlier = window[-1][1]
            if value <= earlier:  # the second's reading stands: the window, and any miss, are as they were
                reserved = window[0][1] * self.factor
                reserved = cap if reserved > cap else reserved
                self.next = reserved
                return reserved
            window.pop()
        else:  # a new second: the reservation decided after the last reading is now in force
            self.in_force, self.missed = self.next, False
        if value > self.in_force and not self.missed:
            self.misses += 1
            self.missed = True
        while window and window[-1][1] <= value:
            window.pop()
        window.append((second, value))
        while window[0][0] <= second - window_s:
            window.popleft()
        reserved = window[0][1] * self.factor
        reserved = cap if reserved > cap else reserved
        self.next = reserved
        return reserved


class _TickSlot:
    """One slot on the per-tick path: its block clock and its two resources."""

    __slots__ = ("block", "last", "memory", "sm", "start")

    def __init__(self, *, start: int, last: int, memory: _TickResource, sm: _TickResource) -> None:
        self.start, self.last, self.block = start, last, 0
        self.memory, self.sm = memory, sm


class MarginPolicy:
    """Per-workload state of the rule, vectorised over workload slots (numpy arrays).

    A slot is taken by :meth:`admit` and given back by :meth:`release`. Per tick the agent calls
    :meth:`observe` with the slots read and their use; the replay calls :meth:`observe_blocks`
    with ``block_s`` seconds of use for slots at a block boundary. The two give the same
    reservations for the same seconds. A slot is fed by one of the two: the per-tick path keeps
    a slot's state in plain Python objects from its first tick on (the arrays, which the block
    path reads, then no longer follow it).
    """

    def __init__(self, config: MarginConfig = DEFAULT_MARGIN_CONFIG, *, capacity: int = 16) -> None:
        self.config = config
        self._size = 0
        self._free: list[int] = []
        self._ticks: dict[int, _TickSlot] = {}  # the per-tick path's state of each slot it has read
        self._allocate(max(1, capacity))

    def _allocate(self, size: int) -> None:
        old = self._size
        b, r = self.config.window_s, len(RESOURCES)

        def grow(array: npt.NDArray[np.generic] | None, shape: tuple[int, ...], fill: object) -> npt.NDArray[np.generic]:
            new = np.full(shape, fill, dtype=np.float64 if isinstance(fill, float) else np.int64)
            if array is not None:
                new[:old] = array
            return new

        first = old == 0
        self._start: IntArray = grow(None if first else self._start, (size,), 0)  # type: ignore[assignment]
        self._last: IntArray = grow(None if first else self._last, (size,), -1)  # type: ignore[assignment]
        self._block: IntArray = grow(None if first else self._block, (size,), 0)  # type: ignore[assignment]
        self._level: IntArray = grow(None if first else self._level, (size, r), 0)  # type: ignore[assignment]
        self._factor: FloatArray = grow(None if first else self._factor, (size, r), 1.0)  # type: ignore[assignment]
        self._decay: IntArray = grow(None if first else self._decay, (size, r), 1)  # type: ignore[assignment]
        self._misses: IntArray = grow(None if first else self._misses, (size, r), 0)  # type: ignore[assignment]
        self._missed_now: IntArray = grow(None if first else self._missed_now, (size, r), 0)  # type: ignore[assignment]
        # Use of the workload's seconds in the peak window, at (second - start) % window_s (seconds
        # last); NaN: not read.
        self._ring: FloatArray = grow(None if first else self._ring, (size, r, b), math.nan)  # type: ignore[assignment]
        self._ring_s: IntArray = grow(None if first else self._ring_s, (size, b), _NEVER)  # type: ignore[assignment]
        self._in_force: FloatArray = grow(None if first else self._in_force, (size, r), math.nan)  # type: ignore[assignment]
        self._next: FloatArray = grow(None if first else self._next, (size, r), math.nan)  # type: ignore[assignment]
        self._free.extend(range(size - 1, old - 1, -1))
        self._size = size

    def admit(self, *, second: int, decays: tuple[int, int]) -> int:
        """A slot for a workload whose first reading is at ``second``; ``decays`` from ``MarginConfig.decays``."""
        if not self._free:
            self._allocate(self._size * 2)
        slot = self._free.pop()
        level = self.config.prior_level
        self._start[slot], self._last[slot], self._block[slot] = second, second - 1, 0
        self._level[slot] = level
        self._factor[slot] = self.config.factors(np.array([level]))[0]
        self._decay[slot] = decays
        self._misses[slot] = 0
        self._missed_now[slot] = 0
        self._ring[slot] = math.nan
        self._ring_s[slot] = _NEVER
        self._in_force[slot] = math.nan
        self._next[slot] = math.nan
        return slot

    def admit_many(self, *, seconds: Sequence[int], decays: IntArray) -> IntArray:
        return np.array(
            [self.admit(second=int(s), decays=(int(d[0]), int(d[1]))) for s, d in zip(seconds, decays, strict=True)],
            dtype=np.int64,
        )

    def release(self, slot: int) -> None:
        self._ticks.pop(slot, None)
        self._free.append(slot)

    def levels(self, slots: IntArray) -> IntArray:
        result: IntArray = self._level[slots].copy()
        for row, tick in self._tick_rows(slots):
            result[row] = (tick.memory.level, tick.sm.level)
        return result

    def factors(self, slots: IntArray) -> FloatArray:
        """1 + margin in force for each slot, per resource."""
        result: FloatArray = self._factor[slots].copy()
        for row, tick in self._tick_rows(slots):
            result[row] = (tick.memory.factor, tick.sm.factor)
        return result

    def _tick_rows(self, slots: IntArray) -> list[tuple[int, _TickSlot]]:
        """The slots the per-tick path feeds (their state is not in the arrays), by row."""
        ticks = self._ticks
        return [(row, ticks[slot]) for row, slot in enumerate(slots.tolist()) if slot in ticks]

    def margins(self, slots: IntArray) -> FloatArray:
        result: FloatArray = self.factors(slots) - 1.0
        return result

    def observe(
        self,
        slots: Sequence[int],
        second: int,
        use: Sequence[tuple[float, float]],
        cap: Sequence[tuple[float, float]],
        decays: Sequence[tuple[int, int]],
    ) -> list[tuple[float, float]]:
        """Readings of ``second`` (``use``: (memory, SMs) per slot) → the reservations in force from now on.

        ``cap`` bounds each reservation; ``decays`` are each slot's tier's (``MarginConfig.decays``),
        read every tick since the policy API may change them. A second read twice (two ticks in one
        second) counts its larger reading; a miss is counted once per second and resource. Plain
        Python, not arrays: at a tick's few workloads numpy's cost per call (a microsecond or more,
        some forty calls) outweighed the arithmetic, and a running maximum replaces the scan of each
        workload's peak window.
        """
        ticks = self._ticks
        states = [ticks.get(slot) or self._tick_state(slot) for slot in slots]
        # Check everything before changing anything: a bad reading leaves the state as it was.
        for state, (mem, sm) in zip(states, use, strict=True):
            if not (second >= state.last and 0.0 <= mem <= _MAX and 0.0 <= sm <= _MAX):
                raise ValueError(
                    "readings must not go back in time"
                    if second < state.last
                    else f"use must be finite and >= 0, got {(mem, sm)!r}"
                )
        b, window, config = self.config.block_s, self.config.window_s, self.config
        reserved: list[tuple[float, float]] = []
        for state, (mem, sm), (mem_cap, sm_cap), decay in zip(states, use, cap, decays, strict=True):
            if second > state.last:  # a new second (each resource's ``read`` sees it too)
                passed = (second - state.start) // b - state.block
                if passed > 0:  # a block closed: its misses move the level, at the tier's decay read now
                    state.memory.close(config, passed, decay[0])
                    state.sm.close(config, passed, decay[1])
                    state.block += passed
                state.last = second
            reserved.append((state.memory.read(second, mem, mem_cap, window), state.sm.read(second, sm, sm_cap, window)))
        return reserved

    def _tick_state(self, slot: int) -> _TickSlot:
        """A slot's per-tick state from its admission (the arrays hold it until the first tick)."""
        level = self._level[slot]
        state = _TickSlot(
            start=int(self._start[slot]),
            last=int(self._last[slot]),
            memory=_TickResource(level=int(level[0]), factor=self.config.factor(int(level[0]))),
            sm=_TickResource(level=int(level[1]), factor=self.config.factor(int(level[1]))),
        )
        self._ticks[slot] = state
        return state

    def observe_blocks(
        self, slots: IntArray, use: FloatArray, cap: FloatArray, valid: IntArray | None = None
    ) -> BlockOutcome:
        """Up to ``k`` whole blocks of readings per slot, (n, k, resources, block_s), from a block boundary on.

        The same as feeding the seconds to :meth:`observe` one by one, in a few array operations.
        A block's margin depends on the misses of the block before, so the blocks are evaluated
        as if none missed, and each slot takes in blocks up to and including its first block
        with a miss (and at most ``valid``): those were decided exactly; the caller feeds the rest
        again. Without misses, a call takes in all ``k``.
        """
        config, b, w = self.config, self.config.block_s, self.config.window_blocks
        n, k = use.shape[0], use.shape[1]
        local = self._last[slots] + 1 - self._start[slots]
        if np.any(local % b) or use.shape[2:] != (len(RESOURCES), b):
            raise ValueError("observe_blocks needs whole blocks of (resources, block_s) from a block boundary")
        started = (local > 0)[:, None]
        decay = self._decay[slots]
        level = np.where(started, config.next_levels(self._level[slots], self._misses[slots], decay), self._level[slots])
        levels = np.clip(level[:, None, :] - decay[:, None, :] * np.arange(k)[None, :, None], 0, config.max_level)
        factors = config.factors(levels)
        # The ring holds block q of the workload at position q % w: the w blocks before, oldest first.
        order = (local[:, None] // b - w + np.arange(w)[None, :]) % w
        ring = self._ring[slots].reshape(n, len(RESOURCES), w, b).transpose(0, 2, 1, 3)
        previous = np.where(started[:, :, None, None], ring[np.arange(n)[:, None], order], math.nan)
        reservations = block_reservations(previous, use, self._next[slots], factors, cap)
        missed: BoolArray = use > reservations  # NaN (no reservation yet) is never a miss
        block_missed = np.any(missed, axis=(2, 3))
        consumed = np.where(block_missed.any(axis=1), np.argmax(block_missed, axis=1) + 1, k)
        if valid is not None:
            consumed = np.minimum(consumed, valid)
        at, each = consumed - 1, np.arange(n)
        self._level[slots] = levels[each, at]
        self._factor[slots] = factors[each, at]
        self._misses[slots] = missed[each, at].sum(axis=2)
        self._missed_now[slots] = missed[each, at, :, -1]
        # The w blocks up to the last one taken in (of ``previous`` then ``use``), back at their positions.
        blocks = np.concatenate([previous, use], axis=1)[each[:, None], at[:, None] + 1 + np.arange(w)[None, :]]
        index = (local // b + at)[:, None] - w + 1 + np.arange(w)[None, :]  # the blocks' numbers, oldest first
        self._ring[slots] = _ring_of(blocks, index % w)
        self._block[slots] = local // b + at
        last = self._start[slots] + local + consumed * b - 1
        seconds = last[:, None] - np.arange(w * b - 1, -1, -1)[None, :]  # the window's seconds, oldest first
        seconds = np.where(np.repeat(index, b, axis=1) < 0, _NEVER, seconds)  # before the workload's first
        self._ring_s[slots] = _ring_of(seconds.reshape(n, 1, w, b).transpose(0, 2, 1, 3), index % w)[:, 0]
        self._last[slots] = last
        self._in_force[slots] = reservations[each, at, :, -1]
        peak = np.fmax.reduce(np.fmax.reduce(blocks, axis=3), axis=1)  # the window's; NaN: a block not read
        self._next[slots] = np.minimum(cap, peak * factors[each, at])
        return BlockOutcome(reservations=reservations, missed=missed, factors=factors, consumed=consumed)
