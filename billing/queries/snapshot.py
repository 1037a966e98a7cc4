"""One instant for a page's reads.

The ledger moves while a page is built: the rollup commits every few seconds, and under Postgres's
default (read committed) every statement sees the latest commit. A page that reads one figure three
ways (the portal's month to date, its upcoming invoice's subtotal and its workloads' total) could then
show three values of one figure, because a rollup committed between two of its queries. Inside
`one_snapshot` every statement sees the database as of the first one (repeatable read), and the
transaction is read only, so a page that tried to write would fail loudly rather than half-apply.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import transaction

__all__ = ["one_snapshot"]


@contextmanager
def one_snapshot() -> Iterator[None]:
    """Run the block's reads against one snapshot of the database. Usable as a decorator."""
    connection = transaction.get_connection()
    if connection.in_atomic_block:
        # An enclosing transaction has begun and may already have read: its isolation is set (a
        # test's own transaction; nothing the service runs pages in).
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield
