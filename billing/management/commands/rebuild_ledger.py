from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.ledger.rollup import rebuild_ledger


def _utc(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise CommandError(f"{text!r} is not an ISO-8601 date or timestamp") from exc
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Command(BaseCommand):
    help = "Price the minute and hour ledgers of [--from, --to) again from their stored integrals (e.g. after a rate-card fix)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--from", dest="start", required=True, help="UTC date or timestamp, inclusive")
        parser.add_argument("--to", dest="end", required=True, help="UTC date or timestamp, exclusive")

    def handle(self, *args: Any, **options: Any) -> None:
        start, end = _utc(options["start"]), _utc(options["end"])
        if end <= start:
            raise CommandError("--to must be after --from")
        result = rebuild_ledger(start=start, end=end)
        self.stdout.write(f"recomputed {result.gpu_minutes} GPU-minute(s), {result.gpu_hours} GPU-hour(s)")
