from django.apps import AppConfig


class WebhookReceiverConfig(AppConfig):
    name = "webhook_receiver"
    verbose_name = "Webhook receiver"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the built-in handlers and the system checks.
        from . import checks  # noqa: F401
        from .services import commerce  # noqa: F401
