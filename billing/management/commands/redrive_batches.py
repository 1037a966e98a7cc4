from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from billing.errors import InvalidInput
from billing.models import UsageBatch
from billing.services.quarantine import redrive_batches


class Command(BaseCommand):
    help = ("List quarantined usage batches, or give them back to the rollup once their cause is fixed "
            "(audited). The next rollup tries them again; one that still fails is quarantined again.")

    def add_arguments(self, parser):
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--id", type=int, action="append", dest="ids", help="a batch id (repeatable)")
        group.add_argument("--node", help="every quarantined batch of this node")
        group.add_argument("--all", action="store_true", help="every quarantined batch")

    def handle(self, *args, **options):
        if not (options["ids"] or options["node"] or options["all"]):
            for b in UsageBatch.objects.filter(quarantined_at__isnull=False).select_related("node").order_by("pk"):
                self.stdout.write(f"{b.pk}\t{b.node.name}\t{b.batch_seq}\t{b.quarantined_at:%Y-%m-%dT%H:%M:%SZ}\t"
                                  f"{b.quarantine_error}")
            return
        try:
            count = redrive_batches(batch_ids=options["ids"], node=options["node"], now=timezone.now(),
                                    actor_label="cli")
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"re-driven {count} batch(es); the next rollup takes them")
