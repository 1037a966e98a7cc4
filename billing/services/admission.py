"""The Kubernetes validating admission webhook for budgets (AdmissionReview v1).

Denies the creation of a pod that requests GPUs — `nvidia.com/gpu` in any container's
requests or limits, one of our `vgpu-ledger.io/*` request annotations, or a DRA resource
claim — when its tenant's budget is enforced with the `block` action. Everything else is
allowed. The tenant of a namespace is the tenant that lists it in `namespaces`, else the
tenant whose slug is the namespace name.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Q

from billing.errors import FieldError, InvalidBatch
from billing.models import BudgetAction, BudgetState, BudgetStatus, Tenant

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


def _parse(review: Any) -> tuple[str, str, str, dict[str, Any]]:
    if not isinstance(review, dict) or review.get("apiVersion") != "admission.k8s.io/v1" \
            or review.get("kind") != "AdmissionReview":
        raise InvalidBatch([FieldError("$", "expected an admission.k8s.io/v1 AdmissionReview")])
    request = review.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise InvalidBatch([FieldError("$.request.uid", "must be present")])
    raw_object = request.get("object")
    obj: dict[str, Any] = raw_object if isinstance(raw_object, dict) else {}
    return str(request["uid"]), str(request.get("operation", "")), str(request.get("namespace") or ""), obj


def review_pod(review: Any, *, now: datetime) -> AdmissionDecision:
    uid, operation, namespace, pod = _parse(review)
    kind = (review.get("request") or {}).get("kind") or {}
    if operation != "CREATE" or kind.get("kind") != "Pod" or not pod_requests_gpu(pod):
        return AdmissionDecision(uid=uid, allowed=True)
    tenant = Tenant.objects.filter(Q(namespaces__contains=[namespace]) | Q(slug=namespace)).order_by("pk").first()
    if tenant is None:
        return AdmissionDecision(uid=uid, allowed=True)
    status = (
        BudgetStatus.objects.select_related("budget")
        .filter(budget__tenant=tenant, month=now.date().replace(day=1))
        .first()
    )
    if status is None or status.state != BudgetState.ENFORCED or status.budget.hard_action != BudgetAction.BLOCK:
        return AdmissionDecision(uid=uid, allowed=True)
    budget = status.budget
    name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName") or "pod"
    message = (
        f"vGPU Ledger: new GPU pods of tenant {tenant.slug} are blocked: its {now:%Y-%m} GPU budget of "
        f"{budget.amount} {budget.currency} is exhausted (month-to-date spend "
        f"{status.spend.quantize(Decimal('0.01'))} {budget.currency}). Running pods keep their guarantees. "
        f"To raise the budget, contact {budget.owner}. (pod {namespace}/{name})"
    )
    return AdmissionDecision(uid=uid, allowed=False, message=message)
