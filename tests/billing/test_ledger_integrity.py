"""No batch and no outage stops the money path (docs/reliability.md): a batch the rollup cannot roll up is
quarantined while every other batch, even one sharing its GPU-minute, is billed; /healthz says so
and says when the rollup falls behind; a database or Redis outage answers 503 with Retry-After."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import kombu.exceptions
import pytest
from django.core.management import call_command
from django.db import OperationalError, connection

from billing.ledger.models import GpuMinute, UsageBatch, UsageMinute
from billing.ledger.rollup import rebuild_ledger
from billing.models import AuditEvent
from billing.services.ingest.rollup import run_rollup
from tests import clock
from tests.conftest import healthz_as_admin, make_batch

pytestmark = pytest.mark.django_db


def poison(batch_seq: int) -> None:
    """A stored batch whose samples the ledger cannot hold, as a batch accepted by an older
    version (before its fields were bounded) would be."""
    with connection.cursor() as cur:
        cur.execute("UPDATE billing_raw_sample SET pcie_mb = 1e25 WHERE batch_id = "
                    "(SELECT id FROM billing_usagebatch WHERE batch_seq = %s)", [batch_seq])


def cure(batch_seq: int) -> None:
    with connection.cursor() as cur:
        cur.execute("UPDATE billing_raw_sample SET pcie_mb = 1 WHERE batch_id = "
                    "(SELECT id FROM billing_usagebatch WHERE batch_seq = %s)", [batch_seq])


def pods_in(minute) -> set[str]:
    return set(UsageMinute.objects.filter(minute=minute).values_list("pod", flat=True))


@pytest.fixture
def poisoned_neighbour(post_batch, minute_start, one_usd_per_gpu_second):
    """Batch 1 (pod bert-1) is poisoned; batch 2 (pod llm-1) follows it in the same GPU-minute."""
    assert post_batch(make_batch(start=minute_start, seq=1)).status_code == 201
    good = [{"gpu": 0, "tenant": "globex", "pod": "llm-1", "mem_used": 100.0, "mem_granted": 100.0,
             "sm_used": 1.0, "sm_granted": 1.0}]
    assert post_batch(make_batch(start=minute_start + timedelta(seconds=10), seq=2, workloads=good)).status_code == 201
    poison(1)


def test_a_poisoned_batch_is_quarantined_and_its_neighbour_in_the_same_minute_is_billed(
        client, poisoned_neighbour, minute_start):
    result = run_rollup(now=clock.now())
    assert (result.batches, result.quarantined) == (1, 1)
    poisoned = UsageBatch.objects.get(batch_seq=1)
    assert poisoned.quarantined_at is not None
    assert "numeric field overflow" in poisoned.quarantine_error
    assert UsageBatch.objects.get(batch_seq=2).rolled_up_at is not None
    assert pods_in(minute_start) == {"llm-1"}
    assert GpuMinute.objects.get(minute=minute_start).metered_seconds == 10  # the good batch's window alone
    audit = AuditEvent.objects.get(action="usage_batch.quarantined")
    assert audit.object_id == "gpu-node-1/1"
    assert audit.after is not None
    assert "numeric field overflow" in audit.after["error"]
    health = healthz_as_admin().json()
    assert health["ledger"]["ok"] is False
    assert health["ledger"]["quarantined_batches"] == 1
    assert "redrive_batches" in health["ledger"]["error"]


def test_billing_goes_on_after_a_quarantine_and_a_rebuild_leaves_the_batch_out(
        post_batch, poisoned_neighbour, minute_start):
    run_rollup(now=clock.now())
    later = minute_start + timedelta(minutes=2)
    assert post_batch(make_batch(start=later, seq=3)).status_code == 201
    assert run_rollup(now=clock.now()).batches == 1
    assert pods_in(later) == {"bert-1"}
    rebuild_ledger(start=minute_start, end=minute_start + timedelta(minutes=5))
    assert pods_in(minute_start) == {"llm-1"}


def test_a_quarantined_batch_re_driven_after_the_fix_is_billed_once(poisoned_neighbour, minute_start, capsys):
    run_rollup(now=clock.now())
    call_command("redrive_batches")  # lists
    assert "gpu-node-1\t1\t" in capsys.readouterr().out
    cure(1)
    call_command("redrive_batches", "--node", "gpu-node-1")
    assert "re-driven 1 batch(es)" in capsys.readouterr().out
    assert AuditEvent.objects.filter(action="usage_batch.redriven", object_id="gpu-node-1/1").count() == 1
    assert run_rollup(now=clock.now()).batches == 1
    assert pods_in(minute_start) == {"bert-1", "llm-1"}
    assert GpuMinute.objects.get(minute=minute_start).metered_seconds == 20
    assert run_rollup(now=clock.now()).batches == 0  # nothing left, nothing twice


def test_re_driving_a_batch_that_is_not_quarantined_changes_nothing(poisoned_neighbour):
    from django.core.management.base import CommandError

    run_rollup(now=clock.now())
    good = UsageBatch.objects.get(batch_seq=2).pk
    with pytest.raises(CommandError, match="not quarantined"):
        call_command("redrive_batches", "--id", str(good), "--id", str(UsageBatch.objects.get(batch_seq=1).pk))
    assert UsageBatch.objects.get(batch_seq=1).quarantined_at is not None
    assert not AuditEvent.objects.filter(action="usage_batch.redriven").exists()


def test_healthz_turns_degraded_when_the_rollup_falls_behind(client, post_batch, minute_start, settings):
    settings.VGPU_HEALTH_MAX_ROLLUP_LAG_S = 300
    assert post_batch(make_batch(start=minute_start)).status_code == 201
    ledger = healthz_as_admin().json()["ledger"]
    assert ledger["ok"]
    assert ledger["backlog_batches"] == 1
    UsageBatch.objects.update(received_at=clock.now() - timedelta(minutes=6))
    ledger = healthz_as_admin().json()["ledger"]
    assert not ledger["ok"]
    assert ledger["rollup_lag_s"] >= 360
    assert "behind" in ledger["error"]
    run_rollup(now=clock.now())
    ledger = healthz_as_admin().json()["ledger"]
    assert (ledger["ok"], ledger["backlog_batches"], ledger["rollup_lag_s"]) == (True, 0, 0)


def test_readyz_needs_only_the_database(client):
    resp = client.get("/readyz")  # no Celery worker runs here: /healthz is degraded, the web is ready
    assert resp.status_code == 200
    assert resp.json()["database"]["ok"]
    assert healthz_as_admin().status_code == 503


def test_ingest_with_the_database_down_is_503_json_with_retry_after(post_batch, minute_start):
    down = OperationalError("connection to server at 127.0.0.1, port 5432 failed: Connection refused")
    with mock.patch("billing.api.agent.authenticate_node", side_effect=down):
        resp = post_batch(make_batch(start=minute_start))
    assert resp.status_code == 503
    assert resp["Retry-After"].isdigit()
    assert "the database is unavailable" in resp.json()["errors"][0]["message"]
    assert not UsageBatch.objects.exists()


@pytest.mark.django_db(transaction=True)  # the enqueue runs on commit, inside the request
def test_a_page_that_needs_redis_while_it_is_down_is_503_not_500(client, settings):
    from tests.conftest import user_in

    client.force_login(user_in("finance"))
    start = (clock.now() - timedelta(days=2)).date()
    with mock.patch("billing.tasks.run_paired_report.delay",
                    side_effect=kombu.exceptions.OperationalError("Error 111 connecting to 127.0.0.1:6379")):
        resp = client.post("/reports/", {"start": start.isoformat(), "end": (start + timedelta(days=1)).isoformat()})
    assert resp.status_code == 503
    assert "task queue" in resp.content.decode()
    assert resp["Retry-After"]
    from billing.models import PairedReport

    report = PairedReport.objects.get()  # not left pending forever: it says why, and what to do
    assert report.status == "failed"
    assert "could not be queued" in report.error


def test_admins_see_each_nodes_quarantined_batches_with_their_error(client, poisoned_neighbour):
    from tests.conftest import user_in

    run_rollup(now=clock.now())
    client.force_login(user_in("platform-admin"))
    page = client.get("/nodes/").content.decode()
    cell = page[page.index('data-testid="node-quarantined-gpu-node-1"'):]
    cell = cell[:cell.index("</td>\n  </tr>")]
    assert 'data-count="1"' in cell
    assert "1 batch quarantined" in cell
    assert 'data-testid="quarantined-gpu-node-1-1"' in cell
    assert "numeric field overflow" in cell
    assert "redrive_batches --id" in page
