from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from billing.errors import InvalidInput
from billing.models import ApiToken
from billing.services.identity import revoke_api_token


class Command(BaseCommand):
    help = "Revoke a read-API token, named by its id or by its prefix (vgla_…, as the API tokens page shows it)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("token", metavar="PREFIX_OR_ID")

    def handle(self, *args: Any, **options: Any) -> None:
        given = options["token"].strip().rstrip("…")
        if given.isdigit():
            ids = list(ApiToken.objects.filter(pk=int(given)).values_list("pk", flat=True))
        elif given.startswith("vgla_"):
            # A prefix is 13 characters; the whole token also works (its first 13 are the prefix).
            ids = list(ApiToken.objects.filter(prefix=given[:13], revoked_at=None).values_list("pk", flat=True))
        else:
            raise CommandError(f"{given!r} is neither a token id nor a prefix starting vgla_")
        if not ids:
            raise CommandError(f"no active API token matches {given!r}")
        if len(ids) > 1:
            raise CommandError(f"{len(ids)} active tokens share the prefix {given!r}; revoke by id (ids {ids})")
        try:
            revoke_api_token(token_id=ids[0], now=timezone.now(), actor_label="cli")
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"revoked API token {ids[0]}")
