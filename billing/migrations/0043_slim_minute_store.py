"""The minute ledger becomes a slim store (docs/architecture.md, "The slim minute store"): the
usage and GPU minutes are kept in billing_usageminute_store and billing_gpuminute_store, keyed by
small ids (billing_card: a node's GPU and its model; billing_workload: the six names) instead of the
repeated strings, their integrals as float8 (what the rate card billed as its basis, one byte), no
surrogate id, no NULLs (no rate card is 0), the primary key the only index. billing_usageminute
and billing_gpuminute become views that join the small tables back and give every column its old
name and type, so readers (and hand-written minutes, through the views' INSTEAD OF triggers) are
unchanged.

Existing rows are converted: each card and workload named gets its id, each minute is copied once
into the store of its day (one partition per day that has rows, plus the DEFAULT partition), the
retention holds follow their partitions' new names, and the wide tables are dropped.

Reversible: the reverse rebuilds the wide tables (their keys, indexes and foreign keys as 0042 left
them) from the views and drops the store. The ids a wide row had are not kept: nothing refers to
them.
"""

from typing import Any

from django.db import migrations, models
from django.db.backends.utils import CursorWrapper

# float8 -> numeric exactly, for what the store holds: a multiple of 2^-10 below 2^43 (every agent's
# integral and every sum of them a minute holds) is exact in float8 and converted digit for digit
# (a float8 -> numeric cast keeps 15 significant digits, too few for such sums); anything else (a
# third-party client's value, metered seconds of microsecond windows) through the cast's 15
# significant digits, which is what it had when it was stored from a decimal of at most 15 digits.
EXACT_FUNCTION = """
CREATE FUNCTION billing_exact(x float8) RETURNS numeric LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (CASE WHEN abs(x) < 8796093022208 AND x * 1024 = trunc(x * 1024) THEN (x * 1024)::int8 * 0.0009765625
             ELSE x::numeric END)::numeric(30, 10);
"""

STORES = """
CREATE TABLE billing_usageminute_store (
    minute timestamptz NOT NULL,
    card_id integer NOT NULL,
    workload_id integer NOT NULL,
    seconds float8 NOT NULL,
    mem_used_mb_s float8 NOT NULL,
    mem_granted_mb_s float8 NOT NULL,
    mem_max_mb_s float8 NOT NULL,
    sm_used_s float8 NOT NULL,
    sm_granted_s float8 NOT NULL,
    sm_max_s float8 NOT NULL,
    pcie_mb float8 NOT NULL,
    billed_basis "char" NOT NULL CHECK (billed_basis IN ('m', 'g', 'u')),
    share_gpu_s numeric(30, 12) NOT NULL,
    charge numeric(30, 12) NOT NULL,
    idle_share numeric(30, 12) NOT NULL,
    energy_j numeric(30, 12) NOT NULL,
    CONSTRAINT billing_usageminute_store_pkey PRIMARY KEY (minute, card_id, workload_id)
) PARTITION BY RANGE (minute);
CREATE TABLE billing_usageminute_store_default PARTITION OF billing_usageminute_store DEFAULT;
CREATE TABLE billing_gpuminute_store (
    minute timestamptz NOT NULL,
    card_id integer NOT NULL,
    rate_card_id integer NOT NULL,
    metered_seconds float8 NOT NULL,
    committed_seconds float8 NOT NULL,
    energy_seconds float8 NOT NULL,
    card_cost numeric(30, 12) NOT NULL,
    charged numeric(30, 12) NOT NULL,
    idle_cost numeric(30, 12) NOT NULL,
    idle_allocated numeric(30, 12) NOT NULL,
    committed_cost numeric(30, 12) NOT NULL,
    energy_j numeric(30, 12) NOT NULL,
    idle_energy_j numeric(30, 12) NOT NULL,
    priced boolean NOT NULL,
    currency varchar(3) NOT NULL,
    CONSTRAINT billing_gpuminute_store_pkey PRIMARY KEY (minute, card_id)
) PARTITION BY RANGE (minute);
CREATE TABLE billing_gpuminute_store_default PARTITION OF billing_gpuminute_store DEFAULT;
"""

