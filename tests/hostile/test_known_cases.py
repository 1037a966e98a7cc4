"""Hostile cases of earlier rounds that already hold, replayed over HTTP against a live server:
tenant isolation, CSRF, SQL injection strings in parameters, XSS escaping, the login lockout, the
credit-note cap under a race, a hostile batch that must not stop billing for the fleet, and
oversized and gzip-bomb bodies. Short on purpose (a few live-server tests, each doing several
cases); every request fails the test on a 5xx (tests/hostile/conftest.py). The unit-level
versions, with every detail, stay where they were (tests/billing/)."""

from __future__ import annotations

import gzip
import threading
from datetime import timedelta

from django.conf import settings

from billing.ledger.models import UsageBatch
from billing.models import AuditEvent, CreditNote, Tenant
from billing.scope import FINANCE_GROUP
from billing.services.identity.api_tokens import issue_api_token
from billing.services.ingest.rollup import run_rollup
from tests import clock
from tests.billing.test_credit_notes import finalized_invoice
from tests.conftest import make_batch, user_in
from tests.hostile.conftest import PASSWORD, bearer, sign_in

INJECTIONS = ["' OR '1'='1", "1; DROP TABLE billing_tenant; --", "' UNION SELECT slug FROM billing_tenant --",
              "\x00", "é" * 500]
XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def test_tenants_csrf_injections_and_markup_over_http(signed_in, new_session, live_server):
    Tenant.objects.create(slug="globex", name="Globex")
    Tenant.objects.create(slug="evil", name=XSS)
    acme_invoice, globex_invoice = finalized_invoice(slug="acme"), finalized_invoice(slug="globex")
    member = signed_in(tenant="acme")
    # Tenant isolation: another tenant's portal and invoice are 404, like ones that do not exist.
    assert member.get("/tenants/acme/").status_code == 200
    for path in ("/tenants/globex/", f"/invoices/{globex_invoice.number}/", f"/invoices/{globex_invoice.number}.pdf",
                 "/tenants/no-such/"):
        assert member.get(path).status_code == 404, path
    assert member.get(f"/invoices/{acme_invoice.number}/").status_code == 200
    for path in ("/audit/", "/nodes/", "/rebalance/", "/rate-cards/"):
        assert member.get(path).status_code in (302, 403, 404), path
    assert "Globex" not in member.get("/finance/").text
    # SQL injection strings in every kind of parameter: refused or ignored, never 5xx, never
    # another tenant's data.
    for value in INJECTIONS:
        for path in ("/tenants/acme/", "/explore/", "/invoices/", "/reports/"):
            answer = member.get(path, params={"tenant": value, "month": value, "group_by": value, "q": value})
            assert "Globex" not in answer.text, (path, value)
    finance = signed_in(FINANCE_GROUP)
    token = issue_api_token(username=user_in(tenants=("acme", "initech")).username, name="script", expires_at=None,
                            now=clock.now(), actor_label="test").token
    api = new_session()
    for value in INJECTIONS:
        for params in ({"window": value}, {"aggregate": value}, {"window": "7d", "filter": value}):
            assert "globex" not in api.get("/api/v1/allocation", params=params, headers=bearer(token)).text.lower()
        assert finance.get("/audit/", params={"action": value, "actor": value}).status_code < 500
    # XSS: a tenant's name is markup-escaped wherever finance reads it.
    listing = finance.get("/tenants/").text
    assert "&lt;script&gt;" in listing
    assert XSS not in listing
    assert "<script>alert" not in listing
    # CSRF: a signed-in POST without the token is refused and changes nothing.
    url = f"/invoices/{acme_invoice.number}/credit-notes/"
    finance.get(f"/invoices/{acme_invoice.number}/")
    assert finance.post(url, data={"amount": "5", "reason": "outage"}).status_code == 403
    assert finance.post("/nodes/tokens/", data={"node": "sneaky"}).status_code == 403
    assert not CreditNote.objects.exists()


