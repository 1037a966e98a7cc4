from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from billing.calendar import parse_month
from billing.errors import InvalidInput
from billing.services.invoicing import close_period


class Command(BaseCommand):
    help = "Close a month: finalize one invoice per tenant (safe to rerun after a crash)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--month", required=True, help="YYYY-MM, a month that is over")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = close_period(month=parse_month(options["month"]), now=timezone.now())
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        if result.already_closed:
            self.stdout.write(f"{result.month:%Y-%m} was already closed ({result.invoices_already_final} invoices)")
        else:
            self.stdout.write(f"closed {result.month:%Y-%m}: {result.invoices_finalized} invoice(s) finalized, "
                              f"{result.invoices_already_final} already final")
        for item in result.unpriced:
            # Left off the invoices until the model is approved and priced (then a late-usage adjustment).
            self.stdout.write(f"unpriced: {item.gpu_model}: {item.gpu_hours:.2f} GPU-hours, "
                              f"tenants {', '.join(item.tenants) or '-'} (approve and price it on /gpu-models/)")
