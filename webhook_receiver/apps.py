from django.apps import AppConfig


class WebhookReceiverConfig(AppConfig):
    name = "webhook_receiver"
    verbose_name = "Webhook receiver"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks. The app ships no handlers: event types belong to
        # the host project, which registers its own (the demo's are in project/shop).
        from . import checks  # noqa: F401
