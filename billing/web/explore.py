"""The drill-down page, `/explore/` (docs/drilldown.md). Thin: parse the GET form, call one query, render the
table or its CSV (`?format=csv`, the same rows and numbers).

The path walked is in the query string (`?tenant=acme&namespace=acme-prod&controller=deployment:bert
&pod=bert-1`), so every level is a link one can share and the period and filters travel with it.
A tenant outside the user's scope answers 404, like the portal, before any other error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from billing.csv_files import amount_cell, csv_writer, download_name, quantity_cell
from billing.figures import figure_key
from billing.money import QUANTITY_PLACES, round_quantities
from billing.queries.explore import (
    DEFAULT_SORT,
    LEVEL_KEYS,
    STEPS,
    Explore,
    ExploreFilters,
    ExplorePath,
    ExploreRow,
    TenantNotFound,
    check_tenant_visible,
    get_explore,
)
from billing.queries.finance import PAGE_PLACES
from billing.queries.snapshot import one_snapshot
from billing.scope import get_scope
from billing.services.fleet import HEADROOM, Suggestion, gib, percent_of
from billing.web.forms import ExploreForm, PeriodForm
from billing.web.trends import TOP_BARS, level_chart
from billing.web.views import quick_periods

# Rows on the page: the costliest; the CSV lists all (the portal's reason: thousands of pods).
PAGE_ROWS = 100
# Quantities on the page: the finance page's places (the CSV has QUANTITY_PLACES).
_FILTERS = ("label", "node", "gpu_model", "sla_tier")
# The columns that add down the table. Requested columns add only when every row's request is known.
_QUANTITIES = ("gpu_hours", "mem_used_gb_h", "mem_granted_gb_h", "mem_requested_gb_h", "sm_used_h", "sm_granted_h",
               "sm_requested_h")
# The energy columns, the portal's (billing.figures carries them): energy cost and kg CO2e add only
# when every row's is known (some energy may have been drawn where no price or factor was set).
_ENERGY = ("energy_kwh", "energy_cost", "co2e_kg")


@dataclass(frozen=True)
class ShownColumn:
    """One column as shown: each figure rounded once, the total the sum of those (billing.money);
    `total` None when a figure is unknown (a request nobody reported)."""

    name: str
    cells: list[Decimal | None]
    total: Decimal | None


@dataclass(frozen=True)
class ShownRow:
    row: ExploreRow
    cost: Decimal
    quantities: dict[str, Decimal | None]
    link: str  # query string of the next level ("" at the GPU level)
    # The identities of its cost and GPU-hours (billing.figures.figure_key): the level this row opens
    # shows the same keys on its totals, so a walk can check that a row and its level agree.
    figures: dict[str, str] = field(default_factory=dict)


def _shown(explore: Explore) -> tuple[list[ShownRow], Decimal, dict[str, ShownColumn]]:
    """Each row as every page shows it (billing.figures), and each column's total: the sum
    of the figures shown (unknown when a row's request is)."""
    rows = explore.rows
    cost = sum((r.shown.cost for r in rows), Decimal(0)) if rows else Decimal(0)
    columns: dict[str, ShownColumn] = {}
    for name in (*_QUANTITIES, *_ENERGY):
        cells: list[Decimal | None] = [getattr(r.shown, name) for r in rows]
        known = [c for c in cells if c is not None]
        columns[name] = ShownColumn(name, cells, sum(known, Decimal(0)) if len(known) == len(cells) else None)
    shown = [ShownRow(r, r.shown.cost, {n: c.cells[i] for n, c in columns.items()}, "") for i, r in enumerate(rows)]
    return shown, cost, columns


def _base_query(form: ExploreForm) -> dict[str, str]:
    """The period and filters as the reader typed them: every link keeps them."""
    data = form.data
    return {k: str(data.get(k, "")) for k in ("start", "end", *_FILTERS) if data.get(k)}


def _query(base: dict[str, str], path: ExplorePath, **extra: str) -> str:
    return urlencode({**base, **dict(path.steps()), **extra})


@login_required
@one_snapshot()
def explore(request: HttpRequest) -> HttpResponse:
    scope = get_scope(request.user)
    try:
        # Scope first: a tenant the user may not see is a 404 whatever else is wrong.
        check_tenant_visible(scope, request.GET.get("tenant", ""))
    except TenantNotFound as exc:
        raise Http404("no such tenant") from exc
    form = ExploreForm(PeriodForm.with_default_period(request.GET, timezone.now().date()))
    as_csv = request.GET.get("format") == "csv"
    if not form.is_valid():
        if as_csv:
            return HttpResponse(_error_text(form), status=400, content_type="text/plain; charset=utf-8")
        return render(request, "billing/explore.html", {"form": form}, status=400)
    data = form.cleaned_data
    path = ExplorePath(**{step: data[step].strip() for step in STEPS})
    filters = ExploreFilters(labels=data["label"], nodes=data["node"], gpu_models=data["gpu_model"],
                             sla_tiers=data["sla_tier"])
    start, end = form.bounds()
    try:
        result = get_explore(scope=scope, path=path, filters=filters, start=start, end=end,
                             places=QUANTITY_PLACES["gb_h"] if as_csv else PAGE_PLACES,
                             rightsizing_limit=None if as_csv else PAGE_ROWS, search=data["q"], sort=data["sort"])
    except TenantNotFound as exc:
        raise Http404("no such tenant") from exc
    if as_csv:
        return _csv(result)
    return render(request, "billing/explore.html", _context(form, result))


def _error_text(form: ExploreForm) -> str:
    lines = [e if name == "__all__" or e.startswith(f"{name}:") else f"{name}: {e}"
             for name, errors in form.errors.items() for e in map(str, errors)]
    return "\n".join(lines) + "\n"


_LEVEL_TITLES = {
    "tenant": gettext_lazy("Tenants"),
    "namespace": gettext_lazy("Namespaces"),
    "controller": gettext_lazy("Controllers"),
    "pod": gettext_lazy("Workloads (pod / container)"),
    "gpu": gettext_lazy("GPUs of the pod"),
}


def _figures(result: Explore, base: dict[str, str], path: ExplorePath | None, search: str = "") -> dict[str, str]:
    """The keys of the cost and GPU-hours of `path` over this period and these filters ({} for none),
    and of its cost over the previous period (`previous_cost`). A search narrows a level's total as a
    filter does, so it is part of the total's key (a row's own figure does not depend on it)."""
    if path is None:
        return {}
    scope = {**_without_period(base), **dict(path.steps()), "search": search}
    keys = {kind: figure_key(kind, result.start, result.end, **scope) for kind in ("cost", "gpu_hours")}
    keys["previous_cost"] = figure_key("cost", result.previous_start, result.previous_end, **scope)
    return keys


# Sortable columns as the table heads them (billing.queries.explore.SORT_COLUMNS).
_SORT_HEADS = ("name", "cost", "previous_cost", "change", "gpu_hours", "mem_used_gb_h", "mem_granted_gb_h",
               "mem_requested_gb_h", "sm_used_h", "sm_granted_h", "sm_requested_h")


def _sort_links(base: dict[str, str], path: ExplorePath, search: str, sort: str) -> dict[str, dict[str, str]]:
    """Each column head's link: the largest first (names A to Z), or the other way round when the
    table is sorted that way already; and how it is sorted now ("ascending", "descending", "")."""
    column, descending = sort.removeprefix("-"), sort.startswith("-")
    out = {}
    for name in _SORT_HEADS:
        first = name if name == "name" else f"-{name}"
        again = name if first.startswith("-") else f"-{name}"
        current = "" if name != column else ("descending" if descending else "ascending")
        target = again if sort == first else first
        extra = {"sort": target, **({"q": search} if search else {})}
        out[name] = {"query": _query(base, path, **extra), "state": current}
    return out


def _context(form: ExploreForm, result: Explore) -> dict[str, Any]:
    base = _base_query(form)
    shown, cost, columns = _shown(result)
    # Going down keeps the order asked for (every level has the columns), not the search (names differ).
    keep_sort = {"sort": result.sort} if result.sort != DEFAULT_SORT else {}
    page = [ShownRow(s.row, s.cost, s.quantities, _query(base, s.row.down, **keep_sort) if s.row.down else "",
                     _figures(result, base, s.row.down))
            for s in shown[:PAGE_ROWS]]
    costliest = sorted(shown, key=lambda s: (-s.cost, s.row.name))
    crumbs = [(_("All tenants"), _query(base, ExplorePath()), "")]
    walked = ExplorePath()
    for level, value in result.path.steps():
        walked = walked.down(**{level: value})
        crumbs.append((value, _query(base, walked), level))
    return {
        "form": form, "explore": result, "rows": page, "row_count": len(shown), "cut": len(shown) > len(page),
        "cost_total": cost, "columns": columns, "figures": _figures(result, base, result.path, result.search),
        "crumbs": crumbs, "level": result.level, "sort_links": _sort_links(base, result.path, result.search, result.sort),
        "level_chart": level_chart([s.row.label for s in costliest], [s.cost for s in costliest],
                                   unit=result.currency, label=_("Cost by row")) if shown else None,
        "top_bars": TOP_BARS,
        "previous_first": result.previous_start.date() if result.previous_start else None,
        "previous_last": (result.previous_end - timedelta(days=1)).date() if result.previous_end else None,
        "level_title": _LEVEL_TITLES[result.level],
        "csv_query": _query(base, result.path, format="csv"), "efficiency": _efficiency(result.rows),
        "headroom_pct": HEADROOM * 100, "filtered": any(base.get(k) for k in _FILTERS),
        "clear_filters_query": _query({k: v for k, v in base.items() if k in ("start", "end")}, result.path),
        # The finance page's quick periods, keeping where the reader stands and what they filter.
        "quick_periods": [{**q, "query": f"{q['query']}&{_query(_without_period(base), result.path)}"}
                          for q in quick_periods(timezone.now().date(), form)],
    }


def _without_period(base: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in base.items() if k not in ("start", "end")}


def _efficiency(rows: Sequence[ExploreRow]) -> dict[str, Decimal | None]:
    """The totals row's ratios: of the exact sums (a ratio does not add down a column); against the
    request only when every row's request is known."""
    def total(figure: Callable[[ExploreRow], Decimal | None]) -> Decimal | None:
        values = [figure(r) for r in rows]
        return None if any(v is None for v in values) else sum((v for v in values if v is not None), Decimal(0))

    mem_used = sum((r.mem_used_gb_h for r in rows), Decimal(0))
    sm_used = sum((r.sm_used_h for r in rows), Decimal(0))
    return {
        "mem_of_granted": percent_of(mem_used, total(lambda r: r.mem_granted_gb_h)),
        "mem_of_requested": percent_of(mem_used, total(lambda r: r.mem_requested_gb_h)),
        "sm_of_granted": percent_of(sm_used, total(lambda r: r.sm_granted_h)),
        "sm_of_requested": percent_of(sm_used, total(lambda r: r.sm_requested_h)),
    }


# --- CSV ---------------------------------------------------------------------------------------

_CSV_HEAD = ("name",)
_CSV_NUMBERS = (
    "cost", "currency", "gpu_hours", "mem_used_gb_h", "mem_granted_gb_h", "mem_requested_gb_h",
    "mem_used_of_granted_pct", "mem_used_of_requested_pct", "sm_used_h", "sm_granted_h", "sm_requested_h",
    "sm_used_of_granted_pct", "sm_used_of_requested_pct", "previous_cost", "change",
)
# Appended after every other column (right-sizing's too), so the columns before keep their positions.
_CSV_ENERGY = ("energy_kwh", "energy_cost", "co2e_kg")
_CSV_RIGHTSIZING = (
    "mem_request_gb", "mem_mean_used_gb", "mem_peak_hour_gb", "suggestion", "suggested_mem_request_gb",
    "mem_freed_gb_h", "sm_request", "sm_mean_used", "sm_peak_hour", "sm_suggestion", "suggested_sm_request",
    "sm_freed_h", "suggestion_basis", "sm_suggestion_basis",
)


def _basis(suggestion: Suggestion | None) -> str:
    return suggestion.basis if suggestion and suggestion.verdict != "unknown" else ""


def _csv(result: Explore) -> HttpResponse:
    """The page's table, every row: amounts to the currency's minor unit, quantities to 4 places,
    percentages to 1, then "(total)": each column the sum of the rows as written (docs/exports.md);
    a requested total is empty when any row's request is unknown, and ratios are of the totals."""
    places, pct = QUANTITY_PLACES["gb_h"], QUANTITY_PLACES["percent"]
    level, currency = result.level, result.currency
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    name = download_name(f"explore-{level}", result.start, result.end)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    writer = csv_writer(response)
    rightsizing = level == "pod"
    keys = LEVEL_KEYS[level]
    writer.writerow([*_CSV_HEAD, *keys, *_CSV_NUMBERS, *(_CSV_RIGHTSIZING if rightsizing else ()), *_CSV_ENERGY])
    shown, cost, columns = _shown(result)

    def q(value: Decimal | None, at: int = places) -> str:
        return "" if value is None else quantity_cell(value, at)

    for s in shown:
        r = s.row
        cells = [r.name, *(r.key(k) for k in keys), amount_cell(s.cost, currency), currency,
                 *(q(s.quantities[n]) for n in ("gpu_hours", "mem_used_gb_h", "mem_granted_gb_h", "mem_requested_gb_h")),
                 q(r.mem_used_of_granted_pct, pct), q(r.mem_used_of_requested_pct, pct),
                 *(q(s.quantities[n]) for n in ("sm_used_h", "sm_granted_h", "sm_requested_h")),
                 q(r.sm_used_of_granted_pct, pct), q(r.sm_used_of_requested_pct, pct),
                 amount_cell(r.previous_cost, currency), amount_cell(r.change, currency)]
        if rightsizing:
            m, sug = r.memory, r.suggestion
            cells += [q(gib(m.request_mb) if m else None), q(gib(m.mean_used_mb) if m else None),
                      q(gib(m.peak_hour_mean_mb) if m else None), sug.verdict if sug else "",
                      q(gib(sug.suggested) if sug else None), q(r.freed_gb_h)]
            sm, sm_sug = r.sm, r.sm_suggestion
            cells += [q(sm.request_sm if sm else None), q(sm.mean_used_sm if sm else None),
                      q(sm.peak_hour_mean_sm if sm else None), sm_sug.verdict if sm_sug else "",
                      q(sm_sug.suggested if sm_sug else None), q(r.freed_sm_h)]
            # "grant": no request was reported, so the suggestion is held against the grant.
            cells += [_basis(sug), _basis(sm_sug)]
        cells += _energy_cells(s.quantities, q, currency)
        writer.writerow(cells)
    eff = _efficiency(result.rows)
    total = ["(total)", *("" for _k in keys), amount_cell(cost, currency), currency,
             *(q(columns[n].total) for n in ("gpu_hours", "mem_used_gb_h", "mem_granted_gb_h", "mem_requested_gb_h")),
             q(eff["mem_of_granted"], pct), q(eff["mem_of_requested"], pct),
             *(q(columns[n].total) for n in ("sm_used_h", "sm_granted_h", "sm_requested_h")),
             q(eff["sm_of_granted"], pct), q(eff["sm_of_requested"], pct),
             # The rows' previous costs and changes, as written, added: the rows listed, not the level then.
             amount_cell(sum((r.previous_cost for r in result.rows), Decimal(0)), currency),
             amount_cell(sum((r.change for r in result.rows), Decimal(0)), currency)]
    if rightsizing:
        freed = [r.freed_gb_h for r in result.rows]
        freed_sm = [r.freed_sm_h for r in result.rows]
        total += ["", "", "", "", "", q(round_quantities([f for f in freed if f is not None], places)[1]),
                  "", "", "", "", "", q(round_quantities([f for f in freed_sm if f is not None], places)[1]), "", ""]
    total += _energy_cells({n: columns[n].total for n in _ENERGY}, q, currency)
    writer.writerow(total)
    return response


def _energy_cells(figures: Mapping[str, Decimal | None], q: Callable[[Decimal | None], str], currency: str) -> list[str]:
    """kWh and kg CO2e as quantities, energy cost to the currency's minor unit; empty where unknown."""
    cost = figures["energy_cost"]
    return [q(figures["energy_kwh"]), "" if cost is None else amount_cell(cost, currency), q(figures["co2e_kg"])]
