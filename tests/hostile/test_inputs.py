"""No input reaches a 500 on the pages: every date, period, month, step, filter and amount parameter
of the pages and their forms, with hostile values (dates at the ends of the calendar, NaN,
infinities, 1e±9999999, huge digit strings, control characters), answers a 2xx, 3xx or 4xx, for
an admin, finance and a tenant member. Over HTTP against a live server on loopback. (The JSON API
is schemathesis's; this covers the pages.)"""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import requests
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from billing.errors import InvalidInput
from billing.models import (
    AlertRule,
    BillingPeriod,
    Budget,
    Commitment,
    ExportDestination,
    GpuModel,
    Invoice,
    InvoiceLine,
    Location,
    RateCard,
    RebalancePlan,
    SlaTier,
    Tenant,
)
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from billing.services.identity.api_tokens import issue_api_token
from billing.services.identity.tokens import issue_node_token
from billing.services.invoicing.credit_notes import MAX_CREDIT_MAJOR, parse_credit_amount
from billing.services.pricing.sla import set_sla_tier_weight
from billing.services.saved_views import ScheduleInput, create_view, set_schedule
from tests import clock
from tests.conftest import A100, user_in

pytestmark = pytest.mark.django_db(transaction=True)

NUMBERS = ("NaN", "-NaN", "sNaN", "Infinity", "-Infinity", "inf", "1e-9999999", "1e9999999", "9" * 400,
           "0." + "0" * 400 + "1", "-0", "0", "1e3", "12.345", "1,000.50", " 7 ", "٣", "１２")
DATES = ("9999-12-31", "0001-01-01", "2026-02-30", "2026-13-01", "1999-12-31", "2200-01-01", "99999-01-01",
         "2026-11-01", "2026-11-30", "", "2026-1-1", "today")
HOSTILE_TEXT = ("\x00", "\r\n", "=1", "../../etc", "%", "'; drop table x; --", "a" * 5000, "ǅ", "😀", "\u202e")
values = st.one_of(st.sampled_from(NUMBERS + DATES + HOSTILE_TEXT), st.text(max_size=40),
                   st.integers().map(str), st.decimals(allow_nan=True).map(str))

# Every page's GET parameters (the pages' forms and the query strings their links build).
PERIOD = ("start", "end")
GET_PAGES: dict[str, tuple[str, ...]] = {
    "/finance/": (*PERIOD, "format", "table"),
    "/explore/": (*PERIOD, "format", "tenant", "namespace", "controller", "pod", "container", "label", "node",
                  "gpu_model", "sla_tier"),
    "/fleet/": (*PERIOD, "format", "sort", "page", "page_size"),
    "/tenants/": (),
    "/tenants/acme/": (*PERIOD, "format"),
    "/budgets/": (),
    "/budgets/new/": ("tenant", "scope"),
    "/alerts/": (),
    "/alerts/rules/new/": ("kind",),
    "/sla-tiers/": (),
    "/audit/": ("action",),
    "/rate-cards/": ("gpu_model",),
    "/commitments/": ("month",),
    "/exports/": (),
    "/nodes/": (),
    "/locations/": (),
    "/api-tokens/": (),
    "/rebalance/": (),
    "/reports/": (),
    "/invoices/": ("format",),
    "/invoices/VGL-202611-acme/": (),
    "/periods/": (),
    "/periods/9999-12/status": (),
    "/periods/0000-00/status": (),
    "/views/": (),
    "/": (),
}
# Every page form's fields (POST), each filled with a hostile value, the others with sane ones. The
# {placeholders} are the ids `_world` creates (sequences are not reset between tests).
RETIRE = {"reason": "hostile probe", "confirm": "on"}
RATE_CARD = {"gpu_model": A100["model"], "price_per_gpu_hour": "4.10", "currency": "USD",
             "effective_from": "2200-01-01T00:00", "alpha": "", "billed_basis": "", "idle_policy": "",
             "confirm_free": "", "source_url": "https://example.org/price", "source_note": "list price"}
