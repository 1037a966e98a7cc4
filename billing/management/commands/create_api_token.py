from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from billing.errors import InvalidInput
from billing.services.identity import MAX_EXPIRY_DAYS, expiry_after_days, issue_api_token


class Command(BaseCommand):
    help = ("Issue a read-API token for USERNAME; it acts with that user's role (a tenant member's token "
            "sees only its tenant). Prints only the token, once; it is stored hashed.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="what the token is for (shown on the API tokens page)")
        parser.add_argument("--expires-days", type=int, default=None,
                            help=f"expire after N days (1 to {MAX_EXPIRY_DAYS}); default: never")

    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        try:
            issued = issue_api_token(username=options["username"], name=options["name"],
                                     expires_at=expiry_after_days(options["expires_days"], now=now),
                                     now=now, actor_label="cli")
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(issued.token)
