"""The demo data set: SLA tiers, tenants, an A100 80GB rate card with its public source, two
locations with an energy price and a CO2e factor (the nodes asked for split between them), and one
user per role. Idempotent: running it again resets the demo users' passwords."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from urllib.parse import urlencode

from django.contrib.auth.models import Group, User
from django.db import transaction

from billing.models import (
    AlertRule,
    GpuModel,
    Location,
    LocationRate,
    Node,
    NodeLocation,
    RateCard,
    SavedView,
    SlaTier,
    Tenant,
    TenantMembership,
)
from billing.models.tenancy import default_miss_targets
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from billing.seeded import SEED_TEXTS, SLA_TIERS, UNATTRIBUTED_NAME
from billing.services.alerts import save_alert_rule
from billing.services.audit import record_audit_event
from billing.services.budgets import set_budget
from billing.services.fleet import FIRST_LOCATION_FROM
from billing.services.ingest import set_tenant_namespaces
from billing.services.saved_views import ScheduleInput, create_view, set_schedule

__all__ = ["DEMO_ALERT_RULE", "DEMO_LOCATIONS", "DEMO_TENANTS", "SEED_TEXTS", "DemoLogin", "demo_namespaces", "load_demo_data"]

# Names and descriptions are data, stored as written and shown as stored in every language, except
# these: the product's own words for what it seeds, shown in the reader's language while they are
# unchanged (billing/templatetags/ledger.py, `seeded`). A name an admin writes is theirs, as typed.
# (slug, display name, default SLA tier)
DEMO_TENANTS = [
    ("acme", "Acme Robotics", "gold"),
    ("globex", "Globex Research", "silver"),
    ("initech", "Initech AI", "bronze"),
    ("xinghe", "星河智能 (Xinghe AI)", "silver"),
]
# Invoice terms a finance team would set (tax rate %, payment terms in days, PO number, cost
# centre, the customer's billing address and tax ID); initech keeps the defaults (no tax, net 30,
# no address), which an invoice shows as 0 % and "—".
DEMO_INVOICE_TERMS = {
    "acme": {"tax_rate_pct": Decimal("20"), "payment_terms_days": 30, "po_number": "PO-2026-0142",
             "cost_centre": "CC-ROBOTICS-7", "billing_address": "Acme Robotics Ltd\nAccounts Payable\n"
             "10 Dock Road\nLondon E16 1AA\nUnited Kingdom", "tax_id": "GB987654321"},
    "globex": {"tax_rate_pct": Decimal("8.875"), "payment_terms_days": 45, "po_number": "GX-4471",
               "cost_centre": "RND-GPU", "billing_address": "Globex Research Inc.\n500 Fifth Avenue\n"
               "New York, NY 10110\nUSA", "tax_id": "EIN 12-3456789"},
    "xinghe": {"tax_rate_pct": Decimal("6"), "payment_terms_days": 60, "po_number": "XH-采购-0093",
               "cost_centre": "研发-03", "billing_address": "星河智能科技有限公司\n上海市浦东新区世纪大道 100 号\n中国",
               "tax_id": "91310000MA1FL0000X"},
}
A100_80GB_MODEL = "NVIDIA A100-SXM4-80GB"
# AWS EC2 p4de.24xlarge (8 × A100 80GB) on-demand in us-east-1 was listed at USD 40.96 per
# instance-hour on the EC2 P4 page (2024): 40.96 / 8 = 5.12 per GPU-hour.
A100_80GB_PRICE_PER_GPU_HOUR = Decimal("5.12")
A100_80GB_SOURCE_URL = "https://aws.amazon.com/ec2/instance-types/p4/"
A100_80GB_SOURCE_NOTE = (
    "AWS EC2 p4de.24xlarge (8 x NVIDIA A100 80GB), Linux on-demand, us-east-1, USD 40.96 per "
    "instance-hour as listed on the EC2 P4 instance page in 2024; 40.96 / 8 GPUs = 5.12 per GPU-hour. "
    "Replace with your own contract price."
)


# Two locations, what a kWh costs there and what it emits (docs/billing.md, Energy): order-of-magnitude
# figures for a data centre's supply, USD per kWh and kg CO2e per kWh of grid electricity (EU average
# intensity about 0.25; US east, PJM, about 0.38). Replace with your own contract and your grid's factor.
# (label, price per kWh, kg CO2e per kWh)
DEMO_LOCATIONS = [("eu-west-dc1", Decimal("0.21"), Decimal("0.25")), ("us-east-dc2", Decimal("0.11"), Decimal("0.38"))]
# From the rate card's start: the demo's whole history has an energy price.
DEMO_RATES_FROM = date(2026, 1, 1)


@dataclass(frozen=True)
class DemoLogin:
    role: str
    username: str
    password: str


# globex trains in a namespace of its own, on a node of its own: the demo scripts a spend spike there
# (config/demo.py) for its spend-anomaly alert rule to find.
_TRAINING_NAMESPACES = {"globex": ["globex-training"]}
DEMO_ALERT_RULE = "GPU spend spikes per namespace"
DEMO_SAVED_VIEW = "GPU cost this month"
DEMO_REPORT_RECIPIENT = "finance@example.com"


def demo_namespaces(slug: str) -> list[str]:
    return [f"{slug}-prod", f"{slug}-staging", *_TRAINING_NAMESPACES.get(slug, [])]


def load_demo_data(*, now: datetime, budget_webhook_url: str = "", budget_webhook_secret: str = "",
                   alert_webhook_url: str = "", slack_url: str = "", nodes: Sequence[str] = ()) -> list[DemoLogin]:
    """Idempotent. `nodes` are placed in the demo's locations, the first half in the first. With a webhook URL, acme also gets a generous monthly budget that notifies by
    email and by that webhook, so an admin can lower it and watch enforcement happen. With an
    alert webhook and a Slack URL, finance has a spend-anomaly rule that tells by e-mail and both."""
    with transaction.atomic():
        tiers = {}
        for slug, name, weight, description in SLA_TIERS:
            tiers[slug], _ = SlaTier.objects.get_or_create(
                slug=slug, defaults={"name": name, "weight": weight, "description": description,
                                     **default_miss_targets(slug)}
            )
        tenants = {}
        for slug, name, tier in DEMO_TENANTS:
            tenants[slug], _ = Tenant.objects.get_or_create(
                slug=slug, defaults={"name": name, "default_sla_tier": tiers[tier], **DEMO_INVOICE_TERMS.get(slug, {})}
            )
            # The simulated agents run each tenant's pods in <slug>-prod and <slug>-staging
            # (agents/backends/sim.py): the service bills by this mapping, not by the agents' claim.
            missing = [n for n in demo_namespaces(slug) if n not in tenants[slug].namespaces]
            if missing:
                set_tenant_namespaces(slug=slug, namespaces=[*tenants[slug].namespaces, *missing], now=now,
                                      actor_label="demo")
        Tenant.objects.get_or_create(slug="unattributed", defaults={"name": UNATTRIBUTED_NAME})
        # Only an approved model may be priced (billing.services.pricing.gpu_models).
        GpuModel.objects.get_or_create(name=A100_80GB_MODEL, defaults={"approved_at": now, "approved_by": "demo"})
        if not RateCard.objects.filter(gpu_model=A100_80GB_MODEL).exists():
            card = RateCard.objects.create(
                gpu_model=A100_80GB_MODEL,
                currency="USD",
                price_per_gpu_hour=A100_80GB_PRICE_PER_GPU_HOUR,
                effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                source_url=A100_80GB_SOURCE_URL,
                source_note=A100_80GB_SOURCE_NOTE,
            )
            record_audit_event(
                at=now, actor_label="demo", action="rate_card.created", object_type="rate_card",
                object_id=str(card.pk), before=None,
                after={"gpu_model": card.gpu_model, "price_per_gpu_hour": str(card.price_per_gpu_hour),
                       "currency": card.currency},
            )
        _locations(now=now, nodes=nodes)
        finance_group, _ = Group.objects.get_or_create(name=FINANCE_GROUP)
        admin_group, _ = Group.objects.get_or_create(name=ADMIN_GROUP)
        logins = []
        for role, username, group, staff in (
            ("finance", "finance", finance_group, False),
            ("tenant member (acme)", "acme-engineer", None, False),
            ("admin", "admin", admin_group, True),
        ):
            password = secrets.token_urlsafe(9)
            user, _ = User.objects.get_or_create(username=username)
            user.set_password(password)
            user.is_staff = staff
            user.is_superuser = staff
            user.save()
            if group is not None:
                user.groups.add(group)
            else:
                TenantMembership.objects.get_or_create(user=user, tenant=tenants["acme"])
            logins.append(DemoLogin(role=role, username=username, password=password))
    if budget_webhook_url:
        values = {"amount": Decimal("3000"), "currency": "USD", "hard_action": "throttle",
                  "throttle_factor": Decimal("0.5"), "owner": "finops@acme.example",
                  "notify_emails": "finops@acme.example", "webhook_url": budget_webhook_url,
                  "webhook_secret": budget_webhook_secret}
        set_budget(tenant_slug="acme", values=values, now=now, actor_label="demo")
    if alert_webhook_url and slack_url:
        _alert_rule(now=now, webhook_url=alert_webhook_url, webhook_secret=budget_webhook_secret, slack_url=slack_url)
    _saved_view(now=now)
    return logins


def _saved_view(*, now: datetime) -> None:
    """Finance's dashboard of this month, saved and mailed daily at this hour. The schedule is set as
    of the hour's start, so today's occurrence is due at once and the first report lands in the
    demo's mail folder within a minute of the worker starting (docs/saved-views.md)."""
    finance = User.objects.get(username="finance")
    if SavedView.objects.filter(owner=finance, name=DEMO_SAVED_VIEW).exists():
        return
    today, hour = now.date(), now.replace(minute=0, second=0, microsecond=0)
    view = create_view(owner_id=finance.pk, name=DEMO_SAVED_VIEW, path="/finance/",
                       query=urlencode({"start": today.replace(day=1).isoformat(), "end": today.isoformat()}),
                       period="this-month", now=now, actor_label="demo")
    set_schedule(view_id=view.pk, owner_id=finance.pk, now=hour, actor_label="demo",
                 values=ScheduleInput(frequency="daily", hour=hour.hour, weekday=None, day_of_month=None,
                                      format="csv", recipients=(DEMO_REPORT_RECIPIENT,)))


