from django.core.management.base import BaseCommand
from django.utils import timezone

from billing.services.demo import load_demo_data


class Command(BaseCommand):
    help = "Load the demo data set (tiers, tenants, A100 rate card, one user per role) and print the logins."

    def handle(self, *args, **options):
        for login in load_demo_data(now=timezone.now()):
            self.stdout.write(f"{login.role:<22} user {login.username:<14} password {login.password}")
