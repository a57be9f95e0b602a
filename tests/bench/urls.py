"""The full path as a host project mounts it, beside the two floors."""

from __future__ import annotations

from django.urls import include, path

from tests.bench.views import BareView, ClaimFloorView

urlpatterns = [
    path("webhooks/", include("webhook_receiver.urls")),
    path("floor/bare/", BareView.as_view()),
    path("floor/claim/", ClaimFloorView.as_view()),
]
