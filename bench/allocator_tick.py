"""Allocation tick benchmark: one GPU's decision latency for 4, 16 and 64 workloads, prediction included.

    python bench/allocator_tick.py [--sizes 4 16 64] [--ticks 20000] [--predictor-ticks 3000] [--seed 1]
                                   [--write-docs]

What is timed, per tick, on one A100-80GB (81,920 MiB, 108 SMs; PCIe taken as 25,000 MB/s,
Gen4 x16 in practice):

- ``allocate_columns``: the decision itself, memory + SMs + PCIe, from ready columns (what
  the agent hands the allocator; ``allocate_gpu`` is the same over ``WorkloadState``s);
- ``agent round``: ``agents.allocation.compute_grants`` for that GPU, i.e. what the agent
  pays every tick: ``UsageReading`` -> prediction -> columns (validated) ->
  ``allocate_columns`` -> ``Grant``s (PCIe unconstrained there, as in the agent), the predictions
  served from the pool (a dict look-up, no model);
- ``agent round + <predictor>``: the same round with the agent's own predictors, built as
  ``vgpu-agent run --predictor <name>`` builds them (``agents.prediction.agent_predictor``, each
  with its own headroom), fed a new reading per workload every tick, 500 ms apart, plus their
  ``observe`` (the loop calls it every tick): ``current-use`` (the baseline: no model),
  ``margin`` (the shipped default, ``vgpu-agent run`` with no flags: the last minute's peak x a
  margin calibrated toward the SLA tier's miss targets), ``last-value``, ``lstm`` (the
  calibrated LSTM for memory, last value + margin for SMs, online calibration on), and ``lstm,
  one workload at a time``: the lstm predictor behind a plain ``Predictor``, so that
  ``compute_grants`` asks reading by reading and each workload's LSTM runs its own
  ``lstm_forward`` (how the agent predicted before the batched pass). Both lstm rows are
  checked to grant the same on the same ticks.
- start-up: a fresh interpreter importing ``agents.__main__``, then the default predictor's
  first tick in that process against its later ticks, and which compilers or tensor
  libraries are loaded by then (none: no JIT or compile step at start).

Inputs are contended on purpose (the slow path: demand above capacity on every resource,
memory in use below the card so that growth is settled by weight), with predictions at
0.5/1/2 s, guarantees on a third of the workloads and one in eight tenants throttled. A
pool of 64 different inputs per size is cycled through, so no tick repeats the previous one.

Wall time (perf_counter) and the thread's CPU time (thread_time) are recorded per tick: on a
shared machine the wall-clock tail is mostly time spent descheduled, the CPU time is what
the tick costs. A third table times the water-filling of one resource in plain Python
against the same algorithm in numpy, on the same inputs, to back the choice of loops.

A benchmark is not a test: it reports numbers and never fails on speed. ``--write-docs``
replaces the "## Tick latency" section of docs/allocation.md and the tick-latency table of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import platform
import random
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agents.allocation import AllocationRound, Policy, compute_grants  # noqa: E402 - after the path fix above
from agents.collection import TickCollector  # noqa: E402 - after the path fix above
from agents.interfaces import Entitlement, GpuInfo, Prediction, Predictor, UsageReading, Workload  # noqa: E402 - after the path fix above
from agents.prediction import (  # noqa: E402 - after the path fix above
    DEFAULT_HEADROOM,
    DEFAULT_PREDICTOR,
    PREDICTOR_CHOICES,
    MarginPredictor,
    PredictorChoice,
    WorkloadPredictors,
    agent_predictor,
)
from allocator import (  # noqa: E402 - after the path fix above
    AllocationPolicy,
    GpuCapacity,
    GpuColumns,
    PredictedPeak,
    Resources,
    WorkloadState,
    allocate_columns,
    allocate_gpu,
)
from allocator.fairshare import _columns_of, _water_fill  # noqa: E402 - after the path fix above; private: the columns of states, the kernel timed on its own

DOCS = ROOT / "docs" / "allocation.md"
SECTION = "## Tick latency"
SUMMARY_DOCS = ROOT / "docs" / "benchmarks.md"
SUMMARY_SECTION = "### Tick latency (docs/allocation.md)"
TARGET_US = 200.0  # CPU p99 per tick at 16 workloads, prediction included (the tick's latency target)
TICK_S = 0.5
PREDICTORS = ("current-use", "margin", "last-value", "lstm", "lstm, one workload at a time")
DEFAULT = "margin"  # the row the target is about: ``vgpu-agent run`` with no flags
AUTOMATIC = f"agent round + {DEFAULT}, automatic collection"  # the default without the agent's TickCollector
assert DEFAULT == DEFAULT_PREDICTOR
GPU = GpuInfo(uuid="GPU-bench", model="NVIDIA A100-SXM4-80GB", memory_mb=81_920, sm_count=108)
CAPACITY = GpuCapacity(mem_mb=81_920.0, sm=108.0, pcie_mbps=25_000.0)
POOL = 64  # different inputs per size, cycled
TIERS = (("gold", 4.0), ("silver", 2.0), ("bronze", 1.0), ("best-effort", 0.5))
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Tick:
    states: list[WorkloadState]
    columns: GpuColumns  # the states as the allocator's columns
    readings: list[UsageReading]
    peaks: dict[str, Prediction]


class _PoolPredictor:
    """Serves the pool's 2 s peaks to the agent round (a dict look-up, no model)."""

    def __init__(self) -> None:
        self.peaks: dict[str, Prediction] = {}

    def predict(self, *, reading: UsageReading, now: datetime) -> Prediction:
        return self.peaks[reading.workload.key]


