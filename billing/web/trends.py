"""What the dashboard, the portal and Explore draw of trends (billing.queries.trends): the
month-over-month chart and the bars of a drill-down level. Each bar is a figure the page states
elsewhere (a month's cost, a row's), never a second computation of it."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from django.utils.formats import date_format
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from billing.queries.trends import MonthCost
from billing.web.charts import Series, stacked_bar_chart

__all__ = ["MONTH_SERIES", "TOP_BARS", "level_bars", "level_chart", "month_series", "months_chart"]

# Tenants stacked in a month's bar before the rest are summed into one (the dashboard's rule).
MONTH_SERIES = 6
# Rows of a drill-down level drawn as bars before the rest are summed into one.
TOP_BARS = 8
_ZERO = Decimal(0)


def month_series(months: Sequence[MonthCost]) -> list[tuple[str, str, list[Decimal]]]:
    """(key, tenant slug or "", one value per month): the MONTH_SERIES tenants that cost most over the
    months, then the others summed (key "other"); a month's values add up to its total."""
    overall: dict[str, Decimal] = {}
    for m in months:
        for tenant, cost in m.costs.tenants.items():
            overall[tenant] = overall.get(tenant, _ZERO) + cost
    ranked = sorted(overall, key=lambda t: (-overall[t], t))
    top, rest = ranked[:MONTH_SERIES], set(ranked[MONTH_SERIES:])
    out = [(t, t, [m.costs.tenants.get(t, _ZERO) for m in months]) for t in top]
    if rest:
        out.append(("other", "", [sum((c for t, c in m.costs.tenants.items() if t in rest), _ZERO) for m in months]))
    return out


def months_chart(months: Sequence[MonthCost], *, unit: str, names: dict[str, str] | None = None) -> SafeString:
    """One bar per month, its tenants stacked (the costliest over the months first)."""
    names = names or {}
    series = [Series(names.get(slug, slug) if slug else _("Other tenants"), values)
              for _key, slug, values in month_series(months)]
    return stacked_bar_chart([date_format(m.month, "YEAR_MONTH_FORMAT") for m in months], series,
                             label=_("Cost per month"), unit=unit)


def level_bars(labels: Sequence[str], costs: Sequence[Decimal]) -> list[tuple[str, Decimal]]:
    """The TOP_BARS first rows (label, cost) in the order given, then the rest summed under "Other
    rows": the bars add up to the rows' total."""
    bars = list(zip(labels[:TOP_BARS], costs[:TOP_BARS], strict=True))
    if len(costs) > TOP_BARS:
        bars.append((_("Other rows"), sum(costs[TOP_BARS:], _ZERO)))
    return bars


def level_chart(labels: Sequence[str], costs: Sequence[Decimal], *, unit: str, label: str) -> SafeString:
    """A bar per row of a drill-down level (level_bars)."""
    bars = level_bars(labels, costs)
    return stacked_bar_chart([b[0] for b in bars], [Series(_("Cost"), [b[1] for b in bars])], label=label, unit=unit)
