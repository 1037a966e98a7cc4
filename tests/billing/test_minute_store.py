"""The minute ledger is the store of the integrals (docs/billing.md, "Minutes: the store of the
integrals"): the rollup adds a batch's integral rows into it and deletes them in the transaction that
marks the batch rolled up. A batch landing in minutes already rolled up gives the ledger the two
batches rolled together would, every integral sent is in the store exactly, and nothing is left in
the inbox but the rows of batches not rolled up."""

from __future__ import annotations

import importlib
import itertools
from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.batch import Sample
from agents.interfaces import GpuInfo
from billing.ledger.models import UsageBatch, UsageMinute
from billing.ledger.rollup import quarantine_batch, rollup_usage
from billing.models import Node
from billing.services.ingest.rollup import redrive_batches
from tests import clock
from tests.billing.test_integrals_v2 import GPU, START, _document, _ledger_of, _per_second, series
from tests.billing.test_rollup_sharded import keep_inbox
from tests.conftest import make_batch

_example = itertools.count()
_seq = itertools.count(1)


def _card(tag: str) -> GpuInfo:
    return GpuInfo(uuid=f"GPU-store-{tag}", model=GPU.model, memory_mb=GPU.memory_mb, sm_count=GPU.sm_count)


def _moved(samples: list[Sample], base: datetime) -> list[Sample]:
    """The series at `base` instead of START: windows must lie within the late-usage horizon of today."""
    return [Sample(start=base + (s.start - START), seconds=s.seconds, gpu=s.gpu, workload=s.workload,
                   mem_used_mb_s=s.mem_used_mb_s, mem_granted_mb_s=s.mem_granted_mb_s, sm_used_s=s.sm_used_s,
                   sm_granted_s=s.sm_granted_s, pcie_mb=s.pcie_mb) for s in samples]


def _inbox_rows(gpu: GpuInfo) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM billing_raw_sample WHERE gpu_uuid = %s", [gpu.uuid])
        return int(cur.fetchone()[0])


def _stored(gpu: GpuInfo) -> dict[datetime, dict[str, tuple[Decimal, ...]]]:
    """The integrals the store holds for the card, per minute and pod, in _per_second's order."""
    stored: dict[datetime, dict[str, tuple[Decimal, ...]]] = defaultdict(dict)
    for m in UsageMinute.objects.filter(gpu_uuid=gpu.uuid):
        stored[m.minute][m.pod] = (m.seconds, m.mem_used_mb_s, m.mem_granted_mb_s, m.mem_max_mb_s, m.sm_used_s,
                                   m.sm_granted_s, m.sm_max_s, m.pcie_mb)
    return stored


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(samples=series(), cut=st.integers(1, 89), wires=st.tuples(st.sampled_from(["v1", "v2"]),
                                                                  st.sampled_from(["v1", "v2"])))
@pytest.mark.django_db
def test_a_late_batch_into_rolled_minutes_equals_the_two_batches_rolled_together(
        post_batch: Any, one_usd_per_gpu_second: Any, samples: list[Sample], cut: int, wires: tuple[str, str]) -> None:
    # Examples share the database: each meters cards of its own. Mid-minute, so batches share minutes.
    base = clock.now().replace(second=40, microsecond=0) - timedelta(hours=2)
    samples = _moved(samples, base)
    parts = [[s for s in samples if s.start < base + timedelta(seconds=cut)],
             [s for s in samples if s.start >= base + timedelta(seconds=cut)]]
    starts = (base, base + timedelta(seconds=cut))
    n = next(_example)
    late, together = _card(f"{n}-late"), _card(f"{n}-together")
    for card, roll_between in ((late, True), (together, False)):
        for part, wire, at in zip(parts, wires, starts, strict=True):
            if not part:
                continue
            assert post_batch(_document(part, wire, seq=next(_seq), gpu=card, start=at)).status_code == 201
            if roll_between:
                rollup_usage(now=clock.now())
        rollup_usage(now=clock.now())
        assert _inbox_rows(card) == 0  # every row went into the store
    assert _ledger_of(late) == _ledger_of(together)
    assert _stored(late) == _per_second(samples)  # Σ over the store == Σ sent, to the last digit


@pytest.mark.django_db
def test_a_quarantined_batch_keeps_its_rows_in_the_inbox_until_it_is_rolled_up(post_batch, minute_start,
                                                                                one_usd_per_gpu_second):
    assert post_batch(make_batch(start=minute_start, seq=1)).status_code == 201
    assert post_batch(make_batch(start=minute_start + timedelta(seconds=10), seq=2)).status_code == 201
    with connection.cursor() as cur:
        cur.execute("SELECT batch_id, count(*) FROM billing_raw_sample GROUP BY 1")
        stored = dict(cur.fetchall())
    held = UsageBatch.objects.get(batch_seq=2)
    quarantine_batch(batch_id=held.pk, error="test: held", now=clock.now())
    assert rollup_usage(now=clock.now()).batches == 1
    with connection.cursor() as cur:
        cur.execute("SELECT batch_id, count(*) FROM billing_raw_sample GROUP BY 1")
        assert dict(cur.fetchall()) == {held.pk: stored[held.pk]}
    redrive_batches(batch_ids=[held.pk], node=None, now=clock.now(), actor_label="test")
    assert rollup_usage(now=clock.now()).batches == 1
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM billing_raw_sample")
        assert cur.fetchone()[0] == 0  # re-driven and rolled up: its rows went into the minutes


@pytest.mark.django_db
def test_a_rolled_up_batch_cannot_be_quarantined_its_integrals_are_in_the_store(post_batch, minute_start,
                                                                                 one_usd_per_gpu_second):
    assert post_batch(make_batch(start=minute_start)).status_code == 201
    rollup_usage(now=clock.now())
    batch = UsageBatch.objects.get()
    with pytest.raises(ValueError, match="not rolled up"):
        quarantine_batch(batch_id=batch.pk, error="too late", now=clock.now())
    batch.refresh_from_db()
    assert batch.quarantined_at is None


_MIGRATION = importlib.import_module("billing.migrations.0042_minute_store_integrals")


@pytest.mark.django_db
def test_the_migration_gives_existing_minutes_their_maxima_and_empties_the_inbox_of_rolled_up_batches(
        post_batch, minute_start, one_usd_per_gpu_second):
    """The migration's SQL on a ledger as the rollup left it before the minutes stored the maxima: the
    raw rows still there, the maxima at their default. An empty ledger first: nothing to do."""
    with connection.cursor() as cur:
        cur.execute(_MIGRATION.MAXIMA)
    used_above_granted = [{"gpu": 0, "tenant": "acme", "pod": "p", "mem_used": 900.5, "mem_granted": 512.0,
                           "sm_used": 3.0, "sm_granted": 13.5}]
    assert post_batch(make_batch(start=minute_start, seq=1, workloads=used_above_granted)).status_code == 201
    assert post_batch(make_batch(start=minute_start + timedelta(seconds=10), seq=2)).status_code == 201
    assert post_batch(make_batch(start=minute_start + timedelta(minutes=5), seq=3)).status_code == 201
    pending = UsageBatch.objects.get(batch_seq=3)
    quarantine_batch(batch_id=pending.pk, error="test: held", now=clock.now())
    columns, rows = keep_inbox()
    rollup_usage(now=clock.now())
    rolled = sorted(UsageMinute.objects.values_list("minute", "pod", "mem_max_mb_s", "sm_max_s"))
    with connection.cursor() as cur:
        cur.execute("DELETE FROM billing_raw_sample")
        cur.executemany(f"INSERT INTO billing_raw_sample ({', '.join(columns)}) "  # noqa: S608 - the table's own column names
                        f"VALUES ({', '.join(['%s'] * len(columns))})", rows)
    UsageMinute.objects.update(mem_max_mb_s=0, sm_max_s=0)
    with connection.cursor() as cur:
        cur.execute(_MIGRATION.MAXIMA)
        cur.execute("SELECT DISTINCT batch_id FROM billing_raw_sample")
        assert [r[0] for r in cur.fetchall()] == [pending.pk]  # only the batch not rolled up keeps its rows
    assert sorted(UsageMinute.objects.values_list("minute", "pod", "mem_max_mb_s", "sm_max_s")) == rolled
    assert any(m > 0 for _, _, m, _ in rolled)


def _minute_rows() -> dict[str, list[tuple[Any, ...]]]:
    """Every usage and GPU minute as the views give them, without the store's ids."""
    with connection.cursor() as cur:
        out = {}
        for view in ("billing_usageminute", "billing_gpuminute"):
            cur.execute(f"SELECT * FROM {view} LIMIT 0")  # noqa: S608 - fixed names
            columns = [c.name for c in cur.description if c.name not in {"id", "card_id", "workload_id"}]
            cur.execute(f"SELECT {', '.join(columns)} FROM {view} ORDER BY {', '.join(columns)}")  # noqa: S608 - fixed names and their catalogue columns
            out[view] = cur.fetchall()
        return out


