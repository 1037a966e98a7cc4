"""The agent: tick loop of backend -> allocation -> enforcer -> observers -> meter -> spool.

Every tick (``tick_ms``) the backend is read, grants are computed under the policy
in force (``policy()``, read each tick: the policy client swaps it in the background)
and applied, the observers (watchdog, budget evictions, metrics) see the round,
and the meter holds the new rates until the next tick. Every ``batch_seconds``
the completed metering periods are closed into a batch in the spool. Uploading
runs elsewhere (``agents.uploader``), so a down server never delays metering.

Between closes, each completed period is checkpointed to the spool: an agent
killed with SIGKILL loses at most the period it was in, because the next run first
closes the checkpointed periods into a batch and then meters from their end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from agents.allocation import Policy, compute_grants
from agents.batch import Sample, gpu_from_wire, gpu_to_wire, render_batch
from agents.clock import ceil_to_seconds, from_us, to_us
from agents.collection import TickCollector
from agents.interfaces import (
    Clock,
    EnergyReader,
    Enforcer,
    GpuBackend,
    GpuInfo,
    Grant,
    Predictor,
    TickObserver,
    UsageReading,
)
from agents.meter import Meter, Rate
from agents.prediction import DEFAULT_PREDICTOR, MarginPredictor, WorkloadPredictors, agent_predictor
from agents.spool import CheckpointPeriod, Spool

__all__ = ["Agent", "AgentConfig", "RunSummary"]

log = logging.getLogger(__name__)

_US_PER_MS = 1000


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node: str
    tick_ms: int = 500  # allocation period
    meter_ms: int = 1000  # width of one usage sample; whole seconds
    batch_seconds: int = 60  # width of one batch window; a multiple of the sample width
    policy: Policy = field(default_factory=Policy)
    cluster: str = ""  # the batches' optional ``cluster`` (``--cluster``); "" sends none
    # Wire protocol of the batches (``--wire``): "v2" sends integrals per workload-minute, "v1" the samples.
    wire: str = "v2"

    def __post_init__(self) -> None:
        if not self.node:
            raise ValueError("node must not be empty")
        if self.meter_ms < 1000 or self.meter_ms % 1000 or self.meter_ms > 60_000:
            raise ValueError(f"meter_ms must be whole seconds in [1000, 60000], got {self.meter_ms}")
        if not 10 <= self.tick_ms <= self.meter_ms:
            raise ValueError(f"tick_ms must be in [10, meter_ms={self.meter_ms}], got {self.tick_ms}")
        if self.batch_seconds < 1 or (self.batch_seconds * 1000) % self.meter_ms:
            raise ValueError(f"batch_seconds must be a positive multiple of meter_ms/1000, got {self.batch_seconds}")
        if self.wire not in {"v1", "v2"}:
            raise ValueError(f"wire must be v1 or v2, got {self.wire!r}")
        if self.wire == "v2" and 60 % self.period_s:
            # A v2 window is a UTC minute: a sample must not cross one (periods are aligned to the epoch).
            raise ValueError(f"--wire v2 needs meter_ms dividing a minute, got {self.meter_ms}")

    @property
    def period_s(self) -> int:
        return self.meter_ms // 1000


@dataclass(frozen=True, slots=True)
class RunSummary:
    start: datetime  # first metered instant
    metered_until: datetime  # end of the last closed batch window
    batches: tuple[int, ...]  # batch_seq of every batch spooled by this run
    ticks: int


class Agent:
    def __init__(
        self,
        *,
        config: AgentConfig,
        backend: GpuBackend,
        clock: Clock,
        enforcer: Enforcer,
        spool: Spool,
        predictor: Predictor | None = None,
        on_batch: Callable[[int], None] | None = None,
        policy: Callable[[], Policy] | None = None,
        observers: Sequence[TickObserver] = (),
        on_tick_seconds: Callable[[float], None] | None = None,
        checkpoint: bool = True,
    ) -> None:
        self._config = config
        self._backend = backend
        self._clock = clock
        self._enforcer = enforcer
        self._spool = spool
        # None: the default (``agents.prediction.MarginPredictor`` toward the policy's miss targets),
        # built in ``run`` once the GPUs are known.
        self._predictor = predictor
        self._on_batch = on_batch
        # Read every tick; default: the configuration's fixed policy.
        self._policy = policy if policy is not None else (lambda: config.policy)
        self._observers = tuple(observers)
        self._with_predictor_observer()
        self._on_tick_seconds = on_tick_seconds  # computation time of each tick (real seconds)
        # Off for replays on a fake clock: their seconds cost nothing to meter again, an fsync each does.
        self._checkpoint = checkpoint

    @property
    def predictor(self) -> Predictor | None:
        """The predictor in use; ``None`` until ``run`` has built the default."""
        return self._predictor

    def _with_predictor_observer(self) -> None:
        # Per-workload predictors forget a workload when a tick's readings no longer have it.
        if isinstance(self._predictor, WorkloadPredictors | MarginPredictor) and self._predictor not in self._observers:
            self._observers = (self._predictor, *self._observers)

    def run(
        self,
        *,
        stop: threading.Event,
        start: datetime | None = None,
        until: datetime | None = None,
    ) -> RunSummary:
        """Meter from ``start`` (default: the next whole period) until ``until`` or ``stop``.

        On the way out the partial batch of completed periods is spooled.
        """
        config = self._config
        gpus = tuple(self._backend.inventory())
        if not gpus:
            raise ValueError("the backend reports no GPUs")
        if self._predictor is None:
            self._predictor = agent_predictor(
                DEFAULT_PREDICTOR, gpus=gpus, targets=lambda tier: self._policy().miss_target_for(tier)
            )
            self._with_predictor_observer()
        predictor = self._predictor
        origin_us = to_us(self._clock.now())
        origin_mono = self._clock.monotonic()

        def now_us() -> int:
            # Wall time anchored once, advanced by the monotonic clock: immune to clock steps.
            return origin_us + round((self._clock.monotonic() - origin_mono) * 1_000_000)

        begin = start if start is not None else ceil_to_seconds(from_us(origin_us), seconds=config.period_s)
        recovered = self._recover()
        last_end = self._spool.last_window_end
        if last_end is not None and begin < last_end:
            log.info("event=start_moved from=%s to=%s reason=spooled_history", begin, last_end)
            begin = ceil_to_seconds(last_end, seconds=config.period_s)
        meter = Meter(gpus=gpus, start=begin, period_s=config.period_s)
        batch = _OpenBatch(start=begin, seconds=config.batch_seconds)
        tick_us = config.tick_ms * _US_PER_MS
        begin_us = to_us(begin)
        until_us = None if until is None else to_us(until)
        batches: list[int] = list(recovered)
        ticks = 0
        log.info(
            "event=agent_started node=%s gpus=%d start=%s tick_ms=%d batch_seconds=%d",
            config.node,
            len(gpus),
            begin.isoformat(),
            config.tick_ms,
            config.batch_seconds,
        )
        # The first tick lands one tick before ``begin`` so that rates are known from its first instant.
        next_tick_us = begin_us - tick_us
        # Garbage is collected between ticks, not inside them (agents.collection).
        with TickCollector() as collector:
            try:
                while not stop.is_set():
                    if until_us is not None and next_tick_us > until_us:
                        break
                    self._clock.sleep(max(0, next_tick_us - now_us()) / 1_000_000)
                    if stop.is_set():
                        break
                    at = from_us(now_us())
                    samples = meter.update(at=at, rates=self._tick(gpus=gpus, at=at, predictor=predictor),
                                           energy_j=self._energy(at))
                    ticks += 1
                    batches.extend(self._close_full(batch=batch, samples=samples, meter=meter, gpus=gpus))
                    if self._checkpoint:
                        self._checkpoint_open(batch=batch, until=meter.completed_until, gpus=gpus)
                    # Missed ticks (a stall) are skipped, not replayed: rates are piecewise constant.
                    next_tick_us = begin_us + ((to_us(at) - begin_us) // tick_us + 1) * tick_us
                    collector.between_ticks()
            finally:
                end = from_us(now_us() if until_us is None else min(now_us(), until_us))
                samples = meter.advance(to=max(end, meter.start))
                batches.extend(self._close_full(batch=batch, samples=samples, meter=meter, gpus=gpus))
                batches.extend(self._close_partial(batch=batch, until=meter.completed_until, gpus=gpus, meter=meter))
                log.info(
                    "event=agent_stopped node=%s metered_until=%s batches=%d",
                    config.node,
                    batch.start.isoformat(),
                    len(batches),
                )
        return RunSummary(start=begin, metered_until=batch.start, batches=tuple(batches), ticks=ticks)

    def _energy(self, at: datetime) -> Mapping[str, float] | None:
        """Each GPU's energy count now, when the backend meters energy (docs/agent.md, Energy)."""
        return self._backend.energy_j(now=at) if isinstance(self._backend, EnergyReader) else None

    def _tick(self, *, gpus: Sequence[GpuInfo], at: datetime, predictor: Predictor) -> list[Rate]:
        # Real elapsed time, not the agent's clock: a fake clock does not move while computing.
        began = time.perf_counter()
        readings = self._backend.read(now=at)
        allocation = compute_grants(
            gpus=gpus, readings=readings, policy=self._policy(), predictor=predictor, now=at
        )
        self._enforcer.apply(allocation.grants)
        for observer in self._observers:
            observer.observe(grants=allocation.grants, readings=readings)
        for uuid in allocation.mem_overcommitted:
            log.warning("event=memory_overcommitted gpu=%s detail='use above capacity'", uuid)
        rates = _rates(readings=readings, grants=allocation.grants, gpus=gpus)
        if self._on_tick_seconds is not None:
            self._on_tick_seconds(time.perf_counter() - began)
        return rates

    def _close_full(
        self, *, batch: _OpenBatch, samples: list[Sample], meter: Meter, gpus: Sequence[GpuInfo]
    ) -> list[int]:
        """Spool every batch window the meter has completed (several after a stall)."""
        batch.samples.extend(samples)
        closed: list[int] = []
        while meter.completed_until >= batch.end:
            closed.append(self._store(batch=batch, end=batch.end, gpus=gpus, meter=meter))
        return closed

    def _checkpoint_open(self, *, batch: _OpenBatch, until: datetime, gpus: Sequence[GpuInfo]) -> None:
        """Persist the open batch's periods completed since the last checkpoint."""
        since = max(batch.start, batch.checkpointed_until or batch.start)
        if until <= since:
            return
        self._spool.checkpoint(
            CheckpointPeriod(
                start=since,
                end=until,
                gpus=[gpu_to_wire(g) for g in gpus],
                samples=[s.to_wire() for s in batch.samples if since <= s.start < until],
            )
        )
        batch.checkpointed_until = until

    def _recover(self) -> list[int]:
        """Close the periods a killed run checkpointed into batches (one per contiguous run of them)."""
        runs: list[list[CheckpointPeriod]] = []
        for period in self._spool.checkpointed():
            if runs and runs[-1][-1].end == period.start and runs[-1][-1].gpus == period.gpus:
                runs[-1].append(period)
            else:
                runs.append([period])
        seqs: list[int] = []
        for run in runs:
            start, end = run[0].start, run[-1].end
            seq = self._spool.store_batch(window_start=start, window_end=end,
                                          render=self._render_recovered(run, wire=self._config.wire),
                                          evidence=self._render_recovered(run, wire="v1"))
            log.warning(
                "event=checkpoint_recovered batch_seq=%d window_start=%s window_end=%s samples=%d"
                " detail='the previous run stopped without closing its batch'",
                seq,
                start.isoformat(),
                end.isoformat(),
                sum(len(p.samples) for p in run),
            )
            if self._on_batch is not None:
                self._on_batch(seq)
            seqs.append(seq)
        return seqs

    def _render_recovered(self, run: Sequence[CheckpointPeriod], *, wire: str) -> Callable[[int], bytes]:
        gpus = [gpu_from_wire(g) for g in run[0].gpus]  # the inventory of the run that metered them
        samples = [Sample.from_wire(s) for p in run for s in p.samples]

        def render(batch_seq: int) -> bytes:
            return render_batch(
                node=self._config.node,
                batch_seq=batch_seq,
                window_start=run[0].start,
                window_end=run[-1].end,
                gpus=gpus,
                samples=samples,
                cluster=self._config.cluster,
                wire=wire,
            )

        return render

    def _close_partial(self, *, batch: _OpenBatch, until: datetime, gpus: Sequence[GpuInfo], meter: Meter) -> list[int]:
        if until <= batch.start:
            return []
        return [self._store(batch=batch, end=until, gpus=gpus, meter=meter)]

    def _store(self, *, batch: _OpenBatch, end: datetime, gpus: Sequence[GpuInfo], meter: Meter) -> int:
        window_start = batch.start
        inside = [s for s in batch.samples if s.start < end]
        energy = meter.take_energy(start=window_start, end=end)
        seq = self._spool.store_batch(
            window_start=window_start,
            window_end=end,
            render=lambda batch_seq: render_batch(
                node=self._config.node,
                batch_seq=batch_seq,
                window_start=window_start,
                window_end=end,
                gpus=gpus,
                samples=inside,
                cluster=self._config.cluster,
                energy_j=energy,
                wire=self._config.wire,
            ),
            # The per-second samples stay on the node as the audit's evidence (docs/agent.md).
            evidence=lambda batch_seq: render_batch(
                node=self._config.node, batch_seq=batch_seq, window_start=window_start, window_end=end,
                gpus=gpus, samples=inside, cluster=self._config.cluster, energy_j=energy, wire="v1",
            ),
        )
        batch.advance(to=end)
        log.info(
            "event=batch_closed batch_seq=%d window_start=%s window_end=%s samples=%d",
            seq,
            window_start.isoformat(),
            end.isoformat(),
            len(inside),
        )
        if self._on_batch is not None:
            self._on_batch(seq)
        return seq


