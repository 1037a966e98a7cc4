import os
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from billing.services.demo import load_demo_data


class Command(BaseCommand):
    help = ("Load the demo data set (tiers, tenants, A100 rate card, locations with energy prices, one user per "
            "role) and print the logins.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--budget-webhook-url", default="",
                            help="also give acme a budget that notifies this webhook (secret from "
                                 "VGPU_DEMO_WEBHOOK_SECRET)")
        parser.add_argument("--alert-webhook-url", default="",
                            help="with --slack-url: a spend-anomaly alert rule that tells finance by e-mail, this "
                                 "signed webhook and that Slack-compatible webhook")
        parser.add_argument("--slack-url", default="", help="a Slack-compatible incoming webhook for the alert rule")
        parser.add_argument("--node", action="append", default=[],
                            help="a demo node to place in the demo's locations (repeat; the first half in the first)")

    def handle(self, *args: Any, **options: Any) -> None:
        logins = load_demo_data(now=timezone.now(), budget_webhook_url=options["budget_webhook_url"],
                                budget_webhook_secret=os.environ.get("VGPU_DEMO_WEBHOOK_SECRET", ""),
                                alert_webhook_url=options["alert_webhook_url"], slack_url=options["slack_url"],
                                nodes=options["node"])
        for login in logins:
            self.stdout.write(f"{login.role:<22} user {login.username:<14} password {login.password}")