@pytest.mark.django_db(transaction=True)
def test_the_slim_store_migration_converts_an_empty_and_a_filled_ledger_both_ways(
        post_batch, minute_start, one_usd_per_gpu_second):
    """Migration 0043 back to the wide minute tables and forward to the slim store: an empty ledger,
    then one the rollup wrote (a late batch in rolled minutes, two workloads, integrals past 15
    significant digits), gives back every minute row to the last digit."""
    from django.db.migrations.executor import MigrationExecutor

    wide = [("billing", "0042_minute_store_integrals")]

    def there_and_back() -> None:
        executor = MigrationExecutor(connection)
        executor.migrate(wide)
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

    there_and_back()
    assert _minute_rows() == {"billing_usageminute": [], "billing_gpuminute": []}
    two = [{"gpu": 0, "tenant": "acme", "pod": "p", "mem_used": 81000.0009765625, "mem_granted": 512.0,
            "sm_used": 3.0, "sm_granted": 13.5},
           {"gpu": 0, "tenant": "beta", "pod": "q", "mem_used": 100.5, "mem_granted": 0.0, "sm_used": 1.0,
            "sm_granted": 0.0}]
    assert post_batch(make_batch(start=minute_start + timedelta(seconds=10), seq=2, workloads=two)).status_code == 201
    rollup_usage(now=clock.now())
    assert post_batch(make_batch(start=minute_start, seq=1, workloads=two)).status_code == 201
    rollup_usage(now=clock.now())
    rows = _minute_rows()
    assert len(rows["billing_usageminute"]) == 2
    assert any(len(str(v).replace(".", "").strip("0")) > 15 for r in rows["billing_usageminute"] for v in r)
    there_and_back()
    assert _minute_rows() == rows


@pytest.mark.django_db
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(quanta=st.integers(min_value=0, max_value=2**53 - 1),
       digits=st.decimals(min_value=0, max_value=Decimal("9999999999.99999"), places=5, allow_nan=False))
def test_the_store_gives_back_every_integral_it_holds_as_the_decimal_it_was(quanta: int, digits: Decimal) -> None:
    """float8 in the store, numeric in the views (billing_exact): a multiple of 2^-10 below 2^43 (what
    agents send, and every sum of it a minute holds) comes back digit for digit, though it may have
    more significant digits than a float8 -> numeric cast keeps; a decimal of at most 15 significant
    digits (what another client may send) comes back as itself."""
    on_grid = Decimal(quanta) / 1024
    with connection.cursor() as cur:
        cur.execute("SELECT billing_exact(%s::numeric::float8), billing_exact(%s::numeric::float8)",
                    [on_grid, digits])
        back_on_grid, back_digits = cur.fetchone()
    assert back_on_grid == on_grid
    assert back_digits == digits


@pytest.mark.django_db
def test_a_hand_written_minute_whose_key_is_taken_is_refused_and_the_first_is_kept() -> None:
    """The store's index is (minute, card), not unique (migration 0048): the view's trigger keeps
    (minute, card, workload) a key for minutes written by hand, with the error the key gave."""
    node = Node.objects.create(name="node-key")
    zero = Decimal(0)

    def write(charge: str, pod: str = "p") -> UsageMinute:
        return UsageMinute.objects.create(
            minute=datetime(2030, 6, 30, 12, 0, tzinfo=START.tzinfo), gpu_uuid="GPU-key", node=node, tenant="acme",
            namespace="acme-prod", pod=pod, container="c", pod_uid="u", sla_tier="gold", seconds=Decimal(60),
            mem_used_mb_s=zero, mem_granted_mb_s=zero, mem_billed_mb_s=zero, sm_used_s=zero, sm_granted_s=zero,
            sm_billed_s=zero, pcie_mb=zero, share_gpu_s=zero, charge=Decimal(charge), idle_share=zero)

    first = write("0.5")
    with pytest.raises(IntegrityError, match="exists already"), transaction.atomic():
        write("0.7")
    write("0.9", pod="q")  # another workload of the same GPU-minute is its own key
    assert sorted(UsageMinute.objects.values_list("pod", "charge")) == [("p", Decimal("0.5")), ("q", Decimal("0.9"))]
    first.charge = Decimal("0.6")
    first.save()  # an update through the view replaces the row under its own key
    assert UsageMinute.objects.get(pod="p").charge == Decimal("0.6")
