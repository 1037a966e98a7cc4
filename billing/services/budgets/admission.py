"""The Kubernetes validating admission webhook for budgets and quotas (AdmissionReview v1).

Denies the creation of a pod that requests GPUs — `nvidia.com/gpu` in any container's
requests or limits, one of our `vgpu-ledger.io/*` request annotations, or a DRA resource
claim — when its tenant's budget, or its namespace's, is enforced with the `block` action, or when its
*guaranteed* memory / SMs would take the tenant's admitted pods above the tenant's quota.
Everything else is allowed. Admitted pods with guarantees are remembered (AdmittedPod) until
the webhook sees their DELETE. The tenant of a namespace is the tenant that lists it in
`namespaces`, else the tenant whose slug is the namespace name.

Guarantees counted: the `vgpu-ledger.io/memory-mb` and `vgpu-ledger.io/sm-count` annotations,
or `nvidia.com/gpu: N` as N whole GPUs of the fleet's largest model. DRA claims' parameters
live in ResourceClaim objects the webhook does not read: their guarantees are enforced by the
agents at run time, not counted here (docs/requests.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Max, Q, Sum

from billing.errors import FieldError, InvalidBatch
from billing.models import AdmittedPod, BudgetAction, BudgetScope, BudgetState, BudgetStatus, Gpu, Tenant
from billing.money import amount_text
from billing.services.input_limits import integer_max, max_length, text_problem

__all__ = ["AdmissionDecision", "pod_requests_gpu", "review_pod"]

GPU_RESOURCE = "nvidia.com/gpu"
REQUEST_ANNOTATION_PREFIX = "vgpu-ledger.io/"
REQUEST_ANNOTATIONS = ("memory-mb", "sm-count", "bandwidth-mbps")


@dataclass(frozen=True)
class AdmissionDecision:
    uid: str
    allowed: bool
    message: str | None = None
    warnings: tuple[str, ...] = ()

    def response(self) -> dict[str, Any]:
        body: dict[str, Any] = {"uid": self.uid, "allowed": self.allowed}
        if self.message:
            body["status"] = {"code": 403, "reason": "Forbidden", "message": self.message}
        if self.warnings:
            body["warnings"] = list(self.warnings)
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": body}


def pod_requests_gpu(pod: dict[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            quantity = (resources.get(section) or {}).get(GPU_RESOURCE)
            if quantity not in (None, "0", 0):
                return True
        if container.get("resources", {}).get("claims"):
            return True
    if spec.get("resourceClaims"):
        return True
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return any(
        key.startswith(REQUEST_ANNOTATION_PREFIX) and key[len(REQUEST_ANNOTATION_PREFIX):].split("-limit")[0]
        in REQUEST_ANNOTATIONS
        for key in annotations
    )


# The A100 80GB, when the fleet has reported no GPU yet.
_DEFAULT_GPU = (81920, Decimal(108))


@dataclass(frozen=True)
class Guarantee:
    mem_mb: int
    sm: Decimal

    @property
    def any(self) -> bool:
        return self.mem_mb > 0 or self.sm > 0


def pod_guarantee(pod: dict[str, Any]) -> Guarantee:
    """What the pod is guaranteed: our annotations win; else whole GPUs; else nothing counted."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    mem, sm = annotations.get("vgpu-ledger.io/memory-mb"), annotations.get("vgpu-ledger.io/sm-count")
    if mem is not None or sm is not None:
        try:
            mem_mb = int(str(mem or "0"))
            sm_count = Decimal(str(sm or "0"))
        except (ValueError, ArithmeticError) as exc:
            raise InvalidBatch([FieldError("$.request.object.metadata.annotations",
                                           f"vgpu-ledger.io request annotations must be numbers: {exc}")]) from exc
        if not sm_count.is_finite() or mem_mb < 0 or sm_count < 0:
            raise InvalidBatch([FieldError("$.request.object.metadata.annotations",
                                           "vgpu-ledger.io request annotations must be finite and not negative")])
        return _bounded(Guarantee(mem_mb=mem_mb, sm=sm_count))
    whole = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        try:
            whole += int(str(limits.get(GPU_RESOURCE, "0")))
        except ValueError:
            continue
    if not whole:
        return Guarantee(mem_mb=0, sm=Decimal(0))
    largest = Gpu.objects.aggregate(mem=Max("memory_mb"), sm=Max("sm_count"))
    mem_mb, sm_count = (largest["mem"], Decimal(largest["sm"])) if largest["mem"] else _DEFAULT_GPU
    return _bounded(Guarantee(mem_mb=whole * mem_mb, sm=whole * sm_count))