class _OneByOne:
    """A plain ``Predictor`` in front of the default one: ``compute_grants`` then asks reading by reading."""

    def __init__(self, inner: WorkloadPredictors) -> None:
        self.inner = inner

    def predict(self, *, reading: UsageReading, now: datetime) -> Prediction:
        return self.inner.predict(reading=reading, now=now)


def _kind(name: str) -> PredictorChoice:
    """The ``--predictor`` choice a row runs (both lstm rows run ``lstm``)."""
    kind = "lstm" if name.startswith("lstm") else name
    if kind not in PREDICTOR_CHOICES:
        raise ValueError(f"no predictor {name!r}")
    return cast(PredictorChoice, kind)


def make_predictor(name: str, policy: Policy) -> tuple[Predictor, WorkloadPredictors | MarginPredictor | None]:
    """The predictor ``compute_grants`` gets and the ``TickObserver`` to call after it (None: none)."""
    predictor = agent_predictor(_kind(name), gpus=[GPU], targets=policy.miss_target_for)
    if name == "lstm, one workload at a time":
        assert isinstance(predictor, WorkloadPredictors)
        return _OneByOne(predictor), predictor
    return predictor, predictor if isinstance(predictor, WorkloadPredictors | MarginPredictor) else None


def make_tick(rng: random.Random, n: int) -> Tick:
    """One contended GPU: memory in use ~70 % of the card, SM and PCIe demand ~1.5x capacity."""
    states: list[WorkloadState] = []
    readings: list[UsageReading] = []
    peaks: dict[str, Prediction] = {}
    mem_each = 0.70 * CAPACITY.mem_mb / n
    sm_each = 1.5 * CAPACITY.sm / n
    pcie_each = 1.5 * 25_000.0 / n
    for i in range(n):
        tier, weight = TIERS[rng.randrange(len(TIERS))]
        tenant = f"tenant-{rng.randrange(8)}"
        current = Resources(
            mem_mb=mem_each * rng.uniform(0.5, 1.5),
            sm=sm_each * rng.uniform(0.2, 1.8),
            pcie_mbps=pcie_each * rng.uniform(0.0, 2.0),
        )
        predicted = tuple(
            PredictedPeak(
                horizon_s=h,
                peak=Resources(
                    mem_mb=current.mem_mb * rng.uniform(0.9, 1.6),
                    sm=current.sm * rng.uniform(0.8, 1.5),
                    pcie_mbps=current.pcie_mbps * rng.uniform(0.8, 1.5),
                ),
            )
            for h in (0.5, 1.0, 2.0)
        )
        guaranteed = i % 3 == 0
        guarantee = Resources(mem_mb=mem_each * 0.8, sm=sm_each * 0.3) if guaranteed else Resources()
        workload = Workload(
            tenant=tenant, namespace="bench", pod=f"pod-{i}", container="main", pod_uid=f"uid-{i}", sla_tier=tier
        )
        states.append(
            WorkloadState(
                key=workload.key,
                weight=weight,
                current=current,
                predicted=predicted,
                guarantee=guarantee,
                throttled=tenant == "tenant-0",
            )
        )
        readings.append(
            UsageReading(
                workload=workload,
                gpu=GPU.uuid,
                mem_used_mb=current.mem_mb,
                sm_used=current.sm,
                pcie_mb_per_s=current.pcie_mbps,
                entitlement=Entitlement(guarantee_mem_mb=guarantee.mem_mb, guarantee_sm=guarantee.sm),
            )
        )
        top = predicted[-1].peak
        peaks[workload.key] = Prediction(mem_peak_mb=top.mem_mb, sm_peak=top.sm)
    columns = _columns_of(sorted(states, key=lambda s: s.key), AllocationPolicy().horizons_s)
    return Tick(states=states, columns=columns, readings=readings, peaks=peaks)


