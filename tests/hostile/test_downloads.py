"""Every file a user downloads is inert: formula payloads planted in every field a user or a node
controls come back in no CSV as a cell a spreadsheet would evaluate (billing.csv_files), and a PDF
draws any text, whatever script or control character it holds (billing.pdf_fonts).

Over HTTP against a live server on loopback, signed in as finance and as a tenant member."""

from __future__ import annotations

import codecs
import csv
import io
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import requests
from django.conf import settings
from django.test import Client

from billing.csv_files import FORMULA_STARTS, csv_writer, inert_cell, number
from billing.errors import InvalidInput
from billing.ledger.models import UsageBatch, WorkloadMeta
from billing.ledger.rollup import rollup_usage
from billing.models import BillingPeriod, CreditNote, Invoice, InvoiceLine, Node, RateCard, Tenant
from billing.pdf_fonts import REPLACEMENT, drawable, undrawable
from billing.scope import FINANCE_GROUP, Scope
from billing.services.exports import export_credit_note, export_invoice
from billing.services.identity.tokens import issue_node_token
from billing.services.invoicing.close import close_period
from billing.services.invoicing.credit_notes import issue_credit_note
from tests import clock
from tests.conftest import A100, make_batch, user_in
from tests.pdf_check import check_pdf

PAYLOADS = ('=HYPERLINK("http://evil.example/x","click")', "+1", "-1+1", "@SUM(1)", "\t=1", "\r=1")
NOV = date(2026, 11, 1)
AFTER_NOV = datetime(2026, 12, 2, 9, tzinfo=UTC)
EVERYONE = Scope(tenants=None, is_finance=True, is_admin=True)
HOSTILE_MODEL = "-1+1 " + A100["model"]
# Texts no PDF font of ours draws: emoji, Hebrew, Arabic, Devanagari, Thai, a zero-width joiner, controls.
UNPRINTABLE = ("outage 😀👩‍💻", "שלום עולם", "مرحبا بالعالم", "नमस्ते दुनिया", "สวัสดีชาวโลก", "a\u200db",
               "bell\x07 and \x1b[31m", "right\u202eto left", "zero\u200bwidth")


def _formula_cells(content: bytes) -> list[tuple[int, str]]:
    """Cells a spreadsheet would evaluate: first character, or first after whitespace, a formula
    start, or a leading tab/CR; a cell that parses as a number is one our code wrote."""
    found = []
    for i, row in enumerate(csv.reader(io.StringIO(content.decode("utf-8-sig"), newline=""))):
        for cell in row:
            if not cell:
                continue
            if cell[0] in "\t\r" or cell.lstrip()[:1] in FORMULA_STARTS:
                try:
                    Decimal(cell)
                except ArithmeticError:
                    found.append((i, cell))
    return found


def test_the_writer_neutralises_text_by_type_and_leaves_numbers():
    for payload in (*PAYLOADS, " =1", "\n=1", "＝1"):
        assert inert_cell(payload) == "'" + payload
    assert inert_cell(Decimal("-12.34")) == "-12.34"
    assert inert_cell(-3) == "-3"
    assert inert_cell(number("-12.34")) == "-12.34"
    assert inert_cell("-12.34") == "'-12.34"  # text that looks like a number is still text
    assert inert_cell("Acme (total)") == "Acme (total)"
    assert inert_cell(None) == ""
    out = io.StringIO()
    csv_writer(out).writerows([["=1", number("-1")]])
    assert out.getvalue() == "\ufeff'=1,-1\r\n"  # the BOM first (billing.csv_files)


