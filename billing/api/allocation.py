"""OpenCost's allocation API (docs/allocation-api.md): `GET /allocation` and
`GET /allocation/compute`, also under /api/v1/. Thin: parse the query parameters
(billing.queries.allocation), one query, render OpenCost's response shape.

Both paths answer the same: OpenCost's /allocation reads its precomputed store and /compute
computes on the fly; here every answer is computed from the ledger at request time, so there is
nothing to tell apart, and a client written for either works.

Numbers are JSON numbers (floats), as OpenCost sends them, because OpenCost's clients parse them so;
the ledger keeps the exact Decimals and invoices their one rounding, so a client adding floats gets
totals right to the cent, not to the ledger unit.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.queries.allocation import (
    LABEL_PREFIX,
    Allocation,
    ParameterError,
    Window,
    align_window,
    allocation_sets,
    parse_aggregate,
    parse_bool,
    parse_filter,
    parse_step,
    parse_window,
    set_windows,
)
from billing.scope import get_scope

__all__ = ["AllocationView"]

# OpenCost's names for the unaggregated properties; ours keep their own names.
_RESPONSE = inline_serializer("AllocationResponse", {
    "code": serializers.IntegerField(),
    "window": inline_serializer("AllocationWindow", {"start": serializers.DateTimeField(),
                                                     "end": serializers.DateTimeField()}),
    "data": serializers.ListField(child=serializers.DictField(), help_text=(
        "One set per step: allocation name -> {name, properties, window, start, end, minutes, gpuHours, gpuCost, "
        "gpuUsageCost, sharedIdleCost, totalCost, currency, gpuMemUsedMBSeconds, gpuMemGrantedMBSeconds, "
        "gpuMemRequestedMBSeconds, gpuSMUsedSeconds, gpuSMGrantedSeconds, gpuSMRequestedSeconds}")),
})
_ERROR = inline_serializer("AllocationError", {"code": serializers.IntegerField(),
                                               "message": serializers.CharField(),
                                               "parameter": serializers.CharField(required=False)})


def _param(name: str, description: str, *, required: bool = False, kind: Any = OpenApiTypes.STR) -> OpenApiParameter:
    return OpenApiParameter(name, kind, OpenApiParameter.QUERY, required=required, description=description)


_PARAMETERS = [
    _param("window", "today, yesterday, week, month, lastweek, lastmonth; a duration (30m, 24h, 7d, 2w); or "
                     "start,end in RFC 3339 or Unix seconds. UTC; aligned to whole hours.", required=True),
    _param("aggregate", "Comma-separated: cluster, node, namespace, controllerKind, controller, pod, container, "
                        "tenant, gpu_model, sla_tier, gpu, label:<name>. Default: cluster,node,namespace,pod,container."),
    _param("step", "Duration of each set, whole hours (1h, 6h, 1d, 1w). Default: one set."),
    _param("accumulate", "true: one set over the whole window.", kind=OpenApiTypes.BOOL),
    _param("includeIdle", "true: the platform's idle as __idle__ (finance and admins only).", kind=OpenApiTypes.BOOL),
    _param("shareIdle", "true: the platform's idle spread onto the allocations by usage charge.",
           kind=OpenApiTypes.BOOL),
    _param("idleByNode", "true: idle per node (<node>/__idle__), and shared per node.", kind=OpenApiTypes.BOOL),
    _param("filter", 'OpenCost filter, equality only: namespace:"a","b"+label[app]:"web".'),
    _param("resolution", "Accepted for OpenCost clients and ignored: the ledger's resolution is one hour."),
]


def _number(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _properties(allocation: Allocation) -> dict[str, Any]:
    """OpenCost's shape: labels under `labels`, every other key by its name."""
    out: dict[str, Any] = {}
    for key, value in allocation.properties.items():
        if key.startswith(LABEL_PREFIX):
            out.setdefault("labels", {})[key[len(LABEL_PREFIX):]] = value
        else:
            out[key] = value
    return out


