"""What the agent's spool takes on a node to keep its per-second samples for an audit (docs/agent.md,
Per-second samples for audits), against what its batches (wire protocol v2) send.

    python bench/spool_disk.py [--gpus 8] [--workloads-per-gpu 16] [--minutes 10] [--seed 7]

The real agent loop (agents.loop.Agent) meters a simulated node (agents.backends.sim, the demo's A100
scenario, its pods repeated with new names up to --workloads-per-gpu per GPU) every second for
--minutes of fake-clock time, in 60-second batches, into a real spool (SQLite, gzip as shipped).
No Django, no database: the node's side only. Bytes per day = bytes of the run x 1440 / --minutes.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agents.backends.sim import SimBackend, demo_scenario, parse_scenario  # noqa: E402 - after the path fix above
from agents.enforcers import DryRunEnforcer  # noqa: E402
from agents.fakes.clock import FakeClock  # noqa: E402
from agents.loop import Agent, AgentConfig  # noqa: E402
from agents.spool import DEFAULT_SAMPLE_RETENTION, Spool  # noqa: E402

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
TENANTS = [("acme", "gold"), ("globex", "silver"), ("initech", "bronze")]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--workloads-per-gpu", type=int, default=16)
    p.add_argument("--minutes", type=int, default=10)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args(argv)


def scenario(gpus: int, per_gpu: int, seed: int) -> dict[str, Any]:
    """The demo's node with each GPU's pods repeated, renamed, until `per_gpu` pods a GPU."""
    document = demo_scenario("gpu-node-01", seed=seed, gpu_count=gpus, tenants=TENANTS)
    workloads = []
    for gpu in document["gpus"]:
        own = [w for w in document["workloads"] if w["gpu"] == gpu["uuid"]]
        for i in range(per_gpu):
            base = own[i % len(own)]
            workloads.append({**base, "pod": f"{base['pod'][:50]}-{i}", "pod_uid": f"{base['pod_uid'][:30]}-{i}"})
    return {**document, "workloads": workloads}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spool.sqlite"
        node = parse_scenario(scenario(args.gpus, args.workloads_per_gpu, args.seed))
        spool = Spool(path, node=node.node, now=lambda: T0)
        Agent(config=AgentConfig(node=node.node), backend=SimBackend(node, epoch=T0), clock=FakeClock(start=T0),
              enforcer=DryRunEnforcer(), spool=spool).run(stop=threading.Event(), start=T0,
                                                          until=T0 + timedelta(minutes=args.minutes))
        spool.close()
        with sqlite3.connect(path) as db:
            evidence, kept = db.execute("SELECT sum(length(body)), count(*) FROM samples").fetchone()
            sent = db.execute("SELECT sum(length(body)), count(*) FROM batches").fetchone()[0]
    per_day = 1440 / args.minutes
    days = DEFAULT_SAMPLE_RETENTION.days
    workloads = args.gpus * args.workloads_per_gpu
    print(f"{args.gpus} GPUs x {args.workloads_per_gpu} workloads, {args.minutes} minutes metered every second, "
          f"{kept} batches of 60 s:\n")
    print("| what | bytes per workload-minute | MB per day on the node | GB held for the default retention |")
    print("|---|---:|---:|---:|")
    for label, size, held in (("per-second samples kept as evidence (gzip JSON)", evidence, days),
                              ("the batches sent (v2 integrals, gzip JSON)", sent, None)):
        per_minute = size / (workloads * args.minutes)
        held_text = f"{size * per_day * held / 1e9:,.2f} ({held} days)" if held else "- (1,000 sent kept)"
        print(f"| {label} | {per_minute:,.0f} | {size * per_day / 1e6:,.0f} | {held_text} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
