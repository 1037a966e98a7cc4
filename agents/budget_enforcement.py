"""Budget enforcement on the node: ``evict-best-effort`` (docs/design.md, Enforcement).

When a tenant's budget, or a namespace's, is enforced with ``evict-best-effort``, the node
policy lists the tenant (``PolicySnapshot.evict_best_effort_tenants``) or the namespace
(``evict_best_effort_namespaces``) and, within one policy poll, the agent evicts the
running ``best-effort`` pods of that tenant or namespace on this node through the Eviction
API, once per pod. "Running" means seen on a GPU in this tick's readings: the agent
governs GPU work, and a pod without a GPU process costs nothing on the GPU ledger.
``throttle`` needs no action here: it is a weight change inside the allocation.

Events: ``budget.evicted_best_effort`` (accepted, or the pod was already gone) and
``budget.evict_failed`` (an error, or refused by a PodDisruptionBudget: tried again after
``retry_s``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agents.events import EmitEvent, Event
from agents.interfaces import Clock, Grant, UsageReading, Workload
from agents.policy_client import BEST_EFFORT_TIER
from agents.watchdog import Evict

__all__ = ["BUDGET_EVICTION_REASON", "BestEffortEvictor"]

log = logging.getLogger(__name__)

BUDGET_EVICTION_REASON = "GpuBudgetExceeded"  # the Kubernetes Event reason


@dataclass(slots=True)
class _Attempt:
    done: bool
    retry_at: float  # monotonic seconds


class BestEffortEvictor:
    """Evicts best-effort pods of tenants in ``evict-best-effort``; ``observe`` once per tick."""

    def __init__(
        self,
        *,
        tenants: Callable[[], frozenset[str]],
        evict: Evict,
        emit: EmitEvent,
        clock: Clock,
        retry_s: float = 30.0,
        namespaces: Callable[[], frozenset[str]] = frozenset,
    ) -> None:
        self._tenants = tenants
        self._namespaces = namespaces
        self._evict = evict
        self._emit = emit
        self._clock = clock
        self._retry_s = retry_s
        self._attempts: dict[str, _Attempt] = {}  # pod uid (or namespace/name) -> last attempt

    def observe(self, *, grants: Sequence[Grant], readings: Sequence[UsageReading]) -> None:
        tenants, namespaces = self._tenants(), self._namespaces()
        if not tenants and not namespaces:
            return
        now = self._clock.monotonic()
        pods: dict[str, Workload] = {}
        for r in readings:
            w = r.workload
            if (w.tenant in tenants or w.namespace in namespaces) and w.sla_tier == BEST_EFFORT_TIER:
                pods.setdefault(w.pod_uid or f"{w.namespace}/{w.pod}", w)
        for key, workload in sorted(pods.items()):
            attempt = self._attempts.get(key)
            if attempt is not None and (attempt.done or now < attempt.retry_at):
                continue
            self._attempts[key] = self._try(workload, now)

    def _try(self, workload: Workload, now: float) -> _Attempt:
        pod = f"{workload.namespace}/{workload.pod}"
        whose = (f"tenant {workload.tenant}" if workload.tenant in self._tenants()
                 else f"namespace {workload.namespace}")
        message = (
            f"vGPU Ledger: the GPU budget of {whose} is exhausted and its hard action is"
            " evict-best-effort; best-effort pods are evicted"
        )
        try:
            outcome = self._evict(
                namespace=workload.namespace,
                pod=workload.pod,
                reason=BUDGET_EVICTION_REASON,
                message=message,
                pod_uid=workload.pod_uid or None,
            )
        # The Kubernetes client raises its own types; the tick loop goes on and retries later.
        except Exception as error:  # noqa: BLE001 - recorded on the workload; the tick goes on
            return self._failed(workload, pod, now, error=repr(error)[:500])
        status = getattr(outcome, "value", "evicted")
        if status == "refused":
            return self._failed(workload, pod, now, error="refused by a PodDisruptionBudget")
        log.warning("event=budget_evicted_best_effort tenant=%s pod=%s outcome=%s", workload.tenant, pod, status)
        self._emit(
            Event(
                at=self._clock.now(),
                action="budget.evicted_best_effort",
                target=pod,
                detail={
                    "tenant": workload.tenant,
                    "pod": pod,
                    "pod_uid": workload.pod_uid,
                    "sla_tier": workload.sla_tier,
                    "outcome": "pod already gone" if status == "gone" else "evicted",
                    "budget_action": "evict-best-effort",
                    "budget": "tenant" if workload.tenant in self._tenants() else "namespace",
                },
            )
        )
        return _Attempt(done=True, retry_at=now)

    def _failed(self, workload: Workload, pod: str, now: float, *, error: str) -> _Attempt:
        log.error("event=budget_evict_failed tenant=%s pod=%s error=%r", workload.tenant, pod, error)
        self._emit(
            Event(
                at=self._clock.now(),
                action="budget.evict_failed",
                target=pod,
                detail={"tenant": workload.tenant, "pod": pod, "error": error, "retry_in_s": self._retry_s},
            )
        )
        return _Attempt(done=False, retry_at=now + self._retry_s)
