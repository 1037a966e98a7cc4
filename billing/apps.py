from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class BillingConfig(AppConfig):
    name = "billing"
    verbose_name = _("vGPU Ledger billing")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from billing import checks  # noqa: F401 - registers the system checks
