"""The ``watchdog`` enforcer: use above grant for too long -> evict the pod or signal its processes.

Fed every tick with the grants and the readings (NVML per-process use,
attributed to workloads). A workload is *over* when, on any GPU, its use
exceeds grant x (1 + tolerance) for a checked resource (memory by default:
memory cannot be taken back from a process, SM time can). The grant is capped at
the workload's limit (``Entitlement.limit_mem_mb`` / ``limit_sm``): the allocator
never grants memory below use, so a memory excess is use above the limit. An offence starts at
the first tick that is over (event ``watchdog.over_grant``) and lasts while
every tick is over; once it has lasted ``grace_s`` the watchdog acts, once:

- ``evict``: ``evict(namespace=, pod=, reason=, message=, pod_uid=)`` (the Kubernetes
  Eviction API, which honours PodDisruptionBudgets); event ``watchdog.evicted``, or
  ``watchdog.evict_failed`` (an error, or refused by a disruption budget) and another
  attempt after ``grace_s``.
- ``signal``: SIGTERM to each of the workload's processes (``watchdog.sigterm``),
  then SIGKILL to those still alive ``kill_grace_s`` later (``watchdog.sigkill``).
  A process is identified by PID *and* start time (``/proc/<pid>/stat``), so a
  recycled PID is never killed.

A tick that is within the grant ends the offence (``watchdog.within_grant``);
the next excess starts a new one. Reaction time is ``grace_s`` plus up to one
tick (the excess is seen at tick granularity).
"""

from __future__ import annotations

import enum
import logging
import math
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agents.events import EmitEvent, Event
from agents.interfaces import Clock, Grant, UsageReading, Workload

__all__ = [
    "EVICTION_REASON",
    "Evict",
    "ProcessTable",
    "WatchdogAction",
    "WatchdogEnforcer",
    "WatchdogPolicy",
    "proc_start_time",
]

log = logging.getLogger(__name__)

ProcessTable = Callable[[Workload], Sequence[int]]
"""Host PIDs of a workload's GPU processes (the loop builds it from NVML processes + attribution)."""


class Evict(Protocol):
    """Evicts a pod: ``agents.kube.KubernetesPods.evict`` fits as it is.

    The answer may be an outcome whose ``value`` is ``"evicted"``, ``"refused"`` (a
    PodDisruptionBudget forbids it now: tried again later) or ``"gone"`` (the pod no
    longer exists), as ``agents.kube.EvictionOutcome``; any other answer means evicted.
    """

    def __call__(
        self, *, namespace: str, pod: str, reason: str, message: str, pod_uid: str | None = None
    ) -> object: ...


EVICTION_REASON = "GpuUseAboveGrant"  # the Kubernetes Event reason (CamelCase, as the kubelet's)


class WatchdogAction(enum.Enum):
    EVICT = "evict"
    SIGNAL = "signal"


