"""The raw sample table, range-partitioned by UTC day on `start`.

Not a Django model: it is written only with COPY (billing.services.ingest.batches) and read only
by the rollup's SQL. Partitions are created ahead by a beat task and on demand by ingest
(billing.ledger.partitions); retention drops whole partitions.
"""

from django.db import migrations

CREATE = """
CREATE TABLE billing_raw_sample (
    batch_id bigint NOT NULL,
    node_id bigint NOT NULL,
    gpu_uuid varchar(128) NOT NULL,
    start timestamptz NOT NULL,
    seconds double precision NOT NULL CHECK (seconds > 0),
    tenant varchar(63) NOT NULL,
    namespace varchar(253) NOT NULL,
    pod varchar(253) NOT NULL,
    container varchar(253) NOT NULL,
    pod_uid varchar(64) NOT NULL,
    sla_tier varchar(63) NOT NULL,
    mem_used_mb_s double precision NOT NULL CHECK (mem_used_mb_s >= 0),
    mem_granted_mb_s double precision NOT NULL CHECK (mem_granted_mb_s >= 0),
    sm_used_s double precision NOT NULL CHECK (sm_used_s >= 0),
    sm_granted_s double precision NOT NULL CHECK (sm_granted_s >= 0),
    pcie_mb double precision NOT NULL CHECK (pcie_mb >= 0)
) PARTITION BY RANGE (start);
CREATE INDEX billing_raw_sample_gpu_start ON billing_raw_sample (gpu_uuid, start);
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]

    operations = [migrations.RunSQL(CREATE, reverse_sql="DROP TABLE billing_raw_sample CASCADE;")]
