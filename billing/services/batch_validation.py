"""Validation of a usage batch against wire protocol v1 (DESIGN §3). Pure: no queries (the
bounds come from the columns that store each field, billing.ledger.columns).

Every rule violation is collected (up to MAX_ERRORS) with a JSON path, so an agent author
sees all problems at once; any error means nothing of the batch is stored.

This is the ingest hot path: per-sample work is kept to dictionary look-ups, float
comparisons and caches of repeated strings (timestamps, names).
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from billing.errors import FieldError, InvalidBatch, PayloadTooLarge
from billing.ledger.batches import BatchGpuDecl, ValidatedBatch
from billing.ledger.columns import gpu_capacity_max, gpu_model_max_length, gpu_uuid_max_length, workload_name_max_length
from billing.models import Node
from billing.services.input_limits import max_length

__all__ = ["SCHEMA", "BatchGpuDecl", "ValidatedBatch", "validate_batch"]

SCHEMA = "vgpu-ledger/usage-batch/v1"
MAX_ERRORS = 50
MAX_SAMPLE_SECONDS = 3600.0
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
YEARS = (2000, 9000)
_FLOAT_MAX = sys.float_info.max


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


def _validate_header(
    payload: Any, errors: _Errors, *, now: datetime, max_skew: timedelta, horizon: timedelta | None
) -> tuple[Any, ...] | None:
    if not isinstance(payload, dict):
        errors.add("$", "the body must be a JSON object")
        return None
    if payload.get("schema") != SCHEMA:
        errors.add("$.schema", f"must be {SCHEMA!r}")
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


def _validate_gpus(raw: Any, errors: _Errors) -> dict[str, BatchGpuDecl]:
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
        if ok:
            gpus[uuid] = BatchGpuDecl(uuid=uuid, model=model, memory_mb=memory_mb, sm_count=sm_count)
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


def validate_batch(
    payload: Any, *, now: datetime, max_skew: timedelta, max_samples: int, horizon: timedelta | None = None
) -> ValidatedBatch:
    """Check every rule of DESIGN §3; raise InvalidBatch listing the violations."""
    errors = _Errors()
    header = _validate_header(payload, errors, now=now, max_skew=max_skew, horizon=horizon)
    if header is None:
        raise InvalidBatch(errors.items)
    node, seq, window_start, window_end = header
    gpus = _validate_gpus(payload.get("gpus"), errors)
    samples = payload.get("samples")
    if not isinstance(samples, list):
        errors.add("$.samples", "must be a list (it may be empty)")
        raise InvalidBatch(errors.items)
    if len(samples) > max_samples:
        raise PayloadTooLarge(f"$.samples holds {len(samples)} samples; at most {max_samples} per batch")

    times: dict[str, datetime] = {}
    # (start, seconds) -> (end, lies inside one UTC minute); samples of one batch share few spans.
    spans: dict[tuple[datetime, float], tuple[datetime, bool]] = {}
    good_names: set[str] = set()
    rows: list[tuple[Any, ...]] = []
    # Σ rate per GPU over intervals: (gpu, start, end) -> [granted mem MB, granted SM, PCIe MB/s].
    granted: dict[tuple[str, datetime, datetime], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    # Intervals metered per (GPU, workload): one workload is metered once per GPU-second.
    metered: dict[tuple[str, ...], list[tuple[datetime, datetime, int]]] = defaultdict(list)
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
        names = []
        for key in NAME_FIELDS:
            value = sample.get(key)
            # A str before the set look-up: a list or an object there is unhashable (a 500, found by schemathesis).
            if type(value) is str and value in good_names:
                names.append(value)
                continue
            if value == "" and key in OPTIONAL_NAMES:
                names.append(value)
                continue
            if not isinstance(value, str) or len(value) > NAME_MAX[key] or not _NAME_RE.fullmatch(value):
                errors.add(
                    f"$.samples[{i}].{key}",
                    f"must be a name of letters, digits and . _ : / - (at most {NAME_MAX[key]} characters)",
                )
                bad = True
            else:
                good_names.add(value)
                names.append(value)
        values: list[float] = []
        for key in QUANTITIES:
            value = sample.get(key)
            # NaN fails both comparisons, ±inf and ints beyond float range fail the upper one.
            if (type(value) is float or type(value) is int) and 0 <= value <= _FLOAT_MAX:
                values.append(value)
            else:
                errors.add(f"$.samples[{i}].{key}", "must be a finite number >= 0")
                bad = True
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
            rows.append((gpu.uuid, start, seconds, *names, mem_used, mem_granted, sm_used, sm_granted, pcie))
        else:
            for piece_start, piece_seconds in _split_at_minutes(start, seconds):
                f = piece_seconds / seconds
                rows.append(
                    (gpu.uuid, piece_start, piece_seconds, *names, *(v * f for v in values))
                )
    if not errors:
        _check_granted_within_capacity(granted, gpus, errors)
        _check_metered_once(metered, errors)
    if errors:
        raise InvalidBatch(errors.items)
    return ValidatedBatch(
        node=node,
        batch_seq=seq,
        window_start=window_start,
        window_end=window_end,
        gpus=tuple(gpus.values()),
        rows=rows,
        sample_count=len(samples),
    )


def _check_metered_once(metered: dict[tuple[str, ...], list[tuple[datetime, datetime, int]]], errors: _Errors) -> None:
    """No two samples of one workload on one GPU cover the same instant: both would be billed."""
    for (uuid, namespace, pod, container, _uid), spans in metered.items():
        spans.sort()
        for (_, prev_end, prev_i), (start, _end, i) in zip(spans, spans[1:], strict=False):
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
