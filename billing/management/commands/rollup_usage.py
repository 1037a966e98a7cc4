import time
from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from billing.services.ingest import run_rollup


class Command(BaseCommand):
    help = "Roll pending usage batches into the priced ledgers until none is pending (what the beat task runs)."

    def handle(self, *args: Any, **options: Any) -> None:
        total = 0
        # A worker may hold a node, or re-pricing the ledger: wait for it; stop once nothing is pending.
        for _ in range(120):
            result = run_rollup(now=timezone.now())  # every shard: shards=1
            total += result.batches
            if result.skipped:
                time.sleep(0.5)
                continue
            if result.batches == 0:
                break
        self.stdout.write(f"rolled up {total} batch(es)")
