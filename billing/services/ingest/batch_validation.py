"""Validation of a usage batch against wire protocol v1 (docs/protocol.md). Pure: no queries (the
bounds come from the columns that store each field, billing.ledger.columns).

The optional grouping fields (batch `cluster`; per sample `controller_kind`, `controller_name`,
`labels`, `mem_requested_mb`, `sm_requested`; docs/protocol.md) are checked here too and gathered
into one PodMeta per pod, so a batch without them validates exactly as before.

Every rule violation is collected (up to MAX_ERRORS) with a JSON path, so an agent author
sees all problems at once; any error means nothing of the batch is stored.

This is the ingest hot path: per-sample work is kept to dictionary look-ups, float
comparisons and caches of repeated strings (timestamps, names).
"""

from __future__ import annotations

import itertools
import re
import sys
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from billing.errors import FieldError, InvalidBatch, PayloadTooLarge
from billing.ledger.batches import BatchGpuDecl, PodMeta, ValidatedBatch
from billing.ledger.columns import (
    gpu_capacity_max,
    gpu_model_max_length,
    gpu_uuid_max_length,
    workload_meta_max_length,
    workload_name_max_length,
)
from billing.models import Node
from billing.services.input_limits import max_length

__all__ = ["SCHEMA", "SCHEMA_V2", "BatchGpuDecl", "PodMeta", "ValidatedBatch", "label_problem", "summed_per_minute",
           "validate_batch"]

SCHEMA = "vgpu-ledger/usage-batch/v1"
SCHEMA_V2 = "vgpu-ledger/usage-batch/v2"  # per workload-minute integrals (docs/protocol.md)
SCHEMAS = (SCHEMA, SCHEMA_V2)
MAX_ERRORS = 50
MAX_SAMPLE_SECONDS = 3600.0
# The most a GPU may draw on average over a batch window, W: well above any board made (1,200 W), so a
# real reading is never refused, and a value past it is a unit slip (mJ for J) or a hostile number.
MAX_GPU_POWER_W = 5000
# Relative slack for float integrals compared against capacity × seconds.
_TOLERANCE = 1e-9
QUANTITIES = ("mem_used_mb_s", "mem_granted_mb_s", "sm_used_s", "sm_granted_s", "pcie_mb")
NAME_FIELDS = ("tenant", "namespace", "pod", "container", "pod_uid", "sla_tier")
# Names we accept in samples: Kubernetes-style names and UIDs, plus '_' for synthetic ones
# ("unattributed", "pid-123"). No whitespace or control characters, so COPY needs no escaping;
# matched whole (fullmatch: `$` would let a trailing newline through).
NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._:/-]*$"  # as JSON Schema (ECMA-262) reads it
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]*")
OPTIONAL_NAMES = frozenset({"container", "pod_uid", "sla_tier"})
# Each bound is the column the value lands in (raw samples share the ledger's widths).
NAME_MAX = {key: workload_name_max_length(key) for key in NAME_FIELDS}
NODE_MAX = max_length(Node, "name")
UUID_MAX = gpu_uuid_max_length()
MODEL_MAX = gpu_model_max_length()
CAPACITY_MAX = {key: gpu_capacity_max(key) for key in ("memory_mb", "sm_count")}
# PCIe has no declared capacity, so it gets a physical one: 10 TB/s per GPU, above any link
# today (NVLink 5 moves 1.8 TB/s). Memory and SM·s are bounded by the card's capacity. Either
# way a GPU-month of the largest rate fits the ledger's numeric(30, 10) columns, which a rollup
# could otherwise overflow, stopping billing for the fleet.
MAX_PCIE_MB_PER_S = 1e7
# A workload is one container on one GPU: it may be metered once per second.
_WORKLOAD = (1, 2, 3, 4)  # indexes of namespace, pod, container, pod_uid in a sample's names
_MINUTE = timedelta(minutes=1)
MINUTE_SECONDS = 60  # the most seconds a v2 window meters: one UTC minute
YEARS = (2000, 9000)
_FLOAT_MAX = sys.float_info.max

# Optional grouping fields (docs/protocol.md). Kubernetes' own syntax for what they carry, so whatever a
# real cluster holds is accepted and nothing else is: a cluster name is DNS-ish like a node's; a
# controller is a kind (CamelCase, as in ownerReferences) and an object name; labels follow
# Kubernetes' label rules (key: optional DNS-subdomain prefix of at most 253 and "/", then a name of
# at most 63; value: at most 63, may be empty). At most MAX_LABELS labels a sample: the agent sends
# only those its allow-list names, and a bound keeps a label dict from becoming a payload.
CLUSTER_MAX = max_length(Node, "cluster")
CLUSTER_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]*$"
_CLUSTER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
CONTROLLER_MAX = {key: workload_meta_max_length(key) for key in ("controller_kind", "controller_name")}
CONTROLLER_KIND_PATTERN = "^[A-Za-z][A-Za-z0-9]*$"
_KIND_RE = re.compile(r"[A-Za-z][A-Za-z0-9]*")
MAX_LABELS = 32
LABEL_NAME_MAX = 63
LABEL_PREFIX_MAX = 253
LABEL_VALUE_MAX = 63
LABEL_VALUE_PATTERN = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_LABEL_NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_LABEL_PREFIX_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*")


