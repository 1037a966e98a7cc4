"""The ledger's tables: accepted batches and their GPUs, and the minute, hour and day ledgers
(the batches' integrals, priced; docs/billing.md). Only billing.ledger reads or writes them.

The raw sample table (the integral rows' inbox) is not a model: see billing.ledger.partitions and
migration 0002.

The minute ledger is a slim store (migrations 0043, 0044; docs/architecture.md): the usage and GPU
minutes, and the batch GPU rows, name a GPU by its card (Card) and a workload by its id (Workload);
UsageMinute and GpuMinute are unmanaged models over the views that join them back.

The usage minutes store the integrals; every other figure is derived: the rollup prices a
GPU-minute's rows again wholesale from its stored integrals plus those of the batches it rolls up,
which lets late batches land. Amounts are Decimal with
LEDGER_PLACES decimal places (billing.money); customer-facing rounding happens once per
invoice line. Invariant per GPU and window: Σ workload charge + idle_cost = card_cost.

The day ledger (UsageDay, GpuDay) is derived from the hour ledger exactly like hours from minutes
(billing.ledger.rollup): sums of exact decimals per UTC day, so Σ days = Σ hours. Reads over whole
UTC days use it (~24x fewer rows); anything that needs hour precision reads hours. The rollup writes
hours and days in one transaction; an hour row saved or deleted through the ORM (hand-written ledgers
in tests) re-derives its GPU-day below. Bulk writes of hours (COPY, bulk_create, QuerySet.update)
must call billing.ledger.rollup.rebuild_days themselves.

The month ledger (UsageMonth) is derived from the day ledger the same way, in the same transaction
(billing.ledger.months), and read for whole UTC months (billing.ledger.reads.usage_rows).
"""

from decimal import Decimal

from django.db import models
from django.db.models import F, Func
from django.db.models.functions import Cast, Now

from billing.models.fleet import Node
from billing.models.pricing import RateCard


def _amount() -> "models.DecimalField[Decimal | int | str, Decimal]":
    """Money at ledger precision (billing.money.LEDGER_PLACES)."""
    return models.DecimalField(max_digits=30, decimal_places=12)


def _quantity() -> "models.DecimalField[Decimal | int | str, Decimal]":
    # 10 places keep agent integrals exact: agents quantise to multiples of 2^-10 (agents/meter.py).
    return models.DecimalField(max_digits=30, decimal_places=10)


class ExactDecimalField(models.DecimalField):  # type: ignore[type-arg]
    """A Decimal stored as PostgreSQL's unconstrained `numeric`: every digit a statement computed
    (a quotient's scale depends on its operands), so a sum of stored quotients is the sum of the
    quotients themselves. max_digits/decimal_places only satisfy Django's checks."""

    def db_type(self, connection: object) -> str:
        return "numeric"


class _WorkloadUsage(models.Model):
    gpu_uuid = models.CharField(max_length=128)
    # No index of its own: every table of these rows has an index that starts with the node, which serves
    # the foreign key's checks too; one more would be written on every rewrite of a row for nothing.
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+", db_index=False)
    tenant = models.CharField(max_length=63)
    namespace = models.CharField(max_length=253)
    pod = models.CharField(max_length=253)
    container = models.CharField(max_length=253)
    pod_uid = models.CharField(max_length=64)
    sla_tier = models.CharField(max_length=63)
    seconds = _quantity()
    mem_used_mb_s = _quantity()
    mem_granted_mb_s = _quantity()
    mem_billed_mb_s = _quantity()
    sm_used_s = _quantity()
    sm_granted_s = _quantity()
    sm_billed_s = _quantity()
    pcie_mb = _quantity()
    # The workload's share of the card in GPU-seconds after any pro-rata scaling.
    share_gpu_s = _amount()
    charge = _amount()
    # Idle spread onto this workload under the `proportional` idle policy, else 0.
    idle_share = _amount()
    # Joules of the card's energy this workload is attributed, by the split of its cost (its share, and its
    # part of the idle under `proportional`; docs/billing.md, Energy). 0 where the card's energy was not metered.
    energy_j = models.DecimalField(max_digits=30, decimal_places=12, default=Decimal(0), db_default=Decimal(0))

    class Meta:
        abstract = True


