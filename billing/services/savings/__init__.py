"""Savings: the paired static-vs-dynamic report. Requested by a user or a command, computed by a
Celery job that reports its progress on the row, rendered as tables, CSV and PDF.

The facade: code outside this package imports from here, never from its modules."""

from __future__ import annotations

from billing.services.savings.paired_report import COLD_START
from billing.services.savings.report_pdf import (
    ALTERNATIVE_LABELS,
    SAVINGS_CSV_COLUMNS,
    STUDY_NAME,
    AlternativeRow,
    CostComparison,
    PairedRow,
    SavingsTables,
    cards_text,
    definitions,
    headline_text,
    is_current,
    p_value_text,
    paired_rows,
    partial_days_note,
    period_text,
    render_paired_report_pdf,
    savings_csv_rows,
    savings_tables,
    shortfall_text,
    study_note,
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
from billing.services.savings.static_alternatives import ALTERNATIVES

__all__ = [
    "ALTERNATIVES",
    "ALTERNATIVE_LABELS",
    "COLD_START",
    "SAVINGS_CSV_COLUMNS",
    "STUDY_NAME",
    "AlternativeRow",
    "CostComparison",
    "PairedRow",
    "SavingsTables",
    "cards_text",
    "check_report_period",
    "definitions",
    "find_in_flight_report",
    "headline_text",
    "is_current",
    "p_value_text",
    "paired_rows",
    "partial_days_note",
    "period_text",
    "render_paired_report_pdf",
    "report_not_queued",
    "request_paired_report",
    "run_paired_report",
    "savings_csv_rows",
    "savings_tables",
    "shortfall_text",
    "study_note",
    "study_rows",
    "summary_rows",
    "tenant_names",
]
