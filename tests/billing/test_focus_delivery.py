"""The fleet FOCUS dataset delivered to S3-compatible object storage (docs/exports.md, Delivery to
object storage), against a real local S3-compatible server: moto's server mode (`moto[server]`) in its
own process on loopback, spoken to by boto3 over HTTP. The dataset lands there as CSV, Parquet,
FOCUS metadata and a manifest; a second run sends nothing; new usage or a month turning final sends
exactly what changed; a failing destination is recorded and never stops another; destinations are
checked, audited and never show their secret; the pages are for finance and admins."""

from __future__ import annotations

import hashlib
import io
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import boto3
import pyarrow.parquet as pq
import pytest
from django.test import Client

from billing import tasks
from billing.calendar import month_of
from billing.errors import InvalidInput
from billing.ledger.rollup import rollup_usage
from billing.models import AuditEvent, BillingPeriod, ExportDelivery, ExportDestination
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from billing.services.exports import DestinationInput, object_keys, retire_destination, save_destination
from billing.services.exports.focus_dataset import build_dataset_files
from tests import clock
from tests.conftest import make_batch, user_in

pytestmark = pytest.mark.django_db

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
KEY_ID = "AKIAEXAMPLE0001"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3-compatible server in its own process, on a free loopback port, for this module."""
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                pytest.fail("moto's server did not start")
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture
def bucket(s3_endpoint: str, settings: Any, request: pytest.FixtureRequest) -> Any:
    """A fresh bucket on the server (one per test), and the loopback server allow-listed."""
    settings.VGPU_EXPORT_ALLOWED_HOSTS = ["127.0.0.1"]
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="eu-west-1", aws_access_key_id=KEY_ID,
                          aws_secret_access_key=SECRET)
    name = f"finops-{request.node.name.replace('_', '-')[:40].strip('-').lower()}"
    client.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return client, name


def destination(s3_endpoint: str, bucket_name: str, **overrides: Any) -> ExportDestination:
    data = {"name": "BI lake", "endpoint_url": s3_endpoint, "region": "eu-west-1", "bucket": bucket_name,
            "prefix": "finops/gpu", "access_key_id": KEY_ID, "secret_access_key": SECRET, "enabled": True}
    return save_destination(destination_id=None, data=DestinationInput(**{**data, **overrides}), now=clock.now(),
                            actor_label="admin")


@pytest.fixture
def metered(post_batch, one_usd_per_gpu_second, minute_start) -> None:
    assert post_batch(make_batch(start=minute_start, seconds=30)).status_code == 201
    rollup_usage(now=clock.now())


def objects(client: Any, bucket_name: str) -> dict[str, tuple[str, Any]]:
    listed = client.list_objects_v2(Bucket=bucket_name).get("Contents", [])
    return {o["Key"]: (o["ETag"], o["LastModified"]) for o in listed}


def body(client: Any, bucket_name: str, key: str) -> bytes:
    return bytes(client.get_object(Bucket=bucket_name, Key=key)["Body"].read())


def test_the_focus_dataset_lands_in_the_local_s3_compatible_server(s3_endpoint, bucket, metered, settings):
    client, name = bucket
    destination(s3_endpoint, name)
    result = tasks.deliver_focus_dataset()
    month = month_of(clock.now())
    keys = object_keys("finops/gpu/", month)
    assert {r["month"] for r in result} >= {f"{month:%Y-%m}"}
    stored = objects(client, name)
    assert set(keys.values()) <= set(stored)
    assert keys["csv"] == f"finops/gpu/csv/billing_period={month:%Y-%m}/vgpu-ledger-focus-1.3-{month:%Y-%m}.csv"
    # What landed is the dataset itself: the CSV byte for byte, the Parquet file with the same rows and
    # exact decimals, FOCUS's metadata, and a manifest with their checksums.
    expected = build_dataset_files(month, now=clock.now(), horizon=settings.VGPU_LATE_USAGE_HORIZON)
    csv = body(client, name, keys["csv"])
    assert csv == expected.csv
    table = pq.read_table(io.BytesIO(body(client, name, keys["parquet"])))
    assert table.num_rows == expected.rows > 0
    assert sum(table.column("BilledCost").to_pylist(), Decimal(0)) == sum(expected.totals.values(), Decimal(0))
    assert json.loads(body(client, name, keys["metadata"]))["Schemas"][0]["FocusVersion"] == "1.3"
    manifest = json.loads(body(client, name, keys["manifest"]))
    assert manifest["files"][expected.csv_name]["sha256"] == hashlib.sha256(csv).hexdigest()
    assert manifest["final"] is False
    assert client.head_object(Bucket=name, Key=keys["csv"])["Metadata"]["sha256"] == hashlib.sha256(csv).hexdigest()
    delivery = ExportDelivery.objects.get(month=month)
    assert delivery.status == ExportDelivery.Status.DELIVERED
    assert delivery.trigger == "schedule"
    assert [o["key"] for o in delivery.objects_written] == [keys["csv"], keys["parquet"], keys["metadata"],
                                                            keys["manifest"]]


def test_run_it_twice_sends_nothing_the_second_time(s3_endpoint, bucket, metered):
    client, name = bucket
    destination(s3_endpoint, name)
    tasks.deliver_focus_dataset()
    first = objects(client, name)
    time.sleep(1.1)  # LastModified has whole seconds: a second write would show
    again = tasks.deliver_focus_dataset()
    assert {r["status"] for r in again} == {"unchanged"}
    assert objects(client, name) == first
    assert not ExportDelivery.objects.filter(status="unchanged").exclude(objects_written=[]).exists()


def test_new_usage_sends_the_data_files_and_the_manifest_again(s3_endpoint, bucket, metered, post_batch, minute_start):
    client, name = bucket
    destination(s3_endpoint, name)
    tasks.deliver_focus_dataset()
    month = month_of(clock.now())
    keys = object_keys("finops/gpu/", month)
    before = objects(client, name)
    assert post_batch(make_batch(start=minute_start + timedelta(seconds=30), seq=2, seconds=20)).status_code == 201
    rollup_usage(now=clock.now())
    tasks.deliver_focus_dataset()
    after = objects(client, name)
    changed = {k for k in after if after[k][0] != before.get(k, (None,))[0]}
    assert changed == {keys["csv"], keys["parquet"], keys["manifest"]}  # FOCUS's metadata did not change


def test_a_month_turning_final_resends_only_its_manifest(s3_endpoint, bucket, metered, settings):
    client, name = bucket
    destination(s3_endpoint, name)
    tasks.deliver_focus_dataset()
    month = month_of(clock.now())
    keys = object_keys("finops/gpu/", month)
    before = objects(client, name)
    BillingPeriod.objects.create(month=month, status=BillingPeriod.Status.CLOSED)
    settings.VGPU_LATE_USAGE_HORIZON = timedelta(days=-40)  # the month is past it: final
    tasks.deliver_focus_dataset()
    after = objects(client, name)
    assert {k for k in after if after[k][0] != before[k][0]} == {keys["manifest"]}
    assert json.loads(body(client, name, keys["manifest"]))["final"] is True


def test_a_failing_destination_is_recorded_and_never_stops_another(s3_endpoint, bucket, metered):
    client, name = bucket
    bad = destination(s3_endpoint, "no-such-bucket-anywhere", name="Wrong bucket")
    destination(s3_endpoint, name)
    tasks.deliver_focus_dataset()
    failed = ExportDelivery.objects.filter(destination=bad)
    assert {d.status for d in failed} == {"failed"}
    assert all("NoSuchBucket" in d.error and SECRET not in d.error for d in failed)
    assert objects(client, name)
    # Paused and retired destinations get nothing.
    bad.refresh_from_db()
    retire_destination(destination_id=bad.pk, now=clock.now(), actor_label="admin")
    count = ExportDelivery.objects.filter(destination=bad).count()
    tasks.deliver_focus_dataset()
    assert ExportDelivery.objects.filter(destination=bad).count() == count


def test_the_secret_is_sealed_audited_as_a_hint_and_never_shown(s3_endpoint, bucket, client):
    _, name = bucket
    d = destination(s3_endpoint, name)
    assert SECRET not in d.credentials
    assert KEY_ID not in d.credentials
    assert d.access_key_hint == "…0001"
    events = list(AuditEvent.objects.filter(action__startswith="export_destination."))
    assert events
    assert all(SECRET not in json.dumps([e.before, e.after]) and KEY_ID not in json.dumps([e.before, e.after])
               for e in events)
    client.force_login(user_in(ADMIN_GROUP))
    page = client.get("/exports/").content.decode()
    assert "…0001" in page
    assert SECRET not in page
    assert KEY_ID not in page
    # A change that leaves the key blank keeps it; a rotated sealing key makes it unreadable, said so.
    save_destination(destination_id=d.pk, data=DestinationInput(
        name="BI lake", endpoint_url=s3_endpoint, region="eu-west-1", bucket=name, prefix="other", access_key_id="",
        secret_access_key="", enabled=True), now=clock.now(), actor_label="admin")
    d.refresh_from_db()
    assert (d.prefix, d.access_key_hint) == ("other/", "…0001")


def test_a_key_sealed_under_another_key_fails_the_delivery_clearly(s3_endpoint, bucket, metered, settings, client):
    _, name = bucket
    destination(s3_endpoint, name)
    settings.VGPU_CREDENTIALS_KEY = "3q2-7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
    tasks.deliver_focus_dataset()
    assert {(d.status, d.error.split(":")[0]) for d in ExportDelivery.objects.all()} == {
        ("failed", "CredentialsUnreadable")}
    client.force_login(user_in(FINANCE_GROUP))
    assert "unreadable with the current key" in client.get("/exports/").content.decode()


@pytest.mark.parametrize(("overrides", "message"), [
    ({"endpoint_url": "http://127.0.0.2:9"}, "plain http"),
    ({"endpoint_url": "https://127.0.0.2:9"}, "a loopback address"),
    ({"endpoint_url": "https://169.254.169.254"}, "link-local"),
    ({"endpoint_url": "ftp://example.org"}, r"http\(s\) URL"),
    ({"endpoint_url": "https://user:pw@example.org"}, r"http\(s\) URL"),
    ({"bucket": "Bad_Bucket"}, "not a bucket name"),
    ({"bucket": "192.168.0.1"}, "not a bucket name"),
    ({"prefix": "a/../b"}, "without . or .."),
    ({"region": "EU WEST"}, "not a region name"),
    ({"name": " "}, "name is required"),
    ({"access_key_id": "AKIA1", "secret_access_key": ""}, "secret access key is required"),
])
def test_bad_destinations_are_refused_and_nothing_is_written(s3_endpoint, settings, overrides, message):
    settings.VGPU_EXPORT_ALLOWED_HOSTS = ["127.0.0.1"]
    with pytest.raises(InvalidInput, match=message):
        destination(s3_endpoint, "finops-data", **overrides)
    assert not ExportDestination.objects.exists()
    assert not AuditEvent.objects.exists()


def test_only_admins_change_destinations_and_finance_may_deliver_now(s3_endpoint, bucket, monkeypatch):
    _, name = bucket
    form = {"name": "Lake", "endpoint_url": s3_endpoint, "region": "eu-west-1", "bucket": name, "key_prefix": "",
            "access_key_id": KEY_ID, "secret_access_key": SECRET, "enabled": "on"}
    finance, admin, tenant = Client(), Client(), Client()
    finance.force_login(user_in(FINANCE_GROUP))
    admin.force_login(user_in(ADMIN_GROUP))
    tenant.force_login(user_in(tenant="acme"))
    assert tenant.get("/exports/").status_code == 403
    assert finance.get("/exports/").status_code == 200
    assert finance.post("/exports/", form).status_code == 403
    assert admin.post("/exports/", {**form, "bucket": "NO"}).status_code == 400
    assert not ExportDestination.objects.exists()
    assert admin.post("/exports/", form).status_code == 302
    d = ExportDestination.objects.get()
    asked: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks.deliver_focus_dataset, "delay", lambda *args: asked.append(args))
    assert tenant.post(f"/exports/{d.pk}/deliver/").status_code == 403
    assert finance.post(f"/exports/{d.pk}/deliver/").status_code == 302
    assert finance.post(f"/exports/{d.pk + 99}/deliver/").status_code == 400
    assert [a[0] for a in asked] == [d.pk]
    assert admin.post(f"/exports/{d.pk}/retire/", {}).status_code == 400  # no confirmation
    assert admin.post(f"/exports/{d.pk}/retire/", {"confirm": "on"}).status_code == 302
    d.refresh_from_db()
    assert d.retired_at is not None
    assert d.credentials == ""


def test_beat_delivers_daily_after_the_dataset_is_written(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["deliver-focus-dataset"]
    assert entry["task"] == "billing.tasks.deliver_focus_dataset"
