"""Agent endpoints of wire protocol v1 (docs/protocol.md). Thin: parse, one service call, render."""

from __future__ import annotations

import threading

from django.conf import settings
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.api.errors import domain_error_response
from billing.api.openapi import NodeTokenSchema, errors
from billing.errors import DomainError, Overloaded, PayloadTooLarge
from billing.metrics import count_ingest_answer, count_ingested_samples
from billing.models import Node
from billing.services.identity import authenticate_node, client_address_of
from billing.services.ingest import (
    decode_body,
    get_node_policy,
    node_events_schema,
    node_policy_schema,
    record_node_events,
    record_undelivered_batches,
    record_usage_batch,
    undelivered_report_schema,
    usage_batch_schema,
)

__all__ = ["NodeEventsView", "NodePolicyView", "NodeUndeliveredView", "UsageBatchView"]

_in_flight = threading.BoundedSemaphore(settings.VGPU_INGEST_MAX_IN_FLIGHT)

_stored = inline_serializer("Stored", {"status": serializers.CharField(), "accepted": serializers.IntegerField()})
# The answers every agent endpoint can give before its body is read (401 and 503 come from the
# hook in billing.api.openapi).
_NODE_REFUSED = {
    401: errors("Missing or unknown token; a ServiceAccount token the TokenReview rejects (expired, wrong "
                "audience, pod gone, not an agent's); an API token (vgla_…)"),
    403: errors("Revoked token, or another node's"),
    503: errors("The database, or the Kubernetes API server that reviews ServiceAccount tokens, is down; "
                "nothing stored, see Retry-After"),
}
_JSON_REFUSED = {
    400: errors("Invalid body: every error with its JSON path; nothing stored"),
    413: errors("Body too large, or expanding beyond the limit when gunzipped"),
    415: errors("Not application/json, an unknown Content-Encoding, or not JSON in UTF-8"),
}


class _AgentView(APIView):  # type: ignore[misc]  # DRF ships no type hints
    # Agents authenticate with bearer tokens, not sessions: a node token or their Kubernetes
    # ServiceAccount token (billing.services.identity.tokens.authenticate_node dispatches). No CSRF
    # applies and DRF's own authentication is bypassed.
    authentication_classes: list[type] = []
    permission_classes: list[type] = []
    parser_classes: list[type] = []
    schema = NodeTokenSchema()

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, DomainError):
            return domain_error_response(exc)
        return super().handle_exception(exc)

    def _node_json(self, request: Request, node: str) -> tuple[Node, object]:
        """The node whose token this is (it must be `node`'s) and the JSON body it sent."""
        node_row = authenticate_node(authorization=request.headers.get("Authorization"), node_name=node,
                                     client=client_address_of(request.META))
        payload, _ = decode_body(
            body=request._request.body,
            content_type=request.headers.get("Content-Type"),
            content_encoding=request.headers.get("Content-Encoding"),
        )
        return node_row, payload


