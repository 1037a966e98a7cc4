"""The usage minute store's primary key (minute, card, workload) becomes a plain index on (minute,
card) (docs/architecture.md, "The slim minute store"): a GPU-minute's rows, one per workload, then
share one index entry (B-tree deduplication keeps a posting list per distinct key, which a unique
index never does), so the index costs about 12 bytes a row instead of 30-50 (a rollup cycle inserts
a minute's cards in no particular order, so the unique index split its pages half full). At 10,000
GPUs x 16 workloads that is about a tenth of what the ledger writes a day (docs/scaling.md).

Every lookup the ledger makes is by (minute, card): the rollup's stored integrals and the GPU-minutes
it replaces, the hours' sums, and the views' readers. Uniqueness of (minute, card, workload) is kept
by how the store is written: the rollup replaces a GPU-minute's rows whole (delete, then one row per
workload of its grouped sums, billing.ledger.rollup), and the view's INSERT trigger (hand-written
minutes: tests, a shell) now refuses a row whose key is taken with the unique-violation error the key
gave.

Reversible: the reverse drops the index, restores the key (it fails if the store holds two rows of one
key, which only a write around both the rollup and the view could make) and migration 0043's trigger.
"""

import importlib

from django.db import migrations

_SLIM = importlib.import_module("billing.migrations.0043_slim_minute_store")


def _write_function() -> str:
    """Migration 0043's INSERT/UPDATE/DELETE function of the usage minute view, as CREATE OR REPLACE."""
    start = _SLIM.VIEW_TRIGGERS.index("CREATE FUNCTION billing_usageminute_write()")
    end = _SLIM.VIEW_TRIGGERS.index("CREATE TRIGGER billing_usageminute_write")
    return "CREATE OR REPLACE" + _SLIM.VIEW_TRIGGERS[start + len("CREATE"):end]


# Once the workload and card are found, before the row is stored: the key the index no longer enforces.
_BEFORE_STORE = "    NEW.energy_j := coalesce(NEW.energy_j, 0);\n"
_KEY_CHECK = """    IF EXISTS (SELECT 1 FROM billing_usageminute_store WHERE minute = NEW.minute AND card_id = NEW.card_id
               AND workload_id = NEW.workload_id) THEN
        RAISE unique_violation USING MESSAGE = format(
            'the usage minute %s of card %s and workload %s exists already', NEW.minute, NEW.card_id, NEW.workload_id);
    END IF;
"""


def _checked_write_function() -> str:
    function = _write_function()
    if function.count(_BEFORE_STORE) != 1:
        raise RuntimeError("migration 0043's usage minute trigger is not the one this migration extends")
    return function.replace(_BEFORE_STORE, _KEY_CHECK + _BEFORE_STORE)


FORWARD = f"""
ALTER TABLE billing_usageminute_store DROP CONSTRAINT billing_usageminute_store_pkey;
CREATE INDEX usage_minute_store_card_idx ON billing_usageminute_store (minute, card_id);
{_checked_write_function()}
"""

BACKWARD = f"""
DROP INDEX usage_minute_store_card_idx;
ALTER TABLE billing_usageminute_store ADD CONSTRAINT billing_usageminute_store_pkey
    PRIMARY KEY (minute, card_id, workload_id);
{_write_function()}
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0047_node_indexes_the_keys_serve")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