SLA_TIER = {"name": "Bronze", "weight": "1", "description": ""}
DESTINATION = {"name": "Lake", "endpoint_url": "", "region": "eu-west-1", "bucket": "finops-lake", "key_prefix": "gpu",
               "access_key_id": "AKIAEXAMPLE0001", "secret_access_key": "probe-secret", "enabled": "on",
               "clear_credentials": ""}
COMMITMENT = {"kind": "on_prem", "gpu_model": A100["model"], "cards": "8", "currency": "USD", "note": "contract",
              "term_start": "2199-01-01", "term_years": "3", "price_per_gpu_hour": "2.9", "purchase_price": "15000",
              "power_watts": "400", "energy_price_per_kwh": "0.15", "facility_cost_per_year": "1200"}
BUDGET = {"amount": "100", "currency": "USD", "soft_threshold_pct": "80", "hard_threshold_pct": "100",
          "hard_action": "throttle", "throttle_factor": "0.5", "owner": "ops", "notify_emails": "", "webhook_url": ""}
ALERT_RULE = {"name": "Spikes", "kind": "spend_anomaly", "tenant": "", "group_by": "namespace", "granularity": "hour",
              "baseline_weeks": "4", "threshold": "3.5", "min_amount": "10", "currency": "USD", "window_hours": "24",
              "resource": "memory", "notify_emails": "", "webhook_url": "", "webhook_secret": "",
              "slack_webhook_url": "", "remove_slack": "", "enabled": "on"}
POST_FORMS: dict[str, dict[str, str]] = {
    "/invoices/VGL-202611-acme/credit-notes/": {"amount": "1.00", "reason": "outage", "confirmed_credited_minor": "0"},
    "/budgets/acme/": {"amount": "100", "currency": "USD", "soft_threshold_pct": "80", "hard_threshold_pct": "100",
                       "hard_action": "alert", "throttle_factor": "0.5", "owner": "ops", "notify_emails": "",
                       "webhook_url": ""},
    "/budgets/new/": {"tenant": "acme", "scope": "namespace", "namespace": "acme-prod", "label": "", **BUDGET},
    "/budgets/{budget}/edit/": BUDGET,
    "/alerts/rules/new/": ALERT_RULE,
    "/alerts/rules/{alert_rule}/": ALERT_RULE,
    "/invoices/VGL-202611-acme/status/": {"status": "paid", "on_date": "2026-12-03", "note": ""},
    "/tenants/acme/billing/": {"tax_rate_pct": "20", "payment_terms_days": "30", "po_number": "PO", "cost_centre": "CC"},
    "/sla-tiers/": {"slug": "gold", "weight": "1"},
    "/sla-tiers/new/": {"slug": "bronze", **SLA_TIER},
    "/sla-tiers/gold/edit/": SLA_TIER,
    "/sla-tiers/silver/retire/": RETIRE,
    "/rate-cards/": RATE_CARD,
    "/rate-cards/{card}/end/": {"effective_to": "2200-01-01T00:00"},
    "/rate-cards/{card}/retire/": RETIRE,
    "/commitments/": COMMITMENT,
    "/commitments/{commitment}/retire/": RETIRE,
    "/exports/": DESTINATION,
    "/exports/{destination}/": DESTINATION,
    "/exports/{destination}/retire/": {"confirm": "on"},
    "/exports/{destination}/deliver/": {},
    "/gpu-models/": {"name": "NVIDIA H100 80GB HBM3", "note": ""},
    "/gpu-models/retire/": {"name": A100["model"], **RETIRE},
    "/nodes/tokens/": {"node": "gpu-node-9"},
    "/nodes/tokens/{node_token}/revoke/": {"confirm": "wrong"},
    "/nodes/gpu-node-1/location/": {"location": "eu-west-dc1"},
    "/locations/": {"label": "ap-south-dc3"},
    "/locations/rates/": {"location": "eu-west-dc1", "effective_from": "2199-01-01", "price_per_kwh": "0.21",
                          "co2e_kg_per_kwh": "0.25"},
    "/api-tokens/": {"username": "admin-probe", "name": "ci", "expires_days": "30"},
    "/api-tokens/{api_token}/revoke/": {"confirm": "wrong"},
    "/rebalance/{plan}/approve/": {"confirmation": "wrong"},
    "/rebalance/{plan}/reject/": {},
    "/reports/": {"start": "2026-11-01", "end": "2026-11-30"},
    "/finance/": {"start": "2026-11-01", "end": "2026-11-30"},  # the savings card's button
    "/periods/9999-12/close": {},
    "/periods/2026-11/resume": {},
    "/views/": {"name": "Probe view", "path": "/explore/", "query": "start=2026-11-01&end=2026-11-30&tenant=acme"},
    "/views/{saved_view}/schedule/": {"frequency": "monthly", "weekday": "", "day_of_month": "31", "hour": "9",
                                      "format": "csv", "recipients": "cfo@example.com"},
    "/views/{saved_view}/rename/": {"name": "Renamed probe"},
    "/views/{saved_view}/send/": {},
    "/i18n/setlang/": {"language": "en", "next": "/"},
    "/accounts/password/": {"old_password": "wrong", "new_password1": "x", "new_password2": "x"},
    "/accounts/login/": {"username": "nobody", "password": "wrong"},
}
# Routes that take a POST but are not the pages' forms, each with the reason it is not probed here.
NOT_PROBED = {
    # The JSON agent and OpenCost APIs: schemathesis probes them from the OpenAPI schema.
    "usage-batches", "node-events", "node-undelivered", "admission-pods",
    # Takes no fields, and probing it would end the probe's own session.
    "logout",
}
# The classic bad values every field of every form gets once, besides hypothesis's draws (which
# also sample the rest of NUMBERS, DATES and HOSTILE_TEXT: empty, 1e-9999999, 0001-01-01, ...).
CLASSIC = ("NaN", "1e9999999", "-1", "9999-12-31T23:59", "a" * 5000, "\x00😀\u202e")