def _locations(*, now: datetime, nodes: Sequence[str]) -> None:
    """The demo's locations with their rates from DEMO_RATES_FROM, written directly: an admin's rate starts
    tomorrow at the earliest (billing.services.fleet), but seed data describes the demo's past too. Audited."""
    places = []
    for label, price, factor in DEMO_LOCATIONS:
        location, created = Location.objects.get_or_create(label=label, defaults={"created_at": now})
        if created:
            LocationRate.objects.create(location=location, effective_from=DEMO_RATES_FROM, price_per_kwh=price,
                                        currency="USD", co2e_kg_per_kwh=factor, created_at=now)
            record_audit_event(at=now, actor_label="demo", action="location.rate_set", object_type="location",
                               object_id=label, before=None,
                               after={"location": label, "effective_from": DEMO_RATES_FROM.isoformat(),
                                      "price_per_kwh": str(price), "currency": "USD", "co2e_kg_per_kwh": str(factor)})
        places.append(location)
    half = (len(nodes) + 1) // 2
    for i, name in enumerate(nodes):
        node, _ = Node.objects.get_or_create(name=name)
        if not NodeLocation.objects.filter(node=node).exists():
            NodeLocation.objects.create(node=node, location=places[0 if i < half else 1],
                                        effective_from=FIRST_LOCATION_FROM, created_at=now)


def _alert_rule(*, now: datetime, webhook_url: str, webhook_secret: str, slack_url: str) -> None:
    """Spend spikes per namespace, hour by hour against the previous 4 weeks, telling finance by every way."""
    if AlertRule.objects.filter(name=DEMO_ALERT_RULE).exists():
        return
    save_alert_rule(values={
        "name": DEMO_ALERT_RULE, "kind": "spend_anomaly", "group_by": "namespace", "granularity": "hour",
        "baseline_weeks": 4, "threshold": Decimal("3.5"), "min_amount": Decimal("2.00"), "currency": "USD",
        "window_hours": 24, "resource": "memory", "notify_emails": "finance@example.com", "webhook_url": webhook_url,
        "webhook_secret": webhook_secret, "slack_webhook_url": slack_url, "enabled": True,
    }, now=now, actor_label="demo")
