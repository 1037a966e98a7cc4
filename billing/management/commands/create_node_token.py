from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from billing.errors import InvalidInput
from billing.services.identity import issue_node_token


class Command(BaseCommand):
    help = (
        "Issue a new bearer token for each NODE (created if new). Prints only the tokens, one a line in the "
        "order given; they are stored hashed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        # Several at once: a launcher that sets up a fleet (the demo, the soak) starts Django once, not per node.
        parser.add_argument("nodes", nargs="+", metavar="node", help="Kubernetes node name")

    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        try:
            # All or none: a refused name leaves no token issued for the names before it.
            with transaction.atomic():
                issued = [issue_node_token(node_name=node, now=now, actor_label="cli") for node in options["nodes"]]
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        for token in issued:
            self.stdout.write(token.token)
