from django.conf import settings
from django.db import models


class UserPreference(models.Model):
    """Per-user settings that must follow the user across browsers: the interface language."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="preference")
    language = models.CharField(max_length=16)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.user_id}: {self.language}"


class ApiToken(models.Model):
    """A person's bearer token for the read API (`vgla_…`; node tokens are `vgl_…`). It acts as its
    user with exactly the user's role, so a tenant member's token sees only that tenant. Only the
    SHA-256 of the token is stored; `prefix` identifies it to humans."""

    # A deleted user's tokens go with them (an inactive user's are refused, and kept for the record).
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    token_sha256 = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField()
    # Who issued it: the user themself, an admin on the page, or null for `manage.py` (audit says "cli").
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        state = "revoked" if self.revoked_at else "active"
        return f"{self.prefix}… ({state})"
