from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django import forms
from django.http import QueryDict
from django.utils.formats import date_format
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from billing.queries.explore import DEFAULT_SORT, SORT_COLUMNS

MAX_PERIOD_DAYS = 366
ISO_DATE = "%Y-%m-%d"
# What a date field accepts, whatever the reader's language: ISO (the period links, scripts, the
# savings card's hidden fields) and the way each language writes a date (config/formats: English
# 2026-12-01, Chinese 2026年12月1日 or 2026/12/01), so a link made in one language opens in the other.
DATE_INPUTS = (ISO_DATE, "%Y/%m/%d", "%Y年%m月%d日")
# The dates a page accepts. Bounded where parsed: 9999-12-31 is a valid date, but the day after it
# (a period's exclusive end) is not, and no ledger holds a day outside these.
MIN_DATE = date(2000, 1, 1)
MAX_DATE = date(2199, 12, 31)
_EXAMPLE_DATE = date(2026, 1, 31)  # any date: the error message shows the format with it


class DateInLanguageInput(forms.TextInput):
    """A date written as the reader's language writes it on every page (DATE_FORMAT: 2026-12-01,
    2026年12月1日). Not `<input type="date">`: a browser draws that in its own locale (12/01/2026 in
    a US-English browser, whichever language the user chose here), and a page cannot change that."""

    def __init__(self) -> None:
        super().__init__(attrs={"inputmode": "numeric", "autocomplete": "off", "size": 14})

    def format_value(self, value: Any) -> str | None:
        """A date, or a date as submitted (a bound form: 2026/12/01, or ISO from a link), written the
        reader's way; what is no date stays as typed, for the user to correct."""
        if isinstance(value, str):
            value = _parsed(value) or value
        if isinstance(value, date):
            return date_format(value, "DATE_FORMAT")
        return super().format_value(value)


def _parsed(text: str) -> date | None:
    for pattern in DATE_INPUTS:
        try:
            return datetime.strptime(text.strip(), pattern).replace(tzinfo=UTC).date()
        except ValueError:
            continue
    return None


class LanguageDateField(forms.DateField):
    """A date in the reader's language's format, also accepting ISO and the other language's
    (DATE_INPUTS); bounded to MIN_DATE…MAX_DATE."""

    widget = DateInLanguageInput

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(input_formats=DATE_INPUTS, **kwargs)

    def to_python(self, value: Any) -> date | None:
        try:
            return super().to_python(value.strip() if isinstance(value, str) else value)
        except forms.ValidationError:
            raise forms.ValidationError(gettext("Enter a date as %(example)s.")
                                        % {"example": date_format(_EXAMPLE_DATE, "DATE_FORMAT")},
                                        code="invalid") from None

    def validate(self, value: Any) -> None:
        super().validate(value)
        if value and not MIN_DATE <= value <= MAX_DATE:
            raise forms.ValidationError(_("Enter a date from %(min)s to %(max)s.")
                                        % {"min": date_format(MIN_DATE, "DATE_FORMAT"),
                                           "max": date_format(MAX_DATE, "DATE_FORMAT")})


class PeriodForm(forms.Form):
    """A period of whole UTC days, both ends included. Defaults to the month to date."""

    start = LanguageDateField(label=_("From"))
    end = LanguageDateField(label=_("To (inclusive)"))

    @staticmethod
    def default_initial(today: date) -> dict[str, date]:
        return {"start": today.replace(day=1), "end": today}

    @staticmethod
    def with_default_period(data: QueryDict, today: date) -> QueryDict:
        """`data` with the month to date when it asks for no period (the pages that default to it)."""
        if {"start", "end"} & set(data):
            return data
        out = data.copy()
        for key, value in PeriodForm.default_initial(today).items():
            out[key] = value.isoformat()
        return out

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


