"""A rollup worker in a process of its own, as Celery runs one: `python -m tests.billing.rollup_worker
SHARD SHARDS` rolls up its shard until nothing of it is pending (retrying while another worker holds
one of its nodes or the ledger is locked for re-pricing), then prints its totals as JSON.

Used by tests/billing/test_rollup_sharded.py, which starts it with DATABASE_URL naming the test
database. It runs the product's entry point unchanged (billing.services.ingest.rollup.run_rollup)."""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    shard, shards = int(argv[0]), int(argv[1])
    import django

    django.setup()
    from django.utils import timezone

    from billing.services.ingest.rollup import run_rollup

    batches = minutes = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        result = run_rollup(now=timezone.now(), shard=shard, shards=shards)  # noqa: TID251 - as a Celery worker
        batches, minutes = batches + result.batches, minutes + result.gpu_minutes
        if result.batches == 0 and not result.skipped:
            break
        if result.skipped:
            time.sleep(0.05)
    print(json.dumps({"shard": shard, "shards": shards, "batches": batches, "gpu_minutes": minutes}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
