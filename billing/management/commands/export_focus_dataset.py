from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from billing.calendar import parse_month
from billing.errors import DomainError
from billing.services.exports import plain_decimal, write_fleet_dataset


class Command(BaseCommand):
    help = ("Write one month's FOCUS 1.3 dataset of the whole fleet (CSV, Parquet, FOCUS metadata, manifest) to "
            "DIR/YYYY-MM/, as the daily task does (docs/exports.md).")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("month", help="YYYY-MM")
        parser.add_argument("--dir", default="", help="folder to write under (default: VGPU_FOCUS_DATASET_DIR)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            month = parse_month(options["month"])
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        directory = options["dir"] or settings.VGPU_FOCUS_DATASET_DIR
        if not directory:
            raise CommandError("no folder: pass --dir or set VGPU_FOCUS_DATASET_DIR")
        try:
            written = write_fleet_dataset(month, Path(directory), now=timezone.now(),
                                          horizon=settings.VGPU_LATE_USAGE_HORIZON)
        except OSError as exc:
            raise CommandError(f"cannot write under {directory}: {exc.strerror or exc}") from exc
        totals = ", ".join(f"{plain_decimal(total)} {currency}" for currency, total in sorted(written.totals.items()))
        state = "final" if written.final else "may still change"
        self.stdout.write(f"{month:%Y-%m}: {written.rows} rows, billed cost {totals or '0'} ({state}) in {written.directory}"
                          + ("" if written.changed else " (unchanged)"))