# What AdmittedPod's columns hold: a guarantee beyond them is refused, not a database error.
_MEM_MAX = integer_max(AdmittedPod, "guaranteed_mem_mb")
_SM_FIELD = AdmittedPod._meta.get_field("guaranteed_sm")
_SM_LIMIT = Decimal(10) ** (_SM_FIELD.max_digits - _SM_FIELD.decimal_places)


def _bounded(guarantee: Guarantee) -> Guarantee:
    if guarantee.mem_mb > _MEM_MAX or guarantee.sm >= _SM_LIMIT:
        raise InvalidBatch([FieldError("$.request.object", f"the pod's GPU guarantee is beyond any fleet "
                                                           f"(at most {_MEM_MAX} MB and {_SM_LIMIT - 1} SMs)")])
    return guarantee


def _quota_denial(tenant: Tenant, uid: str, guarantee: Guarantee) -> str | None:
    used = AdmittedPod.objects.filter(tenant=tenant).exclude(uid=uid).aggregate(
        mem=Sum("guaranteed_mem_mb"), sm=Sum("guaranteed_sm")
    )
    used_mem, used_sm = used["mem"] or 0, used["sm"] or Decimal(0)
    if tenant.quota_guaranteed_mem_mb is not None and used_mem + guarantee.mem_mb > tenant.quota_guaranteed_mem_mb:
        return (f"vGPU Ledger: tenant {tenant.slug} may be guaranteed {tenant.quota_guaranteed_mem_mb} MB of GPU "
                f"memory across the fleet; admitted pods hold {used_mem} MB and this pod asks {guarantee.mem_mb} MB.")
    if tenant.quota_guaranteed_sm is not None and used_sm + guarantee.sm > tenant.quota_guaranteed_sm:
        return (f"vGPU Ledger: tenant {tenant.slug} may be guaranteed {tenant.quota_guaranteed_sm} SMs across the "
                f"fleet; admitted pods hold {used_sm} and this pod asks {guarantee.sm}.")
    return None


def _parse(review: Any) -> tuple[str, str, str, dict[str, Any]]:
    if not isinstance(review, dict) or review.get("apiVersion") != "admission.k8s.io/v1" \
            or review.get("kind") != "AdmissionReview":
        raise InvalidBatch([FieldError("$", "expected an admission.k8s.io/v1 AdmissionReview")])
    request = review.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise InvalidBatch([FieldError("$.request.uid", "must be present")])
    raw_object = request.get("object")
    obj: dict[str, Any] = raw_object if isinstance(raw_object, dict) else {}
    raw_metadata = obj.get("metadata")
    metadata: dict[str, Any] = raw_metadata if isinstance(raw_metadata, dict) else {}
    # Strings the webhook looks up or stores: each must fit its column and be text Postgres holds.
    for path, value, limit in (
        ("$.request.uid", request["uid"], 200),
        ("$.request.namespace", request.get("namespace") or "", max_length(AdmittedPod, "namespace")),
        ("$.request.object.metadata.name", metadata.get("name") or "", max_length(AdmittedPod, "name")),
        ("$.request.object.metadata.uid", metadata.get("uid") or "", max_length(AdmittedPod, "uid")),
    ):
        if not isinstance(value, str) or len(value) > limit or text_problem(value):
            raise InvalidBatch([FieldError(path, f"must be a string of at most {limit} characters, "
                                                 "without NUL or lone surrogates")])
    return str(request["uid"]), str(request.get("operation", "")), str(request.get("namespace") or ""), obj


