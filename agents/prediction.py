"""Per-workload peak prediction in the agent, with online calibration (docs/prediction.md).

:class:`WorkloadPredictors` is the agent's ``Predictor``: it keeps, per (workload, GPU), one
``allocator.predict`` predictor per resource (memory, SMs), feeds it from every reading and
returns the predicted peak over the look-ahead (the largest of the 0.5, 1 and 2 s forecasts),
so that grants rise before a burst arrives. The predictors consume one sample per 100 ms;
the agent reads once per tick, so the samples between two readings are interpolated linearly
(a 500 ms tick feeds five, the last one the reading itself).

Online calibration: each forecast is later checked against the largest use actually read over
its look-ahead. A forecast below that peak is an under-prediction; each workload's additive
margin per resource moves up by ``gain × (1 − target)`` error scales after one and down by
``gain × target`` after a hit, so over a window of n outcomes it moves by ``gain × n × (rate −
target)`` error scales: it rises while the rolling rate is above the target and falls while it
is below, and it settles where the rate is the target. The margin stays within ±
``max_margin_fraction`` of the GPU's capacity.

The state of a workload is dropped at the first tick it is absent from (``observe``, a
``TickObserver``); the agent loop calls it every tick.

It is also a ``BatchPredictor``: ``compute_grants`` hands it a tick's readings at once
(``predict_many``), which feeds them all and then runs every LSTM of the tick in one batched
forward (``allocator.predict.predict_peaks``); ``predict`` is the same, one reading at a time.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import repeat
from types import MappingProxyType
from typing import Literal, get_args

from agents.allocation import CurrentUsePredictor
from agents.interfaces import Entitlement, GpuInfo, Grant, Prediction, Predictor, UsageReading, Workload
from allocator.policy import DEFAULT_MARGIN_CONFIG, MarginConfig, MarginPolicy
from allocator.predict import (
    DEFAULT_KIND,
    STEP_S,
    PeakForecast,
    PeakPredictor,
    PredictorKind,
    Resource,
    make_predictor,
    predict_peaks,
)
from allocator.predict import shipped_bundle as _shipped_bundle
from allocator.risk import DEFAULT_MISS_TARGET, DEFAULT_MISS_TARGETS, MissTarget

__all__ = [
    "DEFAULT_HEADROOM",
    "DEFAULT_PREDICTOR",
    "DEFAULT_UNDERPREDICTION_TARGET",
    "PREDICTOR_CHOICES",
    "Calibration",
    "MarginPredictor",
    "PredictionStats",
    "PredictorChoice",
    "WorkloadPredictors",
    "agent_predictor",
    "make_workload_predictors",
]

# The rate the shipped margins were fitted for (docs/prediction.md, "Calibration").
DEFAULT_UNDERPREDICTION_TARGET = 0.05
LOOKAHEAD_S = 2.0  # the longest horizon: a forecast is checked against the use read over the next 2 s
# ``vgpu-agent run --predictor``: "margin" is the default (``MarginPredictor``); "lstm" is the calibrated
# forecaster pair (memory: the LSTM, SMs: last value + margin, ``allocator.predict.DEFAULT_KIND``); the
# baselines use one kind for both resources; "current-use" expects the next seconds to look like now.
PredictorChoice = Literal["margin", "lstm", "last-value", "ewma", "holt", "current-use"]
PREDICTOR_CHOICES: tuple[PredictorChoice, ...] = get_args(PredictorChoice)
DEFAULT_PREDICTOR: PredictorChoice = "margin"
# The allocator's headroom (demand = forecast x (1 + headroom)) each predictor is meant for, unless
# ``--headroom`` says otherwise. The margin policy's reservation already is the workload's peak x its
# calibrated margin, so it takes none (the replay's agent-default applies none either); the
# forecasters' margins were fitted for a 0.2 headroom on top (docs/prediction.md), and current use
# has no margin of its own.
DEFAULT_HEADROOM: Mapping[PredictorChoice, float] = MappingProxyType(
    {"margin": 0.0, "lstm": 0.2, "last-value": 0.2, "ewma": 0.2, "holt": 0.2, "current-use": 0.2}
)

PredictorFactory = Callable[[Resource], PeakPredictor]


@dataclass(frozen=True, slots=True)
class Calibration:
    """Online calibration of each workload's margin; ``enabled=False`` keeps the shipped margins only."""

    enabled: bool = True
    target: float = DEFAULT_UNDERPREDICTION_TARGET  # under-prediction rate held per workload and resource
    window: int = 200  # outcomes in the rolling rate (100 s of 500 ms ticks)
    gain: float = 0.1  # margin step, in error scales (EWMA of |peak − forecast|)
    max_margin_fraction: float = 0.25  # |margin| <= this x the GPU's capacity of the resource

    def __post_init__(self) -> None:
        if not 0 < self.target < 1:
            raise ValueError(f"calibration target must be in (0, 1), got {self.target!r}")
        if self.window < 1:
            raise ValueError(f"calibration window must be >= 1, got {self.window!r}")
        if not (math.isfinite(self.gain) and self.gain > 0):
            raise ValueError(f"calibration gain must be finite and > 0, got {self.gain!r}")
        if not 0 <= self.max_margin_fraction <= 1:
            raise ValueError(f"max_margin_fraction must be in [0, 1], got {self.max_margin_fraction!r}")


