from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from billing.errors import InvalidInput
from billing.ledger.state import list_quarantined_batches
from billing.services.ingest import redrive_batches


class Command(BaseCommand):
    help = ("List quarantined usage batches, or give them back to the rollup once their cause is fixed "
            "(audited). The next rollup tries them again; one that still fails is quarantined again.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--id", type=int, action="append", dest="ids", help="a batch id (repeatable)")
        group.add_argument("--node", help="every quarantined batch of this node")
        group.add_argument("--all", action="store_true", help="every quarantined batch")

    def handle(self, *args: Any, **options: Any) -> None:
        if not (options["ids"] or options["node"] or options["all"]):
            for b in sorted(list_quarantined_batches(), key=lambda b: b.batch_id):
                self.stdout.write(f"{b.batch_id}\t{b.node}\t{b.batch_seq}\t{b.quarantined_at:%Y-%m-%dT%H:%M:%SZ}\t"
                                  f"{b.error}")
            return
        try:
            count = redrive_batches(batch_ids=options["ids"], node=options["node"], now=timezone.now(),
                                    actor_label="cli")
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"re-driven {count} batch(es); the next rollup takes them")
