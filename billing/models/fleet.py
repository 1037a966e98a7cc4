from django.db import models

from billing.models.tenancy import slug_validator


class Node(models.Model):
    """A GPU node running the agent. `name` is the Kubernetes node name."""

    name = models.CharField(max_length=253, unique=True, validators=[slug_validator])
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)

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