# Kubernetes label syntax (a DNS-subdomain prefix is optional): a filter that could never match is
# a 400 naming `label`, not an empty table.
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9.]{0,251}[A-Za-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
MAX_FILTER_VALUES = 20


def _values(text: str, parameter: str) -> tuple[str, ...]:
    values = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    if len(values) > MAX_FILTER_VALUES:
        raise forms.ValidationError(_("%(parameter)s: at most %(n)s values, separated by commas.")
                                    % {"parameter": parameter, "n": MAX_FILTER_VALUES})
    return values


class ExploreForm(PeriodForm):
    """The drill-down's GET form: the period, the path walked (tenant → namespace → controller →
    pod; hidden, set by the links) and the filters. Every error names its query parameter."""

    tenant = forms.CharField(required=False, max_length=253, widget=forms.HiddenInput)
    namespace = forms.CharField(required=False, max_length=253, widget=forms.HiddenInput)
    controller = forms.CharField(required=False, max_length=520, widget=forms.HiddenInput)
    pod = forms.CharField(required=False, max_length=253, widget=forms.HiddenInput)
    container = forms.CharField(required=False, max_length=253, widget=forms.HiddenInput)
    label = forms.CharField(label=_("Label (name=value)"), required=False, max_length=2000,
                            widget=forms.TextInput(attrs={"placeholder": "app=bert", "size": 16}))
    node = forms.CharField(label=_("Node"), required=False, max_length=2000,
                           widget=forms.TextInput(attrs={"size": 12}))
    gpu_model = forms.CharField(label=_("GPU model"), required=False, max_length=2000,
                                widget=forms.TextInput(attrs={"size": 16}))
    sla_tier = forms.CharField(label=_("SLA tier"), required=False, max_length=2000,
                               widget=forms.TextInput(attrs={"size": 8}))
    q = forms.CharField(label=_("Search names"), required=False, max_length=200,
                        widget=forms.TextInput(attrs={"type": "search", "size": 14}))
    sort = forms.CharField(required=False, max_length=40, widget=forms.HiddenInput)

    PATH = ("tenant", "namespace", "controller", "pod", "container")  # billing.queries.explore.STEPS

    def clean_label(self) -> tuple[tuple[str, str], ...]:
        pairs: dict[str, str] = {}
        for item in _values(self.cleaned_data["label"], "label"):
            name, sep, value = (part.strip() for part in item.partition("="))
            if not sep or not _LABEL_NAME.match(name) or not _LABEL_VALUE.match(value):
                raise forms.ValidationError(
                    _("label: write name=value, several separated by commas (app=bert,team=ml); “%(item)s” is not.")
                    % {"item": item})
            if name in pairs and pairs[name] != value:
                raise forms.ValidationError(_("label: “%(name)s” is given twice.") % {"name": name})
            pairs[name] = value
        return tuple(pairs.items())

    def clean_node(self) -> tuple[str, ...]:
        return _values(self.cleaned_data["node"], "node")

    def clean_gpu_model(self) -> tuple[str, ...]:
        return _values(self.cleaned_data["gpu_model"], "gpu_model")

    def clean_sla_tier(self) -> tuple[str, ...]:
        return _values(self.cleaned_data["sla_tier"], "sla_tier")

    def clean_q(self) -> str:
        return str(self.cleaned_data["q"]).strip()

    def clean_sort(self) -> str:
        sort = str(self.cleaned_data["sort"]).strip() or DEFAULT_SORT
        if sort.removeprefix("-") not in SORT_COLUMNS:
            raise forms.ValidationError(
                _("sort: unknown column “%(column)s”; sort by one of %(columns)s, with “-” first for the largest first.")
                % {"column": sort, "columns": ", ".join(SORT_COLUMNS)})
        return sort

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        # Each step of the path lies inside the one before: a namespace without its tenant would
        # mix tenants' namespaces of one name.
        for before, step in zip(self.PATH, self.PATH[1:], strict=False):
            if data.get(step) and not data.get(before):
                self.add_error(step, _("%(step)s: give %(before)s too; the drill-down goes tenant → namespace → "
                                       "controller → pod → container.") % {"step": step, "before": before})
        return data
