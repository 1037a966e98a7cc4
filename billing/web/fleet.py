"""The fleet view, /fleet/ (docs/billing.md, Fleet view): per node and GPU, card cost, attributed and
idle cost, utilisation, energy and the costliest workloads, for finance and admins, a page of nodes
at a time (?page=, ?page_size=) over the whole fleet's totals; ?format=csv is every GPU row."""

from __future__ import annotations

from datetime import date
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from billing.csv_files import amount_cell, csv_writer, download_name, number, quantity_cell
from billing.money import QUANTITY_PLACES
from billing.queries.fleet import (
    DEFAULT_PAGE_SIZE,
    DEFAULT_SORT,
    PAGE_SIZES,
    SORTS,
    FleetFigures,
    FleetView,
    FleetWorkload,
    PageOutOfRange,
    get_fleet,
)
from billing.queries.snapshot import one_snapshot
from billing.web.access import require_platform
from billing.web.forms import PeriodForm
from billing.web.views import quick_periods

_FORMATS = ("html", "csv")
# The columns a reader can sort by, in the table's order, with their headings.
_COLUMNS = (
    ("name", gettext_lazy("Node / GPU")),
    ("gpu_model", gettext_lazy("GPU model")),
    ("card_cost", gettext_lazy("Card cost")),
    ("attributed", gettext_lazy("Attributed")),
    ("idle_cost", gettext_lazy("Idle cost")),
    ("idle_pct", gettext_lazy("Idle share")),
    ("sm_pct", gettext_lazy("SM utilisation")),
    ("mem_pct", gettext_lazy("Memory utilisation")),
    ("energy_kwh", gettext_lazy("Energy (kWh)")),
    ("workloads", gettext_lazy("Workloads")),
)
_PERCENT_PLACES = QUANTITY_PLACES["percent"]
_PAGE_NEIGHBOURS = 2  # page links each side of the current page, besides the first and the last


def _bad_request(reason: str, *, as_csv: bool, request: HttpRequest, form: PeriodForm,
                 retry_query: str = "") -> HttpResponse:
    if as_csv:
        return HttpResponse(reason + "\n", status=400, content_type="text/plain; charset=utf-8")
    return render(request, "billing/fleet.html", {"form": form, "error": reason, "retry_query": retry_query},
                  status=400)


def _page_number(text: str) -> int | None:
    """A page number as a reader may type it (ASCII digits, from 1; nine at most, past any fleet's
    last page), else None."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() and 0 < len(text) <= 9 and int(text) >= 1 else None


@login_required
@one_snapshot()
def fleet(request: HttpRequest) -> HttpResponse:
    scope = require_platform(request, "the fleet view shows every tenant's cards: finance and admins only")
    today = timezone.now().date()
    form = PeriodForm(PeriodForm.with_default_period(request.GET, today))
    fmt = request.GET.get("format") or "html"
    sort = request.GET.get("sort") or DEFAULT_SORT
    page_text, size_text = request.GET.get("page") or "1", request.GET.get("page_size") or str(DEFAULT_PAGE_SIZE)
    page, page_size = _page_number(page_text), _page_number(size_text)
    as_csv = fmt == "csv"
    # Checked before any read: a bad parameter changes nothing and costs no ledger scan.
    if fmt not in _FORMATS:
        return _bad_request(_("Unknown format “%(format)s”: choose one of %(formats)s.") % {
            "format": fmt, "formats": ", ".join(_FORMATS)}, as_csv=False, request=request, form=form)
    if sort not in SORTS:
        return _bad_request(_("Unknown sort “%(sort)s”: choose one of %(sorts)s.") % {
            "sort": sort, "sorts": ", ".join(SORTS)}, as_csv=as_csv, request=request, form=form)
    if page_size not in PAGE_SIZES:
        return _bad_request(_("Unknown page size “%(size)s”: choose one of %(sizes)s nodes a page.") % {
            "size": size_text, "sizes": ", ".join(map(str, PAGE_SIZES))}, as_csv=as_csv, request=request, form=form)
    if page is None:
        return _bad_request(_("“%(page)s” is not a page number: pages are numbered from 1.") % {"page": page_text},
                            as_csv=as_csv, request=request, form=form)
    if not form.is_valid():
        if as_csv:
            reasons = " ".join(str(e) for errors in form.errors.values() for e in errors)
            return HttpResponse(reasons + "\n", status=400, content_type="text/plain; charset=utf-8")
        return render(request, "billing/fleet.html", {"form": form, "quick_periods": quick_periods(today, form)},
                      status=400)
    start, end = form.bounds()
    # The CSV states energy to a quantity's places, the page to the page's (docs/exports.md).
    # The CSV is every GPU row of the period, whatever page the link was on, and no previous period.
    try:
        view = get_fleet(scope=scope, start=start, end=end, sort=sort, compare=not as_csv,
                         page=None if as_csv else page, page_size=page_size,
                         **({"energy_places": QUANTITY_PLACES["gb_h"]} if as_csv else {}))
    except PageOutOfRange as e:
        return _bad_request(ngettext(
            "Page %(page)s is past the last page, %(pages)s, of this period's %(nodes)s node at %(size)s a page.",
            "Page %(page)s is past the last page, %(pages)s, of this period's %(nodes)s nodes at %(size)s a page.",
            e.nodes) % {"page": e.page, "pages": e.pages, "nodes": e.nodes, "size": page_size},
            as_csv=False, request=request, form=form,
            retry_query=_query(_period(form), sort=sort, page_size=page_size, page=e.pages))
    if as_csv:
        return _csv(view)
    return render(request, "billing/fleet.html", _context(form, view, today))


def _period(form: PeriodForm) -> dict[str, str]:
    return {"start": form.cleaned_data["start"].isoformat(), "end": form.cleaned_data["end"].isoformat()}


def _query(period: dict[str, str], *, sort: str, page_size: int | None, page: int = 1) -> str:
    """A link's query over `period`: the defaults (the first page, DEFAULT_PAGE_SIZE) left out."""
    return urlencode({**period, "sort": sort, **({"page_size": page_size} if page_size != DEFAULT_PAGE_SIZE else {}),
                      **({"page": page} if page != 1 else {})})


