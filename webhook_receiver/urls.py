from django.urls import path

from .inbound.views import WebhookView

app_name = "webhook_receiver"

urlpatterns = [
    path("<str:source>/", WebhookView.as_view(), name="receive"),
]
