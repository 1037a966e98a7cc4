"""OpenCost's allocation API (docs/allocation-api.md): `GET /allocation` and
`GET /allocation/compute`, also under /api/v1/. Thin: parse the query parameters
(billing.api.allocation_params), one query, render OpenCost's response shape.

Both paths answer the same: OpenCost's /allocation reads its precomputed store and /compute
computes on the fly; here every answer is computed from the ledger at request time, so there is
nothing to tell apart, and a client written for either works.

Numbers are JSON numbers (floats), as OpenCost sends them, because OpenCost's clients parse them so;
the ledger keeps the exact Decimals and invoices their one rounding, so a client adding floats gets
totals right to the cent, not to the ledger unit.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone
from django.utils.translation import gettext
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import BrowsableAPIRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.api.allocation_params import (
    legacy_filter_tree,
    parse_accumulate,
    parse_aggregate,
    parse_bool,
    parse_filter,
    parse_filter_tree,
    parse_step,
    parse_window,
)
from billing.api.renderers import FastJSONRenderer, SharedFields
from billing.ledger import allocation as ledger
from billing.ledger.reads import no_cycle_collection
from billing.money import ledger_amount
from billing.queries.allocation import (
    LABEL_PREFIX,
    CostAllocation,
    ParameterError,
    Window,
    align_window,
    allocation_sets,
    node_assets,
    set_windows,
)
from billing.queries.snapshot import one_snapshot
from billing.scope import get_scope

__all__ = ["MAX_ALLOCATIONS", "AllocationSummaryView", "AllocationView", "AssetsView", "AutocompleteView"]

# OpenCost's names for the unaggregated properties; ours keep their own names.
_RESPONSE = inline_serializer("AllocationResponse", {
    "code": serializers.IntegerField(),
    "status": serializers.CharField(help_text="success"),
    "data": serializers.ListField(child=serializers.DictField(), help_text=(
        "One set per step: allocation name -> OpenCost's Allocation (every field of its AllocationJSON: "
        "cpu*, gpu*, network*, loadBalancer*, pv*, ram*, sharedCost, externalCost, totalCost, totalEfficiency, "
        "gpuAllocation...) and ours: gpuUsageCost, sharedIdleCost, currency, gpuMem*, gpuSM*")),
})
_ERROR = inline_serializer("AllocationError", {"code": serializers.IntegerField(),
                                               "message": serializers.CharField(),
                                               "parameter": serializers.CharField(required=False)})


def _param(name: str, description: str, *, required: bool = False, kind: Any = OpenApiTypes.STR) -> OpenApiParameter:
    return OpenApiParameter(name, kind, OpenApiParameter.QUERY, required=required, description=description)


_PARAMETERS = [
    _param("window", "today, yesterday, week, month, lastweek, lastmonth; a duration (30m, 24h, 7d, 2w); or "
                     "start,end in RFC 3339 or Unix seconds. UTC; aligned to whole hours.", required=True),
    _param("aggregate", "Comma-separated: all, cluster, node, namespace, controllerKind, controller, deployment, "
                        "statefulset, daemonset, job, service, pod, container, label:<name>, annotation:<name>, "
                        "tenant, gpu_model, sla_tier, gpu; unknown keys are dropped, as OpenCost drops them. "
                        "Default: cluster,node,namespace,pod,container."),
    _param("step", "Duration of each set (30m, 1h, 1d, 1w), rounded up to whole hours. Default: one set."),
    _param("accumulate", "true or all: one set; hour, day, week, month, quarter: one set per calendar unit."),
    _param("accumulateBy", "Same as accumulate (Kubecost's name)."),
    _param("idle", "Same as includeIdle (OpenCost's name).", kind=OpenApiTypes.BOOL),
    _param("includeIdle", "true: the platform's idle as __idle__ (finance and admins only).", kind=OpenApiTypes.BOOL),
    _param("shareIdle", "true: the platform's idle spread onto the allocations by usage charge.",
           kind=OpenApiTypes.BOOL),
    _param("idleByNode", "true: idle computed and shared per node.", kind=OpenApiTypes.BOOL),
    _param("splitIdle", "true: idle per node (idleByNode) or per cluster, <node>/__idle__.", kind=OpenApiTypes.BOOL),
    _param("filter", 'OpenCost filter: namespace:"a","b"+label[app]:"web", !:, ~:, <~:, ~>:, | and parentheses.'),
    _param("filterNamespaces", "OpenCost's older filters (filterClusters, filterNodes, filterPods, filterLabels...)."),
    _param("resolution", "Accepted for OpenCost clients and ignored: the ledger's resolution is one hour."),
]


def _number(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def _per_kwh(joules_times_rate: Decimal | None, *, money: bool) -> float | None:
    """Σ joules × a per-kWh rate as that rate's unit (money at ledger precision); None where unknown."""
    if joules_times_rate is None:
        return None
    if not joules_times_rate:
        return 0.0  # no energy drawn: 0 at any precision, without a quantize per allocation
    value = joules_times_rate / _J_PER_KWH
    return float(ledger_amount(value) if money else value)


