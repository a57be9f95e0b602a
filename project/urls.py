from django.contrib import admin
from django.urls import include, path

from project.shop.merchant import demo_merchant
from webhook_receiver.watch.health import health_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("webhooks/", include("webhook_receiver.urls")),
    # the events the shop sends: GET /webhooks-catalog/openapi.json (OpenAPI 3.1)
    path("webhooks-catalog/", include("webhook_receiver.outbound.catalog_urls")),
    # the merchant portal: a link from `manage.py webhook_portal_link TENANT` opens it
    path("webhooks-portal/", include("webhook_receiver.portal.urls")),
    path("metrics/", include("webhook_receiver.watch.metrics.urls")),
    path("health/", health_view, name="health"),
    # a demo stand-in for a merchant's server: `make run` sends it the shop's webhooks
    path("demo-merchant/", demo_merchant, name="demo-merchant"),
]
