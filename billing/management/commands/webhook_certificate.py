"""manage.py webhook_certificate: the admission webhook's CA and serving certificate, made and
renewed without a certificate operator (billing/services/identity/webhook_tls.py)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from billing.services.identity import (
    CertificateError,
    DirectoryStore,
    KubernetesStore,
    apply_webhook_certificates,
    kube_api_client,
    service_dns_names,
)


class Command(BaseCommand):
    help = ("Create or renew the admission webhook's CA and serving certificate: write PEM files (--out DIR), or "
            "store them in the cluster (--apply: the TLS Secret, the CA Secret and the webhook configuration's "
            "caBundle). Safe to re-run: a valid CA is kept, the serving certificate renewed near its expiry.")
    # It serves nothing and opens no database: the service's checks (admission credentials and the
    # like) are for the processes that do, and would only be noise in the certificate Job.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--out", type=Path, metavar="DIR", help="write ca.crt, ca.key, tls.crt, tls.key here")
        target.add_argument("--apply", action="store_true", help="store them through the Kubernetes API")
        parser.add_argument("--service", default="vgpu-ledger-web", help="the webhook's Service (default %(default)s)")
        parser.add_argument("--namespace", default="vgpu-ledger", help="its namespace (default %(default)s)")
        parser.add_argument("--dns-name", action="append", default=[], metavar="NAME",
                            help="another name for the certificate (repeatable)")
        parser.add_argument("--secret", default="vgpu-ledger-webhook-tls",
                            help="the kubernetes.io/tls Secret the web pods mount (default %(default)s)")
        parser.add_argument("--ca-secret", default="vgpu-ledger-webhook-ca",
                            help="the Secret holding the CA and its key (default %(default)s)")
        parser.add_argument("--webhook-configuration", default="vgpu-ledger-budgets",
                            help="the ValidatingWebhookConfiguration to give the caBundle (default %(default)s)")
        parser.add_argument("--kube-api", default="", metavar="URL",
                            help="the API server's URL (default: VGPU_KUBE_API, else the in-cluster configuration)")
        parser.add_argument("--valid-days", type=int, default=90, help="serving certificate lifetime (default 90)")
        parser.add_argument("--renew-days", type=int, default=30,
                            help="renew when fewer days than this are left (default 30)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["valid_days"] < 1 or options["renew_days"] < 0:
            raise CommandError("--valid-days must be at least 1 and --renew-days at least 0")
        names = service_dns_names(service=options["service"], namespace=options["namespace"],
                                  extra=options["dns_name"])
        try:
            store = DirectoryStore(options["out"]) if options["out"] else KubernetesStore(
                kube_api_client(options["kube_api"]), namespace=options["namespace"],
                tls_secret=options["secret"], ca_secret=options["ca_secret"],
                webhook_configuration=options["webhook_configuration"])
            planned, changes = apply_webhook_certificates(
                store=store, dns_names=names, now=timezone.now(),
                serving_validity=timedelta(days=options["valid_days"]),
                renew_before=timedelta(days=options["renew_days"]))
        except CertificateError as exc:
            raise CommandError(str(exc)) from exc
        ca, serving = planned.ca.certificate, planned.serving.certificate
        self.stdout.write(f"CA {'issued' if planned.ca_issued else 'kept'}, valid until "
                          f"{ca.not_valid_after_utc.isoformat()}")
        self.stdout.write(f"serving certificate {'issued' if planned.serving_issued else 'kept'} for "
                          f"{', '.join(names)}, valid until {serving.not_valid_after_utc.isoformat()}")
        for reason in planned.reasons:
            self.stdout.write(f"  because: {reason}")
        for change in changes:
            self.stdout.write(change)
        if not changes:
            self.stdout.write("nothing to change")