class UsageBatchView(_AgentView):
    @extend_schema(
        operation_id="upload_usage_batch",
        summary="Upload one usage batch (vgpu-ledger/usage-batch/v1)",
        request={"application/json": usage_batch_schema()},
        responses={
            201: OpenApiResponse(_stored, description="Stored, all of it, in one transaction"),
            200: OpenApiResponse(inline_serializer("Duplicate", {"status": serializers.CharField()}),
                                 description="The same (node, batch_seq) with the same content is already stored"),
            **_NODE_REFUSED, **_JSON_REFUSED,
            403: errors("Revoked token, or another node's; or a GPU of the batch belongs to another node"),
            409: errors("Same (node, batch_seq), different content"),
            413: errors("Body, gunzipped JSON or sample count above its limit"),
            429: errors("Shedding load; see Retry-After"),
        },
    )
    def post(self, request: Request) -> Response:
        if not _in_flight.acquire(blocking=False):
            raise Overloaded("ingest is at capacity", retry_after_s=settings.VGPU_INGEST_RETRY_AFTER_S)
        try:
            node = authenticate_node(authorization=request.headers.get("Authorization"), node_name=None,
                                     client=client_address_of(request.META))
            length = int(request.headers.get("Content-Length") or 0)
            if length > settings.VGPU_INGEST_MAX_BODY_BYTES:
                raise PayloadTooLarge(f"body of {length} bytes is above {settings.VGPU_INGEST_MAX_BODY_BYTES}")
            payload, content = decode_body(
                body=request._request.body,
                content_type=request.headers.get("Content-Type"),
                content_encoding=request.headers.get("Content-Encoding"),
            )
            result = record_usage_batch(node=node, payload=payload, content=content, now=timezone.now())
        finally:
            _in_flight.release()
        if result.status == "duplicate":
            return Response({"status": "duplicate"}, status=200)
        count_ingested_samples(result.accepted)
        return Response({"status": "stored", "accepted": result.accepted}, status=201)

    def finalize_response(self, request: Request, response: Response, *args: object, **kwargs: object) -> Response:
        # Every answer of this view, refusals included (an outage's 503 comes from OutageMiddleware, after it).
        count_ingest_answer(response.status_code)
        return super().finalize_response(request, response, *args, **kwargs)


class NodePolicyView(_AgentView):
    @extend_schema(
        operation_id="get_node_policy",
        summary="The node's policy (SLA weights, budgets, enforcement); ETag",
        parameters=[
            OpenApiParameter("If-None-Match", OpenApiTypes.STR, OpenApiParameter.HEADER,
                             description="the ETag of the policy the agent holds"),
            OpenApiParameter("ETag", OpenApiTypes.STR, OpenApiParameter.HEADER, response=[200, 304],
                             description="the policy's version, quoted"),
        ],
        responses={
            200: OpenApiResponse(node_policy_schema(), description="The policy (vgpu-ledger/node-policy/v1)"),
            304: OpenApiResponse(description="Not modified: If-None-Match named the current ETag"),
            **_NODE_REFUSED,
        },
    )
    def get(self, request: Request, node: str) -> Response:
        authenticate_node(authorization=request.headers.get("Authorization"), node_name=node,
                          client=client_address_of(request.META))
        policy = get_node_policy(node_name=node, now=timezone.now())
        etag = f'"{policy.etag}"'
        if request.headers.get("If-None-Match") == etag:
            return Response(status=304, headers={"ETag": etag})
        return Response(policy.body, headers={"ETag": etag, "Cache-Control": "no-cache"})


class NodeEventsView(_AgentView):
    parser_classes: list[type] = []

    @extend_schema(
        operation_id="post_node_events",
        summary="Enforcement actions taken by the node, for the audit log",
        request={"application/json": node_events_schema()},
        responses={201: OpenApiResponse(_stored, description="All stored, in one transaction"),
                   **_NODE_REFUSED, **_JSON_REFUSED},
    )
    def post(self, request: Request, node: str) -> Response:
        node_row, payload = self._node_json(request, node)
        count = record_node_events(node=node_row, payload=payload, now=timezone.now())
        return Response({"status": "stored", "accepted": count}, status=201)


class NodeUndeliveredView(_AgentView):
    @extend_schema(
        operation_id="post_node_undelivered",
        summary="Batches the node keeps because this service refused them (upsert on batch_seq)",
        request={"application/json": undelivered_report_schema()},
        responses={201: OpenApiResponse(_stored, description="All upserted, in one transaction"),
                   **_NODE_REFUSED, **_JSON_REFUSED},
    )
    def post(self, request: Request, node: str) -> Response:
        node_row, payload = self._node_json(request, node)
        count = record_undelivered_batches(node=node_row, payload=payload, now=timezone.now())
        return Response({"status": "stored", "accepted": count}, status=201)
