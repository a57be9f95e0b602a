from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "project.shop"
    label = "shop"
    verbose_name = "Demo shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the shop's webhook handlers (@webhook_handler) with the receiver, and
        # the events it sends (@webhook_event) with the catalog.
        from . import events, handlers  # noqa: F401