# What the store keeps of a usage minute's integrals. What the rate card billed is one of them, by its
# basis (billing.ledger.pricing: max, granted or used), so the store keeps the basis ('m', 'g', 'u':
# one byte) instead of two more float8s, and the view gives the billed figures from it.
_STORED = ("seconds", "mem_used_mb_s", "mem_granted_mb_s", "mem_max_mb_s", "sm_used_s", "sm_granted_s", "sm_max_s",
           "pcie_mb")
_INTEGRALS = ("seconds", "mem_used_mb_s", "mem_granted_mb_s", "mem_billed_mb_s", "mem_max_mb_s", "sm_used_s",
              "sm_granted_s", "sm_billed_s", "sm_max_s", "pcie_mb")
BILLED = {
    "mem_billed_mb_s": "CASE {m}.billed_basis WHEN 'g' THEN {m}.mem_granted_mb_s WHEN 'u' THEN {m}.mem_used_mb_s "
                       "ELSE {m}.mem_max_mb_s END",
    "sm_billed_s": "CASE {m}.billed_basis WHEN 'g' THEN {m}.sm_granted_s WHEN 'u' THEN {m}.sm_used_s "
                   "ELSE {m}.sm_max_s END",
}


def _stored(column: str, alias: str) -> str:
    """A usage minute's integral as the store keeps it (float8), the billed ones by their basis."""
    return BILLED[column].format(m=alias) if column in BILLED else f"{alias}.{column}"


# The basis a row's billed figures are, from its figures: the first of max, granted, used that both
# billed figures equal. A row whose billed figures are none of them (written by hand) is stored with
# its billed figures as its maxima, basis max: what it bills is kept.
def _basis(r: str) -> str:
    return (f"CASE WHEN {r}.mem_billed_mb_s = {r}.mem_max_mb_s AND {r}.sm_billed_s = {r}.sm_max_s THEN 'm' "
            f"WHEN {r}.mem_billed_mb_s = {r}.mem_granted_mb_s AND {r}.sm_billed_s = {r}.sm_granted_s THEN 'g' "
            f"WHEN {r}.mem_billed_mb_s = {r}.mem_used_mb_s AND {r}.sm_billed_s = {r}.sm_used_s THEN 'u' ELSE 'm' END")


def _max(r: str, column: str, billed: str) -> str:
    """The maximum the store keeps: the row's, or its billed figure where no basis gives the billed ones."""
    return f"CASE WHEN ({_basis(r)}) = 'm' AND NOT ({r}.mem_billed_mb_s = {r}.mem_max_mb_s AND " \
           f"{r}.sm_billed_s = {r}.sm_max_s) THEN {r}.{billed} ELSE {r}.{column} END"


def _stored_values(r: str) -> str:
    """A wide row's (or a view row's) integrals in the store's column order, then its basis."""
    values = [_max(r, c, "mem_billed_mb_s" if c.startswith("mem") else "sm_billed_s") if c.endswith("max_mb_s")
              or c == "sm_max_s" else f"{r}.{c}" for c in _STORED]
    return ", ".join(values) + f", {_basis(r)}"
_AMOUNTS = ("share_gpu_s", "charge", "idle_share", "energy_j")
_GPU_QUANTITIES = ("metered_seconds", "committed_seconds", "energy_seconds")
_GPU_AMOUNTS = ("card_cost", "charged", "idle_cost", "idle_allocated", "committed_cost", "energy_j", "idle_energy_j")