def _world() -> dict[str, int]:
    """An invoice to credit, a tier to edit and one to retire, an approved model with a card, a node
    token, an API token and a proposed plan: every form's object exists, so the values reach the
    parsing behind it. Returns the ids the {placeholders} of POST_FORMS name."""
    tenant = Tenant.objects.create(slug="acme", name="Acme")
    period = BillingPeriod.objects.create(month=datetime(2026, 11, 1, tzinfo=UTC).date(),
                                          status=BillingPeriod.Status.CLOSED)
    at = datetime(2026, 12, 2, 9, tzinfo=UTC)
    invoice = Invoice.objects.create(tenant=tenant, period=period, number="VGL-202611-acme", currency="USD",
                                     created_at=at)
    InvoiceLine.objects.create(invoice=invoice, kind="usage", gpu_model="A100", sla_tier="gold",
                               usage_month=period.month, gpu_hours=Decimal(1), amount=Decimal(100),
                               amount_minor=10_000)
    Invoice.objects.filter(pk=invoice.pk).update(
        status=Invoice.Status.FINALIZED, finalized_at=at, total_minor=10_000, tax_minor=0, tax_rate_pct=Decimal(0),
        issue_date=at.date(), due_date=at.date() + timedelta(days=30), issuer_name="Issuer Ltd", bill_to_name="Acme")
    SlaTier.objects.create(slug="gold", name="Gold", weight=Decimal(4))
    SlaTier.objects.create(slug="silver", name="Silver", weight=Decimal(2))
    now = clock.now()
    GpuModel.objects.create(name=A100["model"], approved_at=now, approved_by="test")
    card = RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("4.1"),
                                   effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    admin = user_in(ADMIN_GROUP)
    commitment = Commitment.objects.create(
        gpu_model=A100["model"], kind="reserved", cards=8, currency="USD", price_per_gpu_hour=Decimal("2.9"),
        term_start=datetime(2199, 1, 1, tzinfo=UTC), term_end=datetime(2200, 1, 1, tzinfo=UTC), term_years=1,
        effective_from=datetime(2199, 1, 1, tzinfo=UTC), effective_to=datetime(2200, 1, 1, tzinfo=UTC), note="c",
        created_at=now, created_by="test")
    Location.objects.create(label="eu-west-dc1", created_at=now)
    budget = Budget.objects.create(tenant=tenant, amount=Decimal(100), currency="USD", owner="ops")
    alert_rule = AlertRule.objects.create(name="Probe", kind="idle_share", group_by="fleet", threshold=Decimal(50),
                                          created_at=now, updated_at=now)
    destination = ExportDestination.objects.create(name="Probe lake", region="eu-west-1", bucket="probe-lake",
                                                   created_at=now, created_by="test", updated_at=now, updated_by="test")
    view = create_view(owner_id=admin.pk, name="Probe", path="/finance/", query="start=2026-11-01&end=2026-11-30",
                       period="fixed", now=now, actor_label="test")
    set_schedule(view_id=view.pk, owner_id=admin.pk, now=now, actor_label="test",
                 values=ScheduleInput(frequency="daily", hour=9, weekday=None, day_of_month=None, format="csv",
                                      recipients=("cfo@example.com",)))
    return {
        "saved_view": view.pk, "admin": admin.pk, "card": card.pk, "commitment": commitment.pk, "destination": destination.pk,
        "budget": budget.pk, "alert_rule": alert_rule.pk,
        "node_token": issue_node_token(node_name="gpu-node-1", now=now, actor_label="test").token_id,
        "api_token": issue_api_token(username=admin.get_username(), name="probe", expires_at=None, now=now,
                                     actor_label="test").token_id,
        "plan": RebalancePlan.objects.create(created_at=now, max_moves=5, moves=[{
            "namespace": "ml", "pod": "train-0", "pod_uid": "uid-0", "from_node": "gpu-node-1", "from_gpu": 0,
            "to_node": "gpu-node-2", "to_gpu": 1}]).pk,
    }


