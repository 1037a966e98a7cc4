"""OpenCost's query parameters of the allocation API (docs/allocation-api.md), parsed into the
arguments of billing.queries.allocation: windows, steps, accumulate, aggregate keys, booleans and
the v1 and v2 filter languages. Each refusal is a ParameterError naming the parameter (the 400's
body). HTTP parsing belongs to the edge; the sets and their money are the query's."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from django.utils.translation import gettext

from billing.calendar import floor_to, month_bounds, month_of, utc_midnight
from billing.ledger import allocation as ledger
from billing.queries.allocation import (
    ACCUMULATE_UNITS,
    AGGREGATE_KEYS,
    DEFAULT_AGGREGATE,
    LABEL_PREFIX,
    ParameterError,
    Window,
    require_printable,
)

__all__ = [
    "LEGACY_FILTERS",
    "MAX_FILTER_DEPTH",
    "MAX_FILTER_LENGTH",
    "MAX_SPAN",
    "legacy_filter_tree",
    "parse_accumulate",
    "parse_aggregate",
    "parse_bool",
    "parse_filter",
    "parse_filter_tree",
    "parse_step",
    "parse_window",
]

_HOUR = timedelta(hours=1)
_DAY = timedelta(days=1)

_DURATION = re.compile(r"^(\d{1,6})(s|m|h|d|w)$")
_UNITS = {"s": timedelta(seconds=1), "m": timedelta(minutes=1), "h": _HOUR, "d": _DAY, "w": timedelta(weeks=1)}
# OpenCost takes a Unix pair with a comma or a dash, and "<window> offset <duration>".
_UNIX_PAIR = re.compile(r"^(\d{1,12})[,-](\d{1,12})$")
_OFFSET = re.compile(r"^(.+?)\s+offset\s+(\S+)$")
_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# No window, step or offset is longer: far past any ledger, short of the calendar's edge (400, not 500).
MAX_SPAN = timedelta(days=3660)
def _month_start(at: datetime) -> datetime:
    return month_bounds(month_of(utc_midnight(at)))[0]


def _parse_instant(text: str) -> datetime:
    if _DATE_ONLY.match(text):  # OpenCost's date-only pair: UTC midnights
        text += "T00:00:00+00:00"
    try:
        at = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ParameterError("window", gettext("%(value)r is not an RFC 3339 time") % {"value": text}) from exc
    if at.tzinfo is None:
        raise ParameterError("window", gettext("%(value)r has no time zone (end it with Z or an offset)")
                             % {"value": text})
    try:
        return at.astimezone(UTC)
    except OverflowError as exc:  # year 1 or 9999 moved past the calendar's edge by its offset
        raise ParameterError("window", gettext("%(value)r is out of range") % {"value": text}) from exc


def parse_window(text: str, *, now: datetime) -> Window:  # noqa: PLR0912 - one branch per window form OpenCost accepts
    """OpenCost's window forms, in UTC, relative to `now`: `today` and `yesterday` (whole UTC days),
    `week` (since Sunday 00:00 to now), `lastweek` (Sunday to Sunday), `month` (since the 1st to
    now), `lastmonth`; a duration `<n>m|h|d|w` (the last n units ending at the end of the current
    one: `7d` is today and the 6 days before); a pair of RFC 3339 times or of Unix seconds,
    `start,end`. Not yet aligned to the ledger's hours (align_window)."""
    text = text.strip()
    if offset_match := _OFFSET.match(text):
        offset = _bounded_duration("window", offset_match[2])
        inner = parse_window(offset_match[1], now=now)
        try:
            return Window(inner.start - offset, inner.end - offset)
        except OverflowError as exc:
            raise ParameterError("window", gettext("%(value)r reaches too far back") % {"value": text}) from exc
    now = now.astimezone(UTC)
    today = utc_midnight(now)
    sunday = today - timedelta(days=(today.weekday() + 1) % 7)
    named = {
        "today": (today, today + _DAY),
        "yesterday": (today - _DAY, today),
        "week": (sunday, now),
        "lastweek": (sunday - timedelta(days=7), sunday),
        "month": (_month_start(now), now),
        "lastmonth": (_month_start(_month_start(now) - _DAY), _month_start(now)),
    }
    if not text:
        raise ParameterError("window", gettext("is required, e.g. 7d, lastmonth or start,end in RFC 3339"))
    if text in named:
        start, end = named[text]
    elif match := _DURATION.match(text):
        count, unit = int(match[1]), match[2]
        if count == 0:
            raise ParameterError("window", gettext("a duration must be more than 0"))
        # OpenCost: the window ends at the end of the current unit (of the current day for weeks).
        step = _UNITS[unit]
        end = floor_to(now, _DAY if unit == "w" else step) + (_DAY if unit == "w" else step)
        try:
            start = end - count * step
        except OverflowError as exc:
            raise ParameterError("window", gettext("%(value)r reaches too far back") % {"value": text}) from exc
    elif match := _UNIX_PAIR.match(text):
        try:
            start, end = (datetime.fromtimestamp(int(v), UTC) for v in (match[1], match[2]))
        except (OverflowError, ValueError, OSError) as exc:
            raise ParameterError("window", gettext("%(value)r is out of range") % {"value": text}) from exc
    elif text.count(",") == 1:
        start, end = (_parse_instant(part.strip()) for part in text.split(","))
    else:
        raise ParameterError("window", gettext(
            "%(value)r is not a window: use today, yesterday, week, month, lastweek, lastmonth, a duration "
            "such as 30m, 24h, 7d or 2w, or start,end in RFC 3339 or Unix seconds") % {"value": text})
    # `week` and `month` are empty at their first instant (OpenCost answers them, with nothing in them).
    if end < start or (end == start and text not in ("week", "month")):
        raise ParameterError("window", gettext("the end must be after the start"))
    if end - start > MAX_SPAN:
        raise ParameterError("window", gettext("is longer than %(days)d days") % {"days": MAX_SPAN.days})
    return Window(start, end)