@dataclass(frozen=True, slots=True)
class Timing:
    wall_p50_us: float
    wall_p99_us: float
    cpu_p50_us: float
    cpu_p99_us: float
    mean_us: float
    # CPU of the loop's collection after each tick (agents.collection), untimed in the tick; NaN: not run
    between_p50_us: float = math.nan
    between_p99_us: float = math.nan


def measure(run: Callable[[int], object], ticks: int, *, collected: bool = True) -> Timing:
    """``run`` timed per tick as the agent's loop runs it: with ``collected``, inside a
    ``TickCollector`` (no automatic collection in the tick, the loop's collection after it, timed
    apart); without, under Python's automatic collection (the baseline)."""
    if not collected:
        return _measure(run, ticks, between=None)
    # The bench runs its ticks back to back; the agent's loop runs them TICK_S apart, and the
    # collector reads the minute between its full passes on that clock: one every 120 ticks.
    paced = itertools.count()
    with TickCollector(now=lambda: next(paced) * TICK_S) as collector:
        return _measure(run, ticks, between=collector.between_ticks)


def _measure(run: Callable[[int], object], ticks: int, *, between: Callable[[], None] | None) -> Timing:
    for i in range(min(ticks, 2000)):  # warm-up: specialisation, caches
        run(i)
        if between is not None:
            between()
    wall: list[int] = []
    cpu: list[int] = []
    after: list[int] = []
    perf, thread = time.perf_counter_ns, time.thread_time_ns
    for i in range(ticks):
        c0, w0 = thread(), perf()
        run(i)
        w1, c1 = perf(), thread()
        wall.append(w1 - w0)
        cpu.append(c1 - c0)
        if between is not None:
            between()
            after.append(thread() - c1)
    return Timing(
        wall_p50_us=_pct(wall, 50),
        wall_p99_us=_pct(wall, 99),
        cpu_p50_us=_pct(cpu, 50),
        cpu_p99_us=_pct(cpu, 99),
        mean_us=statistics.fmean(wall) / 1000,
        between_p50_us=_pct(after, 50) if after else math.nan,
        between_p99_us=_pct(after, 99) if after else math.nan,
    )


def _pct(values_ns: Sequence[int], q: int) -> float:
    ordered = sorted(values_ns)
    return ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)] / 1000


def water_fill_numpy(available: float, caps: FloatArray, weights: FloatArray) -> FloatArray:
    """The allocator's water-filling, vectorised: same order, same saturation rule."""
    if caps.sum() <= available:
        return caps.copy()
    ratios = caps / weights
    order = np.argsort(ratios, kind="stable")
    c, w, r = caps[order], weights[order], ratios[order]
    weight_from = np.cumsum(w[::-1])[::-1]
    remaining = np.maximum(0.0, available - np.concatenate(([0.0], np.cumsum(c)[:-1])))
    saturated = r * weight_from <= remaining
    k = int(np.argmin(saturated)) if not saturated.all() else len(c)
    shares = c.copy()
    if k < len(c):
        shares[k:] = np.minimum(c[k:], remaining[k] / weight_from[k] * w[k:])
    out = np.empty_like(shares)
    out[order] = shares
    return out


