from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from billing.errors import InvalidInput
from billing.services.identity import issue_node_token


class Command(BaseCommand):
    help = "Issue a new bearer token for NODE (created if new). Prints only the token; it is stored hashed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node", help="Kubernetes node name")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            issued = issue_node_token(node_name=options["node"], now=timezone.now(), actor_label="cli")
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(issued.token)
