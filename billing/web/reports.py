"""Paired report pages (finance and admins): request one, watch its progress, read it, download
the PDF. Thin: parse, one service call, render."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _

from billing import tasks
from billing.api.errors import QUEUE_DOWN
from billing.csv_files import csv_writer, download_name
from billing.errors import InvalidInput
from billing.models import PairedReport
from billing.services.savings import (
    COLD_START,
    SAVINGS_CSV_COLUMNS,
    definitions,
    headline_text,
    paired_rows,
    partial_days_note,
    period_text,
    render_paired_report_pdf,
    report_not_queued,
    request_paired_report,
    savings_csv_rows,
    savings_tables,
    study_note,
    study_rows,
    summary_rows,
    tenant_names,
)
from billing.web.access import require_platform
from billing.web.forms import PeriodForm


def _require_platform_view(request: HttpRequest) -> None:
    require_platform(request, "paired reports cover every tenant: finance and admins only")


@login_required
def report_list(request: HttpRequest) -> HttpResponse:
    _require_platform_view(request)
    form = PeriodForm(request.POST or None, initial=PeriodForm.default_initial(timezone.now().date()))
    if request.method == "POST" and form.is_valid():
        try:
            report = request_report(request, form)
        except InvalidInput as exc:
            form.add_error(None, str(exc))
        else:
            return redirect("report-detail", report_id=report.pk)
    reports = PairedReport.objects.order_by("-created_at")[:50]
    return render(request, "billing/reports.html", {"form": form, "reports": reports, "definitions": _definitions()},
                  status=400 if form.errors else 200)


def _definitions() -> list[tuple[str, str]]:
    return definitions(int(COLD_START.total_seconds() // 60))


def request_report(request: HttpRequest, form: PeriodForm) -> PairedReport:
    """The user's paired report of the (valid) form's period, the one way both pages ask: one of
    that period already being computed is joined, with a notice saying so; a new one's job is
    queued once its row is committed. InvalidInput for a period that cannot be reported."""
    start, end = form.bounds()
    report, created = request_paired_report(start=start, end=end, now=timezone.now(),
                                            actor_label=request.user.get_username(), actor_id=request.user.pk,
                                            join_in_flight=True)
    if created:
        transaction.on_commit(lambda: enqueue_report(report.pk))
    else:
        messages.info(request, _("A report of this period is already being computed: here is its progress."))
    return report


def enqueue_report(report_id: int) -> None:
    """Queue a new report's job (after its row is committed); a broker that is down marks the
    report failed and answers 503."""
    try:
        tasks.run_paired_report.delay(report_id)
    except QUEUE_DOWN as exc:
        report_not_queued(report_id=report_id, error=exc)
        raise  # billing.api.errors.OutageMiddleware answers 503


def _get(report_id: int) -> PairedReport:
    report = PairedReport.objects.filter(pk=report_id).first()
    if report is None:
        raise Http404("no such report")
    return report


@login_required
def report_detail(request: HttpRequest, report_id: int) -> HttpResponse:
    _require_platform_view(request)
    report = _get(report_id)
    result = report.result
    tables = savings_tables(result, tenant_names())
    context: dict[str, object] = {"report": report, "period": period_text(report), "definitions": _definitions(),
                                  "tables": tables}
    if tables is not None and result is not None:
        headline = headline_text(tables)
        baseline = tables.baseline_row
        context |= {
            "headline": headline,
            "baseline_label": baseline.label if baseline else _("Static"),
            "paired": paired_rows(result, tables.currency), "rows": summary_rows(result),
            "study": study_rows(result), "study_note": study_note(), "partial_note": partial_days_note(result),
            "profiles": [(model, sorted(names.items())) for model, names in tables.profiles.items()],
        }
    return render(request, "billing/report_detail.html", context)


def _finished(report_id: int) -> PairedReport:
    report = _get(report_id)
    if report.status != PairedReport.Status.DONE or savings_tables(report.result, {}) is None:
        raise Http404("the report is not finished, or was computed before static alternatives were placed")
    return report


@login_required
def report_pdf(request: HttpRequest, report_id: int) -> HttpResponse:
    _require_platform_view(request)
    report = _finished(report_id)
    response = HttpResponse(render_paired_report_pdf(report, tenant_names=tenant_names()),
                            content_type="application/pdf")
    name = download_name(f"paired-report-{report.pk}", report.period_start, report.period_end, "pdf")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@login_required
def report_csv(request: HttpRequest, report_id: int) -> HttpResponse:
    _require_platform_view(request)
    report = _finished(report_id)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    name = download_name(f"paired-report-{report.pk}", report.period_start, report.period_end)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    writer = csv_writer(response)
    writer.writerow(SAVINGS_CSV_COLUMNS)
    writer.writerows(savings_csv_rows(report.result or {}, tenant_names()))
    return response