# A set's allocations share its window and a few hours as their start and end: 4 of these per
# allocation were 0.34 s of a per-pod month's 2.7 s answer at 1,000 GPUs (docs/benchmarks.md).
@functools.lru_cache(maxsize=4096)
def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


# One dict per set's window, shared by its allocations (the renderer only reads it).
@functools.lru_cache(maxsize=1024)
def _window(window: Window) -> dict[str, str]:
    return {"start": _iso(window.start), "end": _iso(window.end)}


@functools.lru_cache(maxsize=256)
def _written_as_they_are(keys: tuple[str, ...]) -> bool:
    """Whether properties of these keys are OpenCost's as they are (_properties changes none)."""
    return not any(k.startswith((LABEL_PREFIX, ledger.ANNOTATION_PREFIX)) or k in ("controller", "service")
                   for k in keys)


def _properties(allocation: CostAllocation) -> Mapping[str, Any]:
    """OpenCost's AllocationProperties: labels under `labels`, annotations under `annotations`,
    `controller` the bare name beside `controllerKind` (the allocation's name keeps `kind:name`),
    `service` as OpenCost's `services` list. Properties of other keys only are the allocation's own
    (the answer only reads them): a set's allocations share their keys, and looking at each key of
    each was 0.1 s of a month's answer at 1,000 GPUs per pod and container."""
    properties = allocation.properties
    if _written_as_they_are(tuple(properties)):
        return properties
    out: dict[str, Any] = {}
    for key, value in properties.items():
        if key.startswith(LABEL_PREFIX):
            out.setdefault("labels", {})[key[len(LABEL_PREFIX):]] = value
        elif key.startswith(ledger.ANNOTATION_PREFIX):
            out.setdefault("annotations", {})[key[len(ledger.ANNOTATION_PREFIX):]] = value
        elif key == "controller" and ":" in value:
            kind, _, name = value.partition(":")
            out["controller"] = name
            out.setdefault("controllerKind", kind)
        elif key == "service":
            out["services"] = [value]
        else:
            out[key] = value
    return out


# OpenCost's Allocation fields for resources the ledger does not meter: present, and 0.
# Joules in a kilowatt-hour.
_J_PER_KWH = Decimal(3_600_000)

_ZERO_FIELDS = (
    "cpuCores", "cpuCoreRequestAverage", "cpuCoreLimitAverage", "cpuCoreUsageAverage", "cpuCoreHours", "cpuCost",
    "cpuCostAdjustment", "cpuCostIdle", "cpuEfficiency", "networkTransferBytes", "networkReceiveBytes",
    "networkCost", "networkCrossZoneCost", "networkCrossRegionCost", "networkInternetCost", "networkCostAdjustment",
    "loadBalancerCost", "loadBalancerCostAdjustment", "pvBytes", "pvByteHours", "pvCost", "pvCostAdjustment",
    "ramBytes", "ramByteRequestAverage", "ramByteLimitAverage", "ramByteUsageAverage", "ramByteHours", "ramCost",
    "ramCostAdjustment", "ramCostIdle", "ramEfficiency", "gpuCostAdjustment", "sharedCost", "externalCost",
)
# The fields every workload allocation has alike, written once as JSON and closing each (SharedFields):
# a per-pod month's 39k allocations at 1,000 GPUs are built and written in less than the 378 ms they
# took as dicts of all seventy-five fields (docs/benchmarks.md).
_SAME = SharedFields({
    **dict.fromkeys(_ZERO_FIELDS, 0.0), "pvs": {}, "lbAllocations": None, "proportionalAssetResourceCosts": None,
    "sharedCostBreakdown": None,
})


