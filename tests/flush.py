"""The database flush after each transactional test (live_server, transaction=True, ...): only the
tables that hold rows, and without deleting and rebuilding the rows Django derives from the
installed models alone.

Django empties every table after such a test (its `flush` command), content types and permissions
included, and then sends post_migrate, whose two receivers here (contenttypes' create_contenttypes,
auth's create_permissions) write them all again, the same rows: three quarters of each flush's
time, about 0.3 s of CPU on every one of the suite's transactional tests (tests/conftest.py installs
this). Here the flush leaves those two tables as they are and sends no post_migrate, as long as they
hold exactly what post_migrate writes (a row count per table, read from the installed models);
when a test has changed them, the flush is Django's own, and rebuilds them. And of the other
tables it empties only those that hold rows, with DELETE where every foreign key is deferred (as
Django makes them) and the table has no trigger of its own: the same empty tables afterwards,
without Postgres replacing the files of a hundred tables and their indexes, most of them empty
already.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from django.apps import apps
from django.core.management import sql as management_sql
from django.core.management.commands import flush as flush_command

# The tables post_migrate fills (create_contenttypes, create_permissions), and only those.
DERIVED_TABLES = ("django_content_type", "auth_permission")
_RECEIVERS = {"create_contenttypes", "create_permissions"}


def _rows_post_migrate_writes() -> tuple[int, int]:
    """Content types and permissions as post_migrate creates them: one content type per model
    (proxies included), and each model's default permissions and its own."""
    models = [model for config in apps.get_app_configs() for model in config.get_models()]
    permissions = sum(len(m._meta.default_permissions) + len(m._meta.permissions) for m in models)
    return len(models), permissions


def _only_derived_receivers() -> bool:
    """post_migrate's receivers are the two that write the derived tables (any other would be
    skipped along with them, so then the flush is Django's)."""
    from django.db.models.signals import post_migrate

    names = set()
    for _, receiver, *_ in post_migrate.receivers:
        function = receiver() if isinstance(receiver, weakref.ReferenceType) else receiver
        names.add(getattr(function, "__name__", repr(function)))
    return names <= _RECEIVERS


def _with_rows(connection: Any, tables: list[str]) -> list[str]:
    """The tables that hold a row, in one query: a test writes to a few of the hundred, and truncating
    an empty table costs Postgres as much as a full one (new files for it and each of its indexes)."""
    if not tables:
        return []
    quote = connection.ops.quote_name
    sql = " UNION ALL ".join(f"SELECT %s WHERE EXISTS (SELECT 1 FROM {quote(t)})" for t in tables)  # noqa: S608 - the models' tables
    with connection.cursor() as cur:
        cur.execute(sql, tables)
        return [name for (name,) in cur.fetchall()]


@functools.cache
def _schema_of(database: str, connection: Any) -> tuple[bool, frozenset[str]]:
    """Whether every foreign key is checked at the commit (Django creates them DEFERRABLE INITIALLY
    DEFERRED on Postgres), and the tables with triggers of their own (a DELETE would fire them; the
    ledger's refuse to delete a finalized invoice's lines, which TRUNCATE, as Django's flush, does not
    ask). Once per database: the tests do not change either."""
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND NOT (condeferrable AND condeferred)")
        (immediate,) = cur.fetchone()
        cur.execute("SELECT DISTINCT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                    "WHERE NOT t.tgisinternal")
        triggered = frozenset(name for (name,) in cur.fetchall())
    return immediate == 0, triggered


def _deletable(connection: Any, tables: list[str]) -> list[str]:
    """Of `tables`, those a DELETE empties as TRUNCATE would: every one, when all foreign keys are
    deferred, but those with triggers of their own."""
    if connection.vendor != "postgresql":
        return []
    deferred, triggered = _schema_of(connection.settings_dict["NAME"], connection)
    return [t for t in tables if t not in triggered] if deferred else []


class _Flush:
    """Stands in for the flush command's sql_flush and emit_post_migrate_signal."""

    def __init__(self) -> None:
        self._sql_flush = management_sql.sql_flush
        self._emit_post_migrate_signal = management_sql.emit_post_migrate_signal
        self._kept: set[str] = set()  # databases whose derived tables this flush keeps

    def _intact(self, connection: Any) -> bool:
        with connection.cursor() as cur:
            cur.execute(f"SELECT (SELECT count(*) FROM {DERIVED_TABLES[0]}), (SELECT count(*) FROM {DERIVED_TABLES[1]})")  # noqa: S608 - constants
            counts = tuple(cur.fetchone())
        return counts == _rows_post_migrate_writes() and _only_derived_receivers()

    def sql_flush(self, style: Any, connection: Any, reset_sequences: bool = True,
                  allow_cascade: bool = False) -> list[str]:
        alias = connection.alias
        if not self._intact(connection):
            self._kept.discard(alias)
            djangos: list[str] = self._sql_flush(style, connection, reset_sequences=reset_sequences,
                                                 allow_cascade=allow_cascade)
            return djangos
        self._kept.add(alias)
        tables = _with_rows(connection, [t for t in connection.introspection.django_table_names(
            only_existing=True, include_views=False) if t not in DERIVED_TABLES])
        deletable = _deletable(connection, tables) if not reset_sequences else []
        truncated = [t for t in tables if t not in deletable]
        # CASCADE: Postgres refuses to truncate a table another one references unless that one is
        # truncated too, empty or not; it adds them (never a derived table: none references another).
        statements: list[str] = connection.ops.sql_flush(style, truncated, reset_sequences=reset_sequences,
                                                         allow_cascade=True) if truncated else []
        # DELETE, not TRUNCATE: on a table of a few rows it is a few pages, where TRUNCATE gives
        # Postgres new files for the table and each of its indexes. In any order: every foreign key
        # is checked at the commit, when the rows that referenced a deleted one are gone too.
        quote = connection.ops.quote_name
        return statements + [f"DELETE FROM {quote(t)}" for t in deletable]  # noqa: S608 - the models' tables

    def emit_post_migrate_signal(self, verbosity: int, interactive: bool, db: str, **kwargs: Any) -> None:
        if db in self._kept:
            return  # what it would write is still there
        self._emit_post_migrate_signal(verbosity, interactive, db, **kwargs)


def install() -> None:
    """For this process: every `flush` keeps the derived tables when they are intact. The command
    calls the two functions by its module's global names, which are replaced here."""
    names = vars(flush_command)
    if isinstance(getattr(names["sql_flush"], "__self__", None), _Flush):
        return
    stand_in = _Flush()
    names["sql_flush"] = stand_in.sql_flush
    names["emit_post_migrate_signal"] = stand_in.emit_post_migrate_signal