def run_benchmark(
    sizes: Sequence[int], ticks: int, seed: int, *, predictor_ticks: int
) -> dict[str, list[tuple[int, Timing]]]:
    rng = random.Random(seed)
    policy = AllocationPolicy()
    agent_policy = Policy(throttled_tenants=frozenset({"tenant-0"}), headroom=policy.headroom)
    now = datetime(2026, 11, 30, tzinfo=UTC)
    results: dict[str, list[tuple[int, Timing]]] = {
        "allocate_columns": [],
        "agent round": [],
        **{f"agent round + {name}": [] for name in PREDICTORS},
        AUTOMATIC: [],
        "python": [],
        "numpy": [],
    }
    for n in sizes:
        pool = [make_tick(rng, n) for _ in range(POOL)]

        def decide(i: int, pool: list[Tick] = pool) -> object:
            return allocate_columns(capacity=CAPACITY, columns=pool[i % POOL].columns, policy=policy)

        predictor = _PoolPredictor()

        def agent_round(i: int, pool: list[Tick] = pool, predictor: _PoolPredictor = predictor) -> object:
            tick = pool[i % POOL]
            predictor.peaks = tick.peaks
            return compute_grants(gpus=[GPU], readings=tick.readings, policy=agent_policy, predictor=predictor, now=now)

        results["allocate_columns"].append((n, measure(decide, ticks)))
        results["agent round"].append((n, measure(agent_round, ticks)))
        for name in PREDICTORS:
            results[f"agent round + {name}"].append(
                (n, measure(_predicted_round(pool, name, agent_policy, now), predictor_ticks))
            )
        # The baseline of the collection's rule: the default under Python's own automatic collection.
        results[AUTOMATIC].append(
            (n, measure(_predicted_round(pool, DEFAULT, agent_policy, now), predictor_ticks, collected=False))
        )
        _check_batched_equals_one_by_one(pool, agent_policy, now, n=n)

        fills = [
            ([s.current.sm * 1.2 for s in t.states], [s.weight for s in t.states]) for t in pool
        ]  # SM burst phase inputs
        arrays = [(np.array(c), np.array(w)) for c, w in fills]
        for (c, w), (ca, wa) in zip(fills, arrays, strict=True):
            expected = _water_fill(available=CAPACITY.sm, caps=c, weights=w)
            got = water_fill_numpy(CAPACITY.sm, ca, wa)
            if not np.allclose(expected, got, rtol=1e-9, atol=1e-9):
                raise RuntimeError(f"numpy water-fill disagrees with the allocator at n={n}")

        def fill_python(i: int, fills: list[tuple[list[float], list[float]]] = fills) -> object:
            caps, weights = fills[i % POOL]
            return _water_fill(available=CAPACITY.sm, caps=caps, weights=weights)

        def fill_numpy(i: int, arrays: list[tuple[FloatArray, FloatArray]] = arrays) -> object:
            caps, weights = arrays[i % POOL]
            return water_fill_numpy(CAPACITY.sm, caps, weights)

        results["python"].append((n, measure(fill_python, ticks)))
        results["numpy"].append((n, measure(fill_numpy, ticks)))
        # Make sure the agent round and the bare decision agree on this pool's grants.
        check = pool[0]
        predictor.peaks = check.peaks
        agent = compute_grants(gpus=[GPU], readings=check.readings, policy=agent_policy, predictor=predictor, now=now)
        bare = allocate_gpu(
            capacity=GpuCapacity(mem_mb=CAPACITY.mem_mb, sm=CAPACITY.sm),
            workloads=[_only_2s(s) for s in check.states],
            policy=policy,
        )
        for g in agent.grants:
            if not (
                math.isclose(g.mem_mb, bare.memory.grants[g.workload.key], rel_tol=1e-12)
                and math.isclose(g.sm, bare.sm.grants[g.workload.key], rel_tol=1e-12, abs_tol=1e-12)
            ):
                raise RuntimeError(f"agent round and allocate_gpu disagree for {g.workload.key} at n={n}")
    return results


