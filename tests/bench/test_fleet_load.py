"""The fleet benchmark's synthetic load (bench/fleet.py), without a database: any seed's load is
valid and coarsens as the agent's meter integrates, pods churn as documented without changing the
series, the v2 batches it sends are byte for byte what the agent's render_batch would send, and
--real-time spreads a window's posts over the window."""

from __future__ import annotations

import gzip
import json
import math
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.batch import render_batch
from agents.interfaces import GpuInfo
from bench.fleet import (
    Batch,
    Q,
    Shape,
    ingest_window,
    make_load,
    node_batches,
    pod_starts_per_slot_day,
    rows_per_gpu_day,
    v1_samples,
)
from bench.ingest import A100
from tests.clock import now

START = datetime(2026, 12, 31, 23, 57, tzinfo=UTC)  # a fixed minute: batches cross midnight and a year


@given(seed=st.integers(0, 2**32 - 1), gpus=st.integers(1, 3), workloads=st.integers(1, 16),
       period_s=st.sampled_from((1, 2, 5, 10, 15, 30, 60)))
@settings(max_examples=25, deadline=None)
def test_any_synthetic_load_is_valid_and_coarsens_as_the_meter_integrates(seed: int, gpus: int, workloads: int,
                                                                          period_s: int) -> None:
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


@given(seed=st.integers(0, 2**32 - 1), low=st.integers(1, 4), spread=st.integers(0, 4),
       grid=st.sampled_from((1, 5, 15, 60)))
@settings(max_examples=25, deadline=None)
def test_pods_churn_on_the_grid_within_their_lifetimes_and_leave_the_series_and_first_pods_alone(
        seed: int, low: int, spread: int, grid: int) -> None:
    still = make_load(Shape(8, 2, 4, 600, 60), seed, 3)
    churned = make_load(Shape(8, 2, 4, 600, 60, low, low + spread, grid), seed, 3)
    for name in ("mem_used", "mem_granted", "sm_used", "sm_granted", "pcie"):
        assert (getattr(still, name) == getattr(churned, name)).all()
    assert churned.gpu_uuids == still.gpu_uuids
    assert still.starts == [[[0]] * 4] * 2
    uids = []
    for gpu_starts, gpu_names, gpu_still in zip(churned.starts, churned.names, still.names, strict=True):
        for starts, names, first in zip(gpu_starts, gpu_names, gpu_still, strict=True):
            assert names[0] == first[0]  # the pod the run finds is the one it finds without churn
            assert len(names) == len(starts)
            assert starts[0] == 0
            assert all(s % grid == 0 for s in starts)
            assert all(s < 600 for s in starts)
            lives = np.diff(starts)
            # The first pod was already running; the later ones live LOW..HIGH minutes, to the grid.
            assert (lives[1:] >= max(grid, low * 60 - grid / 2)).all()
            assert (lives[1:] <= (low + spread) * 60 + grid / 2).all()
            assert lives.size == 0 or lives[0] <= (low + spread) * 60 + grid / 2
            uids += [n["pod_uid"] for n in names]
    assert len(set(uids)) == len(uids)  # every pod a new UID


@given(seed=st.integers(0, 2**32 - 1), gpus=st.integers(1, 3), workloads=st.integers(1, 5),
       period_s=st.sampled_from((1, 5, 15)), churn=st.sampled_from(((0, 0), (1, 1), (1, 3))))
@settings(max_examples=20, deadline=None)
def test_v2_batches_are_the_bytes_render_batch_sends_for_the_same_samples(seed: int, gpus: int, workloads: int,
                                                                         period_s: int,
                                                                         churn: tuple[int, int]) -> None:
    shape = Shape(gpus, 8, workloads, 180, 60, *churn, 15)
    batches, sent = node_batches(shape, seed, 0, start=START, period_s=period_s, wire="v2")
    load = make_load(shape, seed, 0)
    gpus_wire = [GpuInfo(uuid=u, model=str(A100["model"]), memory_mb=int(A100["memory_mb"]),
                         sm_count=int(A100["sm_count"])) for u in load.gpu_uuids]
    for k, samples in enumerate(v1_samples(load, shape, start=START, period_s=period_s)):
        w_start = START + timedelta(minutes=k)
        expected = render_batch(node="fleet-node-0000", batch_seq=k + 1, window_start=w_start,
                                window_end=w_start + timedelta(minutes=1), gpus=gpus_wire, samples=samples, wire="v2")
        assert gzip.decompress(batches[k].body) == expected
    pods = sum(len(s) for g in load.starts for s in g)
    assert len(sent.pod_seconds) == pods
    assert sum(sent.pod_seconds.values()) == gpus * workloads * 180 == sent.workload_seconds


def test_a_steady_fleet_with_churn_adds_a_row_per_pod_started_inside_a_window() -> None:
    still = {"workloads_per_gpu": 16, "gpus_per_node": 8, "batch_seconds": 60}
    churned = still | {"pod_minutes_low": 5, "pod_minutes_high": 360, "pod_grid_s": 1}
    assert pod_starts_per_slot_day(still) == 0
    starts = pod_starts_per_slot_day(churned)
    assert math.isclose(1440 / starts, 355 / math.log(72))  # a day over the mean lifetime, 83 minutes
    base, more = rows_per_gpu_day(still), rows_per_gpu_day(churned)
    assert math.isclose(more["UsageMinute"] - base["UsageMinute"], 16 * starts * 59 / 60)
    assert math.isclose(more["UsageDay"] - base["UsageDay"], 16 * starts * (1 - 1 / 86400))
    assert more["GpuMinute"] == base["GpuMinute"]
    # On a whole-minute grid no pod starts inside a minute.
    assert rows_per_gpu_day(churned | {"pod_grid_s": 60})["UsageMinute"] == base["UsageMinute"]


def test_real_time_posting_spreads_each_threads_batches_over_the_window() -> None:
    """--real-time: a client thread posts its j-th of n batches no earlier than j/n of the window in,
    to a real (loopback) server; without a spread, back to back."""
    arrivals: list[float] = []

    class Ingest(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            arrivals.append(now().timestamp())
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"accepted": 1}).encode()
            self.send_response(201)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ingest)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        work = [[("token", Batch(0, seq, 1, gzip.compress(b"{}"))) for seq in range(4)]]
        start = now().timestamp()
        [spread] = ingest_window(server.server_address[1], work, (start, 1.0))
        assert spread.batches == spread.accepted == 4
        # None early (to a millisecond: the clock reads microseconds).
        assert [a - start >= j / 4 - 1e-3 for j, a in enumerate(arrivals)] == [True] * 4
        assert arrivals[-1] - start >= 0.75
        arrivals.clear()
        start = now().timestamp()
        ingest_window(server.server_address[1], work)
        assert arrivals[-1] - start < 0.5  # as fast as answered
    finally:
        server.shutdown()
        server.server_close()