VIEWS = f"""
CREATE VIEW billing_usageminute AS
SELECT m.minute, m.card_id, m.workload_id, c.node_id, c.gpu_uuid, w.tenant, w.namespace, w.pod, w.container,
       w.pod_uid, w.sla_tier, {", ".join(f"billing_exact({_stored(c, 'm')}) AS {c}" for c in _INTEGRALS)},
       {", ".join(f"m.{c}" for c in _AMOUNTS)}
FROM billing_usageminute_store m JOIN billing_card c ON c.id = m.card_id JOIN billing_workload w ON w.id = m.workload_id;
CREATE VIEW billing_gpuminute AS
SELECT g.minute, g.card_id, c.node_id, c.gpu_uuid, c.gpu_model, NULLIF(g.rate_card_id, 0) AS rate_card_id,
       {", ".join(f"billing_exact(g.{c}) AS {c}" for c in _GPU_QUANTITIES)},
       {", ".join(f"g.{c}" for c in _GPU_AMOUNTS)}, g.priced, g.currency
FROM billing_gpuminute_store g JOIN billing_card c ON c.id = g.card_id;
"""

# Rows written through the views (hand-written ledgers in tests, a shell): the card and workload are
# found or made, the ids given back (INSERT ... RETURNING reads them), an update is a delete and an
# insert. The rollup writes the stores itself. A usage minute is put on its GPU's newest card (the
# one its GPU minute has, when written first), else on a card of no model.
VIEW_TRIGGERS = f"""
CREATE FUNCTION billing_card_id(p_node bigint, p_uuid varchar, p_model varchar) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE found_id integer;
BEGIN
    SELECT id INTO found_id FROM billing_card WHERE node_id = p_node AND gpu_uuid = p_uuid
        AND (p_model IS NULL OR gpu_model = p_model) ORDER BY id DESC LIMIT 1;
    IF found_id IS NULL THEN
        INSERT INTO billing_card (node_id, gpu_uuid, gpu_model) VALUES (p_node, p_uuid, coalesce(p_model, ''))
            ON CONFLICT DO NOTHING;
        SELECT id INTO found_id FROM billing_card WHERE node_id = p_node AND gpu_uuid = p_uuid
            AND gpu_model = coalesce(p_model, '');
    END IF;
    RETURN found_id;
END $$;
CREATE FUNCTION billing_usageminute_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM billing_usageminute_store WHERE minute = OLD.minute AND card_id = OLD.card_id
            AND workload_id = OLD.workload_id;
        IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    END IF;
    IF NEW.card_id IS NULL OR NOT EXISTS (SELECT 1 FROM billing_card WHERE id = NEW.card_id
            AND node_id = NEW.node_id AND gpu_uuid = NEW.gpu_uuid) THEN
        NEW.card_id := billing_card_id(NEW.node_id, NEW.gpu_uuid, NULL);
    END IF;
    SELECT id INTO NEW.workload_id FROM billing_workload WHERE (tenant, namespace, pod, container, pod_uid, sla_tier)
        = (NEW.tenant, NEW.namespace, NEW.pod, NEW.container, NEW.pod_uid, NEW.sla_tier);
    IF NEW.workload_id IS NULL THEN
        INSERT INTO billing_workload (tenant, namespace, pod, container, pod_uid, sla_tier)
            VALUES (NEW.tenant, NEW.namespace, NEW.pod, NEW.container, NEW.pod_uid, NEW.sla_tier)
            RETURNING id INTO NEW.workload_id;
    END IF;
    NEW.energy_j := coalesce(NEW.energy_j, 0);
    NEW.mem_max_mb_s := coalesce(NEW.mem_max_mb_s, 0);
    NEW.sm_max_s := coalesce(NEW.sm_max_s, 0);
    INSERT INTO billing_usageminute_store (minute, card_id, workload_id, {", ".join(_STORED)}, billed_basis,
                                           {", ".join(_AMOUNTS)})
        SELECT NEW.minute, NEW.card_id, NEW.workload_id, {_stored_values("r")}, {", ".join(f"NEW.{c}" for c in _AMOUNTS)}
        FROM (SELECT NEW.*) r;
    IF ({_basis("NEW")}) = 'm' AND NOT (NEW.mem_billed_mb_s = NEW.mem_max_mb_s AND NEW.sm_billed_s = NEW.sm_max_s) THEN
        NEW.mem_max_mb_s := NEW.mem_billed_mb_s;  -- as stored: what it bills is kept
        NEW.sm_max_s := NEW.sm_billed_s;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER billing_usageminute_write INSTEAD OF INSERT OR UPDATE OR DELETE ON billing_usageminute
    FOR EACH ROW EXECUTE FUNCTION billing_usageminute_write();
CREATE FUNCTION billing_gpuminute_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM billing_gpuminute_store WHERE minute = OLD.minute AND card_id = OLD.card_id;
        IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    END IF;
    NEW.card_id := billing_card_id(NEW.node_id, NEW.gpu_uuid, NEW.gpu_model);
    {" ".join(f"NEW.{c} := coalesce(NEW.{c}, 0);" for c in (*_GPU_QUANTITIES[1:], *_GPU_AMOUNTS[4:]))}
    INSERT INTO billing_gpuminute_store (minute, card_id, rate_card_id, {", ".join(_GPU_QUANTITIES)},
                                         {", ".join(_GPU_AMOUNTS)}, priced, currency)
        VALUES (NEW.minute, NEW.card_id, coalesce(NEW.rate_card_id, 0), {", ".join(f"NEW.{c}" for c in _GPU_QUANTITIES)},
                {", ".join(f"NEW.{c}" for c in _GPU_AMOUNTS)}, NEW.priced, coalesce(NEW.currency, ''));
    RETURN NEW;
END $$;
CREATE TRIGGER billing_gpuminute_write INSTEAD OF INSERT OR UPDATE OR DELETE ON billing_gpuminute
    FOR EACH ROW EXECUTE FUNCTION billing_gpuminute_write();
"""