def _gpu(minutes: float, gpu_hours: float, sm_used_s: float, sm_granted_s: float) -> tuple[float, float, float]:
    """The GPU figures OpenCost derives (Allocation.GPUs, GPUEfficiency) of a workload allocation:
    GPUs held on average over its minutes, the SM share of them used, and that ratio. Ratios of
    the figures' floats, as a client would divide them."""
    hours = minutes / 60
    count = gpu_hours / hours if hours > 0 else 0.0
    # SM-seconds used over SM-seconds granted: the card share the workload kept busy.
    efficiency = sm_used_s / sm_granted_s if sm_granted_s > 0 else 0.0
    return count, count * efficiency, efficiency


def _render(allocation: CostAllocation, window: Window) -> dict[str, Any]:
    # Unpacked once, by position (CostAllocation's field order): a per-pod month renders ~40k of them
    # at 1,000 GPUs, and thirty attribute reads of a named tuple each were a third of this function.
    (name, properties, start, end, minutes, gpu_hours, gpu_cost, shared_idle_cost, total_cost, currency,
     mem_used_mb_s, mem_granted_mb_s, mem_requested_mb_s, sm_used_s, sm_granted_s, sm_requested_s, _seconds,
     is_idle, energy_j, energy_cost_jp, co2e_jkg) = allocation
    # Each converted once (a Decimal's float goes through its text; a float's is itself).
    minutes_f, hours, sm_used, sm_granted = float(minutes), float(gpu_hours), float(sm_used_s), float(sm_granted_s)
    count, usage, efficiency = (0.0, 0.0, 0.0) if is_idle else _gpu(minutes_f, hours, sm_used, sm_granted)
    total = float(total_cost)
    shared_idle = float(shared_idle_cost)
    return {
        "name": name,
        "properties": _properties(allocation),
        "window": _window(window),
        "start": _iso(start),
        "end": _iso(end),
        "minutes": minutes_f,
        "gpuCount": count,
        # OpenCost keeps these two on the Allocation but writes them only inside gpuAllocation
        # (allocation_json.go: `json:"-"`); clients read both places, so both carry them.
        "gpuRequestAverage": count,
        "gpuUsageAverage": usage,
        "gpuHours": hours,
        # OpenCost folds shared idle into the resource's cost; the parts are ours.
        "gpuCost": total,
        "gpuCostIdle": _cost_idle(total, shared_idle, is_idle=is_idle),
        "gpuEfficiency": efficiency,
        "totalCost": total,
        # GPUs are the only resource with a cost here, so the cost-weighted efficiency is the GPU's.
        "totalEfficiency": efficiency,
        "gpuAllocation": None if is_idle else {
            "gpuDevice": "", "gpuModel": str(properties.get("gpu_model", "")),
            "gpuUUID": str(properties.get("gpu", "")), "isGPUShared": None,
            "gpuUsageAverage": usage, "gpuRequestAverage": count,
        },
        # Ours.
        "gpuUsageCost": float(gpu_cost),
        "sharedIdleCost": shared_idle,
        "currency": currency,
        "gpuMemUsedMBSeconds": float(mem_used_mb_s),
        "gpuMemGrantedMBSeconds": float(mem_granted_mb_s),
        "gpuMemRequestedMBSeconds": _number(mem_requested_mb_s),
        "gpuSMUsedSeconds": sm_used,
        "gpuSMGrantedSeconds": sm_granted,
        "gpuSMRequestedSeconds": _number(sm_requested_s),
        # GPU energy as the ledger split it (docs/billing.md, Energy; docs/allocation-api.md).
        "gpuEnergyKWh": float(energy_j / _J_PER_KWH) if energy_j else 0.0,
        # What it cost and emitted at its nodes' locations (docs/allocation-api.md); null where unknown.
        "gpuEnergyCost": _per_kwh(energy_cost_jp, money=True),
        "gpuCO2eKg": _per_kwh(co2e_jkg, money=False),
        **_SAME.member,
    }


def _cost_idle(total: float, shared_idle: float, *, is_idle: bool) -> float:
    """OpenCost's gpuCostIdle: an idle allocation's whole cost, a workload's shared idle."""
    return total if is_idle else shared_idle


