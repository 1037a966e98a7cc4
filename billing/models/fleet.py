from django.core.validators import RegexValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

# A Kubernetes node name is a DNS subdomain (RFC 1123): EKS names nodes like
# ip-10-0-1-5.ec2.internal. Both ways a node comes to exist accept the same names: a node token
# issued for a host, and a ServiceAccount token whose pod runs on that node.
node_name_validator = RegexValidator(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$",
    _("Use a Kubernetes node name: lower-case letters, digits, '-' and '.', labels of at most 63 "
      "characters, at most 253 in all."),
)


class Node(models.Model):
    """A GPU node running the agent. `name` is the Kubernetes node name."""

    name = models.CharField(max_length=253, unique=True, validators=[node_name_validator])
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # The Kubernetes cluster the node reports in its batches (optional batch field `cluster`);
    # "" until an agent that knows it uploads. A pod's cluster is its node's: one place for it.
    cluster = models.CharField(max_length=253, blank=True, default="", db_default="")
    # Samples whose claimed tenant differed from the one the service maps their namespace to
    # (billing.services.ingest.tenant_mapping): billed to the mapped tenant, counted here so an admin sees
    # a node that claims other tenants' usage (the nodes page, /metrics).
    tenant_claim_mismatches = models.PositiveBigIntegerField(default=0, db_default=0)
    last_tenant_claim_mismatch_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class NodeToken(models.Model):
    """A node's bearer token. Only the SHA-256 of the token is stored; `prefix` identifies it to humans."""

    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="tokens")
    token_sha256 = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)
    created_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        state = "revoked" if self.revoked_at else "active"
        return f"{self.prefix}… ({state})"


class Gpu(models.Model):
    """A physical GPU (or MIG instance) as last declared by its node's batches."""

    uuid = models.CharField(max_length=128, unique=True)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="gpus")
    model = models.CharField(max_length=128)
    memory_mb = models.PositiveIntegerField()
    sm_count = models.PositiveIntegerField()
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    class Meta:
        ordering = ["node__name", "uuid"]

    def __str__(self) -> str:
        return f"{self.uuid} ({self.model})"


# A location label names a data centre or region ("eu-west-dc1"): short, lower-case, stable, so that
# it reads the same on every page and export.
location_label_validator = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
    _("Use a short label: lower-case letters, digits and '-', at most 63 characters, starting and ending "
      "with a letter or digit."),
)


class Location(models.Model):
    """Where nodes run (a data centre or region): what its energy costs and emits (LocationRate)."""

    label = models.CharField(max_length=63, unique=True, validators=[location_label_validator])
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["label"]

    def __str__(self) -> str:
        return self.label


class LocationRate(models.Model):
    """A location's price per kWh and CO2e factor from a UTC date on, until its next rate. Either may
    be unknown (None): energy there then shows no cost (or no CO2e). Dates are whole UTC days, and a
    rate starts tomorrow at the earliest (billing.services.fleet.locations): it never re-prices energy
    already shown. The price is in the fleet's currency (the rate cards'), checked when it is set."""

    location = models.ForeignKey(Location, on_delete=models.PROTECT, related_name="rates")
    effective_from = models.DateField()
    price_per_kwh = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True)
    co2e_kg_per_kwh = models.DecimalField(max_digits=10, decimal_places=6, null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["location__label", "-effective_from"]
        constraints = [models.UniqueConstraint(fields=["location", "effective_from"], name="location_rate_unique")]

    def __str__(self) -> str:
        return f"{self.location_id} from {self.effective_from}"


class NodeLocation(models.Model):
    """A node's location from a UTC date on, until its next one: a move never re-prices the past."""

    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="locations")
    location = models.ForeignKey(Location, on_delete=models.PROTECT, related_name="+")
    effective_from = models.DateField()
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["node__name", "-effective_from"]
        constraints = [models.UniqueConstraint(fields=["node", "effective_from"], name="node_location_unique")]

    def __str__(self) -> str:
        return f"{self.node_id} at {self.location_id} from {self.effective_from}"
