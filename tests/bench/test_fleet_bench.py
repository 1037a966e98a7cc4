"""The fleet benchmark (bench/fleet.py, docs/scaling.md) at a tiny size, so that it cannot rot: a
real gunicorn, batches rendered by the agent's own code (wire v2 as agents send by default, with pods
that come and go, and v1 with one pod per slot), two rollup processes at once, ingest and rollup
alternating and, with v2, at once on a beat; the pages; and the report it writes must account for
every sample, every integral, every pod and every cent, or its capacity figures mean nothing.
tests/bench/test_fleet_load.py checks the load and the batches without a database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from bench.fleet import Shape, make_load

REPO = Path(__file__).resolve().parents[2]
GPUS, PER_NODE, WORKLOADS, MINUTES, BATCH_S = 4, 2, 3, 2, 60
METERS_MS = (1000, 5000)
CENT = Decimal("1e-6")  # the ledger keeps 12 decimals; sums over a few hundred rows


# v2, the agent's default, with short-lived pods (every slot changes pods in the run) and the
# concurrent mode beside the alternating one; v1 with one pod per slot for the whole run.
CHURN = {"v2": (1, 2), "v1": (0, 0)}
BEAT_S = 0.5
HARNESS_LIMIT_S = 270


def _run_harness(tmp_path: Path, wire: str) -> tuple[dict[str, Any], str]:
    base = os.environ["DATABASE_URL"]
    db_name = (urllib.parse.urlsplit(base).path.lstrip("/") or "postgres") + "_fleetsmoke"
    out = tmp_path / "fleet.json"
    command = [sys.executable, "bench/fleet.py", "--gpus", str(GPUS), "--gpus-per-node", str(PER_NODE),
               "--workloads-per-gpu", str(WORKLOADS), "--minutes", str(MINUTES), "--batch-seconds", str(BATCH_S),
               "--meter-ms", *map(str, METERS_MS), "--agents", "2", "--gunicorn-workers", "1",
               "--rollup-workers", "2", "--page-runs", "1", "--db-name", db_name, "--json-out", str(out),
               "--wire", wire, "--pod-minutes", *map(str, CHURN[wire])]
    if wire == "v2":
        command += ["--concurrent", "--rollup-every-s", str(BEAT_S)]
    # About 28 s of wall time (25 s of CPU) alone on the 2-core machine; 90-110 s in the suite beside
    # the shared demo's chain. The limit catches a harness that hangs, not a slow machine.
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=HARNESS_LIMIT_S, check=False)
    log = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, log
    return json.loads(out.read_text()), log


def _pods_and_pod_minutes(wire: str) -> tuple[int, int]:
    """Pods the run meters, and (pod, minute) pairs: v2 sends one window for each."""
    shape = Shape(GPUS, PER_NODE, WORKLOADS, MINUTES * 60, BATCH_S, *CHURN[wire], 5)  # grid: lcm of 1 s and 5 s
    pods = pod_minutes = 0
    for node in range(GPUS // PER_NODE):
        for gpu in make_load(shape, 14, node).starts:
            for starts in gpu:
                ends = [*starts[1:], MINUTES * 60]
                pods += len(starts)
                pod_minutes += sum(len(range(b // 60, (e - 1) // 60 + 1)) for b, e in zip(starts, ends, strict=True))
    return pods, pod_minutes


@pytest.mark.timeout(HARNESS_LIMIT_S + 20)
@pytest.mark.parametrize("wire", ["v2", "v1"])
def test_fleet_benchmark_accounts_for_every_sample_and_cent_at_each_meter_width(tmp_path: Path, wire: str) -> None:
    report, log = _run_harness(tmp_path, wire)
    assert report["problems"] == [], log
    assert report["wire"] == wire
    fleet_seconds = MINUTES * 60
    nodes = GPUS // PER_NODE
    pods, pod_minutes = _pods_and_pod_minutes(wire)
    assert pods > GPUS * WORKLOADS if wire == "v2" else pods == GPUS * WORKLOADS
    by_meter = {s["meter_ms"]: s for s in report["settings"]}
    assert list(by_meter) == list(METERS_MS)
    for meter_ms, s in by_meter.items():
        period_s = meter_ms // 1000
        assert s["pods"] == pods
        # v1 sends every sample; v2 one window per pod, GPU and minute, whatever the meter.
        items = GPUS * WORKLOADS * fleet_seconds // period_s if wire == "v1" else pod_minutes
        ingest, acc = s["ingest"], {k: Decimal(v) for k, v in s["accounting"].items()}
        # Sent = stored = rolled up, as every workload-second in both ledgers.
        assert ingest["sent"] == ingest["accepted"] == s["items"] == items, meter_ms
        assert ingest["batches"] == s["batches"] == nodes * fleet_seconds // BATCH_S
        assert ingest["errors"] == []
        assert acc["seconds_in_minutes"] == acc["seconds_in_days"] == GPUS * WORKLOADS * fleet_seconds
        # Every batch window's ingest and rollup was timed (the steady-state table).
        for run in (ingest, s["rollup"]):
            assert len(run["window_s"]) == len(run["window_cpu_s"]) == fleet_seconds // BATCH_S
            assert sum(run["window_cpu_s"]) > 0  # /proc counts 10 ms ticks: a tiny window may read 0
        assert acc["pending_batches"] == acc["quarantined_batches"] == 0
        # Money reconciles: Σ charges + idle = Σ card cost = price x every GPU-second of the run.
        assert acc["gpu_seconds"] == GPUS * fleet_seconds
        assert abs(acc["charges"] + acc["idle"] - acc["card_cost"]) < CENT
        assert abs(acc["card_cost"] - acc["expected_card_cost"]) < CENT
        assert abs(acc["charges_in_minutes"] - acc["charges"]) < CENT
        assert Decimal(0) < acc["charges"] < acc["card_cost"]
        # Two rollup processes at once: every batch rolled up exactly once between them.
        workers = s["rollup"]["workers"]
        assert len(workers) == 2
        assert all(w["error"] == "" for w in workers)
        assert sum(w["batches"] for w in workers) == s["batches"]
        # What the capacity figures are made of was measured, not left at zero.
        assert ingest["cpu_gunicorn_s"] > 0
        assert s["rollup"]["cpu_workers_s"] > 0
        assert ingest["gunicorn_worker_rss_max"] > 0
        assert min(w["max_rss"] for w in workers) > 0
        assert all(s["table_bytes"][t] > 0 for t in ("integral rows", "UsageBatch", "BatchGpu", "UsageMinute",
                                                      "GpuMinute", "UsageHour", "GpuHour", "UsageDay", "GpuDay"))
        rows = s["table_rows"]  # one row per workload (GPU) and minute, hour, day; one batch GPU per window
        # Two when the run spans midnight.
        assert rows["integral rows"] == 0  # an inbox: the rollup added every row into the minutes
        assert rows["BatchGpu"] == GPUS * fleet_seconds // BATCH_S
        assert rows["UsageMinute"] == pod_minutes
        assert rows["Workload"] == pods  # one container a pod: a workload each, its names stored once
        assert rows["GpuMinute"] == GPUS * MINUTES
        assert rows["UsageDay"] >= pods
        assert rows["GpuDay"] >= GPUS
        assert set(s["pages_s"]) == {"finance", "tenants", "portal", "invoices"}
        assert all(v > 0 for v in s["pages_s"].values())
    _check_concurrent_runs(by_meter[1000], report["shape"], wire)
    fine, coarse = by_meter[1000], by_meter[5000]
    # The minutes hold one row per workload-minute whatever the meter width (wire v2; v1 samples summed
    # at ingest), so coarser metering no longer stores less.
    assert coarse["table_rows"]["UsageMinute"] == fine["table_rows"]["UsageMinute"]
    assert fine["precision"] is None
    p = coarse["precision"]
    assert p["workloads"] == pods
    # billed = max(used, granted): a coarse sample's max of sums never exceeds the sum of the
    # 1-second maxima, so coarser metering can only bill less, and this load's bursts make it so.
    assert p["charge_rel_mean"] < 0
    assert p["total_charge_rel"] < 0
    assert p["mem_billed_rel_mean"] < 0
    assert p["sm_billed_rel_mean"] < 0
    assert abs(p["charge_rel_mean"]) <= p["charge_rel_max_abs"] < 0.5


def _check_concurrent_runs(s: dict[str, Any], shape: dict[str, int], wire: str) -> None:
    """With --concurrent (v2 here), one run per rollup worker count, each checked by the bench like
    the alternating ones (its problems would be in the report's): every batch stored and rolled up,
    on the beat, after the last post."""
    if wire == "v1":
        assert s["concurrent"] == []
        return
    assert [len(c["workers"]) for c in s["concurrent"]] == [2]
    for c in s["concurrent"]:
        assert c["rollup_every_s"] == BEAT_S
        assert c["errors"] == []
        assert c["batches"] == s["batches"]
        assert c["accepted"] == s["items"]
        assert sum(w["batches"] for w in c["workers"]) == s["batches"]
        assert all(w["error"] == "" and w["backend_pid"] > 0 for w in c["workers"])
        assert len(c["window_s"]) == shape["seconds"] // shape["batch_seconds"]
        # Done when the last batch was rolled up; the CPU runs on to the beat that found nothing left.
        assert 0 < c["ingest_s"] < c["wall_s"] <= c["cpu_span_s"]
        # The rollup's share of Postgres is its workers' backends; both sides did some work.
        assert c["cpu_gunicorn_s"] > 0
        assert c["cpu_workers_s"] > 0
        assert c["cpu_postgres_ingest_s"] + c["cpu_postgres_rollup_s"] > 0
