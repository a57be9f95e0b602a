"""The metrics' URLconf: a host mounts it with
``path("metrics/", include("webhook_receiver.watch.metrics.urls"))``."""

from django.urls import path

from .views import metrics_view

urlpatterns = [path("", metrics_view, name="webhook_receiver_metrics")]
