import json
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from billing.errors import InvalidInput
from billing.money import money_text
from billing.services.savings import (
    headline_text,
    request_paired_report,
    run_paired_report,
    savings_tables,
    tenant_names,
)


def _day(text: str) -> datetime:
    try:
        parsed = datetime.strptime(text, "%Y-%m-%d")  # noqa: DTZ007 - a calendar day, made UTC below
    except ValueError as exc:
        raise CommandError(f"{text!r} must be a date YYYY-MM-DD") from exc
    return parsed.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = "Compute a paired static-vs-dynamic cost report for [--from, --to) (UTC days) and store it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--from", dest="start", required=True, help="first day, YYYY-MM-DD (UTC)")
        parser.add_argument("--to", dest="end", required=True, help="day after the last, YYYY-MM-DD (UTC)")
        parser.add_argument("--json", action="store_true", help="print the whole report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report, _ = request_paired_report(start=_day(options["start"]), end=_day(options["end"]),
                                              now=timezone.now(), actor_label="cli")
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        report = run_paired_report(report_id=report.pk)
        if options["json"]:
            self.stdout.write(json.dumps({"report": report.pk, **(report.result or {})}, indent=1))
            return
        tables = savings_tables(report.result, tenant_names())
        if tables is None:
            raise CommandError(f"report {report.pk}: {report.status} {report.error}".strip())
        figure, sentence = headline_text(tables)
        alternatives = "; ".join(f"{r.label}: {money_text(r.cost, tables.currency) if r.feasible else r.why_not}"
                                 for r in tables.alternatives)
        self.stdout.write(f"report {report.pk}: {figure} {sentence} ({alternatives})")
