"""Delivery of the fleet FOCUS dataset to S3-compatible object storage, where BI tools read it
(docs/exports.md, Delivery to object storage), with boto3.

Every month that can still change (`months_to_write`, as the local files) goes to every enabled
destination, under its prefix, one folder per format so each is a table of its own with the month as
a Hive-style partition:

    <prefix>csv/billing_period=YYYY-MM/vgpu-ledger-focus-1.3-YYYY-MM.csv
    <prefix>parquet/billing_period=YYYY-MM/vgpu-ledger-focus-1.3-YYYY-MM.parquet
    <prefix>metadata/billing_period=YYYY-MM/focus-metadata.json
    <prefix>metadata/billing_period=YYYY-MM/manifest.json      (last: the month's files are all there)

Idempotent: each object carries its SHA-256 in its metadata, and an object whose stored SHA-256 is the
file's is not sent again; the manifest is sent when anything else was, or when the month became final.
So a second run sends nothing and records the month as unchanged. Each attempt is an ExportDelivery
row (delivered, unchanged or failed with the reason), the destinations page's history; a failure at one
destination never stops the others, and the next run tries again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from django.db.models import Q

from billing.errors import InvalidInput
from billing.models import ExportDelivery, ExportDestination
from billing.services.exports.credentials import CredentialsUnreadable, unseal
from billing.services.exports.destinations import check_endpoint
from billing.services.exports.focus_dataset import (
    MANIFEST,
    METADATA,
    DatasetFiles,
    build_dataset_files,
    dataset_file_names,
    months_to_write,
)

if TYPE_CHECKING:  # the stubs are a development dependency
    from mypy_boto3_s3 import S3Client

__all__ = ["deliver_focus_dataset", "object_keys"]

_ERROR_MAX = 1000
_TIMEOUTS = Config(connect_timeout=10, read_timeout=120, retries={"max_attempts": 3, "mode": "standard"})


@dataclass(frozen=True)
class _Object:
    key: str
    body: bytes
    content_type: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()


def object_keys(prefix: str, month: date) -> dict[str, str]:
    """Where each file of a month goes: {"csv", "parquet", "metadata", "manifest"} -> key."""
    partition = f"billing_period={month:%Y-%m}"
    csv_name, parquet_name = dataset_file_names(month)
    return {"csv": f"{prefix}csv/{partition}/{csv_name}", "parquet": f"{prefix}parquet/{partition}/{parquet_name}",
            "metadata": f"{prefix}metadata/{partition}/{METADATA}", "manifest": f"{prefix}metadata/{partition}/{MANIFEST}"}


def _client(destination: ExportDestination) -> S3Client:
    """A client for the destination: its sealed key, or the worker's own credentials when none is stored.
    Custom endpoints are addressed path-style (s3-compatible servers seldom serve bucket subdomains)."""
    credentials = unseal(destination.credentials) if destination.credentials else {}
    config = _TIMEOUTS.merge(Config(s3={"addressing_style": "path" if destination.endpoint_url else "auto"}))
    return boto3.session.Session().client(
        "s3", endpoint_url=destination.endpoint_url or None, region_name=destination.region,
        aws_access_key_id=credentials.get("access_key_id"), aws_secret_access_key=credentials.get("secret_access_key"),
        config=config)


def _stored(client: S3Client, bucket: str, key: str) -> dict[str, str] | None:
    """The object's user metadata, None when there is no such object."""
    try:
        return client.head_object(Bucket=bucket, Key=key)["Metadata"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def _deliver_month(client: S3Client, destination: ExportDestination, dataset: DatasetFiles, *,
                   now: datetime) -> list[dict[str, object]]:
    """Send what the bucket does not hold yet; the keys written, with their SHA-256 and size."""
    keys = object_keys(destination.prefix, dataset.month)
    files = [_Object(keys["csv"], dataset.csv, "text/csv; charset=utf-8"),
             _Object(keys["parquet"], dataset.parquet, "application/vnd.apache.parquet"),
             _Object(keys["metadata"], dataset.metadata, "application/json")]
    written: list[dict[str, object]] = []
    for obj in files:
        stored = _stored(client, destination.bucket, obj.key)
        if stored is None or stored.get("sha256") != obj.sha256:
            _put(client, destination.bucket, obj, final=dataset.final)
            written.append({"key": obj.key, "sha256": obj.sha256, "bytes": len(obj.body)})
    stored_manifest = _stored(client, destination.bucket, keys["manifest"])
    final = "true" if dataset.final else "false"
    if written or stored_manifest is None or stored_manifest.get("final") != final:
        manifest = dataset.manifest(written_at=now, files={
            obj.key.rsplit("/", 1)[1]: {"sha256": obj.sha256, "bytes": len(obj.body)} for obj in files[:2]})
        obj = _Object(keys["manifest"], manifest, "application/json")
        _put(client, destination.bucket, obj, final=dataset.final)
        written.append({"key": obj.key, "sha256": obj.sha256, "bytes": len(obj.body)})
    return written


def _put(client: S3Client, bucket: str, obj: _Object, *, final: bool) -> None:
    client.put_object(Bucket=bucket, Key=obj.key, Body=obj.body, ContentType=obj.content_type,
                      Metadata={"sha256": obj.sha256, "final": "true" if final else "false"})


def _error_text(exc: Exception) -> str:
    """What went wrong, for the history: the service's or the connection's message, never a credential."""
    return f"{type(exc).__name__}: {exc}"[:_ERROR_MAX]


def deliver_focus_dataset(*, now: datetime, horizon: timedelta, trigger: str,
                          destination_ids: list[int] | None = None) -> list[ExportDelivery]:
    """Deliver every month that can still change to every enabled destination (or to those of
    `destination_ids`), recording one ExportDelivery per destination and month. Each month's files are
    built once, from one read of the ledger, for all destinations."""
    destinations = ExportDestination.objects.filter(enabled=True, retired_at__isnull=True)
    if destination_ids is not None:
        destinations = destinations.filter(Q(pk__in=destination_ids))
    chosen = list(destinations.order_by("id"))
    if not chosen:
        return []
    datasets = [build_dataset_files(month, now=now, horizon=horizon) for month in months_to_write(now=now, horizon=horizon)]
    deliveries = []
    for destination in chosen:
        try:
            check_endpoint(destination.endpoint_url)  # again: what it resolves to may have changed since it was saved
            client = _client(destination)
        except (InvalidInput, CredentialsUnreadable, BotoCoreError) as exc:
            deliveries += [_record(destination, d, now=now, trigger=trigger, error=_error_text(exc)) for d in datasets]
            continue
        for dataset in datasets:
            try:
                written = _deliver_month(client, destination, dataset, now=now)
            except (BotoCoreError, ClientError) as exc:
                deliveries.append(_record(destination, dataset, now=now, trigger=trigger, error=_error_text(exc)))
            else:
                deliveries.append(_record(destination, dataset, now=now, trigger=trigger, written=written))
    return deliveries


def _record(destination: ExportDestination, dataset: DatasetFiles, *, now: datetime, trigger: str,
            written: list[dict[str, object]] | None = None, error: str = "") -> ExportDelivery:
    if error:
        status = ExportDelivery.Status.FAILED
    else:
        status = ExportDelivery.Status.DELIVERED if written else ExportDelivery.Status.UNCHANGED
    return ExportDelivery.objects.create(
        destination=destination, month=dataset.month, at=now, status=status, objects_written=written or [],
        rows=dataset.rows, final=dataset.final, error=error, trigger=trigger[:150])
