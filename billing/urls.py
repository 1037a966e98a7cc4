from django.contrib.auth import views as auth_views
from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView

from billing.api.admission import PodAdmissionView
from billing.api.agent import NodeEventsView, NodePolicyView, NodeUndeliveredView, UsageBatchView
from billing.api.allocation import AllocationSummaryView, AllocationView, AssetsView, AutocompleteView
from billing.web import (
    access,
    admin_fleet,
    admin_pages,
    api_tokens,
    explore,
    health,
    invoices,
    language,
    metrics,
    periods,
    portal,
    rebalance,
    reports,
    views,
)

urlpatterns = [
    path("", portal.home, name="home"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics, name="metrics"),
    path("metrics/opencost", metrics.opencost_metrics, name="metrics-opencost"),
    path("api/v1/usage/batches", UsageBatchView.as_view(), name="usage-batches"),
    path("api/v1/nodes/<str:node>/policy", NodePolicyView.as_view(), name="node-policy"),
    path("api/v1/nodes/<str:node>/events", NodeEventsView.as_view(), name="node-events"),
    path("api/v1/nodes/<str:node>/undelivered", NodeUndeliveredView.as_view(), name="node-undelivered"),
    path("api/v1/admission/pods", PodAdmissionView.as_view(), name="admission-pods"),
    # OpenCost clients call <base>/allocation[/compute][/summary], /assets; Kubecost's under /model/;
    # the API's own prefix serves the same (docs/allocation-api.md).
    *[path(f"{prefix}{route}", view.as_view(), name=f"{name_prefix}{name}")
      for prefix, name_prefix in (("", ""), ("api/v1/", "api-"), ("model/", "model-"))
      for route, view, name in (
          ("allocation", AllocationView, "allocation"),
          ("allocation/compute", AllocationView, "allocation-compute"),
          ("allocation/summary", AllocationSummaryView, "allocation-summary"),
          ("allocation/compute/summary", AllocationSummaryView, "allocation-compute-summary"),
          ("allocation/autocomplete", AutocompleteView, "allocation-autocomplete"),
          ("assets", AssetsView, "assets"))],
    path("api/v1/schema", SpectacularAPIView.as_view(), name="openapi-schema"),
    path("finance/", views.finance_overview, name="finance-overview"),
    path("explore/", explore.explore, name="explore"),
    path("tenants/", portal.tenant_list, name="tenant-list"),
    path("tenants/<slug:slug>/", portal.tenant_portal, name="tenant-portal"),
    path("budgets/", admin_pages.budgets, name="budgets"),
    path("budgets/<slug:tenant>/", admin_pages.budget_edit, name="budget-edit"),
    path("sla-tiers/", admin_pages.sla_tiers, name="sla-tiers"),
    path("sla-tiers/new/", admin_pages.sla_tier_create, name="sla-tier-create"),
    path("sla-tiers/<slug:slug>/edit/", admin_pages.sla_tier_edit, name="sla-tier-edit"),
    path("sla-tiers/<slug:slug>/retire/", admin_pages.sla_tier_retire, name="sla-tier-retire"),
    path("audit/", admin_pages.audit_log, name="audit-log"),
    path("rate-cards/", admin_fleet.rate_cards, name="rate-cards"),
    path("rate-cards/<int:card_id>/end/", admin_fleet.rate_card_end, name="rate-card-end"),
    path("rate-cards/<int:card_id>/retire/", admin_fleet.rate_card_retire, name="rate-card-retire"),
    path("gpu-models/", admin_fleet.gpu_models, name="gpu-models"),
    path("gpu-models/retire/", admin_fleet.gpu_model_retire, name="gpu-model-retire"),
    path("nodes/", admin_fleet.nodes, name="nodes"),
    path("nodes/tokens/", admin_fleet.node_token_issue, name="node-token-issue"),
    path("nodes/tokens/<int:token_id>/revoke/", admin_fleet.node_token_revoke, name="node-token-revoke"),
    path("api-tokens/", api_tokens.api_tokens, name="api-tokens"),
    path("api-tokens/<int:token_id>/revoke/", api_tokens.api_token_revoke, name="api-token-revoke"),
    path("rebalance/", rebalance.rebalance_list, name="rebalance"),
    re_path(r"^rebalance/(?P<plan_id>[0-9]+)/(?P<decision>approve|reject)/$", rebalance.rebalance_decide,
            name="rebalance-decide"),
    path("reports/", reports.report_list, name="report-list"),
    path("reports/<int:report_id>/", reports.report_detail, name="report-detail"),
    path("reports/<int:report_id>.pdf", reports.report_pdf, name="report-pdf"),
    path("reports/<int:report_id>.csv", reports.report_csv, name="report-csv"),
    path("invoices/", invoices.invoice_list, name="invoice-list"),
    # Numbers have no dot (VGL-YYYYMM-slug), so "<number>.<fmt>" is a download, never a page.
    re_path(r"^invoices/(?P<number>[^/.]+)/$", invoices.invoice_detail, name="invoice-detail"),
    re_path(r"^invoices/(?P<number>[^/.]+)/credit-notes/$", invoices.credit_note_issue, name="credit-note-issue"),
    re_path(r"^invoices/(?P<number>[^/.]+)/status/$", invoices.invoice_status_record, name="invoice-status-record"),
    re_path(r"^credit-notes/(?P<number>[^/]+)\.(?P<fmt>pdf|csv|focus)$", invoices.credit_note_download,
            name="credit-note-download"),
    path("tenants/<slug:slug>/billing/", invoices.tenant_billing_edit, name="tenant-billing"),
    re_path(r"^invoices/(?P<number>[^/]+)\.(?P<fmt>pdf|csv|focus)$", invoices.invoice_download,
            name="invoice-download"),
    path("periods/", periods.period_list, name="period-list"),
    re_path(r"^periods/(?P<month>[0-9]{4}-[0-9]{2})/close$", periods.period_close, name="period-close"),
    re_path(r"^periods/(?P<month>[0-9]{4}-[0-9]{2})/resume$", periods.period_resume, name="period-resume"),
    re_path(r"^periods/(?P<month>[0-9]{4}-[0-9]{2})/status$", periods.period_status, name="period-status"),
    path("accounts/login/", access.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/password/", auth_views.PasswordChangeView.as_view(success_url="/finance/"), name="password_change"),
    path("i18n/setlang/", language.set_language, name="set_language"),
]
