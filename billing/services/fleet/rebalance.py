"""Pool rebalancing in the service (docs/rebalance.md): the fleet from the ledger, plans from
``allocator.rebalance``, admin approval, execution through the Kubernetes API.

* ``build_pool(now)``: GPUs from ``Gpu`` (seen within the demand window), workloads = pods seen
  on a GPU in the last ``placement`` minutes of the minute ledger (billing.ledger.minutes), demand = each pod's peak over
  the window of its per-minute mean billed memory (MB) and SMs (SM milli), max(used, granted) per
  second: what the agents reserved for it, or its use where that was higher; rounded up. Right-sizing
  reads the window's metered minutes only (a minute some pod used a GPU): the fleet's total demand
  in each, every pod that ran then included, and each running pod's own percentile over the
  minutes it ran; a minute outside the metered history is never a minute of no demand.
* ``propose_rebalance(now, max_moves)``: a dry-run plan plus right-sizing, stored; nothing runs. A
  plan claims only whole nodes (the planner empties nodes with the fewest evictions; a GPU freed on
  a node that stays busy is not handed back), and right-sizing is priced in whole nodes too.
* ``approve_plan`` / ``reject_plan``: admin decisions, audited in the same transaction;
  ``unapprove_unqueued_plan``: an approval whose execution could not be queued (the broker is
  down) goes back to ``proposed``, audited, so the admin approves it again instead of waiting on
  an ``approved`` plan that nothing will ever execute.
* ``execute_plan(plan_id, kube, now)``: for an approved plan, re-check the moves against the
  fleet as it is now, cordon the nodes the plan frees, evict every moved pod through the
  Eviction API. Every step is appended to the plan's log and audited as it happens.

* ``run_execution(plan_id, connect, now)``: ``execute_plan`` as the Celery task runs it; no
  failure (no API client, an error the steps do not expect, a timeout) leaves a plan
  ``approved`` or ``executing``: it ends ``failed`` with the reason, on the page and audited.
* ``plan_steps(plan)``: every cordon and eviction an approval commits to, with what became of
  each; ``confirmation_code(plan)``: the digest of that list an approval must carry.

Eviction rule: a 429 (a PodDisruptionBudget forbids it now) is recorded as ``blocked`` and the
next pod is tried; a 404 (pod gone) or 409 (a different pod of that name) is recorded and
skipped; any other error stops the plan as ``failed``. A plan that finished (``done``,
``failed``, ``rejected``) is never executed again. Outcomes of an execution: ``succeeded``
(every step ok), ``partial`` (done, some evictions not carried out), ``failed``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol

from django.db import connection, transaction
from django.db.models import Count, Q

from allocator.rebalance import (
    HOURS_PER_MONTH,
    SM_MILLI,
    DemandSeries,
    Move,
    Pool,
    PoolNode,
    PoolWorkload,
    apply_moves,
    gpu_cost,
    plan_rebalance,
    right_size,
    whole_node_gpus,
)
from allocator.rebalance import RebalancePlan as Plan
from billing.errors import InvalidInput
from billing.ledger.minutes import list_pod_minute_demand, list_recent_placements
from billing.models import Gpu, RateCard, RebalancePlan, RebalanceStatus
from billing.money import display_amount
from billing.services.audit import record_audit_event
from billing.services.identity import new_api_client

__all__ = [
    "OUTCOMES",
    "CapacityLine",
    "EvictionBlocked",
    "ExecutionStep",
    "KubeApi",
    "KubeError",
    "KubernetesApi",
    "LedgerPool",
    "PodGone",
    "PodReplaced",
    "approve_plan",
    "build_pool",
    "capacity_lines",
    "confirmation_code",
    "count_executions",
    "counts_whole_nodes",
    "execute_plan",
    "execution_outcome",
    "fail_execution",
    "kube_from_settings",
    "plan_steps",
    "propose_rebalance",
    "reject_plan",
    "run_execution",
    "unapprove_unqueued_plan",
]

log = logging.getLogger(__name__)

DEFAULT_WINDOW = timedelta(hours=24)
DEFAULT_PLACEMENT = timedelta(minutes=5)
_LOCK_NAMESPACE = 0x7265  # pg advisory lock class for plan execution ("re")


# -- the pool from the ledger -------------------------------------------------------------


@dataclass(frozen=True)
class LedgerPool:
    """The pool, plus what the planner does not need but execution and right-sizing do."""

    pool: Pool
    gpu_uuids: dict[tuple[str, int], str]  # (node, index) -> GPU UUID
    pods: dict[str, dict[str, str]]  # workload key -> namespace, pod, pod_uid, tenant
    series: list[DemandSeries] = field(default_factory=list)  # per (workload, GPU), per minute
    steps: int = 0  # the window's minutes the fleet was metered (some pod used a GPU)
    first_minute: datetime | None = None  # the first and last of them
    last_minute: datetime | None = None


def _ceil(value: Decimal | float) -> int:
    return max(0, math.ceil(value))


def build_pool(
    now: datetime, *, window: timedelta = DEFAULT_WINDOW, placement: timedelta = DEFAULT_PLACEMENT
) -> LedgerPool | None:
    """The fleet's state at ``now`` from the ledger, or None when no GPU was seen in ``window``.

    A node's GPUs are indexed in UUID order; its model is its most common model and its GPU
    memory the smallest of its GPUs (the planner assumes a node's GPUs alike). A pod holding
    more than one GPU, or GPUs on more than one node, is pinned.

    Demand is the billed amount, max(used, granted) per second, not the use: the agent grants a
    workload its reservation (its peak of the last 3 minutes x a calibrated margin, clamped to its
    guarantee and limit) and hands no spare capacity out, so a grant is the reservation wherever
    the card could hold it. A pod packed at its mean use lands where its reservation does not
    fit, and fair share then cuts it: the trace replay missed 4.5 % of workload-seconds so
    (docs/rebalance.md, In the service).
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

    # Per (pod, GPU, minute): the sum over the pod's containers of their mean demand that minute.
    per_minute: dict[tuple[str, str], dict[datetime, tuple[int, int]]] = defaultdict(dict)
    minutes: set[datetime] = set()
    for demand in list_pod_minute_demand(start=start, end=now, gpus=where):
        sm_milli = _ceil(demand.sm * SM_MILLI / sm_count[demand.gpu_uuid])
        per_minute[(demand.pod_uid, demand.gpu_uuid)][demand.minute] = (_ceil(demand.mem_mb), sm_milli)
        minutes.add(demand.minute)

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
            history = per_minute.pop((pod_uid, uuid), {})
            memory = max([memory, *(m for m, _ in history.values())])
            sm = max([sm, *(s for _, s in history.values())])
            if steps:
                series.append(_demand(f"{key}#{uuid}", history, steps, packed=True))
        workloads.append(PoolWorkload(
            key=key, node=node, gpus=indices, memory_mb=memory, sm_milli=sm, namespace=entry["namespace"],
            pod=entry["pod"], movable=len(entry["gpus"]) == 1,
        ))
        pods[key] = {"namespace": entry["namespace"], "pod": entry["pod"], "pod_uid": pod_uid,
                     "tenant": entry["tenant"]}
    # Pods that ran in the window and ended are part of the fleet's demand in the minutes they ran
    # (right-sizing's total), though there is nothing of them left to place.
    series.extend(_demand(f"{pod_uid}#{uuid}", history, steps, packed=False)
                  for (pod_uid, uuid), history in sorted(per_minute.items()))
    return LedgerPool(pool=Pool.build(nodes, workloads), gpu_uuids=gpu_uuids, pods=pods, series=series,
                      steps=len(steps), first_minute=steps[0] if steps else None,
                      last_minute=steps[-1] if steps else None)


def _demand(key: str, history: dict[datetime, tuple[int, int]], steps: list[datetime], *,
            packed: bool) -> DemandSeries:
    """A pod's demand on one GPU over the window's metered minutes; `ran` marks the minutes it was
    metered, so a minute before it started (or after it ended) is no sample of its demand."""
    return DemandSeries(key=key, memory_mb=tuple(history.get(t, (0, 0))[0] for t in steps),
                        sm_milli=tuple(history.get(t, (0, 0))[1] for t in steps),
                        ran=tuple(t in history for t in steps), packed=packed)


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


def _right_sizing(ledger: LedgerPool, plan: Plan, currency: str) -> dict[str, Any]:
    """Right-sizing of the plan's own pool at the plan's rate over the plan's horizon, so its
    difference and the plan's savings are one rule (``gpu_cost``) on one pool size; each estimate
    also in whole nodes (``whole_node_gpus``), the only capacity the fleet hands back or adds."""
    if not ledger.series:
        return {"error": "no usage in the window"}
    pool = ledger.pool
    try:
        sizing = right_size(ledger.series, gpu_memory_mb=min(n.gpu_memory_mb for n in pool.nodes),
                            current_gpus=pool.total_gpus, price_per_gpu_hour=plan.price_per_gpu_hour,
                            hours=plan.hours)
    except ValueError as exc:
        return {"error": str(exc)}
    node_gpus = [n.gpus for n in pool.nodes]

    def whole_nodes(needed: int) -> dict[str, Any]:
        kept = whole_node_gpus(node_gpus, needed)
        return {"whole_node_gpus": kept, "gpus_released": pool.total_gpus - kept,
                "monthly_difference": str(display_amount(gpu_cost(
                    pool.total_gpus - kept, price_per_gpu_hour=plan.price_per_gpu_hour, hours=plan.hours), currency))}

    return {
        "steps": sizing.steps,
        "first_minute": ledger.first_minute.isoformat() if ledger.first_minute else None,
        "last_minute": ledger.last_minute.isoformat() if ledger.last_minute else None,
        "workloads": sizing.workloads,
        "gpu_memory_mb": sizing.gpu_memory_mb,
        "hours_per_month": str(sizing.hours_per_month),
        "price_per_gpu_hour": str(sizing.price_per_gpu_hour),
        "estimates": [
            {"percentile": e.percentile, "gpus_needed": e.gpus_needed, "current_gpus": e.current_gpus,
             "gpus_saved": e.gpus_saved, "lower_bound_gpus": e.lower_bound_gpus, "ffd_gpus": e.ffd_gpus,
             **whole_nodes(e.gpus_needed)}
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
        "gpus_released": plan.gpus_released,
        "idle_nodes": list(plan.idle_nodes),
        "idle_gpus": sum(n.gpus for n in ledger.pool.nodes if n.name in plan.idle_nodes),
        "smallest_release": None if plan.smallest_release is None else {
            "node": plan.smallest_release[0], "evictions": plan.smallest_release[1]},
        "exhaustive": plan.exhaustive,
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
        "projected_savings": display_amount(plan.projected_savings, currency), "currency": currency,
        "price_per_gpu_hour": price, "pool_gpus": ledger.pool.total_gpus, "pool_nodes": len(ledger.pool.nodes),
        "summary": summary, "right_sizing": _right_sizing(ledger, plan, currency),
    }
    with transaction.atomic():
        latest = RebalancePlan.objects.select_for_update().order_by("-created_at", "-id").first()
        if (latest is not None and latest.status == RebalanceStatus.PROPOSED and latest.moves == moves
                and latest.max_moves == max_moves):
            return latest
        return RebalancePlan.objects.create(created_at=now, status=RebalanceStatus.PROPOSED, **values)


# -- reading a plan -------------------------------------------------------------------------


@dataclass(frozen=True)
class CapacityLine:
    """One line of a plan's capacity table, every line on the plan's pool, rate and horizon, and
    every amount whole nodes' GPUs (the capacity a fleet hands back or adds).

    ``key``: ``pool`` (its ``nodes`` and ``gpus``; ``amount`` what they cost), ``busy`` (busy now;
    ``released_nodes`` / ``released_gpus`` the nodes with no workload, ``amount`` what handing
    them back saves, no eviction needed), ``after_plan`` (busy after the moves; released: the
    nodes the plan empties, ``amount`` its projected savings) or ``p95`` / ``p99`` (right-sizing:
    ``gpus`` needed, ``whole_node_gpus`` those of the fewest whole nodes that hold them,
    ``released_gpus`` the pool − that, negative when the pool is short, ``amount`` its price: a
    saving, or what adding nodes costs).
    """

    key: str
    nodes: int | None
    gpus: int
    released_nodes: int | None
    released_gpus: int | None
    amount: Decimal | None
    whole_node_gpus: int | None = None


def counts_whole_nodes(plan: RebalancePlan) -> bool:
    """Whether the plan was priced in whole nodes (a plan proposed before counted freed GPUs)."""
    return "gpus_released" in plan.summary


def capacity_lines(plan: RebalancePlan) -> list[CapacityLine]:
    """The plan's capacity side by side: each amount is ``gpu_cost`` of whole nodes' GPUs at
    ``plan.price_per_gpu_hour`` over the plan's hours (the very figures stored). A plan proposed
    before plans counted whole nodes only shows its counts, no amounts."""
    hours = Decimal(plan.summary.get("hours", HOURS_PER_MONTH))
    price = plan.price_per_gpu_hour
    priced = counts_whole_nodes(plan)

    def cost(gpus: int) -> Decimal | None:
        return gpu_cost(gpus, price_per_gpu_hour=price, hours=hours) if priced else None

    summary = plan.summary
    busy = int(summary.get("gpus_busy_before", plan.pool_gpus))
    busy_nodes = int(summary.get("nodes_busy_before", plan.pool_nodes))
    idle_gpus = int(summary.get("idle_gpus", 0))
    lines = [
        CapacityLine("pool", plan.pool_nodes, plan.pool_gpus, None, None, cost(plan.pool_gpus)),
        CapacityLine("busy", busy_nodes, busy, plan.pool_nodes - busy_nodes, idle_gpus, cost(idle_gpus)),
        CapacityLine("after_plan", int(summary.get("nodes_busy_after", busy_nodes - plan.nodes_freed)),
                     int(summary.get("gpus_busy_after", busy - plan.gpus_freed)), plan.nodes_freed,
                     int(summary.get("gpus_released", 0)), plan.projected_savings if priced else None),
    ]
    lines.extend(CapacityLine(f"p{e['percentile']}", None, e["gpus_needed"], None,
                              e.get("gpus_released"), Decimal(e["monthly_difference"]) if priced else None,
                              e.get("whole_node_gpus"))
                 for e in plan.right_sizing.get("estimates", []))
    return lines  # exact; the page rounds each amount once, to the currency's minor unit


# -- deciding -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecutionStep:
    """One action an approval commits to, and what became of it.

    ``kind``: ``cordon`` (``target`` a node) or ``evict`` (``target`` ``namespace/pod``,
    ``planned`` the move it makes room for). ``outcome``: ``pending`` (not attempted), ``ok``,
    ``blocked`` (PodDisruptionBudget), ``gone`` (404), ``replaced`` (409) or ``error``.
    """

    kind: str
    target: str
    planned: str = ""
    outcome: str = "pending"
    detail: str = ""

    @property
    def carried_out(self) -> bool:
        return self.outcome == "ok"


def plan_steps(plan: RebalancePlan) -> list[ExecutionStep]:
    """Every cordon, then every eviction, in the order ``execute_plan`` runs them, each with the
    outcome of its last log entry (a resumed execution may have logged it twice)."""
    outcomes: dict[tuple[str, str], tuple[str, str]] = {}
    for entry in plan.log:
        if entry.get("step") in ("cordon", "evict"):
            outcomes[(entry["step"], entry.get("target", ""))] = (entry["outcome"], entry.get("detail", ""))
    steps = [ExecutionStep("cordon", node, "", *outcomes.get(("cordon", node), ("pending", "")))
             for node in plan.summary.get("freed_nodes", [])]
    for move in plan.moves:
        target = f"{move['namespace']}/{move['pod']}"
        planned = f"{move['from_node']}/{move['from_gpu']} -> {move['to_node']}/{move['to_gpu']}"
        steps.append(ExecutionStep("evict", target, planned, *outcomes.get(("evict", target), ("pending", ""))))
    return steps


def confirmation_code(plan: RebalancePlan) -> str:
    """A digest of exactly what approving ``plan`` cordons and evicts (nodes; pods by namespace,
    name and UID). The confirmation page that lists them posts it back, so an approval is of
    that list: an approval without it, or of another list, is refused."""
    targets = [plan.pk, sorted(plan.summary.get("freed_nodes", [])),
               [[m["namespace"], m["pod"], m["pod_uid"]] for m in plan.moves]]
    return hashlib.sha256(json.dumps(targets).encode()).hexdigest()[:20]


def _decide(plan_id: int, *, now: datetime, actor_label: str, actor_id: int | None, status: str,
            action: str, confirmation: str | None = None) -> RebalancePlan:
    with transaction.atomic():
        plan = RebalancePlan.objects.select_for_update().filter(pk=plan_id).first()
        if plan is None:
            raise InvalidInput(f"no rebalance plan {plan_id}")
        if plan.status == status:
            return plan  # the same decision twice changes nothing
        if plan.status != RebalanceStatus.PROPOSED:
            raise InvalidInput(f"plan {plan_id} is {plan.status}; only a proposed plan can be decided")
        if status == RebalanceStatus.APPROVED and not plan.moves:
            raise InvalidInput(f"plan {plan_id} frees no node: it has no move to execute")
        # Compared as bytes: compare_digest refuses a str with non-ASCII characters (a TypeError, a 500).
        if confirmation is not None and not hmac.compare_digest(confirmation.encode(),
                                                                confirmation_code(plan).encode()):
            raise InvalidInput(f"plan {plan_id} was not approved: confirm the list of nodes to cordon and "
                               "pods to evict on its confirmation page first")
        before = {"status": plan.status}
        plan.status = status
        plan.decided_at = now
        plan.decided_by_id = actor_id
        plan.save(update_fields=["status", "decided_at", "decided_by"])
        record_audit_event(at=now, actor_label=actor_label, actor_id=actor_id, action=action,
                           object_type="rebalance_plan", object_id=str(plan.pk), before=before,
                           after={"status": status, "moves": len(plan.moves), "gpus_freed": plan.gpus_freed})
    return plan


def approve_plan(plan_id: int, *, confirmation: str, now: datetime, actor_label: str,
                 actor_id: int | None = None) -> RebalancePlan:
    """Approve a proposed plan (audited); the caller enqueues its execution. ``confirmation``
    must be the plan's ``confirmation_code``: what the admin saw listed is what will run."""
    return _decide(plan_id, now=now, actor_label=actor_label, actor_id=actor_id,
                   status=RebalanceStatus.APPROVED, action="rebalance.approve", confirmation=confirmation)


def reject_plan(plan_id: int, *, now: datetime, actor_label: str, actor_id: int | None = None) -> RebalancePlan:
    return _decide(plan_id, now=now, actor_label=actor_label, actor_id=actor_id,
                   status=RebalanceStatus.REJECTED, action="rebalance.reject")


def unapprove_unqueued_plan(plan_id: int, *, now: datetime, reason: str, actor_label: str,
                            actor_id: int | None = None) -> RebalancePlan | None:
    """Undo the approval of a plan whose execution message could not be queued: back to
    ``proposed`` (audited as ``rebalance.queue_failed`` with the reason), so it can be approved,
    and so queued, again. Only an ``approved`` plan whose execution has not started (empty log)
    changes; None otherwise (a message did reach a worker after all)."""
    with transaction.atomic():
        plan = RebalancePlan.objects.select_for_update().filter(pk=plan_id).first()
        if plan is None or plan.status != RebalanceStatus.APPROVED or plan.log:
            return None
        plan.status = RebalanceStatus.PROPOSED
        plan.decided_at = None
        plan.decided_by_id = None
        plan.save(update_fields=["status", "decided_at", "decided_by"])
        record_audit_event(at=now, actor_label=actor_label, actor_id=actor_id, action="rebalance.queue_failed",
                           object_type="rebalance_plan", object_id=str(plan.pk),
                           before={"status": RebalanceStatus.APPROVED},
                           after={"status": RebalanceStatus.PROPOSED, "reason": reason[:300]})
    return plan


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
_ENDED = (RebalanceStatus.DONE, RebalanceStatus.FAILED)
OUTCOMES = ("succeeded", "partial", "failed")
# Why an eviction was not carried out, for the note of a plan that ended done anyway.
_NOT_CARRIED_OUT = {
    "blocked": "{n} eviction(s) blocked by a PodDisruptionBudget",
    "gone": "{n} pod(s) gone before their eviction",
    "replaced": "{n} pod(s) replaced by another pod of that name",
}


def execution_outcome(plan: RebalancePlan) -> str | None:
    """``succeeded`` / ``partial`` / ``failed`` once an execution ended, else None.

    A ``done`` plan's ``error`` holds the note on evictions not carried out, and is empty
    exactly when every step was carried out (``_finish``), so SQL can count outcomes too."""
    if plan.status == RebalanceStatus.FAILED:
        return "failed"
    if plan.status == RebalanceStatus.DONE:
        return "partial" if plan.error else "succeeded"
    return None


def count_executions() -> dict[str, int]:
    """Ended executions by outcome, for the metric ``vgpu_rebalance_executions_total``."""
    done = Q(status=RebalanceStatus.DONE)
    counts = RebalancePlan.objects.aggregate(
        succeeded=Count("pk", filter=done & Q(error="")),
        partial=Count("pk", filter=done & ~Q(error="")),
        failed=Count("pk", filter=Q(status=RebalanceStatus.FAILED)),
    )
    return {outcome: int(counts[outcome]) for outcome in OUTCOMES}


def _step(plan_id: int, now: datetime, entry: dict[str, Any], *, status: str | None = None,
          error: str | None = None) -> None:
    """Append one step to the plan's log (and change its status), audited, in one transaction.

    The step that ends an execution is audited as ``rebalance.succeeded`` / ``.partial`` /
    ``.failed``, with the reason and which steps were carried out and which not."""
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
        after: dict[str, Any] = {"status": plan.status, **entry}
        outcome = execution_outcome(plan) if status in _ENDED else None
        if outcome is not None:
            steps = plan_steps(plan)
            after |= {"error": plan.error,
                      "carried_out": [f"{s.kind} {s.target}" for s in steps if s.carried_out],
                      "not_carried_out": [f"{s.kind} {s.target}: {s.outcome}" for s in steps if not s.carried_out]}
        record_audit_event(at=now, actor_label="system:rebalance", action=f"rebalance.{outcome or entry['step']}",
                           object_type="rebalance_plan", object_id=str(plan_id), before=before, after=after)


def _done_steps(plan: RebalancePlan) -> set[tuple[str, str]]:
    """(step, target) pairs already finished, so a resumed execution does not repeat them."""
    final = {"ok", "blocked", "gone", "replaced"}
    return {(e["step"], e.get("target", "")) for e in plan.log if e.get("outcome") in final}


@contextmanager
def _execution_lock(plan_id: int) -> Iterator[bool]:
    """Whether this process holds the plan's execution lock (a Postgres advisory lock) inside."""
    with connection.cursor() as cursor:
        cursor.execute("select pg_try_advisory_lock(%s, %s)", [_LOCK_NAMESPACE, plan_id])
        held = bool(cursor.fetchone()[0])
    try:
        yield held
    finally:
        if held:
            with connection.cursor() as cursor:
                cursor.execute("select pg_advisory_unlock(%s, %s)", [_LOCK_NAMESPACE, plan_id])


def execute_plan(plan_id: int, *, kube: KubeApi, now: datetime,
                 window: timedelta = DEFAULT_WINDOW) -> RebalancePlan:
    """Carry out an approved plan: cordon the nodes it frees, then evict each moved pod.

    Idempotent: a finished plan is returned unchanged; an ``executing`` plan (a crash
    mid-way) resumes and skips the steps its log shows finished; two executions of one plan
    never run at once (a Postgres advisory lock).
    """
    with _execution_lock(plan_id) as held:
        if not held:
            return RebalancePlan.objects.get(pk=plan_id)
        return _execute(plan_id, kube=kube, now=now, window=window)


def run_execution(plan_id: int, *, connect: Callable[[], KubeApi], now: datetime,
                  window: timedelta = DEFAULT_WINDOW) -> RebalancePlan:
    """``execute_plan`` with a client from ``connect``, as the Celery task runs it.

    Nothing leaves an approved plan looking approved: a client that cannot be built (no
    ``VGPU_KUBE_API`` outside a cluster) or an error the steps do not expect (a timeout of the
    task, a bug) ends the plan ``failed`` with the reason, on the page and in the audit log.
    """
    try:
        kube = connect()
    except Exception as exc:  # noqa: BLE001 - kubernetes.config.ConfigException and whatever a bad URL raises
        return fail_execution(plan_id, now=now, reason=f"no Kubernetes API client: {type(exc).__name__}: {exc}")
    try:
        return execute_plan(plan_id, kube=kube, now=now, window=window)
    except Exception as exc:
        log.exception("rebalance plan %s: execution stopped by an unexpected error", plan_id)
        return fail_execution(plan_id, now=now, reason=f"execution stopped: {type(exc).__name__}: {exc}")


def fail_execution(plan_id: int, *, now: datetime, reason: str) -> RebalancePlan:
    """End an ``approved`` or ``executing`` plan as ``failed`` with ``reason`` (logged as an
    ``abort`` step, audited). A plan in another status, or one another process is executing
    now, is returned as it is."""
    with _execution_lock(plan_id) as held:
        plan = RebalancePlan.objects.filter(pk=plan_id).first()
        if plan is None:
            raise InvalidInput(f"no rebalance plan {plan_id}")
        if held and plan.status in (RebalanceStatus.APPROVED, RebalanceStatus.EXECUTING):
            _step(plan_id, now, {"step": "abort", "outcome": "error", "detail": reason},
                  status=RebalanceStatus.FAILED, error=reason)
            plan.refresh_from_db()
        return plan


def _execute(plan_id: int, *, kube: KubeApi, now: datetime, window: timedelta) -> RebalancePlan:  # noqa: PLR0912 - one branch per step of a plan's state machine
    plan = RebalancePlan.objects.filter(pk=plan_id).first()
    if plan is None:
        raise InvalidInput(f"no rebalance plan {plan_id}")
    if plan.status in _FINISHED or plan.status == RebalanceStatus.PROPOSED:
        return plan  # done, failed, rejected: never again; proposed: not approved yet
    if plan.status == RebalanceStatus.APPROVED:
        problem = _stale(plan, now=now, window=window)
        if problem is not None:
            _step(plan_id, now, {"step": "check", "outcome": "stale", "detail": problem},
                  status=RebalanceStatus.FAILED, error=problem)
            return RebalancePlan.objects.get(pk=plan_id)
        _step(plan_id, now, {"step": "start", "outcome": "ok", "moves": len(plan.moves)},
              status=RebalanceStatus.EXECUTING)
        plan.refresh_from_db()
    finished = _done_steps(plan)
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
            continue
        entry = {"step": "evict", "target": target, "uid": move["pod_uid"],
                 "planned": f"{move['from_node']}/{move['from_gpu']} -> {move['to_node']}/{move['to_gpu']}"}
        try:
            kube.evict_pod(namespace=move["namespace"], name=move["pod"], uid=move["pod_uid"])
        except EvictionBlocked as exc:
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
    return _finish(plan_id, now)


def _stale(plan: RebalancePlan, *, now: datetime, window: timedelta) -> str | None:
    """Why the plan's moves no longer replay on the fleet as the ledger sees it now, or None."""
    ledger = build_pool(now, window=window)
    if ledger is None:
        return "no fleet in the ledger"
    try:
        apply_moves(ledger.pool, [Move(m["workload"], m["from_node"], m["from_gpu"], m["to_node"], m["to_gpu"])
                                  for m in plan.moves])
    except ValueError as exc:
        return f"the plan no longer fits the fleet: {exc}"
    return None


def _finish(plan_id: int, now: datetime) -> RebalancePlan:
    """Every step was tried: the plan is done; its note says which evictions were not carried out."""
    plan = RebalancePlan.objects.get(pk=plan_id)
    missed = Counter(s.outcome for s in plan_steps(plan) if not s.carried_out)
    note = "; ".join(text.format(n=missed[why]) for why, text in _NOT_CARRIED_OUT.items() if missed[why])
    _step(plan_id, now, {"step": "finish", "outcome": "ok", "blocked": missed["blocked"]},
          status=RebalanceStatus.DONE, error=note)
    return RebalancePlan.objects.get(pk=plan_id)