@dataclass(frozen=True, slots=True)
class PredictionStats:
    """One workload's prediction on one GPU as of the last tick (resource units: MiB, SMs)."""

    workload: Workload
    gpu: str
    mem_predicted_mb: float
    mem_used_mb: float
    sm_predicted: float
    sm_used: float
    mem_underprediction_rate: float | None  # over the checked window; None before the first check
    sm_underprediction_rate: float | None
    mem_over_reservation_mb: float | None  # mean of max(forecast − realised peak, 0) over the window
    sm_over_reservation: float | None
    mem_margin_mb: float  # the online margin in force
    sm_margin: float


@dataclass(slots=True)
class _Pending:
    at_s: float
    forecast: float
    until: float  # at_s + look-ahead (+ tolerance): readings up to here count towards the peak
    due: float  # at_s + look-ahead (- tolerance): checked at the first reading from here on
    peak: float = 0.0  # largest use read in (at, at + look-ahead]
    seen: bool = False


@dataclass(slots=True)
class _Track:
    """One resource of one workload: its predictor, online margin and checked outcomes."""

    predictor: PeakPredictor
    margin: float = 0.0
    error_scale: float = 0.0  # EWMA of |realised peak − forecast|; 0 until the first check
    last_value: float | None = None
    last_at_s: float | None = None
    forecast: float = 0.0  # the last forecast handed out (with the margin, clipped)
    pending: deque[_Pending] = field(default_factory=deque)
    under: deque[bool] = field(default_factory=deque)
    over: deque[float] = field(default_factory=deque)
    under_count: int = 0
    over_sum: float = 0.0


@dataclass(slots=True)
class _State:
    workload: Workload
    memory: _Track
    sm: _Track
    mem_used_mb: float = 0.0
    sm_used: float = 0.0