# OpenCost's SummaryAllocation: the fields its summary endpoints write, with _render's values, built
# alone: a per-pod month's summary is ~40k of them at 1,000 GPUs, and building each whole
# Allocation body to keep a third of it was 0.15 s of the answer's 1.2-1.3 s (docs/benchmarks.md).
def _summary(allocation: CostAllocation, window: Window) -> dict[str, Any]:
    (name, _props, start, end, minutes, gpu_hours, _gpu_cost, shared_idle_cost, total_cost, currency,
     _mem_used, _mem_granted, _mem_requested, sm_used_s, sm_granted_s, *_rest) = allocation
    is_idle = allocation.is_idle
    hours = float(gpu_hours)
    count, usage, efficiency = (0.0, 0.0, 0.0) if is_idle else _gpu(float(minutes), hours, float(sm_used_s),
                                                                      float(sm_granted_s))
    total = float(total_cost)
    return {
        "name": name, "properties": _properties(allocation), "window": _window(window), "start": _iso(start),
        "end": _iso(end), "cpuCoreRequestAverage": 0.0, "cpuCoreUsageAverage": 0.0, "cpuCost": 0.0,
        "cpuCostIdle": 0.0, "gpuRequestAverage": count, "gpuUsageAverage": usage, "gpuCost": total,
        "gpuCostIdle": _cost_idle(total, float(shared_idle_cost), is_idle=is_idle), "networkCost": 0.0,
        "loadBalancerCost": 0.0, "pvCost": 0.0, "ramCost": 0.0, "ramCostIdle": 0.0, "sharedCost": 0.0,
        "externalCost": 0.0, "totalCost": total, "totalEfficiency": efficiency, "gpuEfficiency": efficiency,
        "gpuCount": count, "gpuHours": hours, "currency": currency, "ramBytesRequestAverage": 0.0,
        "ramBytesUsageAverage": 0.0,
    }


def _error(status: int, message: str, parameter: str | None = None) -> Response:
    body: dict[str, Any] = {"code": status, "status": "error", "message": message}
    if parameter is not None:
        body["parameter"] = parameter
    return Response(body, status=status)


# Parameters OpenCost's handler parses that change nothing here: shared overhead (namespaces,
# labels, a fixed cost) and asset reconciliation have no counterpart in a GPU-only ledger.
_IGNORED_BOOLEANS = ("reconcile", "shareTenancyCosts", "includeSharedCostBreakdown",
                     "includeProportionalAssetResourceCosts", "includeAggregatedMetadata")


@dataclass(frozen=True)
class _Query:
    window: Window
    aggregate: tuple[str, ...]
    step: timedelta | None
    accumulate: str | None
    include_idle: bool
    share_idle: bool
    idle_by_node: bool
    split_idle: bool
    tree: ledger.FilterTree | None
    filters: dict[str, tuple[str, ...]]


def _and(*trees: ledger.FilterTree | None) -> ledger.FilterTree | None:
    present = tuple(t for t in trees if t is not None)
    return None if not present else present[0] if len(present) == 1 else ledger.AllOf(present)


def _parse(request: Request) -> _Query:
    query = request.query_params
    accumulate = parse_accumulate(query.get("accumulate"))
    if accumulate is None and query.get("accumulateBy"):
        accumulate = parse_accumulate(query.get("accumulateBy"))
    for name in _IGNORED_BOOLEANS:
        parse_bool(name, query.get(name), default=False)
    include_idle = parse_bool("includeIdle", query.get("includeIdle"), default=False)
    include_idle = parse_bool("idle", query.get("idle"), default=include_idle)
    # OpenCost's filter: the v2 language; an old equality-only filter also reads as v2.
    tree = parse_filter_tree(query.get("filter"))
    return _Query(
        window=align_window(parse_window(query.get("window", ""), now=timezone.now())),
        aggregate=parse_aggregate(query.get("aggregate")),
        step=parse_step(query.get("step")),
        accumulate=accumulate,
        include_idle=include_idle,
        share_idle=parse_bool("shareIdle", query.get("shareIdle"), default=False),
        idle_by_node=parse_bool("idleByNode", query.get("idleByNode"), default=False),
        split_idle=parse_bool("splitIdle", query.get("splitIdle"), default=False),
        tree=_and(tree, legacy_filter_tree(query)),
        filters=parse_filter(None),
    )


# The most workload allocations one answer holds (idle's come on top: a few per set). A week of
# per-pod hourly sets at 1,000 GPUs is 922k of them: 1.8 GB of JSON and 75 s, enough to take a web
# worker's memory; 100k is about 190 MB and a few seconds (docs/allocation-api.md, Limits).
MAX_ALLOCATIONS = 100_000


