from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from billing.errors import InvalidInput
from billing.services.fleet import reassign_gpu


class Command(BaseCommand):
    help = ("Hand a GPU that physically moved to another node: from now on only that node may meter it "
            "(audited; what the old node metered stays billed to it).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("uuid", help="the GPU's UUID, as in the node's batches")
        parser.add_argument("node", help="the node it now belongs to")
        parser.add_argument("--reason", required=True, help="why it moved (goes into the audit log)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            gpu = reassign_gpu(uuid=options["uuid"], to_node=options["node"], reason=options["reason"],
                               now=timezone.now(), actor_label="cli")
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"GPU {gpu.uuid} now belongs to node {options['node']}")
