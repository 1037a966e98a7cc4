"""A page's reads see one instant of the ledger, the reads it runs beside itself included
(billing.queries.snapshot): on connections of their own, in the page's snapshot, language and time
zone; in turn where no other connection can share the snapshot or no side thread is free."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone, translation

from billing.models import Tenant
from billing.queries.snapshot import alongside, close_side_threads, one_snapshot


def _commit_tenant(slug: str) -> None:
    """A row committed on a connection of its own (another thread's), as the rollup commits."""
    def commit() -> None:
        Tenant.objects.create(slug=slug, name=slug)
        connections.close_all()

    worker = threading.Thread(target=commit)
    worker.start()
    worker.join()


def _where_and_what() -> dict[str, Any]:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid(), current_setting('transaction_isolation'), "
                    "current_setting('transaction_read_only')")
        pid, isolation, read_only = cur.fetchone()
    return {"thread": threading.current_thread().name, "backend": pid, "isolation": isolation,
            "read_only": read_only, "tenants": sorted(Tenant.objects.values_list("slug", flat=True)),
            "language": translation.get_language(), "zone": timezone.get_current_timezone_name()}


@pytest.mark.django_db(transaction=True)
def test_a_read_beside_the_page_sees_the_pages_snapshot_on_a_connection_of_its_own() -> None:
    Tenant.objects.create(slug="acme", name="Acme")
    with translation.override("zh-hans"), timezone.override("Asia/Shanghai"), one_snapshot():
        page = _where_and_what()  # the page's first read: its snapshot
        _commit_tenant("late")  # committed after it: in no read of the page
        beside = alongside(_where_and_what)()
        after = _where_and_what()
    assert page["tenants"] == beside["tenants"] == after["tenants"] == ["acme"]
    assert beside["thread"].startswith("page-read")
    assert page["thread"] == threading.current_thread().name
    assert beside["backend"] != page["backend"]
    assert (beside["isolation"], beside["read_only"]) == ("repeatable read", "on")
    assert (beside["language"], beside["zone"]) == ("zh-hans", "Asia/Shanghai")
    with one_snapshot():  # the next page sees the commit, beside it too
        assert alongside(_where_and_what)()["tenants"] == ["acme", "late"]


@pytest.mark.django_db(transaction=True)
def test_a_read_beside_the_page_raises_where_its_result_is_asked_for() -> None:
    def fails() -> None:
        raise LookupError("no such thing")

    with one_snapshot():
        result = alongside(fails)
        with pytest.raises(LookupError, match="no such thing"):
            result()


@pytest.mark.django_db(transaction=True)
def test_with_every_side_thread_busy_a_read_runs_in_turn_on_the_pages_connection(settings: Any) -> None:
    settings.VGPU_PAGE_READ_THREADS = 2
    close_side_threads()  # the pool is made with this test's size
    gate = threading.Event()
    here = threading.current_thread().name

    def held() -> str:
        gate.wait(30)
        return threading.current_thread().name

    with one_snapshot():
        busy = [alongside(held) for _ in range(2)]
        assert alongside(lambda: threading.current_thread().name)() == here
        gate.set()
        assert all(read().startswith("page-read") for read in busy)
    with one_snapshot():  # free again
        assert alongside(lambda: threading.current_thread().name)().startswith("page-read")


@pytest.mark.django_db(transaction=True)
def test_no_side_threads_when_the_setting_is_zero(settings: Any) -> None:
    settings.VGPU_PAGE_READ_THREADS = 0
    with one_snapshot():
        def read() -> str:
            return threading.current_thread().name

        assert alongside(read) is read


@pytest.mark.django_db
def test_inside_a_transaction_the_page_did_not_begin_a_read_runs_in_turn() -> None:
    """A test's transaction: its rows are not committed, so no other connection would see them."""
    Tenant.objects.create(slug="acme", name="Acme")
    with one_snapshot():
        def read() -> list[str]:
            return list(Tenant.objects.values_list("slug", flat=True))

        assert alongside(read) is read
        assert read() == ["acme"]
    assert alongside(read) is read  # and outside any page
