from django.core.management.base import BaseCommand
from django.utils import timezone

from billing.services.rollup import rollup_usage


class Command(BaseCommand):
    help = "Roll pending usage batches into the priced minute and hour ledgers (what the beat task runs)."

    def handle(self, *args, **options):
        total = 0
        while True:
            result = rollup_usage(now=timezone.now())
            total += result.batches
            if result.batches == 0 or result.skipped:
                break
        self.stdout.write(f"rolled up {total} batch(es)")
