"""One instant for a page's reads, and reads of that instant side by side.

The ledger moves while a page is built: the rollup commits every few seconds, and under Postgres's
default (read committed) every statement sees the latest commit. A page that reads one figure three
ways (the portal's month to date, its upcoming invoice's subtotal and its workloads' total) could then
show three values of one figure, because a rollup committed between two of its queries. Inside
`one_snapshot` every statement sees the database as of the first one (repeatable read), and the
transaction is read only, so a page that tried to write would fail loudly rather than half-apply.

`alongside` runs a read the page does not need yet on a second connection that imports the page's
snapshot (pg_export_snapshot, SET TRANSACTION SNAPSHOT: what pg_dump's parallel jobs use), while
the page's own thread goes on with its statements and its Python. The read sees exactly what the
page sees. A page's statements and its Python alternate on one connection otherwise: the portal's
month at 1,000 GPUs spent about a third of its time in statements that needed nothing from the
figures being computed meanwhile (docs/benchmarks.md). Where no second connection can share the
snapshot (inside a transaction `one_snapshot` did not begin, such as a test's: its rows are not
committed, so another connection would not see them), or every side thread of the process is
busy, the read runs on the page's own connection when its result is asked for, as before.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.conf import settings
from django.db import connection as page_connection
from django.db import transaction
from django.utils import timezone, translation

__all__ = ["alongside", "beside", "close_side_threads", "one_snapshot"]

T = TypeVar("T")


@dataclass
class _Snapshot:
    """The snapshot of the page in progress on this thread, exported at the first `alongside`."""

    shareable: bool  # one_snapshot began the transaction: its rows are committed ones
    exported: str = ""
    pending: list[Future[Any]] = field(default_factory=list)


_state = threading.local()


@contextmanager
def one_snapshot() -> Iterator[None]:
    """Run the block's reads against one snapshot of the database. Usable as a decorator."""
    connection = transaction.get_connection()
    outer = getattr(_state, "snapshot", None)
    if connection.in_atomic_block:
        # An enclosing transaction has begun and may already have read: its isolation is set (a
        # test's own transaction; nothing the service runs pages in).
        _state.snapshot = outer or _Snapshot(shareable=False)
        try:
            yield
        finally:
            _state.snapshot = outer
        return
    snapshot = _Snapshot(shareable=True)
    _state.snapshot = snapshot
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            try:
                yield
            finally:
                # A side read still running imports a snapshot that lives as long as this transaction.
                wait(snapshot.pending)
    finally:
        _state.snapshot = outer


def alongside(read: Callable[[], T]) -> Callable[[], T]:
    """Start `read` on a side connection in the page's snapshot (module docstring); the getter
    returned gives its result, or raises what it raised. Without a shareable snapshot or a free side
    thread, the getter runs `read` on this connection."""
    return beside(read) or read


def beside(read: Callable[[], T]) -> Callable[[], T] | None:
    """`alongside`, but None where `read` cannot start on a side connection: for a caller that would
    read otherwise in turn (one statement rather than two parts of it)."""
    snapshot = getattr(_state, "snapshot", None)
    if snapshot is None or not snapshot.shareable or settings.VGPU_PAGE_READ_THREADS <= 0:
        return None
    pool, free = _side_threads()
    if not free.acquire(blocking=False):
        return None
    try:
        if not snapshot.exported:
            with page_connection.cursor() as cursor:
                cursor.execute("SELECT pg_export_snapshot()")
                snapshot.exported = cursor.fetchone()[0]
        future = pool.submit(_in_snapshot, snapshot.exported, translation.get_language(),
                             timezone.get_current_timezone_name(), read, free)
    except BaseException:
        free.release()
        raise
    snapshot.pending.append(future)
    return future.result


def _in_snapshot(exported: str, language: str | None, zone: str, read: Callable[[], T],
                 free: threading.BoundedSemaphore) -> T:
    """`read` on this side thread's connection, in the exported snapshot, the page's language and
    time zone (both are per thread); then its side thread is free again."""
    from django.db import connection  # noqa: PLC0415 - this thread's own connection

    try:
        connection.close_if_unusable_or_obsolete()  # CONN_MAX_AGE and health checks, as a request does
        with translation.override(language), timezone.override(zone), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                cursor.execute("SET TRANSACTION SNAPSHOT %s", [exported])
            return read()
    finally:
        free.release()


# The side threads of this process and a slot per thread, made at the first side read in each
# process (a forking server's workers make their own); each thread keeps its connection as a
# request does (CONN_MAX_AGE).
@dataclass(frozen=True)
class _Side:
    pid: int
    threads: int
    pool: ThreadPoolExecutor
    free: threading.BoundedSemaphore


_lock = threading.Lock()
_side: _Side | None = None


def _side_threads() -> tuple[ThreadPoolExecutor, threading.BoundedSemaphore]:
    global _side  # noqa: PLW0603 - one pool per process, made on first use
    with _lock:
        if _side is None or _side.pid != os.getpid():
            threads = settings.VGPU_PAGE_READ_THREADS
            _side = _Side(os.getpid(), threads, ThreadPoolExecutor(max_workers=threads, thread_name_prefix="page-read"),
                          threading.BoundedSemaphore(threads))
        return _side.pool, _side.free


def close_side_threads() -> None:
    """Stop this process's side threads, each closing its connection first (a test that used them
    ends, and its database is dropped later only if no connection is left on it)."""
    global _side
    with _lock:
        side, _side = _side, None
    if side is None or side.pid != os.getpid():
        return
    # One task per thread: each waits for the others, so no thread takes two.
    everyone = threading.Barrier(side.threads, timeout=30)

    def close() -> None:
        from django.db import connection  # noqa: PLC0415 - this thread's own connection

        everyone.wait()
        connection.close()

    for future in [side.pool.submit(close) for _ in range(side.threads)]:
        future.result()
    side.pool.shutdown(wait=True)
