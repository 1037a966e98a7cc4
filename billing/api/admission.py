"""POST /api/v1/admission/pods: the validating admission webhook (AdmissionReview v1)."""

from __future__ import annotations

import logging

import orjson
from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.api.errors import domain_error_response
from billing.api.openapi import ERRORS, AdmissionSchema, errors
from billing.errors import DomainError, FieldError, InvalidBatch, NotAuthenticated, Overloaded
from billing.metrics import count_admission_review
from billing.services.budgets import AdmissionDecision, review_pod
from billing.services.identity import authenticate_admission_caller, client_address_of, load_admission_credentials
from billing.services.ingest import admission_reply_schema, admission_review_schema

__all__ = ["PodAdmissionView"]

log = logging.getLogger(__name__)


class PodAdmissionView(APIView):  # type: ignore[misc]  # DRF ships no type hints
    # Called by the Kubernetes API server, not by browsers or agents; it authenticates with the
    # webhook kubeconfig's bearer token or a client certificate (billing/services/identity/admission_auth.py).
    authentication_classes: list[type] = []
    permission_classes: list[type] = []
    parser_classes: list[type] = []
    schema = AdmissionSchema()

    @extend_schema(
        operation_id="review_pod_admission",
        summary="Validating admission webhook for Pods (AdmissionReview v1): budgets that block, GPU quotas",
        request={"application/json": admission_review_schema()},
        responses={
            200: OpenApiResponse(admission_reply_schema(), description="The decision, as an AdmissionReview; "
                                 "also when the check itself failed (admitted with a warning, or denied when "
                                 "VGPU_ADMISSION_FAIL_CLOSED)"),
            400: errors("Not JSON, not an admission.k8s.io/v1 AdmissionReview, or a field beyond its bound"),
            401: OpenApiResponse({"allOf": [ERRORS, admission_reply_schema()]},
                                 description="No valid credential, or none configured; nothing changed. The "
                                 "body is both the error shape and an AdmissionReview that denies"),
        },
    )
    def post(self, request: Request) -> Response:
        credentials = load_admission_credentials()
        try:
            # Before the body is read: an unauthenticated review must change nothing.
            authenticate_admission_caller(
                credentials=credentials, authorization=request.headers.get("Authorization", ""),
                client_cert_dn=request.headers.get(credentials.cert_header) if credentials.cert_header else None,
                client=client_address_of(request.META))
        except Overloaded as exc:
            count_admission_review("unauthenticated")
            return domain_error_response(exc)
        except NotAuthenticated as exc:
            log.warning("event=admission_review_unauthenticated remote=%s reason=%s", request.META.get("REMOTE_ADDR"), exc)
            count_admission_review("unauthenticated")
            return _unauthenticated(request, exc)
        try:
            try:
                review = orjson.loads(request._request.body)
            except orjson.JSONDecodeError as exc:
                raise InvalidBatch([FieldError("$", f"body is not JSON: {exc}")]) from exc
            decision = review_pod(review, now=timezone.now())
        except DomainError as exc:
            count_admission_review("invalid")
            return domain_error_response(exc)
        except Exception:  # the webhook must answer; the configured policy decides how
            uid = _uid(request)
            log.exception("event=admission_review_failed uid=%s fail_closed=%s", uid, settings.VGPU_ADMISSION_FAIL_CLOSED)
            if settings.VGPU_ADMISSION_FAIL_CLOSED:
                decision = AdmissionDecision(uid=uid, allowed=False,
                                             message="vGPU Ledger could not check the GPU budget; failing closed")
            else:
                decision = AdmissionDecision(uid=uid, allowed=True,
                                             warnings=("vGPU Ledger could not check the GPU budget; admitted",))
            count_admission_review("failed_closed" if settings.VGPU_ADMISSION_FAIL_CLOSED else "failed_open")
        else:
            count_admission_review("allowed" if decision.allowed else "denied")
        return Response(decision.response())


def _unauthenticated(request: Request, exc: NotAuthenticated) -> Response:
    """401 with the protocol's error body, shaped as an AdmissionReview too, so whoever reads it
    (the API server's log, an operator with curl) sees the reason."""
    response = domain_error_response(exc)
    response.data |= {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": _uid(request), "allowed": False, "status": {"code": 401, "message": str(exc)}},
    }
    return response


def _uid(request: Request) -> str:
    try:
        return str(orjson.loads(request._request.body)["request"]["uid"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return ""
