"""The event catalog's URLconf: a host mounts it with
``path("webhooks-catalog/", include("webhook_receiver.outbound.catalog_urls"))``."""

from django.urls import path

from .catalog_views import catalog_view

urlpatterns = [path("openapi.json", catalog_view, name="webhook_catalog")]
