"""Alerts beyond budgets on the real ledger: usage metered through ingest and rolled up, rules
evaluated, alerts raised once per crossing, each linking to the Explore view that shows it, and
delivered once by e-mail, by a signed webhook and to a loopback Slack-compatible endpoint that
accepts only the payloads Slack's incoming webhooks accept."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest
from django.core import mail
from django.test import Client, override_settings

from billing import tasks
from billing.errors import InvalidInput
from billing.ledger.rollup import rollup_usage
from billing.models import AlertEvent, AlertRule, AlertState, AuditEvent, RateCard, Tenant
from billing.scope import FINANCE_GROUP
from billing.services.alerts import deliver_alert, evaluate_alerts, save_alert_rule, slack_message
from tests import clock
from tests.conftest import A100, make_batch, user_in

pytestmark = pytest.mark.django_db

WEEK = timedelta(weeks=1)


@pytest.fixture(autouse=True)
def _old_usage_is_billable(settings):
    settings.VGPU_LATE_USAGE_HORIZON = timedelta(days=60)
    settings.VGPU_PUBLIC_URL = "https://gpu-cost.example.com"


@pytest.fixture
def fleet(db):
    """A100s at 3600 USD per GPU-hour: a workload holding a fraction f of a card for s seconds costs f × s USD."""
    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal(3600),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    Tenant.objects.create(slug="acme", name="Acme Robotics", namespaces=["acme-prod", "acme-train"])


class Meter:
    """Meters usage at chosen instants through the real ingest API, and rolls it up."""

    def __init__(self, post_batch) -> None:
        self.post, self.seq = post_batch, 0

    def at(self, start: datetime, workloads: list[dict[str, Any]], *, seconds: int = 10,
           controllers: dict[str, str] | None = None) -> None:
        self.seq += 1
        batch = make_batch(start=start, seq=self.seq, seconds=seconds, workloads=workloads)
        for sample in batch["samples"]:
            if controllers and sample["pod"] in controllers:
                sample["controller_kind"], sample["controller_name"] = "Deployment", controllers[sample["pod"]]
        answer = self.post(batch)
        assert answer.status_code == 201, answer.content
        rollup_usage(now=clock.now())


def spend(namespace: str, usd: float, pod: str = "bert-1") -> dict[str, Any]:
    """A workload that costs `usd` over a 10-second batch (a fraction usd / 10 of the card)."""
    share = usd / 10
    return {"gpu": 0, "tenant": "acme", "namespace": namespace, "pod": pod, "mem_used": 81920 * share,
            "mem_granted": 81920 * share, "sm_used": 108 * share, "sm_granted": 108 * share}


@pytest.fixture
def meter(post_batch) -> Meter:
    return Meter(post_batch)


@pytest.fixture
def spike_hour() -> datetime:
    """An hour well inside the checked day, with room for the hour after it."""
    return clock.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=4)


def anomaly_rule(**extra: Any) -> AlertRule:
    values = {"name": "GPU spend spikes", "kind": "spend_anomaly", "group_by": "namespace", "granularity": "hour",
              "baseline_weeks": 4, "threshold": "3.5", "min_amount": "0.50", "currency": "USD",
              "window_hours": 24, "resource": "memory", "notify_emails": "finops@acme.example", "enabled": True,
              **extra}
    return save_alert_rule(values=values, now=clock.now(), actor_label="finance-1")


def baseline(meter: Meter, hour: datetime, namespace: str = "acme-prod",
             usd: tuple[float, ...] = (1.0, 0.9, 1.1, 1.0), minute: int = 5) -> None:
    """The same hour of the 4 weeks before; `minute` apart for each namespace (one GPU, one batch at a time)."""
    for weeks, amount in enumerate(usd, start=1):
        meter.at(hour - weeks * WEEK + timedelta(minutes=minute), [spend(namespace, amount)])


# --- Spend anomalies ------------------------------------------------------------------------------

def test_a_spike_is_found_once_with_its_figures_and_its_explore_link(fleet, meter, spike_hour):
    rule = anomaly_rule()
    baseline(meter, spike_hour)
    baseline(meter, spike_hour, "acme-train", usd=(2.0, 2.1, 1.9, 2.0), minute=15)
    meter.at(spike_hour + timedelta(minutes=5), [spend("acme-prod", 5.0)])
    meter.at(spike_hour + timedelta(minutes=15), [spend("acme-train", 2.05)])
    raised = evaluate_alerts(now=clock.now())
    event = AlertEvent.objects.get()
    assert raised == [event.pk]
    assert (event.key, event.period_start, event.period_end) == ("acme/acme-prod", spike_hour, spike_hour + timedelta(hours=1))
    assert (event.value, event.baseline) == (Decimal(5), Decimal("1.0"))
    assert event.score is not None
    assert event.score > 20
    day = f"{spike_hour:%Y-%m-%d}"
    assert event.explore_path == f"/explore/?start={day}&end={day}&tenant=acme&namespace=acme-prod"
    assert "robust z-score" in event.details["method"]
    assert AuditEvent.objects.filter(action="alert.fired", object_id=str(rule.pk)).count() == 1
    # Evaluated again, at once or an hour later: nothing new (once per crossing).
    assert evaluate_alerts(now=clock.now()) == []
    assert evaluate_alerts(now=clock.now() + timedelta(hours=1)) == []
    # The link opens the namespace's day in Explore, and its row is the spiking namespace.
    finance = Client()
    finance.force_login(user_in(FINANCE_GROUP))
    page = finance.get(event.explore_path)
    assert page.status_code == 200
    assert "acme-prod" in page.content.decode()


def test_a_run_of_anomalous_hours_alerts_once_and_calm_or_new_or_tiny_spend_not_at_all(fleet, meter, spike_hour):
    anomaly_rule()
    next_hour = spike_hour + timedelta(hours=1)
    for hour in (spike_hour, next_hour):
        baseline(meter, hour)
        meter.at(hour + timedelta(minutes=5), [spend("acme-prod", 6.0)])
    # acme-train: calm (within its baseline's spread); a new pod in a namespace with no history; tiny spend.
    earlier = spike_hour - timedelta(hours=2)
    baseline(meter, earlier, "acme-train", usd=(2.0, 2.2, 1.8, 2.0))
    meter.at(earlier + timedelta(minutes=5), [spend("acme-train", 2.3)])
    meter.at(spike_hour - timedelta(minutes=20), [spend("acme-staging", 9.0)])  # no baseline at all
    evaluate_alerts(now=clock.now())
    assert list(AlertEvent.objects.values_list("key", "period_start")) == [("acme/acme-prod", spike_hour)]


def test_tiny_spends_page_nobody(fleet, meter, spike_hour):
    anomaly_rule(min_amount="0.50")
    baseline(meter, spike_hour, usd=(0.01, 0.02, 0.01, 0.01))
    meter.at(spike_hour + timedelta(minutes=5), [spend("acme-prod", 0.40)])  # 40x, but 0.39 above the median
    assert evaluate_alerts(now=clock.now()) == []


def test_usage_that_lands_late_is_still_found(fleet, meter, spike_hour):
    anomaly_rule()
    baseline(meter, spike_hour)
    assert evaluate_alerts(now=clock.now()) == []  # the spike's batch has not arrived yet
    meter.at(spike_hour + timedelta(minutes=50), [spend("acme-prod", 4.0)])
    assert len(evaluate_alerts(now=clock.now())) == 1


def test_a_daily_rule_compares_whole_days(fleet, meter):
    anomaly_rule(granularity="day", group_by="tenant", min_amount="1.00")
    yesterday = clock.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    for weeks, usd in enumerate((3.0, 3.3, 2.9, 3.0), start=1):
        meter.at(yesterday - weeks * WEEK + timedelta(hours=9), [spend("acme-prod", usd)])
    meter.at(yesterday + timedelta(hours=9), [spend("acme-prod", 9.5)])
    meter.at(yesterday + timedelta(hours=15), [spend("acme-prod", 3.0, pod="other")])
    evaluate_alerts(now=clock.now())
    event = AlertEvent.objects.get()
    assert (event.key, event.period_start, event.period_end, event.value) == (
        "acme", yesterday, yesterday + timedelta(days=1), Decimal("12.5"))
    assert event.explore_path == f"/explore/?start={yesterday:%Y-%m-%d}&end={yesterday:%Y-%m-%d}&tenant=acme"


# --- Idle share and over-granting: once per crossing ------------------------------------------------

def test_idle_share_alerts_when_it_crosses_above_and_again_only_after_it_came_back(fleet, meter):
    rule = save_alert_rule(values={
        "name": "Idle fleet", "kind": "idle_share", "group_by": "node", "threshold": "50", "min_amount": "1",
        "currency": "USD", "window_hours": 2, "granularity": "hour", "baseline_weeks": 4, "resource": "memory",
        "enabled": True}, now=clock.now(), actor_label="finance-1")
    hour = clock.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=6)
    meter.at(hour - timedelta(minutes=50), [spend("acme-prod", 2.0)])  # 20 % used: 80 % idle
    evaluate_alerts(now=hour + timedelta(minutes=5))
    event = AlertEvent.objects.get()
    assert (event.key, event.value) == ("node gpu-node-1", Decimal(80))
    assert event.explore_path.endswith("&node=gpu-node-1")
    assert evaluate_alerts(now=hour + timedelta(minutes=10)) == []
    # The next window is busy: the condition clears (audited, not sent); later it is idle again: a new alert.
    meter.at(hour + timedelta(minutes=10), [spend("acme-prod", 9.0)])
    assert evaluate_alerts(now=hour + timedelta(hours=2, minutes=5)) == []
    assert AlertState.objects.get(rule=rule).firing is False
    assert AuditEvent.objects.filter(action="alert.cleared").count() == 1
    meter.at(hour + timedelta(hours=2, minutes=10), [spend("acme-prod", 1.0)])
    assert len(evaluate_alerts(now=hour + timedelta(hours=3, minutes=5))) == 1
    assert AlertEvent.objects.count() == 2


def test_over_granting_names_the_controller_and_links_to_its_workloads(fleet, meter):
    save_alert_rule(values={
        "name": "Over-granted", "kind": "over_granting", "group_by": "controller", "threshold": "3",
        "min_amount": "0.10", "currency": "USD", "window_hours": 2, "granularity": "hour", "baseline_weeks": 4,
        "resource": "memory", "enabled": True, "tenant": "acme"}, now=clock.now(), actor_label="finance-1")
    hour = clock.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    hoarder = {**spend("acme-prod", 1.0, pod="bert-1"), "mem_used": 2048.0, "mem_granted": 16384.0}  # 8x
    fair = {**spend("acme-prod", 1.0, pod="llm-1"), "mem_used": 16384.0, "mem_granted": 18000.0}
    meter.at(hour - timedelta(minutes=30), [hoarder, fair], controllers={"bert-1": "bert", "llm-1": "llm"})
    evaluate_alerts(now=hour + timedelta(minutes=1))
    event = AlertEvent.objects.get()
    assert event.key == "acme/acme-prod/deployment:bert"
    assert event.value == Decimal(8)
    assert "controller=deployment%3Abert" in event.explore_path
    assert (event.details["granted"], event.details["used"], event.details["unit"]) == ("0.04", "0.01", "GB·h")


# --- Rules: validated and audited ---------------------------------------------------------------------

@pytest.mark.parametrize(("change", "message"), [
    ({"group_by": "node"}, "grouped by tenant, namespace"),
    ({"threshold": "0.5"}, "threshold"),
    ({"min_amount": "0"}, "above zero for a spend anomaly"),
    ({"notify_emails": "not-an-address"}, "not an email address"),
    ({"slack_webhook_url": "http://hooks.slack.example/T0/B0/x"}, "must use https"),
    ({"currency": "XXY"}, "XXY"),
    ({"tenant": "nobody"}, "no tenant 'nobody'"),
    ({"name": ""}, "name"),
])
def test_a_rule_that_cannot_work_is_refused_and_nothing_is_written(fleet, change, message):
    with pytest.raises(InvalidInput, match=message):
        anomaly_rule(**change)
    assert not AlertRule.objects.exists()
    assert not AuditEvent.objects.filter(object_type="alert_rule").exists()


def test_changes_are_audited_without_the_secrets(fleet):
    rule = anomaly_rule(webhook_url="https://hooks.example.com/alerts", webhook_secret="s3cret",
                        slack_webhook_url="https://hooks.slack.com/services/T000/B000/XXXXSECRET")
    save_alert_rule(values={"threshold": "4"}, rule_id=rule.pk, now=clock.now(), actor_label="admin-1")
    rule.refresh_from_db()
    assert (rule.threshold, rule.webhook_secret, rule.slack_webhook_url) == (
        Decimal(4), "s3cret", "https://hooks.slack.com/services/T000/B000/XXXXSECRET")
    logged = json.dumps(list(AuditEvent.objects.filter(object_type="alert_rule").values("before", "after")),
                        ensure_ascii=False)
    assert "s3cret" not in logged
    assert "XXXXSECRET" not in logged
    assert "https://hooks.slack.com/…" in logged
    save_alert_rule(values={"slack_webhook_url": None}, rule_id=rule.pk, now=clock.now(), actor_label="admin-1")
    rule.refresh_from_db()
    assert rule.slack_webhook_url == ""


# --- Delivery: e-mail, signed webhook, Slack-compatible; once each ---------------------------------

# What Slack's incoming webhooks accept (api.slack.com, "Sending messages using incoming webhooks",
# "Block Kit"): a JSON object with `text` (required with blocks, as the notification's fallback) and
# at most 50 blocks; a header's plain_text at most 150 characters, a section's or context's text
# at most 3000. Anything else is answered 400 invalid_payload / invalid_blocks, as Slack does.
_BLOCK_TYPES = {"header", "section", "context", "divider", "actions"}


def slack_problem(headers: dict[str, str], body: bytes) -> str | None:
    if not headers.get("Content-Type", "").startswith("application/json"):
        return "invalid_payload: Content-Type is not application/json"
    try:
        message = json.loads(body)
    except ValueError:
        return "invalid_payload: not JSON"
    if not isinstance(message, dict) or not isinstance(message.get("text"), str) or not message["text"].strip():
        return "invalid_payload: no text"
    blocks = message.get("blocks", [])
    if not isinstance(blocks, list) or len(blocks) > 50:
        return "invalid_blocks: at most 50"
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in _BLOCK_TYPES:
            return f"invalid_blocks: type {kind!r}"
        texts = [block["text"]] if "text" in block else list(block.get("elements", []))
        for text in texts:
            limit = 150 if kind == "header" else 3000
            if not (isinstance(text, dict) and text.get("type") in ("plain_text", "mrkdwn")
                    and isinstance(text.get("text"), str) and 0 < len(text["text"]) <= limit):
                return f"invalid_blocks: {kind} text"
            if kind == "header" and text["type"] != "plain_text":
                return "invalid_blocks: a header is plain_text"
    return None


class _Receiver(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, dict[str, str], bytes, int]]] = []
    answers: ClassVar[list[int]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        headers = dict(self.headers)
        if self.path.startswith("/services/"):  # the Slack-compatible endpoint
            problem = slack_problem(headers, body)
            status, reply = (400, problem.encode()) if problem else (200, b"ok")
        else:
            status, reply = (type(self).answers.pop(0) if type(self).answers else 204), b""
        type(self).received.append((self.path, headers, body, status))
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    _Receiver.received, _Receiver.answers = [], []
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with override_settings(VGPU_WEBHOOK_ALLOWED_HOSTS=["127.0.0.1"]):
        yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_an_alert_is_told_by_email_signed_webhook_and_slack_once_each_with_its_explore_link(
        fleet, meter, spike_hour, receiver):
    anomaly_rule(webhook_url=f"{receiver}/hooks/alerts", webhook_secret="s3cret-for-tests",
                 slack_webhook_url=f"{receiver}/services/T000/B000/XXXX")
    baseline(meter, spike_hour)
    meter.at(spike_hour + timedelta(minutes=5), [spend("acme-prod", 5.0)])
    _Receiver.answers = [503]  # the signed webhook's receiver is down once: retried
    raised = tasks.evaluate_alerts.apply().get()
    assert len(raised) == 1
    assert tasks.evaluate_alerts.apply().get() == []  # run twice: nothing raised again
    for channel in ("email", "webhook", "slack"):
        for _ in range(2):  # a redelivered task finds it done
            tasks.deliver_alert.apply(args=(raised[0], channel)).get()
    event = AlertEvent.objects.get()
    assert None not in (event.email_sent_at, event.webhook_sent_at, event.slack_sent_at)
    link = f"https://gpu-cost.example.com{event.explore_path}"

    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["finops@acme.example"]
    assert "Spend anomaly: acme/acme-prod" in mail.outbox[0].subject
    assert link in mail.outbox[0].body
    assert "robust z-score" in mail.outbox[0].body

    hooks = [r for r in _Receiver.received if r[0] == "/hooks/alerts"]
    assert [status for *_rest, status in hooks] == [503, 204]
    _path, headers, body, _status = hooks[-1]
    signature = hmac.new(b"s3cret-for-tests", headers["X-VGPU-Timestamp"].encode() + b"." + body, hashlib.sha256)
    assert headers["X-VGPU-Signature"] == "sha256=" + signature.hexdigest()
    assert headers["X-VGPU-Event"] == "alert.spend_anomaly"
    payload = json.loads(body)
    assert (payload["key"], payload["explore_url"], payload["value"]) == ("acme/acme-prod", link, "5.000000000000")

    slack = [r for r in _Receiver.received if r[0].startswith("/services/")]
    assert [status for *_rest, status in slack] == [200]
    message = json.loads(slack[0][2])
    assert link in message["text"]
    assert message["blocks"][0]["type"] == "header"


def test_the_slack_endpoint_refuses_what_slack_refuses_and_our_message_is_never_refused(fleet, meter, spike_hour):
    assert slack_problem({"Content-Type": "application/json"}, b'{"blocks": []}') is not None
    assert slack_problem({"Content-Type": "application/json"},
                         json.dumps({"text": "x", "blocks": [{"type": "header", "text": {"type": "mrkdwn", "text": "x"}}]}
                                    ).encode()) is not None
    assert slack_problem({"Content-Type": "text/plain"}, b'{"text": "x"}') is not None
    anomaly_rule(name="<b>&amp; " + "x" * 90)  # a long name with Slack's control characters
    baseline(meter, spike_hour)
    meter.at(spike_hour + timedelta(minutes=5), [spend("acme-prod", 5.0)])
    evaluate_alerts(now=clock.now())
    body = json.dumps(slack_message(AlertEvent.objects.get())).encode()
    assert slack_problem({"Content-Type": "application/json"}, body) is None
    assert "<b>" not in json.loads(body)["blocks"][1]["text"]["text"]


def test_a_refused_destination_is_audited_and_not_sent_again(fleet, meter, spike_hour):
    # A private address: refused at send time unless an operator allow-lists it.
    anomaly_rule(slack_webhook_url="https://10.0.0.7/services/T000/B000/XXXXSECRET")
    baseline(meter, spike_hour)
    meter.at(spike_hour + timedelta(minutes=5), [spend("acme-prod", 5.0)])
    [event_id] = evaluate_alerts(now=clock.now())
    assert deliver_alert(event_id=event_id, channel="slack", now=clock.now()) == "refused"
    refusal = AuditEvent.objects.get(action="alert.delivery_refused")
    assert refusal.after is not None
    assert "private address" in refusal.after["reason"]
    assert "XXXXSECRET" not in json.dumps(refusal.after)
    assert AlertEvent.objects.get().slack_sent_at is None


# --- Pages ----------------------------------------------------------------------------------------------

def test_finance_sets_a_rule_and_reads_the_alerts_with_their_links_and_tenants_cannot(fleet, meter, spike_hour):
    finance = Client()
    finance.force_login(user_in(FINANCE_GROUP))
    form = {"name": "Spikes", "kind": "spend_anomaly", "tenant": "", "group_by": "namespace", "granularity": "hour",
            "baseline_weeks": "4", "threshold": "3.5", "min_amount": "0.50", "currency": "USD", "window_hours": "24",
            "resource": "memory", "notify_emails": "", "webhook_url": "", "webhook_secret": "",
            "slack_webhook_url": "", "enabled": "on"}
    assert finance.post("/alerts/rules/new/", form).status_code == 302
    bad = finance.post("/alerts/rules/new/", {**form, "group_by": "node"})
    assert bad.status_code == 400
    assert "grouped by" in bad.content.decode()
    baseline(meter, spike_hour)
    meter.at(spike_hour + timedelta(minutes=5), [spend("acme-prod", 5.0)])
    evaluate_alerts(now=clock.now())
    page = finance.get("/alerts/").content.decode()
    event = AlertEvent.objects.get()
    assert f'href="{event.explore_path.replace("&", "&amp;")}"' in page
    member = Client()
    member.force_login(user_in(tenant="acme"))
    assert member.get("/alerts/").status_code == 403
    assert member.post("/alerts/rules/new/", form).status_code == 403
    assert AlertRule.objects.count() == 1
