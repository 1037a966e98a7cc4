"""POST /api/v1/admission/pods: the validating admission webhook (AdmissionReview v1)."""

from __future__ import annotations

import hmac
import logging

import orjson
from django.conf import settings
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.api.errors import domain_error_response
from billing.errors import DomainError, FieldError, InvalidBatch, NotAuthenticated
from billing.services.admission import AdmissionDecision, review_pod

__all__ = ["PodAdmissionView"]

log = logging.getLogger(__name__)


class PodAdmissionView(APIView):
    # Called by the Kubernetes API server, not by browsers or agents. When
    # VGPU_ADMISSION_TOKEN is set the caller must present it as a bearer token.
    authentication_classes: list[type] = []
    permission_classes: list[type] = []
    parser_classes: list[type] = []

    def post(self, request: Request) -> Response:
        try:
            expected = settings.VGPU_ADMISSION_TOKEN
            if expected:
                given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
                if not hmac.compare_digest(given.encode(), expected.encode()):
                    raise NotAuthenticated("admission webhook token missing or wrong")
            try:
                review = orjson.loads(request._request.body)
            except orjson.JSONDecodeError as exc:
                raise InvalidBatch([FieldError("$", f"body is not JSON: {exc}")]) from exc
            decision = review_pod(review, now=timezone.now())
        except DomainError as exc:
            return domain_error_response(exc)
        except Exception:  # noqa: BLE001 - the webhook must answer; the configured policy decides how
            uid = _uid(request)
            log.exception("event=admission_review_failed uid=%s fail_closed=%s", uid, settings.VGPU_ADMISSION_FAIL_CLOSED)
            if settings.VGPU_ADMISSION_FAIL_CLOSED:
                decision = AdmissionDecision(uid=uid, allowed=False,
                                             message="vGPU Ledger could not check the GPU budget; failing closed")
            else:
                decision = AdmissionDecision(uid=uid, allowed=True,
                                             warnings=("vGPU Ledger could not check the GPU budget; admitted",))
        return Response(decision.response())


def _uid(request: Request) -> str:
    try:
        return str(orjson.loads(request._request.body)["request"]["uid"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return ""