class _GpuWindow(models.Model):
    gpu_uuid = models.CharField(max_length=128)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+", db_index=False)  # as _WorkloadUsage's
    gpu_model = models.CharField(max_length=128)
    metered_seconds = _quantity()
    card_cost = _amount()
    charged = _amount()
    idle_cost = _amount()
    # Part of idle_cost spread onto tenants (proportional policy); the rest is the platform's.
    idle_allocated = _amount()
    currency = models.CharField(max_length=3, blank=True)
    # False when no rate card covered this window: amounts are 0 and the page says so.
    priced = models.BooleanField()
    # The metered seconds and card cost priced by a commitment (docs/billing.md, Commitments and
    # on-prem cards); a minute is covered whole or not at all. Defaults in the database too, since
    # the hour and day rows are also written by SQL that predates them.
    committed_seconds = models.DecimalField(max_digits=30, decimal_places=10, default=Decimal(0), db_default=Decimal(0))
    committed_cost = models.DecimalField(max_digits=30, decimal_places=12, default=Decimal(0), db_default=Decimal(0))
    # The card's energy in joules (its batches' readings, spread over the minutes they cover), the part no
    # workload is attributed, and the metered seconds that had an energy reading (the rest drew unknown energy).
    energy_j = models.DecimalField(max_digits=30, decimal_places=12, default=Decimal(0), db_default=Decimal(0))
    idle_energy_j = models.DecimalField(max_digits=30, decimal_places=12, default=Decimal(0), db_default=Decimal(0))
    energy_seconds = models.DecimalField(max_digits=30, decimal_places=10, default=Decimal(0), db_default=Decimal(0))

    class Meta:
        abstract = True


class Card(models.Model):
    """A node's GPU and its model: what a minute of the slim store names by id (docs/architecture.md,
    "The slim minute store"). A GPU that declares another model gets another card, so a minute keeps the
    model it was priced for. Written by the rollup (and by the minute views' triggers)."""

    id = models.AutoField(primary_key=True)
    # No index of its own: the key's first column.
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+", db_index=False)
    gpu_uuid = models.CharField(max_length=128)
    gpu_model = models.CharField(max_length=128)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "gpu_uuid", "gpu_model"], name="card_key")]
        # A GPU's cards on every node (a GPU-second is metered once, of any node).
        indexes = [models.Index(fields=["gpu_uuid"], name="card_gpu_uuid_idx")]

    def __str__(self) -> str:
        return f"{self.gpu_uuid} ({self.gpu_model}) on node {self.node_id}"


class Workload(models.Model):
    """A workload's six names, named by id in the slim minute store."""

    id = models.AutoField(primary_key=True)
    tenant = models.CharField(max_length=63)
    namespace = models.CharField(max_length=253)
    pod = models.CharField(max_length=253)
    container = models.CharField(max_length=253)
    pod_uid = models.CharField(max_length=64)
    sla_tier = models.CharField(max_length=63)
    # The UTC day of the latest minute the store holds of it, or a later day: the rollup raises it as it
    # writes minutes, and retention deletes the workload once the minute days up to it are dropped
    # (billing.ledger.retention), so that the table holds the pods of the retained minutes, not every pod
    # ever seen (millions a day in a fleet whose pods churn). Rows made otherwise (the minute views'
    # trigger) take the day they are made.
    last_day = models.DateField(db_default=Cast(Now(), models.DateField()))

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "namespace", "pod", "container", "pod_uid", "sla_tier"],
                                               name="workload_key")]
        indexes = [models.Index(fields=["last_day"], name="workload_last_day_idx")]

    def __str__(self) -> str:
        return f"{self.tenant} {self.namespace}/{self.pod}/{self.container}"


class _StoreId(models.IntegerField):  # type: ignore[type-arg]
    """A card or workload id the minute views' INSERT trigger finds or makes: read back (RETURNING)
    after an insert through the ORM, so the saved row has its whole key."""

    db_returning = True


