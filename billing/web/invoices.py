"""Invoice list and downloads. Thin: scope from the user, one call into billing.services.exports
(and, for the list, the upcoming invoices of the month in progress from billing.queries.portal).

An invoice outside the user's scope answers 404, exactly like one that does not exist.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from billing.errors import InvalidInput
from billing.money import from_minor_units
from billing.queries.portal import UpcomingInvoices, list_upcoming_invoices
from billing.scope import get_scope
from billing.services.exports import EXPORT_FORMATS, InvoiceNotFound, export_invoice, list_invoices


@login_required
def invoice_list(request: HttpRequest) -> HttpResponse:
    scope = get_scope(request.user)
    invoices = list_invoices(scope=scope)
    upcoming = list_upcoming_invoices(scope=scope, now=timezone.now())
    return render(request, "billing/invoices.html",
                  {"invoices": invoices, "formats": EXPORT_FORMATS, "upcoming": upcoming,
                   "upcoming_total": _upcoming_total(upcoming)})


def _upcoming_total(upcoming: UpcomingInvoices) -> dict[str, object] | None:
    """The upcoming invoices' totals summed, exactly (each is already in minor units), when they
    share one currency (the close refuses two); None when there is nothing to add."""
    previews = [row.preview for row in upcoming.rows if row.preview is not None]
    currencies = {p.currency for p in previews}
    if not previews or len(currencies) != 1:
        return None
    currency = currencies.pop()
    return {"amount": from_minor_units(sum(p.total_minor for p in previews), currency), "currency": currency}


@login_required
def invoice_download(request: HttpRequest, number: str, fmt: str) -> HttpResponse:
    try:
        export = export_invoice(scope=get_scope(request.user), number=number, fmt=fmt)
    except (InvoiceNotFound, InvalidInput) as exc:
        raise Http404("no such invoice") from exc
    response = HttpResponse(export.content, content_type=export.content_type)
    response["Content-Disposition"] = f'attachment; filename="{export.filename}"'
    return response
