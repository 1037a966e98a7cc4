from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from billing.errors import InvalidInput
from billing.models import NodeToken
from billing.services.identity import revoke_node_token


class Command(BaseCommand):
    help = "Revoke node tokens: by token id, by prefix (vgl_…), or every token of --node."

    def add_arguments(self, parser: CommandParser) -> None:
        group = parser.add_mutually_exclusive_group(required=True)
        group.add_argument("--id", type=int)
        group.add_argument("--prefix")
        group.add_argument("--node")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["id"] is not None:
            ids = [options["id"]]
        elif options["prefix"]:
            ids = list(NodeToken.objects.filter(prefix=options["prefix"], revoked_at=None).values_list("pk", flat=True))
        else:
            ids = list(NodeToken.objects.filter(node__name=options["node"], revoked_at=None).values_list("pk", flat=True))
        if not ids:
            raise CommandError("no active token matches")
        now = timezone.now()
        try:
            for token_id in ids:
                revoke_node_token(token_id=token_id, now=now, actor_label="cli")
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"revoked {len(ids)} token(s)")