class UsageMinute(_WorkloadUsage):
    """A workload's minute on one GPU: the store of its integrals (every rolled-up batch's, summed) and
    what they were priced to. mem_billed_mb_s and sm_billed_s are what the rate card billed (by its
    basis); the billed maxima, Σ per-second max(used, granted), are kept apart so that a late batch or
    a re-pricing prices the minute again from the integrals alone (billing.ledger.rollup).

    A view (migration 0043) over the slim store billing_usageminute_store, which keys the row by card
    and workload id and keeps the integrals as float8: the view joins the names back and gives each
    integral as the exact decimal it stores. The rollup writes the store; rows written through this
    model (tests, a shell) go through the view's trigger, which finds or makes their ids. The rate card
    that priced a minute is its GPU minute's."""

    pk = models.CompositePrimaryKey("minute", "card_id", "workload_id")
    minute = models.DateTimeField()
    card_id = _StoreId()
    workload_id = _StoreId()
    # 0 in the database too, for minutes written by hand (tests, a shell), which no batch ever reaches.
    mem_max_mb_s = models.DecimalField(max_digits=30, decimal_places=10, default=Decimal(0), db_default=Decimal(0))
    sm_max_s = models.DecimalField(max_digits=30, decimal_places=10, default=Decimal(0), db_default=Decimal(0))

    class Meta:
        managed = False
        db_table = "billing_usageminute"

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.gpu_uuid} {self.tenant}/{self.pod}"


class GpuMinute(_GpuWindow):
    """One GPU's minute: a view (migration 0043) over billing_gpuminute_store, keyed by card id (the
    node, GPU and model)."""

    pk = models.CompositePrimaryKey("minute", "card_id")
    minute = models.DateTimeField()
    card_id = _StoreId()
    rate_card = models.ForeignKey(RateCard, on_delete=models.PROTECT, null=True, related_name="+")

    class Meta:
        managed = False
        db_table = "billing_gpuminute"

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.gpu_uuid}"


class _Requested(models.Model):
    """The container's request per GPU (its WorkloadMeta's requests) x the row's seconds, as
    billing.ledger.requests.requested_sql reads it; NULL where that is not a number (unknown). Stored
    so that a read sums them instead of joining every row to the requests (most of a week's hourly
    allocation sets at 1,000 GPUs; docs/architecture.md, "Requests stored in the ledger rows").
    Current only while the pod's WorkloadMeta.requests_changed is false: readers take the request
    from the metadata for the pods where it is true."""

    mem_requested_mb_s = ExactDecimalField(max_digits=1000, decimal_places=40, null=True)
    sm_requested_s = ExactDecimalField(max_digits=1000, decimal_places=40, null=True)

    class Meta:
        abstract = True


class UsageHour(_WorkloadUsage, _Requested):
    hour = models.DateTimeField()

    class Meta:
        indexes = [
            # Node first: the distribution key (docs/scaling.md), and the rollup's per-node lookups.
            models.Index(fields=["node", "gpu_uuid", "hour"], name="usage_hour_node_gpu_idx"),
            models.Index(fields=["hour", "tenant"], name="usage_hour_tenant_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.gpu_uuid} {self.tenant}/{self.pod}"


# Σ the share_gpu_s of the card's usage rows of the same node, GPU and window (the rollup writes it with
# them; rebuild_days for hours written otherwise): the platform's idle of a period is read from the GPU
# rows alone, not from every usage row on them again (billing.ledger.allocation.list_idle_rows).
def _card_share() -> "models.DecimalField[Decimal | int | str, Decimal]":
    return models.DecimalField(max_digits=30, decimal_places=12, default=Decimal(0), db_default=Decimal(0))


class GpuHour(_GpuWindow):
    hour = models.DateTimeField()
    share_gpu_s = _card_share()

    class Meta:
        # Keyed by node (the distribution key): a GPU moved to another node inside an hour has one
        # row per node for that hour, each priced on its own metered seconds.
        constraints = [models.UniqueConstraint(fields=["node", "gpu_uuid", "hour"], name="gpu_hour_node_unique")]
        indexes = [models.Index(fields=["hour"], name="gpu_hour_hour_idx")]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.gpu_uuid}"


class UsageDay(_WorkloadUsage, _Requested):
    """A workload's usage on one GPU for one UTC day: the sum of its UsageHour rows of that day."""

    day = models.DateTimeField()  # 00:00 UTC
    # Start of the first and last ledger hour with usage that day, so readers keep hour precision.
    first_hour = models.DateTimeField()
    last_hour = models.DateTimeField()
    # The highest hourly mean of the day's hours (MB·s ÷ seconds, SM·s ÷ seconds of one hour row, as
    # a statement divides them; NULL where no hour had a metered second, or for a row written other
    # than from its hours): what right-sizing reads instead of the hours where a container ran on one
    # GPU and tier all day (billing.ledger.billed_basis.list_container_use).
    peak_hour_mean_mb = ExactDecimalField(max_digits=1000, decimal_places=40, null=True)
    peak_hour_mean_sm = ExactDecimalField(max_digits=1000, decimal_places=40, null=True)

    class Meta:
        indexes = [
            models.Index(fields=["node", "gpu_uuid", "day"], name="usage_day_node_gpu_idx"),
            models.Index(fields=["day", "tenant"], name="usage_day_tenant_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.day:%Y-%m-%d} {self.gpu_uuid} {self.tenant}/{self.pod}"


class GpuDay(_GpuWindow):
    """One GPU for one UTC day: the sum of its GpuHour rows of that day. `priced` is False when any
    hour was not (wholly) priced; `unpriced_seconds` are the metered seconds of those hours, so the
    unpriced figure stays as exact as the hour ledger's."""

    day = models.DateTimeField()  # 00:00 UTC
    unpriced_seconds = _quantity()
    share_gpu_s = _card_share()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "gpu_uuid", "day"], name="gpu_day_node_unique")]
        indexes = [models.Index(fields=["day"], name="gpu_day_day_idx")]

    def __str__(self) -> str:
        return f"{self.day:%Y-%m-%d} {self.gpu_uuid}"