def _bounded_duration(parameter: str, text: str) -> timedelta:
    """`<n>s|m|h|d|w`, more than 0 and at most MAX_SPAN."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise ParameterError(parameter, gettext("%(value)r is not a duration such as 30m, 1h, 1d or 1w")
                             % {"value": text})
    duration = int(match[1]) * _UNITS[match[2]]
    if duration <= timedelta(0) or duration > MAX_SPAN:
        raise ParameterError(parameter, gettext("must be more than 0 and at most %(days)d days")
                             % {"days": MAX_SPAN.days})
    return duration


def parse_step(text: str | None) -> timedelta | None:
    """A set's duration, `<n>s|m|h|d|w` up to MAX_SPAN, rounded up to whole hours (the ledger's
    resolution: `30m` is `1h`); None (one set) when absent."""
    if text is None or not text.strip():
        return None
    step = _bounded_duration("step", text)
    return -(-step // _HOUR) * _HOUR


def parse_accumulate(text: str | None) -> str | None:
    """OpenCost's `accumulate`: true or `all` (one set), false or absent (None: sets per step), or a
    calendar unit of ACCUMULATE_UNITS (one set per UTC hour, day, Sunday week, month, quarter)."""
    if text is None or not text.strip():
        return None
    value = text.strip().lower()
    if value in ("true", "1", "all"):
        return "all"
    if value in ("false", "0", "none"):
        return None
    if value in ACCUMULATE_UNITS:
        return value
    if value == "weeknow":
        # The OpenCost UI's "Week (calendar)" report option (app/types/report.ts): our `week` is
        # already the calendar week from Sunday.
        return "week"
    raise ParameterError("accumulate", gettext("%(value)r is not true, false, all, hour, day, week, month or quarter")
                         % {"value": text})


# OpenCost's aliases: its label-config keys name labels; `services` is its property's name.
_AGGREGATE_ALIASES = {"services": "service", "department": "label:department", "environment": "label:env",
                      "owner": "label:owner", "product": "label:app", "team": "label:team"}


def parse_aggregate(text: str | None) -> tuple[str, ...]:
    """Comma-separated keys (AGGREGATE_KEYS, `label:<name>`, `annotation:<name>` or OpenCost's
    aliases), duplicates dropped; absent: the unaggregated DEFAULT_AGGREGATE; `all`: one allocation
    (no keys). As OpenCost (ParseAggregationProperties), a key it does not know is dropped, not refused."""
    if text is None or not text.strip():
        return DEFAULT_AGGREGATE
    if text.strip() == "all":
        return ()
    keys: list[str] = []
    for raw in require_printable("aggregate", text).split(","):
        key = _AGGREGATE_ALIASES.get(raw.strip(), raw.strip())
        if ledger.is_group_key(key) and key not in keys:
            keys.append(key)
    return tuple(keys)


def parse_bool(parameter: str, text: str | None, *, default: bool) -> bool:
    if text is None or not text.strip():
        return default
    value = text.strip().lower()
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise ParameterError(parameter, gettext("%(value)r is not true or false") % {"value": text})


_FILTER_CLAUSE = re.compile(r'^\s*([A-Za-z_]+)(?:\[([^\]"]+)\])?\s*:\s*(.+?)\s*$', re.DOTALL)
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def parse_filter(text: str | None) -> dict[str, tuple[str, ...]]:
    """OpenCost's filter language, its equality subset: clauses `key:"a","b"` (any of the values)
    joined by `+` (all clauses), keys AGGREGATE_KEYS or `label[<name>]`; a key given twice keeps the
    values both allow. Absent: no filter."""
    if text is None or not text.strip():
        return {}
    filters: dict[str, tuple[str, ...]] = {}
    for clause in _split_outside_quotes(require_printable("filter", text), "+"):
        match = _FILTER_CLAUSE.match(clause)
        if match is None:
            raise ParameterError("filter", gettext('%(clause)r is not key:"value" (or label[name]:"value")')
                                 % {"clause": clause})
        name, label, values_text = match[1], match[2], match[3]
        key = f"{LABEL_PREFIX}{label}" if name == "label" and label else name
        if not ledger.is_group_key(key) or (label and name != "label"):
            raise ParameterError("filter", gettext("unknown key %(key)r; use %(keys)s or label[<name>]")
                                 % {"key": name, "keys": ", ".join(AGGREGATE_KEYS)})
        matches = [_QUOTED.fullmatch(part.strip()) for part in _split_outside_quotes(values_text, ",")]
        if not all(matches):
            raise ParameterError("filter", gettext('the values of %(key)r must be quoted: %(key)s:"a","b"')
                                 % {"key": key})
        values = tuple(re.sub(r"\\(.)", r"\1", m[1]) for m in matches if m is not None)
        filters[key] = tuple(v for v in filters[key] if v in values) if key in filters else values
    return filters


# OpenCost's filter fields (its allocation filter's field names) -> our grouping keys.
_FILTER_FIELDS = {"cluster": "cluster", "node": "node", "namespace": "namespace", "controllerName": "controllerName",
                  "controllerKind": "controllerKind", "controller": "controller", "pod": "pod",
                  "container": "container", "services": "service", "service": "service",
                  "department": "label:department", "environment": "label:env", "owner": "label:owner",
                  "product": "label:app", "team": "label:team",
                  # ours
                  "tenant": "tenant", "gpu_model": "gpu_model", "sla_tier": "sla_tier", "gpu": "gpu"}
# Longest first, so `!~>:` is not read as `!` then `~>:`.
_FILTER_OPS = {"!<~:": "!prefix", "!~>:": "!suffix", "<~:": "prefix", "~>:": "suffix", "!~:": "!contains",
               "~:": "contains", "!:": "!eq", ":": "eq"}
_FILTER_TOKEN = re.compile(r'\s*(?:(?P<quoted>"(?:[^"\\]|\\.)*")|(?P<op>!<~:|!~>:|<~:|~>:|!~:|~:|!:|:)'
                           r'|(?P<punct>[()+|,\[\]])|(?P<word>[A-Za-z_][A-Za-z0-9_./-]*))')
MAX_FILTER_LENGTH = 10_000  # a filter is a human's or a UI's; longer is a mistake, and bounds the parse
MAX_FILTER_DEPTH = 32


def _filter_tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    at = 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        match = _FILTER_TOKEN.match(text, at)
        if match is None or match.end() == at:
            raise ParameterError("filter", gettext("cannot read %(rest)r") % {"rest": text[at:at + 40]})
        kind = match.lastgroup or ""
        tokens.append((kind, match[kind]))
        at = match.end()
    return tokens


class _FilterParser:
    """OpenCost's allocation filter language (v2): `field:"a","b"` (any), `field!:"a"` (none),
    `~:` contains, `<~:` starts with, `~>:` ends with (each with its `!` negation), `label[app]:"x"`,
    `annotation[k]:"x"`; `+` or `and` joins what must all hold, `|` or `or` what may; parentheses
    group; `and` binds tighter than `or`."""

    def __init__(self, text: str) -> None:
        self.tokens = _filter_tokens(text)
        self.at = 0
        self.depth = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise ParameterError("filter", gettext("ends too soon"))
        self.at += 1
        return token

    def is_next(self, *values: str) -> bool:
        token = self.peek()
        return token is not None and token[0] in ("punct", "word") and token[1].lower() in values

    def parse(self) -> ledger.FilterTree:
        tree = self.any_of()
        extra = self.peek()
        if extra is not None:
            raise ParameterError("filter", gettext("unexpected %(token)r") % {"token": extra[1]})
        return tree

    def any_of(self) -> ledger.FilterTree:
        parts = [self.all_of()]
        while self.is_next("|", "or"):
            self.take()
            parts.append(self.all_of())
        return parts[0] if len(parts) == 1 else ledger.AnyOf(tuple(parts))

    def all_of(self) -> ledger.FilterTree:
        parts = [self.factor()]
        while self.is_next("+", "and"):
            self.take()
            parts.append(self.factor())
        return parts[0] if len(parts) == 1 else ledger.AllOf(tuple(parts))

    def factor(self) -> ledger.FilterTree:
        if self.is_next("("):
            self.take()
            self.depth += 1
            if self.depth > MAX_FILTER_DEPTH:
                raise ParameterError("filter", gettext("nests too deep"))
            tree = self.any_of()
            if not self.is_next(")"):
                raise ParameterError("filter", gettext("a parenthesis is not closed"))
            self.take()
            self.depth -= 1
            return tree
        return self.match()

    def match(self) -> ledger.Match:
        kind, name = self.take()
        if kind != "word":
            raise ParameterError("filter", gettext("expected a field, found %(token)r") % {"token": name})
        if name in ("label", "annotation") and self.is_next("["):
            self.take()
            parts: list[str] = []
            while not self.is_next("]"):
                parts.append(self.take()[1])
            self.take()
            key = f"{LABEL_PREFIX if name == 'label' else ledger.ANNOTATION_PREFIX}{''.join(parts)}"
        elif name in _FILTER_FIELDS:
            key = _FILTER_FIELDS[name]
        else:
            raise ParameterError("filter", gettext("unknown field %(key)r; use %(keys)s, label[<name>] or annotation[<name>]")
                                 % {"key": name, "keys": ", ".join(_FILTER_FIELDS)})
        kind, op = self.take()
        if kind != "op":
            raise ParameterError("filter", gettext('%(key)s must be followed by :, !:, ~:, <~: or ~>: and a quoted value')
                                 % {"key": name})
        values = [self.value(key)]
        while self.is_next(","):
            self.take()
            values.append(self.value(key))
        return ledger.Match(key=require_printable("filter", key), op=_FILTER_OPS[op], values=tuple(values))

    def value(self, key: str) -> str:
        kind, text = self.take()
        if kind != "quoted":
            raise ParameterError("filter", gettext('the values of %(key)r must be quoted: %(key)s:"a","b"')
                                 % {"key": key})
        return require_printable("filter", re.sub(r"\\(.)", r"\1", text[1:-1]))


def parse_filter_tree(text: str | None) -> ledger.FilterTree | None:
    """OpenCost's filter (see _FilterParser) as a tree; None when absent."""
    if text is None or not text.strip():
        return None
    if len(text) > MAX_FILTER_LENGTH:
        raise ParameterError("filter", gettext("is longer than %(n)d characters") % {"n": MAX_FILTER_LENGTH})
    return _FilterParser(require_printable("filter", text)).parse()


