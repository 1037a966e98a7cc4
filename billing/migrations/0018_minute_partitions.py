"""The minute ledger (billing_usageminute, billing_gpuminute) range-partitioned by UTC day on
`minute`, so retention drops whole days (billing.ledger.retention); and the retention bookkeeping.

Existing rows are kept: each table is rebuilt as a partitioned table with one partition per day
that has rows, plus a DEFAULT partition (rows written through the ORM for a day not created yet;
billing.ledger.partitions moves them out when their day is created), and the rows copied over.

Database-first (SeparateDatabaseAndState): Django's state changes only GpuMinute's key. In the database the
primary key becomes (id, minute) (a unique key of a partitioned table must hold the partition key),
`id` draws from a sequence owned by the column (Postgres 15 has no identity columns on partitioned
tables), and GpuMinute's unique key becomes (node_id, gpu_uuid, minute): the ledger's key is
(node, GPU, window), with node_id the distribution key (the schema decision of docs/scaling.md).

Reversible: the reverse rebuilds plain tables with the old keys.
"""

from typing import Any

from django.db import migrations, models
from django.db.backends.utils import CursorWrapper

# Retention's watermarks ("raw samples / minutes before this instant may be gone") and the
# partitions it holds back because batches in them are not rolled up (billing.ledger.retention).
RETENTION_TABLES = """
CREATE TABLE billing_ledger_retention (
    kind text PRIMARY KEY CHECK (kind IN ('raw', 'minute')),
    dropped_before timestamptz NOT NULL
);
CREATE TABLE billing_ledger_retention_hold (
    partition_name text PRIMARY KEY,
    table_name text NOT NULL,
    day date NOT NULL,
    first_held_at timestamptz NOT NULL,
    batch_ids bigint[] NOT NULL
);
"""
DROP_RETENTION_TABLES = "DROP TABLE billing_ledger_retention, billing_ledger_retention_hold;"

# table -> (unique key in the partitioned table, unique key in the plain table)
TABLES: dict[str, tuple[str | None, str | None]] = {
    "billing_usageminute": (None, None),
    "billing_gpuminute": ("(node_id, gpu_uuid, minute)", "(gpu_uuid, minute)"),
}
UNIQUE_NAME = "gpu_minute_unique"


def _unique_name(cur: CursorWrapper, table: str) -> str:
    """The name the table's unique key has now (0017 may rename it), else the model's name."""
    cur.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'u'", [table])
    names = [row[0] for row in cur.fetchall()]
    return names[0] if len(names) == 1 else UNIQUE_NAME


def _definitions(cur: CursorWrapper, table: str) -> tuple[list[str], list[str]]:
    """CREATE INDEX and ADD CONSTRAINT ... FOREIGN KEY statements that recreate the table's
    secondary indexes and foreign keys under their own names (keys are recreated apart)."""
    cur.execute(
        "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indrelid = %s::regclass "
        "AND NOT i.indisprimary AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid "
        "AND c.conrelid = i.indrelid) ORDER BY 1",
        [table],
    )
    # A partitioned table's index reads "ON ONLY table": recreated on a plain table, and on a
    # partitioned one it must reach every partition, so without ONLY.
    indexes = [row[0].replace(" ON ONLY ", " ON ") for row in cur.fetchall()]
    cur.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass "
        "AND contype = 'f' ORDER BY conname",
        [table],
    )
    foreign_keys = [f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}' for name, definition in cur.fetchall()]
    return indexes, foreign_keys


def _to_partitioned(cur: CursorWrapper, table: str) -> None:
    unique, _ = TABLES[table]
    unique_name = _unique_name(cur, table)
    indexes, foreign_keys = _definitions(cur, table)
    old = f"{table}__unpartitioned"
    cur.execute(f"ALTER TABLE {table} RENAME TO {old}")
    cur.execute(f"CREATE TABLE {table} (LIKE {old}) PARTITION BY RANGE (minute)")
    cur.execute(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT")
    cur.execute(f"SELECT DISTINCT date_trunc('day', minute, 'UTC') FROM {old} ORDER BY 1")  # noqa: S608 - fixed table names
    for (day,) in cur.fetchall():
        cur.execute(
            f"CREATE TABLE {table}_p{day:%Y%m%d} PARTITION OF {table} "
            "FOR VALUES FROM (%s) TO (%s::timestamptz + interval '1 day')",
            [day, day],
        )
    cur.execute(f"INSERT INTO {table} SELECT * FROM {old}")  # noqa: S608 - fixed table names
    cur.execute(f"SELECT coalesce(max(id), 0) FROM {old}")  # noqa: S608 - fixed table names
    last_id = cur.fetchone()[0]
    cur.execute(f"DROP TABLE {old}")  # its identity sequence goes with it
    cur.execute(f"CREATE SEQUENCE {table}_id_seq OWNED BY {table}.id")
    cur.execute("SELECT setval(%s, %s, %s)", [f"{table}_id_seq", max(last_id, 1), last_id > 0])
    cur.execute(f"ALTER TABLE {table} ALTER COLUMN id SET DEFAULT nextval('{table}_id_seq')")
    cur.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY (id, minute)")
    if unique:
        cur.execute(f"ALTER TABLE {table} ADD CONSTRAINT {unique_name} UNIQUE {unique}")
    for statement in indexes + foreign_keys:
        cur.execute(statement)


def _to_plain(cur: CursorWrapper, table: str) -> None:
    _, unique = TABLES[table]
    unique_name = _unique_name(cur, table)
    indexes, foreign_keys = _definitions(cur, table)
    old = f"{table}__partitioned"
    cur.execute(f"ALTER TABLE {table} RENAME TO {old}")
    cur.execute(f"CREATE TABLE {table} (LIKE {old})")
    cur.execute(f"INSERT INTO {table} SELECT * FROM {old}")  # noqa: S608 - fixed table names
    cur.execute(f"SELECT coalesce(max(id), 0) FROM {old}")  # noqa: S608 - fixed table names
    last_id = cur.fetchone()[0]
    cur.execute(f"DROP TABLE {old}")  # its partitions and its sequence go with it
    cur.execute(f"ALTER TABLE {table} ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY")
    cur.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s, %s)", [table, max(last_id, 1), last_id > 0])
    cur.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY (id)")
    if unique:
        cur.execute(f"ALTER TABLE {table} ADD CONSTRAINT {unique_name} UNIQUE {unique}")
    for statement in indexes + foreign_keys:
        cur.execute(statement)


def forward(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cur:
        for table in TABLES:
            _to_partitioned(cur, table)
        cur.execute(RETENTION_TABLES)


def backward(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cur:
        cur.execute(DROP_RETENTION_TABLES)
        for table in TABLES:
            _to_plain(cur, table)


class Migration(migrations.Migration):
    dependencies = [("billing", "0017_distribution_key")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forward, backward)],
            # The model states GpuMinute's key as the database has it now; the key keeps its name.
            state_operations=[
                migrations.RemoveConstraint(model_name="gpuminute", name=UNIQUE_NAME),
                migrations.AddConstraint(
                    model_name="gpuminute",
                    constraint=models.UniqueConstraint(fields=("node", "gpu_uuid", "minute"), name=UNIQUE_NAME),
                ),
            ],
        ),
    ]
