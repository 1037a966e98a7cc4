from django.conf import settings
from django.db import models


class UserPreference(models.Model):
    """Per-user settings that must follow the user across browsers: the interface language."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="preference")
    language = models.CharField(max_length=16)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.user_id}: {self.language}"