class WorkloadPredictors:
    """The agent's ``Predictor`` (and ``TickObserver``): one predictor per workload and resource.

    ``memory`` and ``sm`` build a fresh ``PeakPredictor`` for a workload that appears; their
    forecasts are in the shipped model's units: memory in MiB, SMs of a ``model_sm_count``-SM
    card, so SM readings are rescaled by each GPU's own SM count on the way in and out. Forecasts
    are clipped to ``[0, capacity]`` of the GPU. Thread-safe: metrics read :meth:`stats` while the
    loop ticks.
    """

    def __init__(
        self,
        *,
        gpus: Sequence[GpuInfo],
        memory: PredictorFactory,
        sm: PredictorFactory,
        model_sm_count: float,
        calibration: Calibration | None = None,
    ) -> None:
        if not (math.isfinite(model_sm_count) and model_sm_count > 0):
            raise ValueError(f"model_sm_count must be finite and > 0, got {model_sm_count!r}")
        self._gpus: Mapping[str, GpuInfo] = {g.uuid: g for g in gpus}
        self._factories = {"memory_mb": memory, "sm": sm}
        self._model_sm = float(model_sm_count)
        self._calibration = calibration if calibration is not None else Calibration()
        self._origin: datetime | None = None
        self._states: dict[tuple[str, str], _State] = {}
        self._lock = threading.Lock()

    @property
    def calibration(self) -> Calibration:
        return self._calibration

    def predict(self, *, reading: UsageReading, now: datetime) -> Prediction:
        """One reading: its predictors forecast one at a time (the LSTM: one ``lstm_forward`` call)."""
        return self._predict((reading,), now=now, forecast=_one_by_one, keys=[(reading.workload.key, reading.gpu)])[0]

    def predict_many(self, *, readings: Sequence[UsageReading], now: datetime) -> list[Prediction]:
        """A tick's readings at once: the same predictions, with one batched LSTM pass for all of them."""
        keys = [(r.workload.key, r.gpu) for r in readings]
        if len(set(keys)) < len(keys):
            # A workload read twice in one call: each reading sees the one before, as with ``predict``.
            return [self.predict(reading=r, now=now) for r in readings]
        return self._predict(readings, now=now, forecast=predict_peaks, keys=keys)

    def _predict(
        self,
        readings: Sequence[UsageReading],
        *,
        now: datetime,
        forecast: Callable[[Sequence[PeakPredictor]], list[PeakForecast]],
        keys: Sequence[tuple[str, str]],
    ) -> list[Prediction]:
        gpus = []
        for reading in readings:
            gpu = self._gpus.get(reading.gpu)
            if gpu is None:
                raise ValueError(f"reading for unknown GPU {reading.gpu!r} ({reading.workload.key})")
            gpus.append(gpu)
        with self._lock:
            if self._origin is None:
                self._origin = now
            at_s = (now - self._origin).total_seconds()
            # Per reading: memory then SMs, as (track, scale, capacity); fed first, forecast together.
            jobs: list[tuple[_Track, float, float]] = []
            for reading, gpu, key in zip(readings, gpus, keys, strict=True):
                state = self._states.get(key)
                if state is None:
                    state = _State(
                        workload=reading.workload,
                        memory=_Track(predictor=self._factories["memory_mb"]("memory_mb")),
                        sm=_Track(predictor=self._factories["sm"]("sm")),
                    )
                    self._states[key] = state
                state.workload = reading.workload
                state.mem_used_mb, state.sm_used = reading.mem_used_mb, reading.sm_used
                sm_scale = self._model_sm / gpu.sm_count
                self._feed(state.memory, value=reading.mem_used_mb, at_s=at_s, scale=1.0, capacity=gpu.memory_mb)
                self._feed(state.sm, value=reading.sm_used, at_s=at_s, scale=sm_scale, capacity=gpu.sm_count)
                jobs.append((state.memory, 1.0, gpu.memory_mb))
                jobs.append((state.sm, sm_scale, gpu.sm_count))
            peaks = forecast([track.predictor for track, _, _ in jobs])
            values = [
                self._finish(track, peak, at_s=at_s, scale=scale, capacity=capacity)
                for (track, scale, capacity), peak in zip(jobs, peaks, strict=True)
            ]
        return [Prediction(mem_peak_mb=values[k], sm_peak=values[k + 1]) for k in range(0, len(values), 2)]

    def observe(self, *, grants: Sequence[Grant], readings: Sequence[UsageReading]) -> None:
        """Forget the workloads absent from this tick's readings."""
        present = {(r.workload.key, r.gpu) for r in readings}
        with self._lock:
            for key in [k for k in self._states if k not in present]:
                del self._states[key]

    def stats(self) -> list[PredictionStats]:
        with self._lock:
            return [
                PredictionStats(
                    workload=s.workload,
                    gpu=gpu,
                    mem_predicted_mb=s.memory.forecast,
                    mem_used_mb=s.mem_used_mb,
                    sm_predicted=s.sm.forecast,
                    sm_used=s.sm_used,
                    mem_underprediction_rate=_rate(s.memory),
                    sm_underprediction_rate=_rate(s.sm),
                    mem_over_reservation_mb=_over(s.memory),
                    sm_over_reservation=_over(s.sm),
                    mem_margin_mb=s.memory.margin,
                    sm_margin=s.sm.margin,
                )
                for (_key, gpu), s in self._states.items()
            ]

    def _feed(self, track: _Track, *, value: float, at_s: float, scale: float, capacity: float) -> None:
        """Check the pending forecasts against ``value`` and feed the predictor the samples up to it."""
        self._check(track, value=value, at_s=at_s, capacity=capacity)
        scaled = value * scale
        if track.last_value is None or track.last_at_s is None:
            track.predictor.observe(scaled)
        else:
            # One sample per STEP_S since the last reading, on the line from it to this one.
            steps = max(1, min(round((at_s - track.last_at_s) / STEP_S), round(LOOKAHEAD_S / STEP_S) * 2))
            previous = track.last_value * scale
            rise, observe = scaled - previous, track.predictor.observe
            for i in range(1, steps + 1):
                observe(previous + rise * i / steps)
        track.last_value, track.last_at_s = value, at_s

    def _finish(self, track: _Track, peak: PeakForecast, *, at_s: float, scale: float, capacity: float) -> float:
        """The predictor's forecast → the one handed out: largest horizon, margin, clipped; remembered."""
        top = peak.h0_5 if peak.h0_5 >= peak.h1 else peak.h1  # max() of the three, without the tuple
        forecast = (top if top >= peak.h2 else peak.h2) / scale
        if self._calibration.enabled:
            forecast += track.margin
        forecast = min(float(capacity), max(0.0, forecast))
        track.forecast = forecast
        track.pending.append(
            _Pending(at_s=at_s, forecast=forecast, until=at_s + LOOKAHEAD_S + 1e-9, due=at_s + LOOKAHEAD_S - 1e-9)
        )
        return forecast

    def _check(self, track: _Track, *, value: float, at_s: float, capacity: float) -> None:
        pending = track.pending
        for p in pending:
            if at_s <= p.until:
                if not p.seen:
                    p.peak, p.seen = value, True
                elif value > p.peak:
                    p.peak = value
        while pending and at_s >= pending[0].due:
            done = pending.popleft()
            if done.seen:
                self._record(track, done, capacity=capacity)

    def _record(self, track: _Track, done: _Pending, *, capacity: float) -> None:
        c = self._calibration
        # Conditionals rather than min()/max() calls: this runs per workload and resource every tick.
        error = done.peak - done.forecast
        under = error > 1e-9 * (capacity if capacity > 1.0 else 1.0)
        track.under.append(under)
        track.under_count += under
        over = -error if error < 0.0 else 0.0
        track.over.append(over)
        track.over_sum += over
        if len(track.under) > c.window:
            track.under_count -= track.under.popleft()
            track.over_sum -= track.over.popleft()
        # Error scale: the step of the margin; seeded by the first error (or 0.1 % of the card).
        magnitude, floor = abs(error), 1e-3 * capacity
        if magnitude < floor:  # noqa: PLR1730 - conditionals, not max(): the hot path above
            magnitude = floor
        track.error_scale = magnitude if track.error_scale == 0 else 0.9 * track.error_scale + 0.1 * magnitude
        if c.enabled:
            step = c.gain * track.error_scale * ((1 - c.target) if under else -c.target)
            bound = c.max_margin_fraction * capacity
            margin = track.margin + step
            track.margin = bound if margin > bound else (-bound if margin < -bound else margin)