def _predicted_round(pool: list[Tick], name: str, policy: Policy, start: datetime) -> Callable[[int], object]:
    """The k-th call (warm-up included, so time only moves forward): pool input ``k mod POOL`` at
    ``start + k × 500 ms``, through the named predictor with the headroom the agent gives it."""
    policy = replace(policy, headroom=DEFAULT_HEADROOM[_kind(name)])
    predictor, observer = make_predictor(name, policy)
    calls = itertools.count()

    def run(_i: int) -> object:
        k = next(calls)
        tick = pool[k % POOL]
        now = start + timedelta(seconds=TICK_S * k)
        result = compute_grants(gpus=[GPU], readings=tick.readings, policy=policy, predictor=predictor, now=now)
        if observer is not None:
            observer.observe(grants=result.grants, readings=tick.readings)
        return result

    return run


def _check_batched_equals_one_by_one(pool: list[Tick], policy: Policy, start: datetime, *, n: int) -> None:
    """The batched LSTM pass and the one-at-a-time path must grant the same (to rounding) on the same ticks."""
    batched, one_by_one = _predicted_round(pool, "lstm", policy, start), _predicted_round(
        pool, "lstm, one workload at a time", policy, start
    )
    for i in range(2 * POOL):
        a, b = batched(i), one_by_one(i)
        assert isinstance(a, AllocationRound)
        assert isinstance(b, AllocationRound)
        for x, y in zip(a.grants, b.grants, strict=True):
            if not (
                x.workload == y.workload
                and math.isclose(x.mem_mb, y.mem_mb, rel_tol=1e-9, abs_tol=1e-9)
                and math.isclose(x.sm, y.sm, rel_tol=1e-9, abs_tol=1e-9)
            ):
                raise RuntimeError(f"batched and one-by-one LSTM grant differently for {x.workload.key} at n={n}")


def _only_2s(state: WorkloadState) -> WorkloadState:
    """The agent's view of a workload: one peak, the 2 s one (``Predictor`` returns one)."""
    return WorkloadState(
        key=state.key,
        weight=state.weight,
        current=state.current,
        predicted=(state.predicted[-1],),
        guarantee=state.guarantee,
        limit=state.limit,
        throttled=state.throttled,
    )


