import getpass
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from billing.errors import DomainError
from billing.money import format_minor_units
from billing.services.invoicing import issue_credit_note


class Command(BaseCommand):
    help = ("Issue a credit note against a finalized invoice: a net amount (tax is credited on top at the "
            "invoice's rate) and a reason, audited as the operator running the command.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--invoice", required=True, help="invoice number, e.g. VGL-202611-acme")
        parser.add_argument("--amount", required=True, help="net amount in major units, e.g. 12.50")
        parser.add_argument("--reason", required=True, help="why; printed on the credit note")

    def handle(self, *args: Any, **options: Any) -> None:
        operator = getpass.getuser()
        try:
            issued = issue_credit_note(invoice_number=options["invoice"], amount_text=options["amount"],
                                       reason=options["reason"], now=timezone.now(),
                                       actor_label=f"{operator} (manage.py issue_credit_note)")
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"{issued.number}: credits {format_minor_units(issued.total_minor, issued.currency)} {issued.currency} "
            f"({format_minor_units(issued.amount_minor, issued.currency)} net + "
            f"{format_minor_units(issued.tax_minor, issued.currency)} tax) on {issued.invoice_number}")
