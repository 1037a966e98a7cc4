from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from billing.errors import InvalidInput
from billing.services.invoicing import close_period, parse_month


class Command(BaseCommand):
    help = "Close a month: finalize one invoice per tenant (safe to rerun after a crash)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--month", required=True, help="YYYY-MM, a month that is over")
        parser.add_argument("--allow-unpriced", action="store_true",
                            help="close even if some GPU-hours have no rate card (they stay off the invoices)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = close_period(month=parse_month(options["month"]), now=timezone.now(),
                                  allow_unpriced=options["allow_unpriced"])
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        if result.already_closed:
            self.stdout.write(f"{result.month:%Y-%m} was already closed ({result.invoices_already_final} invoices)")
        else:
            self.stdout.write(f"closed {result.month:%Y-%m}: {result.invoices_finalized} invoice(s) finalized, "
                              f"{result.invoices_already_final} already final")