# One instant of the ledger for the whole answer (its groups, read in parts side by side where they
# are per pod, its idle and its currency), as a page reads it.
@one_snapshot()
def _sets(request: Request, q: _Query, *, quantities: bool = True) -> list[tuple[dict[str, CostAllocation], Window]]:
    # The figures as floats (each the double nearest the ledger's): they are written as JSON numbers.
    sets = allocation_sets(get_scope(request.user), window=q.window, aggregate=q.aggregate, step=q.step,
                           accumulate=q.accumulate, include_idle=q.include_idle, share_idle=q.share_idle,
                           idle_by_node=q.idle_by_node, split_idle=q.split_idle, filters=q.filters, tree=q.tree,
                           max_allocations=MAX_ALLOCATIONS, quantities=quantities, floats=True)
    windows = set_windows(q.window, q.step, q.accumulate)
    return list(zip(sets, windows, strict=True))


class _OpenCostView(APIView):  # type: ignore[misc]  # DRF ships no type hints
    """DRF's default authentication (sessions; API tokens where configured), IsAuthenticated, and
    OpenCost's error shape for every answer that is not a 200."""

    permission_classes = [IsAuthenticated]
    # Their answers can be tens of MB (billing.api.renderers); the browsable API as DRF's default.
    renderer_classes = [FastJSONRenderer, BrowsableAPIRenderer]

    def get_authenticate_header(self, request: Request) -> str:
        # 401 rather than DRF's 403 for a session-only setup: the caller has not said who it is.
        header = super().get_authenticate_header(request)
        return str(header) if header else 'Bearer realm="vgpu-ledger"'

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # The cycle collector paused while the answer is built and rendered, not only while
        # allocation_sets reads it: a per-pod month's ~40k allocation bodies (a few dicts each) set off
        # collections that walk every object the answer already holds. Rendered here, under the pause
        # (Django would render it after the view returns): with the collector back on first, the
        # next full collection walked the whole answer before it was written, and one run in five
        # took 1.8 s instead of 1.0. At 1,000 GPUs x 31 days the per-pod month went from 1.47 s to
        # 1.24, its summary from 1.21 to 1.02 and with shared idle per node from 1.84 to 1.54
        # (docs/benchmarks.md). The bodies hold no reference cycles: they go with the response.
        with no_cycle_collection():
            response = super().dispatch(request, *args, **kwargs)
            if isinstance(response, Response):
                response.render()
            return response

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, ParameterError):
            return _error(400, str(exc), exc.parameter)
        response: Response = super().handle_exception(exc)
        if isinstance(exc, exceptions.APIException):
            # OpenCost's error shape, for 401 and every other DRF answer.
            response.data = {"code": response.status_code, "status": "error", "message": str(exc.detail)}
        return response


def _success(data: Any) -> Response:
    return Response({"code": 200, "status": "success", "data": data})


class AllocationView(_OpenCostView):
    """`/allocation`, `/allocation/compute`: OpenCost's AllocationSetRange, one map per set."""

    @extend_schema(
        operation_id="get_allocation", summary="OpenCost-compatible GPU cost allocation",
        parameters=_PARAMETERS,
        responses={200: _RESPONSE, 400: OpenApiResponse(_ERROR, description="A parameter is wrong; `parameter` names it"),
                   401: OpenApiResponse(_ERROR, description="Not authenticated")},
    )
    def get(self, request: Request) -> Response:
        return _success([{name: _render(a, w) for name, a in one.items()} for one, w in _sets(request, _parse(request))])


class AllocationSummaryView(_OpenCostView):
    """`/allocation/summary`, `/allocation/compute/summary`: OpenCost's SummaryAllocationSetRange
    (`{step, sets: [{allocations, window}], window}`; step in nanoseconds, as Go writes a Duration)."""

    @extend_schema(operation_id="get_allocation_summary", summary="OpenCost-compatible allocation summary",
                   parameters=_PARAMETERS, responses={200: OpenApiTypes.OBJECT, 400: _ERROR, 401: _ERROR})
    def get(self, request: Request) -> Response:
        q = _parse(request)
        # A summary shows no memory, request or energy figure (_summary): they are not read.
        pairs = _sets(request, q, quantities=False)
        step = (pairs[0][1].end - pairs[0][1].start) if pairs else timedelta(0)
        return _success({
            "step": int(step.total_seconds()) * 1_000_000_000,
            "sets": [{"allocations": {name: _summary(a, w) for name, a in one.items()}, "window": _window(w)}
                     for one, w in pairs],
            "window": _window(q.window),
        })


