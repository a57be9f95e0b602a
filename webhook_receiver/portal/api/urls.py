"""The portal's JSON API, included by the portal's URLconf at ``api/`` (inside its
``webhook_portal`` namespace: ``reverse("webhook_portal:api_endpoints")``). Described,
with the event catalog, by the one OpenAPI document (outbound/catalog_document.py)."""

from django.urls import path

from . import endpoints, messages, recovery, views

urlpatterns = [
    path("session/", views.SessionView.as_view(), name="api_session"),
    path("endpoints/", endpoints.EndpointsView.as_view(), name="api_endpoints"),
    path("endpoints/<int:pk>/", endpoints.EndpointView.as_view(), name="api_endpoint"),
    path(
        "endpoints/<int:pk>/disable/",
        endpoints.EndpointDisableView.as_view(),
        name="api_endpoint_disable",
    ),
    path(
        "endpoints/<int:pk>/enable/",
        endpoints.EndpointEnableView.as_view(),
        name="api_endpoint_enable",
    ),
    path("endpoints/<int:pk>/secret/", endpoints.SecretView.as_view(), name="api_endpoint_secret"),
    path(
        "endpoints/<int:pk>/secret/rotate/",
        endpoints.SecretRotateView.as_view(),
        name="api_endpoint_secret_rotate",
    ),
    path(
        "endpoints/<int:pk>/test/", endpoints.EndpointTestView.as_view(), name="api_endpoint_test"
    ),
    path(
        "endpoints/<int:pk>/recovery-plan/",
        recovery.RecoveryPlanView.as_view(),
        name="api_endpoint_recovery_plan",
    ),
    path("messages/", messages.MessagesView.as_view(), name="api_messages"),
    path("messages/retry/", messages.MessagesRetryView.as_view(), name="api_messages_retry"),
    path("messages/<int:pk>/", messages.MessageView.as_view(), name="api_message"),
    path("recovery-jobs/", recovery.JobsView.as_view(), name="api_recovery_jobs"),
    path("recovery-jobs/<int:pk>/", recovery.JobView.as_view(), name="api_recovery_job"),
    path(
        "recovery-jobs/<int:pk>/cancel/",
        recovery.JobCancelView.as_view(),
        name="api_recovery_job_cancel",
    ),
    path("catalog/", views.CatalogView.as_view(), name="api_catalog"),
]
