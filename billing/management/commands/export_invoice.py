from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from billing.errors import DomainError
from billing.scope import Scope
from billing.services.exports import EXPORT_FORMATS, export_invoice, find_invoice_number

# Commands run as an operator: every tenant is in scope.
_EVERY_TENANT = Scope(tenants=None, is_finance=True, is_admin=True)


class Command(BaseCommand):
    help = "Write one tenant's invoice for a month as PDF, CSV or FOCUS 1.3 cost-and-usage CSV."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--month", required=True, help="YYYY-MM, an invoiced month")
        parser.add_argument("--format", required=True, choices=EXPORT_FORMATS, dest="fmt")
        parser.add_argument("--output", required=True, help="file to write")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            number = find_invoice_number(tenant_slug=options["tenant"], month_text=options["month"])
            export = export_invoice(scope=_EVERY_TENANT, number=number, fmt=options["fmt"])
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        output = Path(options["output"])
        try:
            output.write_bytes(export.content)
        except OSError as exc:
            raise CommandError(f"cannot write {output}: {exc.strerror}") from exc
        self.stdout.write(f"{number}: wrote {len(export.content)} bytes ({options['fmt']}) to {output}")
