import time
from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from billing.ledger.rollup import rollup_usage


class Command(BaseCommand):
    help = "Roll pending usage batches into the priced ledgers until none is pending (what the beat task runs)."

    def handle(self, *args: Any, **options: Any) -> None:
        total = 0
        # Another rollup (the beat's) may hold the lock: wait for it; stop once nothing is pending.
        for _ in range(120):
            result = rollup_usage(now=timezone.now())
            total += result.batches
            if result.skipped:
                time.sleep(0.5)
                continue
            if result.batches == 0:
                break
        self.stdout.write(f"rolled up {total} batch(es)")