def _render(allocation: Allocation, window: Window) -> dict[str, Any]:
    return {
        "name": allocation.name,
        "properties": _properties(allocation),
        "window": {"start": _iso(window.start), "end": _iso(window.end)},
        "start": _iso(allocation.start),
        "end": _iso(allocation.end),
        "minutes": float(allocation.minutes),
        "gpuHours": float(allocation.gpu_hours),
        # OpenCost folds shared idle into the resource's cost; the parts are ours.
        "gpuCost": float(allocation.total_cost),
        "gpuUsageCost": float(allocation.gpu_cost),
        "sharedIdleCost": float(allocation.shared_idle_cost),
        "totalCost": float(allocation.total_cost),
        "currency": allocation.currency,
        "gpuMemUsedMBSeconds": float(allocation.mem_used_mb_s),
        "gpuMemGrantedMBSeconds": float(allocation.mem_granted_mb_s),
        "gpuMemRequestedMBSeconds": _number(allocation.mem_requested_mb_s),
        "gpuSMUsedSeconds": float(allocation.sm_used_s),
        "gpuSMGrantedSeconds": float(allocation.sm_granted_s),
        "gpuSMRequestedSeconds": _number(allocation.sm_requested_s),
    }


def _error(status: int, message: str, parameter: str | None = None) -> Response:
    body: dict[str, Any] = {"code": status, "message": message}
    if parameter is not None:
        body["parameter"] = parameter
    return Response(body, status=status)


class AllocationView(APIView):  # type: ignore[misc]  # DRF ships no type hints
    """DRF's default authentication (sessions; API tokens where configured) and IsAuthenticated."""

    permission_classes = [IsAuthenticated]

    def get_authenticate_header(self, request: Request) -> str:
        # 401 rather than DRF's 403 for a session-only setup: the caller has not said who it is.
        header = super().get_authenticate_header(request)
        return str(header) if header else 'Bearer realm="vgpu-ledger"'

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, ParameterError):
            return _error(400, str(exc), exc.parameter)
        response: Response = super().handle_exception(exc)
        if isinstance(exc, exceptions.APIException):
            # OpenCost's error shape, for 401 and every other DRF answer.
            response.data = {"code": response.status_code, "message": str(exc.detail)}
        return response

    @extend_schema(
        operation_id="get_allocation", summary="OpenCost-compatible GPU cost allocation",
        parameters=_PARAMETERS,
        responses={200: _RESPONSE, 400: OpenApiResponse(_ERROR, description="A parameter is wrong; `parameter` names it"),
                   401: OpenApiResponse(_ERROR, description="Not authenticated")},
    )
    def get(self, request: Request) -> Response:
        query = request.query_params
        window = align_window(parse_window(query.get("window", ""), now=timezone.now()))
        aggregate = parse_aggregate(query.get("aggregate"))
        step = parse_step(query.get("step"))
        accumulate = parse_bool("accumulate", query.get("accumulate"), default=False)
        include_idle = parse_bool("includeIdle", query.get("includeIdle"), default=False)
        share_idle = parse_bool("shareIdle", query.get("shareIdle"), default=False)
        idle_by_node = parse_bool("idleByNode", query.get("idleByNode"), default=False)
        filters = parse_filter(query.get("filter"))
        sets = allocation_sets(get_scope(request.user), window=window, aggregate=aggregate, step=step,
                               accumulate=accumulate, include_idle=include_idle, share_idle=share_idle,
                               idle_by_node=idle_by_node, filters=filters)
        windows = set_windows(window, None if accumulate else step)
        return Response({
            "code": 200,
            "window": {"start": _iso(window.start), "end": _iso(window.end)},
            "data": [{name: _render(a, w) for name, a in one.items()} for one, w in zip(sets, windows, strict=True)],
        })
