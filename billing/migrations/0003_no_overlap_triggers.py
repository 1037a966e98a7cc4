"""No two rate cards of one GPU model overlap in time, and no GPU-second is metered twice.

These are exclusion constraints in spirit. They are triggers because an exclusion
constraint on `text = AND range &&` needs the btree_gist extension, which the embedded
Postgres (pgserver) does not ship. Each trigger takes a transaction-level advisory lock on
its key (GPU model / GPU UUID) before looking for an overlap, so two concurrent inserts
cannot both pass. Violations raise SQLSTATE 23P01 (exclusion_violation) naming the rule.
"""

from django.db import migrations

SQL = """
CREATE FUNCTION billing_rate_card_no_overlap() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('billing_ratecard:' || NEW.gpu_model));
    IF EXISTS (
        SELECT 1 FROM billing_ratecard r
        WHERE r.gpu_model = NEW.gpu_model AND r.id <> NEW.id
          AND tstzrange(r.effective_from, r.effective_to) && tstzrange(NEW.effective_from, NEW.effective_to)
    ) THEN
        RAISE EXCEPTION 'rate_card_no_overlap: another rate card for % overlaps [%, %)',
            NEW.gpu_model, NEW.effective_from, coalesce(NEW.effective_to::text, 'open end')
            USING ERRCODE = 'exclusion_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER rate_card_no_overlap BEFORE INSERT OR UPDATE ON billing_ratecard
    FOR EACH ROW EXECUTE FUNCTION billing_rate_card_no_overlap();

-- Batch GPU rows are checked once per INSERT statement (a batch inserts all its GPUs in one
-- statement): lock every GPU of the statement in UUID order, then look for any overlap.
-- AFTER ... FOR EACH STATEMENT with a transition table; statements in PL/pgSQL take a fresh
-- snapshot, so once the locks are held, a concurrent batch that committed is visible.
CREATE FUNCTION billing_batch_gpu_no_overlap() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    clash record;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('billing_batchgpu:' || u.gpu_uuid))
        FROM (SELECT DISTINCT gpu_uuid FROM new_rows ORDER BY gpu_uuid) u;
    SELECT n.gpu_uuid, n.window_start, n.window_end INTO clash
        FROM new_rows n JOIN billing_batchgpu g ON g.gpu_uuid = n.gpu_uuid AND g.id <> n.id
         AND g.window_end > n.window_start AND g.window_start < n.window_end
        LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'batch_gpu_no_overlap: GPU % already metered inside [%, %)',
            clash.gpu_uuid, clash.window_start, clash.window_end
            USING ERRCODE = 'exclusion_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER batch_gpu_no_overlap AFTER INSERT ON billing_batchgpu
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION billing_batch_gpu_no_overlap();

-- What was metered is history: batch GPU rows are never edited.
CREATE FUNCTION billing_batch_gpu_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'billing_batchgpu rows are immutable' USING ERRCODE = 'restrict_violation';
END $$;
CREATE TRIGGER batch_gpu_immutable BEFORE UPDATE ON billing_batchgpu
    FOR EACH ROW EXECUTE FUNCTION billing_batch_gpu_immutable();
"""

REVERSE = """
DROP TRIGGER batch_gpu_immutable ON billing_batchgpu;
DROP FUNCTION billing_batch_gpu_immutable();
DROP TRIGGER batch_gpu_no_overlap ON billing_batchgpu;
DROP FUNCTION billing_batch_gpu_no_overlap();
DROP TRIGGER rate_card_no_overlap ON billing_ratecard;
DROP FUNCTION billing_rate_card_no_overlap();
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0002_raw_sample_partitioned")]

    operations = [migrations.RunSQL(SQL, reverse_sql=REVERSE)]