def _one_by_one(predictors: Sequence[PeakPredictor]) -> list[PeakForecast]:
    return [p.predict() for p in predictors]


def _rate(track: _Track) -> float | None:
    return track.under_count / len(track.under) if track.under else None


def _over(track: _Track) -> float | None:
    return track.over_sum / len(track.over) if track.over else None


def make_workload_predictors(
    kind: Literal["lstm", "last-value", "ewma", "holt"],
    *,
    gpus: Sequence[GpuInfo],
    calibration: Calibration | None = None,
) -> WorkloadPredictors:
    """The agent's predictors from the shipped bundle: ``lstm`` is the calibrated default pair."""
    bundle = _shipped_bundle()
    if kind == "lstm":
        kinds: Mapping[Resource, PredictorKind] = DEFAULT_KIND
    else:
        baseline: PredictorKind = "last_value" if kind == "last-value" else kind
        kinds = {"memory_mb": baseline, "sm": baseline}

    def factory(resource: Resource) -> PeakPredictor:
        return make_predictor(kinds[resource], resource, bundle=bundle, calibrated=True)

    return WorkloadPredictors(
        gpus=gpus,
        memory=factory,
        sm=factory,
        model_sm_count=bundle.resources["sm"].capacity,
        calibration=calibration,
    )