# What usage_month_key_idx hashes of a month row: its group but the month and node (billing.ledger.months).
MONTH_KEY_HASHED = ("gpu_uuid", "tenant", "namespace", "pod", "container", "pod_uid", "sla_tier", "gpu_model")


class UsageMonth(_WorkloadUsage, _Requested):
    """A workload's usage on one GPU for one UTC month: the sum of its UsageDay rows of that month
    (billing.ledger.months), for reads of whole UTC months (~5x fewer rows than days where a pod lives
    days, up to 31x for pods that live the month).

    Beside the day row's columns, what a read of days joins per row and must not re-derive from the
    month's sums: the GPU-day's model (NULL where the day had no GPU row)."""

    month = models.DateTimeField()  # the 1st, 00:00 UTC
    first_hour = models.DateTimeField()
    last_hour = models.DateTimeField()
    gpu_model = models.CharField(max_length=128, null=True)  # noqa: DJ001 - NULL: no GPU row that day, not a model named ""

    class Meta:
        indexes = [
            # A GPU-month's rows: where the day step replaces them (billing.ledger.months.recompute_months).
            models.Index(fields=["node", "gpu_uuid", "month"], name="usage_month_node_gpu_idx"),
            # A node's rows of a month, and in them a month row's group (but node and month) hashed: where
            # closing a day merges the day's rows into the month rows of the same group (billing.ledger.months).
            # The function: migration 0046.
            models.Index(F("node"), F("month"), Func(*(F(c) for c in MONTH_KEY_HASHED), function="billing_month_key",
                                                     output_field=models.BigIntegerField()), name="usage_month_key_idx"),
            models.Index(fields=["month", "tenant"], name="usage_month_tenant_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.month:%Y-%m} {self.gpu_uuid} {self.tenant}/{self.pod}"


class UsageBatch(models.Model):
    """One accepted agent batch (wire protocol v1). Raw samples live in the partitioned
    table `billing_raw_sample` (see migration 0002), keyed by this id.

    `(node, batch_seq)` is unique: a retry of the same content is answered 200 duplicate,
    different content under the same key 409.
    """

    node = models.ForeignKey(Node, on_delete=models.PROTECT, db_index=False)  # the first column of its key
    batch_seq = models.BigIntegerField()
    content_sha256 = models.CharField(max_length=64)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    sample_count = models.PositiveIntegerField()
    received_at = models.DateTimeField()
    # Set by the rollup once the batch's minutes and hours are in the ledgers.
    rolled_up_at = models.DateTimeField(null=True, blank=True)
    # Set when the rollup could not roll the batch up: its samples stay out of the ledger, and
    # out of every other batch's way, until an operator re-drives it (billing.services.ingest.rollup).
    quarantined_at = models.DateTimeField(null=True, blank=True)
    quarantine_error = models.TextField(blank=True, default="", db_default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "batch_seq"], name="usage_batch_node_seq_unique")]
        indexes = [
            models.Index(fields=["id"], condition=models.Q(rolled_up_at__isnull=True), name="usage_batch_pending_idx"),
            models.Index(fields=["window_start"], name="usage_batch_window_idx"),
            models.Index(fields=["id"], condition=models.Q(quarantined_at__isnull=False),
                         name="usage_batch_quarantined_idx"),
            # A rollup shard lists the nodes with pending batches, then each node's pending batches.
            models.Index(fields=["node", "id"], condition=models.Q(rolled_up_at__isnull=True, quarantined_at__isnull=True),
                         name="usage_batch_node_pending_idx"),
        ]

    def __str__(self) -> str:
        return f"batch {self.node_id}/{self.batch_seq}"