def test_login_lockout_over_http_is_audited_once(new_session):
    user = user_in(FINANCE_GROUP)
    session = new_session()
    for _ in range(settings.AXES_FAILURE_LIMIT + 2):
        assert sign_in(session, user.username, "wrong-password").status_code in (200, 429)
    locked = sign_in(session, user.username, PASSWORD)
    assert locked.status_code == 429
    assert 'data-testid="login-locked-out"' in locked.text
    assert AuditEvent.objects.filter(action="login.locked_out", object_id=user.username).count() == 1
    # Another user from the same address is not locked out (the lock is per username and address).
    assert sign_in(new_session(), user_in(tenant="acme").username).status_code == 302


def test_two_credit_notes_racing_for_the_last_of_an_invoice_never_exceed_it(new_session):
    invoice = finalized_invoice(subtotal_minor=10_000)  # 100.00 USD net to credit
    finance = user_in(FINANCE_GROUP)
    browsers = [new_session(), new_session()]  # the same person in two browser tabs
    for b in browsers:
        assert sign_in(b, finance.username).status_code == 302
    url = f"/invoices/{invoice.number}/credit-notes/"
    for b in browsers:
        b.get(f"/invoices/{invoice.number}/")
    start, answers = threading.Barrier(len(browsers)), []

    def issue(browser) -> None:
        start.wait()
        # Both confirm a preview that saw nothing credited yet (billing.services.invoicing.credit_notes).
        answers.append(browser.post_form(url, {"amount": "60", "reason": "outage", "confirmed_credited_minor": "0"})
                       .status_code)

    threads = [threading.Thread(target=issue, args=(b,)) for b in browsers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(answers) == [302, 400]
    assert CreditNote.objects.count() == 1


def test_hostile_batches_and_bodies_never_stop_the_fleets_billing(hostile, node_token_for, minute_start,
                                                                  one_usd_per_gpu_second, settings):
    settings.VGPU_INGEST_MAX_JSON_BYTES = 1024 * 1024
    healthy, rogue = node_token_for("gpu-node-1"), node_token_for("gpu-node-2")
    assert hostile.post("/api/v1/usage/batches", headers=bearer(healthy.token),
                        json=make_batch(start=minute_start)).status_code == 201
    later = minute_start + timedelta(seconds=10)
    # The rogue node: the healthy node's GPU, hostile fields, a body too large, a gzip bomb.
    stolen = make_batch(node="gpu-node-1", start=later, seq=7)
    stolen["node"] = "gpu-node-2"
    assert hostile.post("/api/v1/usage/batches", headers=bearer(rogue.token), json=stolen).status_code == 403
    overflow = make_batch(node="gpu-node-2", start=later)
    overflow["samples"][0]["pcie_mb"] = 1e300
    overflow["gpus"][0]["memory_mb"] = 2**40
    assert hostile.post("/api/v1/usage/batches", headers=bearer(rogue.token), json=overflow).status_code == 400
    too_large = b"[" + b" " * (settings.VGPU_INGEST_MAX_BODY_BYTES + 1) + b"]"
    assert hostile.post("/api/v1/usage/batches", headers={**bearer(rogue.token), "Content-Type": "application/json"},
                        data=too_large).status_code == 413
    bomb = gzip.compress(b"[" + b" " * (8 * settings.VGPU_INGEST_MAX_JSON_BYTES) + b"]", compresslevel=9)
    assert len(bomb) < 100_000
    assert hostile.post("/api/v1/usage/batches", data=bomb,
                        headers={**bearer(rogue.token), "Content-Type": "application/json",
                                 "Content-Encoding": "gzip"}).status_code == 413
    nested = b"[" * 100_000 + b"]" * 100_000
    assert hostile.post("/api/v1/usage/batches", data=nested,
                        headers={**bearer(rogue.token), "Content-Type": "application/json"}).status_code in (400, 415)
    # The fleet goes on: the healthy node's next batch is stored and everything stored is billed.
    assert hostile.post("/api/v1/usage/batches", headers=bearer(healthy.token),
                        json=make_batch(start=later, seq=2)).status_code == 201
    result = run_rollup(now=clock.now())
    assert (result.batches, result.quarantined) == (2, 0)
    assert set(UsageBatch.objects.values_list("node__name", flat=True)) == {"gpu-node-1"}
    assert UsageBatch.objects.filter(rolled_up_at__isnull=True).count() == 0