def _plant(post_batch: Any) -> tuple[Invoice, str]:
    """Payloads in the tenants' names, PO numbers and cost centres, the node's GPU model (priced, so
    on the invoice lines and in FOCUS), and a credit note's reason; usage in November."""
    Tenant.objects.create(slug="acme", name=PAYLOADS[0], po_number=PAYLOADS[1], cost_centre=PAYLOADS[2],
                          tax_rate_pct=Decimal(20))
    Tenant.objects.create(slug="globex", name=PAYLOADS[3], po_number=PAYLOADS[4], cost_centre=PAYLOADS[5])
    RateCard.objects.create(gpu_model=HOSTILE_MODEL, currency="USD", price_per_gpu_hour=Decimal("3600"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3600"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    batch = make_batch(start=datetime(2026, 11, 15, 12, tzinfo=UTC), seconds=60, workloads=[
        {"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 8192.0, "mem_granted": 8192.0,
         "sm_used": 10.8, "sm_granted": 10.8},
        {"gpu": 0, "tenant": "globex", "pod": "llm-1", "mem_used": 8192.0, "mem_granted": 8192.0,
         "sm_used": 10.8, "sm_granted": 10.8}])
    batch["gpus"][0]["model"] = HOSTILE_MODEL
    assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())
    close_period(month=NOV, now=AFTER_NOV)
    invoice = Invoice.objects.get(tenant__slug="acme")
    issued = issue_credit_note(invoice_number=invoice.number, amount_text="0.01", reason=PAYLOADS[0],
                               now=AFTER_NOV, actor_label="finance-1")
    return invoice, issued.number


def _session(live_server: Any, user: Any) -> requests.Session:
    client = Client()
    client.force_login(user)
    session = requests.Session()
    session.cookies.set(settings.SESSION_COOKIE_NAME, client.cookies[settings.SESSION_COOKIE_NAME].value)
    return session


def _csv_urls(invoice: str, note: str) -> list[str]:
    period = "start=2026-11-01&end=2026-11-30"
    urls = [f"/finance/?{period}&format=csv&table={t}" for t in ("tenants", "timeline", "utilisation", "workloads")]
    urls += [f"/explore/?{period}&format=csv", f"/explore/?{period}&format=csv&tenant=acme",
             f"/explore/?{period}&format=csv&tenant=acme&namespace=acme-prod",
             f"/tenants/acme/?{period}&format=csv", "/tenants/acme/?format=upcoming-csv",
             f"/fleet/?{period}&format=csv"]
    urls += ["/invoices/?format=csv", f"/invoices/{invoice}.csv", f"/invoices/{invoice}.focus",
             f"/credit-notes/{note}.csv", f"/credit-notes/{note}.focus"]
    urls += [f"/invoices/{number}.{fmt}" for number in Invoice.objects.exclude(number=invoice)
             .values_list("number", flat=True) for fmt in ("csv", "focus")]
    return urls


@pytest.mark.django_db(transaction=True)
def test_every_csv_the_product_serves_is_inert(live_server, post_batch, time_machine):
    time_machine.move_to(datetime(2026, 12, 2, 9, tzinfo=UTC), tick=False)
    invoice, note = _plant(post_batch)
    finance = _session(live_server, user_in(FINANCE_GROUP))
    planted = 0
    for url in _csv_urls(invoice.number, note):
        response = finance.get(live_server.url + url, timeout=60)
        assert response.status_code == 200, url
        assert response.headers["Content-Type"].startswith("text/csv"), url
        assert _formula_cells(response.content) == [], (url, response.content[:600])
        # One byte order mark, first: Excel reads a CSV without it in the machine's code page.
        assert response.content.startswith(codecs.BOM_UTF8), (url, response.content[:20])
        assert response.content.count(codecs.BOM_UTF8) == 1, url
        if "start=" in url:  # named by the period's first and last day, both included
            assert response.headers["Content-Disposition"].endswith('-20261101-20261130.csv"'), url
        planted += sum(f"'{p}" in response.content.decode() for p in PAYLOADS)
    # The payloads did reach the files (quoted), so the test tests something.
    assert planted >= 10
    member = _session(live_server, user_in(tenant="acme"))
    for url in ("/tenants/acme/?start=2026-11-01&end=2026-11-30&format=csv", "/tenants/acme/?format=upcoming-csv",
                "/invoices/?format=csv", f"/invoices/{invoice.number}.csv", f"/invoices/{invoice.number}.focus"):
        response = member.get(live_server.url + url, timeout=60)
        assert response.status_code == 200, url
        assert _formula_cells(response.content) == [], url


