"""The NVML backend's readings of the load beside ``nvidia-smi``'s, and whether they agree.

Tolerances, and why:

- **Memory, backend vs ``nvidia-smi``: within ``MEMORY_TOLERANCE_MB``.** Both read the
  driver's per-process counter (``nvmlDeviceGetComputeRunningProcesses``); ``nvidia-smi``
  prints whole MiB. The load's allocation does not change while it runs, so a larger gap is
  a units or attribution error in the backend.
- **Memory vs the allocation: between the allocation and ``CONTEXT_ALLOWANCE_MB`` above
  it.** A process's device memory is its allocation plus its CUDA context (hundreds of MiB
  on current GPUs); below the allocation or far above it means the wrong unit or process.
- **SM, backend vs ``nvidia-smi``: within ``SM_TOLERANCE_POINTS``** percentage points, for
  ``pmon``'s per-process ``sm`` and for the GPU's ``utilization.gpu``. They are averaged over
  different windows (the backend: the samples since its previous read; ``pmon``: its own
  second; ``utilization.gpu``: the driver's last period), so only a loose bound is fair.
- **Busy: backend SM at least ``BUSY_MIN_PERCENT``.** The load keeps a kernel resident all
  the time, and NVML's SM utilisation is the share of time a kernel of the process ran. It
  is a share of *time*, not of SMs: a kernel on 20 of 132 SMs reads close to 100 %. Each
  round's ``SMs the load occupies`` column shows the difference the agent bills across
  (``sm_used`` = utilisation × the GPU's SM count).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BUSY_MIN_PERCENT",
    "CONTEXT_ALLOWANCE_MB",
    "MEMORY_TOLERANCE_MB",
    "SM_TOLERANCE_POINTS",
    "Check",
    "Round",
    "judge",
    "mean",
]

MEMORY_TOLERANCE_MB = 1.0
CONTEXT_ALLOWANCE_MB = 2048.0
SM_TOLERANCE_POINTS = 20.0
BUSY_MIN_PERCENT = 50.0


@dataclass(frozen=True, slots=True)
class Round:
    """One look at the running load: the backend's reading and nvidia-smi's, moments apart."""

    at_s: float  # seconds since the load said it was ready
    backend_listed: bool  # the backend had a reading for the load's PID
    backend_mem_mb: float
    backend_sm_percent: float  # the reading's sm_used as a share of the GPU's SMs
    backend_sm_used: float  # SMs, as the agent bills them
    smi_listed: bool  # --query-compute-apps listed the PID
    smi_mem_mb: float | None  # None: [N/A] or not listed
    pmon_sm_percent: float | None  # None: "-" or not listed
    gpu_util_percent: float | None


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    passed: bool | None  # None: could not be judged (the reason says why)
    detail: str


def mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def judge(rounds: Sequence[Round], *, allocated_mb: int) -> list[Check]:
    """Every check over the rounds; a check fails if any round breaks it."""
    if not rounds:
        return [Check("readings", False, "no round was taken")]
    return [
        _listed(rounds),
        _memory_agrees(rounds),
        _memory_holds_allocation(rounds, allocated_mb),
        _busy(rounds),
        _sm_agrees(rounds, "pmon sm", [r.pmon_sm_percent for r in rounds]),
        _sm_agrees(rounds, "utilization.gpu", [r.gpu_util_percent for r in rounds]),
    ]


def _listed(rounds: Sequence[Round]) -> Check:
    missing = []
    for r in rounds:
        absent = [who for who, listed in (("backend", r.backend_listed), ("nvidia-smi", r.smi_listed)) if not listed]
        if absent:
            missing.append(f"{r.at_s:.1f} s (by {' and '.join(absent)})")
    if missing:
        return Check("PID listed", False, "the load's PID was missing at " + "; ".join(missing))
    return Check("PID listed", True, f"by the backend and nvidia-smi in all {len(rounds)} rounds")


def _memory_agrees(rounds: Sequence[Round]) -> Check:
    name = f"memory within {MEMORY_TOLERANCE_MB:g} MiB of nvidia-smi"
    if all(r.smi_mem_mb is None for r in rounds):
        return Check(name, None, "nvidia-smi printed no memory for the PID ([N/A]: the driver withholds it)")
    gaps = [abs(r.backend_mem_mb - r.smi_mem_mb) for r in rounds if r.smi_mem_mb is not None]
    worst = max(gaps)
    return Check(name, worst <= MEMORY_TOLERANCE_MB, f"largest gap {worst:.1f} MiB over {len(gaps)} rounds")


def _memory_holds_allocation(rounds: Sequence[Round], allocated_mb: int) -> Check:
    name = f"memory between the allocation and {CONTEXT_ALLOWANCE_MB:g} MiB above it"
    low = min(r.backend_mem_mb for r in rounds)
    high = max(r.backend_mem_mb for r in rounds)
    ok = allocated_mb <= low and high <= allocated_mb + CONTEXT_ALLOWANCE_MB
    return Check(name, ok, f"allocated {allocated_mb} MiB; the backend read {low:.0f}..{high:.0f} MiB")


def _busy(rounds: Sequence[Round]) -> Check:
    # The first round's samples may reach back before the load started: judge the later ones.
    judged = rounds[1:] or rounds
    average = sum(r.backend_sm_percent for r in judged) / len(judged)
    return Check(
        f"busy: backend SM at least {BUSY_MIN_PERCENT:g} %",
        average >= BUSY_MIN_PERCENT,
        f"mean {average:.1f} % over {len(judged)} rounds (0 means no utilisation samples reached the backend)",
    )


def _sm_agrees(rounds: Sequence[Round], what: str, theirs: Sequence[float | None]) -> Check:
    name = f"SM within {SM_TOLERANCE_POINTS:g} points of {what}"
    judged = list(range(1, len(rounds))) or [0]
    their_mean = mean([theirs[i] for i in judged])
    if their_mean is None:
        return Check(name, None, f"nvidia-smi gave no {what} value ([N/A], [Not Supported] or '-')")
    ours = sum(rounds[i].backend_sm_percent for i in judged) / len(judged)
    gap = abs(ours - their_mean)
    return Check(name, gap <= SM_TOLERANCE_POINTS, f"backend {ours:.1f} % vs {their_mean:.1f} % (gap {gap:.1f})")