class BatchGpu(models.Model):
    """A GPU present and metered for a whole batch window, with the capacity the agent declared.

    These rows give each GPU-minute its metered seconds, hence its whole-card cost and its idle. The
    GPU is named by its card (the batch's node, the GPU's uuid and the model it declared; migration
    0044): the key is (batch, card), no surrogate id.
    """

    pk = models.CompositePrimaryKey("batch_id", "card_id")
    batch = models.ForeignKey(UsageBatch, on_delete=models.PROTECT, related_name="gpus", db_index=False)
    card = models.ForeignKey(Card, on_delete=models.PROTECT, related_name="+", db_index=False)
    memory_mb = models.PositiveIntegerField()
    sm_count = models.PositiveIntegerField()
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    # Joules the GPU drew over the whole window, as the agent metered it; NULL when it did not (an agent
    # before energy, a GPU without a counter or power reading, a batch recovered after a crash).
    energy_j = models.DecimalField(max_digits=30, decimal_places=10, null=True, blank=True)

    class Meta:
        indexes = [
            # A GPU-second is metered once: windows of one GPU never overlap across batches, of any node
            # (trigger `batch_gpu_no_overlap`, migrations 0003 and 0044, looks a GPU's cards up by uuid,
            # then their windows by this index); and the rollup's card seconds, a card's windows meeting
            # a range of minutes.
            models.Index(fields=["card", "window_end"], name="batch_gpu_card_end_idx"),
        ]

    def __str__(self) -> str:
        return f"card {self.card_id} in batch {self.batch_id}"


class WorkloadMeta(models.Model):
    """What Kubernetes says about a workload beyond the ledger's key (namespace, pod, pod UID):
    the controller that owns its pod and the pod labels the agent's allow-list names (optional
    per-sample batch fields). One row per pod and node, upserted at ingest, never per sample, so
    the ledgers stay narrow and a query grouping by controller or label joins this small table on
    the ledger's own key, node included. `last_seen` moves with each batch that reports the pod; a
    pod's labels are those it last reported.

    The node is part of the key because a node speaks only for the pods it runs: node B's batch
    naming node A's pod writes B's own row, which only B's usage rows join, so it can never change
    the labels, controller or requests of what A metered. A pod that moves between nodes has one
    row on each."""

    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+", db_index=False)  # its key's first column
    namespace = models.CharField(max_length=253)
    pod = models.CharField(max_length=253)
    pod_uid = models.CharField(max_length=64)
    controller_kind = models.CharField(max_length=63, blank=True, default="")
    controller_name = models.CharField(max_length=253, blank=True, default="")
    labels = models.JSONField(default=dict)
    # What each container asked for per GPU, as the agent resolved it (agents/gpu_requests.py):
    # {"<container>": {"mem_mb": <int>, "sm": <number>}}; the drill-down's "requested" column.
    requests = models.JSONField(default=dict)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    # True while the requested figures stored in this pod's hour rows (UsageHour.mem_requested_mb_s,
    # sm_requested_s) may differ from `requests`: set by the ingest that changes them, cleared by the
    # rollup of the node that stores them again (billing.ledger.requests). A row written otherwise
    # (through the ORM: tests, hand-written ledgers) starts true, so readers take its requests from here.
    requests_changed = models.BooleanField(default=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "namespace", "pod", "pod_uid"],
                                               name="workload_meta_node_key")]
        indexes = [
            models.Index(fields=["controller_kind", "controller_name"], name="workload_meta_controller_idx"),
            # The few rows whose stored requests are behind: what every read of hours looks up.
            models.Index(fields=["node"], condition=models.Q(requests_changed=True), name="workload_meta_changed_idx"),
        ]

    def __str__(self) -> str:
        owner = f"{self.controller_kind}/{self.controller_name}" if self.controller_kind else "-"
        return f"{self.namespace}/{self.pod} ({owner})"