def machine() -> list[str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass  # not Linux: the CPU line says unknown
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return [
        f"- cores: {os.cpu_count()} ({cpu}), shared with other work",
        f"- load average (1/5/15 min) at the start: {load}",
        f"- Python {platform.python_version()} ({platform.python_implementation()}), numpy {np.__version__}, "
        f"{platform.system()} {platform.release()}",
    ]


def _row(n: int, what: str, t: Timing) -> str:
    return (
        f"| {n} | `{what}` | {t.wall_p50_us:.1f} | {t.wall_p99_us:.1f} | {t.cpu_p50_us:.1f} | "
        f"{t.cpu_p99_us:.1f} | {t.mean_us:.1f} |"
    )


_HEADER = [
    "| workloads on the GPU | what | wall p50 | wall p99 | CPU p50 | CPU p99 | mean |",
    "|---:|---|---:|---:|---:|---:|---:|",
]


def prediction_table(results: dict[str, list[tuple[int, Timing]]]) -> list[str]:
    """The agent round per predictor; the default against the baseline and the target, and the
    batched LSTM against one workload at a time (CPU p50 ratios)."""
    lines = list(_HEADER)
    for name in PREDICTORS:
        for n, t in results[f"agent round + {name}"]:
            lines.append(_row(n, f"+ {name}" + (" (default)" if name == DEFAULT else ""), t))
    for n, t in results[AUTOMATIC]:
        lines.append(_row(n, f"+ {DEFAULT} (default), automatic collection", t))
    lines += [
        "",
        f"| workloads | {DEFAULT} / current-use (CPU p50) | lstm / {DEFAULT} (CPU p50) | "
        f"one at a time / lstm (CPU p50) | automatic collection / collected between ticks (CPU p99) | "
        f"collection between ticks, CPU p50 / p99 | {DEFAULT} (default) CPU p99 against the {TARGET_US:.0f} µs target |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    base = dict(results["agent round + current-use"])
    lstm = dict(results["agent round + lstm"])
    one = dict(results["agent round + lstm, one workload at a time"])
    automatic = dict(results[AUTOMATIC])
    for n, t in results[f"agent round + {DEFAULT}"]:
        verdict = "met" if t.cpu_p99_us <= TARGET_US else f"not met: {t.cpu_p99_us / TARGET_US:.2f}× the target"
        lines.append(
            f"| {n} | {t.cpu_p50_us / base[n].cpu_p50_us:.2f}× | {lstm[n].cpu_p50_us / t.cpu_p50_us:.1f}× | "
            f"{one[n].cpu_p50_us / lstm[n].cpu_p50_us:.1f}× | {automatic[n].cpu_p99_us / t.cpu_p99_us:.2f}× | "
            f"{t.between_p50_us:.1f} / {t.between_p99_us:.1f} µs | {verdict} |"
        )
    return lines


@dataclass(frozen=True, slots=True)
class StartUp:
    import_s: float  # median seconds to import agents.__main__ in a fresh interpreter
    first_tick_us: float  # the default predictor's first tick in a fresh process, CPU
    later_tick_us: float  # the median of its next ticks, CPU
    heavy_modules: tuple[str, ...]  # compilers and tensor libraries loaded by then (none expected)


_HEAVY = ("torch", "numba", "jax", "tensorflow", "onnxruntime", "llvmlite", "triton")
_START_UP = f"""
import json, sys, time
t0 = time.perf_counter()
import agents.__main__
imported = time.perf_counter() - t0
from bench.allocator_tick import DEFAULT, POOL, make_tick, _predicted_round
from agents.allocation import Policy
import random
from datetime import UTC, datetime
pool = [make_tick(random.Random(1), 16) for _ in range(POOL)]
run = _predicted_round(pool, DEFAULT, Policy(), datetime(2026, 11, 30, tzinfo=UTC))
ticks = []
for i in range(41):
    c0 = time.thread_time_ns(); run(i); ticks.append(time.thread_time_ns() - c0)
later = sorted(ticks[1:])[len(ticks) // 2]
heavy = [m for m in {_HEAVY!r} if m in sys.modules]
print(json.dumps([imported, ticks[0] / 1000, later / 1000, heavy]))
"""


def measure_start_up(repeats: int = 5) -> StartUp:
    """The agent's start: import time in fresh interpreters, and the default's first tick against its next ones."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", _START_UP], check=True, env=env, capture_output=True, text=True, cwd=ROOT
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return StartUp(
        import_s=statistics.median(r[0] for r in runs),
        first_tick_us=statistics.median(r[1] for r in runs),
        later_tick_us=statistics.median(r[2] for r in runs),
        heavy_modules=tuple(sorted({m for r in runs for m in r[3]})),
    )


def start_up_lines(start: StartUp) -> list[str]:
    heavy = ", ".join(start.heavy_modules) if start.heavy_modules else "none"
    return [
        "| agent start | value |",
        "|---|---:|",
        f"| `import agents.__main__` in a fresh interpreter (median of 5) | {start.import_s * 1000:.0f} ms |",
        f"| the default's first tick at 16 workloads, CPU (median of 5 processes) | {start.first_tick_us:.0f} µs |",
        f"| its later ticks, CPU (median) | {start.later_tick_us:.0f} µs |",
        f"| compilers or tensor libraries loaded ({', '.join(_HEAVY)}) | {heavy} |",
    ]


def render(
    results: dict[str, list[tuple[int, Timing]]],
    *,
    start: StartUp,
    command: str,
    ticks: int,
    predictor_ticks: int,
    started: datetime,
) -> str:
    lines = [
        SECTION,
        "",
        f"Measured {started:%Y-%m-%d %H:%M} UTC with",
        "",
        "```",
        command,
        "```",
        "",
        "Machine:",
        "",
        *machine(),
        "",
        f"µs per tick, after a warm-up: {ticks:,} ticks per row for the decision alone, {predictor_ticks:,} per",
        "row with a predictor. Wall = perf_counter around the call; CPU = the thread's CPU time (what",
        "the tick costs when it is not descheduled). Target: CPU p99 ≤ 200 µs per tick at",
        "16 workloads on one GPU, prediction included.",
        "",
        "The decision, and the round with the predictions served from a dict (no model):",
        "",
        *_HEADER,
    ]
    for what in ("allocate_columns", "agent round"):
        for n, t in results[what]:
            lines.append(_row(n, what, t))
    lines += [
        "",
        "The round with the agent's predictors as `vgpu-agent run --predictor NAME` builds them, each with",
        "its own headroom (a new reading per workload every tick, 500 ms apart, and the predictor's",
        f"`observe`); `{DEFAULT}` is the default, `current-use` the baseline without a model, `one workload",
        "at a time` the lstm predictor asked reading by reading, as before the batched pass (same run,",
        "same inputs):",
        "",
        *prediction_table(results),
        "",
        "The agent's start (fresh processes): the default loads no model and compiles nothing; its",
        "first tick pays only Python's and numpy's first calls, so a restarted agent meters and",
        "reserves from its first second (tests/agents/test_cli.py checks the reservation):",
        "",
        *start_up_lines(start),
        "",
        "Water-filling of one resource (the SM burst phase, same inputs), plain Python against numpy:",
        "",
        "| workloads | Python p50 | numpy p50 | numpy / Python |",
        "|---:|---:|---:|---:|",
    ]
    for (n, py), (_, npy) in zip(results["python"], results["numpy"], strict=True):
        lines.append(f"| {n} | {py.wall_p50_us:.1f} | {npy.wall_p50_us:.1f} | {npy.wall_p50_us / py.wall_p50_us:.2f} |")
    return "\n".join(lines) + "\n"


def render_summary(
    results: dict[str, list[tuple[int, Timing]]], *, start: StartUp, command: str, started: datetime
) -> str:
    """The docs/benchmarks.md mirror: the round with each predictor, and the verdict on the target."""
    return "\n".join(
        [
            SUMMARY_SECTION,
            "",
            f"Measured {started:%Y-%m-%d %H:%M} UTC:",
            "",
            "```",
            command,
            "```",
            "",
            "µs per tick on one GPU; the analysis and the decision-only rows are in docs/allocation.md.",
            "",
            *prediction_table(results),
            "",
            *start_up_lines(start),
        ]
    ) + "\n"


def _replace_section(path: Path, heading: str, section: str, *, default: str) -> None:
    """Replace ``heading`` and its text up to the next heading of the same or a higher level."""
    text = path.read_text() if path.exists() else default
    level = len(heading) - len(heading.lstrip("#"))
    stop = "|".join("#" * k + " " for k in range(1, level + 1))
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^(?:{stop})|\Z)", re.MULTILINE | re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")


def write_docs(section: str, summary: str) -> None:
    _replace_section(DOCS, SECTION, section, default="# Allocation\n")
    _replace_section(SUMMARY_DOCS, SUMMARY_SECTION, summary, default="# Benchmarks\n")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 16, 64], help="workloads on the GPU")
    parser.add_argument("--ticks", type=int, default=20_000, help="timed ticks per row of the decision alone")
    parser.add_argument("--predictor-ticks", type=int, default=3_000, help="timed ticks per row with a predictor")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--write-docs", action="store_true", help=f"replace '{SECTION}' in {DOCS.name}")
    args = parser.parse_args(argv)
    if args.ticks < 100 or args.predictor_ticks < 100 or any(n < 1 for n in args.sizes):
        parser.error("--ticks and --predictor-ticks must be >= 100 and every size >= 1")
    started = datetime.now(UTC)
    command = "python bench/allocator_tick.py " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    gc.collect()
    results = run_benchmark(args.sizes, args.ticks, args.seed, predictor_ticks=args.predictor_ticks)
    start = measure_start_up()
    section = render(
        results,
        start=start,
        command=command.strip(),
        ticks=args.ticks,
        predictor_ticks=args.predictor_ticks,
        started=started,
    )
    print(section)
    if args.write_docs:
        write_docs(section, render_summary(results, start=start, command=command.strip(), started=started))
        print(f"wrote {DOCS.relative_to(ROOT)} and {SUMMARY_DOCS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
