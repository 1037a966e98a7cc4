from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class BillingConfig(AppConfig):
    name = "billing"
    verbose_name = _("vGPU Ledger billing")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from axes.signals import user_locked_out

        from billing import checks  # noqa: F401 - registers the system checks
        from billing.web.lockout import audit_lockout

        user_locked_out.connect(audit_lockout, dispatch_uid="billing.audit_lockout")
