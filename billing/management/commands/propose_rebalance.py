from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from billing.services.fleet import propose_rebalance


class Command(BaseCommand):
    help = "Store a dry-run pool rebalance plan from the fleet's current state (what the hourly task does)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--max-moves", type=int, default=settings.VGPU_REBALANCE_MAX_MOVES)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["max_moves"] < 1:
            raise CommandError("--max-moves must be at least 1")
        plan = propose_rebalance(now=timezone.now(), max_moves=options["max_moves"],
                                 window=timedelta(hours=settings.VGPU_REBALANCE_WINDOW_HOURS))
        if plan is None:
            self.stdout.write("no plan: the ledger shows no GPU in use")
            return
        self.stdout.write(f"plan {plan.pk}: {plan.nodes_freed} node(s) emptied with {len(plan.moves)} eviction(s), "
                          f"{plan.summary.get('gpus_released', 0)} GPU(s) handed back; "
                          f"{plan.projected_savings} {plan.currency}/month")
