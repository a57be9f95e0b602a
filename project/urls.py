from django.contrib import admin
from django.urls import include, path

from webhook_receiver.watch.health import health_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("webhooks/", include("webhook_receiver.urls")),
    path("metrics/", include("webhook_receiver.watch.metrics.urls")),
    path("health/", health_view, name="health"),
]