# The wide tables' cards and workloads, then their rows in key order (a day's rows as they arrive).
# A usage minute takes the card of its GPU minute (its model); one without takes a card of no model.
CONVERT = f"""
INSERT INTO billing_card (node_id, gpu_uuid, gpu_model)
SELECT DISTINCT node_id, gpu_uuid, gpu_model FROM billing_gpuminute
UNION SELECT DISTINCT u.node_id, u.gpu_uuid, '' FROM billing_usageminute u WHERE NOT EXISTS (
    SELECT 1 FROM billing_gpuminute g WHERE g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.minute = u.minute)
ORDER BY 1, 2, 3;
INSERT INTO billing_workload (tenant, namespace, pod, container, pod_uid, sla_tier)
SELECT DISTINCT tenant, namespace, pod, container, pod_uid, sla_tier FROM billing_usageminute ORDER BY 1, 2, 3, 4, 5, 6;
INSERT INTO billing_usageminute_store (minute, card_id, workload_id, {", ".join(_STORED)}, billed_basis,
                                       {", ".join(_AMOUNTS)})
SELECT u.minute, c.id, w.id, {_stored_values("u")}, {", ".join(f"u.{c}" for c in _AMOUNTS)}
FROM billing_usageminute u
LEFT JOIN billing_gpuminute g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.minute = u.minute
JOIN billing_card c ON c.node_id = u.node_id AND c.gpu_uuid = u.gpu_uuid AND c.gpu_model = coalesce(g.gpu_model, '')
JOIN billing_workload w ON (w.tenant, w.namespace, w.pod, w.container, w.pod_uid, w.sla_tier)
    = (u.tenant, u.namespace, u.pod, u.container, u.pod_uid, u.sla_tier)
ORDER BY 1, 2, 3;
INSERT INTO billing_gpuminute_store
SELECT g.minute, c.id, coalesce(g.rate_card_id, 0), {", ".join(f"g.{c}" for c in _GPU_QUANTITIES)},
       {", ".join(f"g.{c}" for c in _GPU_AMOUNTS)}, g.priced, g.currency
FROM billing_gpuminute g JOIN billing_card c ON c.node_id = g.node_id AND c.gpu_uuid = g.gpu_uuid
    AND c.gpu_model = g.gpu_model
ORDER BY 1, 2;
"""