# OpenCost's older filter parameters: comma-separated values, each parameter ANDed with the rest.
LEGACY_FILTERS = {"filterClusters": "cluster", "filterNodes": "node", "filterNamespaces": "namespace",
                  "filterControllerKinds": "controllerKind", "filterControllers": "controllerName",
                  "filterPods": "pod", "filterContainers": "container", "filterServices": "service"}


def legacy_filter_tree(query: Mapping[str, str]) -> ledger.FilterTree | None:
    """`filterNamespaces=a,b`, `filterLabels=app:web,team:x`...; None when none is given."""
    parts: list[ledger.FilterTree] = []
    for parameter, key in LEGACY_FILTERS.items():
        values = [v.strip() for v in require_printable(parameter, query.get(parameter) or "").split(",") if v.strip()]
        if values:
            parts.append(ledger.Match(key=key, op="eq", values=tuple(values)))
    for parameter, prefix in (("filterLabels", LABEL_PREFIX), ("filterAnnotations", ledger.ANNOTATION_PREFIX)):
        pairs = [v.strip() for v in require_printable(parameter, query.get(parameter) or "").split(",") if v.strip()]
        for pair in pairs:
            name, sep, value = pair.partition(":")
            if not sep or not name.strip():
                raise ParameterError(parameter, gettext("%(value)r is not name:value") % {"value": pair})
            parts.append(ledger.Match(key=prefix + name.strip(), op="eq", values=(value.strip(),)))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else ledger.AllOf(tuple(parts))


def _split_outside_quotes(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\" and quoted:
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == sep and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return parts
