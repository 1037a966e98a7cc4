"""The watchdog's offence state machine (fake clock), and its signals on real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.events import Event
from agents.fakes.clock import FakeClock
from agents.interfaces import Grant, UsageReading, Workload
from agents.kube import EvictionOutcome
from agents.watchdog import EVICTION_REASON, WatchdogAction, WatchdogEnforcer, WatchdogPolicy, proc_start_time

T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
GPU = "GPU-aaaa-1111"
BERT = Workload(tenant="acme", namespace="acme-prod", pod="bert-1", container="server", pod_uid="u1", sla_tier="gold")


def grant(mem_mb: float = 1000.0, sm: float = 10.0) -> Grant:
    return Grant(workload=BERT, gpu=GPU, mem_mb=mem_mb, sm=sm)


def reading(mem_used_mb: float, sm_used: float = 5.0) -> UsageReading:
    return UsageReading(workload=BERT, gpu=GPU, mem_used_mb=mem_used_mb, sm_used=sm_used, pcie_mb_per_s=0.0)


@dataclass
class Evictions:
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    failures: list[Exception] = field(default_factory=list)  # raised first, one per call

    def __call__(self, *, namespace: str, pod: str, reason: str, message: str, pod_uid: str | None = None) -> None:
        if self.failures:
            raise self.failures.pop(0)
        assert (reason, pod_uid) == (EVICTION_REASON, "u1")
        self.calls.append((namespace, pod, message))


def watchdog(
    clock: FakeClock,
    events: list[Event],
    *,
    action: WatchdogAction = WatchdogAction.EVICT,
    evict: Evictions | None = None,
    pids: list[int] | None = None,
    **policy: Any,
) -> WatchdogEnforcer:
    return WatchdogEnforcer(
        policy=WatchdogPolicy(action=action, **policy),
        clock=clock,
        emit=events.append,
        processes=lambda w: pids or [],
        evict=evict,
    )


def tick(dog: WatchdogEnforcer, clock: FakeClock, mem_used_mb: float, *, seconds: float = 0.5) -> None:
    dog.observe(grants=[grant()], readings=[reading(mem_used_mb)])
    clock.sleep(seconds)


def actions(events: list[Event]) -> list[str]:
    return [e.action for e in events]


def test_evicts_once_when_use_stays_above_grant_plus_tolerance_for_the_grace_period() -> None:
    clock, evict = FakeClock(start=T0), Evictions()
    events: list[Event] = []
    dog = watchdog(clock, events, evict=evict, tolerance=0.1, grace_s=5.0)

    for _ in range(10):  # 0.0 .. 4.5 s over: not yet
        tick(dog, clock, 1200.0)
    assert evict.calls == []
    assert actions(events) == ["watchdog.over_grant"]
    for _ in range(10):  # 5.0 s: act; afterwards the same offence never acts again
        tick(dog, clock, 1200.0)

    assert len(evict.calls) == 1
    namespace, pod, reason = evict.calls[0]
    assert (namespace, pod) == ("acme-prod", "bert-1")
    assert "mem_mb 1200.0 > granted 1000.0" in reason
    assert actions(events) == ["watchdog.over_grant", "watchdog.evicted"]
    evicted = events[1]
    assert evicted.target == BERT.key
    assert evicted.detail["over_for_s"] == 5.0
    assert evicted.at == T0 + timedelta(seconds=5)


def test_use_within_tolerance_is_not_an_offence() -> None:
    clock, evict = FakeClock(start=T0), Evictions()
    events: list[Event] = []
    dog = watchdog(clock, events, evict=evict, tolerance=0.1, grace_s=0.0)
    for _ in range(5):
        tick(dog, clock, 1100.0)  # exactly grant x 1.1
    assert events == []


def test_dropping_back_ends_the_offence_and_a_new_one_waits_a_full_grace_again() -> None:
    clock, evict = FakeClock(start=T0), Evictions()
    events: list[Event] = []
    dog = watchdog(clock, events, evict=evict, grace_s=2.0)
    for _ in range(3):
        tick(dog, clock, 1500.0)  # 1.5 s over
    tick(dog, clock, 900.0)  # back within: grace restarts
    for _ in range(4):
        tick(dog, clock, 1500.0)  # 0 .. 1.5 s of the new offence
    assert evict.calls == []
    tick(dog, clock, 1500.0)  # 2.0 s
    assert len(evict.calls) == 1
    assert actions(events) == [
        "watchdog.over_grant",
        "watchdog.within_grant",
        "watchdog.over_grant",
        "watchdog.evicted",
    ]
    assert events[1].detail == {"over_for_s": 1.5, "acted": False}


def test_sm_excess_counts_only_when_configured() -> None:
    clock, evict = FakeClock(start=T0), Evictions()
    events: list[Event] = []
    dog = watchdog(clock, events, evict=evict, grace_s=0.0)
    dog.observe(grants=[grant(sm=10.0)], readings=[reading(500.0, sm_used=50.0)])
    assert events == []

    strict = watchdog(clock, events, evict=evict, grace_s=0.0, check_sm=True)
    strict.observe(grants=[grant(sm=10.0)], readings=[reading(500.0, sm_used=50.0)])
    assert actions(events) == ["watchdog.over_grant", "watchdog.evicted"]
    assert events[0].detail["excess"] == [{"gpu": GPU, "resource": "sm", "used": 50.0, "granted": 10.0}]


def test_failed_eviction_is_recorded_and_tried_again_after_the_grace_period() -> None:
    clock = FakeClock(start=T0)
    events: list[Event] = []
    evict = Evictions(failures=[RuntimeError("429 Too Many Requests: PodDisruptionBudget")])
    dog = watchdog(clock, events, evict=evict, grace_s=2.0)
    for _ in range(5):
        tick(dog, clock, 1500.0)  # fails at 2.0 s
    assert actions(events) == ["watchdog.over_grant", "watchdog.evict_failed"]
    assert "PodDisruptionBudget" in events[1].detail["error"]
    for _ in range(4):
        tick(dog, clock, 1500.0)  # retried at 4.0 s
    assert actions(events)[-1] == "watchdog.evicted"
    assert len(evict.calls) == 1


def test_kubernetes_pods_evict_fits_and_a_budget_refusal_is_tried_again() -> None:
    class Pods:  # the signature and answers of agents.kube.KubernetesPods.evict
        def __init__(self) -> None:
            self.answers = [EvictionOutcome.REFUSED, EvictionOutcome.EVICTED]
            self.evicted: list[str] = []

        def evict(
            self, *, namespace: str, pod: str, reason: str, message: str, pod_uid: str | None = None
        ) -> EvictionOutcome:
            self.evicted.append(f"{namespace}/{pod}")
            return self.answers.pop(0)

    pods, clock = Pods(), FakeClock(start=T0)
    events: list[Event] = []
    dog = WatchdogEnforcer(
        policy=WatchdogPolicy(grace_s=1.0), clock=clock, emit=events.append, processes=lambda w: [], evict=pods.evict
    )
    for _ in range(6):
        tick(dog, clock, 5000.0)  # refused at 1.0 s, evicted at 2.0 s
    assert pods.evicted == ["acme-prod/bert-1", "acme-prod/bert-1"]
    assert actions(events) == ["watchdog.over_grant", "watchdog.evict_failed", "watchdog.evicted"]
    assert events[1].detail["error"] == "refused by a PodDisruptionBudget"
    assert events[2].at == T0 + timedelta(seconds=2)


def test_a_pod_already_gone_counts_as_evicted() -> None:
    clock = FakeClock(start=T0)
    events: list[Event] = []

    def evict(*, namespace: str, pod: str, reason: str, message: str, pod_uid: str | None = None) -> EvictionOutcome:
        return EvictionOutcome.GONE

    dog = WatchdogEnforcer(
        policy=WatchdogPolicy(grace_s=0.0), clock=clock, emit=events.append, processes=lambda w: [], evict=evict
    )
    for _ in range(3):
        tick(dog, clock, 5000.0)
    assert actions(events) == ["watchdog.over_grant", "watchdog.evicted"]
    assert events[1].detail["outcome"] == "pod already gone"


def test_evict_policy_needs_an_evict_callable() -> None:
    with pytest.raises(ValueError, match="evict callable"):
        WatchdogEnforcer(policy=WatchdogPolicy(), clock=FakeClock(start=T0), emit=print, processes=lambda w: [])


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(st.booleans(), st.sampled_from([0.1, 0.5, 1.0, 2.5])), min_size=1, max_size=60),
    grace_s=st.sampled_from([0.0, 1.0, 3.0]),
)
def test_watchdog_never_acts_before_grace_acts_once_per_offence_and_resets(
    steps: list[tuple[bool, float]], grace_s: float
) -> None:
    clock, evict = FakeClock(start=T0), Evictions()
    events: list[Event] = []
    dog = watchdog(clock, events, evict=evict, grace_s=grace_s)
    run_start: float | None = None  # reference model: when the current run of over-ticks began
    expected_evictions = 0
    acted_in_run = False
    for over, dt in steps:
        now = clock.monotonic()
        before = len(evict.calls)
        dog.observe(grants=[grant()], readings=[reading(2000.0 if over else 500.0)])
        acted = len(evict.calls) - before
        if over:
            run_start = now if run_start is None else run_start
            due = now - run_start >= grace_s and not acted_in_run
            assert acted == (1 if due else 0), f"at {now}: run began {run_start}, grace {grace_s}"
            if due:
                acted_in_run = True
                expected_evictions += 1
        else:
            assert acted == 0
            run_start, acted_in_run = None, False
        clock.sleep(dt)
    assert len(evict.calls) == expected_evictions
    assert actions(events).count("watchdog.evicted") == expected_evictions


# -- signals, on real child processes ---------------------------------------------------------------


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    spawned: list[subprocess.Popen[str]] = []
    yield spawned
    for child in spawned:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)


def spawn(children: list[subprocess.Popen[str]], *, ignore_sigterm: bool) -> subprocess.Popen[str]:
    code = "import signal, sys, time\n"
    if ignore_sigterm:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(60)\n"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    children.append(child)
    assert child.stdout is not None
    assert child.stdout.readline() == "ready\n"  # the handler is in place before we signal
    return child


def test_sigterm_ends_a_cooperative_process_and_no_sigkill_follows(children: list[subprocess.Popen[str]]) -> None:
    child = spawn(children, ignore_sigterm=False)
    clock = FakeClock(start=T0)
    events: list[Event] = []
    dog = watchdog(clock, events, action=WatchdogAction.SIGNAL, pids=[child.pid], grace_s=1.0, kill_grace_s=2.0)
    for _ in range(3):
        tick(dog, clock, 1500.0)  # SIGTERM at 1.0 s

    assert child.wait(timeout=10) == -signal.SIGTERM
    for _ in range(6):
        tick(dog, clock, 1500.0)  # past the kill grace: the process is gone, nothing to kill
    assert actions(events) == ["watchdog.over_grant", "watchdog.sigterm"]
    assert events[1].detail["pids"] == [child.pid]


def test_sigkill_follows_when_the_process_ignores_sigterm(children: list[subprocess.Popen[str]]) -> None:
    child = spawn(children, ignore_sigterm=True)
    clock = FakeClock(start=T0)
    events: list[Event] = []
    dog = watchdog(clock, events, action=WatchdogAction.SIGNAL, pids=[child.pid], grace_s=1.0, kill_grace_s=2.0)
    for _ in range(3):
        tick(dog, clock, 1500.0)  # SIGTERM at 1.0 s, ignored
    for _ in range(3):
        tick(dog, clock, 1500.0)  # 1.5 .. 2.5 s: still within the kill grace
    assert child.poll() is None
    assert actions(events) == ["watchdog.over_grant", "watchdog.sigterm"]

    tick(dog, clock, 1500.0)  # 3.0 s: kill grace over

    assert child.wait(timeout=10) == -signal.SIGKILL
    assert actions(events) == ["watchdog.over_grant", "watchdog.sigterm", "watchdog.sigkill"]
    assert events[2].detail == {"pid": child.pid, "after_sigterm_s": 2.0}


def test_a_recycled_pid_is_never_killed() -> None:
    sent: list[tuple[int, int]] = []
    starts = iter([111, 222, 222])  # at SIGTERM, then another process holds the PID
    clock = FakeClock(start=T0)
    events: list[Event] = []
    dog = WatchdogEnforcer(
        policy=WatchdogPolicy(action=WatchdogAction.SIGNAL, grace_s=0.0, kill_grace_s=0.0),
        clock=clock,
        emit=events.append,
        processes=lambda w: [4242],
        kill=lambda pid, sig: sent.append((pid, sig)),
        start_time=lambda pid: next(starts),
    )
    dog.observe(grants=[grant()], readings=[reading(5000.0)])
    dog.observe(grants=[grant()], readings=[reading(5000.0)])
    assert sent == [(4242, signal.SIGTERM)]
    assert "watchdog.sigkill" not in actions(events)


def test_signal_policy_without_processes_reports_once_and_keeps_trying() -> None:
    clock = FakeClock(start=T0)
    events: list[Event] = []
    dog = watchdog(clock, events, action=WatchdogAction.SIGNAL, pids=[], grace_s=0.0)
    for _ in range(3):
        tick(dog, clock, 5000.0)
    assert actions(events) == ["watchdog.over_grant", "watchdog.signal_failed"]


def test_proc_start_time_sees_live_processes_only() -> None:
    assert proc_start_time(os.getpid()) is not None
    assert proc_start_time(2**22 + 12345) is None  # above pid_max


def test_memory_above_the_workloads_limit_is_an_offence_although_the_grant_covers_use() -> None:
    # The allocator never grants memory below use, even above the limit: the limit is the ceiling.
    from agents.interfaces import Entitlement

    clock, evict = FakeClock(start=T0), Evictions()
    events: list[Event] = []
    dog = watchdog(clock, events, evict=evict, grace_s=1.0)
    limited = UsageReading(
        workload=BERT, gpu=GPU, mem_used_mb=900.0, sm_used=5.0, pcie_mb_per_s=0.0,
        entitlement=Entitlement(limit_mem_mb=500.0),
    )
    for _ in range(4):
        dog.observe(grants=[grant(mem_mb=900.0)], readings=[limited])
        clock.sleep(0.5)
    assert actions(events) == ["watchdog.over_grant", "watchdog.evicted"]
    assert events[0].detail["excess"] == [{"gpu": GPU, "resource": "mem_mb", "used": 900.0, "granted": 500.0}]
    assert len(evict.calls) == 1