# table -> its store
RENAMED = {"billing_usageminute": "billing_usageminute_store", "billing_gpuminute": "billing_gpuminute_store"}

# The wide tables as 0042 left them, for the reverse.
WIDE = """
CREATE TABLE billing_usageminute (
    id bigint NOT NULL, gpu_uuid varchar(128) NOT NULL, tenant varchar(63) NOT NULL, namespace varchar(253) NOT NULL,
    pod varchar(253) NOT NULL, container varchar(253) NOT NULL, pod_uid varchar(64) NOT NULL,
    sla_tier varchar(63) NOT NULL, seconds numeric(30,10) NOT NULL, mem_used_mb_s numeric(30,10) NOT NULL,
    mem_granted_mb_s numeric(30,10) NOT NULL, mem_billed_mb_s numeric(30,10) NOT NULL, sm_used_s numeric(30,10) NOT NULL,
    sm_granted_s numeric(30,10) NOT NULL, sm_billed_s numeric(30,10) NOT NULL, pcie_mb numeric(30,10) NOT NULL,
    share_gpu_s numeric(30,12) NOT NULL, charge numeric(30,12) NOT NULL, idle_share numeric(30,12) NOT NULL,
    minute timestamptz NOT NULL, node_id bigint NOT NULL, rate_card_id bigint,
    energy_j numeric(30,12) DEFAULT 0 NOT NULL, mem_max_mb_s numeric(30,10) DEFAULT 0 NOT NULL,
    sm_max_s numeric(30,10) DEFAULT 0 NOT NULL
) PARTITION BY RANGE (minute);
CREATE SEQUENCE billing_usageminute_id_seq OWNED BY billing_usageminute.id;
ALTER TABLE billing_usageminute ALTER COLUMN id SET DEFAULT nextval('billing_usageminute_id_seq');
ALTER TABLE billing_usageminute ADD CONSTRAINT billing_usageminute_pkey PRIMARY KEY (id, minute);
CREATE TABLE billing_gpuminute (
    id bigint NOT NULL, gpu_uuid varchar(128) NOT NULL, gpu_model varchar(128) NOT NULL,
    metered_seconds numeric(30,10) NOT NULL, card_cost numeric(30,12) NOT NULL, charged numeric(30,12) NOT NULL,
    idle_cost numeric(30,12) NOT NULL, idle_allocated numeric(30,12) NOT NULL, currency varchar(3) NOT NULL,
    priced boolean NOT NULL, minute timestamptz NOT NULL, node_id bigint NOT NULL, rate_card_id bigint,
    committed_cost numeric(30,12) DEFAULT 0 NOT NULL, committed_seconds numeric(30,10) DEFAULT 0 NOT NULL,
    energy_j numeric(30,12) DEFAULT 0 NOT NULL, energy_seconds numeric(30,10) DEFAULT 0 NOT NULL,
    idle_energy_j numeric(30,12) DEFAULT 0 NOT NULL
) PARTITION BY RANGE (minute);
CREATE SEQUENCE billing_gpuminute_id_seq OWNED BY billing_gpuminute.id;
ALTER TABLE billing_gpuminute ALTER COLUMN id SET DEFAULT nextval('billing_gpuminute_id_seq');
ALTER TABLE billing_gpuminute ADD CONSTRAINT billing_gpuminute_pkey PRIMARY KEY (id, minute);
ALTER TABLE billing_gpuminute ADD CONSTRAINT gpu_minute_unique UNIQUE (node_id, gpu_uuid, minute);
"""
WIDE_INDEXES = """
CREATE INDEX billing_gpuminute_node_id_542c5628 ON billing_gpuminute (node_id);
CREATE INDEX billing_gpuminute_rate_card_id_8af08eef ON billing_gpuminute (rate_card_id);
CREATE INDEX billing_usageminute_node_id_97ac0990 ON billing_usageminute (node_id);
CREATE INDEX billing_usageminute_rate_card_id_ed0fa86d ON billing_usageminute (rate_card_id);
CREATE INDEX gpu_minute_minute_idx ON billing_gpuminute (minute);
CREATE INDEX usage_minute_gpu_idx ON billing_usageminute (gpu_uuid, minute);
CREATE INDEX usage_minute_tenant_idx ON billing_usageminute (minute, tenant);
ALTER TABLE billing_gpuminute ADD CONSTRAINT billing_gpuminute_node_id_542c5628_fk_billing_node_id
    FOREIGN KEY (node_id) REFERENCES billing_node(id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE billing_gpuminute ADD CONSTRAINT billing_gpuminute_rate_card_id_8af08eef_fk_billing_ratecard_id
    FOREIGN KEY (rate_card_id) REFERENCES billing_ratecard(id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE billing_usageminute ADD CONSTRAINT billing_usageminute_node_id_97ac0990_fk_billing_node_id
    FOREIGN KEY (node_id) REFERENCES billing_node(id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE billing_usageminute ADD CONSTRAINT billing_usageminute_rate_card_id_ed0fa86d_fk_billing_r
    FOREIGN KEY (rate_card_id) REFERENCES billing_ratecard(id) DEFERRABLE INITIALLY DEFERRED;
"""
WIDE_ROWS = f"""
INSERT INTO billing_usageminute (minute, node_id, gpu_uuid, tenant, namespace, pod, container, pod_uid, sla_tier,
    {", ".join(_INTEGRALS)}, {", ".join(_AMOUNTS)}, rate_card_id)
SELECT u.minute, u.node_id, u.gpu_uuid, u.tenant, u.namespace, u.pod, u.container, u.pod_uid, u.sla_tier,
    {", ".join(f"u.{c}" for c in _INTEGRALS)}, {", ".join(f"u.{c}" for c in _AMOUNTS)}, g.rate_card_id
FROM slim_usage u LEFT JOIN slim_gpu g ON g.minute = u.minute AND g.card_id = u.card_id ORDER BY u.minute;
INSERT INTO billing_gpuminute (minute, node_id, gpu_uuid, gpu_model, rate_card_id, {", ".join(_GPU_QUANTITIES)},
    {", ".join(_GPU_AMOUNTS)}, priced, currency)
SELECT minute, node_id, gpu_uuid, gpu_model, rate_card_id, {", ".join(_GPU_QUANTITIES)}, {", ".join(_GPU_AMOUNTS)},
    priced, currency FROM slim_gpu ORDER BY minute;
"""
DROP_SLIM = """
DROP VIEW billing_usageminute;
DROP VIEW billing_gpuminute;
DROP FUNCTION billing_usageminute_write();
DROP FUNCTION billing_gpuminute_write();
DROP FUNCTION billing_card_id(bigint, varchar, varchar);
DROP FUNCTION billing_exact(float8);
DROP TABLE billing_usageminute_store, billing_gpuminute_store;
"""


