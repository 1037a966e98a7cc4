"""``evict-best-effort`` on the node: best-effort pods of listed tenants, once per pod."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agents.budget_enforcement import BUDGET_EVICTION_REASON, BestEffortEvictor
from agents.events import Event
from agents.fakes.clock import FakeClock
from agents.interfaces import UsageReading, Workload
from agents.kube import EvictionOutcome

START = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)


def reading(tenant: str, pod: str, tier: str, gpu: str = "GPU-1") -> UsageReading:
    w = Workload(tenant=tenant, namespace=f"{tenant}-prod", pod=pod, container="c", pod_uid=f"uid-{pod}", sla_tier=tier)
    return UsageReading(workload=w, gpu=gpu, mem_used_mb=100.0, sm_used=1.0, pcie_mb_per_s=0.0)


class Recorder:
    def __init__(self, answers: list[object]) -> None:
        self.calls: list[dict[str, object]] = []
        self._answers = answers

    def __call__(self, *, namespace: str, pod: str, reason: str, message: str, pod_uid: str | None = None) -> object:
        self.calls.append({"namespace": namespace, "pod": pod, "reason": reason, "pod_uid": pod_uid})
        answer = self._answers.pop(0) if self._answers else EvictionOutcome.EVICTED
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_only_best_effort_pods_of_listed_tenants_are_evicted_once_each() -> None:
    tenants: frozenset[str] = frozenset()
    clock = FakeClock(start=START)
    evict = Recorder([])
    events: list[Event] = []
    evictor = BestEffortEvictor(tenants=lambda: tenants, evict=evict, emit=events.append, clock=clock)
    readings = [
        reading("initech", "batch-1", "best-effort"),
        reading("initech", "batch-1", "best-effort", gpu="GPU-2"),  # one pod on two GPUs: one eviction
        reading("initech", "api-1", "silver"),
        reading("globex", "batch-9", "best-effort"),
    ]
    evictor.observe(grants=[], readings=readings)
    assert evict.calls == []  # no tenant listed yet
    tenants = frozenset({"initech"})
    for _ in range(3):
        evictor.observe(grants=[], readings=readings)
        clock.advance(timedelta(seconds=60))
    assert evict.calls == [
        {"namespace": "initech-prod", "pod": "batch-1", "reason": BUDGET_EVICTION_REASON, "pod_uid": "uid-batch-1"}
    ]
    assert [(e.action, e.target, e.detail["outcome"]) for e in events] == [
        ("budget.evicted_best_effort", "initech-prod/batch-1", "evicted")
    ]


def test_a_refused_or_failed_eviction_is_reported_and_retried_later() -> None:
    clock = FakeClock(start=START)
    evict = Recorder([EvictionOutcome.REFUSED, ConnectionError("api down"), EvictionOutcome.GONE])
    events: list[Event] = []
    evictor = BestEffortEvictor(
        tenants=lambda: frozenset({"initech"}), evict=evict, emit=events.append, clock=clock, retry_s=30.0
    )
    readings = [reading("initech", "batch-1", "best-effort")]
    evictor.observe(grants=[], readings=readings)
    clock.advance(timedelta(seconds=10))
    evictor.observe(grants=[], readings=readings)  # within retry_s: no second attempt
    assert len(evict.calls) == 1
    clock.advance(timedelta(seconds=25))
    evictor.observe(grants=[], readings=readings)
    clock.advance(timedelta(seconds=31))
    evictor.observe(grants=[], readings=readings)
    evictor.observe(grants=[], readings=readings)
    assert len(evict.calls) == 3
    assert [e.action for e in events] == ["budget.evict_failed", "budget.evict_failed", "budget.evicted_best_effort"]
    assert events[0].detail["error"] == "refused by a PodDisruptionBudget"
    assert events[-1].detail["outcome"] == "pod already gone"


def test_best_effort_pods_of_a_listed_namespace_are_evicted_and_the_tenants_others_are_not() -> None:
    clock = FakeClock(start=START)
    evict = Recorder([])
    events: list[Event] = []
    evictor = BestEffortEvictor(tenants=frozenset, namespaces=lambda: frozenset({"initech-prod"}), evict=evict,
                                emit=events.append, clock=clock)
    staging = reading("initech", "batch-2", "best-effort")
    staging = UsageReading(workload=Workload(tenant="initech", namespace="initech-staging", pod="batch-2", container="c",
                                             pod_uid="uid-batch-2", sla_tier="best-effort"),
                           gpu="GPU-1", mem_used_mb=100.0, sm_used=1.0, pcie_mb_per_s=0.0)
    evictor.observe(grants=[], readings=[reading("initech", "batch-1", "best-effort"), staging,
                                         reading("initech", "api-1", "silver")])
    assert [c["pod"] for c in evict.calls] == ["batch-1"]
    assert [(e.target, e.detail["budget"]) for e in events] == [("initech-prod/batch-1", "namespace")]
