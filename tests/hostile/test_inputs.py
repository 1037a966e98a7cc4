"""No input reaches a 500 on the pages: every date, period, month, step, filter and amount parameter
of the pages and their forms, with hostile values (dates at the ends of the calendar, NaN,
infinities, 1e±9999999, huge digit strings, control characters), answers a 2xx, 3xx or 4xx, for
an admin, finance and a tenant member. Over HTTP against a live server on loopback. (The JSON API
is schemathesis's; this covers the pages.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import requests
from django.conf import settings
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from billing.errors import InvalidInput
from billing.models import BillingPeriod, Invoice, InvoiceLine, Tenant
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from billing.services.credit_notes import MAX_CREDIT_MAJOR, parse_credit_amount
from tests.conftest import user_in

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
    "/tenants/": (),
    "/tenants/acme/": (*PERIOD, "format"),
    "/budgets/": (),
    "/sla-tiers/": (),
    "/audit/": ("action",),
    "/rate-cards/": ("gpu_model",),
    "/nodes/": (),
    "/api-tokens/": (),
    "/rebalance/": (),
    "/reports/": (),
    "/invoices/": (),
    "/invoices/VGL-202611-acme/": (),
    "/periods/": (),
    "/periods/9999-12/status": (),
    "/periods/0000-00/status": (),
    "/": (),
}
# Every page form's fields (POST), each filled with a hostile value, the others with sane ones.
POST_FORMS: dict[str, dict[str, str]] = {
    "/invoices/VGL-202611-acme/credit-notes/": {"amount": "1.00", "reason": "outage"},
    "/budgets/acme/": {"amount": "100", "currency": "USD", "soft_threshold_pct": "80", "hard_threshold_pct": "100",
                       "hard_action": "alert", "throttle_factor": "0.5", "owner": "ops", "notify_emails": "",
                       "webhook_url": ""},
    "/tenants/acme/billing/": {"tax_rate_pct": "20", "payment_terms_days": "30", "po_number": "PO", "cost_centre": "CC"},
    "/sla-tiers/": {"slug": "gold", "weight": "1"},
    "/reports/": {"start": "2026-11-01", "end": "2026-11-30"},
    "/periods/9999-12/close": {},
    "/periods/2026-11/resume": {},
}


def _world() -> None:
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


def _session(user: Any) -> requests.Session:
    client = Client()
    client.force_login(user)
    session = requests.Session()
    session.cookies.set(settings.SESSION_COOKIE_NAME, client.cookies[settings.SESSION_COOKIE_NAME].value)
    session.cookies.set(settings.CSRF_COOKIE_NAME, "k" * 32)  # a CSRF secret the form's token must match
    session.headers["X-CSRFToken"] = "k" * 32
    return session


def test_no_page_parameter_or_form_field_answers_a_server_error(live_server):
    _world()
    sessions = [_session(user_in(ADMIN_GROUP)), _session(user_in(FINANCE_GROUP)), _session(user_in(tenant="acme"))]
    seen: list[int] = []

    @hypothesis_settings(max_examples=60, deadline=None, database=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(who=st.integers(0, 2), page=st.sampled_from(sorted(GET_PAGES) + sorted(POST_FORMS)), data=st.data())
    def probe(who: int, page: str, data: st.DataObject) -> None:
        session = sessions[who]
        if page in POST_FORMS and (page not in GET_PAGES or data.draw(st.booleans())):
            form = dict(POST_FORMS[page])
            for name in data.draw(st.lists(st.sampled_from(sorted(form) or ["x"]), max_size=3, unique=True)):
                form[name] = data.draw(values)
            response = session.post(live_server.url + page, data=form, timeout=60, allow_redirects=False,
                                    headers={"Referer": live_server.url + page})
        else:
            names = GET_PAGES[page]
            params = {n: data.draw(values) for n in data.draw(st.lists(st.sampled_from(names), unique=True))} \
                if names else {}
            if "format" in params and data.draw(st.booleans()):
                params["format"] = data.draw(st.sampled_from(["csv", "upcoming-csv"]))
            response = session.get(live_server.url + page, params=params, timeout=60, allow_redirects=False)
        seen.append(response.status_code)
        assert response.status_code < 500, (page, response.status_code, response.request.url,
                                            response.request.body)

    probe()
    # The probes reached the pages and were refused with a 4xx (not all turned away at the door).
    assert any(s == 200 for s in seen) and any(400 <= s < 500 for s in seen)


@pytest.mark.parametrize("path", ["/explore/", "/finance/", "/tenants/acme/"])
def test_the_attacker_s_dates_are_a_clear_400_page(live_server, path):
    _world()
    session = _session(user_in(ADMIN_GROUP))
    for start, end in (("9999-12-31", "9999-12-31"), ("0001-01-01", "0001-01-02"), ("2026-11-01", "9999-12-31")):
        response = session.get(live_server.url + path, params={"start": start, "end": end}, timeout=60)
        assert response.status_code == 400 and "2199-12-31" in response.text, (path, start, end)


def test_a_credit_amount_is_bounded_and_finite_before_it_reaches_the_database():
    for text in ("NaN", "sNaN", "Infinity", "-Infinity", "1e-9999999", "1e9999999", "9" * 400, "0." + "0" * 60 + "1",
                 "0", "-1", "1.001", str(MAX_CREDIT_MAJOR + 1)):
        with pytest.raises(InvalidInput):
            parse_credit_amount(text, "USD")
    assert parse_credit_amount(str(MAX_CREDIT_MAJOR), "USD") == int(MAX_CREDIT_MAJOR) * 100
    assert parse_credit_amount("12.50", "USD") == 1250 and parse_credit_amount("7", "JPY") == 7
