from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

MAX_PERIOD_DAYS = 366


class PeriodForm(forms.Form):
    """A period of whole UTC days, both ends included. Defaults to the month to date."""

    start = forms.DateField(label=_("From"), widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(label=_("To (inclusive)"), widget=forms.DateInput(attrs={"type": "date"}))

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
