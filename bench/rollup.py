"""Rollup benchmark: GPU-minutes priced per second by `rollup_usage`, and by a `rebuild_ledger`
of the same range (the recompute alone, repeatable).

    python bench/rollup.py [--agents 4] [--batches-per-agent 60] [--seconds-per-batch 10]
                           [--gpus 8] [--workloads-per-gpu 3] [--repeats 3]

DATABASE_URL must be set (`python -m config.embedded -- python bench/rollup.py` provides it). The
benchmark drops and creates `<dbname>_bench` on that server, stores batches through the ingest
service (no HTTP), then times one rollup cycle over all of them and `--repeats` rebuilds of their
range. Run it at two commits on the same machine to compare them: the numbers are absolute, and a
benchmark never fails on speed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.ingest import (  # noqa: E402
    Timeline,
    bench_database,
    build_payloads,
    child_env,
    make_agent,
    manage,
    recreate_database,
    setup_django,
    with_database,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--batches-per-agent", type=int, default=60)
    p.add_argument("--seconds-per-batch", type=int, default=10)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--workloads-per-gpu", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=20261201)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    admin_url, name = bench_database(os.environ["DATABASE_URL"])
    recreate_database(admin_url, name)
    try:
        env = child_env(with_database(admin_url, name))
        manage(env, "migrate", "--noinput")
        setup_django(env)
        return run(args)
    finally:
        from django.db import connections

        connections.close_all()
        recreate_database(admin_url, name, drop_only=True)


def run(args: argparse.Namespace) -> int:
    from django.utils import timezone

    from billing.ledger.rollup import rebuild_ledger, rollup_usage
    from billing.models import GpuMinute, Node, RateCard
    from billing.services.ingest import record_usage_batch
    from billing.services.tokens import issue_node_token

    rng = random.Random(args.seed)
    RateCard.objects.create(gpu_model="NVIDIA A100-SXM4-80GB", currency="USD", price_per_gpu_hour=Decimal("4.10"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    agents = [make_agent(i, gpus=args.gpus, workloads_per_gpu=args.workloads_per_gpu, rng=rng)
              for i in range(args.agents)]
    end = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=5)
    timeline = Timeline(end=end, seconds=args.seconds_per_batch, total=args.batches_per_agent)
    payloads = build_payloads(agents, timeline.take(args.batches_per_agent), args.seconds_per_batch, rng)
    for agent, batches in zip(agents, payloads, strict=True):
        issue_node_token(node_name=agent.node, now=timezone.now(), actor_label="bench")
        node = Node.objects.get(name=agent.node)
        for payload in batches:
            content = json.dumps(payload).encode()
            record_usage_batch(node=node, payload=payload, content=content, now=timezone.now())
    start = end - timedelta(seconds=args.seconds_per_batch * args.batches_per_agent)

    began = time.perf_counter()
    result = rollup_usage(now=timezone.now(), max_batches=10**6)
    rollup_s = time.perf_counter() - began
    rebuilds = []
    for _ in range(args.repeats):
        began = time.perf_counter()
        rebuild_ledger(start=start, end=end)
        rebuilds.append(time.perf_counter() - began)
    minutes = GpuMinute.objects.count()
    samples = args.agents * args.batches_per_agent * args.seconds_per_batch * args.gpus * args.workloads_per_gpu
    rebuild_s = statistics.median(rebuilds)
    print(f"{result.batches} batches, {samples:,} samples, {minutes:,} GPU-minutes")
    print("| step | seconds | GPU-minutes/s | samples/s |\n|---|---:|---:|---:|")
    print(f"| rollup_usage (one cycle) | {rollup_s:.2f} | {minutes / rollup_s:,.0f} | {samples / rollup_s:,.0f} |")
    print(f"| rebuild_ledger (median of {args.repeats}) | {rebuild_s:.2f} | {minutes / rebuild_s:,.0f} "
          f"| {samples / rebuild_s:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