def _finalized_invoice(*, name: str = "Acme", po_number: str = "") -> Invoice:
    tenant = Tenant.objects.create(slug="acme", name=name)
    period = BillingPeriod.objects.create(month=NOV, status=BillingPeriod.Status.CLOSED)
    invoice = Invoice.objects.create(tenant=tenant, period=period, number="VGL-202611-acme", currency="USD",
                                     created_at=AFTER_NOV)
    InvoiceLine.objects.create(invoice=invoice, kind="usage", gpu_model="A100", sla_tier="gold", usage_month=NOV,
                               gpu_hours=Decimal(1), amount=Decimal(100), amount_minor=10_000)
    Invoice.objects.filter(pk=invoice.pk).update(
        status=Invoice.Status.FINALIZED, finalized_at=AFTER_NOV, total_minor=10_000, tax_minor=0,
        tax_rate_pct=Decimal(0), issue_date=AFTER_NOV.date(), due_date=AFTER_NOV.date() + timedelta(days=30),
        issuer_name="Issuer Ltd", bill_to_name=tenant.name, po_number=po_number)
    return Invoice.objects.get(pk=invoice.pk)


@pytest.mark.django_db
def test_a_reason_the_pdf_cannot_print_is_refused_with_the_characters_named():
    invoice = _finalized_invoice()
    for text in UNPRINTABLE:
        assert undrawable(text), text
        with pytest.raises(InvalidInput, match="U\\+"):
            issue_credit_note(invoice_number=invoice.number, amount_text="1", reason=text, now=AFTER_NOV,
                              actor_label="finance-1")
    assert not CreditNote.objects.exists()
    assert undrawable("Outage 星河 Ünïcode Ж α\nline two\ttab") == []


@pytest.mark.django_db
def test_a_stored_credit_note_with_unprintable_text_still_renders_every_glyph(tmp_path):
    """An immutable record written before the check (or by another path) must render for good."""
    invoice = _finalized_invoice(name="مرحبا 😀 שלום", po_number="नमस्ते\u200d")
    reason = " ".join(UNPRINTABLE)
    CreditNote.objects.create(invoice=invoice, number="CN-2026-0001", currency="USD", issue_date=AFTER_NOV.date(),
                              issued_at=AFTER_NOV, amount_minor=100, tax_minor=0, total_minor=100, reason=reason,
                              issued_by_label="finance-1", issuer_name="Issuer Ltd")
    facts = check_pdf(export_credit_note(scope=EVERYONE, number="CN-2026-0001", fmt="pdf").content, tmp_path)
    assert REPLACEMENT in facts.text
    assert "outage" in facts.text
    check_pdf(export_invoice(scope=EVERYONE, number=invoice.number, fmt="pdf").content, tmp_path)
    assert drawable("a😀b") == f"a{REPLACEMENT}b"
    assert drawable("星河") == "星河"


def _sample_field(key: str) -> Any:
    def plant(batch: dict[str, Any], payload: str) -> None:
        for sample in batch["samples"]:
            sample[key] = payload
    return plant


def _controller(key: str) -> Any:
    def plant(batch: dict[str, Any], payload: str) -> None:
        for sample in batch["samples"]:
            sample.update({"controller_kind": "Deployment", "controller_name": "bert"})
            sample[key] = payload
    return plant


def _label_value(batch: dict[str, Any], payload: str) -> None:
    for sample in batch["samples"]:
        sample["labels"] = {"app": payload}


def _label_key(batch: dict[str, Any], payload: str) -> None:
    for sample in batch["samples"]:
        sample["labels"] = {payload: "bert"}


def _cluster(batch: dict[str, Any], payload: str) -> None:
    batch["cluster"] = payload


