"""Pool rebalancing in the service (DESIGN §6): the fleet from the ledger, plans from
``allocator.rebalance``, admin approval, execution through the Kubernetes API.

* ``build_pool(now)``: GPUs from ``Gpu`` (seen within the demand window), workloads = pods seen
  on a GPU in the last ``placement`` minutes of the minute ledger (billing.ledger.minutes), demand = each pod's peak over
  the window of its per-minute mean memory (MB) and SM use (SM milli), rounded up.
* ``propose_rebalance(now, max_moves)``: a dry-run plan plus right-sizing, stored; nothing runs.
* ``approve_plan`` / ``reject_plan``: admin decisions, audited in the same transaction.
* ``execute_plan(plan_id, kube, now)``: for an approved plan, re-check the moves against the
  fleet as it is now, cordon the nodes the plan frees, evict every moved pod through the
  Eviction API. Every step is appended to the plan's log and audited as it happens.

Eviction rule: a 429 (a PodDisruptionBudget forbids it now) is recorded as ``blocked`` and the
next pod is tried; a 404 (pod gone) or 409 (a different pod of that name) is recorded and
skipped; any other error stops the plan as ``failed``. A plan that finished (``done``,
``failed``, ``rejected``) is never executed again.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol

from django.db import connection, transaction

from allocator.rebalance import (
    SM_MILLI,
    DemandSeries,
    Move,
    Pool,
    PoolNode,
    PoolWorkload,
    apply_moves,
    plan_rebalance,
    right_size,
)
from billing.errors import InvalidInput
from billing.ledger.minutes import list_pod_minute_use, list_recent_placements
from billing.models import Gpu, RateCard, RebalancePlan, RebalanceStatus
from billing.services.audit import record_audit_event
from billing.services.kube_api import new_api_client

__all__ = [
    "EvictionBlocked",
    "KubeApi",
    "KubeError",
    "KubernetesApi",
    "LedgerPool",
    "PodGone",
    "PodReplaced",
    "approve_plan",
    "build_pool",
    "execute_plan",
    "kube_from_settings",
    "propose_rebalance",
    "reject_plan",
]

log = logging.getLogger(__name__)

DEFAULT_WINDOW = timedelta(hours=24)
DEFAULT_PLACEMENT = timedelta(minutes=5)
_CENT = Decimal("0.01")
_LOCK_NAMESPACE = 0x7265  # pg advisory lock class for plan execution ("re")


# -- the pool from the ledger -------------------------------------------------------------


@dataclass(frozen=True)
class LedgerPool:
    """The pool, plus what the planner does not need but execution and right-sizing do."""

    pool: Pool
    gpu_uuids: dict[tuple[str, int], str]  # (node, index) -> GPU UUID
    pods: dict[str, dict[str, str]]  # workload key -> namespace, pod, pod_uid, tenant
    series: list[DemandSeries] = field(default_factory=list)  # per (workload, GPU), per minute
    steps: int = 0


def _ceil(value: Decimal | float) -> int:
    return max(0, math.ceil(value))


def build_pool(
    now: datetime, *, window: timedelta = DEFAULT_WINDOW, placement: timedelta = DEFAULT_PLACEMENT
) -> LedgerPool | None:
    """The fleet's state at ``now`` from the ledger, or None when no GPU was seen in ``window``.

    A node's GPUs are indexed in UUID order; its model is its most common model and its GPU
    memory the smallest of its GPUs (the planner assumes a node's GPUs alike). A pod holding
    more than one GPU, or GPUs on more than one node, is pinned.
    """
    start = now - window
    gpus = list(Gpu.objects.filter(last_seen_at__gte=start).select_related("node").order_by("node__name", "uuid"))
    if not gpus:
        return None
    by_node: dict[str, list[Gpu]] = defaultdict(list)
    for gpu in gpus:
        by_node[gpu.node.name].append(gpu)
    nodes: list[PoolNode] = []
    gpu_uuids: dict[tuple[str, int], str] = {}
    where: dict[str, tuple[str, int]] = {}
    sm_count: dict[str, int] = {}
    for name, cards in sorted(by_node.items()):
        models = [c.model for c in cards]
        nodes.append(PoolNode(name=name, model=max(sorted(set(models)), key=models.count), gpus=len(cards),
                              gpu_memory_mb=max(1, min(c.memory_mb for c in cards))))
        for index, card in enumerate(cards):
            gpu_uuids[(name, index)] = card.uuid
            where[card.uuid] = (name, index)
            sm_count[card.uuid] = max(1, card.sm_count)

    # Per (pod, GPU, minute): the sum over the pod's containers of their mean use that minute.
    per_minute: dict[tuple[str, str], dict[datetime, tuple[int, int]]] = defaultdict(dict)
    minutes: set[datetime] = set()
    for use in list_pod_minute_use(start=start, end=now, gpus=where):
        sm_milli = _ceil(use.sm * SM_MILLI / sm_count[use.gpu_uuid])
        per_minute[(use.pod_uid, use.gpu_uuid)][use.minute] = (_ceil(use.mem_mb), sm_milli)
        minutes.add(use.minute)

    # Who runs where now: the latest identity of each pod seen in the last `placement`.
    placed: dict[str, dict[str, Any]] = {}
    for ident in list_recent_placements(start=now - placement, end=now, gpus=where):
        entry = placed.setdefault(ident.pod_uid, {"namespace": ident.namespace, "pod": ident.pod,
                                                  "tenant": ident.tenant, "gpus": set()})
        entry["gpus"].add(ident.gpu_uuid)
    workloads: list[PoolWorkload] = []
    pods: dict[str, dict[str, str]] = {}
    series: list[DemandSeries] = []
    steps = sorted(minutes)
    for pod_uid, entry in sorted(placed.items(), key=lambda item: (item[1]["namespace"], item[1]["pod"], item[0])):
        key = f"{entry['namespace']}/{entry['pod']}"
        if key in pods:  # a pod of that name replaced within minutes: the later UID wins below
            key = f"{key}@{pod_uid[:8]}"
        homes = sorted(where[u] for u in entry["gpus"])
        node = homes[0][0]
        indices = tuple(i for n, i in homes if n == node)
        memory = sm = 0
        for uuid in entry["gpus"]:
            history = per_minute.get((pod_uid, uuid), {})
            memory = max([memory, *(m for m, _ in history.values())])
            sm = max([sm, *(s for _, s in history.values())])
            if steps:
                series.append(DemandSeries(
                    key=f"{key}#{uuid}",
                    memory_mb=tuple(history.get(t, (0, 0))[0] for t in steps),
                    sm_milli=tuple(history.get(t, (0, 0))[1] for t in steps),
                ))
        workloads.append(PoolWorkload(
            key=key, node=node, gpus=indices, memory_mb=memory, sm_milli=sm, namespace=entry["namespace"],
            pod=entry["pod"], movable=len(entry["gpus"]) == 1,
        ))
        pods[key] = {"namespace": entry["namespace"], "pod": entry["pod"], "pod_uid": pod_uid,
                     "tenant": entry["tenant"]}
    return LedgerPool(pool=Pool.build(nodes, workloads), gpu_uuids=gpu_uuids, pods=pods, series=series,
                      steps=len(steps))


def _price(pool: Pool, now: datetime) -> tuple[Decimal, str]:
    """The rate card in force for the pool's most common GPU model (0 and no currency if none)."""
    counts: dict[str, int] = defaultdict(int)
    for node in pool.nodes:
        counts[node.model] += node.gpus
    model = max(sorted(counts), key=lambda m: counts[m])
    card = (
        RateCard.objects.filter(gpu_model=model, effective_from__lte=now)
        .exclude(effective_to__lte=now)
        .order_by("-effective_from")
        .first()
    )
    if card is None:
        return Decimal(0), ""
    return card.price_per_gpu_hour, card.currency


# -- proposing ------------------------------------------------------------------------------


def _right_sizing(ledger: LedgerPool, price: Decimal) -> dict[str, Any]:
    if not ledger.series:
        return {"error": "no usage in the window"}
    pool = ledger.pool
    try:
        sizing = right_size(ledger.series, gpu_memory_mb=min(n.gpu_memory_mb for n in pool.nodes),
                            current_gpus=pool.total_gpus, price_per_gpu_hour=price)
    except ValueError as exc:
        return {"error": str(exc)}
    return {
        "steps": sizing.steps,
        "workloads": sizing.workloads,
        "gpu_memory_mb": sizing.gpu_memory_mb,
        "hours_per_month": str(sizing.hours_per_month),
        "estimates": [
            {"percentile": e.percentile, "gpus_needed": e.gpus_needed, "current_gpus": e.current_gpus,
             "gpus_saved": e.gpus_saved, "lower_bound_gpus": e.lower_bound_gpus, "ffd_gpus": e.ffd_gpus,
             "monthly_cost_difference": str(e.monthly_cost_difference.quantize(_CENT))}
            for e in sizing.estimates
        ],
    }


def propose_rebalance(
    *, now: datetime, max_moves: int, window: timedelta = DEFAULT_WINDOW
) -> RebalancePlan | None:
    """Plan at most ``max_moves`` moves on the fleet as the ledger sees it and store it (dry run).

    Returns None when there is no fleet to plan for. An identical proposal to the latest one
    still proposed is not stored twice: the latest is returned.
    """
    if max_moves < 0:
        raise InvalidInput("max_moves must be >= 0")
    ledger = build_pool(now, window=window)
    if ledger is None:
        return None
    price, currency = _price(ledger.pool, now)
    plan = plan_rebalance(ledger.pool, max_moves=max_moves, price_per_gpu_hour=price)
    moves = [
        {"step": step, "workload": m.workload, **ledger.pods[m.workload],
         "from_node": m.from_node, "from_gpu": m.from_gpu, "from_uuid": ledger.gpu_uuids[(m.from_node, m.from_gpu)],
         "to_node": m.to_node, "to_gpu": m.to_gpu, "to_uuid": ledger.gpu_uuids[(m.to_node, m.to_gpu)]}
        for step, m in enumerate(plan.moves, start=1)
    ]
    summary = {
        "freed_gpus": [str(g) for g in plan.freed_gpus],
        "freed_nodes": list(plan.freed_nodes),
        "gpus_busy_before": plan.gpus_busy_before,
        "gpus_busy_after": plan.gpus_busy_after,
        "nodes_busy_before": plan.nodes_busy_before,
        "nodes_busy_after": plan.nodes_busy_after,
        "pinned_workloads": list(plan.pinned_workloads),
        "overcommitted_at_start": list(plan.overcommitted_at_start),
        "workloads": len(ledger.pool.workloads),
        "window_hours": window.total_seconds() / 3600,
        "hours": str(plan.hours),
    }
    values = {
        "max_moves": max_moves, "moves": moves, "gpus_freed": plan.gpus_freed, "nodes_freed": plan.nodes_freed,
        "projected_savings": plan.projected_savings.quantize(_CENT), "currency": currency,
        "price_per_gpu_hour": price, "pool_gpus": ledger.pool.total_gpus, "pool_nodes": len(ledger.pool.nodes),
        "summary": summary, "right_sizing": _right_sizing(ledger, price),
    }
    with transaction.atomic():
        latest = RebalancePlan.objects.select_for_update().order_by("-created_at", "-id").first()
        if (latest is not None and latest.status == RebalanceStatus.PROPOSED and latest.moves == moves
                and latest.max_moves == max_moves):
            return latest
        return RebalancePlan.objects.create(created_at=now, status=RebalanceStatus.PROPOSED, **values)


# -- deciding -------------------------------------------------------------------------------


def _decide(plan_id: int, *, now: datetime, actor_label: str, actor_id: int | None, status: str,
            action: str) -> RebalancePlan:
    with transaction.atomic():
        plan = RebalancePlan.objects.select_for_update().filter(pk=plan_id).first()
        if plan is None:
            raise InvalidInput(f"no rebalance plan {plan_id}")
        if plan.status == status:
            return plan  # the same decision twice changes nothing
        if plan.status != RebalanceStatus.PROPOSED:
            raise InvalidInput(f"plan {plan_id} is {plan.status}; only a proposed plan can be decided")
        before = {"status": plan.status}
        plan.status = status
        plan.decided_at = now
        plan.decided_by_id = actor_id
        plan.save(update_fields=["status", "decided_at", "decided_by"])
        record_audit_event(at=now, actor_label=actor_label, actor_id=actor_id, action=action,
                           object_type="rebalance_plan", object_id=str(plan.pk), before=before,
                           after={"status": status, "moves": len(plan.moves), "gpus_freed": plan.gpus_freed})
    return plan


def approve_plan(plan_id: int, *, now: datetime, actor_label: str, actor_id: int | None = None) -> RebalancePlan:
    """Approve a proposed plan (audited); the caller enqueues its execution."""
    return _decide(plan_id, now=now, actor_label=actor_label, actor_id=actor_id,
                   status=RebalanceStatus.APPROVED, action="rebalance.approve")


def reject_plan(plan_id: int, *, now: datetime, actor_label: str, actor_id: int | None = None) -> RebalancePlan:
    return _decide(plan_id, now=now, actor_label=actor_label, actor_id=actor_id,
                   status=RebalanceStatus.REJECTED, action="rebalance.reject")


# -- executing ------------------------------------------------------------------------------


class KubeError(Exception):
    """The API server refused or could not be reached (stops the plan)."""


class EvictionBlocked(KubeError):
    """429: a PodDisruptionBudget forbids the eviction now."""


class PodGone(KubeError):
    """404: the pod no longer exists."""


class PodReplaced(KubeError):
    """409: a pod of that name exists with another UID."""


class KubeApi(Protocol):
    def cordon_node(self, name: str) -> None: ...

    def evict_pod(self, *, namespace: str, name: str, uid: str) -> None: ...


class KubernetesApi:
    """``KubeApi`` on the official client (``kubernetes.client.CoreV1Api``)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._client = client

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            fn(*args, **kwargs, _request_timeout=30)
        except ApiException as exc:
            message = f"{exc.status} {exc.reason}: {(exc.body or '')[:300]}"
            error = {429: EvictionBlocked, 404: PodGone, 409: PodReplaced}.get(exc.status or 0, KubeError)
            raise error(message) from exc
        except Exception as exc:  # urllib3 connection errors and the like
            raise KubeError(f"{type(exc).__name__}: {exc}") from exc

    def cordon_node(self, name: str) -> None:
        try:
            self._call(self._core.patch_node, name, {"spec": {"unschedulable": True}})
        except PodGone as exc:  # a 404 here is the node, not a pod
            raise KubeError(f"node {name}: {exc}") from exc

    def evict_pod(self, *, namespace: str, name: str, uid: str) -> None:
        c = self._client
        body = c.V1Eviction(
            api_version="policy/v1", kind="Eviction",
            metadata=c.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=c.V1DeleteOptions(preconditions=c.V1Preconditions(uid=uid) if uid else None),
        )
        self._call(self._core.create_namespaced_pod_eviction, name, namespace, body)


def kube_from_settings() -> KubernetesApi:
    """``VGPU_KUBE_API`` (a URL, e.g. a ``kubectl proxy``) when set, else the in-cluster config."""
    return KubernetesApi(new_api_client())


_FINISHED = {RebalanceStatus.DONE, RebalanceStatus.FAILED, RebalanceStatus.REJECTED}


def _step(plan_id: int, now: datetime, entry: dict[str, Any], *, status: str | None = None,
          error: str | None = None) -> None:
    """Append one step to the plan's log (and change its status), audited, in one transaction."""
    with transaction.atomic():
        plan = RebalancePlan.objects.select_for_update().get(pk=plan_id)
        before = {"status": plan.status}
        plan.log = [*plan.log, {"at": now.isoformat(), **entry}]
        fields = ["log"]
        if status is not None:
            plan.status = status
            fields.append("status")
        if error is not None:
            plan.error = error
            fields.append("error")
        plan.save(update_fields=fields)
        record_audit_event(at=now, actor_label="system:rebalance", action=f"rebalance.{entry['step']}",
                           object_type="rebalance_plan", object_id=str(plan_id), before=before,
                           after={"status": plan.status, **entry})


def _done_steps(plan: RebalancePlan) -> set[tuple[str, str]]:
    """(step, target) pairs already finished, so a resumed execution does not repeat them."""
    final = {"ok", "blocked", "gone", "replaced"}
    return {(e["step"], e.get("target", "")) for e in plan.log if e.get("outcome") in final}


def execute_plan(plan_id: int, *, kube: KubeApi, now: datetime,
                 window: timedelta = DEFAULT_WINDOW) -> RebalancePlan:
    """Carry out an approved plan: cordon the nodes it frees, then evict each moved pod.

    Idempotent: a finished plan is returned unchanged; an ``executing`` plan (a crash
    mid-way) resumes and skips the steps its log shows finished; two executions of one plan
    never run at once (a Postgres advisory lock).
    """
    with connection.cursor() as cursor:
        cursor.execute("select pg_try_advisory_lock(%s, %s)", [_LOCK_NAMESPACE, plan_id])
        if not cursor.fetchone()[0]:
            return RebalancePlan.objects.get(pk=plan_id)
    try:
        return _execute(plan_id, kube=kube, now=now, window=window)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("select pg_advisory_unlock(%s, %s)", [_LOCK_NAMESPACE, plan_id])


def _execute(plan_id: int, *, kube: KubeApi, now: datetime, window: timedelta) -> RebalancePlan:
    plan = RebalancePlan.objects.filter(pk=plan_id).first()
    if plan is None:
        raise InvalidInput(f"no rebalance plan {plan_id}")
    if plan.status in _FINISHED or plan.status == RebalanceStatus.PROPOSED:
        return plan  # done, failed, rejected: never again; proposed: not approved yet
    if plan.status == RebalanceStatus.APPROVED:
        # The fleet may have changed since the plan: replay its moves on the pool as it is now.
        ledger = build_pool(now, window=window)
        problem = None
        if ledger is None:
            problem = "no fleet in the ledger"
        else:
            try:
                apply_moves(ledger.pool, [Move(m["workload"], m["from_node"], m["from_gpu"], m["to_node"],
                                               m["to_gpu"]) for m in plan.moves])
            except ValueError as exc:
                problem = f"the plan no longer fits the fleet: {exc}"
        if problem is not None:
            _step(plan_id, now, {"step": "check", "outcome": "stale", "detail": problem},
                  status=RebalanceStatus.FAILED, error=problem)
            return RebalancePlan.objects.get(pk=plan_id)
        _step(plan_id, now, {"step": "start", "outcome": "ok", "moves": len(plan.moves)},
              status=RebalanceStatus.EXECUTING)
        plan.refresh_from_db()
    finished = _done_steps(plan)
    blocked = 0
    for node in plan.summary.get("freed_nodes", []):
        if ("cordon", node) in finished:
            continue
        try:
            kube.cordon_node(node)
        except KubeError as exc:
            _step(plan_id, now, {"step": "cordon", "target": node, "outcome": "error", "detail": str(exc)},
                  status=RebalanceStatus.FAILED, error=f"cordon {node}: {exc}")
            return RebalancePlan.objects.get(pk=plan_id)
        _step(plan_id, now, {"step": "cordon", "target": node, "outcome": "ok"})
    for move in plan.moves:
        target = f"{move['namespace']}/{move['pod']}"
        if ("evict", target) in finished:
            blocked += any(e.get("target") == target and e.get("outcome") == "blocked" for e in plan.log)
            continue
        entry = {"step": "evict", "target": target, "uid": move["pod_uid"],
                 "planned": f"{move['from_node']}/{move['from_gpu']} -> {move['to_node']}/{move['to_gpu']}"}
        try:
            kube.evict_pod(namespace=move["namespace"], name=move["pod"], uid=move["pod_uid"])
        except EvictionBlocked as exc:
            blocked += 1
            _step(plan_id, now, {**entry, "outcome": "blocked", "detail": str(exc)})
        except PodGone as exc:
            _step(plan_id, now, {**entry, "outcome": "gone", "detail": str(exc)})
        except PodReplaced as exc:
            _step(plan_id, now, {**entry, "outcome": "replaced", "detail": str(exc)})
        except KubeError as exc:
            _step(plan_id, now, {**entry, "outcome": "error", "detail": str(exc)},
                  status=RebalanceStatus.FAILED, error=f"evict {target}: {exc}")
            return RebalancePlan.objects.get(pk=plan_id)
        else:
            _step(plan_id, now, {**entry, "outcome": "ok"})
    note = f"{blocked} eviction(s) blocked by a PodDisruptionBudget" if blocked else ""
    _step(plan_id, now, {"step": "finish", "outcome": "ok", "blocked": blocked},
          status=RebalanceStatus.DONE, error=note)
    return RebalancePlan.objects.get(pk=plan_id)