_AUTOCOMPLETE_FIELDS = ("cluster", "node", "namespace", "controllerKind", "controllerName", "pod", "container",
                        "tenant", "gpu_model", "sla_tier")
MAX_AUTOCOMPLETE = 1000


class AutocompleteView(_OpenCostView):
    """`/allocation/autocomplete?window=&field=namespace&search=te&limit=`: the values of one field
    over the window (Kubecost's endpoint; OpenCost's UI offers them in its filter box)."""

    @extend_schema(operation_id="get_allocation_autocomplete", summary="Values of one allocation field",
                   responses={200: OpenApiTypes.OBJECT, 400: _ERROR, 401: _ERROR})
    def get(self, request: Request) -> Response:
        query = request.query_params
        field_name = (query.get("field") or "namespace").strip()
        label = field_name[len("label:"):] if field_name.startswith("label:") else None
        if field_name not in _AUTOCOMPLETE_FIELDS and not label:
            raise ParameterError("field", gettext("use one of %(fields)s or label:<name>")
                                 % {"fields": ", ".join(_AUTOCOMPLETE_FIELDS)})
        search = (query.get("search") or "").strip()
        limit_text = (query.get("limit") or str(MAX_AUTOCOMPLETE)).strip()
        if not limit_text.isdigit() or not 0 < int(limit_text) <= MAX_AUTOCOMPLETE:
            raise ParameterError("limit", gettext("must be a whole number from 1 to %(max)d") % {"max": MAX_AUTOCOMPLETE})
        window = align_window(parse_window(query.get("window") or "7d", now=timezone.now()))
        tree = ledger.Match(key=field_name, op="contains", values=(search,)) if search else None
        [one] = allocation_sets(get_scope(request.user), window=window, aggregate=[field_name], accumulate=True,
                                tree=tree)
        values = sorted({str(a.properties.get(field_name, "")) for a in one.values()} - {""})
        return _success(values[:int(limit_text)])


class AssetsView(_OpenCostView):
    """`/assets`: OpenCost's AssetSetRange with one Node asset per node that has GPUs (their cost
    only: the ledger prices GPUs, not CPU, memory or disks). A tenant scope gets none: nodes are
    the platform's."""

    @extend_schema(operation_id="get_assets", summary="OpenCost-compatible GPU node assets",
                   responses={200: OpenApiTypes.OBJECT, 400: _ERROR, 401: _ERROR})
    def get(self, request: Request) -> Response:
        query = request.query_params
        window = align_window(parse_window(query.get("window", ""), now=timezone.now()))
        accumulate = parse_accumulate(query.get("accumulate"))
        windows = set_windows(window, parse_step(query.get("step")), accumulate)
        scope = get_scope(request.user)
        data = []
        for w in windows:
            assets = node_assets(scope, window=w)
            data.append({f"{a.cluster}/{a.node}": _asset(a, w) for a in assets})
        return _success(data)


def _asset(a: ledger.NodeAssetRow, window: Window) -> dict[str, Any]:
    end = a.last_hour + timedelta(hours=1)
    start, end = max(a.first_hour, window.start), min(end, window.end)
    minutes = (end - start).total_seconds() / 60
    gpu_hours = float(a.metered_seconds) / 3600
    return {
        "type": "Node",
        "properties": {"category": "Compute", "service": "Kubernetes", "cluster": a.cluster, "name": a.node,
                       "providerID": a.node},
        "labels": {}, "window": _window(window), "start": _iso(start), "end": _iso(end), "minutes": minutes,
        "nodeType": a.gpu_model, "cpuCores": 0.0, "ramBytes": 0.0, "cpuCoreHours": 0.0, "ramByteHours": 0.0,
        "GPUHours": gpu_hours, "cpuBreakdown": None, "ramBreakdown": None, "preemptible": 0.0, "discount": 0.0,
        "cpuCost": 0.0, "gpuCost": float(a.card_cost), "gpuCount": float(a.gpu_count), "ramCost": 0.0,
        "adjustment": 0.0, "totalCost": float(a.card_cost), "currency": a.currency,
    }