def _gpu_uuid(batch: dict[str, Any], payload: str) -> None:
    batch["gpus"][0]["uuid"] = payload
    for sample in batch["samples"]:
        sample["gpu"] = payload


def _node(batch: dict[str, Any], payload: str) -> None:
    batch["node"] = payload


# Every text of a usage batch a node controls, with the path each takes: refused at ingest with a
# 400 naming the field (Kubernetes names and label syntax begin with a letter or digit, so no
# formula start gets through), or stored. The GPU model is the one stored node text: free-form
# (vendors name cards "NVIDIA A100-SXM4-80GB"), so test_every_csv_the_product_serves_is_inert plants it
# and follows it into the explore, finance, invoice and FOCUS CSVs. A field moved from refused to
# stored here must be planted there too, or this test fails on the 201.
NODE_FIELDS: dict[str, tuple[Any, str]] = {
    "namespace": (_sample_field("namespace"), "$.samples[0].namespace"),
    "pod": (_sample_field("pod"), "$.samples[0].pod"),
    "container": (_sample_field("container"), "$.samples[0].container"),
    "pod_uid": (_sample_field("pod_uid"), "$.samples[0].pod_uid"),
    "tenant": (_sample_field("tenant"), "$.samples[0].tenant"),
    "sla_tier": (_sample_field("sla_tier"), "$.samples[0].sla_tier"),
    "controller_kind": (_controller("controller_kind"), "$.samples[0].controller_kind"),
    "controller_name": (_controller("controller_name"), "$.samples[0].controller_name"),
    "label value": (_label_value, "$.samples[0].labels"),
    "label key": (_label_key, "$.samples[0].labels"),
    "cluster": (_cluster, "$.cluster"),
    "gpu uuid": (_gpu_uuid, "$.gpus[0].uuid"),
}


@pytest.mark.django_db(transaction=True)
def test_every_node_controlled_name_of_a_batch_is_refused_at_ingest(live_server, node_token, minute_start):
    url = live_server.url + "/api/v1/usage/batches"
    headers = {"Authorization": f"Bearer {node_token.token}"}
    seq = 0
    for field, (plant, path) in NODE_FIELDS.items():
        for payload in PAYLOADS:
            seq += 1
            batch = make_batch(seq=seq, start=minute_start, seconds=2)
            plant(batch, payload)
            response = requests.post(url, json=batch, headers=headers, timeout=60)
            assert response.status_code == 400, (field, payload, response.status_code, response.text[:300])
            paths = [e["path"] for e in response.json()["errors"]]
            assert path in paths, (field, payload, paths)
    seq += 1
    for payload in PAYLOADS:
        # The batch's node is the token's (403 otherwise), and no node of such a name can get one:
        # token issue takes Kubernetes node names only. (A ServiceAccount-authenticated node is the
        # nodeName the Kubernetes API server gives for the agent's pod, which it validated.)
        batch = make_batch(seq=seq, start=minute_start, seconds=2)
        _node(batch, payload)
        response = requests.post(url, json=batch, headers=headers, timeout=60)
        assert response.status_code == 403, (payload, response.text[:300])
        assert "gpu-node-1" in response.text, (payload, response.text[:300])
        with pytest.raises(InvalidInput, match="node name"):
            issue_node_token(node_name=payload, now=minute_start, actor_label="admin-1")
    assert not UsageBatch.objects.exists()
    assert not WorkloadMeta.objects.exists()
    assert list(Node.objects.values_list("name", flat=True)) == ["gpu-node-1"]
    # The same batch without a payload is stored: the refusals above are the payloads'.
    clean = make_batch(seq=seq, start=minute_start, seconds=2)
    _controller("controller_name")(clean, "bert")
    _label_value(clean, "bert")
    clean["cluster"] = "prod-eu-west-1"
    assert requests.post(url, json=clean, headers=headers, timeout=60).status_code == 201
    assert WorkloadMeta.objects.filter(controller_name="bert").exists()