def _default_targets(tier: str) -> MissTarget:
    return DEFAULT_MISS_TARGETS.get(tier, DEFAULT_MISS_TARGET)


class _Followed:
    """A workload on one GPU that ``MarginPredictor`` follows: its policy slot and the card that caps it,
    and its last reading and reservation (for /metrics; None until its first tick went through)."""

    __slots__ = ("card", "reading", "reserved", "slot")

    def __init__(self, slot: int, card: tuple[float, float]) -> None:
        self.slot, self.card = slot, card
        self.reading: UsageReading | None = None
        self.reserved: tuple[float, float] = (0.0, 0.0)


def _capped(card: tuple[float, float], entitlement: Entitlement) -> tuple[float, float]:
    """What a reservation is capped at: the entitlement's limits, the card where it sets none."""
    mem, sm = entitlement.limit_mem_mb, entitlement.limit_sm
    return (card[0] if mem is None else mem, card[1] if sm is None else sm)


class MarginPredictor:
    """The agent's default ``Predictor`` (and ``TickObserver``): :class:`allocator.policy.MarginPolicy`.

    Each workload's reservation is its own peak over the last minute times a margin calibrated
    toward its SLA tier's miss targets (``targets``, read every tick: the policy API may change
    them); the replay runs the same object (docs/replay.md). The "forecast" handed to the
    allocator is the reservation itself, capped at the workload's limit (else the card), so the
    allocation policy's headroom should be 0 with it. A reading belongs to its whole second
    (``now`` floored): two ticks in one second are one reading, the larger.
    """

    def __init__(
        self,
        *,
        gpus: Sequence[GpuInfo],
        targets: Callable[[str], MissTarget] = _default_targets,
        config: MarginConfig = DEFAULT_MARGIN_CONFIG,
    ) -> None:
        # Each card's (memory, SMs): what a reservation is capped at when the entitlement sets no limit.
        self._cards: Mapping[str, tuple[float, float]] = {g.uuid: (float(g.memory_mb), float(g.sm_count)) for g in gpus}
        self._targets = targets
        self._policy = MarginPolicy(config)
        self._followed: dict[tuple[str, str], _Followed] = {}  # per (workload key, GPU uuid)
        self._decay_of: dict[str, tuple[MissTarget, tuple[int, int]]] = {}  # per tier: its targets, their decays
        self._predicted: Sequence[UsageReading] = ()  # the readings of the last tick predicted
        self._lock = threading.Lock()

    @property
    def policy(self) -> MarginPolicy:
        return self._policy

    @property
    def targets(self) -> Callable[[str], MissTarget]:
        """A tier's miss targets, as this predictor reads them each tick."""
        return self._targets

    def predict(self, *, reading: UsageReading, now: datetime) -> Prediction:
        return self.predict_many(readings=(reading,), now=now)[0]

    def predict_many(self, *, readings: Sequence[UsageReading], now: datetime) -> list[Prediction]:
        # Column by column (a comprehension per attribute) rather than one loop body per reading:
        # every workload, every tick, and the loop's bookkeeping cost as much as the policy's rule.
        if not readings:
            return []
        second = math.floor(now.timestamp())
        with self._lock:
            followed = self._followed
            rows = [followed.get((r.workload.key, r.gpu)) for r in readings]
            if None in rows:  # a workload's first reading (or a reading of an unknown GPU: refused)
                rows = [row or self._follow(r, second) for row, r in zip(rows, readings, strict=True)]
            slots = [row.slot for row in rows]  # type: ignore[union-attr]  # every None was replaced above
            if len(set(slots)) < len(slots):
                raise ValueError("a workload was read twice on one GPU in one tick")
            decay_of = {tier: self._decays(tier) for tier in {r.workload.sla_tier for r in readings}}
            reserved = self._policy.observe(
                slots,
                second,
                [(r.mem_used_mb, r.sm_used) for r in readings],
                [
                    row.card if (e := r.entitlement).limit_mem_mb is None and e.limit_sm is None else _capped(row.card, e)  # type: ignore[union-attr]
                    for row, r in zip(rows, readings, strict=True)
                ],
                [decay_of[r.workload.sla_tier] for r in readings],
            )
            for row, r, res in zip(rows, readings, reserved, strict=True):
                row.reading, row.reserved = r, res  # type: ignore[union-attr]
            self._predicted = readings
        # tuple.__new__ builds each named tuple from its pair without a Python-level call (``_make``,
        # ``__new__``): half the cost, every workload, every tick.
        return list(map(tuple.__new__, repeat(Prediction, len(reserved)), reserved))

    def _follow(self, reading: UsageReading, second: int) -> _Followed:
        """A workload's first reading on its GPU: a policy slot for it from ``second`` on (read twice in
        one tick, it is found here the second time, and the tick is refused for it)."""
        key = (reading.workload.key, reading.gpu)
        row = self._followed.get(key)
        if row is None:
            card = self._cards.get(reading.gpu)
            if card is None:
                raise ValueError(f"reading for unknown GPU {reading.gpu!r} ({reading.workload.key})")
            decays = self._decays(reading.workload.sla_tier)
            row = self._followed[key] = _Followed(self._policy.admit(second=second, decays=decays), card)
        return row

    def stats(self) -> list[PredictionStats]:
        """Each workload's reservation as of its last tick, for /metrics. The margin reported is the
        reservation above the use last read (MiB, SMs); the policy checks its misses per 60 s block
        rather than per forecast, so there is no rolling under-prediction rate to report."""
        with self._lock:
            rows = [(row.reading, row.reserved) for row in self._followed.values() if row.reading is not None]
        return [
            PredictionStats(
                workload=r.workload, gpu=r.gpu, mem_predicted_mb=mem, mem_used_mb=r.mem_used_mb, sm_predicted=sm,
                sm_used=r.sm_used, mem_underprediction_rate=None, sm_underprediction_rate=None,
                mem_over_reservation_mb=None, sm_over_reservation=None,
                mem_margin_mb=max(mem - r.mem_used_mb, 0.0), sm_margin=max(sm - r.sm_used, 0.0),
            )
            for r, (mem, sm) in rows
        ]

    def _decays(self, tier: str) -> tuple[int, int]:
        """A tier's decays for its targets as read now, priced again only when its targets are another
        object (an identity check: hashing a ``MissTarget`` is a Python-level call, every tick)."""
        target = self._targets(tier)
        known = self._decay_of.get(tier)
        if known is not None and known[0] is target:
            return known[1]
        decays = self._policy.config.decays(target)
        self._decay_of[tier] = (target, decays)
        return decays

    def observe(self, *, grants: Sequence[Grant], readings: Sequence[UsageReading]) -> None:
        """Forget the workloads absent from this tick's readings."""
        with self._lock:
            followed = self._followed
            # This tick's readings were all followed by ``predict_many`` (each once: it refuses a
            # workload read twice), so when they are as many as the workloads followed, none is absent.
            if readings is self._predicted and len(readings) == len(followed):
                return
            present = {(r.workload.key, r.gpu) for r in readings}
            for key in [k for k in followed if k not in present]:
                self._policy.release(followed.pop(key).slot)


def agent_predictor(
    kind: PredictorChoice,
    *,
    gpus: Sequence[GpuInfo],
    targets: Callable[[str], MissTarget],
    calibration: Calibration | None = None,
) -> Predictor:
    """The predictor ``vgpu-agent run --predictor kind`` runs: the one place each choice is built.

    ``targets`` gives a tier's miss targets (the margin policy reads them every tick);
    ``calibration`` is the forecasters' online calibration.
    """
    if kind == "margin":
        return MarginPredictor(gpus=gpus, targets=targets)
    if kind == "current-use":
        return CurrentUsePredictor()
    return make_workload_predictors(kind, gpus=gpus, calibration=calibration)
