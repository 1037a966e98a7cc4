"""Saved views and scheduled reports (docs/saved-views.md): a user's named pages with their query
strings, their schedules (daily, weekly, monthly at a UTC hour) and the reports sent, each
occurrence exactly once."""

from billing.services.saved_views.recurrence import (
    FREQUENCIES,
    PERIODS,
    Recurrence,
    latest_occurrence,
    next_occurrence,
    report_period,
)
from billing.services.saved_views.sending import (
    Render,
    Report,
    recurrence_of,
    saved_dates,
    send_due_reports,
    send_now,
)
from billing.services.saved_views.views import (
    MAX_RECIPIENTS,
    ScheduleInput,
    create_view,
    delete_schedule,
    delete_view,
    owned_view,
    rename_view,
    set_schedule,
)

__all__ = [
    "FREQUENCIES",
    "MAX_RECIPIENTS",
    "PERIODS",
    "Recurrence",
    "Render",
    "Report",
    "ScheduleInput",
    "create_view",
    "delete_schedule",
    "delete_view",
    "latest_occurrence",
    "next_occurrence",
    "owned_view",
    "recurrence_of",
    "rename_view",
    "report_period",
    "saved_dates",
    "send_due_reports",
    "send_now",
    "set_schedule",
]
