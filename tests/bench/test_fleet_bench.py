"""The fleet benchmark (bench/fleet.py, docs/scaling.md) at a tiny size, so that it cannot rot: a
real gunicorn, batches rendered by the agent's own code (wire v2 as agents send by default, and v1),
two rollup processes at once, the pages; and the report it writes must account for every sample,
every integral and every cent, or its capacity figures mean nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
GPUS, PER_NODE, WORKLOADS, MINUTES, BATCH_S = 4, 2, 3, 2, 60
METERS_MS = (1000, 5000)
CENT = Decimal("1e-6")  # the ledger keeps 12 decimals; sums over a few hundred rows


def _run_harness(tmp_path: Path, wire: str) -> tuple[dict[str, Any], str]:
    base = os.environ["DATABASE_URL"]
    db_name = (urllib.parse.urlsplit(base).path.lstrip("/") or "postgres") + "_fleetsmoke"
    out = tmp_path / "fleet.json"
    command = [sys.executable, "bench/fleet.py", "--gpus", str(GPUS), "--gpus-per-node", str(PER_NODE),
               "--workloads-per-gpu", str(WORKLOADS), "--minutes", str(MINUTES), "--batch-seconds", str(BATCH_S),
               "--meter-ms", *map(str, METERS_MS), "--agents", "2", "--gunicorn-workers", "1",
               "--rollup-workers", "2", "--page-runs", "1", "--db-name", db_name, "--json-out", str(out),
               "--wire", wire]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=110, check=False)
    log = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, log
    return json.loads(out.read_text()), log


@pytest.mark.timeout(120)
@pytest.mark.parametrize("wire", ["v2", "v1"])
def test_fleet_benchmark_accounts_for_every_sample_and_cent_at_each_meter_width(tmp_path: Path, wire: str) -> None:
    report, log = _run_harness(tmp_path, wire)
    assert report["problems"] == [], log
    assert report["wire"] == wire
    fleet_seconds = MINUTES * 60
    nodes = GPUS // PER_NODE
    by_meter = {s["meter_ms"]: s for s in report["settings"]}
    assert list(by_meter) == list(METERS_MS)
    for meter_ms, s in by_meter.items():
        period_s = meter_ms // 1000
        # v1 sends every sample; v2 one window per workload, GPU and minute, whatever the meter.
        items = GPUS * WORKLOADS * (fleet_seconds // period_s if wire == "v1" else MINUTES)
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
        assert rows["UsageMinute"] == GPUS * WORKLOADS * MINUTES
        assert rows["GpuMinute"] == GPUS * MINUTES
        assert rows["UsageDay"] >= GPUS * WORKLOADS
        assert rows["GpuDay"] >= GPUS
        assert set(s["pages_s"]) == {"finance", "tenants", "portal", "invoices"}
        assert all(v > 0 for v in s["pages_s"].values())
    fine, coarse = by_meter[1000], by_meter[5000]
    # The minutes hold one row per workload-minute whatever the meter width (wire v2; v1 samples summed
    # at ingest), so coarser metering no longer stores less.
    assert coarse["table_rows"]["UsageMinute"] == fine["table_rows"]["UsageMinute"]
    assert fine["precision"] is None
    p = coarse["precision"]
    assert p["workloads"] == GPUS * WORKLOADS
    # billed = max(used, granted): a coarse sample's max of sums never exceeds the sum of the
    # 1-second maxima, so coarser metering can only bill less, and this load's bursts make it so.
    assert p["charge_rel_mean"] < 0
    assert p["total_charge_rel"] < 0
    assert p["mem_billed_rel_mean"] < 0
    assert p["sm_billed_rel_mean"] < 0
    assert abs(p["charge_rel_mean"]) <= p["charge_rel_max_abs"] < 0.5


@given(seed=st.integers(0, 2**32 - 1), gpus=st.integers(1, 3), workloads=st.integers(1, 16),
       period_s=st.sampled_from((1, 2, 5, 10, 15, 30, 60)))
@settings(max_examples=25, deadline=None)
def test_any_synthetic_load_is_valid_and_coarsens_as_the_meter_integrates(seed: int, gpus: int, workloads: int,
                                                                          period_s: int) -> None:
    from bench.fleet import Q, Shape, make_load
    from bench.ingest import A100

    load = make_load(Shape(gpus, 8, workloads, 60, 60), seed, 0)
    memory_mb, sm_count = A100["memory_mb"] * Q, A100["sm_count"] * Q  # in 1/1024 units
    # What ingest would refuse (docs/protocol.md): use or grant above the card, Σ granted on a GPU above it.
    for used, granted, capacity in ((load.mem_used, load.mem_granted, memory_mb),
                                    (load.sm_used, load.sm_granted, sm_count)):
        assert used.min() >= 0
        assert used.max() <= capacity
        assert granted.max() <= capacity
        assert granted.sum(axis=1).max() <= capacity
    coarse = load.coarsened(period_s)
    for name in ("mem_used", "mem_granted", "sm_used", "sm_granted", "pcie"):
        assert int(coarse[name].sum()) == int(getattr(load, name).sum())  # integrals add, exactly
    # billed = max(used, granted): per coarse sample never more than the sum of its seconds' maxima.
    fine_max = np.maximum(load.mem_used, load.mem_granted).reshape(gpus, workloads, -1, period_s).sum(axis=3)
    assert (np.maximum(coarse["mem_used"], coarse["mem_granted"]) <= fine_max).all()

