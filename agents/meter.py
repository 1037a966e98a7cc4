"""Integrates piecewise-constant rates into per-period usage samples.

Between two ``update`` calls every rate is constant, so each integral is
exact: rate x duration, split at period boundaries. Periods start at
``start + k * period_s`` (whole UTC seconds). Integrals are reported in
quanta of 2**-10 (MB·s, SM·s, MB): such numbers are exact in binary floating
point, so any server summing them (float in any order, Decimal, integers)
sees exactly the totals checked here.

Invariants of every emitted period, per GPU:
- each used / granted integral <= capacity x period seconds;
- sum of granted integrals <= capacity x period seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
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

    @property
    def start(self) -> datetime:
        return from_us(self._start_us)

    @property
    def completed_until(self) -> datetime:
        """End of the last emitted period (== start before the first one)."""
        done = (self._cursor_us - self._start_us) // self._period_us
        return from_us(self._start_us + done * self._period_us)

    def update(self, *, at: datetime, rates: Iterable[Rate]) -> list[Sample]:
        """Integrate the current rates up to ``at``, then hold ``rates`` from ``at`` on."""
        samples = self.advance(to=at)
        self._rates = self._validated(rates)
        return samples

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
