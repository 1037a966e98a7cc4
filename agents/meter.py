"""Integrates piecewise-constant rates into per-period usage samples.

Between two ``update`` calls every rate is constant, so each integral is
exact: rate x duration, split at period boundaries. Periods start at
``start + k * period_s`` (whole UTC seconds). Integrals are reported in
quanta of 2**-10 (MB·s, SM·s, MB): such numbers are exact in binary floating
point, so any server summing them (float in any order, Decimal, integers)
sees exactly the totals checked here.

Energy is per GPU, not per workload: given a GPU's cumulative energy count at each
update (``agents.interfaces.EnergyReader``), its growth since the previous update is
spread evenly over that interval (the mean power), integrated per period like the
rates, and kept per closed period (``take_energy``). A period has a GPU's energy only
when the power was known for the whole of it; a batch, only when all its periods do.

Invariants of every emitted period, per GPU:
- each used / granted integral <= capacity x period seconds;
- sum of granted integrals <= capacity x period seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from agents.batch import Sample
from agents.clock import from_us, to_us
from agents.interfaces import GpuInfo, Workload

__all__ = ["QUANTUM", "Meter", "Rate"]

QUANTUM = 2.0**-10  # resolution of every reported integral
_Q_PER_UNIT = 1024
_US_PER_S = 1_000_000
# Relative slack accepted on instantaneous granted totals (float rounding of the allocator).
_RATE_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class Rate:
    """Rates of one workload on one GPU, constant until the next update."""

    workload: Workload
    gpu: str
    mem_used_mb: float  # MiB held
    mem_granted_mb: float  # MiB granted
    sm_used: float  # SMs busy
    sm_granted: float  # SMs granted
    pcie_mb_per_s: float  # MB/s


@dataclass(slots=True)
class _Integral:
    mem_used: float = 0.0  # MB·s
    mem_granted: float = 0.0  # MB·s
    sm_used: float = 0.0  # SM·s
    sm_granted: float = 0.0  # SM·s
    pcie: float = 0.0  # MB

    def add(self, rate: Rate, seconds: float) -> None:
        self.mem_used += rate.mem_used_mb * seconds
        self.mem_granted += rate.mem_granted_mb * seconds
        self.sm_used += rate.sm_used * seconds
        self.sm_granted += rate.sm_granted * seconds
        self.pcie += rate.pcie_mb_per_s * seconds


class Meter:
    """Per-(workload, GPU) integrals over fixed metering periods."""

    def __init__(self, *, gpus: Sequence[GpuInfo], start: datetime, period_s: int = 1) -> None:
        if period_s < 1:
            raise ValueError(f"period_s must be >= 1, got {period_s}")
        start_us = to_us(start)
        if start_us % _US_PER_S:
            raise ValueError(f"meter start {start.isoformat()} is not a whole second")
        self._gpus = {g.uuid: g for g in gpus}
        self._period_s = period_s
        self._period_us = period_s * _US_PER_S
        self._start_us = start_us
        self._cursor_us = start_us  # everything before it is integrated
        self._rates: dict[tuple[str, str], Rate] = {}
        self._open: dict[tuple[str, str], tuple[Workload, _Integral]] = {}
        # Energy: the last counter reading per GPU and when, the mean power since (W), what the open period
        # has integrated (joules, µs covered), and each closed period's joules per GPU (whole periods only).
        self._energy_read: dict[str, tuple[float, int]] = {}
        self._power_w: dict[str, float] = {}
        self._open_energy: dict[str, list[float]] = {}
        self._closed_energy: dict[int, dict[str, float]] = {}

    @property
    def start(self) -> datetime:
        return from_us(self._start_us)

    @property
    def completed_until(self) -> datetime:
        """End of the last emitted period (== start before the first one)."""
        done = (self._cursor_us - self._start_us) // self._period_us
        return from_us(self._start_us + done * self._period_us)

    def update(self, *, at: datetime, rates: Iterable[Rate], energy_j: Mapping[str, float] | None = None) -> list[Sample]:
        """Integrate the current rates up to ``at``, then hold ``rates`` from ``at`` on. ``energy_j``: each
        GPU's cumulative energy count at ``at``, whose growth since the previous update is the energy of
        the interval just integrated (``None``: the backend meters no energy)."""
        self._power_w = self._mean_power(at=to_us(at), energy_j=energy_j or {})
        samples = self.advance(to=at)
        self._rates = self._validated(rates)
        return samples

    def take_energy(self, *, start: datetime, end: datetime) -> dict[str, float]:
        """Joules per GPU over ``[start, end)``, for the GPUs whose energy is known for every period of
        it; the closed periods it covers are forgotten."""
        first, last = to_us(start), to_us(end)
        periods = [p for p in sorted(self._closed_energy) if first <= p < last]
        expected = (last - first) // self._period_us
        chosen = [self._closed_energy.pop(p) for p in periods]
        if not chosen or len(chosen) != expected:
            return {}
        known = set.intersection(*(set(c) for c in chosen))
        return {uuid: sum(c[uuid] for c in chosen) for uuid in sorted(known)}

    def _mean_power(self, *, at: int, energy_j: Mapping[str, float]) -> dict[str, float]:
        """The mean power of each GPU since its previous reading; a GPU whose counter went back (a driver
        reload) or was not read before gets none for this interval."""
        power: dict[str, float] = {}
        for uuid, joules in energy_j.items():
            if uuid not in self._gpus or not math.isfinite(joules):
                continue
            previous = self._energy_read.get(uuid)
            if previous is not None and at > previous[1] and joules >= previous[0]:
                power[uuid] = (joules - previous[0]) / ((at - previous[1]) / _US_PER_S)
            self._energy_read[uuid] = (joules, at)
        return power

    def advance(self, *, to: datetime) -> list[Sample]:
        """Integrate the current rates up to ``to``; returns samples of completed periods."""
        to_us_ = max(to_us(to), self._start_us)  # nothing is metered before start
        if to_us_ < self._cursor_us:
            raise ValueError(f"time went backwards: {to.isoformat()} < {from_us(self._cursor_us).isoformat()}")
        samples: list[Sample] = []
        while self._cursor_us < to_us_:
            offset = (self._cursor_us - self._start_us) % self._period_us
            period_end = self._cursor_us - offset + self._period_us
            segment_end = min(to_us_, period_end)
            seconds = (segment_end - self._cursor_us) / _US_PER_S
            for key, rate in self._rates.items():
                self._open.setdefault(key, (rate.workload, _Integral()))[1].add(rate, seconds)
            for uuid, watts in self._power_w.items():
                integral = self._open_energy.setdefault(uuid, [0.0, 0.0])
                integral[0] += watts * seconds
                integral[1] += segment_end - self._cursor_us
            self._cursor_us = segment_end
            if segment_end == period_end:
                samples.extend(self._close_period(start_us=period_end - self._period_us))
        return samples

    def _validated(self, rates: Iterable[Rate]) -> dict[tuple[str, str], Rate]:
        by_key: dict[tuple[str, str], Rate] = {}
        granted_mem: dict[str, float] = {}
        granted_sm: dict[str, float] = {}
        for r in rates:
            gpu = self._gpus.get(r.gpu)
            if gpu is None:
                raise ValueError(f"rate for unknown GPU {r.gpu!r} ({r.workload.key})")
            key = (r.gpu, r.workload.key)
            if key in by_key:
                raise ValueError(f"two rates for {r.workload.key} on {r.gpu}")
            for name, value, cap in (
                ("mem_used_mb", r.mem_used_mb, gpu.memory_mb),
                ("mem_granted_mb", r.mem_granted_mb, gpu.memory_mb),
                ("sm_used", r.sm_used, gpu.sm_count),
                ("sm_granted", r.sm_granted, gpu.sm_count),
                ("pcie_mb_per_s", r.pcie_mb_per_s, math.inf),
            ):
                if not (math.isfinite(value) and 0 <= value <= cap * (1 + _RATE_TOLERANCE)):
                    raise ValueError(f"{name}={value!r} for {r.workload.key} on {r.gpu} outside [0, {cap}]")
            granted_mem[r.gpu] = granted_mem.get(r.gpu, 0.0) + r.mem_granted_mb
            granted_sm[r.gpu] = granted_sm.get(r.gpu, 0.0) + r.sm_granted
            by_key[key] = r
        for uuid, total in granted_mem.items():
            if total > self._gpus[uuid].memory_mb * (1 + _RATE_TOLERANCE):
                raise ValueError(f"memory granted on {uuid} sums to {total} MB > capacity")
        for uuid, total in granted_sm.items():
            if total > self._gpus[uuid].sm_count * (1 + _RATE_TOLERANCE):
                raise ValueError(f"SMs granted on {uuid} sum to {total} > capacity")
        return by_key

    def _close_period(self, *, start_us: int) -> list[Sample]:
        energy, self._open_energy = self._open_energy, {}
        self._closed_energy[start_us] = {uuid: joules for uuid, (joules, covered) in energy.items()
                                         if covered >= self._period_us}
        closed, self._open = self._open, {}
        by_gpu: dict[str, list[tuple[Workload, _Integral]]] = {}
        for (gpu_uuid, _), entry in sorted(closed.items()):
            by_gpu.setdefault(gpu_uuid, []).append(entry)
        samples: list[Sample] = []
        start = from_us(start_us)
        for uuid, entries in by_gpu.items():
            gpu = self._gpus[uuid]
            mem_cap = gpu.memory_mb * self._period_s * _Q_PER_UNIT  # quanta
            sm_cap = gpu.sm_count * self._period_s * _Q_PER_UNIT
            mem_granted = _fit_total([_quanta(i.mem_granted, mem_cap) for _, i in entries], mem_cap)
            sm_granted = _fit_total([_quanta(i.sm_granted, sm_cap) for _, i in entries], sm_cap)
            for index, (workload, integral) in enumerate(entries):
                samples.append(
                    Sample(
                        start=start,
                        seconds=self._period_s,
                        gpu=uuid,
                        workload=workload,
                        mem_used_mb_s=_quanta(integral.mem_used, mem_cap) / _Q_PER_UNIT,
                        mem_granted_mb_s=mem_granted[index] / _Q_PER_UNIT,
                        sm_used_s=_quanta(integral.sm_used, sm_cap) / _Q_PER_UNIT,
                        sm_granted_s=sm_granted[index] / _Q_PER_UNIT,
                        pcie_mb=_quanta(integral.pcie, None) / _Q_PER_UNIT,
                    )
                )
        return samples


def _quanta(value: float, cap: int | None) -> int:
    """Nearest whole number of quanta, clipped to ``[0, cap]``."""
    q = max(0, round(value * _Q_PER_UNIT))
    return q if cap is None else min(q, cap)


def _fit_total(values: list[int], cap: int) -> list[int]:
    """Take rounding excess off the largest values so that ``sum(values) <= cap``."""
    values = list(values)
    while (excess := sum(values) - cap) > 0:
        largest = max(range(len(values)), key=lambda i: (values[i], -i))
        values[largest] -= min(excess, values[largest])
    return values
