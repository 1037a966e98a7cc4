"""Usage batches of wire protocol v2 (per workload-minute integrals) from a hostile or careless
node, over HTTP: every field a value it must not hold, integrals no per-second series can sum to,
windows outside the batch or beyond the card. Each is a 400 naming the field (413 for too many
windows), stores nothing, and the node's clean batch after them is stored and billed."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from billing.ledger.models import UsageBatch, UsageMinute
from billing.ledger.rollup import rollup_usage
from tests import clock
from tests.conftest import A100, iso
from tests.hostile.conftest import HostileSession, bearer

pytestmark = pytest.mark.django_db(transaction=True)

GPU = {"uuid": "GPU-v2-0", **A100}
HOSTILE_NUMBERS: tuple[Any, ...] = (-1.0, float("nan"), "12", None, [], {}, True)
NUMBER_FIELDS = ("mem_used_mb_s", "mem_granted_mb_s", "mem_billed_mb_s", "sm_used_s", "sm_granted_s", "sm_billed_s",
                 "pcie_mb", "mem_peak_mb", "sm_peak")


def v2_batch(start: datetime, *, seq: int = 1, seconds: int = 60) -> dict[str, Any]:
    """A valid v2 batch: one workload on one A100 for `seconds` of the minute at `start`."""
    window = {"minute": iso(start), "seconds": seconds, "gpu": GPU["uuid"], "tenant": "acme",
              "namespace": "acme-prod", "pod": "bert-1", "container": "server", "pod_uid": "uid-bert-1",
              "sla_tier": "gold", "mem_used_mb_s": 312.5 * seconds, "mem_granted_mb_s": 512.0 * seconds,
              "mem_billed_mb_s": 512.0 * seconds, "sm_used_s": 7.75 * seconds, "sm_granted_s": 13.5 * seconds,
              "sm_billed_s": 13.5 * seconds, "pcie_mb": 3.0 * seconds, "mem_peak_mb": 400.0, "sm_peak": 9.0}
    return {"schema": "vgpu-ledger/usage-batch/v2", "node": "gpu-node-1", "batch_seq": seq,
            "window": {"start": iso(start), "end": iso(start + timedelta(seconds=seconds))},
            "gpus": [GPU], "windows": [window]}


def _field(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda b: b["windows"][0].update({key: value})


def _second_window(**changes: Any) -> Callable[[dict[str, Any]], None]:
    return lambda b: b["windows"].append({**b["windows"][0], **changes})


# (what is wrong, how to plant it, the error path the answer must name)
CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    # Each number field one hostile value, each hostile value in some field: a request is ~50 ms.
    *((f"{key}={value!r}", _field(key, value), f"$.windows[0].{key}") for key, value in zip(
        NUMBER_FIELDS, HOSTILE_NUMBERS * 2, strict=False)),
    *((f"seconds={value!r}", _field("seconds", value), "$.windows[0].seconds")
      for value in (0, 61, "60")),
    *((f"minute={value!r}", _field("minute", value), "$.windows[0].minute")
      for value in ("2026-11-30T03:00:30Z", "not a time", None)),
    *((f"{key}={value!r}", _field(key, value), f"$.windows[0].{key}")
      for key, value in zip(("tenant", "namespace", "pod") * 2, ("", "a b", "../x", "\x00", "a" * 300, 7), strict=True)),
    *((f"{key}=1e300", _field(key, 1e300), "$.windows[0]") for key in ("mem_used_mb_s", "sm_billed_s", "mem_peak_mb")),
    ("unknown gpu", _field("gpu", "GPU-stolen"), "$.windows[0].gpu"),
    ("windows not a list", lambda b: b.update(windows={"a": 1}), "$.windows"),
    ("memory above the card over its seconds", _field("mem_granted_mb_s", A100["memory_mb"] * 61.0), "$.windows[0]"),
    ("billed below the larger of used and granted", _field("mem_billed_mb_s", 100.0), "$.windows[0]"),
    ("billed above used plus granted", _field("sm_billed_s", 13.5 * 60 + 7.75 * 60 + 1), "$.windows[0]"),
    ("a peak above the card", _field("sm_peak", A100["sm_count"] + 1.0), "$.windows[0]"),
    ("the same workload-minute twice", _second_window(), "$.windows[1]"),
    ("Σ granted of the minute above the card", _second_window(
        pod="llm-1", pod_uid="uid-llm-1", mem_granted_mb_s=A100["memory_mb"] * 60.0,
        mem_billed_mb_s=A100["memory_mb"] * 60.0), "$.windows"),
]


def test_every_hostile_v2_window_is_a_400_naming_it_and_the_clean_batch_after_is_billed(
        hostile: HostileSession, node_token_for, minute_start, one_usd_per_gpu_second, settings):
    token = node_token_for("gpu-node-1").token
    for seq, (what, plant, path) in enumerate(CASES, start=1):
        batch = v2_batch(minute_start, seq=seq)
        plant(batch)
        answer = hostile.post("/api/v1/usage/batches", data=json.dumps(batch),  # NaN as the token NaN
                              headers={**bearer(token), "Content-Type": "application/json"})
        assert answer.status_code == 400, (what, answer.status_code, answer.text[:300])
        assert path in [e["path"] for e in answer.json()["errors"]], (what, answer.text[:300])
    # A window that starts before the batch: its minute is not the batch's.
    outside = v2_batch(minute_start, seq=len(CASES) + 1)
    outside["windows"][0]["minute"] = iso(minute_start - timedelta(minutes=1))
    assert hostile.post("/api/v1/usage/batches", headers=bearer(token), json=outside).status_code == 400
    settings.VGPU_INGEST_MAX_SAMPLES = 1  # two windows where one is allowed: too large, not invalid
    crowded = v2_batch(minute_start, seq=len(CASES) + 2)
    _second_window(pod="llm-1", pod_uid="uid-llm-1")(crowded)
    assert hostile.post("/api/v1/usage/batches", headers=bearer(token), json=crowded).status_code == 413
    assert not UsageBatch.objects.exists()

    clean = v2_batch(minute_start, seq=len(CASES) + 3)
    assert hostile.post("/api/v1/usage/batches", headers=bearer(token), json=clean).status_code == 201
    rollup_usage(now=clock.now())
    (row,) = UsageMinute.objects.all()
    assert (row.seconds, row.mem_billed_mb_s, row.sm_billed_s) == (Decimal(60), Decimal(512 * 60), Decimal(810))