def _page_numbers(page: int, pages: int) -> list[int | None]:
    """The pages to link: the first, the last and _PAGE_NEIGHBOURS each side of `page`; None for a gap
    (a gap of one page is that page: "…" would take as much room)."""
    kept = sorted({1, pages, *range(max(1, page - _PAGE_NEIGHBOURS), min(pages, page + _PAGE_NEIGHBOURS) + 1)})
    out: list[int | None] = []
    for before, n in zip([0, *kept], kept, strict=False):
        if before and n > before + 1:
            out.append(before + 1 if n == before + 2 else None)
        out.append(n)
    return out


def _pager(period: dict[str, str], view: FleetView) -> dict[str, Any]:
    size = view.page_size or DEFAULT_PAGE_SIZE

    def link(page: int) -> str:
        return _query(period, sort=view.sort, page_size=size, page=page)

    return {
        "previous": link(view.page - 1) if view.page > 1 else "",
        "next": link(view.page + 1) if view.page < view.pages else "",
        "pages": [{"number": n, "query": link(n), "current": n == view.page} if n else None
                  for n in _page_numbers(view.page, view.pages)],
        # Another page size starts again at the first page: the same page number would show other nodes.
        "sizes": [{"size": s, "query": _query(period, sort=view.sort, page_size=s), "current": s == size}
                  for s in PAGE_SIZES],
    }


def _explore_link(explore: str, period: dict[str, str], w: FleetWorkload) -> str:
    """Explore (`explore`: its URL, resolved once per page: the page links every workload of the
    fleet) at the workload's own level: its containers, over the same period."""
    query = {**period, "tenant": w.tenant, "namespace": w.namespace, "controller": w.controller, "pod": w.pod}
    return f"{explore}?{urlencode(query)}"


def _context(form: PeriodForm, view: FleetView, today: date) -> dict[str, Any]:
    period = _period(form)
    # A new order starts at its first page, at the same page size.
    columns = [{"key": key, "label": label, "query": _query(period, sort=key, page_size=view.page_size),
                "active": key == view.sort, "order": "descending" if SORTS[key] else "ascending"}
               for key, label in _COLUMNS]
    explore = reverse("explore")
    nodes = [{"node": n, "gpus": [{"gpu": g, "workloads": [(w, _explore_link(explore, period, w)) for w in g.workloads]}
                                  for g in n.gpus]}
             for n in view.nodes]
    c = view.comparison
    previous = {"start": c.previous_first.isoformat(), "end": c.previous_last.isoformat()} if c else {}
    return {
        "form": form, "fleet": view, "columns": columns, "nodes": nodes, "quick_periods": quick_periods(today, form),
        "csv_query": urlencode({**period, "sort": view.sort, "format": "csv"}),
        "previous_query": _query(previous, sort=view.sort, page_size=view.page_size),
        "pager": _pager(period, view), "default_page_size": DEFAULT_PAGE_SIZE,
    }


def _pct_cell(value: object) -> str:
    return f"{value:.{_PERCENT_PLACES}f}" if value is not None else ""


def _csv(view: FleetView) -> HttpResponse:
    """One row per GPU, amounts and energy as the page shows them (they add up), then a total row."""
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{download_name("fleet-gpus", view.start, view.end)}"'
    writer = csv_writer(response)
    currency, places = view.currency, QUANTITY_PLACES["gb_h"]
    writer.writerow(["node", "gpu_uuid", "gpu_model", "card_cost", "attributed", "idle_cost", "currency",
                     "idle_share_pct", "sm_utilisation_pct", "mem_utilisation_pct", "energy_kwh", "workloads",
                     "top_workloads", "energy_cost", "co2e_kg"])

    def priced(f: FleetFigures) -> list[object]:
        # Appended after the first columns; an empty cell where some energy had no price (never 0).
        return ["" if f.energy_cost is None else amount_cell(f.energy_cost, currency),
                "" if f.co2e_kg is None else quantity_cell(f.co2e_kg, places)]

    def figures(f: FleetFigures) -> list[object]:
        return [amount_cell(f.card_cost, currency), amount_cell(f.attributed, currency),
                amount_cell(f.idle_cost, currency), currency, number(_pct_cell(f.idle_pct)),
                number(_pct_cell(f.sm_pct)), number(_pct_cell(f.mem_pct)), quantity_cell(f.energy_kwh, places)]

    for g in view.gpus:
        top = "; ".join(f"{w.tenant}/{w.namespace}/{w.pod}" for w in g.workloads)
        writer.writerow([g.node, g.gpu_uuid, g.gpu_model, *figures(g.figures), g.figures.workloads, top, *priced(g.figures)])
    writer.writerow(["(total)", "", "", *figures(view.total), view.total.workloads, "", *priced(view.total)])
    return response