@dataclass(slots=True)
class _OpenBatch:
    """Samples of the batch window being filled: ``[start, start + seconds)``."""

    start: datetime
    seconds: int
    samples: list[Sample] = field(default_factory=list)
    checkpointed_until: datetime | None = None  # end of the periods already in the spool's checkpoint

    @property
    def end(self) -> datetime:
        """The next multiple of ``seconds`` since the epoch: batches close on whole minutes (of 60 s
        batches), so a v2 batch holds each workload-minute once, not split between two batches."""
        into = to_us(self.start) % (self.seconds * 1_000_000)
        return self.start + timedelta(microseconds=self.seconds * 1_000_000 - into)

    def advance(self, *, to: datetime) -> None:
        self.samples = [s for s in self.samples if s.start >= to]
        self.start = to


def _rates(*, readings: Sequence[UsageReading], grants: Sequence[Grant], gpus: Sequence[GpuInfo]) -> list[Rate]:
    """Meter rates; memory granted on an overcommitted card is scaled to fit its capacity."""
    granted = {(g.gpu, g.workload.key): g for g in grants}
    capacity = {g.uuid: float(g.memory_mb) for g in gpus}
    mem_total: dict[str, float] = {}
    for g in grants:
        mem_total[g.gpu] = mem_total.get(g.gpu, 0.0) + g.mem_mb
    rates: list[Rate] = []
    for r in readings:
        grant = granted[(r.gpu, r.workload.key)]
        scale = min(1.0, capacity[r.gpu] / mem_total[r.gpu]) if mem_total[r.gpu] > 0 else 1.0
        rates.append(
            Rate(
                workload=r.workload,
                gpu=r.gpu,
                mem_used_mb=r.mem_used_mb,
                mem_granted_mb=grant.mem_mb * scale,
                sm_used=r.sm_used,
                sm_granted=grant.sm,
                pcie_mb_per_s=r.pcie_mb_per_s,
            )
        )
    return rates