def review_pod(review: Any, *, now: datetime) -> AdmissionDecision:
    uid, operation, namespace, pod = _parse(review)
    request = review.get("request") or {}
    kind = request.get("kind") or {}
    if kind.get("kind") != "Pod":
        return AdmissionDecision(uid=uid, allowed=True)
    if operation == "DELETE":
        raw_old = request.get("oldObject")
        old: dict[str, Any] = raw_old if isinstance(raw_old, dict) else {}
        pod_uid = (old.get("metadata") or {}).get("uid")
        if pod_uid and not request.get("dryRun"):
            AdmittedPod.objects.filter(uid=pod_uid).delete()
        return AdmissionDecision(uid=uid, allowed=True)
    if operation != "CREATE" or not pod_requests_gpu(pod):
        return AdmissionDecision(uid=uid, allowed=True)
    tenant = Tenant.objects.filter(Q(namespaces__contains=[namespace]) | Q(slug=namespace)).order_by("pk").first()
    if tenant is None:
        return AdmissionDecision(uid=uid, allowed=True)
    blocked = _budget_block(tenant, uid=uid, namespace=namespace, pod=pod, now=now)
    if blocked is not None:
        return blocked
    guarantee = pod_guarantee(pod)
    if not guarantee.any or (tenant.quota_guaranteed_mem_mb is None and tenant.quota_guaranteed_sm is None):
        return AdmissionDecision(uid=uid, allowed=True)
    metadata = pod.get("metadata") or {}
    pod_uid = str(metadata.get("uid") or "")
    with transaction.atomic():
        # One admission at a time per tenant, so two pods cannot both take the last of a quota.
        Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
        denial = _quota_denial(tenant, pod_uid, guarantee)
        if denial is not None:
            return AdmissionDecision(uid=uid, allowed=False, message=denial)
        if pod_uid and not request.get("dryRun"):
            AdmittedPod.objects.update_or_create(uid=pod_uid, defaults={
                "tenant": tenant, "namespace": namespace, "name": str(metadata.get("name") or ""),
                "guaranteed_mem_mb": guarantee.mem_mb, "guaranteed_sm": guarantee.sm, "admitted_at": now,
            })
    return AdmissionDecision(uid=uid, allowed=True)


def _budget_block(tenant: Tenant, *, uid: str, namespace: str, pod: dict[str, Any],
                  now: datetime) -> AdmissionDecision | None:
    """A denial when the tenant's own budget, or the budget of the pod's namespace, is enforced this
    month with `block`; the message names that budget and who can raise it."""
    status = (
        BudgetStatus.objects.select_related("budget")
        .filter(Q(budget__scope=BudgetScope.TENANT) | Q(budget__scope=BudgetScope.NAMESPACE, budget__namespace=namespace),
                budget__tenant=tenant, month=now.date().replace(day=1), state=BudgetState.ENFORCED,
                budget__hard_action=BudgetAction.BLOCK)
        .order_by("budget__scope")  # "namespace" before "tenant": the narrower budget is named
        .first()
    )
    if status is None:
        return None
    budget = status.budget
    name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName") or "pod"
    whose = (f"tenant {tenant.slug}" if budget.scope == BudgetScope.TENANT
             else f"namespace {namespace} (tenant {tenant.slug})")
    message = (
        f"vGPU Ledger: new GPU pods of {whose} are blocked: its {now:%Y-%m} GPU budget of "
        f"{budget.amount} {budget.currency} is exhausted (month-to-date spend "
        f"{amount_text(status.spend, budget.currency)} {budget.currency}). Running pods keep their guarantees. "
        f"To raise the budget, contact {budget.owner}. (pod {namespace}/{name})"
    )
    return AdmissionDecision(uid=uid, allowed=False, message=message)
