"""Savings: the paired static-vs-dynamic report. Requested by a user or a command, computed by a
Celery job that reports its progress on the row, rendered as tables, CSV and PDF.

The facade: code outside this package imports from here, never from its modules."""

from __future__ import annotations

from billing.services.savings.paired_report import COLD_START
from billing.services.savings.report_pdf import (
    SAVINGS_CSV_COLUMNS,
    CostComparison,
    definitions,
    partial_days_note,
    period_text,
    render_paired_report_pdf,
    savings_csv_rows,
    savings_tables,
    study_rows,
    summary_rows,
)
from billing.services.savings.reports import (
    check_report_period,
    find_in_flight_report,
    report_not_queued,
    request_paired_report,
    run_paired_report,
    tenant_names,
)

__all__ = [
    "COLD_START",
    "SAVINGS_CSV_COLUMNS",
    "CostComparison",
    "check_report_period",
    "definitions",
    "find_in_flight_report",
    "partial_days_note",
    "period_text",
    "render_paired_report_pdf",
    "report_not_queued",
    "request_paired_report",
    "run_paired_report",
    "savings_csv_rows",
    "savings_tables",
    "study_rows",
    "summary_rows",
    "tenant_names",
]
