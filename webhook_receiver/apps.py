from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class WebhookReceiverConfig(AppConfig):
    name = "webhook_receiver"
    verbose_name = _("Webhook receiver")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks, and the app's own events in the catalog (the
        # notices sent to OPS_DESTINATION). The app ships no handlers and no merchant
        # events: those belong to the host project (the demo's are in project/shop).
        from . import checks  # noqa: F401
        from .outbound import notices  # noqa: F401
        from .watch import notifiers  # noqa: F401
