"""The ledger lock: a transaction-level advisory lock that every rollup transaction takes shared
and a re-pricing (a rate-card change, `rebuild_ledger`, `rebuild_days`) or a retention drop takes
exclusive, so the ledger is never re-priced or dropped under a rollup in flight. Its own module so
that the rollup and the retention both use it without importing each other."""

from __future__ import annotations

from django.db import connection
from django.db.backends.utils import CursorWrapper

__all__ = ["lock_ledger", "try_lock_ledger_shared"]

LEDGER_LOCK_KEY = 0x726F6C6C  # "roll": shared by rollups, exclusive for re-pricing


def lock_ledger() -> None:
    """Hold the ledger lock exclusively until the current transaction ends: waits for the rollups
    in flight, and no rollup or rebuild runs meanwhile (a rate-card change re-prices under it)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", [LEDGER_LOCK_KEY])


def try_lock_ledger_shared(cur: CursorWrapper) -> bool:
    """The ledger lock, shared, until the transaction ends; False while someone holds it exclusively
    (the rollup then skips this cycle rather than wait for a re-pricing)."""
    cur.execute("SELECT pg_try_advisory_xact_lock_shared(%s)", [LEDGER_LOCK_KEY])
    return bool(cur.fetchone()[0])
