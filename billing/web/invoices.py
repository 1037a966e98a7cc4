"""Invoices, credit notes and a tenant's invoice terms. Thin: scope from the user, one call into
billing.services (exports for reads and downloads, the list's CSV included; credit_notes and
tenant_billing for writes; the list also shows the upcoming invoices of the month in progress from
billing.queries.portal).

An invoice or credit note outside the user's scope answers 404, exactly like one that does not
exist. Finance and admins issue credit notes (in two steps: the note as it would be issued, then
its confirmation) and record payment status (sent, paid, payment
reversed; POST, CSRF, audited); admins edit invoice terms. Overdue is computed on every read from
the due date and today (billing.services.invoicing.payments), never stored.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from billing.errors import InvalidInput
from billing.models import InvoiceStatusChange
from billing.money import from_minor_units
from billing.pdf_fonts import undrawable
from billing.queries.portal import UpcomingInvoices, list_upcoming_invoices
from billing.queries.snapshot import one_snapshot
from billing.scope import Scope, get_scope
from billing.services.exports import (
    EXPORT_FORMATS,
    GPU_HOURS_PLACES,
    LINE_QUANTITY_PLACES,
    CreditNoteNotFound,
    ExportFile,
    InvoiceNotFound,
    export_credit_note,
    export_invoice,
    get_invoice_document,
    invoice_list_csv_name,
    invoice_list_total,
    list_invoices,
    render_invoice_list_csv,
)
from billing.services.invoicing import (
    NOTE_MAX_CHARS,
    REASON_MAX_CHARS,
    get_credit_room,
    get_tenant_billing,
    issue_credit_note,
    preview_credit_note,
    record_invoice_status,
    unprintable_message,
    update_tenant_billing,
)
from billing.web.access import require_admin, require_platform
from billing.web.forms import LanguageDateField


@login_required
@one_snapshot()
def invoice_list(request: HttpRequest) -> HttpResponse:
    """The invoices with subtotal, tax, total, credited and balance due (or their CSV,
    `?format=csv`), and the upcoming invoices of the month in progress."""
    scope = get_scope(request.user)
    today = timezone.now().date()
    invoices = list_invoices(scope=scope, today=today)
    if request.GET.get("format") == "csv":
        return _attachment(ExportFile(filename=invoice_list_csv_name(today), content_type="text/csv; charset=utf-8",
                                      content=render_invoice_list_csv(invoices)))
    upcoming = list_upcoming_invoices(scope=scope, now=timezone.now())
    return render(request, "billing/invoices.html",
                  {"invoices": invoices, "list_total": invoice_list_total(invoices), "formats": EXPORT_FORMATS,
                   "upcoming": upcoming, "upcoming_total": _upcoming_total(upcoming)})


def _upcoming_total(upcoming: UpcomingInvoices) -> dict[str, object] | None:
    """The upcoming invoices' totals summed, exactly (each is already in minor units), when they
    share one currency (the close refuses two); None when there is nothing to add."""
    previews = [row.preview for row in upcoming.rows if row.preview is not None]
    currencies = {p.currency for p in previews}
    if not previews or len(currencies) != 1:
        return None
    currency = currencies.pop()
    return {"amount": from_minor_units(sum(p.total_minor for p in previews), currency), "currency": currency}


def _attachment(export: ExportFile) -> HttpResponse:
    response = HttpResponse(export.content, content_type=export.content_type)
    response["Content-Disposition"] = f'attachment; filename="{export.filename}"'
    return response


@login_required
def invoice_download(request: HttpRequest, number: str, fmt: str) -> HttpResponse:
    try:
        export = export_invoice(scope=get_scope(request.user), number=number, fmt=fmt)
    except (InvoiceNotFound, InvalidInput) as exc:
        raise Http404("no such invoice") from exc
    return _attachment(export)


@login_required
def credit_note_download(request: HttpRequest, number: str, fmt: str) -> HttpResponse:
    try:
        export = export_credit_note(scope=get_scope(request.user), number=number, fmt=fmt)
    except (CreditNoteNotFound, InvalidInput) as exc:
        raise Http404("no such credit note") from exc
    return _attachment(export)


class CreditNoteForm(forms.Form):
    """Shapes only; the amount's rules (positive, the currency's decimals, what is left) are the service's."""

    amount = forms.CharField(label=gettext_lazy("Amount to credit (net, before tax)"), max_length=32,
                             widget=forms.TextInput(attrs={"inputmode": "decimal", "size": 12}))
    reason = forms.CharField(label=gettext_lazy("Reason (printed on the credit note)"), max_length=REASON_MAX_CHARS,
                             widget=forms.Textarea(attrs={"rows": 2, "cols": 48}))
    # Set by the confirmation page only: the invoice's credited net it stated (a confirmed note is
    # refused if the invoice was credited since, so a double click or a second tab issues it once).
    confirmed_credited_minor = forms.IntegerField(required=False, min_value=0, widget=forms.HiddenInput)


class InvoiceStatusForm(forms.Form):
    """Shapes only; which change fits the invoice now, and the date's bounds, are the service's."""

    status = forms.ChoiceField(label=gettext_lazy("Status"), choices=InvoiceStatusChange.Status.choices)
    on_date = LanguageDateField(label=gettext_lazy("On"))
    note = forms.CharField(label=gettext_lazy("Note (optional)"), max_length=NOTE_MAX_CHARS, required=False,
                           widget=forms.TextInput(attrs={"size": 32}))


def _render_invoice(request: HttpRequest, scope: Scope, number: str, *, form: CreditNoteForm | None = None,
                    status_form: InvoiceStatusForm | None = None, status: int = 200) -> HttpResponse:
    today = timezone.now().date()
    try:
        doc = get_invoice_document(scope=scope, number=number, today=today)
    except InvoiceNotFound as exc:
        raise Http404("no such invoice") from exc
    context: dict[str, Any] = {"doc": doc, "formats": EXPORT_FORMATS, "can_credit": False,
                               "can_edit_terms": scope.is_admin, "gpu_hours_places": GPU_HOURS_PLACES,
                               "line_quantity_places": LINE_QUANTITY_PLACES}
    if scope.sees_platform and doc.status == "finalized":
        room = get_credit_room(invoice_number=number)
        context.update({"can_credit": room.net_minor > 0, "room": room, "form": form or CreditNoteForm(),
                        "status_form": status_form or InvoiceStatusForm(initial={"on_date": today})})
    return render(request, "billing/invoice_detail.html", context, status=status)


@login_required
def invoice_detail(request: HttpRequest, number: str) -> HttpResponse:
    """One invoice: its terms, lines, tax and credit notes; finance and admins may credit it."""
    return _render_invoice(request, get_scope(request.user), number)


@login_required
@require_POST
def credit_note_issue(request: HttpRequest, number: str) -> HttpResponse:
    scope = require_platform(request, _("Only finance and admins issue credit notes."))
    form = CreditNoteForm(request.POST)
    if form.is_valid() and "edit" in request.POST:  # "Change" on the confirmation: the form again, as typed
        return _render_invoice(request, scope, number, form=CreditNoteForm(initial=form.cleaned_data))
    if form.is_valid():
        data = form.cleaned_data
        try:
            if data["confirmed_credited_minor"] is None:
                preview = preview_credit_note(invoice_number=number, amount_text=data["amount"], reason=data["reason"])
                return render(request, "billing/credit_note_confirm.html", {"preview": preview, "form": form})
            issued = issue_credit_note(invoice_number=number, amount_text=data["amount"], reason=data["reason"],
                                       now=timezone.now(), actor_label=request.user.get_username(),
                                       actor_id=request.user.pk, credited_net_minor=data["confirmed_credited_minor"])
        except InvalidInput as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, _("Credit note %(number)s issued against %(invoice)s.")
                             % {"number": issued.number, "invoice": issued.invoice_number})
            return redirect("invoice-detail", number=number)
    return _render_invoice(request, scope, number, form=form, status=400)


