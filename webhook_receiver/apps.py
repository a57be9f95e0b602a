from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class WebhookReceiverConfig(AppConfig):
    name = "webhook_receiver"
    verbose_name = _("Webhook receiver")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks. The app ships no handlers: event types belong to
        # the host project, which registers its own (the demo's are in project/shop).
        from . import checks  # noqa: F401