def _post_forms(ids: dict[str, int]) -> dict[str, dict[str, str]]:
    return {path.format(**ids): form for path, form in POST_FORMS.items()}


def _session(user: Any) -> requests.Session:
    client = Client()
    client.force_login(user)
    session = requests.Session()
    session.cookies.set(settings.SESSION_COOKIE_NAME, client.cookies[settings.SESSION_COOKIE_NAME].value)
    session.cookies.set(settings.CSRF_COOKIE_NAME, "k" * 32)  # a CSRF secret the form's token must match
    session.headers["X-CSRFToken"] = "k" * 32
    return session


def test_no_page_parameter_or_form_field_answers_a_server_error(live_server):
    ids = _world()
    sessions = [_session(User.objects.get(pk=ids["admin"])), _session(user_in(FINANCE_GROUP)),
                _session(user_in(tenant="acme"))]
    forms = _post_forms(ids)
    seen: list[int] = []

    def post(session: requests.Session, page: str, form: dict[str, str]) -> None:
        response = session.post(live_server.url + page, data=form, timeout=60, allow_redirects=False,
                                headers={"Referer": live_server.url + page})
        seen.append(response.status_code)
        assert response.status_code < 500, (page, response.status_code, response.request.body)

    # Every field of every form gets each classic bad value once, as the admin (who passes the
    # permission checks, so the value reaches the parsing).
    for page, form in forms.items():
        for name in form:
            for value in CLASSIC:
                post(sessions[0], page, {**form, name: value})

    @hypothesis_settings(max_examples=30, deadline=None, database=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(who=st.integers(0, 2), page=st.sampled_from(sorted(GET_PAGES) + sorted(forms)), data=st.data())
    def probe(who: int, page: str, data: st.DataObject) -> None:
        session = sessions[who]
        if page in forms and (page not in GET_PAGES or data.draw(st.booleans())):
            form = dict(forms[page])
            for name in data.draw(st.lists(st.sampled_from(sorted(form) or ["x"]), max_size=3, unique=True)):
                form[name] = data.draw(values)
            post(session, page, form)
            return
        names = GET_PAGES[page]
        params = {n: data.draw(values) for n in data.draw(st.lists(st.sampled_from(names), unique=True))} \
            if names else {}
        if "format" in params and data.draw(st.booleans()):
            params["format"] = data.draw(st.sampled_from(["csv", "upcoming-csv"]))
        response = session.get(live_server.url + page, params=params, timeout=60, allow_redirects=False)
        seen.append(response.status_code)
        assert response.status_code < 500, (page, response.status_code, response.request.url)

    probe()
    # The probes reached the pages and were refused with a 4xx (not all turned away at the door).
    assert any(s == 200 for s in seen)
    assert any(400 <= s < 500 for s in seen)


def _routes(patterns: list[Any]) -> list[URLPattern]:
    """Every route of the URLconf, includes flattened."""
    out: list[URLPattern] = []
    for p in patterns:
        out += _routes(p.url_patterns) if isinstance(p, URLResolver) else [p]
    return out


def _takes_post(route: URLPattern) -> bool:
    """A class-based view with a `post`, or a view function whose own source (decorators included)
    names POST: `require_POST`, `request.POST`, a method check. A view that reads the form only in a
    helper it calls would be missed; the views here read `request.POST` themselves."""
    view_class = getattr(route.callback, "view_class", None)
    if view_class is not None:
        return hasattr(view_class, "post")
    return "POST" in inspect.getsource(inspect.unwrap(route.callback))


def test_the_probe_covers_every_route_that_takes_a_post():
    """A new form (a route whose view takes a POST) must join POST_FORMS, or NOT_PROBED with the
    reason it is not probed."""
    probed = {resolve(path).url_name for path in _post_forms({"card": 1, "node_token": 1, "api_token": 1, "plan": 1,
                                                               "commitment": 1, "destination": 1, "budget": 1,
                                                               "alert_rule": 1, "saved_view": 1})}
    posting = {route.name for route in _routes(get_resolver().url_patterns) if _takes_post(route)}
    assert posting - probed - NOT_PROBED == set(), "routes that take a POST the probe does not send one to"
    # Both lists stay true: nothing named that takes no POST, nothing both probed and excused.
    assert (probed | NOT_PROBED) - posting == set()
    assert not probed & NOT_PROBED


@pytest.mark.parametrize("path", ["/explore/", "/finance/", "/fleet/", "/tenants/acme/"])
def test_the_attacker_s_dates_are_a_clear_400_page(live_server, path):
    session = _session(User.objects.get(pk=_world()["admin"]))
    for start, end in (("9999-12-31", "9999-12-31"), ("0001-01-01", "0001-01-02"), ("2026-11-01", "9999-12-31")):
        response = session.get(live_server.url + path, params={"start": start, "end": end}, timeout=60)
        assert response.status_code == 400, (path, start, end)
        assert "2199-12-31" in response.text, (path, start, end)


def test_a_credit_amount_is_bounded_and_finite_before_it_reaches_the_database():
    for text in ("NaN", "sNaN", "Infinity", "-Infinity", "1e-9999999", "1e9999999", "9" * 400, "0." + "0" * 60 + "1",
                 "0", "-1", "1.001", str(MAX_CREDIT_MAJOR + 1)):
        with pytest.raises(InvalidInput):
            parse_credit_amount(text, "USD")
    assert parse_credit_amount(str(MAX_CREDIT_MAJOR), "USD") == int(MAX_CREDIT_MAJOR) * 100
    assert parse_credit_amount("12.50", "USD") == 1250
    assert parse_credit_amount("7", "JPY") == 7


def test_a_weight_change_for_a_slug_with_a_nul_is_no_tier_not_a_database_error(db):
    SlaTier.objects.create(slug="gold", name="Gold", weight=Decimal(4))
    for slug in ("go\x00ld", "a" * 5000, "Gold", ""):
        with pytest.raises(InvalidInput, match="no SLA tier"):
            set_sla_tier_weight(slug=slug, weight="2", now=clock.now(), actor_label="test")
    assert set_sla_tier_weight(slug="gold", weight="2", now=clock.now(), actor_label="test").weight == 2
