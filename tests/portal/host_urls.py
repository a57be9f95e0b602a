"""The demo's URLs, and the portal opened from the host's own page behind its login, as
docs/sending.md#the-merchant-portal shows it: alice is acme's; anyone else has no portal."""

from django.contrib.auth.decorators import login_required
from django.urls import path

from project.urls import urlpatterns as project_patterns
from webhook_receiver.portal.pages.entry import Grant, host_portal


def merchant_grant(request):
    if request.user.username != "alice":
        return None
    return Grant("acme", ["recover"], by=f"user {request.user.username}")


urlpatterns = [
    *project_patterns,
    path("account/webhooks/", login_required(host_portal(merchant_grant)), name="host_portal"),
]