def _days(cur: CursorWrapper, table: str) -> list[str]:
    """The day suffixes (YYYYMMDD) of the table's day partitions."""
    prefix = f"{table}_p"
    cur.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s ORDER BY 1", [table])
    return [name[len(prefix):] for (name,) in cur.fetchall()
            if name.startswith(prefix) and name[len(prefix):].isdigit()]


def _partition_like(cur: CursorWrapper, old: str, new: str) -> None:
    """`new` gets a partition for every day partition `old` has."""
    for day in _days(cur, old):
        cur.execute(f"CREATE TABLE {new}_p{day} PARTITION OF {new} "
                    "FOR VALUES FROM (%s::date::timestamp AT TIME ZONE 'UTC') "
                    "TO ((%s::date + 1)::timestamp AT TIME ZONE 'UTC')", [day, day])


def _rename_holds(cur: CursorWrapper, renamed: dict[str, str]) -> None:
    for old, new in renamed.items():
        cur.execute("UPDATE billing_ledger_retention_hold SET table_name = %s, "
                    "partition_name = %s || substr(partition_name, length(%s) + 1) WHERE table_name = %s",
                    [new, f"{new}_", f"{old}_", old])


def forward(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cur:
        cur.execute(EXACT_FUNCTION)
        cur.execute(STORES)
        for old, new in RENAMED.items():
            _partition_like(cur, old, new)
        cur.execute(CONVERT)
        cur.execute("DROP TABLE billing_usageminute, billing_gpuminute")
        _rename_holds(cur, RENAMED)
        cur.execute(VIEWS)
        cur.execute(VIEW_TRIGGERS)


def backward(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cur:
        cur.execute("CREATE TEMP TABLE slim_usage ON COMMIT DROP AS SELECT * FROM billing_usageminute")
        cur.execute("CREATE TEMP TABLE slim_gpu ON COMMIT DROP AS SELECT * FROM billing_gpuminute")
        stores = {new: old for old, new in RENAMED.items()}
        days = {new: _days(cur, new) for new in stores}
        cur.execute(DROP_SLIM)
        cur.execute(WIDE)
        for new, old in stores.items():
            cur.execute(f"CREATE TABLE {old}_default PARTITION OF {old} DEFAULT")
            for day in days[new]:
                cur.execute(f"CREATE TABLE {old}_p{day} PARTITION OF {old} "
                            "FOR VALUES FROM (%s::date::timestamp AT TIME ZONE 'UTC') "
                            "TO ((%s::date + 1)::timestamp AT TIME ZONE 'UTC')", [day, day])
        cur.execute(WIDE_INDEXES)
        cur.execute(WIDE_ROWS)
        cur.execute("DROP TABLE slim_usage, slim_gpu")
        _rename_holds(cur, stores)


class Migration(migrations.Migration):
    dependencies = [("billing", "0042_minute_store_integrals")]

    operations = [
        migrations.CreateModel(
            name="Card",
            fields=[
                ("id", models.AutoField(primary_key=True, serialize=False)),
                ("gpu_uuid", models.CharField(max_length=128)),
                ("gpu_model", models.CharField(max_length=128)),
                ("node", models.ForeignKey(db_index=False, on_delete=models.deletion.PROTECT, related_name="+",
                                           to="billing.node")),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("node", "gpu_uuid", "gpu_model"), name="card_key")],
                "indexes": [models.Index(fields=["gpu_uuid"], name="card_gpu_uuid_idx")],
            },
        ),
        migrations.CreateModel(
            name="Workload",
            fields=[
                ("id", models.AutoField(primary_key=True, serialize=False)),
                ("tenant", models.CharField(max_length=63)),
                ("namespace", models.CharField(max_length=253)),
                ("pod", models.CharField(max_length=253)),
                ("container", models.CharField(max_length=253)),
                ("pod_uid", models.CharField(max_length=64)),
                ("sla_tier", models.CharField(max_length=63)),
            ],
            options={
                "constraints": [models.UniqueConstraint(
                    fields=("tenant", "namespace", "pod", "container", "pod_uid", "sla_tier"), name="workload_key")],
            },
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forward, backward)],
            state_operations=[
                migrations.DeleteModel("UsageMinute"),
                migrations.DeleteModel("GpuMinute"),
                migrations.CreateModel(
                    name="UsageMinute",
                    fields=[],
                    options={"managed": False, "db_table": "billing_usageminute"},
                ),
                migrations.CreateModel(
                    name="GpuMinute",
                    fields=[],
                    options={"managed": False, "db_table": "billing_gpuminute"},
                ),
            ],
        ),
    ]
