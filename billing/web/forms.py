from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

MAX_PERIOD_DAYS = 366
ISO_DATE = "%Y-%m-%d"


class IsoDateField(forms.DateField):
    """A date as `<input type="date">` wants it in every language: the value is always ISO
    (YYYY-MM-DD, which is also what the browser submits), never the locale's input format
    (zh-hans would write 2026/12/01, which Chromium shows as a blank input)."""

    widget = forms.DateInput(format=ISO_DATE, attrs={"type": "date"})

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(input_formats=[ISO_DATE], error_messages={"invalid": _("Enter a date as YYYY-MM-DD.")},
                         **kwargs)


class PeriodForm(forms.Form):
    """A period of whole UTC days, both ends included. Defaults to the month to date."""

    start = IsoDateField(label=_("From"))
    end = IsoDateField(label=_("To (inclusive)"))

    @staticmethod
    def default_initial(today: date) -> dict[str, date]:
        return {"start": today.replace(day=1), "end": today}

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end = data.get("start"), data.get("end")
        if start and end:
            if end < start:
                raise forms.ValidationError(_("'To' must not be before 'From'."))
            if (end - start).days >= MAX_PERIOD_DAYS:
                raise forms.ValidationError(_("A period may span at most %(days)s days.") % {"days": MAX_PERIOD_DAYS})
        return data

    def bounds(self) -> tuple[datetime, datetime]:
        start: date = self.cleaned_data["start"]
        end: date = self.cleaned_data["end"]
        lo = datetime(start.year, start.month, start.day, tzinfo=UTC)
        hi = datetime(end.year, end.month, end.day, tzinfo=UTC) + timedelta(days=1)
        return lo, hi


class RetireForm(forms.Form):
    """Retiring a rate card or an SLA tier: a reason (kept in the audit log and shown on the page)
    and an explicit confirmation."""

    reason = forms.CharField(label=_("Why"), max_length=500, widget=forms.TextInput(attrs={"size": 24}))
    confirm = forms.BooleanField(label=_("I confirm the retirement"),
                                 error_messages={"required": _("Tick the confirmation to retire.")})

    def error_text(self) -> str:
        """Every error in one line, for a table row's message."""
        return " ".join(str(e) for errors in self.errors.values() for e in errors)