@dataclass(frozen=True, slots=True)
class WatchdogPolicy:
    action: WatchdogAction = WatchdogAction.EVICT
    tolerance: float = 0.1  # over when use > grant x (1 + tolerance)
    grace_s: float = 30.0  # an offence must last this long before the watchdog acts
    kill_grace_s: float = 10.0  # signal: SIGKILL this long after SIGTERM if still alive
    check_mem: bool = True
    check_sm: bool = False  # SM time is preemptible; an SM excess only slows the others down

    def __post_init__(self) -> None:
        if not isinstance(self.action, WatchdogAction):
            raise ValueError(f"action must be a WatchdogAction, got {self.action!r}")
        if not (math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise ValueError(f"tolerance must be finite and >= 0, got {self.tolerance!r}")
        for name in ("grace_s", "kill_grace_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if not (self.check_mem or self.check_sm):
            raise ValueError("at least one of check_mem and check_sm must be set")


@dataclass(slots=True)
class _Offence:
    since: float  # monotonic seconds of the first tick over the grant
    acted: bool = False
    next_attempt: float | None = None  # evict: when a failed eviction is tried again
    signal_failure_reported: bool = False


@dataclass(slots=True)
class _Terminating:
    workload_key: str
    start_time: int | None  # clock ticks since boot at process start; None where /proc is absent
    sigterm_at: float


@dataclass(frozen=True, slots=True)
class _Excess:
    gpu: str
    resource: str  # "mem_mb" or "sm"
    used: float
    granted: float

    def to_json(self) -> dict[str, object]:
        return {
            "gpu": self.gpu,
            "resource": self.resource,
            "used": round(self.used, 3),
            "granted": round(self.granted, 3),
        }


def proc_start_time(pid: int, *, proc: Path = Path("/proc")) -> int | None:
    """Start time of a live process (field 22 of ``/proc/<pid>/stat``); None when gone or a zombie."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # ``comm`` (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    state, start = fields[0], fields[19]
    if state in ("Z", "X"):
        return None
    return int(start)


@dataclass
class WatchdogEnforcer:
    """Offence state machine per workload; ``observe`` once per tick."""

    policy: WatchdogPolicy
    clock: Clock
    emit: EmitEvent
    processes: ProcessTable
    evict: Evict | None = None  # required for WatchdogAction.EVICT
    kill: Callable[[int, int], None] = os.kill
    start_time: Callable[[int], int | None] = proc_start_time
    _offences: dict[str, _Offence] = field(default_factory=dict, init=False)
    _terminating: dict[int, _Terminating] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.policy.action is WatchdogAction.EVICT and self.evict is None:
            raise ValueError("the evict action needs an evict callable (agents.kube.KubernetesPods.evict)")

    def observe(self, *, grants: Sequence[Grant], readings: Sequence[UsageReading]) -> None:
        now = self.clock.monotonic()
        granted = {(g.workload.key, g.gpu): g for g in grants}
        excess: dict[str, list[_Excess]] = {}
        workloads: dict[str, Workload] = {}
        for r in readings:
            workloads[r.workload.key] = r.workload
            grant = granted.get((r.workload.key, r.gpu))
            found = excess.setdefault(r.workload.key, [])
            if grant is None:
                continue  # no grant this tick (the allocation skipped it): nothing to compare with
            found.extend(self._excess(r, grant))
        for key, items in sorted(excess.items()):
            if items:
                self._over(workloads[key], items, now)
            elif key in self._offences:
                self._within(workloads[key], now)
        for key in [k for k in self._offences if k not in excess]:
            del self._offences[key]  # the workload is gone (evicted, finished)
        self._follow_up_sigterms(now)

    def _excess(self, reading: UsageReading, grant: Grant) -> list[_Excess]:
        factor = 1.0 + self.policy.tolerance
        found = []
        # The allocator never grants memory below use (it cannot be taken back), even above
        # a workload's limit: what a workload may hold is its grant capped at its limit.
        limit = reading.entitlement
        mem_allowed = grant.mem_mb if limit.limit_mem_mb is None else min(grant.mem_mb, limit.limit_mem_mb)
        sm_allowed = grant.sm if limit.limit_sm is None else min(grant.sm, limit.limit_sm)
        if self.policy.check_mem and reading.mem_used_mb > mem_allowed * factor:
            found.append(_Excess(grant.gpu, "mem_mb", reading.mem_used_mb, mem_allowed))
        if self.policy.check_sm and reading.sm_used > sm_allowed * factor:
            found.append(_Excess(grant.gpu, "sm", reading.sm_used, sm_allowed))
        return found

    def _over(self, workload: Workload, items: list[_Excess], now: float) -> None:
        offence = self._offences.get(workload.key)
        if offence is None:
            offence = self._offences[workload.key] = _Offence(since=now)
            log.warning("event=watchdog_over_grant workload=%s", workload.key)
            self._event(
                "watchdog.over_grant",
                workload.key,
                excess=[e.to_json() for e in items],
                tolerance=self.policy.tolerance,
                grace_s=self.policy.grace_s,
                action=self.policy.action.value,
            )
        if offence.acted or now - offence.since < self.policy.grace_s:
            return
        if offence.next_attempt is not None and now < offence.next_attempt:
            return
        reason = _reason(items, self.policy)
        if self.policy.action is WatchdogAction.EVICT:
            self._evict(workload, offence, reason, items, now)
        else:
            self._sigterm(workload, offence, reason, items, now)

    def _within(self, workload: Workload, now: float) -> None:
        offence = self._offences.pop(workload.key)
        log.info("event=watchdog_within_grant workload=%s acted=%s", workload.key, offence.acted)
        self._event(
            "watchdog.within_grant",
            workload.key,
            over_for_s=round(now - offence.since, 3),
            acted=offence.acted,
        )

    def _evict(self, workload: Workload, offence: _Offence, message: str, items: list[_Excess], now: float) -> None:
        evict = self.evict
        if evict is None:
            raise RuntimeError("the evict action needs an evict callable")  # __post_init__ prevents this
        pod = f"{workload.namespace}/{workload.pod}"
        try:
            outcome = evict(
                namespace=workload.namespace,
                pod=workload.pod,
                reason=EVICTION_REASON,
                message=message,
                pod_uid=workload.pod_uid or None,
            )
        # The Kubernetes client raises its own types (ApiException, urllib3 errors): whatever
        # it is, the tick loop must go on; the failure is recorded and tried again later.
        except Exception as error:  # noqa: BLE001 - recorded with the offence; the tick goes on
            self._evict_failed(workload, offence, now, error=repr(error)[:500])
            return
        status = getattr(outcome, "value", "evicted")
        if status == "refused":
            self._evict_failed(workload, offence, now, error="refused by a PodDisruptionBudget")
            return
        offence.acted = True
        log.warning("event=watchdog_evicted workload=%s outcome=%s message=%r", workload.key, status, message)
        self._event(
            "watchdog.evicted",
            workload.key,
            pod=pod,
            outcome="pod already gone" if status == "gone" else "evicted",
            reason=message,
            over_for_s=round(now - offence.since, 3),
            excess=[e.to_json() for e in items],
        )

    def _evict_failed(self, workload: Workload, offence: _Offence, now: float, *, error: str) -> None:
        offence.next_attempt = now + max(self.policy.grace_s, 1.0)
        log.error("event=watchdog_evict_failed workload=%s error=%r", workload.key, error)
        self._event(
            "watchdog.evict_failed",
            workload.key,
            pod=f"{workload.namespace}/{workload.pod}",
            error=error,
            retry_in_s=round(offence.next_attempt - now, 3),
        )

    def _sigterm(self, workload: Workload, offence: _Offence, reason: str, items: list[_Excess], now: float) -> None:
        pids = sorted(set(self.processes(workload)))
        signalled, errors = [], []
        for pid in pids:
            start = self.start_time(pid)
            try:
                self.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue  # exited meanwhile
            except PermissionError as error:
                errors.append({"pid": pid, "error": str(error)})
                continue
            signalled.append(pid)
            self._terminating[pid] = _Terminating(workload_key=workload.key, start_time=start, sigterm_at=now)
        if not signalled:
            if not offence.signal_failure_reported:
                offence.signal_failure_reported = True
                log.error("event=watchdog_signal_failed workload=%s pids=%s", workload.key, pids)
                self._event("watchdog.signal_failed", workload.key, pids=pids, errors=errors, signal="SIGTERM")
            return  # tried again next tick: the processes may show up (or the permission be fixed)
        offence.acted = True
        log.warning("event=watchdog_sigterm workload=%s pids=%s reason=%r", workload.key, signalled, reason)
        self._event(
            "watchdog.sigterm",
            workload.key,
            pids=signalled,
            errors=errors,
            reason=reason,
            kill_grace_s=self.policy.kill_grace_s,
            over_for_s=round(now - offence.since, 3),
            excess=[e.to_json() for e in items],
        )

    def _follow_up_sigterms(self, now: float) -> None:
        for pid, term in list(self._terminating.items()):
            current = self.start_time(pid)
            if current is None or (term.start_time is not None and current != term.start_time):
                del self._terminating[pid]  # exited (or the PID now belongs to another process)
                continue
            if now - term.sigterm_at < self.policy.kill_grace_s:
                continue
            del self._terminating[pid]
            try:
                self.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            except PermissionError as error:
                log.error("event=watchdog_signal_failed pid=%d signal=SIGKILL error=%r", pid, error)
                self._event(
                    "watchdog.signal_failed", term.workload_key, pids=[pid], signal="SIGKILL", errors=[str(error)]
                )
                continue
            log.warning("event=watchdog_sigkill workload=%s pid=%d", term.workload_key, pid)
            self._event(
                "watchdog.sigkill",
                term.workload_key,
                pid=pid,
                after_sigterm_s=round(now - term.sigterm_at, 3),
            )

    def _event(self, name: str, target: str, /, **detail: object) -> None:
        self.emit(Event(at=self.clock.now(), action=name, target=target, detail=detail))


def _reason(items: list[_Excess], policy: WatchdogPolicy) -> str:
    parts = [f"{e.resource} {e.used:.1f} > granted {e.granted:.1f} on {e.gpu}" for e in items]
    return (
        f"vGPU Ledger watchdog: use above grant + {policy.tolerance:.0%} for {policy.grace_s:g} s ("
        + "; ".join(parts)
        + ")"
    )
