"""manage.py tenant_namespaces SLUG [NAMESPACE ...]: show or set the namespaces a tenant owns.

Usage is billed by this mapping, not by the tenant an agent names (billing.services.ingest.tenant_mapping).
Without namespaces it prints the current list; `--set` replaces it (audited; `--set` alone clears it).
"""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from billing.errors import InvalidInput
from billing.models import Tenant
from billing.services.ingest import set_tenant_namespaces


class Command(BaseCommand):
    help = "Show or set (--set) the Kubernetes namespaces a tenant owns; samples in them are billed to it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("namespaces", nargs="*")
        parser.add_argument("--set", action="store_true", help="replace the tenant's namespaces with those given")

    def handle(self, *args: Any, **options: Any) -> None:
        slug = options["slug"]
        if not options["set"]:
            if options["namespaces"]:
                raise CommandError("give --set to change the namespaces")
            tenant = Tenant.objects.filter(slug=slug).first()
            if tenant is None:
                raise CommandError(f"no tenant {slug!r}")
            self.stdout.write(" ".join(tenant.namespaces) or "(none besides the namespace named like the slug)")
            return
        try:
            listed = set_tenant_namespaces(slug=slug, namespaces=options["namespaces"], now=timezone.now(),
                                           actor_label="cli")
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"{slug}: {' '.join(listed) or '(none)'}")
