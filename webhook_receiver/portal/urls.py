"""The merchant portal's URLconf: a host mounts it with
``path("webhooks-portal/", include("webhook_receiver.portal.urls"))`` (namespace
``webhook_portal``). Pages at the root, the JSON API under ``api/``
(docs/sending.md#the-merchant-portal).

Every URL here that names an object is in tests/portal/test_cross_tenant.py, which
opens it with another tenant's session and expects 404.
"""

from django.urls import include, path

from .pages import catalog, endpoints, entry, messages, recovery

app_name = "webhook_portal"

urlpatterns = [
    path("", entry.enter, name="enter"),
    path("session/", entry.exchange, name="exchange"),
    path("sign-out/", entry.sign_out, name="sign_out"),
    path("endpoints/", endpoints.endpoint_list, name="endpoints"),
    path("endpoints/add/", endpoints.endpoint_add, name="endpoint_add"),
    path("endpoints/<int:pk>/", endpoints.endpoint_detail, name="endpoint"),
    path("endpoints/<int:pk>/edit/", endpoints.endpoint_edit, name="endpoint_edit"),
    path("endpoints/<int:pk>/disable/", endpoints.endpoint_disable, name="endpoint_disable"),
    path("endpoints/<int:pk>/enable/", endpoints.endpoint_enable, name="endpoint_enable"),
    path("endpoints/<int:pk>/secret/", endpoints.endpoint_secret, name="endpoint_secret"),
    path("endpoints/<int:pk>/test/", endpoints.endpoint_test, name="endpoint_test"),
    path("endpoints/<int:pk>/recover/", recovery.recovery_plan, name="endpoint_recover"),
    path("messages/", messages.message_list, name="messages"),
    path("messages/retry/", messages.messages_retry, name="messages_retry"),
    path("messages/<int:pk>/", messages.message_detail, name="message"),
    path("recovery-jobs/", recovery.recovery_list, name="recovery_jobs"),
    path("recovery-jobs/<int:pk>/", recovery.recovery_detail, name="recovery_job"),
    path("recovery-jobs/<int:pk>/cancel/", recovery.recovery_cancel, name="recovery_cancel"),
    path("catalog/", catalog.catalog_page, name="catalog"),
    path("api/", include("webhook_receiver.portal.api.urls")),
]