@login_required
@require_POST
def invoice_status_record(request: HttpRequest, number: str) -> HttpResponse:
    """Finance (and admins) record that an issued invoice was sent, paid, or its payment reversed."""
    scope = require_platform(request, _("Only finance and admins record an invoice's payment status."))
    form = InvoiceStatusForm(request.POST)
    if form.is_valid():
        try:
            change = record_invoice_status(invoice_number=number, status=form.cleaned_data["status"],
                                           on_date=form.cleaned_data["on_date"], note=form.cleaned_data["note"],
                                           now=timezone.now(), actor_label=request.user.get_username(),
                                           actor_id=request.user.pk)
        except InvalidInput as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, _("Invoice %(number)s recorded as %(status)s on %(date)s.")
                             % {"number": number, "status": change.get_status_display(),
                                "date": change.on_date.isoformat()})
            return redirect("invoice-detail", number=number)
    return _render_invoice(request, scope, number, status_form=form, status=400)


class TenantBillingForm(forms.Form):
    tax_rate_pct = forms.DecimalField(label=gettext_lazy("Tax rate (%)"), min_value=0, max_value=100,
                                      decimal_places=3, max_digits=6)
    payment_terms_days = forms.IntegerField(
        label=gettext_lazy("Payment terms (days)"), min_value=0, max_value=365, required=False,
        help_text=gettext_lazy("Days from issue to due date; empty for the default."))
    po_number = forms.CharField(label=gettext_lazy("PO number"), max_length=64, required=False)
    cost_centre = forms.CharField(label=gettext_lazy("Cost centre"), max_length=64, required=False)
    billing_address = forms.CharField(
        label=gettext_lazy("Billing address"), max_length=500, required=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 40}),
        help_text=gettext_lazy("The customer's postal address under Bill to, one line per line (at most 6)."))
    tax_id = forms.CharField(label=gettext_lazy("Customer tax ID"), max_length=64, required=False,
                             help_text=gettext_lazy("VAT, GST or other tax registration number."))
    tax_exemption_note = forms.CharField(
        label=gettext_lazy("Tax exemption / reverse-charge note"), max_length=300, required=False,
        help_text=gettext_lazy("Why the tax rate is 0 %, e.g. \"Reverse charge: VAT to be accounted for by the "
                               "recipient\"; printed on invoices issued at 0 % only."))

    # All of these are printed on every invoice PDF from now on.
    def clean_po_number(self) -> str:
        return _printable(self.cleaned_data["po_number"])

    def clean_cost_centre(self) -> str:
        return _printable(self.cleaned_data["cost_centre"])

    def clean_billing_address(self) -> str:
        # A browser sends a textarea's line breaks as CRLF; the address keeps its lines as LF.
        return _printable(self.cleaned_data["billing_address"].replace("\r\n", "\n").replace("\r", "\n"))

    def clean_tax_id(self) -> str:
        return _printable(self.cleaned_data["tax_id"])

    def clean_tax_exemption_note(self) -> str:
        return _printable(self.cleaned_data["tax_exemption_note"])


def _printable(text: str) -> str:
    if bad := undrawable(text):
        raise forms.ValidationError(unprintable_message(bad))
    return text


@login_required
def tenant_billing_edit(request: HttpRequest, slug: str) -> HttpResponse:
    """Admins set a tenant's tax rate, payment terms, PO number, cost centre, billing address, tax ID
    and tax exemption note; each invoice copies them when it is issued, so the change applies from
    the next invoice on."""
    require_admin(request, _("Only admins change a tenant's invoice terms."))
    current = get_tenant_billing(slug=slug)
    if current is None:
        raise Http404("no such tenant")
    initial = {"tax_rate_pct": current.tax_rate_pct, "payment_terms_days": current.payment_terms_days,
               "po_number": current.po_number, "cost_centre": current.cost_centre,
               "billing_address": current.billing_address, "tax_id": current.tax_id,
               "tax_exemption_note": current.tax_exemption_note}
    form = TenantBillingForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            update_tenant_billing(slug=slug, now=timezone.now(), actor_label=request.user.get_username(),
                                  actor_id=request.user.pk, **form.cleaned_data)
        except InvalidInput as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, _("Invoice terms of %(tenant)s saved; invoices issued from now on use them.")
                             % {"tenant": current.name})
            return redirect("tenant-billing", slug=slug)
    return render(request, "billing/tenant_billing.html", {"tenant": current, "form": form},
                  status=400 if form.errors else 200)