class _Errors:
    def __init__(self) -> None:
        self.items: list[FieldError] = []

    def add(self, path: str, message: str) -> None:
        if len(self.items) < MAX_ERRORS:
            self.items.append(FieldError(path, message))

    def __bool__(self) -> bool:
        return bool(self.items)


def _parse_time(value: Any) -> datetime:
    if not isinstance(value, str) or not value.endswith("Z"):
        raise ValueError("must be an ISO-8601 UTC timestamp ending in 'Z'")
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError("must carry a UTC offset")
    if not YEARS[0] <= parsed.year <= YEARS[1]:
        # Arithmetic on the edges of datetime's range (year 1 or 9999) would overflow.
        raise ValueError(f"must lie between the years {YEARS[0]} and {YEARS[1]}")
    return parsed.astimezone(UTC)


def _validate_header(  # noqa: PLR0912 - one check per header field, in the protocol's order
    payload: Any, errors: _Errors, *, now: datetime, max_skew: timedelta, horizon: timedelta | None
) -> tuple[Any, ...] | None:
    if not isinstance(payload, dict):
        errors.add("$", "the body must be a JSON object")
        return None
    if payload.get("schema") not in SCHEMAS:
        errors.add("$.schema", f"must be {SCHEMA!r} or {SCHEMA_V2!r}")
    node = payload.get("node")
    if not isinstance(node, str) or not 1 <= len(node) <= NODE_MAX:
        errors.add("$.node", f"must be a node name of 1 to {NODE_MAX} characters")
    seq = payload.get("batch_seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq < 2**63:
        errors.add("$.batch_seq", "must be an integer in [0, 2^63)")
    window = payload.get("window")
    start = end = None
    if not isinstance(window, dict):
        errors.add("$.window", "must be an object with 'start' and 'end'")
    else:
        for key in ("start", "end"):
            try:
                parsed = _parse_time(window.get(key))
            except (ValueError, TypeError) as exc:
                errors.add(f"$.window.{key}", str(exc))
                continue
            if key == "start":
                start = parsed
            else:
                end = parsed
        if start is not None and end is not None:
            if end <= start:
                errors.add("$.window", "end must be after start")
            elif end - start > timedelta(hours=1):
                errors.add("$.window", "a batch window may span at most one hour")
            if horizon is not None and start < now - horizon:
                errors.add(
                    "$.window.start",
                    f"is older than the late-usage horizon of {horizon.days} days; it can no longer be billed",
                )
            if end > now + max_skew:
                errors.add(
                    "$.window.end",
                    f"is {(end - now).total_seconds():.0f} s in the future; allowed clock skew is "
                    f"{max_skew.total_seconds():.0f} s",
                )
    return node, seq, start, end


def _energy(value: Any, *, path: str, window_s: float | None, errors: _Errors) -> float | None:
    """The optional `energy_j` of a batch GPU: joules it drew over the whole window (docs/protocol.md)."""
    if value is None:
        return None
    # Unknown window: a year's bound, finite, so that float() of whatever passes cannot overflow.
    top = MAX_GPU_POWER_W * (max(window_s, 0.0) if window_s is not None else 366 * 86_400.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= top:
        errors.add(f"{path}.energy_j", f"must be a number of joules from 0 to {top:g} ({MAX_GPU_POWER_W} W over the "
                                       f"{window_s or 0:g} s window)")
        return None
    return float(value)


def _validate_gpus(raw: Any, errors: _Errors, *, window_s: float | None) -> dict[str, BatchGpuDecl]:
    gpus: dict[str, BatchGpuDecl] = {}
    if not isinstance(raw, list) or not raw:
        errors.add("$.gpus", "must be a non-empty list")
        return gpus
    for i, gpu in enumerate(raw):
        path = f"$.gpus[{i}]"
        if not isinstance(gpu, dict):
            errors.add(path, "must be an object")
            continue
        uuid: Any = gpu.get("uuid")
        model: Any = gpu.get("model")
        memory_mb: Any = gpu.get("memory_mb")
        sm_count: Any = gpu.get("sm_count")
        ok = True
        if not isinstance(uuid, str) or len(uuid) > UUID_MAX or not _NAME_RE.fullmatch(uuid):
            errors.add(f"{path}.uuid", f"must be a GPU UUID of letters, digits and . _ : / - (at most {UUID_MAX})")
            ok = False
        elif uuid in gpus:
            errors.add(f"{path}.uuid", f"duplicate GPU {uuid}")
            ok = False
        if not isinstance(model, str) or not 1 <= len(model) <= MODEL_MAX or not model.isprintable():
            errors.add(f"{path}.model", f"must be the GPU model name (1-{MODEL_MAX} printable characters)")
            ok = False
        for key, value in (("memory_mb", memory_mb), ("sm_count", sm_count)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= CAPACITY_MAX[key]:
                errors.add(f"{path}.{key}", f"must be a positive integer of at most {CAPACITY_MAX[key]}")
                ok = False
        energy = _energy(gpu.get("energy_j"), path=path, window_s=window_s, errors=errors)
        if ok:
            gpus[uuid] = BatchGpuDecl(uuid=uuid, model=model, memory_mb=memory_mb, sm_count=sm_count, energy_j=energy)
    return gpus


def _split_at_minutes(start: datetime, seconds: float) -> list[tuple[datetime, float]]:
    """Pieces of [start, start+seconds) that each lie inside one UTC minute."""
    pieces = []
    end = start + timedelta(seconds=seconds)
    cursor = start
    while cursor < end:
        boundary = cursor.replace(second=0, microsecond=0) + _MINUTE
        piece_end = min(end, boundary)
        pieces.append((cursor, (piece_end - cursor).total_seconds()))
        cursor = piece_end
    return pieces

def _validate_cluster(payload: dict[str, Any], errors: _Errors) -> str | None:
    """The batch's optional cluster name; None when absent (an older agent, or none configured)."""
    if "cluster" not in payload:
        return None
    cluster = payload["cluster"]
    if not isinstance(cluster, str) or not 1 <= len(cluster) <= CLUSTER_MAX or not _CLUSTER_RE.fullmatch(cluster):
        errors.add("$.cluster", f"must be a cluster name of letters, digits and . _ - (1 to {CLUSTER_MAX} characters)")
        return None
    return cluster


def label_problem(key: Any, value: Any) -> str | None:
    """Why (key, value) is not a Kubernetes label, or None when it is one."""
    if not isinstance(key, str):
        return "label keys must be strings"
    prefix, slash, name = key.rpartition("/")
    if not 1 <= len(name) <= LABEL_NAME_MAX or not _LABEL_NAME_RE.fullmatch(name):
        return (f"key {key!r}: the name must be 1 to {LABEL_NAME_MAX} letters, digits and - _ . "
                "beginning and ending with a letter or digit")
    if slash and (not 1 <= len(prefix) <= LABEL_PREFIX_MAX or not _LABEL_PREFIX_RE.fullmatch(prefix)):
        return f"key {key!r}: the prefix must be a DNS subdomain of at most {LABEL_PREFIX_MAX} characters"
    if not isinstance(value, str):
        return f"key {key!r}: the value must be a string"
    if value and (len(value) > LABEL_VALUE_MAX or not _LABEL_NAME_RE.fullmatch(value)):
        return (f"key {key!r}: the value must be empty or at most {LABEL_VALUE_MAX} letters, digits and - _ . "
                "beginning and ending with a letter or digit")
    return None


class _Pods:
    """Per pod of the batch: what its samples reported of the optional fields, and where.

    One pod has one owner, so two controllers for one pod are a 400; labels and requests may
    change during a batch (a relabel), and the latest sample's win."""

    def __init__(self) -> None:
        self.controller: dict[tuple[str, ...], tuple[str, str, int]] = {}  # pod -> (kind, name, sample index)
        self.labels: dict[tuple[str, ...], tuple[datetime, dict[str, str]]] = {}
        self.requests: dict[tuple[str, ...], dict[str, tuple[datetime, dict[str, float]]]] = {}
        self.seen: dict[tuple[str, ...], None] = {}  # every pod, in order of appearance

    def meta(self) -> tuple[PodMeta, ...]:
        pods = []
        for key in sorted(self.seen):
            kind, name, _ = self.controller.get(key, ("", "", -1))
            requests = {container: asked for container, (_, asked) in self.requests.get(key, {}).items()}
            labels = self.labels.get(key)
            pods.append(PodMeta(namespace=key[0], pod=key[1], pod_uid=key[2], controller_kind=kind,
                                controller_name=name, labels=labels[1] if labels else {}, requests=requests))
        return tuple(pods)


def _validate_meta(
    sample: dict[str, Any], i: int, *, pod: tuple[str, ...], container: str, start: datetime | None,
    gpu: BatchGpuDecl | None, pods: _Pods, good_labels: set[tuple[str, str]], errors: _Errors,
    where: str = "$.samples",
) -> bool:
    """Check a sample's optional grouping fields and note them for its pod; False when one is wrong.

    Hot path: a pod's samples repeat its controller and labels, so a repeat of what was already
    checked for the pod costs a comparison, not a regex."""
    ok = True
    kind: Any = sample.get("controller_kind")
    name: Any = sample.get("controller_name")
    if kind is not None or name is not None:
        held = pods.controller.get(pod)
        if held is None or held[0] != kind or held[1] != name:
            ok = _check_controller(kind, name, i, pod=pod, held=held, pods=pods, errors=errors, where=where)
    if "labels" in sample:
        labels: Any = sample["labels"]
        held_labels = pods.labels.get(pod)
        if held_labels is not None and labels == held_labels[1] and type(labels) is dict:
            if start is not None and start >= held_labels[0]:
                pods.labels[pod] = (start, held_labels[1])
        elif _validate_labels(labels, i, good=good_labels, errors=errors, where=where):
            if start is not None and (held_labels is None or start >= held_labels[0]):
                pods.labels[pod] = (start, labels)
        else:
            ok = False
    if "mem_requested_mb" in sample or "sm_requested" in sample:
        asked = _requested(sample, i, gpu=gpu, errors=errors, where=where)
        if asked is None:
            ok = False
        elif start is not None:
            by_container = pods.requests.setdefault(pod, {})
            held_request = by_container.get(container)
            if held_request is None or start >= held_request[0]:
                by_container[container] = (start, asked)
    return ok


def _check_controller(kind: Any, name: Any, i: int, *, pod: tuple[str, ...], held: tuple[str, str, int] | None,
                      pods: _Pods, errors: _Errors, where: str) -> bool:
    ok = True
    if not isinstance(kind, str) or len(kind) > CONTROLLER_MAX["controller_kind"] or not _KIND_RE.fullmatch(kind):
        errors.add(f"{where}[{i}].controller_kind", "must be a Kubernetes kind (a letter, then letters and digits; "
                                                      f"at most {CONTROLLER_MAX['controller_kind']}), given with "
                                                      "controller_name")
        ok = False
    if not isinstance(name, str) or len(name) > CONTROLLER_MAX["controller_name"] or not _NAME_RE.fullmatch(name):
        errors.add(f"{where}[{i}].controller_name", "must be the controller's name (letters, digits and . _ : / -; "
                                                      f"at most {CONTROLLER_MAX['controller_name']}), given with "
                                                      "controller_kind")
        ok = False
    if not ok:
        return False
    if held is not None:
        errors.add(f"{where}[{i}].controller_kind", f"pod {pod[0]}/{pod[1]} is owned by {held[0]}/{held[1]} in "
                                                      f"{where[2:]}[{held[2]}]; a pod has one controller")
        return False
    pods.controller[pod] = (kind, name, i)
    return True


def _requested(sample: dict[str, Any], i: int, *, gpu: BatchGpuDecl | None, errors: _Errors,
               where: str) -> dict[str, float] | None:
    """The sample's request per GPU ({"mem_mb", "sm"}, the keys it has), or None when one is wrong."""
    asked: dict[str, float] = {}
    ok = True
    if "mem_requested_mb" in sample:
        mem: Any = sample["mem_requested_mb"]
        cap = gpu.memory_mb if gpu is not None else CAPACITY_MAX["memory_mb"]
        if type(mem) is not int or not 0 <= mem <= cap:
            errors.add(f"{where}[{i}].mem_requested_mb",
                       f"must be an integer of MiB per GPU in [0, {cap}] (the GPU's memory)")
            ok = False
        else:
            asked["mem_mb"] = mem
    if "sm_requested" in sample:
        sm: Any = sample["sm_requested"]
        top = gpu.sm_count if gpu is not None else CAPACITY_MAX["sm_count"]
        # NaN fails the comparisons; exact types: bool is not a number here.
        if (type(sm) is not float and type(sm) is not int) or not 0 <= sm <= top:
            errors.add(f"{where}[{i}].sm_requested", f"must be a number of SMs in [0, {top}] (the GPU's SM count)")
            ok = False
        else:
            asked["sm"] = sm
    return asked if ok else None


def _validate_labels(labels: Any, i: int, *, good: set[tuple[str, str]], errors: _Errors, where: str) -> bool:
    if not isinstance(labels, dict):
        errors.add(f"{where}[{i}].labels", "must be an object of label key to value (strings)")
        return False
    if len(labels) > MAX_LABELS:
        errors.add(f"{where}[{i}].labels", f"holds {len(labels)} labels; at most {MAX_LABELS} (the agent's allow-list)")
        return False
    for key, value in labels.items():
        if isinstance(value, str) and (key, value) in good:
            continue
        problem = label_problem(key, value)
        if problem is not None:
            errors.add(f"{where}[{i}].labels", problem)
            return False
        good.add((key, value))
    return True


def _names(item: dict[str, Any], at: str, good_names: set[str], errors: _Errors) -> list[str] | None:
    """The six workload names of a sample or window, in NAME_FIELDS order; None when one is wrong."""
    names: list[str] = []
    ok = True
    for key in NAME_FIELDS:
        value = item.get(key)
        # A str before the set look-up: a list or an object there is unhashable (a 500, found by schemathesis).
        if type(value) is str and value in good_names:
            names.append(value)
            continue
        if value == "" and key in OPTIONAL_NAMES:
            names.append(value)
            continue
        if not isinstance(value, str) or len(value) > NAME_MAX[key] or not _NAME_RE.fullmatch(value):
            errors.add(f"{at}.{key}", f"must be a name of letters, digits and . _ : / - (at most {NAME_MAX[key]} characters)")
            ok = False
        else:
            good_names.add(value)
            names.append(value)
    return names if ok else None


def _quantities(item: dict[str, Any], keys: tuple[str, ...], at: str, errors: _Errors) -> list[float] | None:
    values: list[float] = []
    for key in keys:
        value = item.get(key)
        # NaN fails both comparisons, ±inf and ints beyond float range fail the upper one.
        if (type(value) is float or type(value) is int) and 0 <= value <= _FLOAT_MAX:
            values.append(value)
        else:
            errors.add(f"{at}.{key}", "must be a finite number >= 0")
    return values if len(values) == len(keys) else None


def validate_batch(
    payload: Any, *, now: datetime, max_skew: timedelta, max_samples: int, horizon: timedelta | None = None
) -> ValidatedBatch:
    """Check every rule of docs/protocol.md; raise InvalidBatch listing the violations."""
    errors = _Errors()
    header = _validate_header(payload, errors, now=now, max_skew=max_skew, horizon=horizon)
    if header is None:
        raise InvalidBatch(errors.items)
    node, seq, window_start, window_end = header
    cluster = _validate_cluster(payload, errors)
    # The window bounds energy; a malformed window is its own error, and energy is then only checked for shape.
    window_s = (window_end - window_start).total_seconds() if window_start and window_end else None
    gpus = _validate_gpus(payload.get("gpus"), errors, window_s=window_s)
    kind = "windows" if payload.get("schema") == SCHEMA_V2 else "samples"
    items = payload.get(kind)
    if not isinstance(items, list):
        errors.add(f"$.{kind}", "must be a list (it may be empty)")
        raise InvalidBatch(errors.items)
    if len(items) > max_samples:
        raise PayloadTooLarge(f"$.{kind} holds {len(items)} {kind}; at most {max_samples} per batch")
    check = _validate_windows if kind == "windows" else _validate_samples
    rows, pods = check(items, gpus=gpus, window=(window_start, window_end), errors=errors)
    if errors:
        raise InvalidBatch(errors.items)
    return ValidatedBatch(
        node=node,
        batch_seq=seq,
        window_start=window_start,
        window_end=window_end,
        gpus=tuple(gpus.values()),
        rows=rows,
        sample_count=len(items),
        cluster=cluster,
        pods=pods.meta(),
    )


def _validate_samples(  # noqa: PLR0912, PLR0915 - every rule of a v1 sample, in the protocol's order, in one pass
    samples: list[Any], *, gpus: dict[str, BatchGpuDecl], window: tuple[datetime | None, datetime | None],
    errors: _Errors,
) -> tuple[list[tuple[Any, ...]], _Pods]:
    """v1: check each per-second sample; its rows split at minute boundaries, billed = max(used, granted)."""
    window_start, window_end = window

    times: dict[str, datetime] = {}
    # (start, seconds) -> (end, lies inside one UTC minute); samples of one batch share few spans.
    spans: dict[tuple[datetime, float], tuple[datetime, bool]] = {}
    good_names: set[str] = set()
    rows: list[tuple[Any, ...]] = []
    # Σ rate per GPU over intervals: (gpu, start, end) -> [granted mem MB, granted SM, PCIe MB/s].
    granted: dict[tuple[str, datetime, datetime], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    # Intervals metered per (GPU, workload): one workload is metered once per GPU-second.
    metered: dict[tuple[str, ...], list[tuple[datetime, datetime, int]]] = defaultdict(list)
    pods = _Pods()
    good_labels: set[tuple[str, str]] = set()
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict):
            errors.add(f"$.samples[{i}]", "must be an object")
            continue
        bad = False
        start_text: Any = sample.get("start")
        start = times.get(start_text) if isinstance(start_text, str) else None
        if start is None:
            try:
                start = _parse_time(start_text)
            except (ValueError, TypeError) as exc:
                errors.add(f"$.samples[{i}].start", str(exc))
                bad = True
            else:
                times[start_text] = start
        seconds: Any = sample.get("seconds")
        # Exact type checks: bool is not a number here, and they are the fastest test.
        if (type(seconds) is not float and type(seconds) is not int) or not 0 < seconds <= MAX_SAMPLE_SECONDS:
            errors.add(f"$.samples[{i}].seconds", f"must be a number in (0, {MAX_SAMPLE_SECONDS:.0f}]")
            bad = True
        gpu_id = sample.get("gpu")
        gpu = gpus.get(gpu_id) if isinstance(gpu_id, str) else None
        if gpu is None:
            errors.add(f"$.samples[{i}].gpu", f"unknown GPU {gpu_id!r}: not listed in $.gpus")
            bad = True
        names = _names(sample, f"$.samples[{i}]", good_names, errors)
        values = _quantities(sample, QUANTITIES, f"$.samples[{i}]", errors)
        if names is None or values is None:
            continue
        if not bad:
            pod = (names[1], names[2], names[4])  # namespace, pod, pod_uid: the ledger's key of a pod
            pods.seen[pod] = None
            if ("labels" in sample or "controller_kind" in sample or "controller_name" in sample
                    or "mem_requested_mb" in sample or "sm_requested" in sample):
                bad = not _validate_meta(sample, i, pod=pod, container=names[3], start=start, gpu=gpu, pods=pods,
                                         good_labels=good_labels, errors=errors)
        if bad or gpu is None or start is None:
            continue
        span = spans.get((start, seconds))
        if span is None:
            span = (start + timedelta(seconds=seconds), start.second + start.microsecond / 1e6 + seconds <= 60)
            spans[(start, seconds)] = span
        end, in_one_minute = span
        if window_start is not None and window_end is not None and (start < window_start or end > window_end):
            errors.add(f"$.samples[{i}]", "lies outside the batch window")
            continue
        mem_cap = gpu.memory_mb * seconds * (1 + _TOLERANCE)
        sm_cap = gpu.sm_count * seconds * (1 + _TOLERANCE)
        mem_used, mem_granted, sm_used, sm_granted, pcie = values
        if mem_used > mem_cap or mem_granted > mem_cap:
            errors.add(f"$.samples[{i}]", f"memory above capacity × seconds ({gpu.memory_mb} MB × {seconds} s)")
            continue
        if sm_used > sm_cap or sm_granted > sm_cap:
            errors.add(f"$.samples[{i}]", f"SM·s above capacity × seconds ({gpu.sm_count} SMs × {seconds} s)")
            continue
        acc = granted[(gpu.uuid, start, end)]
        acc[0] += mem_granted / seconds
        acc[1] += sm_granted / seconds
        acc[2] += pcie / seconds
        metered[(gpu.uuid, *(names[k] for k in _WORKLOAD))].append((start, end, i))
        if in_one_minute:
            rows.append((gpu.uuid, start, seconds, *names, mem_used, mem_granted, max(mem_used, mem_granted),
                         sm_used, sm_granted, max(sm_used, sm_granted), pcie))
        else:
            for piece_start, piece_seconds in _split_at_minutes(start, seconds):
                f = piece_seconds / seconds
                u, g, su, sg, p = (v * f for v in values)
                rows.append((gpu.uuid, piece_start, piece_seconds, *names, u, g, max(u, g), su, sg, max(su, sg), p))
    if not errors:
        _check_granted_within_capacity(granted, gpus, errors)
        _check_metered_once(metered, errors)
    return rows, pods


# v2 windows: the integrals a sample has, plus the billed maximum of each resource, then the peaks.
WINDOW_QUANTITIES = ("mem_used_mb_s", "mem_granted_mb_s", "mem_billed_mb_s", "sm_used_s", "sm_granted_s",
                     "sm_billed_s", "pcie_mb")
WINDOW_PEAKS = ("mem_peak_mb", "sm_peak")


def _validate_windows(  # noqa: PLR0915 - every rule of a v2 window, in the protocol's order, in one pass
    windows: list[Any], *, gpus: dict[str, BatchGpuDecl], window: tuple[datetime | None, datetime | None],
    errors: _Errors,
) -> tuple[list[tuple[Any, ...]], _Pods]:
    """v2: check each window's integrals against its card and the seconds of its minute the batch
    covers; one row each, already per workload-minute."""
    window_start, window_end = window
    good_names: set[str] = set()
    good_labels: set[tuple[str, str]] = set()
    minutes: dict[str, datetime] = {}
    rows: list[tuple[Any, ...]] = []
    pods = _Pods()
    seen: dict[tuple[str, ...], int] = {}
    # (gpu, minute) -> [Σ granted MB·s, Σ granted SM·s, Σ PCIe MB, seconds of the minute inside the window]
    per_minute: dict[tuple[str, datetime], list[float]] = {}
    for i, item in enumerate(windows):
        at = f"$.windows[{i}]"
        if not isinstance(item, dict):
            errors.add(at, "must be an object")
            continue
        minute = _window_minute(item.get("minute"), at, minutes, errors)
        seconds: Any = item.get("seconds")
        ok = minute is not None
        if (type(seconds) is not float and type(seconds) is not int) or not 0 < seconds <= MINUTE_SECONDS:
            errors.add(f"{at}.seconds", "must be a number in (0, 60]")
            ok = False
        gpu_id = item.get("gpu")
        gpu = gpus.get(gpu_id) if isinstance(gpu_id, str) else None
        if gpu is None:
            errors.add(f"{at}.gpu", f"unknown GPU {gpu_id!r}: not listed in $.gpus")
        names = _names(item, at, good_names, errors)
        values = _quantities(item, WINDOW_QUANTITIES, at, errors)
        peaks = _quantities(item, WINDOW_PEAKS, at, errors)
        if not ok or gpu is None or names is None or values is None or peaks is None or minute is None:
            continue
        pod = (names[1], names[2], names[4])
        pods.seen[pod] = None
        if any(key in item for key in _META_KEYS) and not _validate_meta(
                item, i, pod=pod, container=names[3], start=minute, gpu=gpu, pods=pods, good_labels=good_labels,
                errors=errors, where="$.windows"):
            continue
        if window_start is None or window_end is None:
            continue
        covered = (min(minute + _MINUTE, window_end) - max(minute, window_start)).total_seconds()
        if covered <= 0 or seconds > covered * (1 + _TOLERANCE):
            errors.add(at, f"{seconds} s of minute {minute.isoformat()} lie outside the batch window")
            continue
        key = (gpu.uuid, *(names[k] for k in _WORKLOAD), minute.isoformat())
        if key in seen:
            errors.add(at, f"meters {names[1]}/{names[2]}/{names[3]} on GPU {gpu.uuid} in minute "
                           f"{minute.isoformat()} again: windows[{seen[key]}] already does")
            continue
        seen[key] = i
        if not _window_within_card(values, peaks, gpu=gpu, seconds=seconds, at=at, errors=errors):
            continue
        acc = per_minute.setdefault((gpu.uuid, minute), [0.0, 0.0, 0.0, covered])
        acc[0] += values[1]
        acc[1] += values[4]
        acc[2] += values[6]
        rows.append((gpu.uuid, max(minute, window_start), seconds, *names, *values))
    if not errors:
        _check_minutes_within_capacity(per_minute, gpus, errors)
    return rows, pods


_META_KEYS = ("labels", "controller_kind", "controller_name", "mem_requested_mb", "sm_requested")


def _window_minute(value: Any, at: str, cache: dict[str, datetime], errors: _Errors) -> datetime | None:
    minute = cache.get(value) if isinstance(value, str) else None
    if minute is not None:
        return minute
    try:
        minute = _parse_time(value)
    except (ValueError, TypeError) as exc:
        errors.add(f"{at}.minute", str(exc))
        return None
    if minute.second or minute.microsecond:
        errors.add(f"{at}.minute", "must be a whole UTC minute")
        return None
    cache[value] = minute
    return minute


def _window_within_card(values: list[float], peaks: list[float], *, gpu: BatchGpuDecl, seconds: float, at: str,
                        errors: _Errors) -> bool:
    """A window's integrals fit its card over its seconds, and each billed maximum is one a sum of
    per-second maxima can be: at least the larger sum, at most both sums together."""
    mem_used, mem_granted, mem_billed, sm_used, sm_granted, sm_billed, _ = values
    for what, used, granted, billed, cap in (("memory", mem_used, mem_granted, mem_billed, gpu.memory_mb),
                                             ("SM·s", sm_used, sm_granted, sm_billed, gpu.sm_count)):
        if max(used, granted, billed) > cap * seconds * (1 + _TOLERANCE):
            errors.add(at, f"{what} above capacity × seconds ({cap} × {seconds} s)")
            return False
        if not max(used, granted) * (1 - _TOLERANCE) <= billed <= (used + granted) * (1 + _TOLERANCE):
            errors.add(at, f"billed {what} must lie between the larger of used and granted and their sum")
            return False
    if peaks[0] > gpu.memory_mb or peaks[1] > gpu.sm_count:
        errors.add(at, f"a peak above the card ({gpu.memory_mb} MB, {gpu.sm_count} SMs)")
        return False
    return True


def _check_minutes_within_capacity(per_minute: dict[tuple[str, datetime], list[float]],
                                   gpus: dict[str, BatchGpuDecl], errors: _Errors) -> None:
    """v1's per-instant rule, as integrals can show it: Σ granted of a GPU's windows in a minute fits
    the card over the seconds of that minute the batch covers, and so does Σ PCIe at 10 TB/s."""
    for (uuid, minute), (mem, sm, pcie, covered) in per_minute.items():
        gpu = gpus[uuid]
        slack = covered * (1 + _TOLERANCE)
        if mem > gpu.memory_mb * slack or sm > gpu.sm_count * slack or pcie > MAX_PCIE_MB_PER_S * slack:
            errors.add("$.windows", f"Σ granted memory, SM·s or PCIe on GPU {uuid} in minute {minute.isoformat()} "
                                    f"is above what the card holds over {covered:g} s")
            return


# Integrals our agents send are multiples of 2^-10 (agents/meter.py). Below 2^33, sums of such
# values over a workload-minute are exact in binary floating point (every partial sum a multiple of
# 2^-10 below 2^43); the rollup sums them in float8 for the same reason (billing.ledger.rollup).
_EXACT_BELOW = 2.0**33


def _exact(row: tuple[Any, ...]) -> bool:
    return all(v < _EXACT_BELOW and (v * 1024) % 1 == 0 for v in (row[2], *row[9:]))


def summed_per_minute(batch: ValidatedBatch) -> ValidatedBatch:
    """The batch with its rows summed per (GPU, workload, UTC minute): what a v2 batch sends, made
    from a v1 batch's per-second samples (docs/protocol.md, v1 is converted). A group holding a value
    that is not a multiple of 2^-10 below 2^33 is kept row by row, so the rollup sums it in numeric
    as before: the ledger prices the same numbers either way. Rows keep the order they came in."""
    groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for row in batch.rows:
        groups.setdefault((row[0], row[1].replace(second=0, microsecond=0), *row[3:9]), []).append(row)
    if len(groups) == len(batch.rows):
        return batch
    rows: list[tuple[Any, ...]] = []
    for group in groups.values():
        if len(group) == 1 or not all(_exact(r) for r in group):
            rows.extend(group)
            continue
        first = group[0]
        sums = [sum(r[c] for r in group) for c in (2, *range(9, 16))]
        rows.append((first[0], min(r[1] for r in group), sums[0], *first[3:9], *sums[1:]))
    return replace(batch, rows=rows)


def _check_metered_once(metered: dict[tuple[str, ...], list[tuple[datetime, datetime, int]]], errors: _Errors) -> None:
    """No two samples of one workload on one GPU cover the same instant: both would be billed."""
    for (uuid, namespace, pod, container, _uid), spans in metered.items():
        spans.sort()
        for (_, prev_end, prev_i), (start, _end, i) in itertools.pairwise(spans):
            if start < prev_end:
                errors.add(f"$.samples[{i}]", f"meters {namespace}/{pod}/{container} on GPU {uuid} again for "
                                              f"seconds samples[{prev_i}] already covers")
                return


def _check_granted_within_capacity(
    granted: dict[tuple[str, datetime, datetime], list[float]],
    gpus: dict[str, BatchGpuDecl],
    errors: _Errors,
) -> None:
    """Σ granted rate (and Σ PCIe rate) on a GPU must not exceed its capacity at any instant (sweep line)."""
    events: dict[str, list[tuple[datetime, int, float, float, float]]] = defaultdict(list)
    for (uuid, start, end), (mem, sm, pcie) in granted.items():
        # At equal times, ends (0) sort before starts (1): back-to-back samples do not overlap.
        events[uuid].append((start, 1, mem, sm, pcie))
        events[uuid].append((end, 0, -mem, -sm, -pcie))
    for uuid, evs in events.items():
        gpu = gpus[uuid]
        mem_cap = gpu.memory_mb * (1 + _TOLERANCE)
        sm_cap = gpu.sm_count * (1 + _TOLERANCE)
        mem = sm = pcie = 0.0
        for at, _kind, d_mem, d_sm, d_pcie in sorted(evs, key=lambda e: (e[0], e[1])):
            mem += d_mem
            sm += d_sm
            pcie += d_pcie
            if mem > mem_cap:
                errors.add("$.samples", f"Σ granted memory on GPU {uuid} at {at.isoformat()} is {mem:.1f} MB, above its {gpu.memory_mb} MB")
                break
            if sm > sm_cap:
                errors.add("$.samples", f"Σ granted SMs on GPU {uuid} at {at.isoformat()} is {sm:.2f}, above its {gpu.sm_count}")
                break
            if pcie > MAX_PCIE_MB_PER_S * (1 + _TOLERANCE):
                errors.add("$.samples", f"Σ PCIe traffic on GPU {uuid} at {at.isoformat()} is {pcie:.3g} MB/s, "
                                        f"above the {MAX_PCIE_MB_PER_S:.0e} MB/s any GPU link carries")
                break
