"""The export destinations page: each destination as the page shows it (its key only as a hint, and
whether the stored key can still be read) and the latest deliveries (docs/exports.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime

from billing.models import ExportDelivery, ExportDestination
from billing.scope import Scope
from billing.services.exports import credentials_readable, object_keys

__all__ = ["DeliveryView", "DestinationView", "DestinationsPage", "get_destinations_page"]

HISTORY = 50


@dataclass(frozen=True)
class DestinationView:
    id: int
    name: str
    endpoint_url: str
    region: str
    bucket: str
    prefix: str
    key_hint: str  # "" when the worker's own credentials are used
    credentials_readable: bool
    enabled: bool
    retired_at: datetime | None
    example_key: str  # where this month's CSV goes, to show the layout

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


@dataclass(frozen=True)
class DeliveryView:
    destination: str
    month: date
    at: datetime
    status: str
    status_label: str
    objects: int
    rows: int
    final: bool
    error: str
    trigger: str


@dataclass(frozen=True)
class DestinationsPage:
    destinations: list[DestinationView]
    deliveries: list[DeliveryView]
    may_change: bool


def get_destinations_page(*, scope: Scope, today: date) -> DestinationsPage:
    """Destinations (retired ones last) and the newest deliveries; nothing outside the platform's scope."""
    if not scope.sees_platform:
        return DestinationsPage(destinations=[], deliveries=[], may_change=False)
    month = today.replace(day=1)
    views = [DestinationView(
        id=d.pk, name=d.name, endpoint_url=d.endpoint_url, region=d.region, bucket=d.bucket, prefix=d.prefix,
        key_hint=d.access_key_hint, credentials_readable=credentials_readable(d.credentials), enabled=d.enabled,
        retired_at=d.retired_at, example_key=object_keys(d.prefix, month)["csv"],
    ) for d in ExportDestination.objects.order_by("retired_at", "name")]
    deliveries = [DeliveryView(
        destination=x.destination.name, month=x.month, at=x.at, status=x.status,
        status_label=str(ExportDelivery.Status(x.status).label), objects=len(x.objects_written), rows=x.rows,
        final=x.final, error=x.error, trigger=x.trigger,
    ) for x in ExportDelivery.objects.select_related("destination").order_by("-at", "-id")[:HISTORY]]
    return DestinationsPage(destinations=views, deliveries=deliveries, may_change=scope.is_admin)
