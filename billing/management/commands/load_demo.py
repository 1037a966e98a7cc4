import os
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from billing.services.demo import load_demo_data


class Command(BaseCommand):
    help = "Load the demo data set (tiers, tenants, A100 rate card, one user per role) and print the logins."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--budget-webhook-url", default="",
                            help="also give acme a budget that notifies this webhook (secret from "
                                 "VGPU_DEMO_WEBHOOK_SECRET)")

    def handle(self, *args: Any, **options: Any) -> None:
        logins = load_demo_data(now=timezone.now(), budget_webhook_url=options["budget_webhook_url"],
                                budget_webhook_secret=os.environ.get("VGPU_DEMO_WEBHOOK_SECRET", ""))
        for login in logins:
            self.stdout.write(f"{login.role:<22} user {login.username:<14} password {login.password}")
